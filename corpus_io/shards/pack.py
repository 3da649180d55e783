"""``pack-shards``: any input of :mod:`corpus_io.tables.inputs` (FunASR, WeNet, Kaldi, NeMo, Lhotse) -> tar shards.

Design (memory is bounded, independent of corpus size):

* The main process makes one cheap pass over the input (the *driver* file: the jsonl, or
  ``wav.scp`` / ``segments`` / ``feats.scp`` of a Kaldi dir) to record each line's byte offset,
  line number and a 64-bit key hash (24 bytes per utterance). That gives the total, catches
  duplicate keys before anything is written, and lets ``shuffle=true`` permute an int64 array
  of offsets instead of the records.
* It then streams the records in (shuffled) order and hands out whole shards,
  ``(shard index, its records)``, to worker processes through the bounded
  :func:`corpus_io.storage.progress.parallel_imap` (at most ``4 * num_workers`` shards in flight).
* A worker writes its shard to a temp name (hashing while writing), renames it, then writes
  a small hidden sidecar ``.<shard>.json`` with its stats and a digest of its inputs.
* On a rerun, a shard whose sidecar digest matches and whose size and sha256 match is kept
  as is; anything else is rewritten. ``data.list`` and ``index.jsonl`` are written atomically
  at the very end from the sidecars, so no list line ever names a partial shard, and the
  output after ``kill -9`` + rerun is byte-identical to an uninterrupted run.
* ``output_dir=s3://bucket/prefix`` (:mod:`corpus_io.storage.objects`): each shard is made complete locally,
  sent as one object (with its sha256 and digest as metadata) and deleted locally; the sidecars stay
  in the local state dir, a rerun keeps the objects whose size and metadata match, and the list and
  index (naming the s3:// URLs) are sent last. Nothing else is written to the bucket.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from corpus_io.audio import io as audio
from corpus_io.config import check_values
from corpus_io.errors import ConfigError, DataError
from corpus_io.jobs.parts import (
    Job,
    Part,
    Place,
    RecordProblem,
    bad,
    begin,
    files_digest,
    fingerprint,
    inner_path,
    job_of,
    merged_summary,
    of_type,
    output_entry,
    seal_output,
    sealed,
    sha256_hex,
    summary_data,
    whole,
    write_part,
)
from corpus_io.keys import ExcludedKeys
from corpus_io.shards import format as fmt
from corpus_io.shards.index import index_entry_problems, index_path_for, read_index_file, write_list_and_index
from corpus_io.shards.writer import ShardWriter
from corpus_io.storage import objects
from corpus_io.storage.files import (
    atomic_write,
    completed_output,
    ensure_dir,
    file_sha256,
    inputs_digest,
    is_object_url,
    refuse_overwriting_inputs,
    remove_temp_files,
    sidecar_path,
    state_dir,
    write_sidecar,
)
from corpus_io.storage.progress import Summary, parallel_imap, progress, resolve_num_workers
from corpus_io.tables import kaldi, parquet
from corpus_io.tables.inputs import Input, Skip, open_input
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


def _digest(task: ShardTask) -> str:
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


def _audio_members(record: dict, opts: PackOptions) -> tuple[str, bytes, dict[str, Any]]:
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
    digest = _digest(task)
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
                    ext, data, first = _audio_members(record, opts)
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


# --------------------------------------------------------------------------- driver


def parse_filter_group(specs: list[str]) -> list[tuple[int, int]]:
    groups = []
    for spec in specs:
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(spec))
        if not m or int(m.group(1)) >= int(m.group(2)):
            raise ConfigError(f"filter_group entry '{spec}' must be 'lo:hi' in 10 ms frames with lo < hi, e.g. "
                              f"++filter_group='[\"10:500\",\"500:1000\"]'.")
        groups.append((int(m.group(1)), int(m.group(2))))
    return groups


def _source_len(record: dict, opts: PackOptions) -> int:
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


def _clean_temp_files(out_dir: Path, prefix: str) -> None:
    """Remove the temp files of shards and sidecars (``.<prefix>-NNNNNN.tar.json``) a killed run left."""
    shard_or_sidecar = re.compile(rf"\.?{fmt.shard_stem_pattern(prefix)}\.tar(\.gz)?(\.json)?")
    remove_temp_files(out_dir, shard_or_sidecar.fullmatch)


def _pack_dir(inp: Input, out_dir: Path, cfg: Any, opts: PackOptions, total: int,
              keep: Callable[[dict], bool] | None, summary: Summary, desc: str,
              wanted: range | None = None, url: str = "", excluded: ExcludedKeys | None = None) -> list[ShardStat]:
    """Pack one directory's shards; ``wanted``: a job's shard numbers (only those are written, and no list);
    ``url``: an object-storage prefix (``out_dir`` is then its local state dir); ``excluded``: the keys of
    ``++exclude_keys``, left out and counted."""
    ensure_dir(out_dir, what="output_dir")
    _refuse_other_prefix(out_dir, cfg.shard_prefix)
    if wanted is None:
        _clean_temp_files(out_dir, cfg.shard_prefix)
        previous_index = _withdraw_list(out_dir / "data.list")
    else:  # another job may be writing its own shards here: only this job's temp files are removed
        names = {fmt.shard_name(cfg.shard_prefix, k, opts.compression) for k in wanted}
        remove_temp_files(out_dir, lambda final: final.lstrip(".").removesuffix(".json") in names)
    per_shard = cfg.num_utts_per_shard

    def task(index: int, batch: list[dict]) -> ShardTask:
        name = fmt.shard_name(cfg.shard_prefix, index, opts.compression)
        t = ShardTask(index, str(out_dir / name), batch, opts, objects.join(url, name) if url else "")
        if wanted is not None:
            _refuse_other_run(t)
        return t

    # a job over a jsonl (every line one record, no filter) starts reading at its first shard's first line
    index = wanted.start if wanted is not None and keep is None and excluded is None and not inp.may_skip else 0

    def tasks() -> Iterator[ShardTask]:
        nonlocal index
        batch: list[dict] = []
        for rec in inp.records(cfg.shuffle, cfg.seed, index * per_shard):
            if isinstance(rec, Skip):
                if cfg.on_error == "fail":
                    raise DataError(f"{rec.where}: {rec.what} ({inp.describe}). Fix the "
                                    f"input, or pass ++on_error=skip to drop such utterances (they are counted).")
                if wanted is None or index in wanted:
                    summary.skip(rec.reason)
                continue
            if keep is not None and not keep(rec):
                continue
            if excluded is not None and excluded.excludes(rec["key"]):
                if wanted is None or index in wanted:
                    summary.skip(excluded.reason)
                continue
            if wanted is not None and index >= wanted.stop:
                return  # a job: the rest of the input is other jobs' shards
            if wanted is None or index in wanted:
                batch.append(rec)
            else:
                batch.append(None)  # type: ignore[arg-type]  # counted, not kept: another job's shard
            if len(batch) == per_shard:
                if wanted is None or index in wanted:
                    yield task(index, batch)
                batch, index = [], index + 1
        if batch and (wanted is None or index in wanted):
            yield task(index, batch)

    workers = resolve_num_workers(cfg.num_workers)
    stats: list[ShardStat] = []
    num_shards = -(-total // per_shard) if keep is None else None
    if wanted is not None:
        num_shards, workers = len(wanted), max(1, min(workers, len(wanted)))
    results = parallel_imap(pack_shard, tasks(), num_workers=workers, chunksize=1)
    for stat in progress(results, total=num_shards, desc=desc, unit="shard"):
        stats.append(stat)
        summary.kept += stat.num_utts
        summary.seconds += stat.duration
        summary.bytes += stat.bytes
        for reason, n in stat.skipped.items():
            summary.skip(reason, n)
    if wanted is not None:
        return stats
    listed = [s for s in stats if s.num_utts > 0]
    _write_list(out_dir, cfg.shard_prefix, previous_index, [s.index_entry() for s in listed], summary,
                url=url, storage_options=opts.storage_options)
    return stats


def _write_list(out_dir: Path, prefix: str, previous_index: Path, entries: Iterable[dict], summary: Summary,
                repeated_keys: int | None = None, url: str = "", storage_options: dict | None = None) -> None:
    """The end of a one-job run (or of merge-jobs): data.list + index.jsonl (sent to ``url`` when the output is
    on object storage), then stale shards removed."""
    names: set[str] = set()

    def named() -> Iterator[dict]:
        for entry in _keep_companion_fields(previous_index, entries):
            names.add(Path(entry["path"]).name)
            yield entry

    write_list_and_index(out_dir / "data.list", named(), repeated_keys=repeated_keys)
    if url:
        _publish_list(out_dir / "data.list", url, storage_options or {})
    previous_index.unlink(missing_ok=True)
    removed = _remove_stale_shards(out_dir, prefix, names)
    if removed:
        summary.extra["stale shards removed"] = summary.extra.get("stale shards removed", 0) + removed


def _refuse_other_run(task: ShardTask) -> None:
    """A job does not overwrite a complete shard that another run (other options or input) wrote."""
    try:
        stored = json.loads(sidecar_path(task.path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no complete shard there (or an unfinished one): this job writes it
    if isinstance(stored, dict) and stored.get("digest") not in (None, _digest(task)):
        raise DataError(f"{task.path} was written by another run (other options or another input) and is not "
                        f"this job's shard {task.index}; a job never overwrites it. Use another output_dir, or "
                        f"delete that run's shards (or run it with ++num_jobs=1, which replaces them).")


def _refuse_other_prefix(out_dir: Path, prefix: str) -> None:
    """Two runs with different shard_prefix in one output_dir would leave one run's shards orphaned."""
    listed = out_dir / "data.list"
    mine = re.compile(rf"{fmt.shard_stem_pattern(prefix)}(\..+)?")
    others = []
    if listed.is_file():
        others = [e for e in read_index_file(index_path_for(listed)) or {} if not mine.fullmatch(Path(e).name)]
    if not others:
        others = [e.name for e in os.scandir(out_dir) if e.is_file() and e.name.endswith((".tar", ".tar.gz", ".tgz"))
                  and not mine.fullmatch(e.name)]
    if others:
        raise DataError(f"output_dir {out_dir} holds shards of another run ({Path(others[0]).name}: not "
                        f"'{prefix}-NNNNNN'). Nothing was written. Use another output_dir, or delete that run's "
                        f"shards, data.list and index.jsonl first.")


def _publish_list(list_path: Path, url: str, storage_options: dict) -> None:
    """Send a written list's index, then the list (so a list never lacks its index), to object storage."""
    for path in (index_path_for(list_path), list_path):
        objects.put_object(path, objects.join(url, path.name), storage_options, sha256=file_sha256(path))


def _remove_stale_shards(out_dir: Path, prefix: str, current: set[str]) -> int:
    """Delete shards (with their sidecars and add-field companions) of an earlier run that this run's
    list no longer names, e.g. after a rerun with a larger num_utts_per_shard; a directory glob would
    otherwise read them twice. Runs after the new list is in place. Returns the number of shards."""
    pattern = re.compile(rf"\.?({fmt.shard_stem_pattern(prefix)})\..+")
    current_stems = {fmt.shard_stem(name) for name in current}
    removed = 0
    for entry in os.scandir(out_dir):
        match = pattern.fullmatch(entry.name)
        if not match or not entry.is_file():
            continue
        stem = match.group(1)
        name = entry.name.lstrip(".").removesuffix(".json")  # a shard's hidden sidecar goes with the shard
        is_shard = fmt.shard_stem(name) == stem  # stem + .tar / .tar.gz / .tgz
        # stale: nothing of this run has the stem, or a shard of this stem with another suffix (compression
        # switched between runs), which a directory glob would otherwise read next to the new one
        if stem not in current_stems or (is_shard and name not in current):
            os.unlink(entry.path)
            removed += is_shard and not entry.name.startswith(".")
    return removed


def _withdraw_list(list_path: Path) -> Path:
    """Take a previous run's list out of the way before any shard is rewritten, so a run that fails
    halfway leaves no list naming shards that no longer match it. Its index moves to a hidden name,
    which the end of the run reads (add-field's entries) and then deletes. Returns that name."""
    index = index_path_for(list_path)
    kept = index.with_name(f".{index.name}.previous")
    if index.is_file() and not kept.is_file():  # a kept one is from a run that failed: it is the older truth
        os.replace(index, kept)
    index.unlink(missing_ok=True)
    list_path.unlink(missing_ok=True)
    return kept


def _keep_companion_fields(previous_index: Path, entries: Iterable[dict]) -> Iterator[dict]:
    """Carry add-field's ``fields`` over from the old index for shards whose bytes did not change."""
    old = read_index_file(previous_index) or {}  # only its add-field entries are carried over
    for entry in entries:
        previous = old.get(entry["path"])
        if previous and previous.get("sha256") == entry.get("sha256") and "fields" in previous:
            entry["fields"] = previous["fields"]
        yield entry


def _fingerprint(cfg: Any, opts: PackOptions, inp: Input) -> str:
    excluded = [files_digest([cfg.exclude_keys])] if cfg.exclude_keys else []  # other keys left out: other shards
    return fingerprint(["pack-shards", opts.digest_part(), opts.on_error, cfg.num_utts_per_shard, bool(cfg.shuffle),
                        cfg.seed, list(cfg.filter_group), cfg.shard_prefix, files_digest(inp.files), *excluded])


def _group_dirs(out_dir: Path, groups: list[tuple[int, int]]) -> list[str]:
    return [f"{lo}_{hi}" for lo, hi in groups] or [""]


def _plan(inp: Input, cfg: Any, total: int, keeps: list[Callable[[dict], bool] | None],
          excluded: ExcludedKeys | None = None) -> list[int]:
    """The number of shards of each group, as a one-job run makes them (a job needs the global numbering):
    from the line count when every line is one record, else from a counting pass over the input."""
    per = cfg.num_utts_per_shard
    if keeps == [None] and not inp.may_skip and excluded is None:
        return [-(-total // per)]
    counts = [0] * len(keeps)
    for rec in inp.records(cfg.shuffle, cfg.seed):
        if isinstance(rec, Skip):
            if cfg.on_error == "fail":
                raise DataError(f"{rec.where}: {rec.what} ({inp.describe}). Fix the data dir, or "
                                f"pass ++on_error=skip to drop such utterances (they are counted).")
            continue
        if excluded is not None and rec["key"] in excluded.keys:
            continue
        for g, keep in enumerate(keeps):
            if keep is None or keep(rec):
                counts[g] += 1
    return [-(-n // per) for n in counts]


def pack_shards(cfg: Any) -> Summary:
    """Run pack-shards for a validated :class:`corpus_io.config.PackShardsConfig`; returns the summary.

    With ``++num_jobs=N`` (N > 1) this is one job (corpus_io.jobs.parts): it writes the shards of its contiguous
    range of global shard numbers and a part record, no data.list; ``merge-jobs ++path=<output_dir>``
    writes the list and index a one-job run writes."""
    check_values(cfg)  # num_utts_per_shard, resample, ...: their ranges, also for configs built in Python
    refuse_overwriting_inputs([(f"++output_dir's {name}", os.path.join(str(cfg.output_dir), name))
                               for name in ("data.list", "index.jsonl")],
                              [("++input", cfg.input), ("++exclude_keys", cfg.exclude_keys)])
    excluded = ExcludedKeys(cfg.exclude_keys) if cfg.exclude_keys else None
    job = job_of(cfg)
    feats = bool(getattr(cfg, "feats", False))
    if feats and (cfg.audio_format != "keep" or cfg.resample):
        raise ConfigError("++feats=true stores feature matrices; audio_format/resample do not apply.")
    opts = PackOptions(cfg.audio_format, cfg.resample, feats, cfg.on_error, cfg.allow_pipe,
                       {**(cfg.storage_options or {}), "pipe_timeout": float(cfg.pipe_timeout)}, cfg.compression)
    # a parquet row's audio is read by the worker that writes it (the tasks in flight hold no audio)
    inp = open_input(cfg.input, feats=feats, columns=dict(cfg.columns or {}), storage_options=cfg.storage_options,
                     inline=False)
    total = inp.scan(check_keys=job.single or inp.may_skip)
    if total == 0:
        raise DataError(f"{inp.describe} holds no utterances, so there is nothing to pack (nothing was written). "
                        f"Check ++input (an earlier step may have written it empty).")
    url = str(cfg.output_dir) if is_object_url(cfg.output_dir) else ""
    out_dir = state_dir(url) if url else ensure_dir(cfg.output_dir, what="output_dir").resolve()
    summary = Summary()
    groups = parse_filter_group(list(cfg.filter_group))
    keeps: list[Callable[[dict], bool] | None] = [None]
    if groups:
        keeps = []
        for lo, hi in groups:
            def keep(rec: dict, lo: int = lo, hi: int = hi) -> bool:
                try:
                    return lo <= _source_len(rec, opts) < hi
                except DataError:
                    return True  # the worker reports (or skips) unreadable audio
            keeps.append(keep)
    dirs = _group_dirs(out_dir, groups)
    place = Place(str(out_dir), "pack-shards", True)
    if not job.single or place.records():
        fp = _fingerprint(cfg, opts, inp)
        done = begin(place, job, fp)
        if done is not None and url and _absent_object(url, [done], opts.storage_options):
            done = None  # an object went missing since: the job runs again and sends only what is not there
        if done is not None:
            if url:  # a record written just before a kill may never have reached the bucket
                _publish_record(place.record(job), url, opts.storage_options)
            summary = merged_summary([done])
            summary.print(f"pack-shards {job} (already complete)")
            return summary
    if not job.single:
        return _pack_job(inp, out_dir, cfg, opts, total, keeps, dirs, job, place, fp, url, excluded)
    all_stats: list[ShardStat] = []
    for keep, sub in zip(keeps, dirs):
        desc = "pack-shards" + (f" {sub.replace('_', ':')}" if sub else "")
        all_stats += _pack_dir(inp, out_dir / sub, cfg, opts, total, keep, summary, desc,
                               url=objects.join(url, sub) if url else "", excluded=excluded)
    if groups:
        grouped = summary.kept + sum(summary.skipped.values())
        if grouped < total:
            summary.skip("outside filter_group", total - grouped)
    summary.what = "utterances"
    summary.extra["shards"] = sum(1 for s in all_stats if s.num_utts)
    summary.extra["resumed"] = sum(1 for s in all_stats if s.resumed)
    summary.print("pack-shards")
    if excluded is not None:
        print(excluded.report("pack-shards"), file=sys.stderr, flush=True)
    summary.raise_if_empty("pack-shards", f"No shard was listed in {out_dir}: check {cfg.input} (an earlier step "
                                          f"may have written it empty) and the skip reasons above (audio paths, "
                                          f"transcripts, filter_group).")
    return summary


def _pack_job(inp: Input, out_dir: Path, cfg: Any, opts: PackOptions, total: int,
              keeps: list[Callable[[dict], bool] | None], dirs: list[str], job: Job, place: Place,
              fp: str, url: str = "", excluded: ExcludedKeys | None = None) -> Summary:
    """One job of N: the shards of its range of global shard numbers (over the groups in order), a record.
    With ``url`` (object storage) the record's outputs are the shards' local sidecars (the objects' size and
    sha256), and its entries name the shards relative to ``url``."""
    counts = _plan(inp, cfg, total, keeps, excluded)
    lo, hi = job.span(sum(counts))
    summary = Summary()
    groups: list[dict] = []
    outputs: list[dict] = []
    first = 0
    for keep, sub, count in zip(keeps, dirs, counts):
        wanted = range(max(lo - first, 0), max(min(hi - first, count), 0))
        first += count
        entries: list[dict] = []
        if len(wanted):
            stats = _pack_dir(inp, out_dir / sub, cfg, opts, total, keep, summary, f"pack-shards {job}", wanted,
                              url=objects.join(url, sub) if url else "", excluded=excluded)
            for stat in stats:
                if stat.num_utts > 0:
                    local = out_dir / sub / Path(stat.path).name
                    entry = dict(stat.index_entry(), path=os.path.relpath(local, out_dir))
                    entries.append(entry)
                    outputs.append(output_entry(sidecar_path(local), out_dir) if url else  # sealed: merge-jobs stats
                                   seal_output(output_entry(stat.path, out_dir, sha256=stat.sha256, size=stat.bytes),
                                               stat.path, entry))
        groups.append({"dir": sub, "entries": entries})
    summary.what = "utterances"
    summary.extra["shards"] = len(outputs)
    data = {"prefix": cfg.shard_prefix, "groups": groups, "summary": summary_data(summary), "url": url}
    record = write_part(place, Part("pack-shards", place.tag, job.count, job.index, fp, [lo, hi], sum(counts),
                                    outputs, data))
    if url:
        _publish_record(record, url, opts.storage_options)
    summary.print(f"pack-shards {job}")
    if excluded is not None:  # a job reads only its part of the input: the keys it did not meet may be others'
        print(excluded.report(f"pack-shards {job}", whole_input=False), file=sys.stderr, flush=True)
    print(f"pack-shards {job}: shards {lo}..{hi - 1} of {sum(counts)} -> {record}", flush=True)
    return summary


def _publish_record(record: Path, url: str, storage_options: dict) -> None:
    """A job's part record, sent beside its shards (after them), unless the bucket holds it already."""
    sha256 = file_sha256(record)
    target = objects.join(url, record.name)
    if not objects.object_matches(target, storage_options, size=record.stat().st_size, sha256=sha256):
        objects.put_object(record, target, storage_options, sha256=sha256)


def fetch_part_records(url: str, storage_options: dict | None = None) -> None:
    """merge-jobs of an ``s3://`` output: the part records the jobs sent to the bucket, written into this
    machine's state dir (a job's own copy stays where it ran: jobs on machines that share no disk)."""
    place = Place(str(state_dir(url)), "pack-shards", True)
    for obj in sorted(objects.object_sizes(url, storage_options)):
        name = obj.rsplit("/", 1)[1]
        if obj != objects.join(url, name) or not place.is_record(name):  # this prefix's records only
            continue
        data = objects.get_object(obj, storage_options)
        target = place.directory / name
        if not target.is_file() or target.read_bytes() != data:
            with atomic_write(target, "wb") as f:
                f.write(data)


def _absent_object(url: str, parts: list[Part], storage_options: dict | None = None) -> tuple[Part, str] | None:
    """Object storage: the first part with a shard that is not an object of the size its record says, and why
    (one listing of ``url``); the local sidecars that a part records do not prove the objects are there."""
    sizes = objects.object_sizes(url, storage_options)
    for part in parts:
        for group in part.payload()["groups"]:
            for entry in group["entries"]:
                name = objects.join(url, entry["path"])
                if sizes.get(name) != entry["bytes"]:
                    now = "is absent" if name not in sizes else f"has {sizes[name]} bytes, not {entry['bytes']}"
                    return part, f"its shard {name} {now}"
    return None


def _refuse_absent_objects(url: str, parts: list[Part], storage_options: dict) -> None:
    """merge-jobs into object storage: every shard is checked before anything is written."""
    absent = _absent_object(url, parts, storage_options)
    if absent:
        part, why = absent
        raise DataError(f"part {part.where}: {why}. Nothing was changed. Rerun job {part.job_index} "
                        f"(++num_jobs={part.num_jobs} ++job_index={part.job_index}), which sends it again, then "
                        f"merge.")


def part_keys(data: dict) -> Iterator[str]:
    """The utterance keys of a pack-shards part (merge-jobs refuses a key two parts hold)."""
    return itertools.chain.from_iterable(e.get("keys") or () for group in data["groups"] for e in group["entries"])


def check_part(part: Part) -> dict:
    """merge-jobs: the pack-shards fields of a record, before any is trusted
    (:class:`corpus_io.jobs.parts.RecordProblem`
    on the first that cannot be): each group's directory and shard entries (paths inside the output, the values
    :func:`corpus_io.shards.index.index_entry_problems` checks, the size and sha256 its outputs record), and counts
    that agree (utterances with the summary, shards with the outputs and the span). Returns what merge_parts needs
    of the record without reading it again: its groups' dirs, and whether every shard is as its job sealed it
    (:func:`corpus_io.jobs.parts.sealed`: one ``stat()`` each)."""
    data = part.data
    of_type(data.get("prefix"), "data.prefix", str, "a string")
    url = of_type(data.get("url", ""), "data.url", str, "a string")
    shards = utts = 0
    for g, group in enumerate(of_type(data.get("groups"), "data.groups", list, "a list")):
        name = f"data.groups[{g}]"
        inner_path(of_type(group, name, dict, "a JSON object").get("dir"), f"{name}.dir", empty=True)
        for e, entry in enumerate(of_type(group.get("entries"), f"{name}.entries", list, "a list")):
            where = f"{name}.entries[{e}]"
            inner_path(of_type(entry, where, dict, "a JSON object").get("path"), f"{where}.path")
            whole(entry.get("num_utts"), f"{where}.num_utts", 1)
            whole(entry.get("bytes"), f"{where}.bytes")
            sha256_hex(entry.get("sha256"), f"{where}.sha256")
            problems = index_entry_problems(entry)
            if problems:
                raise RecordProblem(f"{where}.{problems[0]}")
            out = part.outputs[shards] if shards < len(part.outputs) else None
            if not url and out is not None and [out["file"], out["bytes"], out["sha256"]] != \
                    [entry["path"], entry["bytes"], entry["sha256"]]:  # object storage: outputs are sidecars
                raise bad(where, {k: entry[k] for k in ("path", "bytes", "sha256")},
                          f"but outputs[{shards}] records {out}")
            shards += 1
            utts += entry["num_utts"]
    if shards != len(part.outputs):
        raise bad("outputs", f"{len(part.outputs)} files", f"but data.groups lists {shards} shards")
    lo, hi = part.span
    if shards > hi - lo:
        raise bad("data.groups", f"{shards} shards", f"but the job's span {part.span} holds {hi - lo}")
    kept = data.get("summary", {}).get("kept", 0)
    if kept != utts:
        raise bad("data.summary.kept", kept, f"but the shard entries hold {utts} utterances")
    base = Path(part.where).parent  # merge_parts: the groups, and whether every shard is as its job sealed it
    entries = (e for group in data["groups"] for e in group["entries"])
    return {"checked": {"dirs": [group["dir"] for group in data["groups"]],
                        "sealed": not url and all(sealed(out, base / e["path"], e) for out, e in zip(part.outputs,
                                                                                                    entries))}}


def _shard_holds(path: Path) -> tuple[list[str], list[float]]:
    """The keys and durations (seconds) a packed shard holds: its tar headers and ``.json`` members (audio payloads
    seeked over, never read)."""
    from corpus_io.shards.fields import iter_main_without_audio

    keys, durations = [], []
    for sample in iter_main_without_audio(str(path)):
        keys.append(sample["key"])
        durations.append(float(sample["meta"].get("duration", 0.0)))
    return keys, durations


def _entry_disagrees(entry: dict, keys: list[str], durations: list[float], where: str) -> str | None:
    """What the shard entry of a part record says that the shard itself (``keys``, ``durations``) does not."""
    if entry["num_utts"] != len(keys):
        return f"{where}.num_utts is {entry['num_utts']}, but shard {entry['path']} holds {len(keys)} utterances"
    recorded = entry.get("keys")
    if recorded is not None and recorded != keys:
        i = next(i for i, (a, b) in enumerate(zip(recorded, keys)) if a != b)
        return (f"{where}.keys[{i}] is {recorded[i]!r}, but utterance {i + 1} of shard {entry['path']} is "
                f"{keys[i]!r}")
    listed = entry.get("durations")
    if listed is not None:
        wrong = next((i for i, (a, b) in enumerate(zip(listed, durations)) if abs(float(a) - round(b, 2)) > 0.006),
                     None if len(listed) == len(durations) else min(len(listed), len(durations)))
        if wrong is not None:
            return (f"{where}.durations[{wrong}] does not match utterance {wrong + 1} of shard {entry['path']} "
                    f"({len(listed)} durations listed, {len(durations)} utterances)")
    held = {"duration": sum(durations), "min_duration": min(durations, default=0.0),
            "max_duration": max(durations, default=0.0)}
    for name, value in held.items():
        if name in entry and abs(float(entry[name]) - round(value, 3)) > 1e-3:
            return (f"{where}.{name} is {entry[name]}, but the utterances of shard {entry['path']} give "
                    f"{round(value, 3)} s")
    return None


def _refuse_records_the_shards_deny(out_dir: Path, part: Part, payload: dict, level: str = "stat") -> None:
    """merge-jobs, before anything is written: each shard entry's count, keys and durations against the shard it
    names (its tar headers and ``.json`` members), so a record with a false duration or an invented key is refused
    as a changed record is. At ``++check=stat`` (the default) a shard whose record entry its job sealed
    (:func:`corpus_io.jobs.parts.sealed`: the entry unedited, the shard of the size and mtime the job saw) is trusted
    with one ``stat()``, unread; the headers of the others (records of older versions, edited records, shards
    touched or copied since) are read. ``headers``/``sha256`` read every shard. Object storage: the shards are
    objects, checked by size (the record is the job's)."""
    i = 0
    for g, group in enumerate(payload["groups"]):
        for e, entry in enumerate(group["entries"]):
            out = part.outputs[i] if i < len(part.outputs) else {}
            i += 1
            if level == "stat" and sealed(out, out_dir / entry["path"], entry):
                continue
            keys, durations = _shard_holds(out_dir / entry["path"])
            problem = _entry_disagrees(entry, keys, durations, f"data.groups[{g}].entries[{e}]")
            if problem:
                raise DataError(f"part record {part.where}: {problem}. The record was changed after its job "
                                f"wrote it, or is damaged, so nothing in it is trusted and nothing was changed. "
                                f"Delete it and rerun job {part.job_index} (++num_jobs={part.num_jobs} "
                                f"++job_index={part.job_index}), then merge.")


def merge_parts(place: Place, parts: list[Part]) -> Summary:
    """``merge-jobs`` of pack-shards: each directory's data.list + index.jsonl, as one job writes them (streamed:
    one part's entries in memory at a time; each record read once to check it against its shards, once to write)."""
    out_dir = Path(place.path).resolve()
    first = parts[0].payload()
    dirs = [group["dir"] for group in first["groups"]]
    for part in parts:  # before the old lists are withdrawn: every part has the same groups, its shards agree
        checked = (part.data or {}).get("checked") or {}
        payload = None if "dirs" in checked else part.payload()
        theirs = checked["dirs"] if payload is None else [group["dir"] for group in payload["groups"]]
        if theirs != dirs:
            raise DataError(f"part record {part.where}: data.groups are {theirs}, but {parts[0].where} has {dirs}: "
                            f"the record was changed after its job wrote it. Nothing was changed. Delete it and "
                            f"rerun job {part.job_index}, then merge.")
        if not first.get("url") and not (place.check == "stat" and checked.get("sealed")):
            _refuse_records_the_shards_deny(out_dir, part, payload or part.payload(), place.check)
    options = place.storage_options or {}
    if first.get("url"):
        _refuse_absent_objects(first["url"], parts, options)
    summary = merged_summary(parts)
    for g, sub in enumerate(group["dir"] for group in first["groups"]):
        url = first.get("url") or ""  # object storage: entries name the objects, the list is sent there
        entries = (dict(e, path=objects.join(url, e["path"]) if url else str(out_dir / e["path"])) for part in parts
                   for e in part.payload()["groups"][g]["entries"])
        _write_list(out_dir / sub, first["prefix"], _withdraw_list(out_dir / sub / "data.list"), entries, summary,
                    repeated_keys=0,  # load_parts refused any key held twice
                    url=objects.join(url, sub) if url else "", storage_options=options)
    summary.extra["shards"] = sum(len(p.outputs) for p in parts)
    summary.print("pack-shards (merged)")
    return summary
