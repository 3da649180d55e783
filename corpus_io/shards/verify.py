"""``verify-shards``: check every shard of a data.list, in parallel, and report by shard and member.

Per shard: it exists; the tar parses to the end; members group into samples (adjacent, one of each
field); every ``.txt`` is UTF-8; every audio member decodes (soundfile); every sample has an audio or
``.npy`` member. Against the index sidecar, when there is one: its entry's own values are sane (finite,
non-negative, ordered), and every field it records matches the shard: ``bytes``, ``sha256``,
``num_utts``, ``duration``/``min_duration``/``max_duration`` (from the audio headers, within
rounding), ``durations`` (each utterance's, within 10 ms) and ``keys`` (the same keys in the same
order). A list entry without an index entry, when a sidecar exists, is a problem too. Across the list,
with or without an index: an entry naming a shard an earlier entry names (after URL normalisation), and
a key two shards hold (from the members read).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Iterator

from corpus_io.errors import DataError, redact
from corpus_io.jobs import parts as jobs
from corpus_io.shards.format import legacy_member_name, safe_member_name, split_member
from corpus_io.shards.index import (
    durations_problems,
    find_repeated_keys,
    index_entry_problems,
    index_path_for,
    load_index,
    read_datalist,
    repeated_keys,
    shard_identity,
)
from corpus_io.shards.reader import DEFAULT_MAX_MEMBER_BYTES, group_samples, iter_tar_members
from corpus_io.storage.files import atomic_write
from corpus_io.storage.progress import parallel_imap, progress, resolve_num_workers


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
    durations_expected: bool = False  # another entry of the index records ``durations``: each entry must


@dataclass
class VerifyResult:
    url: str
    num_utts: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)
    keys: str = ""  # the shard's keys in order, joined by NUL (one string: cheap to send back from a worker)


def _named_members(members: Iterator[tuple[str, bytes]], names: dict[str, list[str]]) -> Iterator[tuple[str, bytes]]:
    for name, data in members:
        names.setdefault(split_member(name)[0], []).append(name)
        yield name, data


def verify_one(task: VerifyTask) -> VerifyResult:
    """Check one shard; never raises for a data problem (they go into ``problems``)."""
    from corpus_io.audio import io as audio
    from corpus_io.storage.urls import open_url

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
    keys: list[str] = []
    durations: list[float | None] = []
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
            keys.append(key)
            durations.append(_duration(sample))
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
    result.keys = "\0".join(keys)
    entry = task.entry
    if entry is not None:
        problems.extend(f"{task.url}: the index entry is wrong: {why}." for why in index_entry_problems(entry))
        if entry.get("bytes") is not None and entry["bytes"] != reader.bytes:
            problems.append(f"{task.url}: size {reader.bytes} bytes, the index says {entry['bytes']} "
                            f"(truncated or replaced).")
        if entry.get("sha256") and str(entry["sha256"]).lower() != reader.sha.hexdigest():
            problems.append(f"{task.url}: sha256 mismatch: content changed since packing (a flipped byte or a "
                            f"partial copy). Re-copy or re-pack the shard.")
        if entry.get("num_utts") is not None and entry["num_utts"] != result.num_utts:
            problems.append(f"{task.url}: {result.num_utts} samples, the index says {entry['num_utts']}.")
        problems.extend(_index_keys_problems(task.url, entry.get("keys"), keys))
        if task.durations_expected and "durations" not in entry:
            problems.append(f"{task.url}: the index entry has no 'durations' while other entries of the index have "
                            f"them, so the loader refuses the list (its bucket edges would come from a part of the "
                            f"corpus). Regenerate the index with the command that wrote it (pack-shards into the "
                            f"same output_dir; make-datalist for Lhotse Shar and parquet lists).")
        if None not in durations:
            problems.extend(_duration_problems(task.url, entry, durations))  # type: ignore[arg-type]
            problems.extend(_per_utterance_problems(task.url, entry.get("durations"), durations, keys))
    return result


#: how far an index's ``durations`` value may be from the audio header's (seconds): they are rounded to 10 ms
PER_UTTERANCE_TOLERANCE = 0.01


def _per_utterance_problems(url: str, recorded: Any, durations: list[float], keys: list[str]) -> list[str]:
    """The index's ``durations`` (each utterance's seconds: the loader's bucket edges and padding come from them)
    against the samples' audio headers, one by one, within :data:`PER_UTTERANCE_TOLERANCE`."""
    if not isinstance(recorded, list) or len(recorded) != len(durations) or durations_problems(recorded):
        return []  # not a list of that many seconds: index_entry_problems says so
    wrong = [i for i, (r, d) in enumerate(zip(recorded, durations)) if abs(float(r) - d) > PER_UTTERANCE_TOLERANCE
             + 1e-6]
    if not wrong:
        return []
    i = wrong[0]
    return [f"{url}: the index's durations differ from the audio for {len(wrong)} of {len(durations)} utterances "
            f"(more than {PER_UTTERANCE_TOLERANCE * 1000:g} ms), e.g. '{keys[i]}' (utterance {i + 1}): the index "
            f"says {recorded[i]!r} s, its audio lasts {durations[i]:.3f} s. The loader pads and buckets by these "
            f"durations: regenerate the index with the command that wrote it (pack-shards into the same output_dir; "
            f"make-datalist for Lhotse Shar and parquet lists)."]


def _duration(sample: dict) -> float | None:
    """Seconds of a sample's audio from its header (soundfile when the header parser does not know it), or
    the ``duration`` its ``.json`` records for a features sample; None when neither says."""
    from corpus_io.audio import io as audio

    data = sample.get("audio")
    if data is None:
        value = (sample.get("meta") or {}).get("duration")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    info = audio.header_info(bytes(data[:audio.HEAD_BYTES]), len(data))
    if info is None:
        import io

        import soundfile as sf

        try:
            sfi = sf.info(io.BytesIO(bytes(data)))
        except (sf.LibsndfileError, RuntimeError, TypeError):
            return None  # reported by the decode check
        return sfi.frames / sfi.samplerate if sfi.samplerate else None
    return info.num_samples / info.sample_rate if info.sample_rate else None


def _duration_problems(url: str, entry: dict, durations: list[float]) -> list[str]:
    """The index's durations against the samples' (pack-shards rounds each field to 1 ms)."""
    actual = {"duration": sum(durations), "min_duration": min(durations, default=0.0),
              "max_duration": max(durations, default=0.0)}
    problems = []
    for name, value in actual.items():
        recorded = entry.get(name)
        if isinstance(recorded, (int, float)) and not isinstance(recorded, bool) and recorded == recorded \
                and abs(recorded - value) > 0.002 + 1e-4 * len(durations):
            problems.append(f"{url}: {name} is {value:.3f} s in the shard, the index says {recorded!r}.")
    return problems


def _index_keys_problems(url: str, recorded: Any, keys: list[str]) -> list[str]:
    if not isinstance(recorded, list) or recorded == keys:
        return []
    held, listed = set(keys), set(recorded)
    invented = [k for k in recorded if k not in held]
    missing = [k for k in keys if k not in listed]
    if invented or missing:
        return [f"{url}: the index's keys differ from the shard's: {len(invented)} keys the shard does not hold"
                f"{f' (e.g. {invented[0]!r})' if invented else ''}, {len(missing)} keys of the shard missing"
                f"{f' (e.g. {missing[0]!r})' if missing else ''}."]
    return [f"{url}: the index lists the shard's keys in another order."]


def _distinct_entries(entries: list[str]) -> tuple[list[str], list[tuple[int, int]]]:
    """The list's entries with each shard once (after URL normalisation), and ``(entry, earlier entry)`` pairs
    (1-based) of every line that names a shard again."""
    first_entry: dict[str, int] = {}
    twice: list[tuple[int, int]] = []
    for j, url in enumerate(entries, 1):
        i = first_entry.setdefault(shard_identity(url), j)
        if i != j:
            twice.append((j, i))
    return [u for j, u in enumerate(entries, 1) if first_entry[shard_identity(u)] == j], twice


def verify_shards(cfg: Any) -> list[VerifyResult]:
    """Verify every shard of ``cfg.input``; print a report; raise DataError (exit 2) on any problem.

    With ``++num_jobs=N`` (N > 1) this is one job (corpus_io.jobs.parts): it verifies its range of the list's
    shards and writes a part record; ``merge-jobs ++path=<input>`` prints (and writes to ``report``) the
    one-job report, the check of keys repeated across shards included."""
    job = jobs.job_of(cfg)
    options = dict(cfg.storage_options or {})
    urls, _ = _distinct_entries(read_datalist(cfg.input, storage_options=options))  # each shard read once
    index = load_index(cfg.input, keys=True, storage_options=options)
    if index is None:
        print(f"[verify-shards] no index sidecar {index_path_for(cfg.input)}: sha256, size and counts are not "
              f"checked.", file=sys.stderr, flush=True)
    place = jobs.Place(str(cfg.input), "verify-shards", False)
    lo, hi = job.span(len(urls))
    if not job.single or place.records():
        fp = jobs.fingerprint(["verify-shards", jobs.files_digest([cfg.input]), index, cfg.decode_audio,
                               cfg.report])
        jobs.check_place(place, job, fp)  # a rerun checks the shards again: they may have changed
    expected = any("durations" in entry for entry in (index or {}).values())
    tasks = (VerifyTask(u, (index or {}).get(u), index is not None, cfg.decode_audio, options,
                        durations_expected=expected) for u in urls[lo:hi])
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
    return _report(cfg.input, index, results, cfg.report, options)


def _print_failures(bad: list[VerifyResult], out: list[str] | None = None) -> None:
    for r in bad:
        for line in [f"FAIL {r.url}"] + [f"  - {problem}" for problem in r.problems]:
            line = redact(line)
            print(line, flush=True)
            if out is not None:
                out.append(line)


def check_part(part: jobs.Part) -> None:
    """merge-jobs: a verify-shards record's results, one per shard of its span, each a :class:`VerifyResult`
    (:class:`corpus_io.jobs.parts.RecordProblem` on the first field that cannot be trusted)."""
    results = jobs.of_type(part.data.get("results"), "data.results", list, "a list")
    lo, hi = part.span
    if len(results) != hi - lo:
        raise jobs.bad("data.results", f"{len(results)} shards", f"but the job's span {part.span} holds {hi - lo}")
    fields = set(VerifyResult.__dataclass_fields__)
    for i, r in enumerate(results):
        where = f"data.results[{i}]"
        extra = set(jobs.of_type(r, where, dict, "a JSON object")) - fields
        if extra:
            raise jobs.bad(where, sorted(extra), f"fields a verify result does not have (it has {sorted(fields)})")
        jobs.of_type(r.get("url"), f"{where}.url", str, "a string")
        jobs.whole(r.get("num_utts", 0), f"{where}.num_utts")
        jobs.whole(r.get("bytes", 0), f"{where}.bytes")
        problems = jobs.of_type(r.get("problems", []), f"{where}.problems", list, "a list")
        if not all(isinstance(p, str) for p in problems):
            raise jobs.bad(f"{where}.problems", problems, "not a list of strings")
        jobs.of_type(r.get("keys", ""), f"{where}.keys", str, "a string")
    report = part.data.get("report")
    if report is not None:
        jobs.of_type(report, "data.report", str, "a path (a string)")


def merge_parts(place: jobs.Place, parts: list[jobs.Part]) -> list[VerifyResult]:
    """``merge-jobs`` of verify-shards: the one-job report (and its exit status) from the parts' results."""
    results = [VerifyResult(**r) for part in parts for r in part.payload()["results"]]
    options = place.storage_options
    return _report(place.path, load_index(place.path, keys=True, storage_options=options), results,
                   parts[0].payload().get("report"), options)


def _report(list_path: str, index: dict | None, results: list[VerifyResult], report: str | None,
            storage_options: dict | None = None) -> list[VerifyResult]:
    """Shards listed twice, keys repeated across shards, the report (stdout, and ``report`` when given); a
    DataError on any problem. ``storage_options``: the list's, when it is at a URL."""
    entries = read_datalist(list_path, storage_options=storage_options)
    _, twice = _distinct_entries(entries)
    by_url = {r.url: r for r in results}
    for j, i in twice:
        by_url[entries[i - 1]].problems.append(
            f"{entries[j - 1]}: entry {j} names the same shard as entry {i} ({entries[i - 1]}) of {list_path}; "
            f"training would read every utterance of it twice. Remove one of the lines.")
    # across shards: from the members read, and from the index for shards that could not be read whole
    repeats = find_repeated_keys(lambda: ((r.url, r.keys.split("\0") if r.keys else []) for r in results))
    for key, shards in repeated_keys(list_path, storage_options=storage_options).items():
        repeats.setdefault(key, shards)
    if index is not None and not any(isinstance(e.get("keys"), list) for e in index.values()):
        print(f"[verify-shards] {index_path_for(list_path)} records no utterance keys (an older pack-shards or "
              f"another tool wrote it): keys repeated across shards were found from the shards' members instead "
              f"(the loader finds them only as it reads). Re-run make-datalist or pack-shards to record them.",
              file=sys.stderr, flush=True)
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
