"""``corpus-io export-model``: a trained CTC checkpoint as one self-contained ONNX or TorchScript file (read back for
``decode ++checkpoint=model.onnx`` by :mod:`corpus_io.infer.exported`).

What is exported: :class:`ExportedCTC`, ConformerCTC's forward (CMVN buffers, subsampling, Conformer layers,
CTC head, log-softmax) with the padding mask passed explicitly instead of the forward pre-hooks
``ConformerCTC.encode`` registers (tracing sees plain tensor ops; the outputs equal ``model(...)``). Inputs
``feats`` (B, T, D) float32 and ``feats_lengths`` (B,) int64; with ``++frontend=true`` instead ``wav``
(B, N) float32 in [-1, 1] at the model's sample rate and ``wav_lengths`` (B,) samples: the Kaldi fbank/mfcc of
:mod:`corpus_io.audio.features` (dither 0) runs inside. Outputs ``log_probs`` (B, T', V) and ``lengths`` (B,).
Batch and time axes are dynamic. A waveform must hold at least one analysis window (25 ms by default).

Everything needed to use the file travels inside it (ONNX ``metadata_props``; TorchScript ``_extra_files``),
as strings under ``corpus_io.*`` keys: :data:`FORMAT` (the marker a file of ours carries), the token list,
the tokenizer block (and a sentencepiece model, base64), the sample rate, the feature config, the
subsampling factor and frame shift, the inputs kind and the training config (YAML) decode reads; the config's
absolute paths (data lists, output_dir, token list, CMVN file...) are cut to their base names, so nothing in the file
names the training machine's directories.

A features-in file also carries the plain keys sherpa-onnx's offline WeNet CTC model reads (``model_type``,
``vocab_size``, ``subsampling_factor``) and every setting of its features under plain documented names
(:func:`deploy_metadata`); its ONNX export writes ``tokens.txt`` beside the model in sherpa-onnx's form
(:func:`sherpa_tokens`), so ``sherpa_onnx.OfflineRecognizer.from_wenet_ctc(model=..., tokens=..., feature_dim=D)``
runs it unchanged.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from corpus_io.errors import ConfigError, DataError
from corpus_io.infer.exported import FORMAT, META_PREFIX, SUFFIXES, load_exported, read_metadata

SUBSAMPLING = 4
ONNX_OPSET = 17
#: the largest |log-prob difference| between the written file and the PyTorch model on the check batch that export
#: accepts (ONNX float32 kernels give about 1e-5); more, or a NaN, and nothing is written
CHECK_TOLERANCE = 1e-3
#: the name export-model's outputs are recorded under (storage/files.py record_written): the files it may replace
WRITER = "export-model"


# --------------------------------------------------------------------------- the exported module


class ExportFrontEnd(nn.Module):
    """Kaldi fbank/mfcc of padded waveforms in ops ONNX has (gather for the frames, a DFT as two matrix
    products): :func:`corpus_io.audio.features.batch_fbank` / ``batch_mfcc`` step for step. ``exact_fft``
    (TorchScript) uses ``torch.fft.rfft`` as they do."""

    def __init__(self, kind: str, options: dict, sample_rate: int, *, exact_fft: bool = False) -> None:
        super().__init__()
        from corpus_io.audio import features

        self.kind = kind
        self.sample_rate = int(sample_rate)
        self.exact_fft = exact_fft
        frame_length, frame_shift = float(options["frame_length"]), float(options["frame_shift"])
        self.window, self.shift, self.fft_size = features.window_geometry(self.sample_rate, frame_length, frame_shift)
        self.snip_edges = bool(options.get("snip_edges", True))
        bins = int(options["num_mel_bins"])
        low = float(options.get("low_freq", features.LOW_FREQ))
        high = float(options.get("high_freq", 0.0))
        cpu = torch.device("cpu")
        self.register_buffer("povey", features._povey(self.window, cpu).clone())
        self.register_buffer("mel", features._mel(self.sample_rate, self.fft_size, bins, low, high, cpu).clone())
        k = torch.arange(self.fft_size // 2 + 1, dtype=torch.float64)
        n = torch.arange(self.fft_size, dtype=torch.float64)[:, None]
        angle = 2 * math.pi * n * k / self.fft_size
        self.register_buffer("dft_cos", torch.cos(angle).float())
        self.register_buffer("dft_sin", torch.sin(angle).float())
        if kind == "mfcc":
            ceps = int(options["num_ceps"])
            self.register_buffer("dct", features._dct(bins, ceps, cpu).clone())
            self.register_buffer("lifter", features._lifter(ceps, 22.0, cpu).clone())
        self.dim = int(options["num_ceps"]) if kind == "mfcc" else bins

    def forward(self, wav: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from corpus_io.audio.features import EPSILON, INT16_SCALE, PREEMPHASIS, frame_offset, reflect

        x = wav.float() * INT16_SCALE
        if self.snip_edges:
            frames = torch.where(lengths >= self.window,
                                 torch.div(lengths - self.window, self.shift, rounding_mode="floor") + 1,
                                 torch.zeros_like(lengths))
            count = torch.div(x.shape[1] - self.window, self.shift, rounding_mode="floor") + 1
        else:  # each row's samples reflected at its own length (features.edge_samples), then framed as above
            frames = torch.div(lengths + self.shift // 2, self.shift, rounding_mode="floor")
            count = torch.div(x.shape[1] + self.shift // 2, self.shift, rounding_mode="floor")
            index = (torch.arange((count - 1) * self.shift + self.window, device=x.device)
                     + frame_offset(self.window, self.shift, False))
            x = torch.gather(x, 1, reflect(index[None, :], lengths[:, None]).expand(x.shape[0], -1))
        index = (torch.arange(count, device=x.device)[:, None] * self.shift
                 + torch.arange(self.window, device=x.device)[None, :])
        raw = x[:, index]  # (B, T, window)
        centred = raw - raw.mean(dim=-1, keepdim=True)
        framed = torch.cat([centred[..., :1] - PREEMPHASIS * centred[..., :1],
                            centred[..., 1:] - PREEMPHASIS * centred[..., :-1]], dim=-1) * self.povey
        framed = nn.functional.pad(framed, (0, self.fft_size - self.window))
        if self.exact_fft:
            spectrum = torch.fft.rfft(framed)
            power = spectrum.real.square() + spectrum.imag.square()
        else:
            power = torch.matmul(framed, self.dft_cos).square() + torch.matmul(framed, self.dft_sin).square()
        feats = torch.matmul(power, self.mel).clamp_min(EPSILON).log()
        if self.kind == "mfcc":
            feats = torch.matmul(feats, self.dct) * self.lifter
        past = torch.arange(feats.shape[1], device=feats.device)[None, :] >= frames[:, None]
        return feats.masked_fill(past.unsqueeze(-1), 0.0), frames


class ExportedCTC(nn.Module):
    """``ConformerCTC.forward`` (full context, plain tensor ops: :mod:`corpus_io.model.conformer`), so the same
    log-probs. With ``front_end`` the inputs are waveforms."""

    def __init__(self, model: nn.Module, front_end: ExportFrontEnd | None = None) -> None:
        super().__init__()
        self.model = model
        self.front_end = front_end

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.front_end is not None:
            x, lengths = self.front_end(x, lengths)
        return self.model(x, lengths)


def exportable(model: nn.Module, where: str) -> None:
    """Refuse, in one paragraph, a model this exporter does not handle (only ConformerCTC itself)."""
    from corpus_io.model.model import ConformerCTC

    if type(model) is not ConformerCTC:
        name = f"{type(model).__module__}.{type(model).__name__}"
        raise ConfigError(f"export-model exports corpus_io.model.model.ConformerCTC (CTC-only) models; the model of "
                          f"checkpoint {where} is {name}, which it cannot export (a hybrid CTC/attention model's "
                          f"decoder, or a custom model's forward, is not covered). Decode it with the PyTorch "
                          f"checkpoint (corpus-io decode ++checkpoint={where}), or train a model=conformer_tiny "
                          f"style ConformerCTC to export.")


# --------------------------------------------------------------------------- export-model


def export_model(cfg: Any) -> dict:
    """``corpus-io export-model``: ``cfg.checkpoint`` as ``cfg.output`` (ONNX or TorchScript), its metadata inside.
    Before anything is written: the output's suffix is the format's, and it is none of the files the export reads
    (the checkpoint, and the token list, BPE model and CMVN stats its config names). The file is written under a
    temp name, read back and checked against the PyTorch model, then renamed (an ``s3://`` output: uploaded once
    checked)."""
    import io
    import warnings

    from corpus_io.config import require
    from corpus_io.infer.decode import load_model  # decode reads exported files through exported.py, not here
    from corpus_io.storage.files import refuse_overwriting_inputs, refuse_remote_output

    require(cfg, "checkpoint", "output")
    refuse_remote_output(cfg.output, "++output", "export-model", objects=True)
    refuse_wrong_suffix(cfg.output, cfg.format)
    refuse_overwriting_inputs([("++output", cfg.output)], [("++checkpoint", cfg.checkpoint)])
    if cfg.format == "onnx":
        import onnx  # noqa: F401  (the [onnx] extra, before the model is loaded)
    model, tokenizer, tcfg = load_model(cfg.checkpoint, torch.device("cpu"))
    tokens_txt = tokens_path(cfg.output) if cfg.format == "onnx" and not cfg.frontend else None  # sherpa-onnx's
    refuse_overwriting_inputs([("++output", cfg.output), ("tokens.txt beside ++output", tokens_txt)], [
        ("++checkpoint", cfg.checkpoint),
        (f"tokenizer.token_list of checkpoint {cfg.checkpoint}", tcfg.tokenizer.token_list),
        (f"tokenizer.bpe_model of checkpoint {cfg.checkpoint}", tcfg.tokenizer.bpe_model),
        (f"cmvn_file of checkpoint {cfg.checkpoint}", tcfg.cmvn_file)])
    exportable(model, cfg.checkpoint)
    dconf = tcfg.dataset_conf
    if cfg.frontend and dconf.feats_type not in ("fbank", "mfcc"):
        raise ConfigError(f"++frontend=true exports the fbank/mfcc front end, but checkpoint {cfg.checkpoint} was "
                          f"trained on dataset_conf.feats_type={dconf.feats_type}; export without the front end.")
    tokens_text = sherpa_tokens(tokenizer) if tokens_txt is not None else ""
    if not claim_outputs(cfg.output, cfg.format, tokens_txt, tokens_text):
        tokens_txt = None  # already there, the same tokens: left as it is
    meta = metadata(tcfg, tokenizer, frontend=bool(cfg.frontend))
    if cfg.streaming:
        return export_streaming(cfg, model, tokenizer, meta, tokens_txt, tokens_path(cfg.output))
    front = None
    if cfg.frontend:
        front = ExportFrontEnd(dconf.feats_type, feature_options(dconf), dconf.resample_conf.resample_rate,
                               exact_fft=cfg.format == "torchscript")
    module = ExportedCTC(model, front).eval()
    example = example_inputs(module, model.input_dim)
    with torch.no_grad():
        refuse_nonfinite(module(*example)[0], cfg.checkpoint)
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and exporter warnings about shapes the tests check dynamic
        if cfg.format == "onnx":
            names = ("wav", "wav_lengths") if front is not None else ("feats", "feats_lengths")
            torch.onnx.export(module, example, buffer, dynamo=False, opset_version=ONNX_OPSET,
                              input_names=list(names), output_names=["log_probs", "lengths"],
                              dynamic_axes={names[0]: {0: "batch", 1: "time"}, names[1]: {0: "batch"},
                                            "log_probs": {0: "batch", 1: "frames"}, "lengths": {0: "batch"}})
            data = _with_onnx_metadata(buffer.getvalue(), meta)
        else:
            traced = torch.jit.trace(module, example, check_trace=False)
            torch.jit.save(traced, buffer, _extra_files=meta)
            data = buffer.getvalue()

    def check(path: Path) -> float:  # the file as decode will load it, on another batch shape
        exported = load_exported(str(path), torch.device("cpu"), kind=cfg.format)[0]
        return within_tolerance(check_against(module, exported, model.input_dim), cfg.output)

    gap = write_output(cfg.output, data, check)
    beside = ""
    if tokens_txt is not None:
        write_tokens(tokens_txt, tokens_text, cfg.output)
    if cfg.format == "onnx" and not cfg.frontend:
        beside = f" and {tokens_path(cfg.output)} (sherpa-onnx's tokens.txt, for OfflineRecognizer.from_wenet_ctc)"
    what = "waveform" if front is not None else "features"
    print(f"export-model: {cfg.checkpoint} -> {cfg.output}{beside} ({cfg.format}, {what} in, log-probs out; "
          f"{tokenizer.vocab_size} tokens, {meta[META_PREFIX + 'sample_rate']} Hz, subsampling {SUBSAMPLING}); "
          f"max |log-prob difference| to PyTorch on a check batch {gap:.2e}")
    return {"output": str(cfg.output), "format": cfg.format, "frontend": bool(cfg.frontend), "max_abs_diff": gap,
            "tokens": tokens_path(cfg.output) if cfg.format == "onnx" and not cfg.frontend else None}


def claim_outputs(output: str, fmt: str, tokens_txt: str | None, tokens_text: str) -> bool:
    """Before the export is computed: refuse to replace a file at ``output`` that is not an export (neither
    corpus-io's metadata inside nor export-model's record), and a ``tokens.txt`` beside it whose content differs
    from this export's unless export-model wrote it for this same ``output`` name (another model's token list, or
    a checkpoint's own token list copied into a model dir, are never replaced). Returns whether tokens.txt is to be
    written (False: it already holds exactly these tokens and is left as it is). Object URLs are not checked."""
    import os

    from corpus_io.storage.files import is_url, written_by

    if not is_url(output) and os.path.isfile(output) and written_by(output, WRITER) is None:
        try:
            read_metadata(str(output), fmt)
        except ConfigError:
            raise DataError(f"++output {output} exists and is not a model of corpus-io export-model (it carries no "
                            f"corpus-io metadata, and export-model has no record of writing it), so export-model "
                            f"will not replace it. Give ++output another name, or delete {output} first if you mean "
                            f"to replace it. Nothing was written.") from None
    if tokens_txt is None or is_url(tokens_txt) or not os.path.lexists(tokens_txt):
        return True
    try:
        if Path(tokens_txt).read_bytes() == tokens_text.encode("utf-8"):
            return False
    except OSError:
        pass
    stat = written_by(tokens_txt, WRITER)
    if stat is not None and stat.get("output") == Path(output).name:
        return True
    why = (f"export-model wrote it for {stat.get('output')}" if stat is not None else
           "export-model did not write it: it may be the checkpoint's own token list (a model dir's tokens.txt, in "
           "corpus-io's form) or another model's")
    raise DataError(f"tokens.txt beside ++output ({tokens_txt}) exists and holds other tokens than this export's "
                    f"(sherpa-onnx's form of the checkpoint's token list), and {why}; export-model never replaces "
                    f"a token list it did not write for this ++output. Export into a directory of its own (e.g. "
                    f"++output={Path(output).parent / 'onnx' / Path(output).name}), or delete {tokens_txt} first if "
                    f"it is an old export's. Nothing was written.")


def write_tokens(tokens_txt: str, text: str, output: str) -> None:
    """sherpa-onnx's ``tokens.txt`` written beside ``output`` (checked by :func:`claim_outputs`) and recorded as
    export-model's for that output."""
    from corpus_io.storage.files import is_url, record_written

    write_output(tokens_txt, text.encode("utf-8"), lambda path: None)
    if not is_url(tokens_txt):
        record_written(tokens_txt, WRITER, output=Path(output).name)


def refuse_nonfinite(log_probs: torch.Tensor, checkpoint: str) -> None:
    """A DataError when the model's log-probs on the check batch are not finite (a diverged model): nothing is
    exported."""
    from corpus_io.model.model import nonfinite_message, nonfinite_rows

    bad = nonfinite_rows(log_probs)
    if bad:
        raise DataError(nonfinite_message(checkpoint, "export-model's check batch", len(bad), log_probs.shape[0])
                        + " Nothing was exported.")


def within_tolerance(gap: float, output: str) -> float:
    """``gap`` (the check's largest |log-prob difference|) when it is finite and at most :data:`CHECK_TOLERANCE`,
    else a ConfigError: the written file does not compute the model, and is not renamed into place."""
    if not math.isfinite(gap) or gap > CHECK_TOLERANCE:
        raise ConfigError(f"export-model: the written file for {output} differs from the PyTorch model by up to "
                          f"{gap:.3g} in log-probability on the check batch (the tolerance is {CHECK_TOLERANCE:g}; "
                          f"NaN never passes), so it is not written. If the model's own outputs are finite this is a "
                          f"bug of the exporter or the runtime: please report it with the checkpoint's config.")
    return gap


def tokens_path(output: str) -> str:
    """``tokens.txt`` in the directory of ``output`` (a local path or an object URL), where sherpa-onnx's examples
    look for it."""
    text = str(output)
    if "://" in text:
        return text.rsplit("/", 1)[0] + "/tokens.txt"
    return str(Path(text).parent / "tokens.txt")


#: the blank symbols sherpa-onnx's CTC greedy search looks for in tokens.txt
SHERPA_BLANKS = ("<blk>", "<eps>", "<blank>")
SHERPA_SPACE = "\u2581"  # ▁: sherpa-onnx prints a token's leading ▁ as a space (and drops the text's first one)


def sherpa_tokens(tokenizer: Any) -> str:
    """The token list as sherpa-onnx reads it (``<symbol> <id>`` lines, the same ids): the blank named one of
    :data:`SHERPA_BLANKS`; a whole-word Latin token (``char`` with ``latin_unit=word``, or ``word``) written with a
    leading ``▁`` so sherpa prints a space before it (CJK tokens stay bare: no space between them); letter mode's
    word-boundary symbol written as ``▁``; BPE pieces as they are (they carry their ``▁``)."""
    from corpus_io.tokenizer import SOS_EOS, is_cjk, token_list_text

    conf = tokenizer.conf
    symbols = list(tokenizer.symbols)
    special = {conf.blank, conf.unk, SOS_EOS}
    words = conf.type == "word" or (conf.type == "char" and conf.latin_unit == "word")
    for i, token in enumerate(symbols):
        if i == tokenizer.blank_id:
            continue
        if words and token not in special and not is_cjk(token) and not token.startswith(SHERPA_SPACE):
            symbols[i] = SHERPA_SPACE + token
        elif conf.type == "char" and conf.latin_unit == "letter" and token == conf.space:
            symbols[i] = SHERPA_SPACE
    blank = symbols[tokenizer.blank_id]
    if blank not in SHERPA_BLANKS:
        free = next((b for b in SHERPA_BLANKS[::-1] if b not in symbols), None)
        if free is None:
            raise ConfigError(f"export-model: the blank {blank!r} (tokenizer.blank) is none of {SHERPA_BLANKS}, and "
                              f"every one of those names another token, so tokens.txt cannot name the blank as "
                              f"sherpa-onnx needs; rename one of them in the token list.")
        symbols[tokenizer.blank_id] = free
    return token_list_text(symbols)


def refuse_wrong_suffix(output: str, fmt: str) -> None:
    """An output whose suffix is not its format's, refused before anything is done: decode tells an exported file
    from a checkpoint, and ONNX from TorchScript, by the suffix alone."""
    suffixes = SUFFIXES[fmt]
    if not str(output).lower().endswith(suffixes):
        other = next((f for f, names in SUFFIXES.items() if str(output).lower().endswith(names)), None)
        why = (f"the suffix of ++format={other}" if other else
               "a name decode would not recognise as an exported model, and load as a checkpoint")
        stem = str(output)[:-len(Path(output).suffix)] if Path(output).suffix else str(output)
        kind = "an ONNX" if fmt == "onnx" else "a TorchScript"
        raise ConfigError(f"++output={output} does not end in {' or '.join(suffixes)} ({why}), but ++format={fmt} "
                          f"writes {kind} file: decode tells the formats apart by the suffix. Give "
                          f"++output={stem}{suffixes[0]}, or the ++format its suffix names. Nothing was written.")


def write_output(output: str, data: bytes, check: Any) -> Any:
    """``data`` written to ``output`` under a temp name, ``check(path)`` run on it, then renamed; an ``s3://``
    output is checked on local disk, then uploaded as one object (:func:`corpus_io.storage.objects.put_object`)."""
    import hashlib
    import tempfile

    from corpus_io.storage.files import is_object_url, write_checked

    if not is_object_url(output):
        return write_checked(output, data, check)
    from corpus_io.storage.objects import put_object

    with tempfile.TemporaryDirectory(prefix="corpus-io-export-") as tmp:
        local = Path(tmp) / Path(str(output).split("://", 1)[1]).name
        result = write_checked(local, data, check)
        put_object(local, output, sha256=hashlib.sha256(data).hexdigest())
    return result


def feature_options(dconf: Any) -> dict:
    import dataclasses

    c = dconf.fbank_conf if dconf.feats_type == "fbank" else dconf.mfcc_conf
    return {k: v for k, v in dataclasses.asdict(c).items() if k != "dither"}


def example_inputs(module: ExportedCTC, input_dim: int, *, seed: int = 0,
                   sizes: tuple[int, ...] = (2, 1)) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch of ``sizes`` seconds (rows of unequal lengths): waveforms or features."""
    g = torch.Generator().manual_seed(seed)
    if module.front_end is not None:
        n = [int(s * module.front_end.sample_rate) for s in sizes]
        wav = (torch.rand(len(n), max(n), generator=g) - 0.5) * 0.2
        return wav, torch.tensor(n, dtype=torch.long)
    t = [int(s * 100) for s in sizes]
    return torch.randn(len(t), max(t), input_dim, generator=g) * 3 + 8, torch.tensor(t, dtype=torch.long)


def check_against(module: ExportedCTC, exported: Any, input_dim: int) -> float:
    """The largest log-prob difference between the exported file and the module on another batch shape."""
    x, n = example_inputs(module, input_dim, seed=1, sizes=(1.5, 3.0, 0.7))
    with torch.no_grad():
        ref, ref_n = module(x, n)
    got, got_n = exported(x, n)
    if not torch.equal(ref_n, got_n.cpu()):
        raise ConfigError(f"export-model: the exported file's output lengths {got_n.tolist()} differ from the "
                          f"model's {ref_n.tolist()}; the export is wrong, please report it.")
    diff = (ref - got.cpu()).abs()
    valid = torch.arange(ref.shape[1])[None, :] < ref_n[:, None]
    return float(diff[valid].max()) if bool(valid.any()) else 0.0


def metadata(tcfg: Any, tokenizer: Any, *, frontend: bool) -> dict[str, str]:
    """The strings an exported file carries (ONNX metadata_props, TorchScript extra files)."""
    import dataclasses

    from omegaconf import OmegaConf

    from corpus_io.tokenizer import token_list_text

    dconf = tcfg.dataset_conf
    features = {"feats_type": dconf.feats_type,
                **({"options": feature_options(dconf)} if dconf.feats_type in ("fbank", "mfcc") else {})}
    tok = portable(dataclasses.asdict(tcfg.tokenizer))
    config = portable(OmegaConf.to_container(OmegaConf.structured(tcfg)))
    meta = {"format": FORMAT, "inputs": "waveform" if frontend else "features",
            "tokens": token_list_text(tokenizer.symbols), "tokenizer": json.dumps(tok, ensure_ascii=False),
            "sample_rate": str(int(dconf.resample_conf.resample_rate)), "features": json.dumps(features),
            "subsampling": str(SUBSAMPLING), "frame_shift_ms": str(_frame_shift(dconf)),
            "blank_id": "0", "config": OmegaConf.to_yaml(OmegaConf.create(config))}
    if tcfg.tokenizer.type == "bpe" and tcfg.tokenizer.bpe_model:
        meta["bpe_model"] = base64.b64encode(Path(tcfg.tokenizer.bpe_model).read_bytes()).decode("ascii")
    ours = {META_PREFIX + k: v for k, v in meta.items()}
    return ours if frontend else {**deploy_metadata(tcfg, tokenizer), **ours}


def portable(value: Any) -> Any:
    """``value`` (a config as plain dicts and lists) with every absolute path cut to its base name: an exported
    file names no directory of the training machine (decode of the file reads none of them: the token list, BPE
    model and CMVN statistics travel inside it)."""
    import os

    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if isinstance(value, str) and (os.path.isabs(value) or value.startswith("file://")):
        return os.path.basename(value.rstrip("/")) or value
    return value


def deploy_metadata(tcfg: Any, tokenizer: Any) -> dict[str, str]:
    """The plain keys of a features-in file, for a runtime that computes the features itself: those sherpa-onnx's
    offline WeNet CTC model reads (``model_type``, ``vocab_size``, ``subsampling_factor``), and every setting of the
    features under kaldi-native-fbank's names (docs/DECODING.md, "Serving with sherpa-onnx")."""
    dconf = tcfg.dataset_conf
    meta = {"model_type": "wenet_ctc", "vocab_size": str(tokenizer.vocab_size),
            "subsampling_factor": str(SUBSAMPLING), "blank_id": "0", "sample_rate": str(int(
                dconf.resample_conf.resample_rate)), "feature_type": dconf.feats_type, "cmvn": "inside the model"}
    if dconf.feats_type not in ("fbank", "mfcc"):
        return meta
    from corpus_io.audio.features import PREEMPHASIS

    c = dconf.fbank_conf if dconf.feats_type == "fbank" else dconf.mfcc_conf
    meta.update({"feature_dim": str(c.num_ceps if dconf.feats_type == "mfcc" else c.num_mel_bins),
                 "num_mel_bins": str(c.num_mel_bins), "frame_length_ms": f"{float(c.frame_length):g}",
                 "frame_shift_ms": f"{float(c.frame_shift):g}",
                 "sample_scale": "int16", "normalize_samples": "false",  # samples in [-32768, 32767]
                 "dither": "0", "window_type": "povey", "low_freq": f"{float(c.low_freq):g}",
                 "high_freq": f"{float(c.high_freq):g}",
                 "snip_edges": "true" if getattr(c, "snip_edges", True) else "false",
                 "preemph_coeff": f"{PREEMPHASIS:g}",
                 "remove_dc_offset": "true", "round_to_power_of_two": "true", "use_energy": "false",
                 "energy_floor": "0", "log_floor": "float32 epsilon"})
    if dconf.feats_type == "mfcc":
        meta.update({"num_ceps": str(c.num_ceps), "cepstral_lifter": "22"})
    return meta


def _frame_shift(dconf: Any) -> float:
    if dconf.feats_type == "mfcc":
        return float(dconf.mfcc_conf.frame_shift)
    if dconf.feats_type == "fbank":
        return float(dconf.fbank_conf.frame_shift)
    return 10.0


def _with_onnx_metadata(data: bytes, meta: dict[str, str]) -> bytes:
    import onnx

    proto = onnx.load_from_string(data)
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.producer_name = "corpus-io"
    return proto.SerializeToString()


# --------------------------------------------------------------------------- the streaming (chunk) export


#: the chunk the check runs, and sherpa-onnx's defaults (OnlineRecognizer.from_wenet_ctc): 16 frames, 4 left chunks
CHECK_CHUNK, CHECK_LEFT_CHUNKS = 16, 4


class ExportedChunkCTC(nn.Module):
    """One chunk through a causal ConformerCTC with fixed-size caches: sherpa-onnx's online WeNet CTC interface
    (csrc/online-wenet-ctc-model.cc), inputs by position:

    ``x`` (1, frames, D) features of one chunk ((chunk - 1) * 4 + 7 frames: 67 for 16); ``offset`` (1,) int64,
    the encoder frames seen so far counted from ``required_cache_size`` (sherpa starts it there);
    ``required_cache_size`` (1,) int64, chunk * left chunks; ``attn_cache`` (layers, heads, S, 2 D/heads);
    ``conv_cache`` (layers, 1, D, kernel - 1); ``attn_mask`` (1, 1, S + chunk) bool, False on cache frames not
    filled yet. Outputs: ``log_probs`` (1, chunk, V), ``next_att_cache`` (the same S frames, moved on by the
    chunk), ``next_conv_cache``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, offset: torch.Tensor, required_cache_size: torch.Tensor,
                attn_cache: torch.Tensor, conv_cache: torch.Tensor,
                attn_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        start = offset - required_cache_size  # encoder frames before this chunk (the positions of abs_pos)
        y, att, cnn = self.model.forward_chunk(x, start, attn_cache, conv_cache, attn_mask)
        # sherpa feeds all six inputs by position: a model without positions still keeps offset in the graph
        log_probs = torch.log_softmax(self.model.ctc(y).float(), dim=-1) + 0.0 * start.float()
        return log_probs, att[:, :, att.shape[2] - attn_cache.shape[2]:], cnn


def streaming_metadata(model: nn.Module) -> dict[str, str]:
    """The plain keys sherpa-onnx's online WeNet CTC model reads (besides vocab_size and subsampling_factor)."""
    layer = model.encoder.conformer_layers[0]
    return {"head": str(layer.self_attn.num_heads), "num_blocks": str(len(model.encoder.conformer_layers)),
            "output_size": str(layer.self_attn.embed_dim),
            "cnn_module_kernel": str(layer.conv_module.sequential[2].kernel_size[0]),
            "right_context": str(model.RIGHT_CONTEXT), "subsampling_factor": str(model.SUBSAMPLING),
            "vocab_size": str(model.vocab_size), "model_type": "wenet_ctc", "comment": "streaming",
            "chunk_size": str(CHECK_CHUNK), "left_chunks": str(CHECK_LEFT_CHUNKS)}


def onnx_chunk_log_probs(session: Any, feats: torch.Tensor, chunk: int, left_chunks: int, *,
                         latencies: list | None = None) -> torch.Tensor:
    """A streaming export run as sherpa-onnx runs it (fixed caches of chunk * left_chunks frames, its offset and
    mask rule), over one utterance's features (1, T, D): the log-probs (T', V) of every full chunk (sherpa reads
    a chunk only when all its frames are there). ``latencies``: each chunk's seconds are appended."""
    import time

    import numpy as np

    names = [i.name for i in session.get_inputs()]
    shapes = {i.name: i.shape for i in session.get_inputs()}
    layers, heads, _, width = shapes[names[3]]
    _, _, dim, context = shapes[names[4]]
    cache = chunk * left_chunks
    att = np.zeros((layers, heads, cache, width), np.float32)
    cnn = np.zeros((layers, 1, dim, context), np.float32)
    from corpus_io.model.model import ConformerCTC

    frames, shift = ConformerCTC.chunk_window(chunk)  # the subsampling's geometry (no weights needed)
    offset, outs = cache, []
    x = feats.detach().cpu().float().numpy()
    for begin in range(0, x.shape[1] - frames + 1, shift):
        t0 = time.perf_counter()
        seen = offset // chunk - left_chunks  # chunks before this one
        mask = np.ones((1, 1, cache + chunk), bool)
        if seen < left_chunks:
            mask[..., :cache - seen * chunk] = False
        log_probs, att, cnn = session.run(None, dict(zip(names, (
            x[:, begin:begin + frames], np.array([offset], np.int64), np.array([cache], np.int64), att, cnn, mask))))
        offset += log_probs.shape[1]
        outs.append(torch.from_numpy(log_probs[0]))
        if latencies is not None:
            latencies.append(time.perf_counter() - t0)
    return torch.cat(outs) if outs else torch.zeros(0, 0)


def export_streaming(cfg: Any, model: nn.Module, tokenizer: Any, meta: dict[str, str],
                     tokens_txt: str | None, beside: str) -> dict:
    """``export-model ++streaming=true``: the chunk model (:class:`ExportedChunkCTC`) as ONNX, checked by running
    the written file as sherpa-onnx does against :meth:`ConformerCTC.encode_streaming` (16-frame chunks, 4 left
    chunks), then renamed into place; sherpa-onnx's ``tokens.txt`` beside it."""
    import io
    import warnings

    if cfg.format != "onnx":
        raise ConfigError(f"++streaming=true exports sherpa-onnx's online model, an ONNX file; ++format={cfg.format} "
                          f"has no streaming export. Give ++format=onnx ++output=<name>.onnx.")
    if cfg.frontend:
        raise ConfigError("++streaming=true takes features (sherpa-onnx computes the fbank itself); drop "
                          "++frontend=true.")
    model.require_streaming("export-model ++streaming=true")
    module = ExportedChunkCTC(model).eval()
    cache = CHECK_CHUNK * CHECK_LEFT_CHUNKS
    frames, _ = model.chunk_window(CHECK_CHUNK)
    att, cnn = model.initial_caches(None, cache)
    mask = torch.ones(1, 1, cache + CHECK_CHUNK, dtype=torch.bool)
    mask[..., :cache] = False
    example = (torch.randn(1, frames, model.input_dim), torch.tensor([cache]), torch.tensor([cache]), att, cnn, mask)
    with torch.no_grad():
        refuse_nonfinite(module(*example)[0], cfg.checkpoint)
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, buffer, dynamo=False, opset_version=ONNX_OPSET,
                          input_names=["x", "offset", "required_cache_size", "attn_cache", "conv_cache", "attn_mask"],
                          output_names=["log_probs", "next_att_cache", "next_conv_cache"],
                          dynamic_axes={"x": {1: "frames"}, "attn_cache": {2: "cache"}, "attn_mask": {2: "seen"},
                                        "log_probs": {1: "chunk"}, "next_att_cache": {2: "cache"}})
    meta = {**meta, META_PREFIX + "inputs": "chunk", **streaming_metadata(model)}  # and deploy_metadata's keys
    data = _with_onnx_metadata(buffer.getvalue(), meta)

    def check(path: Path) -> float:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        g = torch.Generator().manual_seed(1)
        feats = torch.randn(1, frames + 9 * 64, model.input_dim, generator=g) * 3 + 8  # 10 chunks
        got = onnx_chunk_log_probs(session, feats, CHECK_CHUNK, CHECK_LEFT_CHUNKS)
        with torch.no_grad():
            ref = model.ctc_log_probs(*model.encode_streaming(feats, CHECK_CHUNK, CHECK_LEFT_CHUNKS))[0][0]
        return within_tolerance(float((got - ref[:got.shape[0]]).abs().max()), cfg.output)

    gap = write_output(cfg.output, data, check)
    if tokens_txt is not None:
        write_tokens(tokens_txt, sherpa_tokens(tokenizer), cfg.output)
    print(f"export-model: {cfg.checkpoint} -> {cfg.output} and {beside} (onnx, streaming: sherpa-onnx's online "
          f"WeNet CTC "
          f"interface, one chunk of features in, its log-probs and the caches out; {tokenizer.vocab_size} tokens, "
          f"{meta[META_PREFIX + 'sample_rate']} Hz); max |log-prob difference| to the PyTorch chunk-by-chunk "
          f"decode ({CHECK_CHUNK}-frame chunks, {CHECK_LEFT_CHUNKS} left) {gap:.2e}")
    return {"output": str(cfg.output), "format": "onnx", "streaming": True, "max_abs_diff": gap, "tokens": beside}
