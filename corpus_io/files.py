"""Crash-safe file writing: write to a temp name in the same directory, then rename."""

from __future__ import annotations

import contextlib
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
