"""Lhotse Shar in and out: ``cuts.NNNNNN.jsonl.gz`` + ``recording.NNNNNN.tar`` shards.

Lhotse's ``SharWriter`` (``CutSet.to_shar``) writes, per shard, the cuts (one JSON line each, ``start`` 0: the tar
holds each cut's own audio) and a tar of pairs ``<cut id>.<fmt>`` + ``<cut id>.json`` (the recording manifest) in
the cuts' order; ``<fmt>`` is ``wav``, ``flac``, ``mp3``, ``opus`` or ``original`` (the source's container under
that literal name), so the container is sniffed from the bytes, never taken from the name. A cut without
recording has the pair ``<id>.nodata`` + ``<id>.nometa``.

* :func:`shar_shards` finds the shards of a Shar directory (local or a URL listing) or of a list of cuts URLs;
  each cuts file's tar is the file beside it named ``recording.NNNNNN.tar``.
* :func:`read_shar_shard`: the loader's samples of one shard, the cuts and the tar streamed side by side (local,
  ``s3://``, ``http(s)://``; nothing extracted to disk); positions count the samples given.
* :func:`index_entry`: a shard's ``index.jsonl`` entry from its cuts alone (durations, keys; no audio read).
* :class:`SharDriver`: a local Shar as an input of :mod:`corpus_io.tables.inputs` (pack-shards,
  make-datalist raw, stats, read_manifest): records whose ``source`` is ``<recording tar>//<member>``.
* :func:`write_shar`: records -> a Shar directory that ``CutSet.from_shar`` reads, the audio bytes copied.

A cut is read as :mod:`corpus_io.tables.inputs` reads a Lhotse cut (its span, its supervisions' texts joined);
its ``custom`` fields with plain values become record fields (sample ``meta``).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
import tempfile
from array import array
from bisect import bisect_right
from collections import Counter
from typing import Any, Iterable, Iterator

from corpus_io.audio import io as audio
from corpus_io.errors import ConfigError, DataError
from corpus_io.storage import urls
from corpus_io.storage.files import atomic_write, ensure_dir
from corpus_io.tables.cuts import Skip, _join_texts, _lhotse_span, _utterance

CUTS_NAME = re.compile(r"^cuts(\.\d+)?\.jsonl(\.gz)?$")
_NO_DATA = (".nodata", ".nometa")
_FIX = ("Write the Shar again with Lhotse (cuts.to_shar(out_dir, fields={'recording': 'flac'})) or re-copy it "
        "whole.")
_PLAIN = (str, int, float, bool)
TAR_MTIME = 0  # fixed header fields: the same input gives the same bytes (Lhotse's own tars say 0 too)


def is_shar_cuts(url: str) -> bool:
    """Whether ``url`` names the cuts file of a Shar shard (``cuts.000000.jsonl.gz``, ``cuts.jsonl``, ...)."""
    return bool(CUTS_NAME.match(url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]))


def recording_of(cuts_url: str) -> str:
    """The recording tar of a Shar shard, named from its cuts file (``cuts.000003.jsonl.gz`` ->
    ``recording.000003.tar`` beside it)."""
    name = cuts_url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    middle = CUTS_NAME.match(name).group(1) or ""  # type: ignore[union-attr]
    return urls.beside(cuts_url, f"recording{middle}.tar")


def _listing(path: str, storage_options: dict | None) -> list[str]:
    """The file names in a local directory or under a URL prefix."""
    if not urls.is_remote(path):
        return sorted(os.listdir(path))
    fs, inner = urls.filesystem(path, storage_options)
    try:
        return sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(inner, detail=False))
    except (FileNotFoundError, NotImplementedError) as exc:
        raise DataError(f"cannot list {path} ({type(exc).__name__}: {exc}). Give the Shar's cuts files instead "
                        f"(a list file with one cuts.NNNNNN.jsonl.gz URL per line).") from None


def is_shar_dir(path: str, storage_options: dict | None = None) -> bool:
    """Whether ``path`` is a directory (local, or an object-store prefix) holding Shar cuts files."""
    if urls.is_remote(path):
        if not path.endswith("/"):
            return False
        try:
            return any(CUTS_NAME.match(n) for n in _listing(path, storage_options))
        except DataError:
            return False
    return os.path.isdir(path) and any(CUTS_NAME.match(n) for n in os.listdir(path))


def shar_shards(path: str, storage_options: dict | None = None, *, names: list[str] | None = None) -> list[str]:
    """The cuts files of the Shar at ``path`` (a directory or URL prefix ending in ``/``), in shard order; a
    cuts file without its ``recording`` tar beside it (in a listing) is a DataError naming both. ``names``: the
    sorted listing of ``path`` when the caller has one."""
    names = _listing(path, storage_options) if names is None else names
    base = path if path.endswith("/") else path + "/"
    cuts = [base + n for n in names if CUTS_NAME.match(n)]
    if not cuts:
        raise DataError(f"{path} holds no Lhotse Shar cuts files (cuts.NNNNNN.jsonl.gz).")
    present = set(names)
    for c in cuts:
        tar = recording_of(c).rsplit("/", 1)[-1]
        if tar not in present:
            others = sorted(n for n in names if not CUTS_NAME.match(n))
            raise DataError(f"{c} has no recording tar beside it ({tar} is not in {path}; it holds "
                            f"{others[:6] or 'nothing else'}). corpus-io reads a Shar written with the audio: "
                            f"{_FIX}")
    return cuts


# --------------------------------------------------------------------------- reading


def _cut_lines(cuts_url: str, storage_options: dict | None, allow_pipe: bool = False) -> Iterator[tuple[int, dict]]:
    """``(line number, cut)`` of a cuts file (gzip or plain jsonl), streamed."""
    from corpus_io.storage.files import MAX_INFLATED_BYTES, bounded_lines, parse_json_object

    f = urls.open_url(cuts_url, storage_options=storage_options, allow_pipe=allow_pipe)
    try:
        zipped = cuts_url.split("?", 1)[0].endswith(".gz")
        gz = gzip.GzipFile(fileobj=f, mode="rb") if zipped else f
        try:
            for lineno, raw in bounded_lines(gz, cuts_url, max_total=MAX_INFLATED_BYTES if zipped else None):
                if raw.strip():
                    yield lineno, parse_json_object(raw, f"{cuts_url}:{lineno}",
                                                    "A Shar cuts file holds one Lhotse cut per line.")
        except (EOFError, gzip.BadGzipFile, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile):
                raise
            raise DataError(f"{cuts_url}: damaged or truncated gzip ({type(exc).__name__}: {exc}). {_FIX}") from None
    finally:
        f.close()


def _tar_pairs(tar_url: str, storage_options: dict | None, max_member_bytes: int,
               allow_pipe: bool = False, headers_only: bool = False) -> Iterator[tuple[str, Any]]:
    """``(data member name, data or None for a .nodata placeholder)`` of a Shar tar, streamed strictly forward;
    the ``.json`` after each data member is read past (the cut holds the same recording). ``headers_only``: the
    member's ``TarInfo`` (its byte range) in place of its data."""
    f = urls.open_url(tar_url, storage_options=storage_options, allow_pipe=allow_pipe)
    last = "(none: the first member)"
    try:
        with tarfile.open(fileobj=f, mode="r|*") as tar:
            pending: tuple[str, bytes | None] | None = None
            for info in tar:
                if not info.isfile():
                    _refuse_special(tar_url, info, last)
                    continue
                if info.size > max_member_bytes:
                    raise DataError(f"{tar_url}: member '{info.name}' is {info.size} bytes, over the cap "
                                    f"max_member_bytes={max_member_bytes}; raise the cap if it is legitimate.")
                if pending is None:
                    if info.name.endswith((".json", ".nometa")):
                        raise DataError(f"{tar_url}: member '{info.name}' after '{last}' is a manifest where the "
                                        f"data of the next cut belongs (data, then its .json). {_FIX}")
                    data = None if info.name.endswith(".nodata") else \
                        info if headers_only else tar.extractfile(info).read()  # type: ignore[union-attr]
                    pending = (info.name, data)
                else:
                    yield pending
                    pending = None
                last = info.name
            if pending is not None:
                raise DataError(f"{tar_url}: the last member '{last}' has no .json after it (a Shar tar holds pairs "
                                f"of data + manifest). {_FIX}")
    except tarfile.TarError as exc:
        raise DataError(f"{tar_url}: truncated or damaged tar after member '{last}' ({exc}). {_FIX}") from None
    except EOFError:
        raise DataError(f"{tar_url}: truncated tar: it ends inside the member after '{last}'. {_FIX}") from None
    finally:
        f.close()


_KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
          tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO"}


def _refuse_special(tar_url: str, info: tarfile.TarInfo, last: str) -> None:
    """A member that is not a regular file (a directory is passed over): a DataError naming it and what it is.
    Lhotse writes regular files only; a link's data is not in the tar, so the cut paired with it has no audio."""
    if info.isdir():
        return
    kind = _KINDS.get(info.type, f"a member of tar type {info.type!r}")
    target = f" to '{info.linkname}'" if info.issym() or info.islnk() else ""
    raise DataError(f"{tar_url}: member '{info.name}' (after '{last}') is {kind}{target}, not a regular file: a Shar "
                    f"tar holds each cut's data and its .json as regular files, and a link's data is not in the tar. "
                    f"Write the Shar again with the file itself in place of the link (Lhotse's to_shar does).")


def _stem(member: str) -> str:
    """The cut id of a Shar member name (``<cut id>.<ext>``; ids may hold dots and slashes)."""
    return member.rsplit(".", 1)[0] if "." in member.rsplit("/", 1)[-1] else member


def cut_record(obj: dict, where: str) -> dict | Skip:
    """The canonical record of one Shar cut (no ``source`` yet), or an ``inputs.Skip``: the rules of a Lhotse cut
    (span inside its recording, supervisions joined, no overlap, no mixed cut), its plain ``custom`` fields kept."""
    key = str(obj.get("id", ""))
    kind = obj.get("type", "MonoCut")
    if kind not in ("MonoCut", "MultiCut"):
        raise DataError(f"{where}: cut '{key}' is a {kind}; a Shar holds the audio of mono cuts. {_FIX}")
    recording = obj.get("recording")
    if not isinstance(recording, dict):
        return Skip("no recording", where, key, "the cut has no 'recording' (written without audio?)")
    start, duration = _lhotse_span(obj, recording, where, key, "cut")
    sups = obj.get("supervisions") or []
    if not sups:
        return Skip("no supervision", where, key, "'supervisions' is empty: the transcript is a supervision's 'text'")
    text, speaker, language = _join_texts(sups, where, key)
    whole = start < 1e-3 and abs(duration - float(recording.get("duration", -1))) < 1e-3
    rec = _utterance(key, "", start, duration, whole, text, speaker, language, where)
    for name, value in (obj.get("custom") or {}).items():
        if isinstance(value, _PLAIN) and name not in rec:
            rec[name] = value
    return rec


def _meta(rec: dict) -> dict:
    """A sample's ``meta`` (as a packed shard's ``.json``): the record's fields but its source and text."""
    meta = {k: v for k, v in rec.items() if k not in ("key", "source", "target", "start", "end", "where")}
    meta["key"] = rec["key"]
    return meta


def _sample(rec: dict, data: bytes, member: str, url: str, pos: int) -> dict:
    fmt = audio_format(data, member)
    sample = {"key": rec["key"], "audio": data, "audio_format": fmt, "txt": rec["target"], "meta": _meta(rec)}
    if "start" in rec:
        sample["start"], sample["end"] = rec["start"], rec["end"]
    sample["__url__"], sample["__pos__"] = url, pos
    return sample


def audio_format(data: bytes, member: str) -> str:
    """The container of a Shar audio member, sniffed (Lhotse may name it ``.original``)."""
    ext = member.rsplit(".", 1)[-1].lower()
    sniffed = audio.sniff_audio_format(data)
    if sniffed:
        return sniffed
    if ext in audio.AUDIO_EXTENSIONS:
        return ext
    raise DataError(f"member '{member}' is not audio corpus-io can read (wav/flac/ogg/opus/mp3). {_FIX}")


def read_shar_shard(url: str, *, storage_options: dict | None = None, max_member_bytes: int = audio.MAX_SOURCE_BYTES,
                    allow_pipe: bool = False, counts: Counter | None = None) -> Iterator[dict]:
    """The loader's samples of the Shar shard whose cuts file is ``url`` (docs/DEVELOPING.md "The sample dict"),
    the cuts and ``recording`` tar streamed side by side. A cut without supervision or recording is passed over
    (counted in ``counts`` by its reason) and takes no position, as :func:`index_entry` counts; a tar member that
    is not its cut's, or a tar shorter or longer than the cuts, is a DataError naming both files."""
    for pos, (rec, member, data) in enumerate(_paired(url, storage_options, max_member_bytes, allow_pipe, counts)):
        yield _sample(rec, data, member, url, pos)


def locate_shar_shard(url: str, *, storage_options: dict | None = None) -> Iterator[tuple[dict, str, Any]]:
    """``(record, member name, TarInfo)`` of each sample of a Shar shard, in position order, from the cuts and the
    tar's headers (no audio read): the explorer serves a sample's audio by the member's byte range in
    :func:`recording_of` ``(url)``."""
    yield from _paired(url, storage_options, audio.MAX_SOURCE_BYTES, False, None, headers_only=True)


def _paired(url: str, storage_options: dict | None, max_member_bytes: int, allow_pipe: bool, counts: Counter | None,
            headers_only: bool = False) -> Iterator[tuple[dict, str, Any]]:
    """``(record, member, data or TarInfo)`` of each cut of a Shar shard that gives a sample (the others counted in
    ``counts``), its tar member checked to be the cut's."""
    tar_url = recording_of(url)
    pairs = _tar_pairs(tar_url, storage_options, max_member_bytes, allow_pipe, headers_only)
    last = "(none: the first)"
    for lineno, obj in _cut_lines(url, storage_options, allow_pipe):
        where = f"{url}:{lineno}"
        key = str(obj.get("id", ""))
        pair = next(pairs, None)
        if pair is None:
            raise DataError(f"{where}: cut '{key}' has no recording: {tar_url} ends after the member of cut "
                            f"'{last}'. The tar is truncated or belongs to other cuts; {_FIX}")
        member, data = pair
        if _stem(member) != key:
            raise DataError(f"{where}: cut '{key}' is paired with tar member '{member}' of {tar_url}: the tar's "
                            f"members are out of the cuts' order (or of other cuts). {_FIX}")
        last = key
        rec = cut_record(obj, where)
        if data is None and isinstance(rec, dict):
            rec = _skip(where, key, "no recording", f"{tar_url} holds a .nodata placeholder for it")
        if not isinstance(rec, dict):
            if counts is not None:
                counts[f"shar cuts with {rec.reason}"] += 1
            continue
        yield rec, member, data
    extra = next(pairs, None)
    if extra is not None:
        raise DataError(f"{tar_url} holds member '{extra[0]}' after the last cut of {url} ('{last}'): the tar has "
                        f"more recordings than the cuts file has cuts. {_FIX}")


def _skip(where: str, key: str, reason: str, detail: str) -> Skip:
    return Skip(reason, where, key, detail)


def _records(url: str, storage_options: dict | None) -> Iterator[dict]:
    """The records of a Shar shard's cuts that give a sample (no ``source``), from the cuts alone."""
    for lineno, obj in _cut_lines(url, storage_options):
        rec = cut_record(obj, f"{url}:{lineno}")
        if isinstance(rec, dict):
            yield rec


def cut_metadata(url: str, *, storage_options: dict | None = None) -> Iterator[dict]:
    """``{key, txt, meta, __url__, __pos__}`` of every sample of a Shar shard, from its cuts alone (stats)."""
    for pos, rec in enumerate(_records(url, storage_options)):
        yield {"key": rec["key"], "txt": rec["target"], "meta": _meta(rec), "__url__": url, "__pos__": pos}


def index_entry(url: str, *, storage_options: dict | None = None) -> dict:
    """The ``index.jsonl`` entry of one Shar shard, from its cuts alone (no audio read): ``path`` (the cuts
    URL), ``num_utts`` (cuts that give a sample), ``duration`` / ``min_duration`` / ``max_duration`` (s)
    ``durations`` (each cut's seconds) and ``keys``."""
    durations: list[float] = []
    keys: list[str] = []
    for rec in _records(url, storage_options):
        keys.append(rec["key"])
        durations.append(float(rec["duration"]))
    return {"path": url, "num_utts": len(keys), "duration": round(sum(durations), 3),
            "min_duration": round(min(durations), 3) if durations else 0.0,
            "max_duration": round(max(durations), 3) if durations else 0.0,
            "durations": [round(d, 2) for d in durations], "keys": keys}


# --------------------------------------------------------------------------- a local Shar as an input


def shar_input_shards(path: str, names: list[str] | None = None) -> list[str] | None:
    """The cuts files of a local Shar input (a directory, a cuts file, or a list file of cuts paths), or None
    when ``path`` is none of these. A remote one is a ConfigError: it is read where it streams, by the loader.
    ``names``: the sorted listing of the directory ``path`` when the caller has one (it is then not listed)."""
    if urls.is_remote(path):
        if is_shar_cuts(path) or path.endswith("/"):
            raise ConfigError(f"{path}: a Shar on object storage or a web server is read directly by the loader: "
                              f"list it with make-datalist ++data_type=shard ++input={path} and train on that "
                              f"list. pack-shards and the other commands that read it as an input need a local "
                              f"copy.")
        return None
    if os.path.isdir(path):
        names = sorted(os.listdir(path)) if names is None else names
        first = next((os.path.join(path, n) for n in names if CUTS_NAME.match(n)), None)
        return shar_shards(path, names=names) if first is not None and _holds_shar_cuts(first) else None
    if is_shar_cuts(path) and os.path.isfile(path) and _holds_shar_cuts(path):
        return [path]
    return None


def _holds_shar_cuts(cuts: str) -> bool:
    """Whether the first cut of ``cuts`` has its audio in a Shar tar (a ``shar`` source): a CutSet that is merely
    named ``cuts.jsonl.gz`` (as Lhotse recipes name them) is read as a CutSet. A cuts file that cannot be read
    (damaged gzip, a line past the bounds, not JSON) is a DataError naming it: its name says it is meant as one."""
    for _, obj in _cut_lines(cuts, None):
        sources = (obj.get("recording") or {}).get("sources") or [{}]
        return sources[0].get("type") == "shar"
    return False


def _member_names(tar: str, cuts: str) -> list[str]:
    """The data members of a local Shar tar, in order, from its headers only (payloads are seeked over)."""
    if not os.path.isfile(tar):
        raise DataError(f"{cuts} has no recording tar beside it ({tar} does not exist). {_FIX}")
    names: list[str] = []
    last = "(none: the first member)"
    try:
        with tarfile.open(tar, "r:") as t:
            members = []
            for m in t:
                if not m.isfile():
                    _refuse_special(tar, m, members[-1].name if members else last)
                    continue
                members.append(m)
    except (tarfile.TarError, EOFError) as exc:
        raise DataError(f"{tar}: truncated or damaged tar ({exc}). {_FIX}") from None
    size = os.path.getsize(tar)
    for i, m in enumerate(members):
        if m.offset_data + m.size > size:
            raise DataError(f"{tar}: truncated tar: member '{m.name}' needs {m.size} bytes but the file ends "
                            f"first; the last complete member is '{last}'. {_FIX}")
        if i % 2 == 0:
            names.append(m.name)
        last = m.name
    if len(members) % 2:
        raise DataError(f"{tar}: the last member '{last}' has no .json after it (a Shar tar holds pairs of data + "
                        f"manifest). {_FIX}")
    return names


class SharDriver:
    """The cuts of a local Shar's shards, decompressed once into a temporary driver file (``path``; the input that
    reads it deletes it), one line per cut (``{n, line, cut}``), each paired with its tar member by the tar headers:
    a cut without its member, or members out of order, is a DataError here, before any record is read."""

    def __init__(self, cuts_files: list[str]):
        self.firsts = array("q")  # the driver line number of each shard's first cut
        self.sources: list[tuple[str, str, list[str]]] = []  # (cuts file, tar, data members)
        fd, self.path = tempfile.mkstemp(prefix="corpus-io-shar-", suffix=".jsonl")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                lineno = 0
                for cuts in cuts_files:
                    self.firsts.append(lineno + 1)
                    lineno += self._pair(cuts, out)
        except BaseException:
            os.unlink(self.path)
            raise
        self.files = [f for c, t, _ in self.sources for f in (c, t)]

    def _pair(self, cuts: str, out: Any) -> int:
        tar = recording_of(cuts)
        members = _member_names(tar, cuts)
        self.sources.append((cuts, tar, members))
        n = 0
        for file_line, obj in _cut_lines(cuts, None):
            key = str(obj.get("id", ""))
            if n >= len(members):
                raise DataError(f"{cuts}:{file_line}: cut '{key}' has no recording: {tar} holds {len(members)} "
                                f"members for more cuts. {_FIX}")
            if _stem(members[n]) != key:
                raise DataError(f"{cuts}:{file_line}: cut '{key}' is paired with tar member '{members[n]}' of {tar}: "
                                f"the tar's members are out of the cuts' order (or of other cuts). {_FIX}")
            out.write(json.dumps({"n": n, "line": file_line, "cut": obj}, ensure_ascii=False) + "\n")
            n += 1
        if n < len(members):
            raise DataError(f"{tar} holds member '{members[n]}' after the last cut of {cuts}: the tar has more "
                            f"recordings than the cuts file has cuts. {_FIX}")
        return n

    @staticmethod
    def key(obj: dict) -> str:
        """The key of a driver line's cut."""
        return str(obj["cut"].get("id", ""))

    def record(self, obj: dict, driver_line: int) -> dict | Skip:
        """The record of a driver line: the cut's, sourced ``<recording tar>//<member>``."""
        cuts, tar, members = self.sources[bisect_right(self.firsts, driver_line) - 1]
        cut, where, member = obj["cut"], f"{cuts}:{obj['line']}", members[obj["n"]]
        if member.endswith(".nodata"):
            return _skip(where, str(cut.get("id", "")), "no recording", f"{tar} holds a .nodata placeholder for it")
        rec = cut_record(cut, where)
        if isinstance(rec, dict):
            rec["source"] = f"{tar}//{member}"
            rec["where"] = where
        return rec


# --------------------------------------------------------------------------- writing


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), TAR_MTIME, 0o644
    tar.addfile(info, io.BytesIO(data))


def _mono(item: dict) -> tuple[bytes, str, int]:
    """``(bytes, format, samples)`` of an item's audio as one mono cut: the bytes as they are, unless the file has
    several channels (mixed down, as corpus-io reads them, and encoded as FLAC: a Shar cut takes one channel)."""
    data = item["audio"]
    info = audio.header_info(data, len(data))
    channels = info.channels if info is not None else None
    if channels is None:
        import soundfile as sf

        try:
            channels = int(sf.info(io.BytesIO(data)).channels)
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            raise DataError(f"key '{item['key']}': not a readable audio file ({exc}).") from None
    if channels == 1:
        return data, item["audio_format"], int(item["num_samples"])
    wave, rate = audio.decode_bytes(data, where=f"key '{item['key']}'")
    wave = audio.to_mono(wave)
    return audio.encode(wave, rate, "flac"), "flac", int(wave.shape[0])


def _cut_json(item: dict, num_samples: int) -> tuple[dict, dict]:
    """``(cut, recording manifest)`` of one item, as Lhotse's SharWriter writes them (``start`` 0, one channel)."""
    key, rate = item["key"], int(item["sample_rate"])
    duration = num_samples / rate
    recording = {"id": key, "sources": [{"type": "shar", "channels": [0], "source": ""}], "sampling_rate": rate,
                 "num_samples": num_samples, "duration": duration, "channel_ids": [0]}
    fields = dict(item.get("fields") or {})
    sup: dict[str, Any] = {"id": key, "recording_id": key, "start": 0, "duration": duration, "channel": 0,
                           "text": item["text"]}
    if item.get("speaker") is not None:
        sup["speaker"] = str(item["speaker"])
    if isinstance(fields.get("language"), str):
        sup["language"] = fields.pop("language")
    cut: dict[str, Any] = {"id": key, "start": 0, "duration": duration, "channel": 0, "supervisions": [sup],
                           "recording": recording}
    if fields:
        cut["custom"] = fields
    cut["type"] = "MonoCut"
    return cut, recording


def write_shar_group(items: list[dict], output_dir: str, index: int, num_files: int, *, split: str = "") -> list[str]:
    """Shard ``index`` of a Lhotse Shar: ``cuts.NNNNNN.jsonl.gz`` + ``recording.NNNNNN.tar`` in
    ``output_dir/<split>`` (in ``output_dir`` when ``split`` is empty). The writer of ``corpus-io export
    ++format=lhotse-shar`` (the contract and the items are in ``corpus_io/shards/export.py``): a Shar directory is
    one split, and ``CutSet.from_shar(in_dir=...)`` takes every file in it as a field, so export's own records
    (``.export-*.json``, part records) stay one level up, in ``output_dir``.
    The audio bytes are copied as they are (a multi-channel file is mixed down to FLAC); fixed header fields
    (tar mtime 0, gzip mtime 0 and no name), so the same items give the same bytes; each file is written under a
    temporary name and renamed. Returns the two file names (relative to ``output_dir``)."""
    del num_files
    names = [os.path.join(split, f"recording.{index:06d}.tar"), os.path.join(split, f"cuts.{index:06d}.jsonl.gz")]
    if split:
        ensure_dir(os.path.join(output_dir, split))
    with atomic_write(os.path.join(output_dir, names[0]), "wb") as tar_file, \
            atomic_write(os.path.join(output_dir, names[1]), "wb") as cuts_file:
        with tarfile.open(fileobj=tar_file, mode="w", format=tarfile.PAX_FORMAT) as tar, \
                gzip.GzipFile(filename="", fileobj=cuts_file, mode="wb", mtime=0) as gz:
            for item in items:
                data, fmt, n = _mono(item)
                cut, recording = _cut_json(item, n)
                _tar_member(tar, f"{item['key']}.{fmt}", data)
                _tar_member(tar, f"{item['key']}.json", json.dumps(recording).encode("utf-8") + b"\n")
                gz.write(json.dumps(cut, ensure_ascii=False).encode("utf-8") + b"\n")
    return names


_NOT_FIELDS = {"key", "source", "target", "start", "end", "where", "speaker", "duration", "source_len", "target_len",
               "sample_rate", "num_samples"}


def shar_item(rec: dict, *, storage_options: dict | None = None, allow_pipe: bool = False) -> dict:
    """The :func:`write_shar_group` item of a canonical record: its stored bytes, or its span (a segment) encoded
    as FLAC."""
    where = rec.get("where", rec["key"])
    data = audio.read_source_bytes(str(rec["source"]), allow_pipe=allow_pipe, storage_options=storage_options)
    fmt = audio.sniff_audio_format(data)
    info = audio.header_info(data, len(data))
    if "start" in rec or fmt is None or info is None:
        wave, rate = audio.decode_bytes(data, where=where)
        first, last = 0, None
        if "start" in rec:
            first, last = audio.segment_samples(float(rec["start"]), float(rec.get("end", -1)), rate, wave.shape[0])
        wave = audio.to_mono(wave[first:last])
        data, fmt, rate, n = audio.encode(wave, rate, "flac"), "flac", rate, int(wave.shape[0])
    else:
        rate, n = info.sample_rate, info.num_samples
    fields = {k: v for k, v in rec.items() if k not in _NOT_FIELDS and isinstance(v, _PLAIN)}
    return {"key": rec["key"], "audio": data, "audio_format": fmt, "text": str(rec.get("target", "")),
            "sample_rate": rate, "num_samples": n, "duration": n / rate, "speaker": rec.get("speaker"),
            "fields": fields}


def write_shar(records: Iterable[dict], output_dir: str, *, shard_size: int = 1000,
               storage_options: dict | None = None, allow_pipe: bool = False) -> list[str]:
    """Canonical records (:func:`corpus_io.tables.inputs.iter_records`) as a Lhotse Shar in ``output_dir``,
    ``shard_size`` per shard (:func:`write_shar_group`); returns the file names written. The ``export`` command does
    the same as jobs, resumable; this is the one-process form for the API and tests."""
    if urls.is_remote(output_dir):
        raise ConfigError(f"{output_dir}: the Shar writer writes a local directory; copy it after.")
    ensure_dir(output_dir)
    names: list[str] = []
    batch: list[dict] = []
    for rec in records:
        batch.append(shar_item(rec, storage_options=storage_options, allow_pipe=allow_pipe))
        if len(batch) == shard_size:
            names += write_shar_group(batch, output_dir, len(names) // 2, 0)
            batch = []
    if batch:
        names += write_shar_group(batch, output_dir, len(names) // 2, 0)
    return names
