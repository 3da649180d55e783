"""An exported model read back (``decode ++checkpoint=model.onnx``, ``.ts``): onnxruntime (the ``[onnx]`` extra,
imported only here, when a file is loaded) or TorchScript, behind a model's ``(x, lengths) -> (log_probs,
lengths)`` interface, with the tokenizer and training config the file carries (:mod:`corpus_io.infer.export`
writes them: ``corpus_io.*`` ONNX metadata_props or TorchScript extra files). A file without them is refused.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import torch

from corpus_io.errors import ConfigError

FORMAT = "corpus-io-ctc/1"
META_PREFIX = "corpus_io."


class OnnxCTC:
    """An exported ONNX model run by onnxruntime: ``model(x, lengths) -> (log_probs, lengths)`` as torch tensors,
    like a PyTorch model's forward. ``inputs``: "features" or "waveform"."""

    def __init__(self, session: Any, meta: dict[str, str], device: Any = "cpu") -> None:
        self.session = session
        self.meta = meta
        self.device = torch.device(device)
        self.inputs = meta[META_PREFIX + "inputs"]
        self.names = [i.name for i in session.get_inputs()]

    def __call__(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype == torch.int16:  # the loader's exact 16-bit samples (k / 32768)
            x = x.float() / 32768.0
        feed = {self.names[0]: x.detach().cpu().float().contiguous().numpy(),
                self.names[1]: lengths.detach().cpu().long().numpy()}
        log_probs, out = self.session.run(None, feed)
        return torch.from_numpy(log_probs).to(self.device), torch.from_numpy(out).to(self.device)

    def front_end(self, batch: dict, *, train: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """A waveform model's inputs from a loader batch (feats_on=model): the waveforms themselves."""
        return batch["wav"], batch["wav_lengths"]


class TorchScriptCTC(OnnxCTC):
    """An exported TorchScript model, with the same interface as :class:`OnnxCTC`."""

    def __init__(self, module: Any, meta: dict[str, str], device: Any) -> None:
        self.module, self.meta, self.device = module, meta, device
        self.inputs = meta[META_PREFIX + "inputs"]

    def __call__(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype == torch.int16:
            x = x.float() / 32768.0
        with torch.no_grad():
            return self.module(x.to(self.device).float(), lengths.to(self.device).long())


#: the suffixes of an exported file, by format: decode tells an exported file from a checkpoint by them
SUFFIXES = {"onnx": (".onnx",), "torchscript": (".ts", ".torchscript")}


def is_exported(path: str) -> bool:
    """Whether ``path`` names an exported model (by its suffix: .onnx, .ts or .torchscript)."""
    return str(path).lower().endswith(tuple(s for names in SUFFIXES.values() for s in names))


def read_metadata(path: str, kind: str | None = None) -> tuple[str, dict[str, str]]:
    """``(kind, metadata)`` of an exported file; a file that is not one of ours is refused in one paragraph.
    ``kind`` ("onnx" or "torchscript"; by default from the suffix) reads a file whose name does not say it (export's
    temp name)."""
    if not Path(path).is_file():
        raise ConfigError(f"exported model {path} does not exist; write one with corpus-io export-model "
                          f"++checkpoint=exp/model.pt ++output={path}.")
    if (kind or ("onnx" if str(path).lower().endswith(".onnx") else "torchscript")) == "onnx":
        import onnx

        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # noqa: BLE001  (protobuf's decode errors have no common type)
            raise ConfigError(f"{path} is not a readable ONNX model ({' '.join(str(exc).split())[:200]}). Give "
                              f"a file written by corpus-io export-model.") from None
        meta, kind = {p.key: p.value for p in proto.metadata_props}, "onnx"
    else:
        meta = {key: "" for key in _REQUIRED}
        try:
            torch.jit.load(str(path), map_location="cpu", _extra_files=meta)
        except Exception as exc:  # noqa: BLE001  (TorchScript load errors are RuntimeErrors of any text)
            raise ConfigError(f"{path} is not a readable TorchScript model ({' '.join(str(exc).split())[:200]}). "
                              f"Give a file written by corpus-io export-model ++format=torchscript.") from None
        meta = {k: v.decode() if isinstance(v, bytes) else v for k, v in meta.items() if v}
        kind = "torchscript"
    if meta.get(META_PREFIX + "format") != FORMAT or any(key not in meta for key in _REQUIRED):
        found = meta.get(META_PREFIX + "format")
        how = ("corpus-io export-model ++checkpoint=exp/model.pt ++output=model.onnx" if kind == "onnx" else
               "corpus-io export-model ++checkpoint=exp/model.pt ++output=model.ts ++format=torchscript")
        raise ConfigError(f"{path} is a {kind} model without corpus-io's metadata ({META_PREFIX}format="
                          f"{found!r}, expected {FORMAT!r}; the token list, features and sample rate travel "
                          f"there), so decode cannot tell what its inputs and outputs mean. Export the model with "
                          f"{how}, or decode the PyTorch checkpoint.")
    return kind, meta


_REQUIRED = tuple(META_PREFIX + k for k in ("format", "inputs", "tokens", "tokenizer", "sample_rate", "features",
                                             "subsampling", "frame_shift_ms", "blank_id", "config"))


def load_exported(path: str, device: Any, kind: str | None = None) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, training config)`` of an exported file, as ``decode.load_model`` gives them for a
    checkpoint (``kind``: as :func:`read_metadata`). The token list (and a sentencepiece model) are written to a
    private temporary directory."""
    import atexit
    import shutil
    import tempfile

    from omegaconf import OmegaConf

    from corpus_io.config import TrainConfig, saved_features, validate
    from corpus_io.tokenizer import build_tokenizer

    kind, meta = read_metadata(path, kind)
    if meta[META_PREFIX + "inputs"] == "chunk":
        raise ConfigError(f"{path} is a streaming export (export-model with streaming=true: one chunk and its caches "
                          f"per call, for sherpa-onnx's OnlineRecognizer), which is not run here. Decode the PyTorch "
                          f"checkpoint chunk by chunk (corpus-io decode ++decoding_chunk_size=16), or give the file "
                          f"of an export without streaming.")
    tcfg = validate(TrainConfig, saved_features(OmegaConf.to_container(OmegaConf.create(meta[META_PREFIX + "config"]),
                                                                       resolve=True)))
    tmp = tempfile.mkdtemp(prefix="corpus-io-exported-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    (Path(tmp) / "tokens.txt").write_text(meta[META_PREFIX + "tokens"], encoding="utf-8")
    tcfg.tokenizer.token_list = str(Path(tmp) / "tokens.txt")
    if META_PREFIX + "bpe_model" in meta:
        (Path(tmp) / "bpe.model").write_bytes(base64.b64decode(meta[META_PREFIX + "bpe_model"]))
        tcfg.tokenizer.bpe_model = str(Path(tmp) / "bpe.model")
    tokenizer = build_tokenizer(tcfg.tokenizer)
    if meta[META_PREFIX + "inputs"] == "waveform":
        tcfg.dataset_conf.feats_on = "model"  # the loader ships waveforms; the file computes the features
    if kind == "onnx":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return OnnxCTC(session, meta, device), tokenizer, tcfg
    module = torch.jit.load(str(path), map_location=device).eval()
    return TorchScriptCTC(module, meta, device), tokenizer, tcfg
