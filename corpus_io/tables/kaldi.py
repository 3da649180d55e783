"""Kaldi tables: ``wav.scp``, ``text``, ``segments``, ``utt2spk``, ``utt2dur``, ``feats.scp``.

Reading is streaming and strict:

* blank lines are skipped; CRLF, a UTF-8 BOM, tabs and runs of spaces are accepted;
* invalid UTF-8, a key without a value, and a duplicate key are :class:`DataError`
  naming ``file:line`` (both lines for a duplicate);
* memory for :func:`iter_table` does not grow with the number of lines.

:class:`KeyedTable` gives random access by key for joins with 16 bytes of memory
per line (a sorted array of key hashes and file offsets), not a dict of strings.
"""

from __future__ import annotations

import os
import re
from array import array
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from corpus_io.errors import DataError
from corpus_io.keys import first_repeated_key, key_hash, recording_id
from corpus_io.storage.files import UTF8_BOM, atomic_write, bounded_lines, iter_raw_lines

_SEP = re.compile(rb"[ \t]+")
#: what ends a table key, for the reader (``_SEP``, and the line's end) and the writer alike: a key holding
#: U+00A0 or U+3000 (Unicode spaces Kaldi's byte-wise split does not see) reads and writes back unchanged
KEY_BREAKS = frozenset(" \t\r\n")


@dataclass(frozen=True)
class TableLine:
    key: str
    value: str
    path: str
    lineno: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


def _first_bad_utf8_byte(raw: bytes) -> int:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return 0


def parse_line(raw: bytes, path: str, lineno: int) -> tuple[str, str] | None:
    """``(key, value)`` of one raw table line, ``None`` for a blank line; errors name ``path:lineno``."""
    if lineno == 1 and raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]
    raw = raw.rstrip(b"\r\n")
    stripped = raw.strip(b" \t\r")
    if not stripped:
        return None
    parts = _SEP.split(stripped, maxsplit=1)
    try:
        key = parts[0].decode("utf-8")
        value = parts[1].decode("utf-8").rstrip(" \t\r") if len(parts) > 1 else ""
    except UnicodeDecodeError:
        # the offset counts from the start of the line (the key's or value's own offset would mislead)
        bad = _first_bad_utf8_byte(raw)
        raise DataError(f"{path}:{lineno}: invalid UTF-8 at byte {bad} of the line. "
                        f"Re-encode the file as UTF-8 (e.g. iconv -f GBK -t UTF-8).") from None
    return key, value


def iter_table(path: str | os.PathLike, *, allow_empty_value: bool = False) -> Iterator[TableLine]:
    """Stream ``(key, value)`` lines of a Kaldi table; the value is the rest of the line."""
    path = str(path)
    for lineno, raw in iter_raw_lines(path, what="table"):
        parsed = parse_line(raw, path, lineno)
        if parsed is None:
            continue
        key, value = parsed
        if not value and not allow_empty_value:
            raise DataError(f"{path}:{lineno}: key '{key}' has no value. Each line must be "
                            f"'<key> <value>'; remove the line or fill in the value.")
        yield TableLine(key, value, path, lineno)


def raise_if_duplicates(path: str, hashes: Any, hint: str = "") -> None:
    """Raise a DataError naming both lines of a repeated key, given the keys' :func:`key_hash` values;
    ``hint`` (a sentence) is appended to the message."""
    repeat = first_repeated_key(hashes, lambda: ((line.key, f"{path}:{line.lineno}")
                                                 for line in iter_table(path, allow_empty_value=True)))
    if repeat:
        key, first, second = repeat
        raise DataError(f"duplicate key '{key}' in {path}: at {first} and {second}. Keys must be unique; "
                        f"remove or rename one.{' ' + hint if hint else ''}")


def check_unique_keys(path: str | os.PathLike) -> int:
    """Raise on a duplicate key (naming both lines); return the number of lines. 8 bytes per line."""
    hashes = array("q")
    for line in iter_table(path, allow_empty_value=True):
        hashes.append(key_hash(line.key))
    raise_if_duplicates(str(path), np.frombuffer(hashes, dtype=np.int64))
    return len(hashes)


class KeyedTable:
    """Random access to a table by key, for joins. 16 bytes of index per line.

    ``get(key)`` seeks to the line and re-reads it. ``mark_used`` and
    ``unused_keys`` find keys that no other table mentioned.
    """

    def __init__(self, path: str | os.PathLike, *, allow_empty_value: bool = False, keep_first: bool = False,
                 hint: str = ""):
        """``keep_first``: a repeated key is not an error; :meth:`get` returns its first line and
        ``num_duplicates`` counts the later ones (scp2jsonl ``++on_duplicate=skip``). Otherwise a repeated
        key is an error; ``hint`` (a sentence) is appended to that error and to the one for an empty value."""
        self.path = str(path)
        self.allow_empty_value = allow_empty_value
        hashes = array("q")
        offsets = array("q")
        offset = 0
        with open(self.path, "rb") as f:
            for lineno, raw in bounded_lines(f, self.path):
                parsed = parse_line(raw, self.path, lineno)
                if parsed is not None:
                    key, value = parsed
                    if not value and not allow_empty_value:
                        raise DataError(f"{self.path}:{lineno}: key '{key}' has no value. Each line must be "
                                        f"'<key> <value>'; remove the line or fill in the value."
                                        f"{' ' + hint if hint else ''}")
                    hashes.append(key_hash(key))
                    offsets.append(offset)
                    offsets.append(lineno)
                offset += len(raw)
        h = np.frombuffer(hashes, dtype=np.int64)
        pairs = np.frombuffer(offsets, dtype=np.int64).reshape(-1, 2)
        if not keep_first:
            raise_if_duplicates(self.path, h, hint)
        order = np.argsort(h, kind="stable")  # stable: among equal keys the first line comes first
        self._hashes = h[order]
        self.num_duplicates = len(h) - len(np.unique(h)) if keep_first else 0
        self._offsets = pairs[order, 0].copy()
        self._linenos = pairs[order, 1].copy()
        self._used = np.zeros(len(self._hashes), dtype=bool)
        self._file = open(self.path, "rb")
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self._hashes)

    def __getstate__(self) -> dict:
        """Picklable for spawned workers: the index goes along, the open file does not (reopened on first use)."""
        state = dict(self.__dict__)
        state["_file"], state["_pid"] = None, None
        return state

    def _lookup(self, key: str) -> tuple[int, str | None]:
        """``(slot, value)`` of ``key``, ``(-1, None)`` when absent; reads and parses one line."""
        if self._pid != os.getpid():  # a forked worker: a shared file offset would race
            self._file = open(self.path, "rb")
            self._pid = os.getpid()
        h = key_hash(key)
        i = int(np.searchsorted(self._hashes, h))
        while i < len(self._hashes) and self._hashes[i] == h:
            self._file.seek(int(self._offsets[i]))
            parsed = parse_line(self._file.readline(), self.path, int(self._linenos[i]))
            if parsed and parsed[0] == key:
                return i, parsed[1]
            i += 1
        return -1, None

    def get(self, key: str) -> str | None:
        i, value = self._lookup(key)
        if i >= 0:
            self._used[i] = True
        return value

    def get_where(self, key: str) -> tuple[str | None, str]:
        """``(value, "file:line")`` of ``key`` (:meth:`get`); ``(None, file)`` when absent."""
        i, value = self._lookup(key)
        if i < 0:
            return None, self.path
        self._used[i] = True
        return value, f"{self.path}:{int(self._linenos[i])}"

    def mark_present(self, key: str) -> bool:
        """Whether ``key`` is in the table, by its hash alone (no file read); marks it used.

        A 64-bit hash collision could only make a missing key look present; :meth:`get` still
        checks the key itself, so that case surfaces later as a missing value, never a wrong one.
        """
        h = key_hash(key)
        i = int(np.searchsorted(self._hashes, h))
        found = False
        while i < len(self._hashes) and self._hashes[i] == h:
            self._used[i] = found = True
            i += 1
        return found

    def __contains__(self, key: str) -> bool:
        return self._lookup(key)[0] >= 0

    def num_unused(self) -> int:
        return int((~self._used).sum())

    def unused_keys(self, limit: int = 10) -> list[str]:
        """Keys never fetched with :meth:`get`, in file order, at most ``limit``."""
        lines = np.sort(self._linenos[~self._used])[:limit]
        wanted = set(int(x) for x in lines)
        keys = []
        for line in iter_table(self.path, allow_empty_value=True):
            if line.lineno in wanted:
                keys.append(line.key)
        return keys

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


@dataclass(frozen=True)
class Segment:
    """One line of ``segments``: times in seconds; ``end < 0`` means the end of the recording."""

    key: str
    recording: str
    start: float
    end: float
    where: str


def parse_segment(key: str, value: str, where: str) -> Segment:
    """One ``segments`` line (``<utt> <recording> <start> <end>``, seconds); errors name ``where``."""
    fields = value.split()
    try:
        if len(fields) != 3:
            raise ValueError
        start, end = float(fields[1]), float(fields[2])
    except ValueError:
        raise DataError(f"{where}: a segments line must be '<utt> <recording> <start> <end>' "
                        f"(seconds); got '{key} {value}'.") from None
    if start < 0 or (end >= 0 and end <= start):
        raise DataError(f"{where}: segment '{key}' has start {start} and end {end}; "
                        f"need 0 <= start < end (or end = -1 for the end of the recording).")
    return Segment(key, recording_id(fields[0], f"{where}: segment '{key}'"), start, end, where)


def iter_segments(path: str | os.PathLike) -> Iterator[Segment]:
    for line in iter_table(path):
        yield parse_segment(line.key, line.value, line.where)


def is_pipe(value: str) -> bool:
    """A Kaldi pipe entry: a command whose stdout is the audio, ending with '|'."""
    return value.rstrip().endswith("|")


def table_line(key: str, value: str, separator: str = " ", *, where: str, field: str = "value") -> str:
    """``key<sep>value\n``, or a DataError (naming ``where``) for a pair that would not read back as
    written: a key that is empty or holds whitespace, a value that is empty or holds a line break."""
    if not key or any(c in KEY_BREAKS for c in key):
        raise DataError(f"{where}: key {key!r} is {'empty' if not key else 'not one word'}; a Kaldi table key "
                        f"is one word without spaces or tabs (the rest of the line is the value). Rename the "
                        f"key, e.g. replace spaces with '_'.")
    if not value.strip() or "\n" in value or "\r" in value:
        why = "is empty" if not value.strip() else "holds a line break"
        raise DataError(f"{where}: key '{key}': the {field} {value!r} {why}; a Kaldi table holds one non-empty "
                        f"line per key. Fix the {field} (e.g. join its lines with a space) or drop the utterance.")
    return f"{key}{separator}{value}\n"


def write_table(path: str | os.PathLike, items: Iterable[tuple[str, str]], *, separator: str = " ") -> int:
    """Write ``key<sep>value`` lines atomically; returns the number of lines."""
    n = 0
    with atomic_write(path) as f:
        for key, value in items:
            n += 1
            f.write(table_line(key, value, separator, where=f"{path} (line {n})"))
    return n


def read_feats(value: str):
    """Load a matrix from a feats.scp value (``foo.ark:1234``) with kaldiio."""
    import kaldiio

    try:
        return kaldiio.load_mat(value)
    except Exception as exc:  # kaldiio raises many types for a bad ark
        raise DataError(f"cannot read features '{value}': {exc}. Check the ark file and offset.") from None
