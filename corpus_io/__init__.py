"""corpus-io: prepare speech corpora of any size and stream them into training.

Importing the package is cheap: nothing here imports torch. Modules that need
torch (the loader, training) import it themselves.

The Python API (docs/API.md; :mod:`corpus_io.api`) is importable from here, loaded on first use::

    from corpus_io import build_loader, load_config
"""

import importlib.machinery as _machinery
import sys as _sys

__version__ = "0.1.0"

#: the public API, from corpus_io.api (resolved lazily, so `import corpus_io` and `corpus-io --help` stay fast)
__all__ = [
    "Cmvn", "ConfigError", "DataError", "DatasetConf", "FrontEnd", "TokenizerConf", "TrainConfig",
    "build_front_end", "build_loader", "build_tokenizer", "compute_cmvn", "jsonl2scp", "load_cmvn", "load_config",
    "make_datalist", "make_tokenizer", "pack_shards", "read_manifest", "read_shards", "scp2jsonl", "verify_shards",
    "write_manifest", "StreamingTranscriber",
]


def __getattr__(name: str):
    if name in __all__:
        from corpus_io import api  # the one import of the package above its layer: the lazy facade

        return getattr(api, name)
    raise AttributeError(f"module 'corpus_io' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


#: The old module paths (before the wings, issues 30 and 53) -> their homes. Until corpus-io 0.2 the old names
#: import, with a DeprecationWarning, as the moved module objects themselves; a package maps its submodules.
_MOVED = {
    "corpus_io.urls": "corpus_io.storage.urls",
    "corpus_io.files": "corpus_io.storage.files",
    "corpus_io.objects": "corpus_io.storage.objects",
    "corpus_io.progress": "corpus_io.storage.progress",
    "corpus_io.kaldi": "corpus_io.tables.kaldi",
    "corpus_io.manifest": "corpus_io.tables.manifest",
    "corpus_io.inputs": "corpus_io.tables.inputs",
    "corpus_io.exports": "corpus_io.tables.exports",
    "corpus_io.corpora": "corpus_io.tables.corpora",
    "corpus_io.synth": "corpus_io.tables.synth",
    "corpus_io.features": "corpus_io.audio.features",
    "corpus_io.augment": "corpus_io.audio.augment",
    "corpus_io.pipeline": "corpus_io.loader",
    "corpus_io.partition": "corpus_io.loader.partition",
    "corpus_io.batching": "corpus_io.loader.batching",
    "corpus_io.rawlist": "corpus_io.loader.rawlist",
    "corpus_io.dataset": "corpus_io.loader.dataset",
    "corpus_io.executors": "corpus_io.jobs.executors",
    # issue 53: the model and its doors left train/
    **{f"corpus_io.train.{m}": f"corpus_io.model.{m}"
       for m in ("model", "conformer", "frontend", "cmvn", "checkpoint")},
    **{f"corpus_io.train.{m}": f"corpus_io.infer.{m}"
       for m in ("decode", "transcribe", "export", "exported", "sherpa", "tune_lm")},
    "corpus_io.train.scoring": "corpus_io.decoding.scoring",
}
_MOVED_PACKAGES = ("corpus_io.pipeline",)  # their submodules move with them


def _moved(name: str) -> str | None:
    if name in _MOVED:
        return _MOVED[name]
    old = next((p for p in _MOVED_PACKAGES if name.startswith(p + ".")), None)
    return None if old is None else _MOVED[old] + name[len(old):]


class _MovedModule:
    """The import hook of :data:`_MOVED`, first on ``sys.meta_path``: ``import corpus_io.dataset`` binds
    ``corpus_io.loader.dataset`` itself (one module: its state, patches and pickles agree), and
    ``python -m corpus_io.synth`` runs ``corpus_io.tables.synth``."""

    def __init__(self, new: str):
        self.new = new

    @classmethod
    def find_spec(cls, name: str, path=None, target=None):
        new = _moved(name) if name.startswith("corpus_io.") else None
        return None if new is None else _machinery.ModuleSpec(name, cls(new))

    def create_module(self, spec):
        return None  # a stand-in: exec_module puts the moved module in its place

    def exec_module(self, module) -> None:
        import importlib
        import warnings

        warnings.warn(f"{module.__name__} moved to {self.new}; the old name goes in corpus-io 0.2.",
                      DeprecationWarning, stacklevel=2)
        _sys.modules[module.__name__] = importlib.import_module(self.new)

    def get_code(self, name: str):  # runpy: `python -m <old name>`
        import importlib.util
        import warnings

        warnings.warn(f"python -m {name}: it moved to {self.new}; the old name goes in corpus-io 0.2.",
                      FutureWarning, stacklevel=2)
        return importlib.util.find_spec(self.new).loader.get_code(self.new)


def _moved_attribute(package: str, name: str, home: str):
    """``package.name`` where ``package`` was a module and is now its wing (``corpus_io.jobs.run_job``): the name
    from ``home``, with a DeprecationWarning, until corpus-io 0.2; a submodule of the wing is not one."""
    import importlib
    import importlib.util
    import warnings

    if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is not None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")  # a submodule: imported as one
    module = importlib.import_module(home)
    if not hasattr(module, name):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(f"{package}.{name} moved to {home}.{name}; the old name goes in corpus-io 0.2.",
                  DeprecationWarning, stacklevel=3)
    return getattr(module, name)


if not any(isinstance(f, type) and f.__name__ == "_MovedModule" for f in _sys.meta_path):
    _sys.meta_path.insert(0, _MovedModule)
