"""Optional dependencies: which ``pip install 'corpus-io[EXTRA]'`` brings a missing module.

The core install (data preparation) has no torch; the loader, training and remote storage come
with extras. A command that reaches a missing module fails with one paragraph naming the extra
(``cli/_app.run_with_errors`` turns the ImportError into it), never a traceback.
"""

from __future__ import annotations

# top-level module -> (extra, what needs it)
EXTRA_OF_MODULE = {
    "torch": ("train", "the loader, train, decode, compute-cmvn, average, fbank/mfcc and resampling"),
    "torchaudio": ("train", "the loader, train, decode, compute-cmvn, average, fbank/mfcc and resampling"),
    "tensorboard": ("train", "training logs"),
    "kaldialign": ("train", "CER/WER scoring in decode"),
    "s3fs": ("s3", "s3:// URLs"),
    "aiohttp": ("http", "http(s):// URLs"),
    "matplotlib": ("plots", "the stats PNG histogram"),
    "duckdb": ("explore", "corpus-io explore (its catalog engine)"),
    "distributed": ("dask", "executor=dask"),
    "onnx": ("onnx", "export-model ++format=onnx and decoding an exported .onnx model"),
    "onnxruntime": ("onnx", "decoding an exported .onnx model (decode ++checkpoint=model.onnx)"),
    "sherpa_onnx": ("deploy", "serving an export with sherpa-onnx (recipes/tools/sherpa_decode.py)"),
    "pyarrow": ("parquet", "Hugging Face parquet inputs, training on them and export ++format=hf-parquet"),
}

# fsspec reports a missing backend in its own words, without the module name
_FSSPEC_HINTS = {"s3fs": "s3fs", "aiohttp": "aiohttp", "HTTPFileSystem": "aiohttp"}


def missing_extra_message(exc: ImportError) -> str | None:
    """One paragraph for an ImportError of an optional module, or None when it is not one of ours."""
    name = (exc.name or "").split(".")[0]
    if name not in EXTRA_OF_MODULE:
        text = str(exc)
        name = next((mod for hint, mod in _FSSPEC_HINTS.items() if hint in text), "")
        if not name:
            return None
    extra, what = EXTRA_OF_MODULE[name]
    return (f"this command needs the optional package '{name}' ({what}), which is not installed in "
            f"this environment. Install it with: pip install 'corpus-io[{extra}]' "
            f"(or 'corpus-io[all]' for every extra).")
