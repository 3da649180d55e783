"""The worker side of ``pack-shards``: one shard written from its records (or kept, when a complete shard of
exactly this task is there already).

A record becomes its members: ``<key>.txt``, ``<key>.json`` (metadata) and the audio as stored, or cut (a
segment), resampled or re-encoded (``audio_format``), or a Kaldi feature matrix as ``<key>.npy``. The shard is
written to a temp name (hashing while writing) and renamed, then its hidden sidecar ``.<shard>.json`` (stats and
a digest of its inputs) is written; on object storage the shard is sent as one object and its local copy removed.
:class:`PackOptions`, :class:`ShardTask` and :class:`ShardStat` are what travels to and from the worker.
``export`` writes its audio members with :func:`audio_members`.
"""


from __future__ import annotations

import functools
import io
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corpus_io.audio import io as audio
from corpus_io.errors import DataError
from corpus_io.shards import format as fmt
from corpus_io.shards.writer import ShardWriter
from corpus_io.storage import objects
from corpus_io.storage.files import (
    completed_output,
    inputs_digest,
    sidecar_path,
    write_sidecar,
)
from corpus_io.tables import kaldi, parquet
from corpus_io.tables.parquet import INLINE

# FunASR/WeNet fields that become members or computed metadata instead of being copied to the .json
# (INLINE: a parquet row's audio bytes, which become the audio member).
_CORE_FIELDS = {"key", "source", "target", "source_len", "target_len", "start", "end", INLINE}
FORMAT_VERSION = 1  # part of every shard digest: bump when member bytes change for the same input


# --------------------------------------------------------------------------- options and tasks


@dataclass(frozen=True)
class PackOptions:
    """What a worker needs besides the records (picklable)."""

    audio_format: str = "keep"  # keep | wav | flac
    resample: int | None = None  # Hz
    feats: bool = False
    on_error: str = "fail"  # fail | skip
    allow_pipe: bool = False
    storage_options: dict = field(default_factory=dict)
    compression: str = "none"  # none | gzip (.tar.gz)

    @functools.cached_property
    def storage_options_json(self) -> str:
        """``storage_options`` as the key of the per-source caches (made once, not per utterance)."""
        return json.dumps(self.storage_options, sort_keys=True)

    def digest_part(self) -> list:
        # compression only when set, so the digests of plain shards packed before it existed still match
        return [FORMAT_VERSION, self.audio_format, self.resample, self.feats] + \
            ([self.compression] if self.compression != "none" else [])


@dataclass
class ShardTask:
    index: int
    path: str  # final shard path (absolute)
    records: list[dict]
    options: PackOptions
    url: str = ""  # the shard's object URL when output_dir is on object storage (path: its local staging name)


@dataclass
class ShardStat:
    path: str
    num_utts: int
    duration: float  # seconds, total
    min_duration: float  # seconds
    max_duration: float  # seconds
    bytes: int
    sha256: str
    digest: str
    skipped: dict[str, int]
    resumed: bool = False
    keys: list[str] | None = None  # utterance keys in shard order (None: a sidecar of an older version)
    durations: list[float] | None = None  # each utterance's seconds, 10 ms steps, shard order (None: older sidecar)

    def index_entry(self) -> dict:
        entry = {"path": self.path, "num_utts": self.num_utts, "duration": round(self.duration, 3),
                 "min_duration": round(self.min_duration, 3), "max_duration": round(self.max_duration, 3),
                 "bytes": self.bytes, "sha256": self.sha256}
        if self.durations is not None:  # the loader's bucket edges (corpus_io.loader.shapes)
            entry["durations"] = self.durations
        if self.keys is not None:  # lets verify-shards, make-datalist and the loader find repeats without audio
            entry["keys"] = self.keys
        return entry


# --------------------------------------------------------------------------- worker side


def task_digest(task: ShardTask) -> str:
    # a parquet row's bytes enter as their size: its source (file and row) names them, as a path names a file's
    return inputs_digest([task.options.digest_part(), Path(task.path).name,
                          [{k: len(v) if k == INLINE else v for k, v in r.items() if k != "where"}
                           for r in task.records]])


def _resume(task: ShardTask, digest: str) -> ShardStat | None:
    """The stat of an already complete shard for exactly this task, else None."""
    stat = _completed_object(task, digest) if task.url else completed_output(task.path, digest)
    try:
        # The sidecar's own path is not trusted: a copied directory (or an old sidecar that stored the
        # first run's absolute path) resumes under this run's output_dir.
        return None if stat is None else ShardStat(**{**stat, "path": task.url or task.path, "resumed": True})
    except TypeError:  # a sidecar of another version, missing a field
        return None


def _completed_object(task: ShardTask, digest: str) -> dict | None:
    """The local sidecar stat of a shard already sent to object storage, when the object there has its size,
    sha256 and input digest (object metadata); else None."""
    try:
        stat = json.loads(sidecar_path(task.path).read_text(encoding="utf-8"))
        if stat.get("digest") != digest:
            return None
        size, sha256 = int(stat["bytes"]), str(stat["sha256"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    matches = objects.object_matches(task.url, task.options.storage_options, size=size, sha256=sha256, digest=digest)
    return stat if matches else None


def _text_of(record: dict) -> str:
    target = record.get("target")
    if target is None:
        raise DataError("no transcript ('target' / 'txt' field or a line in text)")
    return target if isinstance(target, str) else str(target)


def _meta(record: dict, first: dict[str, Any]) -> dict:
    meta = {"key": record["key"], **first}
    if "target_len" in record:
        meta["target_len"] = record["target_len"]
    if "start" in record:
        meta["segment"] = [record["start"], record.get("end", -1)]
    for name, value in record.items():
        if name not in _CORE_FIELDS and name != "where" and name not in meta:
            meta[name] = value
    return meta


def audio_members(record: dict, opts: PackOptions) -> tuple[str, bytes, dict[str, Any]]:
    """``(extension, bytes, metadata)`` of the audio member of one record."""
    source = str(record["source"])
    try:
        data = _record_bytes(record, opts)
    except OSError as exc:
        raise DataError(f"cannot read audio {source}: {exc}") from None
    ext = audio.extension_of(source)
    orig = fmt.sniff_audio_format(data) or (ext if ext in fmt.AUDIO_EXTS else None)
    if orig is None:
        raise DataError(f"{source} is not a known audio format (not wav/flac/ogg/opus/mp3)")
    segment = "start" in record
    if opts.audio_format == "keep" and opts.resample is None and not segment:
        # Header parsing in pure Python: soundfile's probe costs ~0.3 ms per file, as much as the write.
        info = audio.header_info(data, len(data))
        if info is None:
            import soundfile as sf

            try:
                sfi = sf.info(io.BytesIO(data))
            except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
                raise DataError(f"{source}: not a readable audio file ({exc})") from None
            info = audio.AudioInfo(int(sfi.samplerate), int(sfi.frames), int(sfi.channels), orig)
        header = (info.sample_rate, info.num_samples)
        rate, n = header
        out_ext, out = orig, data
    else:
        # Cut, resample or re-encode: decode (only the segment's range), then encode.
        import soundfile as sf

        try:
            info = sf.info(io.BytesIO(data))
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            raise DataError(f"{source}: not a readable audio file ({exc})") from None
        rate = int(info.samplerate)
        first, last = 0, None
        if segment:
            try:
                first, last = audio.segment_samples(float(record["start"]), float(record.get("end", -1)), rate,
                                                    int(info.frames))
            except DataError as exc:
                raise DataError(f"{source}: {exc}") from None
        wave, rate = audio.decode_bytes(data, where=source, start=first, stop=last)
        if opts.resample and opts.resample != rate:
            wave, rate = audio.resample(wave, rate, opts.resample), opts.resample
        if opts.audio_format != "keep":
            out_ext = opts.audio_format
        else:
            out_ext = orig if orig in ("wav", "flac") else "wav"
        out = audio.encode(wave, rate, out_ext)
        n = int(wave.shape[0])
    if n <= 0 or rate <= 0:
        raise DataError(f"{source} holds no samples")
    return out_ext, out, {"duration": n / rate, "sample_rate": rate, "num_samples": n,
                          "source_len": audio.frames_10ms(n, rate)}


def _record_bytes(record: dict, opts: PackOptions) -> bytes:
    """The stored audio of a record: held in it (a parquet row read by the input), a parquet row read here (a
    row group at a time, :func:`corpus_io.tables.parquet.read_audio`), or the file, URL or command it names."""
    source = str(record["source"])
    if INLINE in record:
        return record[INLINE]
    if parquet.is_locator(source):
        return parquet.read_audio(source, {k: v for k, v in opts.storage_options.items() if k != "pipe_timeout"})
    return _source_bytes(source, opts.allow_pipe, opts.storage_options_json)


@functools.lru_cache(maxsize=1)
def _source_bytes(source: str, allow_pipe: bool, storage_options_json: str) -> bytes:
    """A source's bytes, kept for the next call: the segments of one recording arrive one after another,
    and reading a 1-hour recording once per 1-second segment made packing O(segments x recording).
    Holds one source (at most audio.MAX_SOURCE_BYTES) per worker; cleared at the start of each shard."""
    return audio.read_source_bytes(source, allow_pipe=allow_pipe, storage_options=json.loads(storage_options_json))


def _feats_member(record: dict) -> tuple[bytes, dict[str, Any]]:
    mat = np.asarray(kaldi.read_feats(str(record["source"])))
    if mat.ndim != 2:
        raise DataError(f"features '{record['source']}' are not a matrix (shape {mat.shape})")
    buf = io.BytesIO()
    np.save(buf, mat, allow_pickle=False)
    frames = int(mat.shape[0])
    return buf.getvalue(), {"duration": frames / 100.0, "num_frames": frames, "feat_dim": int(mat.shape[1]),
                            "source_len": frames}


def pack_shard(task: ShardTask) -> ShardStat:
    """Write one shard (or reuse it if complete and identical); runs in a worker process."""
    digest = task_digest(task)
    done = _resume(task, digest)
    if done is not None:
        return done
    opts = task.options
    _source_bytes.cache_clear()  # reuse a recording within this shard only: files may change between runs
    skipped: Counter = Counter()
    durations: list[float] = []
    keys: list[str] = []
    seen: dict[str, str] = {}
    with ShardWriter(task.path, compress=opts.compression == "gzip") as writer:
        for record in task.records:
            key = record["key"]
            try:
                stem = fmt.safe_member_name(key)
                txt = _text_of(record).encode("utf-8")
                if opts.feats:
                    npy, first = _feats_member(record)
                else:
                    ext, data, first = audio_members(record, opts)
            except DataError as exc:
                if opts.on_error == "fail":
                    raise DataError(f"{record.get('where', '?')}: key '{key}': {str(exc).rstrip('.')}. Fix the "
                                    f"input, or pass ++on_error=skip to drop such utterances (they are "
                                    f"counted).") from None
                reason = "missing transcript" if "transcript" in str(exc) else "unreadable audio"
                skipped[reason] += 1
                continue
            if stem in seen:  # unreachable with an injective mapping unless a key repeats
                raise DataError(f"keys '{seen[stem]}' and '{key}' map to the same member name '{stem}' in "
                                f"{task.path}; keys must be unique.")
            seen[stem] = key
            meta = json.dumps(_meta(record, first), ensure_ascii=False, sort_keys=False).encode("utf-8")
            writer.add(f"{stem}.txt", txt)
            if opts.feats:
                writer.add(f"{stem}.json", meta)
                writer.add(f"{stem}.npy", npy)
            else:
                writer.add(f"{stem}.{ext}", data)
                writer.add(f"{stem}.json", meta)
            durations.append(first["duration"])
            keys.append(key)
    stat = ShardStat(task.path, len(durations), float(sum(durations)), min(durations, default=0.0),
                     max(durations, default=0.0), writer.bytes, writer.sha256, digest, dict(skipped), keys=keys,
                     durations=[round(d, 2) for d in durations])
    stored = {k: v for k, v in stat.__dict__.items() if k != "resumed"}
    if task.url:  # one whole object; the local copy goes, its sidecar (the state) stays
        objects.put_object(task.path, task.url, opts.storage_options, sha256=stat.sha256, digest=digest)
        os.unlink(task.path)
        stat.path = task.url
    write_sidecar(task.path, dict(stored, path=Path(task.path).name))  # relative: the dir may move
    return stat




def source_len(record: dict, opts: PackOptions) -> int:
    """Length in 10 ms frames, from the record or a header probe (for filter_group)."""
    if "source_len" in record:
        return int(record["source_len"])
    if opts.feats:
        return int(np.asarray(kaldi.read_feats(str(record["source"]))).shape[0])
    if INLINE in record or parquet.is_locator(str(record["source"])):
        info = audio.probe_bytes(_record_bytes(record, opts), str(record["source"]))
        return audio.frames_10ms(info.num_samples, info.sample_rate)
    info = _probe_cached(str(record["source"]), opts.allow_pipe, opts.storage_options_json)
    num_samples = info.num_samples
    if "start" in record:  # a segment: counted exactly as the packed shard's meta will count it
        first, last = audio.segment_samples(float(record["start"]), float(record["end"]), info.sample_rate,
                                            info.num_samples)
        num_samples = max(0, last - first)
    return audio.frames_10ms(num_samples, info.sample_rate)


@functools.lru_cache(maxsize=64)
def _probe_cached(source: str, allow_pipe: bool, storage_options_json: str) -> audio.AudioInfo:
    """Header probe; cached because the segments of one recording arrive one after another."""
    return audio.probe(source, allow_pipe=allow_pipe, storage_options=json.loads(storage_options_json))

