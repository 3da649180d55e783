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
    """``ConformerCTC.forward`` with the padding mask an explicit argument of each layer (no hooks, no state on
    the model): the same operations, so the same log-probs. With ``front_end`` the inputs are waveforms."""

    def __init__(self, model: nn.Module, front_end: ExportFrontEnd | None = None) -> None:
        super().__init__()
        self.model = model
        self.front_end = front_end

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.front_end is not None:
            x, lengths = self.front_end(x, lengths)
        encoded, out_lengths = encode_explicit(self.model, x, lengths)
        return torch.log_softmax(self.model.ctc(encoded).float(), dim=-1), out_lengths


def encode_explicit(model: nn.Module, feats: torch.Tensor, feats_lengths: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                   torch.Tensor]:
    """``model.encode`` (a ConformerCTC in eval mode) with the mask passed to every layer explicitly."""
    x = model.cmvn(feats)
    frames = torch.arange(x.shape[1], device=x.device)[None, :]
    x = x.masked_fill((frames >= feats_lengths[:, None])[..., None], 0.0)
    x = model.embed.conv(x.unsqueeze(1))  # (B, C, T', F')
    b, c, t, f = x.shape
    x = model.embed.out(x.transpose(1, 2).reshape(b, t, c * f))
    lengths = model.embed.output_lengths(feats_lengths)
    lengths = torch.minimum(lengths.clamp(min=0), torch.full_like(lengths, 1) * t)
    if model.pos_enc_layer_type == "abs_pos":
        x = x * math.sqrt(x.shape[-1]) + _sinusoids(x.shape[1], x.shape[-1], x.device).to(x.dtype)
    pad = torch.arange(x.shape[1], device=x.device)[None, :] >= lengths.clamp(min=1)[:, None]
    x = x.transpose(0, 1)
    for layer in model.encoder.conformer_layers:
        x = conformer_layer(layer, x, pad)
    return x.transpose(0, 1), lengths


def conformer_layer(layer: nn.Module, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """torchaudio's ``ConformerLayer.forward`` (T, B, D) with padding zeroed before the depthwise convolution."""
    def convolution(x: torch.Tensor) -> torch.Tensor:
        module = layer.conv_module
        y = module.layer_norm(x.transpose(0, 1)).transpose(1, 2)  # (B, D, T)
        seq = module.sequential
        y = seq[1](seq[0](y)).masked_fill(pad[:, None, :], 0.0)
        for i in range(2, len(seq)):
            y = seq[i](y)
        return x + y.transpose(1, 2).transpose(0, 1)

    x = layer.ffn1(x) * 0.5 + x
    if layer.convolution_first:
        x = convolution(x)
    residual = x
    y = layer.self_attn_layer_norm(x)
    x = layer.self_attn_dropout(self_attention(layer.self_attn, y, pad)) + residual
    if not layer.convolution_first:
        x = convolution(x)
    x = layer.ffn2(x) * 0.5 + x
    return layer.final_layer_norm(x)


def self_attention(mha: nn.MultiheadAttention, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """``nn.MultiheadAttention(x, x, x, key_padding_mask=pad, need_weights=False)`` (T, B, D) in eval mode, as
    ``F.multi_head_attention_forward`` computes it (one projection, an additive -inf mask, scaled dot-product
    attention), with every reshape's time and batch taken from the tensor (tracing keeps them dynamic)."""
    heads, dim = mha.num_heads, mha.embed_dim
    q, k, v = nn.functional.linear(x.transpose(0, 1), mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (t.unflatten(-1, (heads, dim // heads)).transpose(1, 2) for t in (q, k, v))  # (B, H, T, d)
    mask = torch.zeros(pad.shape, dtype=q.dtype, device=q.device).masked_fill(pad, float("-inf"))[:, None, None, :]
    y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, d)
    y = nn.functional.linear(y.permute(2, 0, 1, 3).flatten(2), mha.out_proj.weight, mha.out_proj.bias)
    return y  # (T, B, D)


def _sinusoids(length: Any, dim: int, device: Any) -> torch.Tensor:
    """``model._sinusoids`` without slice assignment (sin and cos interleaved by a stack)."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    return torch.stack([torch.sin(pos * inv), torch.cos(pos * inv)], dim=-1).reshape(-1, dim)


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
    if model.pos_enc_layer_type == "abs_pos" and model.ctc.in_features % 2:
        raise ConfigError(f"export-model: checkpoint {where} uses pos_enc_layer_type=abs_pos with an odd "
                          f"output_size ({model.ctc.in_features}), which the exporter does not handle; decode it "
                          f"with the PyTorch checkpoint.")


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
    beside = ""
    if tokens_txt is not None:
        write_output(tokens_txt, sherpa_tokens(tokenizer).encode("utf-8"), lambda path: None)
        beside = f" and {tokens_txt} (sherpa-onnx's tokens.txt, for OfflineRecognizer.from_wenet_ctc)"
    what = "waveform" if front is not None else "features"
    print(f"export-model: {cfg.checkpoint} -> {cfg.output}{beside} ({cfg.format}, {what} in, log-probs out; "
          f"{tokenizer.vocab_size} tokens, {meta[META_PREFIX + 'sample_rate']} Hz, subsampling {SUBSAMPLING}); "
          f"max |log-prob difference| to PyTorch on a check batch {gap:.2e}")
    return {"output": str(cfg.output), "format": cfg.format, "frontend": bool(cfg.frontend), "max_abs_diff": gap,
            "tokens": str(tokens_txt) if tokens_txt is not None else None}


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
                 "high_freq": f"{float(c.high_freq):g}", "snip_edges": "true", "preemph_coeff": f"{PREEMPHASIS:g}",
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
