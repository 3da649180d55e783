"""Hugging Face parquet in and out: the corpora of the Hub (``data/train-00000-of-00042.parquet``).

An **input** is a ``.parquet`` file, a directory of them (searched recursively; one split: the split of an HF file
is the part of its name before ``-NNNNN-of-NNNNN``) or a glob, local, ``s3://`` or ``http(s)://``. Files are read
row group by row group through a seekable file (:func:`corpus_io.storage.urls.open_url` ``seekable=True``: ranged
reads), so memory holds one row group's columns, never a whole file.

Columns (:func:`resolve_columns`): ``audio`` (a struct ``{bytes, path}`` as HF's ``Audio`` stores it, or
``{array, sampling_rate}``: decoded samples, encoded here as 16-bit WAV), ``text``, ``key`` and ``speaker``, given
as ``++columns.<role>=<column>`` or found by the common names below; other scalar columns are kept as fields.
An ``audio`` whose ``bytes`` is null but whose ``path`` names a file is read from that file (a dataset saved
without embedding its audio).

Records (:class:`ParquetInput`, what :func:`corpus_io.tables.inputs.open_input` gives) carry the audio bytes
themselves in ``source_bytes`` (:data:`INLINE`) and ``source = <file>#row=<N>`` (for messages and digests).

The **loader** reads a parquet file listed in a shard data.list as one unit (:func:`read_samples`: the samples of
a tar shard, row by row); :func:`index_entry` makes its index entry (counts, durations from the audio headers,
keys) in one pass that decodes no audio. A list entry may carry a column mapping as ``<file>#audio=a&text=b``
(:func:`with_columns`).

The **writer** (:func:`write_hf_parquet`, ``corpus-io export ++format=hf-parquet``) writes ``id``, ``audio``
(``{bytes, path}``, bytes copied) and ``text`` (plus ``speaker`` and the records' other scalar fields) with HF's
features in the schema metadata, so ``datasets.load_dataset("parquet", ...)`` gives an ``Audio`` column.

pyarrow is imported inside functions: ``corpus-io --help`` does not load it.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import parse_qsl, urlencode

import numpy as np

from corpus_io.audio import io as audio
from corpus_io.errors import ConfigError, DataError
from corpus_io.keys import first_repeated_key, key_hash, one_token
from corpus_io.storage import urls

log = logging.getLogger(__name__)

INLINE = "source_bytes"  # the record field holding the audio bytes of a parquet row
KIND = "hf-parquet"
ROLES = ("audio", "text", "key", "speaker")
AUDIO_NAMES = ("audio", "speech", "wav")
TEXT_NAMES = ("text", "sentence", "transcription", "normalized_text", "transcript", "raw_text")
KEY_NAMES = ("id", "key", "utt_id", "segment_id", "audio_id")
SPEAKER_NAMES = ("speaker_id", "speaker", "client_id")
# how a message names the columns option: the loader reads what make-datalist put in the list line
_NAME_IT = "make-datalist, pack-shards or export with "
_SPLIT = re.compile(r"(.+?)-\d{5}-of-\d{5}\.parquet$")


# --------------------------------------------------------------------------- files


def is_parquet(path: str, tree: Iterable[tuple[str, list[str], list[str]]] | None = None) -> bool:
    """Whether ``path`` names parquet input: a ``.parquet`` file or glob (also a URL), or a local directory
    holding ``.parquet`` files (recursively). ``tree``: the ``os.walk(path)`` of that directory when the caller
    has listed it already (input detection lists it once)."""
    base = split_entry(str(path))[0]
    if base.endswith(".parquet"):
        return True
    if tree is None:
        if urls.is_remote(base) or not os.path.isdir(base):
            return False
        tree = os.walk(base)
    return any(f.endswith(".parquet") for _, _, files in tree for f in files)


def parquet_in(tree: Iterable[tuple[str, list[str], list[str]]]) -> list[str]:
    """The ``.parquet`` files of a directory's ``os.walk`` ``tree``, sorted."""
    return sorted(os.path.join(root, f) for root, _, files in tree for f in files if f.endswith(".parquet"))


def split_of(url: str) -> str:
    """The HF split of a file name (``train-00000-of-00042.parquet`` -> ``train``), else the file's stem."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    m = _SPLIT.match(name)
    return m.group(1) if m else name.removesuffix(".parquet")


def parquet_files(spec: str, storage_options: dict | None = None, listed: Iterable[str] | None = None) -> list[str]:
    """The parquet files of an input, sorted: the file, a directory's files (one split only: a directory with
    several is refused with the globs that pick one), or a glob's matches (local or on object storage).
    ``listed``: a local directory's parquet files when the caller has walked it (input detection walks it once)."""
    spec = str(spec)
    if urls.is_remote(spec):
        if not glob.has_magic(spec):
            return [spec]
        fs, path = urls.filesystem(spec, storage_options)
        proto = spec.split("://", 1)[0]
        found = sorted(f"{proto}://{p}" for p in fs.glob(path) if p.endswith(".parquet"))
    elif os.path.isdir(spec):
        found = sorted(listed) if listed is not None else parquet_in(os.walk(spec))
        splits = sorted({split_of(f) for f in found})
        if len(splits) > 1:
            rel = [os.path.relpath(f, spec) for f in found]
            raise DataError(f"{spec} holds the parquet files of {len(splits)} splits ({', '.join(splits)}); one "
                            f"input is one split. Give the split's files as a glob, e.g. "
                            f"'{os.path.join(spec, os.path.dirname(rel[0]), splits[0])}-*.parquet'.")
    elif glob.has_magic(spec):
        found = sorted(glob.glob(spec, recursive=True))
    else:
        if not os.path.isfile(spec):
            raise DataError(f"input {spec} does not exist. Give a .parquet file, a directory of them or a glob.")
        found = [spec]
    if not found:
        raise DataError(f"{spec} names no .parquet file. Check the path or glob (quote a glob in the shell).")
    return found


def open_file(url: str, storage_options: dict | None = None) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` of ``url``: a local file, or a remote one read by ranges. A file that is
    not parquet (or is truncated) is a DataError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source: Any = url
    if urls.is_remote(url):
        # no read-ahead: pyarrow asks for the footer and the column chunks it needs, each one ranged read
        source = urls.open_url(url, storage_options=storage_options, seekable=True, cache_type="none")
    else:
        urls.check_regular_file(urls.local_path(url))
        source = urls.local_path(url)
    try:
        try:
            return pq.ParquetFile(source)
        except ValueError as exc:  # an HTTP server that ignores Range: the file whole, up to a bound
            if not urls.no_range_support(exc):
                raise
            log.warning("%s: the server does not answer Range requests; reading the file whole (at most %d bytes)",
                        url, urls.MAX_WHOLE_BYTES)
            return pq.ParquetFile(pa.BufferReader(urls.read_whole(url, storage_options=storage_options)))
    except FileNotFoundError:
        raise DataError(f"{url} does not exist. Check the path.") from None
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{url} is not a readable parquet file ({exc}); a truncated download? Fetch it again (its "
                        f"size should match the source's).") from None


# --------------------------------------------------------------------------- columns


@dataclass(frozen=True)
class Columns:
    """Which column plays which role; ``key``/``speaker`` None: the key is the audio path's stem (else
    ``<file stem>-<row>``), no speaker. ``extra``: other scalar columns, kept as fields."""

    audio: str
    text: str
    key: str | None = None
    speaker: str | None = None
    extra: tuple = ()


def _scalar(field: Any) -> bool:
    import pyarrow.types as t

    kind = field.type
    return (t.is_string(kind) or t.is_large_string(kind) or t.is_integer(kind) or t.is_floating(kind)
            or t.is_boolean(kind))


def resolve_columns(schema: Any, columns: dict | None, where: str) -> Columns:
    """The :class:`Columns` of a file with arrow ``schema``: ``columns`` (role -> column, e.g. from
    ``++columns``) first, then the common names; a DataError listing the columns when a role cannot be told."""
    given = {k: v for k, v in dict(columns or {}).items() if v not in (None, "")}
    unknown = sorted(set(given) - set(ROLES))
    if unknown:
        raise ConfigError(f"columns.{unknown[0]} is not a column role; the roles are {', '.join(ROLES)} "
                          f"(e.g. columns.text=sentence).")
    names = list(schema.names)
    listing = ", ".join(f"{f.name} ({f.type})" for f in schema)
    for role, name in given.items():
        if name not in names:
            raise DataError(f"{where} has no column '{name}' (columns.{role}); its columns: {listing}.")

    def pick(role: str, candidates: tuple, required: bool) -> str | None:
        if role in given:
            return given[role]
        found = next((n for n in candidates if n in names), None)
        if found is None and role == "audio":  # a struct holding encoded bytes or samples
            structs = [f.name for f in schema if hasattr(f.type, "get_field_index")
                       and (f.type.get_field_index("bytes") >= 0 or f.type.get_field_index("array") >= 0)]
            found = structs[0] if len(structs) == 1 else None
        if found is None and required:
            raise DataError(f"{where}: cannot tell which column holds the {role} (looked for "
                            f"{', '.join(candidates)}); its columns: {listing}. Name it: "
                            f"{_NAME_IT}columns.{role}=<column>.")
        return found

    col_audio = pick("audio", AUDIO_NAMES, True)
    col_text = pick("text", TEXT_NAMES, True)
    col_key, col_speaker = pick("key", KEY_NAMES, False), pick("speaker", SPEAKER_NAMES, False)
    kind = schema.field(col_audio).type
    if not (hasattr(kind, "get_field_index") and (kind.get_field_index("bytes") >= 0
                                                  or kind.get_field_index("array") >= 0)):
        raise DataError(f"{where}: column '{col_audio}' ({kind}) is not audio: corpus-io reads a struct "
                        f"{{bytes, path}} (HF's Audio) or {{array, sampling_rate}}; its columns: {listing}. Name the "
                        f"audio column: {_NAME_IT}columns.audio=<column>.")
    used = {col_audio, col_text, col_key, col_speaker}
    extra = tuple(f.name for f in schema if f.name not in used and _scalar(f))
    return Columns(col_audio, col_text, col_key, col_speaker, extra)


def locator(url: str, columns: dict | None, row: int) -> str:
    """The source of one row's audio, ``<file>#[<columns>&]row=<N>`` (read by :func:`read_audio`)."""
    return with_columns(url, {**dict(columns or {}), "row": str(row)})


def is_locator(source: str) -> bool:
    url, sep, fragment = source.partition("#")
    return bool(sep) and url.endswith(".parquet") and "row=" in fragment


_READERS: dict[tuple, ParquetFileReader] = {}


def read_audio(source: str, storage_options: dict | None = None) -> bytes:
    """The audio bytes a :func:`locator` names, read a row group at a time (this process keeps the last file's
    reader and its last row group: a shard's rows come in runs of one group)."""
    url, columns = split_entry(source)
    row = int(columns.pop("row"))
    key = (url, tuple(sorted(columns.items())), json.dumps(storage_options or {}, sort_keys=True))
    if key not in _READERS:
        _READERS.clear()
        _READERS[key] = ParquetFileReader(url, columns, storage_options)
    return _READERS[key].audio_of_row(row)


def split_entry(entry: str) -> tuple[str, dict]:
    """``(url, columns)`` of a data.list entry ``<file>.parquet#audio=a&text=b`` (columns empty without one)."""
    url, sep, fragment = entry.partition("#")
    if sep and url.endswith(".parquet"):
        return url, dict(parse_qsl(fragment))
    return entry, {}


def with_columns(url: str, columns: dict | None) -> str:
    """The data.list entry of ``url`` read with the column mapping ``columns`` (only the roles given)."""
    given = {k: v for k, v in sorted(dict(columns or {}).items()) if v not in (None, "")}
    return f"{url}#{urlencode(given)}" if given else url


# --------------------------------------------------------------------------- rows


def _audio_of(value: Any, where: str) -> tuple[bytes | None, str | None]:
    """``(bytes, path)`` of one audio cell: encoded bytes as stored, decoded samples encoded as WAV, or
    ``(None, path)`` for audio not embedded (``(None, None)``: null)."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise DataError(f"{where}: the audio cell is {type(value).__name__}, not a struct {{bytes, path}}.")
    path = value.get("path") or None
    data = value.get("bytes")
    if data is not None:
        return bytes(data), path
    samples = value.get("array")
    if samples is not None:
        rate = value.get("sampling_rate")
        if not isinstance(rate, int) or rate <= 0:
            raise DataError(f"{where}: the audio has samples but sampling_rate is {rate!r}.")
        wave = np.asarray(samples, dtype=np.float32)
        audio.non_finite(wave, where)
        return audio.encode(wave, rate, "wav"), path
    return None, path


def _audio_cells(column: Any) -> Callable[[int, str], tuple[bytes | None, str | None]]:
    """``cell(j, where)``: :func:`_audio_of` of row ``j`` of a row group's audio column. A ``{bytes, path}`` column
    (HF's ``Audio``) is taken as two lists, its binary child straight to ``bytes``, with no dict per row."""
    kind = column.type
    names = [kind.field(i).name for i in range(kind.num_fields)]
    if "array" in names:  # decoded samples: encoded per row
        cells = column.to_pylist()
        return lambda j, where: _audio_of(cells[j], where)
    struct = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    flat = dict(zip(names, struct.flatten()))  # flatten: a null struct's children read as null
    blobs = flat["bytes"].to_pylist() if "bytes" in flat else [None] * len(struct)
    paths = flat["path"].to_pylist() if "path" in flat else [None] * len(struct)
    return lambda j, where: (blobs[j], paths[j] or None)


def _stem(path: str) -> str:
    return "_".join(os.path.splitext(os.path.basename(path.rstrip("/")))[0].split())


@dataclass
class Row:
    """One row: ``index`` in the file, its key, text (None: null), audio bytes (None: not embedded or null),
    the audio's ``path`` and the extra fields."""

    index: int
    key: str
    text: Any
    data: bytes | None
    path: str | None
    fields: dict


def _key_of(cols: Columns, key: Any, path: Any, url: str, index: int) -> str:
    if cols.key is not None and key not in (None, ""):
        return one_token(str(key), f"{url} row {index}")
    # a key made from a name: its whitespace replaced, as nemo_key does
    if path:
        return "_".join(_stem(str(path)).split())
    return "_".join(f"{_stem(url)}-{index:08d}".split())


class ParquetFileReader:
    """Row groups of one file, read with the columns they need (``audio=False``: every column but the audio bytes,
    whose path is kept)."""

    def __init__(self, url: str, columns: dict | None = None, storage_options: dict | None = None):
        self.url = url
        self.file = open_file(url, storage_options)
        self.cols = resolve_columns(self.file.schema_arrow, columns, url)
        meta = self.file.metadata
        self.sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.num_rows = int(sum(self.sizes))
        self.starts = [int(x) for x in np.cumsum([0, *self.sizes[:-1]])] if self.sizes else [0]  # first row of each
        self._cached: tuple[int, Callable] = (-1, _audio_of)  # audio_of_row: (row group, its audio cells)

    def _group(self, i: int, audio_bytes: bool, only_audio: bool = False) -> Any:
        import pyarrow as pa

        cols = self.cols
        wanted = [] if only_audio else [c for c in (cols.key, cols.text, cols.speaker, *cols.extra) if c]
        if audio_bytes:
            wanted.append(cols.audio)
        elif self._has_path():  # a key may be the audio path's stem: the path, never the bytes
            wanted.append(f"{cols.audio}.path")
        try:
            # one thread: the loader's and pack-shards' worker processes are the parallelism (no pool per worker)
            return self.file.read_row_group(i, columns=list(dict.fromkeys(wanted)), use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{self.url}: row group {i} cannot be read ({exc}); the file is damaged or truncated. "
                            f"Fetch it again.") from None

    def _has_path(self) -> bool:
        return self.file.schema_arrow.field(self.cols.audio).type.get_field_index("path") >= 0

    def rows(self, *, audio: bool = True, start: int = 0, order: Callable[[int, int], Any] | None = None
             ) -> Iterator[Row]:
        """Rows from row ``start`` on, a row group at a time (``audio=False``: without the audio bytes);
        ``order(group, n)``: the order of a group's rows (a permutation), else file order."""
        first = 0
        for g, size in enumerate(self.sizes):
            if first + size <= start:
                first += size
                continue
            table = self._group(g, audio)
            cols = self.cols
            column = {name: table.column(name).to_pylist() for name in table.column_names if name != cols.audio}
            # audio=False: the paths only (or nothing)
            cells = _audio_cells(table.column(cols.audio)) if cols.audio in table.column_names else None
            positions = range(size) if order is None else order(g, size)
            for j in positions:
                index = first + int(j)
                if index < start:
                    continue
                data, path = cells(int(j), f"{self.url} row {index}") if cells is not None else (None, None)
                key = _key_of(cols, column[cols.key][j] if cols.key else None, path, self.url, index)
                fields = {name: column[name][j] for name in cols.extra if name in column
                          and column[name][j] is not None}
                if cols.speaker and column[cols.speaker][j] is not None:
                    fields["speaker"] = str(column[cols.speaker][j])
                yield Row(index, key, column[cols.text][j], data, path, fields)
            first += size

    def audio_of_row(self, index: int) -> bytes:
        """The audio bytes of row ``index`` (a worker's read: the row group's audio column, kept for the next
        rows of the group)."""
        import bisect

        g = bisect.bisect_right(self.starts, index) - 1
        first = self.starts[g] if 0 <= index < self.num_rows else -1
        if first < 0:
            raise DataError(f"{self.url} has {self.num_rows} rows, no row {index}; the file changed since it was "
                            f"listed. Run the command again.")
        if self._cached[0] != g:
            self._cached = (g, _audio_cells(self._group(g, True, only_audio=True).column(self.cols.audio)))
        data, path = self._cached[1](index - first, "its audio cell")  # the caller names the row and key
        if data is None and path:  # not embedded: the file it names
            data = audio.read_source_bytes(path)
        if data is None:
            raise DataError("its audio is null")  # the caller names the row and key
        return data


# --------------------------------------------------------------------------- records (tables.inputs)


class ParquetInput:
    """A parquet input as :class:`corpus_io.tables.inputs.Input` serves it to pack-shards, export and
    :func:`corpus_io.tables.inputs.iter_records`: ``scan`` (count and duplicate keys, reading keys and texts only),
    ``records(shuffle, seed, start)`` (row group by row group; ``shuffle``: the row groups of all files in a seeded
    order, each group's rows permuted: memory stays one row group)."""

    def __init__(self, spec: str, columns: dict | None = None, storage_options: dict | None = None, *,
                 skip: type = tuple, inline: bool = True, listed: Iterable[str] | None = None):
        self.skip = skip  # the type of a row left out: inputs.Skip(reason, where, key, detail) (given: no circle)
        self.inline = inline  # records hold the audio bytes; else a locator that read_audio reads (pack's workers)
        self.spec = str(spec)
        self.urls = parquet_files(self.spec, storage_options, listed)  # listed: what input detection found
        self.columns = dict(columns or {})
        self.storage_options = storage_options
        self.kind = KIND
        self.name = self.spec
        self.describe = f"parquet input {self.spec} ({len(self.urls)} file{'s' if len(self.urls) > 1 else ''})"
        self.files = [u for u in self.urls if not urls.is_remote(u)]  # a job's fingerprint (local files)
        self.may_skip = True  # a null text or audio is a Skip
        self._readers: dict[str, ParquetFileReader] = {}

    def reader(self, url: str) -> ParquetFileReader:
        if url not in self._readers:
            self._readers[url] = ParquetFileReader(url, self.columns, self.storage_options)
        return self._readers[url]

    def scan(self, *, offsets: bool = True, check_keys: bool = True) -> int:
        """The number of rows; with ``check_keys`` a repeated key is refused (8 bytes per row)."""
        if not check_keys:
            return sum(self.reader(u).num_rows for u in self.urls)
        hashes = np.fromiter((key_hash(k) for k, _ in self.keys()), dtype=np.int64)
        if repeat := first_repeated_key(hashes, self.keys):
            key, first, second = repeat
            raise DataError(f"duplicate key '{key}' in {self.spec}: at {first} and {second}. Keys must be "
                            f"unique; name the key column ({_NAME_IT}columns.key=<column>) if another column holds "
                            f"unique ids.")
        return len(hashes)

    def keys(self) -> Iterator[tuple[str, str]]:
        for url in self.urls:
            for row in self.reader(url).rows(audio=False):
                yield row.key, f"{url} row {row.index}"

    def _order(self, shuffle: bool, seed: int) -> list[tuple[str, int]]:
        groups = [(u, g) for u in self.urls for g in range(len(self.reader(u).sizes))]
        if shuffle:
            groups = [groups[i] for i in np.random.default_rng(seed).permutation(len(groups))]
        return groups

    def records(self, shuffle: bool = False, seed: int = 0, start: int = 0) -> Iterator[Any]:
        """Records (and :class:`corpus_io.tables.inputs.Skip` for a null text or audio) from the ``start``-th row
        on (in the order of ``shuffle``)."""
        seen = 0
        for url, g in self._order(shuffle, seed):
            reader = self.reader(url)
            size = reader.sizes[g]
            if seen + size <= start:
                seen += size
                continue
            first = sum(reader.sizes[:g])
            order = None
            if shuffle:  # a group's rows permuted by (seed, file, group): the same order wherever it is read
                rng = np.random.default_rng([seed, self.urls.index(url), g])
                order = lambda _g, n, rng=rng: rng.permutation(n)  # noqa: E731
            rows = reader.rows(start=first, order=order, audio=self.inline)
            for _ in range(size):
                row = next(rows)
                seen += 1
                if seen <= start:
                    continue
                yield _record(row, url, self.skip, None if self.inline else self.columns)

    def close(self) -> None:
        self._readers.clear()


def _record(row: Row, url: str, skip_type: type, lazy: dict | None = None) -> Any:
    """The record of a row; ``lazy`` (the column mapping): its audio not read here but named by a locator
    (:func:`read_audio`), and a null audio found by the reader (an unreadable-audio error or skip)."""
    where = f"{url} row {row.index}"
    if row.text is None:
        return skip_type("missing transcript", where, row.key, "its text is null")
    if lazy is None and row.data is None and not row.path:
        return skip_type("no audio", where, row.key, "its audio is null")
    rec: dict[str, Any] = {"key": row.key}
    if lazy is not None:
        rec["source"] = locator(url, lazy, row.index)
    elif row.data is not None:
        rec["source"], rec[INLINE] = f"{url}#row={row.index}", row.data
    else:  # not embedded: the file the path names
        rec["source"] = row.path
    rec["target"] = row.text if isinstance(row.text, str) else str(row.text)
    for name, value in row.fields.items():
        rec.setdefault(name, value)
    rec["where"] = where
    return rec


# --------------------------------------------------------------------------- the loader and the index


def _sample(row: Row, url: str, entry: str, pos: int) -> dict:
    where = f"{url} row {row.index}"
    if row.text is None:
        raise DataError(f"{where}: key '{row.key}': its text is null. Fill it or drop the row (pack-shards "
                        f"on_error=skip drops and counts such rows).")
    data = row.data
    if data is None:
        if not row.path:
            raise DataError(f"{where}: key '{row.key}': its audio is null. Drop the row (pack-shards "
                            f"on_error=skip drops and counts such rows).")
        data = audio.read_source_bytes(row.path)
    ext = audio.sniff_audio_format(data)
    if ext is None:
        raise DataError(f"{where}: key '{row.key}': its audio bytes are not a known audio format (wav, flac, ogg, "
                        f"opus, mp3). Fix or drop the row (pack-shards on_error=skip drops and counts such rows), "
                        f"or, if another column holds the audio, name it: {_NAME_IT}columns.audio=<column>.")
    meta = {"key": row.key, **row.fields}
    return {"key": row.key, "audio": data, "audio_format": ext, "txt": str(row.text), "meta": meta,
            "__url__": entry, "__pos__": pos}


def read_samples(entry: str, *, storage_options: dict | None = None, max_member_bytes: int = 0,
                 allow_pipe: bool = False, start: int = 0) -> Iterator[dict]:
    """The samples of a parquet file listed in a shard data.list (``entry``: the list's line, with its column
    mapping), as :func:`corpus_io.shards.reader.read_shard` gives a tar's: ``key``, ``audio``, ``audio_format``,
    ``txt``, ``meta``, ``__url__``, ``__pos__`` (the row). One row group in memory. ``start``: the first row
    wanted (a resumed reader): the row groups before it are not read."""
    url, columns = split_entry(entry)
    reader = ParquetFileReader(url, columns, storage_options)
    for row in reader.rows(start=start):
        if max_member_bytes and row.data is not None and len(row.data) > max_member_bytes:
            raise DataError(f"{url} row {row.index}: key '{row.key}': its audio is {len(row.data)} bytes, more than "
                            f"dataset_conf.max_member_bytes={max_member_bytes}.")
        yield _sample(row, url, entry, row.index)


def iter_metadata(entry: str, *, storage_options: dict | None = None) -> Iterator[dict]:
    """``{key, txt, meta}`` of each row of a listed parquet file (``stats``), ``meta`` with ``duration`` (seconds)
    from the audio header (nothing decoded)."""
    for sample in read_samples(entry, storage_options=storage_options):
        info = audio.probe_bytes(sample["audio"], f"{sample['__url__']} row {sample['__pos__']}")
        sample["meta"]["duration"] = info.num_samples / info.sample_rate if info.sample_rate else 0.0
        yield {"key": sample["key"], "txt": sample["txt"], "meta": sample["meta"]}


def index_entry(entry: str, storage_options: dict | None = None) -> dict:
    """The index entry of a parquet file (the data.list line ``entry``): ``num_utts``, durations from the audio
    headers (nothing decoded), ``bytes`` (the file's size) and ``keys``. A row without text or audio is a
    DataError: the loader would fail on it."""
    url, columns = split_entry(entry)
    reader = ParquetFileReader(url, columns, storage_options)
    durations, keys = [], []
    for row in reader.rows():
        where = f"{url} row {row.index}"
        sample = _sample(row, url, entry, row.index)
        try:
            info = audio.probe_bytes(sample["audio"], where)
        except DataError as exc:
            raise DataError(f"{where}: key '{row.key}': {str(exc).rstrip('.')}. Fix or drop the row.") from None
        durations.append(info.num_samples / info.sample_rate if info.sample_rate else 0.0)
        keys.append(row.key)
    if urls.is_remote(url):
        fs, path = urls.filesystem(url, storage_options)
        size = fs.size(path)
    else:
        size = os.path.getsize(urls.local_path(url))
    return {"path": entry, "num_utts": len(keys), "duration": round(float(sum(durations)), 3),
            "min_duration": round(min(durations, default=0.0), 3),
            "max_duration": round(max(durations, default=0.0), 3), "bytes": int(size),
            "durations": [round(d, 2) for d in durations], "keys": keys}


# --------------------------------------------------------------------------- the writer


HF_FEATURES_KEY = b"huggingface"


def _features(extra: list[tuple[str, str]]) -> dict:
    features = {"id": {"dtype": "string", "_type": "Value"}, "audio": {"_type": "Audio"},
                "text": {"dtype": "string", "_type": "Value"}}
    for name, dtype in extra:
        features[name] = {"dtype": dtype, "_type": "Value"}
    return {"info": {"features": features}}


def _arrow_dtype(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    return "string"


def write_hf_parquet(rows: list[dict], path: str, *, row_group_size: int = 100) -> None:
    """Write ``rows`` (``{"id", "audio": {"bytes", "path"}, "text", <scalar fields>}``) as one parquet file at
    ``path`` (atomically), with HF's features in the schema metadata. Deterministic: the same rows give the same
    bytes (no timestamps; dictionary and statistics settings fixed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpus_io.storage.files import atomic_write

    extra: dict[str, str] = {}
    for row in rows:
        for name, value in row.items():
            if name not in ("id", "audio", "text") and value is not None:
                dtype = _arrow_dtype(value)
                if extra.setdefault(name, dtype) != dtype:
                    extra[name] = "string"
    arrow_types = {"bool": pa.bool_(), "int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}
    fields = [pa.field("id", pa.string()),
              pa.field("audio", pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])),
              pa.field("text", pa.string())] + [pa.field(n, arrow_types[t]) for n, t in extra.items()]
    metadata = {HF_FEATURES_KEY: json.dumps(_features(list(extra.items()))).encode()}
    schema = pa.schema(fields, metadata=metadata)

    def value(row: dict, name: str) -> Any:
        v = row.get(name)
        return str(v) if v is not None and extra.get(name) == "string" and not isinstance(v, str) else v

    columns = {f.name: [value(r, f.name) for r in rows] for f in fields}
    table = pa.Table.from_pydict(columns, schema=schema)
    with atomic_write(path, "wb", encoding=None, newline=None) as f:
        pq.write_table(table, f, row_group_size=row_group_size, compression="snappy", use_dictionary=False,
                       write_statistics=True)


def write_hf_group(items: list[dict], output_dir: str, index: int, num_files: int, *, split: str) -> list[str]:
    """The ``hf-parquet`` writer of ``corpus-io export`` (contract: :mod:`corpus_io.shards.export`): group ``index``
    as ``data/<split>-<index:05d>-of-<num_files:05d>.parquet``, HF's Hub layout; the audio bytes as given, its
    ``path`` ``<key>.<format>``; ``speaker`` and the items' fields as columns."""
    name = f"data/{split}-{index:05d}-of-{num_files:05d}.parquet"
    rows = []
    for item in items:
        row = {"id": item["key"], "audio": {"bytes": item["audio"], "path": f"{item['key']}.{item['audio_format']}"},
               "text": item["text"]}
        if item.get("speaker") is not None:
            row["speaker"] = item["speaker"]
        for field, value in item.get("fields", {}).items():
            row.setdefault(field, value)
        rows.append(row)
    write_hf_parquet(rows, os.path.join(output_dir, name))
    return [name]
