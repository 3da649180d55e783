"""corpus-io: prepare speech corpora of any size and stream them into training.

Importing the package is cheap: nothing here imports torch. Modules that need
torch (the loader, training) import it themselves.

The Python API (README "Python API"; :mod:`corpus_io.api`) is importable from here, loaded on first use::

    from corpus_io import build_loader, load_config
"""

__version__ = "0.1.0"

#: the public API, from corpus_io.api (resolved lazily, so `import corpus_io` and `corpus-io --help` stay fast)
__all__ = [
    "Cmvn", "ConfigError", "DataError", "DatasetConf", "FrontEnd", "TokenizerConf", "TrainConfig",
    "build_front_end", "build_loader", "build_tokenizer", "compute_cmvn", "jsonl2scp", "load_cmvn", "load_config",
    "make_datalist", "make_tokenizer", "pack_shards", "read_manifest", "read_shards", "scp2jsonl", "verify_shards",
    "write_manifest",
]


def __getattr__(name: str):
    if name in __all__:
        from corpus_io import api  # the one import of the package above its layer: the lazy facade

        return getattr(api, name)
    raise AttributeError(f"module 'corpus_io' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
