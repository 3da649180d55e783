"""``verify-shards``: check every shard of a data.list, in parallel, and report by shard and member.

Per shard: it exists; its size and sha256 match the index sidecar; the tar parses to the end;
members group into samples (adjacent, one of each field); the number of samples matches
``num_utts``; no key repeats; every ``.txt`` is UTF-8; every audio member decodes (soundfile);
every sample has an audio or ``.npy`` member. A list entry without an index entry, when a
sidecar exists, is a problem too.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Iterator

from corpus_io import jobs
from corpus_io.errors import DataError
from corpus_io.files import atomic_write
from corpus_io.progress import parallel_imap, progress, resolve_num_workers
from corpus_io.shards.format import legacy_member_name, safe_member_name, split_member
from corpus_io.shards.index import index_path_for, load_index, read_datalist, read_index_file, repeated_keys
from corpus_io.shards.reader import DEFAULT_MAX_MEMBER_BYTES, group_samples, iter_tar_members


class HashingReader:
    """A read-only stream wrapper that hashes (sha256) and counts every byte read through it."""

    def __init__(self, f: IO[bytes]):
        self._f = f
        self.sha = hashlib.sha256()
        self.bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        if data:
            self.sha.update(data)
            self.bytes += len(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


@dataclass
class VerifyTask:
    url: str
    entry: dict | None  # index entry, None when the list has no sidecar
    has_index: bool
    decode_audio: bool
    storage_options: dict = field(default_factory=dict)
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES


@dataclass
class VerifyResult:
    url: str
    num_utts: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)


def _named_members(members: Iterator[tuple[str, bytes]], names: dict[str, list[str]]) -> Iterator[tuple[str, bytes]]:
    for name, data in members:
        names.setdefault(split_member(name)[0], []).append(name)
        yield name, data


def verify_one(task: VerifyTask) -> VerifyResult:
    """Check one shard; never raises for a data problem (they go into ``problems``)."""
    from corpus_io import audio
    from corpus_io.urls import open_url

    result = VerifyResult(task.url)
    problems = result.problems
    if task.has_index and task.entry is None:
        problems.append(f"{task.url}: no entry in the index sidecar; re-run make-datalist or pack-shards.")
    try:
        f = open_url(task.url, storage_options=task.storage_options)
    except DataError as exc:
        problems.append(f"{task.url}: missing or unreadable shard: {exc}")
        return result
    reader = HashingReader(f)
    names: dict[str, list[str]] = {}
    first_pos: dict[str, int] = {}
    try:
        members = _named_members(iter_tar_members(reader, url=task.url, max_member_bytes=task.max_member_bytes),
                                 names)
        for sample in group_samples(members, url=task.url):
            key, pos = sample["key"], sample["__pos__"]
            stem = next((s for s in (safe_member_name(key), legacy_member_name(key)) if s in names), key)
            member_names = names.get(stem, [])
            if key in first_pos:
                problems.append(f"{task.url}: duplicate key '{key}' (samples {first_pos[key]} and {pos}, members "
                                f"{', '.join(member_names)}).")
            first_pos.setdefault(key, pos)
            if "audio" in sample:
                member = next((n for n in member_names if n.endswith("." + sample["audio_format"])), stem)
                if task.decode_audio:
                    try:
                        audio.decode_bytes(sample["audio"], where=f"{task.url}: member '{member}'")
                    except DataError as exc:
                        problems.append(str(exc))
            elif "npy" not in sample:
                problems.append(f"{task.url}: sample '{key}' (members {', '.join(member_names)}) has neither an "
                                f"audio member nor .npy features.")
            names.pop(stem, None)  # keep memory to one sample
            result.num_utts += 1
        reader.drain()
    except DataError as exc:
        problems.append(str(exc))
        reader.drain()
    finally:
        f.close()
    result.bytes = reader.bytes
    entry = task.entry
    if entry is not None:
        if entry.get("bytes") is not None and entry["bytes"] != reader.bytes:
            problems.append(f"{task.url}: size {reader.bytes} bytes, the index says {entry['bytes']} "
                            f"(truncated or replaced).")
        if entry.get("sha256") and entry["sha256"] != reader.sha.hexdigest():
            problems.append(f"{task.url}: sha256 mismatch: content changed since packing (a flipped byte or a "
                            f"partial copy). Re-copy or re-pack the shard.")
        if entry.get("num_utts") is not None and entry["num_utts"] != result.num_utts:
            problems.append(f"{task.url}: {result.num_utts} samples, the index says {entry['num_utts']}.")
    return result


def verify_shards(cfg: Any) -> list[VerifyResult]:
    """Verify every shard of ``cfg.input``; print a report; raise DataError (exit 2) on any problem.

    With ``++num_jobs=N`` (N > 1) this is one job (corpus_io.jobs): it verifies its range of the list's
    shards and writes a part record; ``merge-jobs ++path=<input>`` prints (and writes to ``report``) the
    one-job report, the check of keys repeated across shards included."""
    job = jobs.job_of(cfg)
    urls = read_datalist(cfg.input)
    index = load_index(cfg.input)
    if index is None:
        print(f"[verify-shards] no index sidecar {index_path_for(cfg.input)}: sha256, size and counts are not "
              f"checked.", file=sys.stderr, flush=True)
    place = jobs.Place(str(cfg.input), "verify-shards", False)
    lo, hi = job.span(len(urls))
    if not job.single or place.records():
        fp = jobs.fingerprint(["verify-shards", jobs.files_digest([cfg.input]), index, cfg.decode_audio,
                               cfg.report])
        jobs.check_place(place, job, fp)  # a rerun checks the shards again: they may have changed
    tasks = (VerifyTask(u, (index or {}).get(u), index is not None, cfg.decode_audio, dict(cfg.storage_options or {}))
             for u in urls[lo:hi])
    workers = min(resolve_num_workers(cfg.num_workers), max(1, hi - lo))
    results: list[VerifyResult] = []
    desc = "verify-shards" if job.single else f"verify-shards {job}"
    for result in progress(parallel_imap(verify_one, tasks, num_workers=workers, chunksize=1),
                           total=hi - lo, desc=desc, unit="shard"):
        results.append(result)
    if not job.single:
        jobs.write_part(place, jobs.Part("verify-shards", place.tag, job.count, job.index, fp, [lo, hi], len(urls),
                                         data={"results": [asdict(r) for r in results], "report": cfg.report}))
        bad = [r for r in results if r.problems]
        _print_failures(bad)
        print(f"[verify-shards] {job}: {len(results)} shards, {len(bad)} failed", flush=True)
        if bad:
            raise DataError(f"{job}: {len(bad)} of {len(results)} shards failed verification; first: "
                            f"{bad[0].problems[0]}")
        return results
    return _report(cfg.input, index, results, cfg.report)


def _print_failures(bad: list[VerifyResult], out: list[str] | None = None) -> None:
    for r in bad:
        for line in [f"FAIL {r.url}"] + [f"  - {problem}" for problem in r.problems]:
            print(line, flush=True)
            if out is not None:
                out.append(line)


def merge_parts(place: jobs.Place, parts: list[jobs.Part]) -> list[VerifyResult]:
    """``merge-jobs`` of verify-shards: the one-job report (and its exit status) from the parts' results."""
    results = [VerifyResult(**r) for part in parts for r in part.payload()["results"]]
    return _report(place.path, load_index(place.path), results, parts[0].payload().get("report"))


def _report(list_path: str, index: dict | None, results: list[VerifyResult], report: str | None) -> list[VerifyResult]:
    """The cross-shard key check, the report (stdout, and ``report`` when given); a DataError on any problem."""
    repeats = repeated_keys(list_path)  # across shards, from the index alone
    if index is not None and not any(isinstance(e.get("keys"), list)
                                     for e in read_index_file(index_path_for(list_path), keys=True, lazy=True)):
        print(f"[verify-shards] {index_path_for(list_path)} records no utterance keys (an older pack-shards or "
              f"another tool wrote it): a key repeated across shards is not checked. Re-run pack-shards to "
              f"record them.", file=sys.stderr, flush=True)
    by_url = {r.url: r for r in results}
    for key, shards in repeats.items():
        later = shards[-1]
        by_url.get(later, results[0]).problems.append(
            f"{later}: key '{key}' repeats a key of {shards[0]}{' (same shard)' if later == shards[0] else ''}; "
            f"training would see it twice and decode would score it once. Give each utterance its own key "
            f"(e.g. a corpus prefix) and re-pack, or drop one of the lists.")
    bad = [r for r in results if r.problems]
    lines: list[str] = []
    _print_failures(bad, lines)
    utts = sum(r.num_utts for r in results)
    lines.append(f"[verify-shards] {len(results)} shards, {utts} utterances, "
                 f"{sum(r.bytes for r in results) / 1e9:.3f} GB; {len(results) - len(bad)} ok, {len(bad)} failed")
    print(lines[-1], flush=True)
    if report:
        with atomic_write(report) as f:
            f.write("".join(line + "\n" for line in lines))
    if bad:
        raise DataError(f"{len(bad)} of {len(results)} shards failed verification; first: {bad[0].problems[0]} "
                        f"See the report above for every shard and member.")
    if utts == 0:
        raise DataError(f"{list_path} lists {len(results)} shards holding 0 utterances: there is nothing to verify "
                        f"or train on. Point ++input at the data.list of a pack-shards run that wrote utterances.")
    return results
