"""A deterministic, hashing tar writer (one shard = one file written under a temp name).

Headers are built here rather than through ``tarfile.addfile`` so that every byte is fixed
(mtime, uid, gid, names, mode; see :mod:`corpus_io.shards.format`) and so sha256 and the
byte count are computed while writing, with no second read. The output is a POSIX ustar
archive (pax headers only for names over 100 bytes) that ``tarfile``, GNU tar, WeNet and
WebDataset read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tarfile
from pathlib import Path
from types import TracebackType

from corpus_io.shards import format as fmt

BLOCK = 512
RECORD = 20 * BLOCK  # tarfile pads the archive to a multiple of this; so do we
_ZERO = bytes(RECORD)
_MAX_OCTAL_SIZE = 8 ** 11 - 1  # 8 GiB - 1: the largest size a ustar octal field holds


def _ustar_header(name: bytes, size: int) -> bytes:
    """A 512-byte ustar header for a regular file with the fixed fields of the format."""
    header = bytearray(BLOCK)
    header[0:len(name)] = name
    header[100:108] = b"%07o\0" % fmt.TAR_MODE
    header[108:116] = b"%07o\0" % fmt.TAR_UID
    header[116:124] = b"%07o\0" % fmt.TAR_GID
    header[124:136] = b"%011o\0" % size
    header[136:148] = b"%011o\0" % fmt.TAR_MTIME
    header[148:156] = b"        "
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    header[329:337] = b"%07o\0" % 0
    header[337:345] = b"%07o\0" % 0
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def member_header(name: str, size: int) -> bytes:
    """Header bytes for member ``name`` of ``size`` bytes (ustar, or pax for long names/huge sizes)."""
    raw = name.encode("utf-8")
    if len(raw) <= 100 and size <= _MAX_OCTAL_SIZE:
        return _ustar_header(raw, size)
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, fmt.TAR_MTIME, fmt.TAR_MODE
    info.uid, info.gid, info.uname, info.gname = fmt.TAR_UID, fmt.TAR_GID, fmt.TAR_UNAME, fmt.TAR_GNAME
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


class ShardWriter:
    """Write one tar to ``<final>`` via a temp name; sha256 and size are known at :meth:`close`.

    ``with ShardWriter(path) as w: w.add("k.txt", b"...")`` renames the temp file to ``path``
    only when the block succeeds; on an exception the temp file is removed.
    """

    def __init__(self, path: str | os.PathLike, *, buffer_size: int = 1 << 20):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._f = open(self.tmp, "wb", buffering=buffer_size)
        self._sha = hashlib.sha256()
        self.bytes = 0
        self.sha256 = ""

    def _write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._sha.update(data)
        self.bytes += len(data)

    def add(self, name: str, data: bytes) -> None:
        """Append a regular-file member (header, data, zero padding to 512 bytes)."""
        self._write(member_header(name, len(data)))
        self._write(data)
        pad = -len(data) % BLOCK
        if pad:
            self._write(_ZERO[:pad])

    def close(self) -> None:
        """End-of-archive blocks, pad to a 10 KiB record, rename into place."""
        self._write(_ZERO[:2 * BLOCK])
        pad = -self.bytes % RECORD
        if pad:
            self._write(_ZERO[:pad])
        self._f.close()
        self.sha256 = self._sha.hexdigest()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self._f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
