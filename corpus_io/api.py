"""The Python API: what the ``corpus-io`` commands do, callable from Python (``from corpus_io import ...``).

Everything here is also importable from the package itself, lazily: ``import corpus_io`` stays cheap and
torch-free, and only the functions that need torch (the loader, CMVN) import it when called.

* configs: :func:`load_config` composes a command's config from a dict, a YAML file and/or Hydra overrides,
  with the same checks and messages as the CLI; the schemas (``TrainConfig``, ``DatasetConf``, ...) check
  their types when built in Python too;
* the loader ``train`` uses: :func:`build_loader` (a :class:`corpus_io.loader.dataset.CorpusLoader`: ``set_epoch``,
  ``state_dict``/``load_state_dict``, ``counts``; every DDP rank gets the same number of batches per epoch
  unless ``uneven='allow'``), :func:`build_tokenizer`, :func:`load_cmvn` / :class:`Cmvn`, and
  :func:`build_front_end` (features on the model's device with ``feats_on=model``);
* manifests and shards: :func:`read_manifest`, :func:`write_manifest`, :func:`read_shards`, and the data
  commands as functions (:func:`scp2jsonl`, :func:`jsonl2scp`, :func:`pack_shards`, :func:`make_datalist`,
  :func:`verify_shards`, :func:`make_tokenizer`, :func:`compute_cmvn`) taking the CLI's keys as keyword
  arguments (nested blocks as dicts: ``dataset_conf={"num_workers": 0}``);
* a checkpoint as a recognizer: :class:`StreamingTranscriber` (audio fed in pieces, partial and final results with
  word times, latency per chunk; ``corpus-io transcribe``).

Errors are the CLI's: :class:`ConfigError` (a key or value) and :class:`DataError` (a file, line, key or shard),
one paragraph each.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from corpus_io import config
from corpus_io.commands import COMMANDS
from corpus_io.config import DatasetConf, TokenizerConf, TrainConfig
from corpus_io.errors import ConfigError, DataError
from corpus_io.infer.transcribe import StreamingTranscriber  # torch is imported when one is built

__all__ = [
    "Cmvn", "ConfigError", "DataError", "DatasetConf", "FrontEnd", "TokenizerConf", "TrainConfig",
    "build_front_end", "build_loader", "build_tokenizer", "compute_cmvn", "jsonl2scp", "load_cmvn", "load_config",
    "make_datalist", "make_tokenizer", "pack_shards", "read_manifest", "read_shards", "scp2jsonl", "verify_shards",
    "write_manifest", "StreamingTranscriber",
]

_COMMAND = {c.name: c for c in COMMANDS}
#: train's required keys that the loader and the tokenizer do not read
_UNUSED_BY_LOADER = ("output_dir",)


# --------------------------------------------------------------------------- configs


def load_config(config_or_path: Any = None, overrides: Iterable[str] = (), *, command: str = "train",
                missing_ok: Iterable[str] = ()) -> Any:
    """The checked config of ``command`` (a ``corpus-io`` subcommand; ``train`` by default), built as the CLI
    builds it: the shipped ``conf/<command>.yaml`` (with its groups: ``dataset_conf: shard``, ...), then

    * ``config_or_path`` a YAML file: that file instead (``--config-path DIR --config-name FILE``; its
      ``defaults`` may name the shipped groups);
    * ``overrides``: Hydra overrides, exactly the CLI's (``["++dataset_conf.batch_size=8", ...]``);
    * ``config_or_path`` a dict (or a schema instance): merged over the result, key by key.

    Unknown keys (with the closest valid one), wrong types, values outside their choices or range and
    missing required keys raise the CLI's :class:`ConfigError`; ``missing_ok`` names required keys you do not
    use (they stay ``""``), e.g. ``output_dir`` when you only build the loader.
    """
    cmd = _command(command)
    overrides = [overrides] if isinstance(overrides, str) else list(overrides)
    values: dict | None = None
    path = None
    if dataclasses.is_dataclass(config_or_path) and not isinstance(config_or_path, type):
        values = dataclasses.asdict(config_or_path)
    elif isinstance(config_or_path, Mapping):
        values = _plain(config_or_path)
    elif isinstance(config_or_path, (str, os.PathLike)):
        path = os.fspath(config_or_path)
        if not os.path.isfile(path):
            raise ConfigError(f"config file {path} does not exist. Pass a YAML file of {command}'s keys, a dict, "
                              f"or None for the shipped conf/{command.replace('-', '_')}.yaml.")
    elif config_or_path is not None:
        raise ConfigError(f"load_config takes a YAML path, a dict or a config instance, not "
                          f"{type(config_or_path).__name__}.")
    name = os.path.basename(path) if path else command.replace("-", "_")
    raw = config.compose_raw(name, overrides, config_path=os.path.dirname(os.path.abspath(path)) if path else None)
    if values is not None:
        raw = _merged(raw, values)
    config.keep_given_model(raw, config.override_keys(overrides) | _dotted_keys(values or {}))
    return config.validate(cmd.schema, raw, missing_ok=tuple(missing_ok))


def _dotted_keys(values: dict, prefix: str = "") -> frozenset:
    """``{"model": {"num_blocks": 2}}`` -> ``{"model.num_blocks"}``: the keys a dict sets, as overrides name them."""
    keys: set = set()
    for key, value in values.items():
        keys |= _dotted_keys(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}"}
    return frozenset(keys)


def _command(name: str) -> Any:
    if name not in _COMMAND:
        raise ConfigError(f"there is no corpus-io command {name!r}; the commands are {', '.join(_COMMAND)}.")
    return _COMMAND[name]


def _plain(value: Any) -> Any:
    """Schema instances and mappings inside a dict as plain dicts (what OmegaConf merges)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _merged(base: dict, values: dict) -> dict:
    out = dict(base)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and value:
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _run(command: str, values: dict) -> Any:
    """Run ``command``'s function with its config built from keyword arguments (see :func:`load_config`)."""
    import importlib

    cfg = load_config(values, command=command)
    module, _, function = _command(command).run.partition(":")
    return getattr(importlib.import_module(module), function)(cfg)


# --------------------------------------------------------------------------- the loader


def build_tokenizer(conf: Any = None, **keys: Any) -> Any:
    """The tokenizer ``train`` uses (``encode(text) -> ids``, ``decode(ids) -> text``, ``vocab_size``).

    ``conf``: a ``TokenizerConf``, a dict of its keys, a token list path (``tokens.txt``), or a
    ``TrainConfig`` (its ``tokenizer`` block); ``keys`` set single keys (``type="bpe", bpe_model=...``).
    """
    from corpus_io.tokenizer import build_tokenizer as build

    if isinstance(conf, TrainConfig):
        conf = conf.tokenizer
    if isinstance(conf, (str, os.PathLike)):
        conf = {"token_list": os.fspath(conf)}
    if isinstance(conf, TokenizerConf):
        conf = dataclasses.asdict(conf)
    return build(load_config({"tokenizer": {**(conf or {}), **keys}}, missing_ok=_UNUSED_BY_LOADER).tokenizer)


def build_loader(config_or_path: Any = None, overrides: Iterable[str] = (), *, data_list: str | None = None,
                 tokenizer: Any = None, train: bool = True, uneven: str | None = None, rank: int | None = None,
                 world_size: int | None = None) -> Any:
    """The loader ``corpus-io train`` builds: padded batches of ``keys``, ``feats`` (B, T, D), ``feats_lengths``,
    ``target`` (B, U, padded with -1), ``target_lengths``, ``audio_seconds``, ``padding_ratio``.

    ``config_or_path`` and ``overrides``: ``train``'s config (see :func:`load_config`; a ``TrainConfig``, a dict,
    a YAML path) or a ``DatasetConf`` alone. ``data_list``: default ``train_data_set_list`` (``train=True``) or
    ``valid_data_set_list`` (``train=False``: the cv loader, list order kept, no augmentation).
    ``tokenizer``: default :func:`build_tokenizer` of the config's ``tokenizer`` block. Rank and world size
    come from torch.distributed (torchrun) unless given.

    ``uneven``: what happens when DDP ranks run out of batches at different steps. ``stop`` (the default for
    training): every rank ends the epoch at the step the first one runs out, so a plain ``for batch in loader``
    DDP loop cannot desync (what the others still held is counted in ``loader.epoch_counts()`` as
    ``uneven_ranks.unused`` and carried into the next epoch, which trains it first: ``uneven_ranks.carried``);
    ``error``: a DataError instead; ``allow`` (the default for ``train=False``, which
    has no collectives per batch): every rank yields all of its batches, and your loop keeps the ranks together
    (DDP's ``join()``).

    Call ``loader.set_epoch(e)`` before each epoch (epoch ``e`` shuffles with ``(seed, e)``). ``loader.state_dict()``
    is this rank's exact read position as of the last batch it yielded; after ``loader.load_state_dict(state)``
    the next iteration of that epoch yields exactly the batches not yet consumed (``load_rank_states`` takes every
    rank's states and also resumes on another world size or worker count). There is no ``len()``: a streaming
    epoch's batch count is known only at its end.
    """
    from corpus_io.loader.dataset import build_dataloader, check_uneven
    from corpus_io.model.cmvn import eval_dataset_conf

    if uneven is not None:
        check_uneven(uneven)  # before anything is read
    cfg = _loader_config(config_or_path, overrides)
    if data_list is None:
        data_list = cfg.train_data_set_list if train else cfg.valid_data_set_list
    data_list = os.fspath(data_list) if data_list else None
    if tokenizer is None:
        tokenizer = build_tokenizer(cfg.tokenizer)
    dataset_conf = cfg.dataset_conf if train else eval_dataset_conf(cfg.dataset_conf)
    return build_dataloader(data_list, dataset_conf, tokenizer, train=train, rank=rank, world_size=world_size,
                            uneven=uneven or ("stop" if train else "allow"))


class FrontEnd:
    """``front_end(batch) -> (feats (B, T, D), feats_lengths (B,))`` on ``device`` from a loader batch of either
    kind: with ``dataset_conf.feats_on=model`` (padded waveforms) it computes Kaldi fbank/mfcc there, batched,
    plus spec_aug/sub/trim when ``train`` (as ``train`` does; call ``set_epoch`` with the loader's); with
    ``feats_on=loader`` it moves the loader's ``feats`` to ``device``."""

    def __init__(self, dataset_conf: DatasetConf, device: Any = "cpu", *, train: bool = True) -> None:
        import torch

        from corpus_io.model.frontend import build_front_end as build

        self.device = torch.device(device)
        self.train = train
        self._front_end = build(dataset_conf, self.device)

    def set_epoch(self, epoch: int) -> None:
        if self._front_end is not None:
            self._front_end.set_epoch(epoch)

    def __call__(self, batch: dict) -> tuple[Any, Any]:
        from corpus_io.model.frontend import model_inputs

        return model_inputs(self._front_end, batch, self.device, train=self.train)


def build_front_end(config_or_path: Any = None, overrides: Iterable[str] = (), *, device: Any = "cpu",
                    train: bool = True) -> FrontEnd:
    """The :class:`FrontEnd` of a config (what :func:`build_loader` takes: a ``TrainConfig``, a dict, a YAML path,
    overrides or a ``DatasetConf``); ``train=False`` for cv/decode (no augmentation, no dither)."""
    from corpus_io.model.cmvn import eval_dataset_conf

    conf = config_or_path if isinstance(config_or_path, DatasetConf) and not overrides else \
        _loader_config(config_or_path, overrides).dataset_conf
    return FrontEnd(conf if train else eval_dataset_conf(conf), device, train=train)


def _loader_config(config_or_path: Any, overrides: Iterable[str]) -> TrainConfig:
    """``train``'s config for the loader: a TrainConfig as is (its ranges checked), else :func:`load_config`."""
    if isinstance(config_or_path, DatasetConf):
        config_or_path = {"dataset_conf": config_or_path}
    if isinstance(config_or_path, TrainConfig) and not overrides:
        config.check_values(config_or_path)
        return config_or_path
    return load_config(config_or_path, overrides, command="train", missing_ok=_UNUSED_BY_LOADER)


@dataclasses.dataclass
class Cmvn:
    """Global CMVN stats (``mean``, ``istd`` per feature dimension); ``cmvn(feats)`` is ``(feats - mean) * istd``,
    what ``train``'s model applies to the loader's ``feats`` (B, T, D) or (T, D)."""

    mean: list[float]
    istd: list[float]

    @property
    def dim(self) -> int:
        return len(self.mean)

    def __call__(self, feats: Any) -> Any:
        import torch

        if feats.shape[-1] != self.dim:
            raise ConfigError(f"the CMVN stats have dimension {self.dim}, but the features have {feats.shape[-1]}. "
                              f"Recompute them with the same dataset_conf (fbank_conf.num_mel_bins).")
        mean = torch.tensor(self.mean, dtype=feats.dtype, device=feats.device)
        istd = torch.tensor(self.istd, dtype=feats.dtype, device=feats.device)
        return (feats - mean) * istd

    apply = __call__


def load_cmvn(path: str | os.PathLike, dim: int | None = None) -> Cmvn:
    """CMVN stats from a ``compute-cmvn`` JSON, WeNet's ``global_cmvn``, a Kaldi ``cmvn.ark`` or FunASR's
    ``am.mvn`` (what ``train``'s ``cmvn_file`` takes); ``dim`` checks the feature dimension."""
    from corpus_io.model.cmvn import load_cmvn as load

    mean, istd = load(os.fspath(path), dim)
    return Cmvn(mean, istd)


# --------------------------------------------------------------------------- manifests and shards


def read_manifest(path: str | os.PathLike, *, columns: dict | None = None) -> Iterator[dict]:
    """The utterances of any input the commands read (a FunASR JSONL, a WeNet raw list, a Kaldi dir with
    ``segments``, a NeMo manifest, a Lhotse CutSet or RecordingSet + SupervisionSet, a local Lhotse Shar, Hugging
    Face parquet files; detected by content) as dicts with FunASR names (``key``, ``source``, ``target``, ...;
    ``start``/``end`` in seconds for a segment; ``where``: file:line; a parquet row's audio bytes in
    ``source_bytes``, its columns mapped by ``columns``, e.g. ``{"text": "sentence"}``), streamed after one pass that
    refuses a repeated key; a bad line is a DataError naming file:line."""
    from corpus_io.tables.inputs import iter_records

    yield from iter_records(str(path), columns=columns)


def write_manifest(path: str | os.PathLike, records: Iterable[Mapping]) -> int:
    """Write ``records`` as a JSONL (one object per line, UTF-8), atomically (a temp name renamed when
    complete); returns the number of lines. Each record needs ``key`` and ``source`` (or WeNet's ``wav``)."""
    from corpus_io.storage.files import atomic_write
    from corpus_io.tables.manifest import canonical

    n = 0
    with atomic_write(path) as f:
        for n, record in enumerate(records, 1):
            canonical(dict(record), f"record {n}")  # the same check the readers make
            f.write(json.dumps(dict(record), ensure_ascii=False) + "\n")
    return n


def read_shards(data_list: str | os.PathLike, *, storage_options: dict | None = None) -> Iterator[dict]:
    """Every sample of the shards of a ``data.list`` (or of one ``.tar``), in list order, as dicts: ``key``,
    ``audio`` (the stored bytes), ``audio_format``, ``txt``, ``meta`` (the sample's ``.json``), and any other
    member by its extension. Nothing is decoded (see build_loader for features)."""
    from corpus_io.shards.index import read_datalist
    from corpus_io.shards.reader import read_shard

    path = os.fspath(data_list)
    urls = [path] if path.endswith((".tar", ".tar.gz", ".tgz")) else \
        read_datalist(path, storage_options=storage_options)
    for url in urls:
        for sample in read_shard(url, storage_options=storage_options):
            yield {k: v for k, v in sample.items() if not k.startswith("__")}


def scp2jsonl(scp_file_list: list, jsonl_file_out: str | os.PathLike, *, data_type_list: list | None = None,
              **keys: Any) -> Any:
    """``corpus-io scp2jsonl``: Kaldi tables (``[wav.scp, text]``) -> a FunASR JSONL; other keys as the CLI's."""
    if data_type_list is not None:
        keys["data_type_list"] = data_type_list
    return _run("scp2jsonl", {"scp_file_list": _plain(scp_file_list), "jsonl_file_out": jsonl_file_out, **keys})


def jsonl2scp(jsonl_file_in: str | os.PathLike, scp_file_list: list, **keys: Any) -> Any:
    """``corpus-io jsonl2scp``: a JSONL -> Kaldi tables, one per field."""
    return _run("jsonl2scp", {"jsonl_file_in": jsonl_file_in, "scp_file_list": _plain(scp_file_list), **keys})


def pack_shards(input: str | os.PathLike, output_dir: str | os.PathLike, **keys: Any) -> str:
    """``corpus-io pack-shards``: a JSONL, a WeNet raw list or a Kaldi dir -> tar shards, ``data.list`` and
    ``index.jsonl`` in ``output_dir`` (``num_utts_per_shard=...``, ``audio_format=...``, ...); returns the path
    of the ``data.list`` (of the first ``filter_group`` bucket's directory when there are buckets)."""
    _run("pack-shards", {"input": input, "output_dir": output_dir, **keys})
    groups = keys.get("filter_group") or []
    out = os.path.join(os.fspath(output_dir), groups[0].replace(":", "_")) if groups else os.fspath(output_dir)
    return os.path.join(out, "data.list")


def make_datalist(input: Any, output: str | os.PathLike, **keys: Any) -> str:
    """``corpus-io make-datalist``: a shard list (``data_type="shard"``: dirs, globs, brace ranges) or a raw list
    (``data_type="raw"``: from a JSONL); returns ``output``."""
    _run("make-datalist", {"input": _plain(input), "output": output, **keys})
    return os.fspath(output)


def verify_shards(input: str | os.PathLike, **keys: Any) -> Any:
    """``corpus-io verify-shards``: sha256, grouping, counts, audio and UTF-8 of every shard of a data.list."""
    return _run("verify-shards", {"input": input, **keys})


def make_tokenizer(input: str | os.PathLike, output: str | os.PathLike, **keys: Any) -> Any:
    """``corpus-io make-tokenizer``: a token list (``tokenizer={"type": "char"}``) or a sentencepiece BPE model
    from a Kaldi text or a JSONL."""
    return _run("make-tokenizer", {"input": input, "output": output, **keys})


def compute_cmvn(data_list: str | os.PathLike, output: str | os.PathLike, **keys: Any) -> Cmvn:
    """``corpus-io compute-cmvn``: global CMVN over the features of a list (``dataset_conf={...}`` as the
    training's); writes ``output`` and returns the stats."""
    _run("compute-cmvn", {"data_list": data_list, "output": output, **keys})
    return load_cmvn(output)
