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

This module is the driver (and a job's run of it); one shard's writing is :mod:`corpus_io.shards.pack_worker`,
the output directory's list and clean-up :mod:`corpus_io.shards.pack_list`, merge-jobs
:mod:`corpus_io.shards.pack_merge`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from corpus_io.config import check_values
from corpus_io.errors import ConfigError, DataError
from corpus_io.jobs.parts import (
    Job,
    Part,
    Place,
    begin,
    files_digest,
    fingerprint,
    job_of,
    merged_summary,
    output_entry,
    seal_output,
    summary_data,
    write_part,
)
from corpus_io.keys import ExcludedKeys
from corpus_io.shards import format as fmt
from corpus_io.shards.pack_list import clean_temp_files, refuse_other_prefix, withdraw_list, write_list
from corpus_io.shards.pack_merge import absent_object, publish_record
from corpus_io.shards.pack_worker import PackOptions, ShardStat, ShardTask, pack_shard, source_len, task_digest
from corpus_io.storage import objects
from corpus_io.storage.files import (
    ensure_dir,
    is_object_url,
    refuse_overwriting_inputs,
    remove_temp_files,
    sidecar_path,
    state_dir,
)
from corpus_io.storage.progress import Summary, parallel_imap, progress, resolve_num_workers
from corpus_io.tables.inputs import Input, Skip, open_input


def parse_filter_group(specs: list[str]) -> list[tuple[int, int]]:
    groups = []
    for spec in specs:
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(spec))
        if not m or int(m.group(1)) >= int(m.group(2)):
            raise ConfigError(f"filter_group entry '{spec}' must be 'lo:hi' in 10 ms frames with lo < hi, e.g. "
                              f"++filter_group='[\"10:500\",\"500:1000\"]'.")
        groups.append((int(m.group(1)), int(m.group(2))))
    return groups



def _pack_dir(inp: Input, out_dir: Path, cfg: Any, opts: PackOptions, total: int,
              keep: Callable[[dict], bool] | None, summary: Summary, desc: str,
              wanted: range | None = None, url: str = "", excluded: ExcludedKeys | None = None) -> list[ShardStat]:
    """Pack one directory's shards; ``wanted``: a job's shard numbers (only those are written, and no list);
    ``url``: an object-storage prefix (``out_dir`` is then its local state dir); ``excluded``: the keys of
    ``++exclude_keys``, left out and counted."""
    ensure_dir(out_dir, what="output_dir")
    refuse_other_prefix(out_dir, cfg.shard_prefix)
    if wanted is None:
        clean_temp_files(out_dir, cfg.shard_prefix)
        previous_index = withdraw_list(out_dir / "data.list")
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
    write_list(out_dir, cfg.shard_prefix, previous_index, [s.index_entry() for s in listed], summary,
                url=url, storage_options=opts.storage_options)
    return stats



def _refuse_other_run(task: ShardTask) -> None:
    """A job does not overwrite a complete shard that another run (other options or input) wrote."""
    try:
        stored = json.loads(sidecar_path(task.path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no complete shard there (or an unfinished one): this job writes it
    if isinstance(stored, dict) and stored.get("digest") not in (None, task_digest(task)):
        raise DataError(f"{task.path} was written by another run (other options or another input) and is not "
                        f"this job's shard {task.index}; a job never overwrites it. Use another output_dir, or "
                        f"delete that run's shards (or run it with ++num_jobs=1, which replaces them).")



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
                    return lo <= source_len(rec, opts) < hi
                except DataError:
                    return True  # the worker reports (or skips) unreadable audio
            keeps.append(keep)
    dirs = _group_dirs(out_dir, groups)
    place = Place(str(out_dir), "pack-shards", True)
    if not job.single or place.records():
        fp = _fingerprint(cfg, opts, inp)
        done = begin(place, job, fp)
        if done is not None and url and absent_object(url, [done], opts.storage_options):
            done = None  # an object went missing since: the job runs again and sends only what is not there
        if done is not None:
            if url:  # a record written just before a kill may never have reached the bucket
                publish_record(place.record(job), url, opts.storage_options)
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
        publish_record(record, url, opts.storage_options)
    summary.print(f"pack-shards {job}")
    if excluded is not None:  # a job reads only its part of the input: the keys it did not meet may be others'
        print(excluded.report(f"pack-shards {job}", whole_input=False), file=sys.stderr, flush=True)
    print(f"pack-shards {job}: shards {lo}..{hi - 1} of {sum(counts)} -> {record}", flush=True)
    return summary

