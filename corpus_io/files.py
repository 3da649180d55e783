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


class UnnamedFile:
    """A file written in ``final``'s directory that has no name until :meth:`commit` gives it ``final``.

    On Linux it is an ``O_TMPFILE`` inode, so a writer killed at any point (even by SIGKILL, or with
    its parent) leaves nothing behind; :meth:`commit` links it under :func:`temp_name` and renames it
    over ``final`` (atomic). Where the filesystem has no ``O_TMPFILE`` the file is the visible
    :func:`temp_name` from the start (removed by :meth:`abort`, or by a rerun's :func:`remove_temp_files`).
    """

    def __init__(self, final: str | os.PathLike, mode: str = "wb", *, buffering: int = -1,
                 encoding: str | None = None, newline: str | None = None):
        self.final = Path(final)
        self.tmp = temp_name(self.final)
        fd = None
        if hasattr(os, "O_TMPFILE"):
            with contextlib.suppress(OSError):  # EOPNOTSUPP/EISDIR: this filesystem has no O_TMPFILE
                fd = os.open(self.final.parent, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o666)
        self.unnamed = fd is not None
        kwargs: dict = {"buffering": buffering, "encoding": encoding, "newline": newline}
        self.file: IO = os.fdopen(fd, mode, **kwargs) if fd is not None else open(self.tmp, mode, **kwargs)

    def commit(self, *, fsync: bool = False) -> None:
        self.file.flush()
        if fsync:
            os.fsync(self.file.fileno())
        if self.unnamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)  # left by a writer of the same pid that was killed between link and rename
            try:
                os.link(f"/proc/self/fd/{self.file.fileno()}", self.tmp)
            except OSError:  # no /proc: copy the bytes out instead
                self._copy_to_tmp()
        self.file.close()
        os.replace(self.tmp, self.final)

    def _copy_to_tmp(self) -> None:
        fd, offset = self.file.fileno(), 0
        with open(self.tmp, "wb") as out:
            while chunk := os.pread(fd, 1 << 20, offset):
                out.write(chunk)
                offset += len(chunk)

    def abort(self) -> None:
        self.file.close()
        if not self.unnamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8",
                 newline: str | None = "\n", fsync: bool = False) -> Iterator[IO]:
    """Write an :class:`UnnamedFile`; it becomes ``path`` only if the block succeeds (nothing is left
    behind otherwise, even when the process is killed).

    An output that cannot be written (a directory in the way, no permission) is a :class:`DataError`
    naming ``path``, raised before anything is written.
    """
    final = Path(path)
    if final.is_dir():
        raise DataError(f"cannot write {final}: it is a directory. Give a file path for this output.")
    ensure_dir(final.parent, what=f"the directory of {final}")
    binary = "b" in mode
    try:
        out = UnnamedFile(final, mode, encoding=None if binary else encoding, newline=None if binary else newline)
    except OSError as exc:
        raise DataError(f"cannot write {final}: {exc.strerror}. Check the path and its permissions.") from None
    try:
        yield out.file
        out.commit(fsync=fsync)
    except BaseException:
        out.abort()
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


MAX_LINE_BYTES = 4 * 1024 * 1024  # bytes: one line of a table, jsonl or list; longer is not text (/dev/zero)


def bounded_lines(f: IO[bytes], path: str | os.PathLike,
                  max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(lineno, raw line)`` of a binary file, like ``enumerate(f, 1)``, but a line longer than ``max_bytes``
    is a DataError instead of an unbounded read (a device, or a binary file given as a table)."""
    lineno = 0
    while raw := f.readline(max_bytes + 1):
        lineno += 1
        if len(raw) > max_bytes:
            raise DataError(f"{path}:{lineno}: the line is longer than {max_bytes} bytes (the per-line bound of "
                            f"text inputs), so this is not a text table, jsonl or list (a binary file or a device "
                            f"such as /dev/zero?). Point the option at the right file.")
        yield lineno, raw


def iter_raw_lines(path: str | os.PathLike, *, what: str = "file") -> Iterator[tuple[int, bytes]]:
    """``(lineno, bytes)`` of a text file, streamed, with a leading UTF-8 BOM removed; lines are bounded
    (:func:`bounded_lines`).

    Opening errors become a :class:`DataError` naming the file.
    """
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot open {what} {path}: {exc.strerror}. Check the path.") from None
    with f:
        for lineno, raw in bounded_lines(f, path):
            if lineno == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
            yield lineno, raw
