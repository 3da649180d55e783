"""``add-field``: write companion field files next to packed shards without rewriting them.

One worker process per shard (:func:`corpus_io.storage.progress.parallel_imap`; the feats.scp reader or jsonl
values reach the workers through its ``initializer``) writes ``shard-NNNNNN.<field>.tar`` (fbank/mfcc or
feats.scp matrices as ``.npy``) or ``.<field>.jsonl.gz``, plus the ``meta`` companion, with the crash-safe
output protocol of :mod:`corpus_io.storage.files` (hash while writing, sidecar, resume check); the index records
each shard's fields. The format and its readers are :mod:`corpus_io.shards.fields`.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corpus_io.errors import ConfigError, DataError
from corpus_io.jobs import parts as jobs
from corpus_io.shards.fields import (
    META,
    MISSING_EXT,
    check_field_name,
    companion_url,
    iter_json_objects,
    meta_url,
    open_shard_fields,
)
from corpus_io.shards.format import safe_member_name, shard_stem
from corpus_io.shards.index import write_index
from corpus_io.shards.kinds import iter_shard_metadata
from corpus_io.storage.files import (
    HashingWriter,
    atomic_write,
    completed_output,
    inputs_digest,
    remove_temp_files,
    sidecar_path,
    write_sidecar,
)
from corpus_io.storage.progress import WorkerState

# --------------------------------------------------------------------------- writing


def _finish_file(path: Path, writer: Any, digest: str, kind: str, num_utts: int, missing: int, extra: dict) -> dict:
    """Write the sidecar of a companion file ``writer`` (hashing while writing) has just completed."""
    stat = {"file": path.name, "kind": kind, "bytes": writer.bytes, "sha256": writer.sha256,
            "num_utts": num_utts, "missing": missing, **extra, "digest": digest}
    write_sidecar(path, stat)
    return stat


class _JsonlGzWriter:
    """Deterministic ``.jsonl.gz`` (gzip mtime 0, no file name) under a temp name, renamed on close."""

    def __init__(self, path: Path):
        self._ctx = atomic_write(path, "wb")
        self._raw = HashingWriter(self._ctx.__enter__())
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)

    def write(self, rec: dict) -> None:
        self._gz.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))

    @property
    def bytes(self) -> int:
        return self._raw.bytes

    @property
    def sha256(self) -> str:
        return self._raw.sha256

    def close(self) -> None:
        self._gz.close()
        self._ctx.__exit__(None, None, None)

    def abort(self, exc: BaseException) -> None:
        self._gz.close()
        with contextlib.suppress(BaseException):
            self._ctx.__exit__(type(exc), exc, exc.__traceback__)


@dataclass
class FieldTask:
    url: str
    field: str
    mode: str  # fbank | mfcc | scp | jsonl
    shard_digest: str
    options: dict
    on_error: str = "fail"
    storage_options: dict = field(default_factory=dict)


@dataclass
class FieldResult:
    url: str
    stats: dict
    num_utts: int = 0
    seconds: float = 0.0
    missing: int = 0
    resumed: int = 0
    reasons: dict = field(default_factory=dict)


# the sources of this worker (feats.scp reader, jsonl values), set by _use_sources: the parallel_imap
# initializer of add-field's workers (under fork they are shared copy-on-write; per thread when inline)
_SOURCES = WorkerState()


def _use_sources(sources: dict[str, Any]) -> None:
    _SOURCES.values = dict(sources)


def _npy_bytes(array: Any) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
    return buf.getvalue()


def _feature_fn(task: FieldTask) -> Any:
    """``sample -> np.ndarray``: decode, resample and fbank|mfcc with the loader's own functions
    (corpus_io.audio.io, corpus_io.audio.features), so the field equals what the loader would compute."""
    import numpy as np
    import torch

    from corpus_io.audio import features
    from corpus_io.audio import io as audio

    o = task.options

    def compute(sample: dict) -> Any:
        data = sample.get("audio")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DataError("has no audio bytes ('audio' is missing).")
        wave, rate = audio.decode_bytes(bytes(data), where=f"{sample.get('audio_format', 'audio')} member")
        wav = torch.from_numpy(np.ascontiguousarray(audio.to_mono(wave), dtype=np.float32)).unsqueeze(0)
        wav = audio.resample_wav(wav, rate, o["resample_rate"])
        rate = o["resample_rate"]
        if task.mode == "fbank":
            c = o["fbank_conf"]
            feats = features.fbank(wav, rate, num_mel_bins=c["num_mel_bins"], frame_length=c["frame_length"],
                                   frame_shift=c["frame_shift"], low_freq=c["low_freq"], high_freq=c["high_freq"],
                                   snip_edges=c.get("snip_edges", True))
        else:
            c = o["mfcc_conf"]
            feats = features.mfcc(wav, rate, num_mel_bins=c["num_mel_bins"], num_ceps=c["num_ceps"],
                                  frame_length=c["frame_length"], frame_shift=c["frame_shift"],
                                  high_freq=c["high_freq"], low_freq=c["low_freq"])
        if feats.shape[0] == 0:
            raise DataError("gives 0 feature frames (shorter than one window).")
        return feats.numpy()

    return compute


def add_field_to_shard(task: FieldTask) -> FieldResult:
    """Write the field file (and the meta companion when missing) of one shard; resumable."""
    from corpus_io.storage.urls import local_path

    kind = "tar" if task.mode in ("fbank", "mfcc", "scp") else "jsonl.gz"
    fpath = Path(local_path(companion_url(task.url, task.field, kind)))
    mpath = Path(local_path(meta_url(task.url)))
    fdigest = inputs_digest([task.shard_digest, task.field, task.mode, task.options])
    mdigest = inputs_digest([task.shard_digest, META])
    result = FieldResult(task.url, {})
    fstat, mstat = completed_output(fpath, fdigest), completed_output(mpath, mdigest)
    if fstat and mstat:
        result.stats = {task.field: fstat, META: mstat}
        result.num_utts, result.missing, result.resumed = fstat["num_utts"], fstat["missing"], 1
        result.seconds = float(mstat.get("seconds", 0.0))
        return result
    for stale in (fpath, mpath):  # a complete file from other inputs is replaced; temp files are ours
        if stale == fpath and fstat or stale == mpath and mstat:
            continue
        with contextlib.suppress(FileNotFoundError):
            sidecar_path(stale).unlink()
    compute = _feature_fn(task) if task.mode in ("fbank", "mfcc") else None
    threads = None
    if compute is not None:  # parallelism comes from the shard processes (as in the loader's workers)
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        return _write_shard_fields(task, result, kind, fpath, mpath, fstat, mstat, fdigest, mdigest, compute)
    finally:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)


def _write_shard_fields(task: FieldTask, result: FieldResult, kind: str, fpath: Path, mpath: Path,
                        fstat: dict | None, mstat: dict | None, fdigest: str, mdigest: str,
                        compute: Any) -> FieldResult:
    from corpus_io.shards.writer import ShardWriter

    if compute is not None:
        samples = open_shard_fields(task.url, ["audio"], storage_options=task.storage_options)
    else:
        samples = iter_shard_metadata(task.url, storage_options=task.storage_options)
    fwriter = None if fstat else (ShardWriter(fpath) if kind == "tar" else _JsonlGzWriter(fpath))
    mwriter = None if mstat else _JsonlGzWriter(mpath)
    reasons: dict[str, int] = {}
    try:
        for sample in samples:
            key = sample["key"]
            dur = _duration(sample.get("meta") or {})
            result.num_utts += 1
            result.seconds += dur
            if mwriter is not None:
                mwriter.write({"key": key, "txt": sample["txt"], "meta": sample.get("meta") or {}})
            if fwriter is None:
                continue
            value, why = _value(task, sample, compute)
            if why:
                reasons[why] = reasons.get(why, 0) + 1
                result.missing += 1
            if kind == "tar":
                name = safe_member_name(key)
                fwriter.add(f"{name}.{MISSING_EXT}" if value is None else f"{name}.npy",
                            b"" if value is None else value)
            else:
                fwriter.write({"key": key, task.field: value})
    except BaseException as exc:
        for w in (fwriter, mwriter):
            if w is not None:
                w.abort(exc) if isinstance(w, _JsonlGzWriter) else w.abort()
        raise
    for w in (fwriter, mwriter):
        if w is not None:
            w.close()
    if fstat is None:
        extra = {"conf": task.options} if task.mode in ("fbank", "mfcc") else {}
        fstat = _finish_file(fpath, fwriter, fdigest, kind, result.num_utts, result.missing, extra)
    if mstat is None:
        mstat = _finish_file(mpath, mwriter, mdigest, "jsonl.gz", result.num_utts, 0,
                             {"seconds": round(result.seconds, 3)})
    result.stats = {task.field: fstat, META: mstat}
    result.reasons = reasons
    return result


def _duration(meta: dict) -> float:
    for name, scale in (("duration", 1.0), ("source_len", 0.01), ("num_frames", 0.01)):
        value = meta.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) * scale
    return 0.0


def _value(task: FieldTask, sample: dict, compute: Any) -> tuple[Any, str]:
    """(value or None, reason it is missing or '')."""
    key = sample["key"]
    if compute is not None:
        try:
            return _npy_bytes(compute(sample)), ""
        except DataError as exc:
            if task.on_error == "skip":
                return None, "features failed"
            raise DataError(f"shard {task.url}, utterance '{key}': {exc} Fix or remove the utterance, or set "
                            f"++dataset_conf.on_error=skip to store a missing placeholder instead.") from None
    source = _SOURCES.values[task.mode]
    if task.mode == "scp":
        if key not in source:
            return None, "not in feats.scp"
        try:
            return _npy_bytes(source[key]), ""
        except Exception as exc:  # noqa: BLE001 - kaldiio raises many kinds
            scp = task.options["from_scp"][0]  # the signature [path, size, mtime]: name the path
            raise DataError(f"{scp}: cannot read the features of '{key}' ({type(exc).__name__}: {exc}). Check that "
                            f"line of the scp and the ark file it points into, then rerun add-field.") from None
    if key not in source:
        return None, "not in the jsonl"
    return source[key], ""


def _source_signature(path: str) -> list:
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def _load_jsonl_values(path: str, name: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    with open(path, "rb") as f:
        for lineno, rec in iter_json_objects(f, path, f'each line must be {{"key": ..., "{name}": ...}}.'):
            if not isinstance(rec.get("key"), str):
                raise DataError(f"{path}:{lineno}: needs a string 'key'.")
            if name not in rec:
                raise DataError(f"{path}:{lineno}: key '{rec['key']}' has no '{name}' value. Each line must be "
                                f'{{"key": ..., "{name}": ...}}; pass the matching ++field=.')
            if rec["key"] in values:
                raise DataError(f"{path}:{lineno}: key '{rec['key']}' appears twice; keys must be unique.")
            values[rec["key"]] = rec[name]
    return values


def add_field(cfg: Any) -> Any:
    """``corpus-io add-field`` for a validated :class:`corpus_io.config.AddFieldConfig`; returns the Summary."""
    from corpus_io.shards.index import index_path_for, load_index, read_datalist
    from corpus_io.storage.progress import Summary, parallel_imap, progress, resolve_num_workers
    from corpus_io.storage.urls import is_command, is_remote

    check_field_name(cfg.field)
    if cfg.from_scp and cfg.from_jsonl:
        raise ConfigError("pass one of ++from_scp and ++from_jsonl, not both.")
    dc = cfg.dataset_conf
    options: dict[str, Any]
    sources: dict[str, Any] = {}
    if cfg.from_scp:
        import kaldiio

        if not os.path.isfile(cfg.from_scp):
            raise ConfigError(f"from_scp={cfg.from_scp} does not exist. Pass a Kaldi feats.scp.")
        mode, options = "scp", {"from_scp": _source_signature(cfg.from_scp)}
        sources["scp"] = kaldiio.load_scp(cfg.from_scp)
    elif cfg.from_jsonl:
        if not os.path.isfile(cfg.from_jsonl):
            raise ConfigError(f"from_jsonl={cfg.from_jsonl} does not exist. Pass a JSONL of "
                              f'{{"key": ..., "{cfg.field}": ...}} lines.')
        mode, options = "jsonl", {"from_jsonl": _source_signature(cfg.from_jsonl)}
        sources["jsonl"] = _load_jsonl_values(cfg.from_jsonl, cfg.field)
    elif cfg.field in ("fbank", "mfcc"):
        mode = cfg.field
        conf = dc.fbank_conf if mode == "fbank" else dc.mfcc_conf
        # stored features are computed once, as cv and decode compute them: dither (training's, per epoch) is 0
        options = {"resample_rate": dc.resample_conf.resample_rate,
                   f"{mode}_conf": {**{k: getattr(conf, k) for k in conf.__dataclass_fields__}, "dither": 0.0}}
    else:
        raise ConfigError(f"field '{cfg.field}' is not computed by add-field (only fbank and mfcc are): pass "
                          f"++from_scp=feats.scp or ++from_jsonl=values.jsonl with it.")
    urls = read_datalist(cfg.input)
    for url in urls:
        if is_remote(url) or is_command(url):
            raise ConfigError(f"{cfg.input} lists {url}: add-field writes companion files next to each shard, so "
                              f"the shards must be local. Run it where the shards were packed, then upload the "
                              f"new files with the shards.")
    job = jobs.job_of(cfg)
    lo, hi = job.span(len(urls))
    _clean_temp_files(urls[lo:hi])
    index = load_index(cfg.input, keys=True) or {}  # rewritten below: its keys are kept
    tasks = [FieldTask(url, cfg.field, mode, _shard_digest(url, index.get(url)), options, dc.on_error,
                       dict(dc.storage_options or {})) for url in urls]
    place = jobs.Place(str(cfg.input), f"add-field-{cfg.field}", False)
    if not job.single or place.records():
        # the shards' digests, not the index file: the merge adds this field's entries to the index
        fp = jobs.fingerprint(["add-field", cfg.field, mode, options, dc.on_error, urls,
                               [t.shard_digest for t in tasks]])
        done = jobs.begin(place, job, fp)
        if done is not None:
            summary = jobs.merged_summary([done])
            summary.print(f"add-field {job} (already complete)")
            return summary
    tasks = tasks[lo:hi]
    summary = Summary()
    results: dict[str, dict] = {}
    workers = min(resolve_num_workers(cfg.num_workers), max(1, len(tasks)))
    resumed = 0
    for res in progress(parallel_imap(add_field_to_shard, tasks, num_workers=workers, chunksize=1,
                                      initializer=_use_sources, initargs=(sources,)),
                        total=len(tasks), desc="add-field", unit="shard"):
        results[res.url] = res.stats
        summary.kept += res.num_utts - res.missing
        summary.seconds += res.seconds
        resumed += res.resumed
        for why, n in res.reasons.items():
            summary.skip(why, n)
        if res.resumed and res.missing:
            summary.skip("missing (resumed)", res.missing)
    _SOURCES.values = {}
    if not job.single:
        _write_part(place, job, fp, [lo, hi], len(urls), results, summary)
        summary.print(f"add-field {job}")
        return summary
    _update_index(index_path_for(cfg.input), urls, index, results)
    summary.extra["field"] = cfg.field
    summary.extra["shards"] = len(tasks)
    summary.extra["resumed"] = resumed
    summary.print("add-field")
    return summary


def _write_part(place: jobs.Place, job: jobs.Job, fp: str, span: list, total: int, results: dict[str, dict],
                summary: Any) -> None:
    """A job's record: its companion files (outputs) and their stats by shard (what the merge indexes)."""
    from corpus_io.storage.urls import local_path

    outputs = []
    for url, stats in results.items():
        for stat in stats.values():
            path = Path(local_path(url)).parent / stat["file"]
            outputs.append(jobs.output_entry(path, place.directory, sha256=stat["sha256"], size=stat["bytes"]))
    jobs.write_part(place, jobs.Part("add-field", place.tag, job.count, job.index, fp, span, total, outputs,
                                     {"results": results, "summary": jobs.summary_data(summary)}))


def part_keys(data: dict) -> list[str]:
    """The shards an add-field part wrote fields for (merge-jobs refuses a shard two parts hold)."""
    return list(data["results"])


def check_part(part: jobs.Part) -> None:
    """merge-jobs: an add-field record's companion files per shard (a file name beside the shard, its size and
    sha256, as many as its outputs) (:class:`corpus_io.jobs.parts.RecordProblem` on the first field that cannot be
    trusted)."""
    files = 0
    for url, stats in jobs.of_type(part.data.get("results"), "data.results", dict, "a JSON object").items():
        for name, stat in jobs.of_type(stats, f"data.results[{url!r}]", dict, "a JSON object").items():
            where = f"data.results[{url!r}][{name!r}]"
            file = jobs.inner_path(jobs.of_type(stat, where, dict, "a JSON object").get("file"), f"{where}.file")
            if "/" in file:
                raise jobs.bad(f"{where}.file", file, "not a file name beside its shard")
            jobs.whole(stat.get("bytes"), f"{where}.bytes")
            jobs.sha256_hex(stat.get("sha256"), f"{where}.sha256")
            files += 1
    if files != len(part.outputs):
        raise jobs.bad("outputs", f"{len(part.outputs)} files", f"but data.results names {files}")


def merge_parts(place: jobs.Place, parts: list[jobs.Part]) -> Any:
    """``merge-jobs`` of add-field: the index with every shard's field entries, as one job writes it."""
    from corpus_io.shards.index import index_path_for, load_index, read_datalist

    results = {url: stats for part in parts for url, stats in part.payload()["results"].items()}
    urls = read_datalist(place.path)
    listed = set(urls)
    unknown = next((u for u in results if u not in listed), None)
    if unknown is not None:
        raise DataError(f"a part of {place.path} holds shard {unknown}, which the list does not name: the list "
                        f"changed since the jobs ran, or a record was changed. Nothing was changed. Rerun the jobs.")
    missing = next((u for u in urls if u not in results), None)
    if missing is not None:
        raise DataError(f"no part of {place.path} holds shard {missing}: the list changed since the jobs ran. "
                        f"Nothing was changed. Rerun the jobs.")
    _update_index(index_path_for(place.path), urls, load_index(place.path, keys=True) or {}, results)
    summary = jobs.merged_summary(parts)
    summary.print("add-field (merged)")
    return summary


def _clean_temp_files(urls: list[str]) -> None:
    """Remove the temp companion files and sidecars (``.<shard>.<field>.<kind>.json``) of a killed run."""
    from corpus_io.storage.urls import local_path

    stems: dict[str, set[str]] = {}
    for url in urls:
        path = Path(local_path(url))
        stems.setdefault(str(path.parent), set()).add(shard_stem(path.name))

    for directory, names in stems.items():
        def is_companion(final: str, names: set[str] = names) -> bool:
            # <stem>.<field>.<kind>[.json]; the main shard's "<stem>.tar[.json]" (pack-shards') has no field part
            stem, _, rest = final.lstrip(".").partition(".")
            return stem in names and rest.endswith((".tar", ".jsonl.gz", ".tar.json", ".jsonl.gz.json"))

        if os.path.isdir(directory):
            remove_temp_files(directory, is_companion)


def _shard_digest(url: str, entry: dict | None) -> str:
    from corpus_io.storage.urls import local_path

    if entry and entry.get("sha256"):
        return str(entry["sha256"])
    try:
        st = os.stat(local_path(url))
    except FileNotFoundError:
        raise DataError(f"shard {url} does not exist. Check the data.list.") from None
    return f"size={st.st_size},mtime={st.st_mtime_ns}"


def _update_index(path: Path, urls: list[str], index: dict[str, dict], results: dict[str, dict]) -> None:
    """Rewrite the index atomically with ``fields`` (file, kind, sha256, bytes, ...) per shard."""
    order = list(index) + [u for u in urls if u not in index]
    entries = []
    for url in order:
        entry = dict(index.get(url) or {"path": url})
        fields = dict(entry.get("fields") or {})
        for name, stat in results.get(url, {}).items():
            fields[name] = {k: v for k, v in stat.items() if k not in ("digest",)}
        entry["fields"] = dict(sorted(fields.items()))
        entries.append(entry)
    write_index(path, entries)
