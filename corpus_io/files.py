"""Crash-safe file writing (temp name, then rename), resumable outputs with sidecars, JSON-line parsing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import IO, Callable, Iterator

from corpus_io.errors import DataError

UTF8_BOM = b"\xef\xbb\xbf"


def temp_name(path: str | os.PathLike) -> Path:
    """The temp name used while ``path`` is being written (same directory, so rename is atomic)."""
    p = Path(path)
    return p.with_name(f".{p.name}.tmp-{os.getpid()}")


def remove_temp_files(directory: str | os.PathLike, is_ours: Callable[[str], bool]) -> int:
    """Delete the :func:`temp_name` files a killed run left in ``directory`` for final names that
    ``is_ours(final_name)`` accepts; returns how many. Call it before a rerun writes anything."""
    removed = 0
    for entry in os.scandir(directory):
        match = _TEMP.fullmatch(entry.name)
        if match and is_ours(match.group(1)) and entry.is_file():
            os.unlink(entry.path)
            removed += 1
    return removed


_TEMP = re.compile(r"\.(.+)\.tmp-\d+")


def ensure_dir(path: str | os.PathLike, *, what: str = "output directory") -> Path:
    """``mkdir -p path``; a file in the way or a path that cannot be made is a :class:`DataError`."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DataError(f"{what} {p} is a file, not a directory. Give a directory path.") from None
    except OSError as exc:
        raise DataError(f"cannot create {what} {p}: {exc.strerror}. Check the path and its permissions.") from None
    return p


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8",
                 newline: str | None = "\n", fsync: bool = False) -> Iterator[IO]:
    """Open a temp file for writing; rename it over ``path`` only if the block succeeds.

    An output that cannot be written (a directory in the way, no permission) is a :class:`DataError`
    naming ``path``, raised before anything is written.
    """
    final = Path(path)
    if final.is_dir():
        raise DataError(f"cannot write {final}: it is a directory. Give a file path for this output.")
    ensure_dir(final.parent, what=f"the directory of {final}")
    tmp = temp_name(final)
    binary = "b" in mode
    try:
        f = open(tmp, mode, encoding=None if binary else encoding, newline=None if binary else newline)
    except OSError as exc:
        raise DataError(f"cannot write {final}: {exc.strerror}. Check the path and its permissions.") from None
    try:
        yield f
        f.flush()
        if fsync:
            os.fsync(f.fileno())
        f.close()
        os.replace(tmp, final)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json_object(path: str | os.PathLike, bad: Callable[[str], DataError]) -> dict:
    """The JSON object stored in ``path``; anything else raises ``bad(why)``, a DataError whose
    message names the file and says what to do (``why``: "is empty", "is not UTF-8 text", ...)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise bad(f"is not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise bad("is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); it may be truncated") \
            from None
    if not isinstance(data, dict):
        raise bad(f"holds a JSON {type(data).__name__}, not an object")
    return data


def iter_raw_lines(path: str | os.PathLike, *, what: str = "file") -> Iterator[tuple[int, bytes]]:
    """``(lineno, bytes)`` of a text file, streamed, with a leading UTF-8 BOM removed.

    Opening errors become a :class:`DataError` naming the file.
    """
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot open {what} {path}: {exc.strerror}. Check the path.") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
            yield lineno, raw


def parse_json_object(raw: bytes | str, where: str | Callable[[], str], hint: str) -> dict:
    """The JSON object on one line of a JSON-lines file, or a :class:`DataError` naming ``where``.

    ``where`` is ``"file:line"`` (or a function returning it, for readers that find the line number
    only when something is wrong); ``hint`` says what the line should hold or what to do.
    """
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise DataError(f"{_where(where)}: invalid UTF-8 (byte {exc.start}). {hint}") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{_where(where)}: not valid JSON ({exc.msg} at column {exc.colno}). {hint}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{_where(where)}: a JSON {type(obj).__name__}, not an object. {hint}")
    return obj


def _where(where: str | Callable[[], str]) -> str:
    return where if isinstance(where, str) else where()


# --------------------------------------------------------------------------- resumable outputs
# The crash-safe output protocol of pack-shards and add-field: an output is written under a temp name
# while its sha256 is computed, renamed, and then described by a hidden sidecar ``.<name>.json`` holding
# its size, sha256 and a digest of the inputs it was made from. A rerun keeps an output whose sidecar
# matches (same inputs, same bytes) and rewrites anything else; a sidecar is written last, so an output
# without one was never finished.


def inputs_digest(parts: object) -> str:
    """sha256 (hex) of ``parts`` as canonical JSON: what an output was made from."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sidecar_path(path: str | os.PathLike) -> Path:
    """The hidden stat file ``.<name>.json`` next to the output ``path``."""
    p = Path(path)
    return p.with_name(f".{p.name}.json")


def completed_output(path: str | os.PathLike, digest: str) -> dict | None:
    """The sidecar stat of ``path`` when the file is complete and was made from inputs with ``digest``
    (the sidecar's digest, byte count and sha256 all match), else None: the output must be (re)written."""
    try:
        stat = json.loads(sidecar_path(path).read_text(encoding="utf-8"))
        if stat.get("digest") != digest or os.path.getsize(path) != stat["bytes"]:
            return None
        if file_sha256(path) != stat["sha256"]:
            return None
        return stat
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_sidecar(path: str | os.PathLike, stat: dict) -> None:
    """Mark ``path`` complete: write its stat (``digest``, ``bytes``, ``sha256``, ...) atomically."""
    with atomic_write(sidecar_path(path)) as f:
        f.write(json.dumps(stat, sort_keys=True) + "\n")


class HashingWriter:
    """A binary file wrapper that counts and hashes the bytes written through it (no second read)."""

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self._sha.update(data)
        self.bytes += len(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()
