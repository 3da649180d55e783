"""A deterministic, hashing tar writer (one shard = one file written under a temp name).

Headers are built here rather than through ``tarfile.addfile`` so that every byte is fixed
(mtime, uid, gid, names, mode; see :mod:`corpus_io.shards.format`) and so sha256 and the
byte count are computed while writing, with no second read. The output is a POSIX ustar
archive (pax headers only for names over 100 bytes) that ``tarfile``, GNU tar, WeNet and
WebDataset read; with ``compress=True`` it is gzip-compressed (WeNet's ``.tar.gz``; mtime 0 and
no file name in the gzip header, so the bytes stay deterministic), and sha256/bytes are those of
the compressed file.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import queue
import tarfile
import threading
from pathlib import Path
from types import TracebackType

from corpus_io.shards import format as fmt
from corpus_io.storage.files import UnnamedFile

BLOCK = 512
RECORD = 20 * BLOCK  # tarfile pads the archive to a multiple of this; so do we
_ZERO = bytes(RECORD)
_MAX_OCTAL_SIZE = 8 ** 11 - 1  # 8 GiB - 1: the largest size a ustar octal field holds


def _ustar_template() -> tuple[bytes, bytes, bytes, int]:
    """The fixed bytes of a ustar header between and after its variable fields (name ``[0:100]``, size
    ``[124:136]``, checksum ``[148:156]``), and their checksum (the checksum field counted as spaces)."""
    header = bytearray(BLOCK)
    header[100:108] = b"%07o\0" % fmt.TAR_MODE
    header[108:116] = b"%07o\0" % fmt.TAR_UID
    header[116:124] = b"%07o\0" % fmt.TAR_GID
    header[136:148] = b"%011o\0" % fmt.TAR_MTIME
    header[148:156] = b"        "
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    header[329:337] = b"%07o\0" % 0
    header[337:345] = b"%07o\0" % 0
    return bytes(header[100:124]), bytes(header[136:148]), bytes(header[156:]), sum(header)


_USTAR_MODE_IDS, _USTAR_MTIME, _USTAR_REST, _USTAR_SUM = _ustar_template()


def _ustar_header(name: bytes, size: int) -> bytes:
    """A 512-byte ustar header for a regular file with the fixed fields of the format: the template, with the
    checksum summed over the variable fields only (a shard of 1,000 utterances has 3,000 headers)."""
    size_field = b"%011o\0" % size
    checksum = _USTAR_SUM + sum(name) + sum(size_field)
    return b"".join((name, bytes(100 - len(name)), _USTAR_MODE_IDS, size_field, _USTAR_MTIME,
                     b"%06o\0 " % checksum, _USTAR_REST))


def member_header(name: str, size: int) -> bytes:
    """Header bytes for member ``name`` of ``size`` bytes (ustar, or pax for long names/huge sizes)."""
    raw = name.encode("utf-8")
    if len(raw) <= 100 and size <= _MAX_OCTAL_SIZE:
        return _ustar_header(raw, size)
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, fmt.TAR_MTIME, fmt.TAR_MODE
    info.uid, info.gid, info.uname, info.gname = fmt.TAR_UID, fmt.TAR_GID, fmt.TAR_UNAME, fmt.TAR_GNAME
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


class _Hasher:
    """sha256 on a helper thread, fed in ~4 MiB batches of immutable ``bytes``.

    hashlib releases the GIL on large inputs, so hashing overlaps the file writes instead of
    adding to them (sha256 here runs at ~0.7 GB/s, a third of the write cost).
    """

    BATCH = 4 << 20  # bytes

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._queue: queue.Queue = queue.Queue(maxsize=4)  # bounded: at most ~20 MiB pending
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            for piece in batch:
                self._sha.update(piece)

    def update(self, data: bytes) -> None:
        self.extend([data], len(data))

    def extend(self, pieces: list[bytes], size: int) -> None:
        """Hash ``pieces`` (``size`` bytes in all) after what came before."""
        self._pending += pieces
        self._pending_bytes += size
        if self._pending_bytes >= self.BATCH:
            self._queue.put(self._pending)
            self._pending, self._pending_bytes = [], 0

    def hexdigest(self) -> str:
        if self._thread.is_alive():
            self._queue.put(self._pending)
            self._queue.put(None)
            self._thread.join()
        return self._sha.hexdigest()


_MAX_PIECES = 1000  # per writev (Linux takes at most IOV_MAX = 1024 buffers)


def _writev_all(fd: int, pieces: list[bytes], total: int) -> None:
    """Write ``pieces`` (``total`` bytes) in order: one ``writev``; a short write, rare on a regular file, goes
    on where it stopped."""
    written = os.writev(fd, pieces) if hasattr(os, "writev") else 0
    if written == total:
        return
    rest = memoryview(b"".join(pieces))
    while written < total:
        written += os.write(fd, rest[written:])


class _HashedFile:
    """The file a GzipFile writes into: every compressed byte is hashed and counted on its way out."""

    def __init__(self, f, hasher: _Hasher):
        self._f, self._hasher, self.bytes = f, hasher, 0

    def write(self, data) -> int:
        data = bytes(data)
        self._f.write(data)
        self._hasher.update(data)
        self.bytes += len(data)
        return len(data)

    def flush(self) -> None:
        self._f.flush()


class ShardWriter:
    """Write one tar to ``<final>`` via a temp name; sha256 and size are known at :meth:`close`.

    ``with ShardWriter(path) as w: w.add("k.txt", b"...")`` renames the temp file to ``path``
    only when the block succeeds; on an exception the temp file is removed. ``compress``: gzip the
    tar (level ``GZIP_LEVEL``); ``bytes``/``sha256`` then describe the compressed file.
    """

    GZIP_LEVEL = 6  # gzip's own default: most of level 9's size at a fraction of its time
    WRITE_BATCH = 1 << 20  # bytes: a plain tar's members are gathered and written with one writev per batch

    def __init__(self, path: str | os.PathLike, *, buffer_size: int = 1 << 16, compress: bool = False):
        self.path = Path(path)
        # No name until close (O_TMPFILE): a writer killed mid-shard leaves no partial file. The buffer
        # serves gzip's output; a plain tar's pieces (headers, member bytes, padding) are not copied into
        # it but written by reference, ~15 utterances per system call, and go to the hash thread as they are.
        self._file = UnnamedFile(self.path, "wb", buffering=buffer_size)
        self._pieces: list[bytes] = []
        self._pieces_bytes = 0
        self._f = self._file.file
        self._hasher = _Hasher()
        self._gz: gzip.GzipFile | None = None
        self._out: _HashedFile | None = None
        if compress:
            self._out = _HashedFile(self._f, self._hasher)
            self._gz = gzip.GzipFile(filename="", mode="wb", compresslevel=self.GZIP_LEVEL, fileobj=self._out,
                                     mtime=0)
        self.tar_bytes = 0  # uncompressed tar bytes (the 10 KiB record padding counts these)
        self.sha256 = ""

    @property
    def bytes(self) -> int:
        """Bytes of the shard file (compressed when ``compress``)."""
        return self._out.bytes if self._out is not None else self.tar_bytes

    def _write(self, data: bytes) -> None:
        if self._gz is not None:
            self._gz.write(data)
        else:
            self._pieces.append(data)
            self._pieces_bytes += len(data)
        self.tar_bytes += len(data)

    def add(self, name: str, data: bytes) -> None:
        """Append a regular-file member (header, data, zero padding to 512 bytes). A plain tar writes and
        hashes ``data`` later, so a mutable buffer is copied first."""
        if type(data) is not bytes:
            data = bytes(data)
        header = member_header(name, len(data))
        pad = -len(data) % BLOCK
        if self._gz is not None:
            for piece in (header, data, _ZERO[:pad]):
                self._gz.write(piece)
        else:
            self._pieces += (header, data, _ZERO[:pad]) if pad else (header, data)
            self._pieces_bytes += len(header) + len(data) + pad
            if self._pieces_bytes >= self.WRITE_BATCH or len(self._pieces) > _MAX_PIECES:
                self._flush_pieces()
        self.tar_bytes += len(header) + len(data) + pad

    def _flush_pieces(self) -> None:
        if self._pieces:
            _writev_all(self._f.fileno(), self._pieces, self._pieces_bytes)
            self._hasher.extend(self._pieces, self._pieces_bytes)
            self._pieces, self._pieces_bytes = [], 0

    def close(self) -> None:
        """End-of-archive blocks, pad to a 10 KiB record, rename into place."""
        self._write(_ZERO[:2 * BLOCK])
        pad = -self.tar_bytes % RECORD
        if pad:
            self._write(_ZERO[:pad])
        if self._gz is not None:
            self._gz.close()  # writes the gzip trailer through _HashedFile
        self._flush_pieces()
        self._file.commit()
        self.sha256 = self._hasher.hexdigest()

    def abort(self) -> None:
        if self._gz is not None:
            self._gz.close()
        self._file.abort()
        self._hasher.hexdigest()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
