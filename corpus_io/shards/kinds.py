"""What a shard URL of a data.list is, and the readers of that kind: the one dispatch of the loader, stats and
add-field.

A data.list line names a packed tar (``.tar``/``.tar.gz``, companions beside it), a Lhotse Shar shard (its
``cuts.NNNNNN.jsonl.gz``, the recording tar beside it) or a Hugging Face parquet file (``<file>.parquet``,
its column mapping after ``#``). The readers are imported when asked for, so naming a kind imports neither
pyarrow nor torch.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import IO, Callable, Iterator

TAR = "tar"
SHAR = "lhotse-shar"
PARQUET = "hf-parquet"

#: ``(url, *, storage_options, max_member_bytes, allow_pipe) -> samples`` (docs/DEVELOPING.md "The sample dict")
SampleReader = Callable[..., Iterator[dict]]


def shard_kind(url: str) -> str:
    """:data:`SHAR` for a Shar cuts file, :data:`PARQUET` for a ``.parquet`` entry (column mapping or not),
    else :data:`TAR`; by the name alone, nothing is opened."""
    from corpus_io.tables.shar import is_shar_cuts

    if is_shar_cuts(url):
        return SHAR
    if url.partition("#")[0].endswith(".parquet"):
        return PARQUET
    return TAR


def sample_reader(url: str, *, fields: tuple | list = (), counts: Counter | None = None,
                  wrap: Callable[[IO[bytes]], IO[bytes]] | None = None, views: bool = False) -> SampleReader:
    """The reader of ``url``'s samples. For a tar: ``fields`` (dataset_conf.fields) reads only those, companions
    in lockstep (:func:`corpus_io.shards.fields.open_shard_fields`); else ``wrap`` is applied to the opened
    stream (the loader's profile) and ``views`` gives its members as memoryviews of the read buffer (a reader
    that copies what it keeps: the loader's decode). A Shar shard counts the cuts it passes over in ``counts``; a
    parquet file reads its rows whole (``fields``, ``wrap`` and ``views`` do not apply to either)."""
    kind = shard_kind(url)
    if kind == SHAR:
        from corpus_io.tables.shar import read_shar_shard

        return partial(read_shar_shard, counts=counts)
    if kind == PARQUET:
        from corpus_io.tables.parquet import read_samples

        return read_samples
    if fields:
        from corpus_io.shards.fields import open_shard_fields

        return partial(open_shard_fields, fields=tuple(fields))
    from corpus_io.shards.reader import read_shard

    return partial(read_shard, wrap=wrap, views=views)


def iter_shard_metadata(url: str, *, storage_options: dict | None = None) -> Iterator[dict]:
    """``{key, txt, meta}`` of every utterance of a shard, without reading audio (for stats, add-field): a Shar
    shard's from its cuts file; a listed parquet file's rows carry their audio, so its ``meta`` gets ``duration``
    (seconds) from each row's audio header; a tar's from its meta companion, else its ``txt``/``json`` members."""
    kind = shard_kind(url)
    if kind == SHAR:
        from corpus_io.tables.shar import cut_metadata

        return cut_metadata(url, storage_options=storage_options)
    if kind == PARQUET:
        from corpus_io.tables.parquet import iter_metadata

        return iter_metadata(url, storage_options=storage_options)
    from corpus_io.shards.fields import open_shard_fields

    return open_shard_fields(url, ["txt", "meta"], storage_options=storage_options)
