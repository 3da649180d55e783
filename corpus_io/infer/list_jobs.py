"""score's and decode's N jobs over a list's entries (:mod:`corpus_io.jobs.parts`): job J's contiguous share of a
raw list's records or a shard list's shards, run into its part directory, or the record of a job already done."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass
class ListJob:
    """Job J of N of a command over a list's entries (score, decode) once it ran: its place, options' fingerprint,
    span ``[lo, hi)`` of ``total`` entries, part directory and what its run gave."""

    job: Any
    place: Any
    fingerprint: str
    span: tuple
    total: int
    folder: Path
    result: Any


def list_job(cfg: Any, job: Any, tag: str, fingerprint_of: Callable[[], str],
             run_list: Callable[[str, Path, Any], Any], empty: Callable[[Path], Any]) -> Any:
    """score's and decode's start as ``job`` (:mod:`corpus_io.jobs.parts`), after their refusals: the one-job run's
    result (``run_list(cfg.data_list, output_dir, None)``), the record's result of a job it proves done (said so),
    or a :class:`ListJob` of this job's share of the list (:func:`job_list`) run into its part directory
    (``run_list(its list, folder, job)``; ``empty(folder)`` for a job past the entries). The caller writes its
    part record."""
    from corpus_io.jobs import parts as jobs
    from corpus_io.storage.files import ensure_dir

    out = Path(cfg.output_dir)
    place = jobs.Place(str(out), tag, True)
    fp, done = jobs.started(place, job, fingerprint_of)
    if done is not None:
        print(f"{tag} {job}: already complete ({done.where})", flush=True)
        return done.data["result"]
    if job.single:
        return run_list(cfg.data_list, out, None)
    with tempfile.TemporaryDirectory(prefix=f".{tag}-job-", dir=ensure_dir(out, what="output_dir")) as tmp:
        data_list, lo, hi, total = job_list(cfg, job, Path(tmp))
        folder = place.data(job)
        result = run_list(data_list, folder, job) if hi > lo else empty(folder)
    return ListJob(job, place, fp, (lo, hi), total, folder, result)


def job_list(cfg: Any, job: Any, tmp: Path) -> tuple[str, int, int, int]:
    """``(list, lo, hi, total)``: job J's contiguous share ``[lo, hi)`` of the list's ``total`` entries (a raw
    list's records, a shard list's shards), written to a list of its own in ``tmp``, a line at a time."""
    if cfg.dataset_conf.data_type == "raw":
        from corpus_io.loader.rawlist import RawList

        entries = RawList(cfg.data_list)
        total = len(entries)
        lo, hi = job.span(total)
        path = tmp / "list.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for i in range(lo, hi):
                f.write(json.dumps(entries.record(i), ensure_ascii=False) + "\n")
        return str(path), lo, hi, total
    from corpus_io.shards.index import read_datalist

    shards = read_datalist(cfg.data_list, storage_options=cfg.dataset_conf.storage_options or None)
    lo, hi = job.span(len(shards))
    path = tmp / "data.list"
    path.write_text("".join(f"{s}\n" for s in shards[lo:hi]), encoding="utf-8")
    return str(path), lo, hi, len(shards)


__all__ = ["ListJob", "job_list", "list_job"]
