"""Packed shards as an input (``export``'s): a shard ``data.list`` (local, ``http(s)://``, ``s3://``), a directory of
shards (its ``data.list``, else its ``*.tar``/``*.tar.gz``), a glob, a brace pattern or one tar, as
:func:`corpus_io.shards.datalist.expand_input` expands them for make-datalist. A list may name any shard the loader
reads: corpus-io tars, WeNet ``.tar.gz``, Lhotse Shar cuts files and listed parquet files
(:func:`corpus_io.shards.kinds.sample_reader`).

The utterances are numbered by their position in the list (shard after shard, in shard order), so that export cuts
them into groups by position as it does any input. Counts and keys come from the index (:mod:`corpus_io.shards.index`)
where it describes a shard; the shards it does not describe are read once without their audio
(:func:`corpus_io.shards.kinds.iter_shard_metadata`). A key two shards hold is refused before anything is written.

A group is a list of :class:`Piece` (a shard, its first position, a count), and the worker that writes the group
reads its pieces (:func:`piece_records`): the main process reads no audio. A shard holding more or fewer utterances
than it was counted with is a DataError naming the shard and the count's source.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

from corpus_io.errors import DataError
from corpus_io.keys import first_repeated_key, key_hash, one_token
from corpus_io.shards.format import SHARD_SUFFIXES, safe_member_name
from corpus_io.storage.urls import is_remote

KIND = "shards"
#: the record field holding a sample's audio bytes (the same as a parquet row's, so pack's reader takes it)
INLINE = "source_bytes"
#: a sample's metadata fields that are its reading, not the utterance's (never copied into a record)
_NOT_META = {"key", "source", "target", "start", "end", "where", INLINE, "segment"}
_KALDI_FILES = ("wav.scp", "feats.scp", "text", "segments")


@dataclass(frozen=True)
class Piece:
    """``count`` utterances of shard ``url`` from position ``first`` (0-based) on; the shard holds ``num_utts``,
    as ``counted_by`` says (its index, or a reading of it)."""

    url: str
    first: int
    count: int
    num_utts: int
    counted_by: str
    identity: tuple = ()  # what changes when the shard does (its index entry, or a local file's size and mtime)


def is_shard_input(path: str, tree: list | None = None) -> bool:
    """Whether ``path`` names packed shards (see the module docstring) rather than an input of
    :func:`corpus_io.tables.inputs.open_input` (a manifest, a Kaldi dir, a Lhotse Shar, parquet files): decided by
    names and a file's first line, no shard is opened. ``tree``: the directory's
    :func:`corpus_io.tables.inputs.walk_once` (then not listed again)."""
    from corpus_io.tables import parquet, shar

    if parquet.is_parquet(path, tree) or shar.is_shar_cuts(path):
        return False
    if is_remote(path):
        return not path.endswith("/")  # a list or a shard URL (a Shar prefix ends with '/')
    if path.endswith(SHARD_SUFFIXES):
        return os.path.isfile(path)
    if os.path.isdir(path):
        names = sorted(tree[0][1] + tree[0][2]) if tree else sorted(os.listdir(path))
        if any(n in _KALDI_FILES for n in names) or shar.shar_input_shards(path, names) is not None:
            return False
        return "data.list" in names or any(n.endswith(SHARD_SUFFIXES) for n in names)
    if not os.path.isfile(path) or path.endswith((".gz", ".json", ".jsonl")):
        return False
    try:
        with open(path, "rb") as f:
            for raw in f:
                line = raw.removeprefix(b"\xef\xbb\xbf").strip()
                if line:
                    return not line.startswith(b"{")
    except OSError:
        return False
    return False


class ShardInput:
    """The utterances of packed shards, by position (see the module docstring)."""

    kind = KIND
    files: list[str] = []  # no manifest file: the fingerprint is :attr:`identity`

    def __init__(self, path: str, storage_options: dict | None = None):
        from corpus_io.shards.datalist import expand_input

        self.path = path
        self.storage_options = dict(storage_options or {})
        self.describe = f"shard list {path}"
        self.entries = list(expand_input(path, storage_options=self.storage_options or None))
        if not self.entries:
            raise DataError(f"{path} lists no shards, so there is nothing to export (nothing was written). Check "
                            f"++input (make-datalist writes a shard list).")
        self.urls = [url for url, _ in self.entries]
        self.counts: list[int] = []
        self.counted_by: list[str] = []
        self.identities: list[tuple] = []

    def scan(self, **_: Any) -> int:
        """The number of utterances (the index's counts, or one reading of each shard it does not describe
        without audio); a key two shards hold (or one twice) is a DataError naming both places."""
        from corpus_io.shards.index import index_entry_problems, repeated_shard

        twice = repeated_shard(self.urls)
        if twice:
            i, j = twice
            raise DataError(f"{self.path} names the same shard twice: entry {i} ({self.urls[i - 1]}) and entry {j} "
                            f"({self.urls[j - 1]}); its utterances would be exported twice. Remove one of the lines "
                            f"(nothing was written).")
        hashes: list[int] = []
        self.counts, self.counted_by, self.identities = [], [], []
        for url, entry in self.entries:
            problems = index_entry_problems(entry) if entry else []
            if problems:
                raise DataError(f"the index entry of shard {url}: {problems[0]}. The index does not describe the "
                                f"shard; rebuild it (make-datalist) and check the shards with verify-shards "
                                f"(nothing was written).")
            if entry and isinstance(entry.get("num_utts"), int) and isinstance(entry.get("keys"), list):
                keys, by = entry["keys"], "its index entry"
            else:
                keys, by = self._read_keys(url), "a reading of its members"
            for i, key in enumerate(keys):
                one_token(key, f"{url} (utterance {i + 1})")
            self.counts.append(len(keys))
            self.counted_by.append(by)
            self.identities.append(_identity(url, entry))
            hashes.extend(key_hash(k) for k in keys)
        if repeat := first_repeated_key(hashes, self._keyed):
            key, first, second = repeat
            raise DataError(f"key '{key}' is held twice: at {first} and at {second}. Keys must be unique, or "
                            f"the export would hold the utterance twice; drop one of the shards (or re-pack "
                            f"with unique keys). Nothing was written.")
        return sum(self.counts)

    def _read_keys(self, url: str) -> list[str]:
        from corpus_io.shards.kinds import iter_shard_metadata

        try:
            return [str(m["key"]) for m in iter_shard_metadata(url, storage_options=self.storage_options or None)]
        except OSError as exc:
            raise DataError(f"cannot read shard {url}: {exc}. Check the path (or the server and "
                            f"++storage_options); nothing was written.") from None

    def _keyed(self) -> Iterator[tuple[str, str]]:
        for (url, entry), by in zip(self.entries, self.counted_by):
            keys = entry["keys"] if by == "its index entry" else self._read_keys(url)
            yield from ((k, f"{url} (utterance {i + 1})") for i, k in enumerate(keys))

    def pieces(self, start: int, stop: int) -> list[Piece]:
        """The pieces of shards holding the utterances at positions ``[start, stop)`` (after :meth:`scan`)."""
        pieces, first = [], 0
        for url, n, by, ident in zip(self.urls, self.counts, self.counted_by, self.identities):
            lo, hi = max(start, first), min(stop, first + n)
            if lo < hi:
                pieces.append(Piece(url, lo - first, hi - lo, n, by, ident))
            first += n
            if first >= stop:
                break
        return pieces

    def identity(self) -> list:
        """What a job's fingerprint holds of the input: every shard, its count and identity."""
        return [[u, n, list(i)] for u, n, i in zip(self.urls, self.counts, self.identities)]


def _identity(url: str, entry: dict | None) -> tuple:
    if entry:
        return tuple((k, entry[k]) for k in ("num_utts", "duration", "bytes", "sha256") if k in entry)
    if not is_remote(url) and os.path.isfile(url):
        st = os.stat(url)
        return (("bytes", st.st_size), ("mtime_ns", st.st_mtime_ns))
    return ()


def record_of_sample(sample: dict, url: str, pos: int) -> dict:
    """The canonical record of one shard sample (docs/DEVELOPING.md "The sample dict"): its key, text, audio bytes
    (``INLINE``; None for a sample without audio), a segment's span, and its metadata's other fields (speaker,
    language, ...)."""
    meta = sample.get("meta") or {}
    key = str(sample["key"])
    rec: dict[str, Any] = {k: v for k, v in meta.items() if k not in _NOT_META}
    audio = sample.get("audio")
    ext = sample.get("audio_format") or "wav"
    rec.update(key=key, source=f"{url}//{safe_member_name(key)}.{ext}", target=sample["txt"],
               where=f"{url} (utterance {pos + 1})")
    rec[INLINE] = bytes(audio) if audio is not None else None
    if "start" in sample:
        rec["start"], rec["end"] = sample["start"], sample.get("end", -1.0)
    return rec


def piece_records(piece: Piece, skipped: Counter, *, storage_options: dict | None = None,
                  allow_pipe: bool = False, on_error: str = "fail") -> Iterator[dict]:
    """The records of ``piece``, read from its shard (runs in the worker writing the group). A Shar cut the reader
    passes over is counted in ``skipped`` by the piece that reads past it (each once). A shard that cannot be read,
    or holds another count than ``piece.num_utts``, is a DataError naming it (``on_error=skip``: the piece's
    utterances not read are counted as "unreadable shard")."""
    from corpus_io.shards.kinds import sample_reader

    passed: Counter = Counter()
    stop, last = piece.first + piece.count, piece.first + piece.count == piece.num_utts
    base: Counter = Counter()
    pos = given = 0
    samples = sample_reader(piece.url, counts=passed)(piece.url, storage_options=storage_options or None,
                                                       allow_pipe=allow_pipe)
    try:
        for sample in samples:
            if pos == stop:
                if not last:
                    break
                raise DataError(f"shard {piece.url} holds more than the {piece.num_utts} utterances "
                                f"{piece.counted_by} counts")
            if pos == piece.first and pos:
                base = Counter(passed)
            if pos >= piece.first:
                yield record_of_sample(sample, piece.url, pos)
                given += 1
            pos += 1
        else:
            if pos < stop:
                raise DataError(f"shard {piece.url} ends after {pos} utterances, but {piece.counted_by} counts "
                                f"{piece.num_utts}")
    except (DataError, OSError) as exc:
        why = str(exc).rstrip(".")
        if on_error == "fail":
            raise DataError(f"{why}. Check the shard with verify-shards (and rebuild its index with "
                            f"make-datalist), or pass ++on_error=skip to count its utterances as lost.") from None
        skipped["unreadable shard"] += piece.count - given
    finally:
        samples.close()
    for reason, n in (passed - base).items():
        skipped[reason] += n
