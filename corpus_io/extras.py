"""Optional dependencies: which extra (``pip install -e '.[EXTRA]'`` in a checkout) brings a missing module.

The distribution name ``corpus-io`` is another project's in the public registry, so no install line names
it: :func:`install_line` names this checkout (or asks for one); tests/test_docs.py scans the pages for such lines.

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
    "silero_vad": ("vad", "segment ++vad=silero (silero-vad's model, shipped in its wheel)"),
    "transformers": ("hf", "a Hugging Face CTC model directory as the checkpoint of decode, align, segment or score"),
    "pyarrow": ("parquet", "Hugging Face parquet inputs, training on them and export ++format=hf-parquet"),
}

# fsspec reports a missing backend in its own words, without the module name
_FSSPEC_HINTS = {"s3fs": "s3fs", "aiohttp": "aiohttp", "HTTPFileSystem": "aiohttp"}


def install_line(extra: str) -> str:
    """``pip install -e '/path/to/checkout[EXTRA]'`` for the checkout this package runs from, else with a
    placeholder for it (the name ``corpus-io`` in the public registry is another project)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "corpus_io" / "extras.py").is_file():
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install -e '<path-to-corpus-io-checkout>[{extra}]'"


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
            f"this environment. Install it with: {install_line(extra)} (or [all] for every extra; the name "
            f"corpus-io in the public registry is another project).")
