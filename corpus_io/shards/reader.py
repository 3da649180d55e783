"""Streaming shard reader: tar members from a non-seekable stream, grouped into samples.

This is a contract the loader codes against (see docs/FORMAT.md):

* :func:`iter_tar_members` parses 512-byte tar headers itself (ustar, pax and GNU long
  names), reading the stream strictly forward: local files, pipes and HTTP bodies all work.
  Headers and members are cut from one buffer filled by 1 MiB reads; the loader takes members as
  memoryviews of it (``views``), so a sample's bytes are copied once, by decode.
  A gzip-compressed tar (WeNet's ``.tar.gz``/``.tgz``) is recognised by its magic bytes, whatever
  its name, and decompressed on the fly (:func:`tar_stream`).
  Nothing is written to disk; member names are never used as paths, so ``..`` or a leading
  ``/`` is harmless. A member over ``max_member_bytes`` is rejected before it is read.
* :func:`group_samples` groups adjacent members by key (rule: :func:`format.split_member`)
  into the pipeline sample dict of docs/DEVELOPING.md.
* :func:`read_shard` opens a URL and chains the two.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from typing import IO, Callable, Iterable, Iterator

from corpus_io.audio.io import MAX_SOURCE_BYTES
from corpus_io.errors import DataError
from corpus_io.shards.format import AUDIO_EXTS, key_from_member_name, split_member

DEFAULT_MAX_MEMBER_BYTES = MAX_SOURCE_BYTES  # bytes; matches dataset_conf.max_member_bytes
_BLOCK = 512
_REGULAR = (b"0", b"\0", b"7")
_META = (b"x", b"g", b"L", b"K")
_ZEROS = bytes(_BLOCK)
READ_AHEAD = 1 << 20  # bytes per read of a tar stream (iter_tar_members)


def _read_exact(f: IO[bytes], n: int) -> bytes:
    """Up to ``n`` bytes; fewer only at end of stream (pipes and sockets return short reads)."""
    data = f.read(n)
    if data is None:
        data = b""
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = f.read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _octal(field: bytes, *, url: str, what: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for sizes over 8 GiB
        value = int.from_bytes(field[1:], "big")
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise DataError(f"{url}: corrupt tar header ({what}: {field!r} is not an octal number); "
                        f"{what_to_do()}") from None


def what_to_do() -> str:
    return "the shard is damaged: re-copy it, or re-pack it with pack-shards (verify with verify-shards)."


_HIGH_BYTES = bytes(range(128, 256))


def _checksum_ok(block: bytes) -> bool:
    """Does the header's stored checksum match its bytes (summed with the checksum field as spaces)?

    An ASCII header sums to at most 512 * 127 < 65521, so its sum equals the stored one when it does modulo
    65521, which zlib's Adler-32 gives in C (its low half is 1 + the byte sum modulo 65521): 1 us instead of 6
    per header. Other headers are summed in Python, also as signed chars (some old tars)."""
    stored = block[148:156].split(b"\0", 1)[0].strip(b" \0")
    try:
        expected = int(stored, 8)
    except ValueError:
        return False
    if (expected < 65521 and block.isascii()
            and zlib.adler32(block[:148] + b"        " + block[156:]) & 0xFFFF == (expected + 1) % 65521):
        return True
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    if expected == unsigned:
        return True
    rest = block[:148] + block[156:]  # some old tars sum the bytes as signed chars
    return expected == unsigned - 256 * (len(rest) - len(rest.translate(None, _HIGH_BYTES)))


def _pax_records(data: bytes, *, url: str) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise DataError(f"{url}: corrupt pax header record; {what_to_do()}") from None
        record = data[space + 1:pos + length - 1]  # drop the trailing newline
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        if length <= 0:
            break
        pos += length
    return records


GZIP_MAGIC = b"\x1f\x8b"


def _peek_head(fileobj: IO[bytes], n: int) -> bytes | None:
    """The first ``n`` bytes without consuming them, or None when the stream can neither peek nor seek."""
    peek = getattr(fileobj, "peek", None)
    if peek is not None:
        return peek(n)[:n]
    try:
        if fileobj.seekable():
            pos = fileobj.tell()
            head = fileobj.read(n)
            fileobj.seek(pos)
            return head
    except (AttributeError, OSError, io.UnsupportedOperation):
        pass
    return None


class _Replay:
    """``head`` (already read) followed by the rest of ``fileobj``: sniffing a stream that cannot peek."""

    def __init__(self, head: bytes, fileobj: IO[bytes]):
        self._head, self._f = head, fileobj

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._f.read(n)
        if n < 0:
            data, self._head = self._head + self._f.read(), b""
            return data
        data, self._head = self._head[:n], self._head[n:]
        return data if len(data) == n else data + self._f.read(n - len(data))


class _Gunzip:
    """A gzip stream's decompressed bytes; a damaged or cut-off gzip becomes a DataError naming ``url``
    (never an OSError, which the loader would retry as a network failure)."""

    compressed = True

    def __init__(self, fileobj: IO[bytes], url: str):
        self._gz = gzip.GzipFile(fileobj=fileobj, mode="rb")  # type: ignore[arg-type]
        self._url = url

    def read(self, n: int = -1) -> bytes:
        try:
            return self._gz.read(n)
        except EOFError:
            raise DataError(f"{self._url}: truncated gzip shard: the compressed stream ends before its end "
                            f"marker; {what_to_do()}") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise DataError(f"{self._url}: damaged gzip shard ({exc}); {what_to_do()}") from None


def tar_stream(fileobj: IO[bytes], *, url: str) -> IO[bytes]:
    """The tar bytes of a shard stream: ``fileobj`` itself, or its decompressed content when it starts with
    the gzip magic (``tar czf`` output, whatever the file is named). Nothing is consumed from a stream
    that can peek or seek, so a local plain tar still skips payloads by seeking."""
    head = _peek_head(fileobj, 2)
    if head is None:
        head = _read_exact(fileobj, 2)
        fileobj = _Replay(head, fileobj)  # type: ignore[assignment]
    return _Gunzip(fileobj, url) if head == GZIP_MAGIC else fileobj  # type: ignore[return-value]


def iter_tar_members(fileobj: IO[bytes], *, url: str, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
                     skip_payload: Callable[[str], bool] | None = None,
                     views: bool = False) -> Iterator[tuple[str, bytes | memoryview]]:
    """Yield ``(name, data)`` for each regular-file member of a tar stream, in order.

    Directories, links and other entries are skipped. Raises :class:`DataError` naming ``url``
    and the last good member on a truncated or corrupt stream, and naming the member when it is
    larger than ``max_member_bytes`` (bytes).

    Members for which ``skip_payload(name)`` is true are yielded as ``(name, b"")`` without being
    buffered: a local file seeks past them (their bytes are never read), any other stream reads
    past them in 1 MiB blocks.

    Headers and payloads are cut from one buffer filled by reads of ``READ_AHEAD`` bytes: one read call per
    ~1 MiB of shard instead of three per member (a header-only scan of a local file reads header by header, so
    that it seeks over the payloads). ``views``: a member inside one buffer is yielded as a read-only memoryview of
    it, not copied (the loader's decode copies the samples once anyway); the view keeps that ~1 MiB alive.
    """
    fileobj = tar_stream(fileobj, url=url)
    compressed = getattr(fileobj, "compressed", False)
    file_size = _local_file_size(fileobj) if skip_payload is not None else None
    ahead = _BLOCK if file_size is not None else READ_AHEAD
    buf, pos = b"", 0
    view: bytes | memoryview = buf
    first = last = "(none: the first header)"
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        if len(buf) - pos >= _BLOCK:
            block = buf[pos:pos + _BLOCK]
            pos += _BLOCK
        else:  # the next read; a header cut by the last one is joined from both (the buffer is not copied)
            tail = buf[pos:]
            buf = _read_exact(fileobj, ahead)
            view = memoryview(buf) if views else buf
            pos = _BLOCK - len(tail)
            block = tail + buf[:pos] if tail else buf[:pos]
        if len(block) < _BLOCK:
            if last == first:
                what = "a gzip file whose content is" if compressed else "a stream of"
                raise DataError(f"{url}: {what} {len(block)} bytes, too short for a tar (a tar header is "
                                f"{_BLOCK} bytes); {what_to_do()}")
            raise DataError(f"{url}: truncated shard: the stream ends after member '{last}' without the "
                            f"tar end-of-archive marker; {what_to_do()}")
        if block == _ZEROS:
            return  # end-of-archive: the rest is zero padding
        if not _checksum_ok(block):
            if last == first:
                what = ("is gzip-compressed, but what is inside is not a tar" if compressed else
                        "is neither a tar nor a gzip-compressed tar (its first block is not a tar header)")
                raise DataError(f"{url} {what}. A shard must be a tar (pack-shards) or a WeNet-style .tar.gz "
                                f"(tar czf); check that the data list names shards.")
            raise DataError(f"{url}: corrupt tar header after member '{last}' (bad checksum); {what_to_do()}")
        end = block.find(b"\0", 0, 100)
        name_field = block[:end if end >= 0 else 100]
        if block[345] and block[257:262] == b"ustar":
            name_field = block[345:500].split(b"\0", 1)[0] + b"/" + name_field
        name = name_field.decode("utf-8", "replace")
        size = _octal(block[124:136], url=url, what=f"size of '{name}'")
        typeflag = block[156:157]
        if typeflag not in _META:  # pax / GNU long-name headers describe the entry after them
            if pax or long_name is not None:
                if pax.get("path"):
                    name = pax["path"]
                if "size" in pax:
                    size = int(pax["size"])
                if long_name is not None:
                    name = long_name
                pax, long_name = {}, None
        padded = size + (-size % _BLOCK)
        have = len(buf) - pos
        if typeflag in _REGULAR and skip_payload is not None and skip_payload(name):
            if padded <= have:
                pos += padded
            else:
                buf, pos = b"", 0
                if not _skip(fileobj, padded - have, file_size):
                    raise DataError(f"{url}: truncated shard: member '{name}' needs {size} bytes but the stream "
                                    f"ends first; the last complete member is '{last}'; {what_to_do()}")
            last = name
            yield name, b""
            continue
        if size < 0 or size > max_member_bytes:
            raise DataError(f"{url}: member '{name}' is {size} bytes, over the cap max_member_bytes="
                            f"{max_member_bytes}; it is rejected, not buffered. If the member is legitimate, raise "
                            f"the cap (the loader: ++dataset_conf.max_member_bytes; verify-shards and stats read "
                            f"with the default cap).")
        if padded <= have:
            data = view[pos:pos + size]
            pos += padded
        else:  # the member runs past the buffer: its rest is read at once
            data = buf[pos:] + _read_exact(fileobj, padded - have)
            buf, pos = b"", 0
            if len(data) < padded:
                if len(data) < size:
                    raise DataError(f"{url}: truncated shard: member '{name}' needs {size} bytes but the stream "
                                    f"ends after {len(data)}; the last complete member is '{last}'; {what_to_do()}")
                raise DataError(f"{url}: truncated shard inside the padding of member '{name}'; {what_to_do()}")
            data = data[:size] if padded != size else data
        if typeflag in _REGULAR:
            last = name
            yield name, data
        elif typeflag == b"x":
            pax = _pax_records(bytes(data), url=url)
        elif typeflag == b"L":
            long_name = bytes(data).split(b"\0", 1)[0].decode("utf-8", "replace")
        # 'g' (global pax), '5' (directory), links, devices: nothing to yield


def _local_file_size(fileobj: IO[bytes]) -> int | None:
    """Size in bytes of a seekable local file, None for pipes, sockets and remote files (read past)."""
    if not (isinstance(fileobj, io.BufferedReader) and fileobj.seekable()):
        return None
    try:
        return os.fstat(fileobj.fileno()).st_size
    except (OSError, io.UnsupportedOperation):
        return None


def _skip(fileobj: IO[bytes], n: int, file_size: int | None) -> bool:
    """Move ``n`` bytes forward (seek when ``file_size`` is known); False when the stream ends first."""
    if file_size is not None:
        return fileobj.seek(n, io.SEEK_CUR) <= file_size
    while n > 0:
        chunk = fileobj.read(min(n, 1 << 20))
        if not chunk:
            return False
        n -= len(chunk)
    return True


def _decode_txt(data: bytes | memoryview, *, url: str, member: str) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{url}: member '{member}' is not UTF-8 (byte {exc.start}); transcripts must be "
                        f"UTF-8 text. Re-pack the shard from a UTF-8 source.") from None


def _finish(prefix: str, fields: dict[str, bytes], names: dict[str, str], *, url: str, pos: int) -> dict:
    sample: dict = {}
    meta: dict = {}
    if "json" in fields:
        try:
            meta = json.loads(str(fields["json"], "utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{url}: member '{names['json']}' is not valid JSON ({exc}); {what_to_do()}") from None
        if not isinstance(meta, dict):
            raise DataError(f"{url}: member '{names['json']}' must hold a JSON object; {what_to_do()}")
    key = meta.get("key")
    if not isinstance(key, str) or not key:
        try:
            key = key_from_member_name(prefix)
        except UnicodeDecodeError:
            key = prefix
    sample["key"] = key
    audio_exts = [ext for ext in fields if ext in AUDIO_EXTS]
    if len(audio_exts) > 1:
        raise DataError(f"{url}: sample '{key}' has several audio members "
                        f"({', '.join(names[e] for e in audio_exts)}); a sample holds one audio member.")
    if audio_exts:
        sample["audio"] = fields[audio_exts[0]]
        sample["audio_format"] = audio_exts[0]
    if "txt" not in fields:
        first = next(iter(names.values()))
        raise DataError(f"{url}: sample '{key}' (member '{first}') has no .txt member; every sample needs "
                        f"its transcript next to it (WeNet crashes without it). Re-pack the shard.")
    sample["txt"] = _decode_txt(fields["txt"], url=url, member=names["txt"])
    sample["meta"] = meta
    if "npy" in fields:
        sample["npy"] = fields["npy"]
    for ext, data in fields.items():
        if ext not in sample and ext not in ("json", "txt") and ext not in AUDIO_EXTS:
            sample[ext] = data
    sample["__url__"] = url
    sample["__pos__"] = pos
    return sample


def member_keys(path: str) -> list[str]:
    """The sample names of a local uncompressed shard, in order, from its tar headers alone (every payload is
    seeked over, never read): the prefix each run of adjacent members shares (:func:`split_member`)."""
    keys: list[str] = []
    with open(path, "rb") as f:
        for name, _ in iter_tar_members(f, url=path, skip_payload=lambda _name: True):
            stem = split_member(name)[0]
            if not keys or keys[-1] != stem:
                keys.append(stem)
    return keys


def group_samples(members: Iterable[tuple[str, bytes]], *, url: str) -> Iterator[dict]:
    """Group adjacent members with the same key into sample dicts (see docs/DEVELOPING.md).

    Keys: ``key``, ``audio``/``audio_format`` (when an audio member exists), ``txt`` (str),
    ``meta`` (dict from ``.json``, ``{}`` without one), ``npy`` (bytes, if present), every other
    field as ``<ext>``: bytes, then ``__url__`` and ``__pos__`` (0-based sample index in the shard).
    """
    prefix: str | None = None
    fields: dict[str, bytes] = {}
    names: dict[str, str] = {}
    pos = 0
    for name, data in members:
        member_prefix, ext = split_member(name)
        if not ext:
            raise DataError(f"{url}: member '{name}' has no extension, so it cannot be grouped into a "
                            f"sample (WeNet drops the rest of such a tar); {what_to_do()}")
        if member_prefix != prefix:
            if prefix is not None:
                yield _finish(prefix, fields, names, url=url, pos=pos)
                pos += 1
            prefix, fields, names = member_prefix, {}, {}
        if ext in fields:
            raise DataError(f"{url}: member '{name}' repeats field '.{ext}' of sample '{prefix}' "
                            f"(first: '{names[ext]}'); keys must be unique within a shard.")
        fields[ext] = data
        names[ext] = name
    if prefix is not None:
        yield _finish(prefix, fields, names, url=url, pos=pos)


def read_shard(url: str, *, storage_options: dict | None = None,
               max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES, allow_pipe: bool = False,
               wrap: Callable[[IO[bytes]], IO[bytes]] | None = None, views: bool = False) -> Iterator[dict]:
    """Samples of the shard at ``url`` (local path, file://, http(s)://, s3://, or pipe: when allowed).
    ``wrap``: applied to the opened stream (the loader's profile times its reads). ``views``: members as
    memoryviews of the read buffer (:func:`iter_tar_members`), for a reader that copies what it keeps."""
    from corpus_io.storage.urls import open_url

    f = open_url(url, storage_options=storage_options, allow_pipe=allow_pipe)
    try:
        stream = f if wrap is None else wrap(f)
        yield from group_samples(iter_tar_members(stream, url=url, max_member_bytes=max_member_bytes, views=views),
                                 url=url)
    finally:
        f.close()
