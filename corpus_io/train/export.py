"""``corpus-io export-model``: a trained CTC checkpoint as one self-contained ONNX or TorchScript file (read back for
``decode ++checkpoint=model.onnx`` by :mod:`corpus_io.train.exported`).

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
subsampling factor and frame shift, the inputs kind and the training config (YAML) decode reads.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from corpus_io.errors import ConfigError
from corpus_io.train.exported import FORMAT, META_PREFIX, SUFFIXES, load_exported

SUBSAMPLING = 4
ONNX_OPSET = 17


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
        from corpus_io.audio.features import EPSILON, INT16_SCALE, PREEMPHASIS

        x = wav.float() * INT16_SCALE
        frames = torch.where(lengths >= self.window,
                             torch.div(lengths - self.window, self.shift, rounding_mode="floor") + 1,
                             torch.zeros_like(lengths))
        count = torch.div(x.shape[1] - self.window, self.shift, rounding_mode="floor") + 1
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
    """``ConformerCTC.forward`` (full context, plain tensor ops: :mod:`corpus_io.train.conformer`), so the same
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
    from corpus_io.train.model import ConformerCTC

    if type(model) is not ConformerCTC:
        name = f"{type(model).__module__}.{type(model).__name__}"
        raise ConfigError(f"export-model exports corpus_io.train.model.ConformerCTC (CTC-only) models; the model of "
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
    from corpus_io.storage.files import refuse_overwriting_inputs, refuse_remote_output
    from corpus_io.train.decode import load_model  # decode reads exported files through exported.py, not here

    require(cfg, "checkpoint", "output")
    refuse_remote_output(cfg.output, "++output", "export-model", objects=True)
    refuse_wrong_suffix(cfg.output, cfg.format)
    refuse_overwriting_inputs([("++output", cfg.output)], [("++checkpoint", cfg.checkpoint)])
    if cfg.format == "onnx":
        import onnx  # noqa: F401  (the [onnx] extra, before the model is loaded)
    model, tokenizer, tcfg = load_model(cfg.checkpoint, torch.device("cpu"))
    refuse_overwriting_inputs([("++output", cfg.output)], [
        (f"tokenizer.token_list of checkpoint {cfg.checkpoint}", tcfg.tokenizer.token_list),
        (f"tokenizer.bpe_model of checkpoint {cfg.checkpoint}", tcfg.tokenizer.bpe_model),
        (f"cmvn_file of checkpoint {cfg.checkpoint}", tcfg.cmvn_file)])
    exportable(model, cfg.checkpoint)
    dconf = tcfg.dataset_conf
    if cfg.frontend and dconf.feats_type not in ("fbank", "mfcc"):
        raise ConfigError(f"++frontend=true exports the fbank/mfcc front end, but checkpoint {cfg.checkpoint} was "
                          f"trained on dataset_conf.feats_type={dconf.feats_type}; export without the front end.")
    meta = metadata(tcfg, tokenizer, frontend=bool(cfg.frontend))
    front = None
    if cfg.frontend:
        front = ExportFrontEnd(dconf.feats_type, feature_options(dconf), dconf.resample_conf.resample_rate,
                               exact_fft=cfg.format == "torchscript")
    module = ExportedCTC(model, front).eval()
    example = example_inputs(module, model.input_dim)
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
        return check_against(module, exported, model.input_dim)

    gap = write_output(cfg.output, data, check)
    what = "waveform" if front is not None else "features"
    print(f"export-model: {cfg.checkpoint} -> {cfg.output} ({cfg.format}, {what} in, log-probs out; "
          f"{tokenizer.vocab_size} tokens, {meta[META_PREFIX + 'sample_rate']} Hz, subsampling {SUBSAMPLING}); "
          f"max |log-prob difference| to PyTorch on a check batch {gap:.2e}")
    return {"output": str(cfg.output), "format": cfg.format, "frontend": bool(cfg.frontend), "max_abs_diff": gap}


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
    tok = dataclasses.asdict(tcfg.tokenizer)
    meta = {"format": FORMAT, "inputs": "waveform" if frontend else "features",
            "tokens": token_list_text(tokenizer.symbols), "tokenizer": json.dumps(tok, ensure_ascii=False),
            "sample_rate": str(int(dconf.resample_conf.resample_rate)), "features": json.dumps(features),
            "subsampling": str(SUBSAMPLING), "frame_shift_ms": str(_frame_shift(dconf)),
            "blank_id": "0", "config": OmegaConf.to_yaml(OmegaConf.structured(tcfg))}
    if tcfg.tokenizer.type == "bpe" and tcfg.tokenizer.bpe_model:
        meta["bpe_model"] = base64.b64encode(Path(tcfg.tokenizer.bpe_model).read_bytes()).decode("ascii")
    return {META_PREFIX + k: v for k, v in meta.items()}


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
