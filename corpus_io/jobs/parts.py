"""Jobs: one long data command split into N jobs (Kaldi's ``JOB=1:$nj``), and ``merge-jobs``.

The interface (what an engine, recipe or executor needs):

* ``++num_jobs=N ++job_index=J`` on ``pack-shards``, ``scp2jsonl``, ``compute-cmvn``, ``add-field``,
  ``verify-shards``, ``export``, ``segment``, ``score`` and ``decode``; J counts from 1. ``auto`` (both keys) reads a
  scheduler's array variables (:func:`scheduler_job`: Slurm, SGE/UGE, PBS Pro with ``num_jobs`` given, LSF);
  ``auto`` outside an array is a :class:`ConfigError`. ``N = 1`` (the default) is the one-job run: it writes the final
  outputs (``data.list``, the jsonl, the CMVN file, ...) itself.
* Job J of N is a pure function of (input, options, N, J): :func:`Job.span` gives its contiguous slice
  of the command's N-independent units (pack-shards: global shard numbers; scp2jsonl: lines of the first
  table; compute-cmvn, add-field, verify-shards: entries of the data.list; segment: recordings in key order;
  score and decode: a raw list's lines or a shard list's shards).
  It writes only its own outputs plus a **part record** (:class:`Part`, JSON, by temp + rename, written last),
  never the final list/file.
* :func:`run_job` ``(command, overrides, job_index, num_jobs)`` composes the command's config exactly as
  the CLI does and runs that one job: the function an executor (Dask, a local pool) submits; it needs
  nothing but the same filesystem.
* ``corpus-io merge-jobs ++path=P`` (:func:`merge_jobs`), where P is what one job would have written
  (pack-shards', segment's, score's and decode's ``output_dir``, scp2jsonl's ``jsonl_file_out``, compute-cmvn's
  ``output``, add-field's and verify-shards' ``input`` list), checks the parts (:func:`load_parts`: none
  missing, one N, one options fingerprint, outputs present and unchanged, no key in two parts) and only then
  writes exactly the bytes ``++num_jobs=1`` writes. It changes nothing when it refuses, and a second merge
  rewrites the same bytes.

Part records live beside P: ``P/<tag>.part-JJJJJJ-of-NNNNNN.json`` when P is a directory (pack-shards),
else ``P.<tag>.part-JJJJJJ-of-NNNNNN.json`` (``<tag>`` is the command, add-field's is ``add-field-<field>``).
A job's per-job data file, where it has one (scp2jsonl; segment's is a directory of its six files), is the
record's name without ``.json``.
A rerun of a job whose record proves its outputs complete (size and sha256) does nothing; any other rerun
redoes what is missing (pack-shards and add-field also keep each complete shard). A job that finds a record
of other options or of another N in its place stops before writing anything.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import json
import os
import re
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from corpus_io.errors import ConfigError, DataError
from corpus_io.storage.files import atomic_write, file_sha256, inputs_digest, is_object_url, state_dir
from corpus_io.storage.progress import Summary

RECORD_FORMAT = 1
MAX_JOBS = 10_000_000

# the commands that run as jobs: the function that runs one job (the CLI's, see corpus_io/commands.py) and the
# one that joins the parts (called by merge_jobs with the place and the checked parts), the one that names
# the keys a part holds (in its record's data), which no two parts may share, and the one that checks the
# command's fields of a record (``check(part)`` raises :class:`RecordProblem`) before the merge trusts any
JOB_COMMANDS: dict[str, tuple[str, str, str, str, str]] = {  # command -> (schema, run, merge, keys, check)
    "pack-shards": ("PackShardsConfig", "corpus_io.shards.pack:pack_shards", "corpus_io.shards.pack_merge:merge_parts",
                    "corpus_io.shards.pack_merge:part_keys", "corpus_io.shards.pack_merge:check_part"),
    "scp2jsonl": ("Scp2JsonlConfig", "corpus_io.tables.manifest:scp2jsonl", "corpus_io.tables.manifest:merge_parts",
                  "corpus_io.tables.manifest:part_keys", "corpus_io.tables.manifest:check_part"),
    "compute-cmvn": ("ComputeCmvnConfig", "corpus_io.model.cmvn:compute_cmvn", "corpus_io.model.cmvn:merge_parts",
                     "", "corpus_io.model.cmvn:check_part"),
    "add-field": ("AddFieldConfig", "corpus_io.shards.add_field:add_field", "corpus_io.shards.add_field:merge_parts",
                  "corpus_io.shards.add_field:part_keys", "corpus_io.shards.add_field:check_part"),
    "export": ("ExportConfig", "corpus_io.shards.export:export", "corpus_io.shards.export:merge_parts",
               "corpus_io.shards.export:part_keys", "corpus_io.shards.export:check_part"),
    "verify-shards": ("VerifyShardsConfig", "corpus_io.shards.verify:verify_shards",
                      "corpus_io.shards.verify:merge_parts", "", "corpus_io.shards.verify:check_part"),
    "segment": ("SegmentConfig", "corpus_io.infer.segment:segment", "corpus_io.infer.segment:merge_parts",
                "corpus_io.infer.segment:part_keys", "corpus_io.infer.segment:check_part"),
    "score": ("ScoreConfig", "corpus_io.infer.score:score", "corpus_io.infer.score:merge_parts",
              "corpus_io.infer.score:part_keys", "corpus_io.infer.score:check_part"),
    "decode": ("DecodeConfig", "corpus_io.infer.decode:decode", "corpus_io.infer.decode:merge_parts",
               "corpus_io.infer.decode:part_keys", "corpus_io.infer.decode:check_part"),
}

# merge-jobs' ++check levels, each doing what the one before does and more: ``stat`` (the default; ``size`` is its
# former name): every output's size, and what a sealed record says of a shard trusted while the shard has the size and
# mtime its job saw (:func:`sealed`; else the shard's tar headers are read); ``headers``: every shard's tar headers
# read against its record; ``sha256``: every output's sha256 too
CHECKS = {"stat": "stat", "size": "stat", "headers": "headers", "sha256": "sha256"}

CONVENTION = "job_index counts from 1 to num_jobs, as Kaldi's JOB=1:$nj"


# --------------------------------------------------------------------------- N and J


@dataclass(frozen=True)
class Job:
    """Job ``index`` (1..count) of ``count``."""

    index: int = 1
    count: int = 1

    @property
    def single(self) -> bool:
        return self.count == 1

    def span(self, total: int) -> tuple[int, int]:
        """``[lo, hi)``: this job's contiguous share of ``total`` units (split_scp.pl's even split; jobs past
        the units get an empty span)."""
        return (self.index - 1) * total // self.count, self.index * total // self.count

    def name(self) -> str:
        return f"part-{self.index:06d}-of-{self.count:06d}"

    def __str__(self) -> str:
        return f"job {self.index} of {self.count}"


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"the scheduler variable {name}={value!r} is not an integer, so "
                          f"++job_index=auto cannot read it. Pass ++num_jobs=N ++job_index=J instead.") from None


def scheduler_job(env: Mapping[str, str], num_jobs: int | None = None) -> tuple[Job, str] | None:
    """``(Job, scheduler)`` from a job array's variables, or None outside an array.

    Slurm: ``SLURM_ARRAY_TASK_ID`` within ``_MIN``.. by ``_STEP`` (``_COUNT``, else ``(_MAX - _MIN) // _STEP
    + 1``); SGE/UGE: ``SGE_TASK_ID`` within ``SGE_TASK_FIRST``..``SGE_TASK_LAST`` by ``SGE_TASK_STEPSIZE``
    (``qsub -t``; "undefined" outside an array); PBS Pro: ``PBS_ARRAY_INDEX`` (``qsub -J 1-N``; the count
    comes from ``num_jobs``); LSF: ``LSB_JOBINDEX`` (``bsub -J "name[1-N]"``; 0 outside an array) up to
    ``LSB_JOBINDEX_END`` by ``LSB_JOBINDEX_STEP``. The index is counted from the array's first index in steps,
    so ``--array=0-3``, ``--array=1-4`` and ``--array=1-7:2`` all give jobs 1..4.

    ``auto`` needs an array that is one range (``start-end[:step]``). A Slurm index list (``--array=1,3,7``:
    ``_COUNT`` is not the size of ``_MIN``..``_MAX`` by ``_STEP``) is a :class:`ConfigError`. LSF does not
    tell a task its array's start: it is read from ``LSB_JOBNAME`` when that holds the array's range
    (``name[3-11:2]``, agreeing with ``LSB_JOBINDEX_END`` and ``_STEP``), else it is taken as 1 (LSF's default
    start); an ``LSB_JOBINDEX`` that is not start + k * step, and a job name holding an index list
    (``name[1,5,7]``), are ConfigErrors. Where auto cannot tell, pass ``++num_jobs=N ++job_index=J``."""
    explicit = ("pass this task's place explicitly instead: ++num_jobs=N ++job_index=J (J from 1 to N, computed "
                "in the job script from the task's index).")
    task = _env_int(env, "SLURM_ARRAY_TASK_ID")
    if task is not None:
        first = _env_int(env, "SLURM_ARRAY_TASK_MIN")
        step = _env_int(env, "SLURM_ARRAY_TASK_STEP") or 1
        count = _env_int(env, "SLURM_ARRAY_TASK_COUNT")
        last = _env_int(env, "SLURM_ARRAY_TASK_MAX")
        _check_slurm_array(task, first, last, count, step, explicit)
        first = 1 if first is None else first
        spanned = (last - first) // step + 1 if last is not None else None
        if count is None:
            count = spanned
        elif spanned is not None and count != spanned:
            raise ConfigError(f"the Slurm array is not one range: it has SLURM_ARRAY_TASK_COUNT={count} tasks, but "
                              f"{first}..{last} in steps of {step} (SLURM_ARRAY_TASK_MIN/_MAX/_STEP) would be "
                              f"{spanned}; an index list such as --array=1,3,7 does this. ++num_jobs=auto / "
                              f"++job_index=auto need a range array: sbatch --array=1-N (or --array=A-B:S). For "
                              f"this array, {explicit}")
        if task < first or (task - first) % step:
            end = last if last is not None else first + (count - 1) * step if count else None
            span = f"the range {first}..{end}" if end is not None else f"a range from {first}"
            raise ConfigError(f"SLURM_ARRAY_TASK_ID={task} is not in {span} in steps of {step} "
                              f"(SLURM_ARRAY_TASK_MIN/_MAX/_STEP). ++job_index=auto needs a range array "
                              f"(sbatch --array=1-N); {explicit}")
        return Job((task - first) // step + 1, count or num_jobs or 0), "Slurm"
    if env.get("SGE_TASK_ID", "undefined") != "undefined":
        task = _env_int(env, "SGE_TASK_ID")
        first = _env_int(env, "SGE_TASK_FIRST") if env.get("SGE_TASK_FIRST", "undefined") != "undefined" else 1
        last = _env_int(env, "SGE_TASK_LAST") if env.get("SGE_TASK_LAST", "undefined") != "undefined" else None
        step = _env_int(env, "SGE_TASK_STEPSIZE") if env.get("SGE_TASK_STEPSIZE", "undefined") != "undefined" \
            else 1
        step = step or 1
        count = (last - first) // step + 1 if last is not None else num_jobs or 0
        return Job((task - first) // step + 1, count), "SGE"
    task = _env_int(env, "PBS_ARRAY_INDEX")
    if task is not None:
        return Job(task, num_jobs or 0), "PBS"
    task = _env_int(env, "LSB_JOBINDEX")
    if task:  # 0: not an array job
        last = _env_int(env, "LSB_JOBINDEX_END")
        step = _env_int(env, "LSB_JOBINDEX_STEP") or 1
        first, where = 1, "taken as 1, LSF's default: LSF does not tell a task its array's start"
        name = env.get("LSB_JOBNAME", "")
        spec = re.search(r"\[([0-9,:\- ]+)\](?:%\d+)?$", name)
        if spec and "," in spec.group(1):
            raise ConfigError(f"the LSF array {name!r} (LSB_JOBNAME) is an index list, not one range. "
                              f"++num_jobs=auto / ++job_index=auto need a range array: bsub -J \"name[1-N]\" (or "
                              f"\"name[1-N:S]\"). For this array, {explicit}")
        ranged = re.fullmatch(r"\s*(\d+)-(\d+)(?::(\d+))?\s*", spec.group(1)) if spec else None
        if ranged:
            a, b, s = int(ranged.group(1)), int(ranged.group(2)), int(ranged.group(3) or 1)
            if s == step and a <= b and last in (None, b, a + (b - a) // s * s):
                first, where = a, f"read from LSB_JOBNAME={name!r}"
        if task < first or (task - first) % step:
            raise ConfigError(f"LSB_JOBINDEX={task} is not an index of the LSF array as ++job_index=auto sees it: "
                              f"from {first} ({where}) in steps of LSB_JOBINDEX_STEP={step}. Submit the array as "
                              f"bsub -J \"name[1-N]\" (or \"name[1-N:S]\"), or {explicit}")
        count = (last - first) // step + 1 if last is not None else num_jobs or 0
        return Job((task - first) // step + 1, count), "LSF"
    return None


def _check_slurm_array(task: int, first: int | None, last: int | None, count: int | None, step: int,
                       explicit: str) -> None:
    """The Slurm array variables that cannot place ``task`` in one range, named with what to set: Slurm sets
    ``SLURM_ARRAY_TASK_MIN``, ``_MAX`` and ``_COUNT`` with ``_ID`` in every array task, so a task that lacks them
    runs in an environment someone wrote (a wrapper, a copied ``export``) and ``auto`` would only guess."""
    missing = [f"SLURM_ARRAY_TASK_{name}" for name, value in (("MIN", first), ("MAX", last), ("COUNT", count))
               if value is None]
    if first is None and task < 1:  # a 1-based guess cannot hold task 0 (or below): say what is not there
        raise ConfigError(f"SLURM_ARRAY_TASK_ID={task} is set but {', '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} not, so ++job_index=auto cannot tell where task "
                          f"{task} is in the array (sbatch --array sets them all in every array task). Set them as "
                          f"sbatch --array would (e.g. SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX=N-1 for "
                          f"--array=0-(N-1)), or {explicit}")
    if step < 1:
        raise ConfigError(f"SLURM_ARRAY_TASK_STEP={step} must be 1 or more (--array=A-B:S). Set it, or {explicit}")
    if first is not None and last is not None and last < first:
        raise ConfigError(f"SLURM_ARRAY_TASK_MAX={last} is below SLURM_ARRAY_TASK_MIN={first}: no array runs from "
                          f"{first} to {last}. Make them agree with sbatch --array=MIN-MAX, or {explicit}")
    if count is not None and count < 1:
        raise ConfigError(f"SLURM_ARRAY_TASK_COUNT={count}: an array holds at least one task. Set it to the array's "
                          f"size, or {explicit}")
    if last is not None and task > last:
        raise ConfigError(f"SLURM_ARRAY_TASK_ID={task} is above SLURM_ARRAY_TASK_MAX={last}: the variables do not "
                          f"describe one array. Make them agree with sbatch --array=MIN-MAX, or {explicit}")


def resolve_job(num_jobs: Any = 1, job_index: Any = 1, env: Mapping[str, str] | None = None) -> Job:
    """The :class:`Job` of ``++num_jobs``/``++job_index`` (ints, or ``auto``: the scheduler's array)."""
    env = os.environ if env is None else env
    count = None if str(num_jobs) == "auto" else _as_int("num_jobs", num_jobs)
    index = None if str(job_index) == "auto" else _as_int("job_index", job_index)
    if count is None or index is None:
        found = scheduler_job(env, count)
        if found is None:
            raise ConfigError("++num_jobs=auto / ++job_index=auto read a job array's variables (Slurm "
                              "SLURM_ARRAY_TASK_ID, SGE SGE_TASK_ID, PBS PBS_ARRAY_INDEX, LSF LSB_JOBINDEX), but "
                              "none is set: this is not an array job. Submit it as an array (sbatch --array=1-N), "
                              "or give ++num_jobs=N ++job_index=J.")
        job, scheduler = found
        if job.count <= 0:
            raise ConfigError(f"{scheduler} gives this array task's index ({job.index}) but not the array's size; "
                              f"pass it: ++num_jobs=N ++job_index=auto.")
        if count is not None and count != job.count:
            raise ConfigError(f"++num_jobs={count}, but the {scheduler} array has {job.count} tasks. Make them "
                              f"agree, or pass ++num_jobs=auto.")
        count = job.count
        index = job.index if index is None else index
    if not 1 <= count <= MAX_JOBS:
        raise ConfigError(f"++num_jobs={count} must be in [1, {MAX_JOBS}].")
    if not 1 <= index <= count:
        raise ConfigError(f"++job_index={index} is outside 1..{count}: {CONVENTION} (0 is not a job index). "
                          f"Give ++job_index=1..{count}.")
    return Job(index, count)


def _as_int(name: str, value: Any) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"++{name}={value!r} must be an integer or 'auto' ({CONVENTION}).") from None


def job_of(cfg: Any) -> Job:
    """The job a command's config asks for (``num_jobs``/``job_index``; configs without them: one job)."""
    return resolve_job(getattr(cfg, "num_jobs", 1), getattr(cfg, "job_index", 1))


# --------------------------------------------------------------------------- where parts live


@dataclass(frozen=True)
class Place:
    """Where a command's final output P is and where its part records go."""

    path: str  # P
    tag: str  # the command (add-field: add-field-<field>)
    is_dir: bool  # P is a directory (pack-shards' output_dir): records inside it
    storage_options: dict | None = field(default=None, compare=False, hash=False)  # an s3:// P's (merge-jobs)
    check: str = field(default="stat", compare=False, hash=False)  # merge-jobs' ++check (stat, headers, sha256)

    @property
    def directory(self) -> Path:
        return Path(self.path) if self.is_dir else Path(self.path).parent

    def _prefix(self) -> str:
        return f"{self.tag}." if self.is_dir else f"{Path(self.path).name}.{self.tag}."

    def record(self, job: Job) -> Path:
        return self.directory / f"{self._prefix()}{job.name()}.json"

    def data(self, job: Job) -> Path:
        """The job's own data file (for commands whose P is one file, e.g. scp2jsonl's jsonl slice)."""
        return self.directory / f"{self._prefix()}{job.name()}"

    def is_record(self, name: str) -> bool:
        """Whether the file name ``name`` is a part record of this tag."""
        return re.fullmatch(re.escape(self._prefix()) + r"part-\d{6,}-of-\d{6,}\.json", name) is not None

    def records(self) -> list[Path]:
        """Every part record of this tag here, by name (so by N, then J)."""
        try:
            names = sorted(e.name for e in os.scandir(self.directory) if self.is_record(e.name))
        except FileNotFoundError:
            return []
        return [self.directory / n for n in names]


# --------------------------------------------------------------------------- part records


@dataclass
class Part:
    """One job's record: what it covered, what it wrote, with which options, and its payload."""

    command: str
    tag: str
    num_jobs: int
    job_index: int
    fingerprint: str  # digest of the options and the input: parts of one run share it
    span: list  # [lo, hi) of the command's units
    total: int  # units in all
    outputs: list = field(default_factory=list)  # [{"file" (relative to the record's dir), "bytes", "sha256"}]
    data: dict = field(default_factory=dict)  # command-specific (index entries, stats, summary counts)
    format: int = RECORD_FORMAT
    where: str = ""  # the record's path (not stored)
    lazy: bool = False  # data holds only its "summary": payload() reads the rest again (not stored)

    @property
    def job(self) -> Job:
        return Job(self.job_index, self.num_jobs)

    def payload(self) -> dict:
        """``data``, read again from the record when :func:`load_parts` let it go (memory stays one part's)."""
        return read_part(Path(self.where)).data or {} if self.lazy else self.data or {}


def summary_data(summary: Summary) -> dict:
    """A job's closing counts, as stored in its part record (``data["summary"]``)."""
    return {"kept": summary.kept, "seconds": summary.seconds, "bytes": summary.bytes, "skipped": dict(summary.skipped)}


def merged_summary(parts: list[Part], what: str = "utterances") -> Summary:
    """The counts of all parts, summed (for the merge's closing line)."""
    total = Summary(what=what)
    for part in parts:
        s = (part.data or {}).get("summary", {})
        total.merge(Summary(kept=s.get("kept", 0), seconds=s.get("seconds", 0.0), bytes=s.get("bytes", 0),
                            skipped=Counter(s.get("skipped", {}))))
    return total


def fingerprint(parts: object) -> str:
    """The options' fingerprint of a run (a digest of ``parts``, canonical JSON)."""
    return inputs_digest(["jobs", RECORD_FORMAT, parts])


def files_digest(paths: Iterable[str | os.PathLike]) -> list:
    """``[[name, size, sha256], ...]`` of input files (content, not mtime: nodes may see other mtimes)."""
    return [[os.path.basename(str(p)), os.path.getsize(p), file_sha256(p)] for p in paths]


def output_entry(path: str | os.PathLike, base: str | os.PathLike, *, sha256: str | None = None,
                 size: int | None = None) -> dict:
    """The record entry of an output file (its path relative to ``base``)."""
    return {"file": os.path.relpath(path, base), "bytes": os.path.getsize(path) if size is None else size,
            "sha256": sha256 or file_sha256(path)}


def seal_output(out: dict, path: str | os.PathLike, claims: Any) -> dict:
    """``out`` (an :func:`output_entry`) with what the job that wrote ``path`` can vouch for cheaply: the file's
    ``mtime_ns`` as the job sees it after writing it, and ``seal``, a sha256 binding ``claims`` (what the record
    says of the file, e.g. a shard's index entry: keys, durations) to the file's name, size, sha256 and mtime.
    :func:`sealed` then proves, with one ``stat()``, that the file and the claims are still the job's."""
    out = dict(out, mtime_ns=os.stat(path).st_mtime_ns)
    return dict(out, seal=_seal(out, claims))


def _seal(out: dict, claims: Any) -> str:
    h = hashlib.sha256()
    _digest_into(h, [out.get("file"), out.get("bytes"), out.get("sha256"), out.get("mtime_ns"), claims])
    return h.hexdigest()


def _digest_into(h: Any, value: Any) -> None:
    """Feed JSON-like ``value`` to hash ``h`` canonically (dict keys sorted) and fast: a list of strings (keys) is
    joined, a list of numbers (durations) packed as float64, so a 75,000-part merge does not format 36M floats."""
    if isinstance(value, dict):  # its scalars in one JSON text, then each list or dict by its key
        nested = sorted(k for k, v in value.items() if isinstance(v, (list, dict)))
        h.update(b"{" + json.dumps({k: v for k, v in value.items() if k not in nested}, sort_keys=True).encode())
        for k in nested:
            h.update(json.dumps(k).encode())
            _digest_into(h, value[k])
        h.update(b"}")
    elif isinstance(value, list):
        try:
            h.update(b"[s%d:" % len(value) + "\0".join(value).encode("utf-8", "surrogatepass"))
        except TypeError:
            try:
                h.update(b"[d%d:" % len(value) + array("d", value).tobytes())
            except (TypeError, OverflowError):
                h.update(b"[%d:" % len(value))
                for item in value:
                    _digest_into(h, item)
    else:
        h.update(b"=" + json.dumps(value).encode())


def sealed(out: dict, path: str | os.PathLike, claims: Any) -> bool:
    """Whether ``out``'s :func:`seal_output` still holds: the record's claims are the ones its job sealed, and the
    file at ``path`` has the size and mtime the job saw (one ``stat()``, the file is not opened). False for a
    record of an older version (no seal), an edited record, or a file replaced, rewritten, touched or copied
    without its times since: the caller then reads the file. What it cannot see: a record whose seal was
    recomputed by hand, or a same-size file given back the job's mtime (``touch -d``, ``cp -p`` of another
    shard of the same size); ``merge-jobs ++check=headers``/``sha256`` read the files for that."""
    if not isinstance(out.get("seal"), str) or not isinstance(out.get("mtime_ns"), int):
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_size == out.get("bytes") and st.st_mtime_ns == out["mtime_ns"] and _seal(out, claims) == out["seal"]


def write_part(place: Place, part: Part) -> Path:
    """Write ``part``'s record atomically (last, after its outputs)."""
    path = place.record(part.job)
    stored = {k: v for k, v in asdict(part).items() if k not in ("where", "lazy")}
    with atomic_write(path) as f:
        f.write(json.dumps(stored, ensure_ascii=False) + "\n")  # payload order kept: merges write it
    return path


def read_part(path: Path) -> Part:
    """The record at ``path``, its own fields checked (:func:`check_record`); a DataError naming the record and
    the field when one cannot be trusted."""
    try:
        obj = json.loads(path.read_bytes())
        part = Part(**obj)
        if part.format != RECORD_FORMAT or not isinstance(part.span, list):
            raise TypeError
    except (OSError, ValueError, TypeError) as exc:
        raise DataError(f"part record {path} cannot be read ({type(exc).__name__}): it is damaged or of another "
                        f"corpus-io version. Delete it and rerun that job.") from None
    part.where = str(path)
    try:
        check_record(part)
    except RecordProblem as problem:
        raise DataError(f"part record {path}: {problem}. The record was changed after its job wrote it, or is "
                        f"damaged, so nothing in it is trusted and nothing was changed. Delete it and rerun that "
                        f"job, then merge.") from None
    return part


# --------------------------------------------------------------------------- record checks


class RecordProblem(Exception):
    """A field of a part record that cannot be trusted, said as ``<dotted field name> is <value>, <why>``."""


def bad(name: str, value: Any, want: str) -> RecordProblem:
    """The :class:`RecordProblem` of field ``name`` holding ``value`` (shown shortened), ``want`` saying why."""
    shown = repr(value)
    return RecordProblem(f"{name} is {shown if len(shown) <= 80 else shown[:77] + '...'}, {want}")


def whole(value: Any, name: str, lo: int = 0, hi: int | None = None) -> int:
    """``value`` when it is an int in [lo, hi], else :class:`RecordProblem`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        raise bad(name, value, f"not a whole number in [{lo}, {'inf' if hi is None else hi}]")
    return value


def seconds(value: Any, name: str) -> float:
    """``value`` when it is a finite number >= 0 (seconds), else :class:`RecordProblem`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise bad(name, value, "not a finite number of seconds >= 0")
    return float(value)


def of_type(value: Any, name: str, kind: type, what: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise bad(name, value, f"not {what}")
    return value


def sha256_hex(value: Any, name: str) -> str:
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise bad(name, value, "not a sha256 (64 lowercase hex digits)")
    return value


def inner_path(value: Any, name: str, *, empty: bool = False) -> str:
    """``value`` when it is a relative path that stays inside its base directory (no ``..``, not absolute): a
    record that names ``../x`` would have the merge read or list a file outside the run's place."""
    if not isinstance(value, str) or (not value and not empty) or "\0" in value or os.path.isabs(value) \
            or ".." in value.replace("\\", "/").split("/"):
        raise bad(name, value, "not a relative path inside the record's directory")
    return value


def check_summary(data: dict) -> dict:
    """``data["summary"]`` (:func:`summary_data`): counts >= 0, seconds finite."""
    s = of_type(data.get("summary", {}), "data.summary", dict, "a JSON object")
    whole(s.get("kept", 0), "data.summary.kept")
    seconds(s.get("seconds", 0.0), "data.summary.seconds")
    whole(s.get("bytes", 0), "data.summary.bytes")
    for reason, n in of_type(s.get("skipped", {}), "data.summary.skipped", dict, "a JSON object").items():
        whole(n, f"data.summary.skipped[{reason!r}]")
    return s


def check_record(part: Part) -> None:
    """The fields every record has: its command and tag, N and J (which its file name repeats), its span (the one
    :meth:`Job.span` gives J of N over its total), its outputs (paths inside its directory, sizes, sha256) and its
    summary; :class:`RecordProblem` on the first that cannot be trusted."""
    if part.command not in JOB_COMMANDS:
        raise bad("command", part.command, f"not one of {', '.join(JOB_COMMANDS)}")
    of_type(part.tag, "tag", str, "a string")
    if part.tag != part.command and not part.tag.startswith(part.command + "-"):
        raise bad("tag", part.tag, f"not the tag of {part.command}")
    n = whole(part.num_jobs, "num_jobs", 1, MAX_JOBS)
    j = whole(part.job_index, "job_index", 1, n)
    named = re.search(r"part-(\d+)-of-(\d+)\.json$", part.where)
    if named and (int(named.group(1)), int(named.group(2))) != (j, n):
        raise bad("num_jobs/job_index", [n, j], f"but the record's file name says job "
                                                          f"{int(named.group(1))} of {int(named.group(2))}")
    of_type(part.fingerprint, "fingerprint", str, "a string")
    total = whole(part.total, "total")
    if part.span != list(Job(j, n).span(total)):
        raise bad("span", part.span, f"but job {j} of {n} over {total} units covers "
                                               f"{list(Job(j, n).span(total))}")
    for i, out in enumerate(of_type(part.outputs, "outputs", list, "a list")):
        of_type(out, f"outputs[{i}]", dict, "a JSON object")
        inner_path(out.get("file"), f"outputs[{i}].file")
        whole(out.get("bytes"), f"outputs[{i}].bytes")
        sha256_hex(out.get("sha256"), f"outputs[{i}].sha256")
    check_summary(of_type(part.data, "data", dict, "a JSON object"))


def _outputs_changed(part: Part, *, digest: bool) -> str | None:
    """Why ``part``'s outputs do not match its record (absent, other size, other sha256), or None."""
    base = Path(part.where).parent
    for out in part.outputs:
        path = base / out["file"]
        try:
            size = os.path.getsize(path)
        except OSError:
            return f"its output {path} is absent"
        if size != out["bytes"]:
            return f"its output {path} has {size} bytes, the record says {out['bytes']}"
        if digest and file_sha256(path) != out["sha256"]:
            return f"its output {path} changed since the job wrote it (sha256 differs)"
    return None


def check_place(place: Place, job: Job, fp: str) -> None:
    """Before a job writes anything: refuse a place holding parts of other options, or of another N."""
    for path in place.records():
        part = read_part(path)
        if part.fingerprint != fp:
            raise DataError(f"{path} is a part of a run with other options or another input than this {job} "
                            f"({place.tag}). Nothing was written. Use another output, or delete that run's parts "
                            f"(and its outputs) first.")
        if not job.single and part.num_jobs != job.count:
            raise DataError(f"{path} is a part of a {part.num_jobs}-job run, and this is {job}. Nothing was written. "
                            f"Rerun with ++num_jobs={part.num_jobs}, or delete the {part.num_jobs}-job run's part "
                            f"records first.")


def begin(place: Place, job: Job, fp: str) -> Part | None:
    """The start of a job (or of a one-job run beside parts): :func:`check_place`, then the job's record when
    it proves the job already done (:func:`completed_part`; never for a one-job run)."""
    check_place(place, job, fp)
    return None if job.single else completed_part(place, job, fp)


def started(place: Place, job: Job, fingerprint_of: Callable[[], str]) -> tuple[str, Part | None]:
    """``(fingerprint, record)`` at a job's start: :func:`begin` where there are jobs (this one, or parts beside a
    one-job run), the record when it proves the job done; ``("", None)`` for a one-job run alone (no digest)."""
    if job.single and not place.records():
        return "", None
    fp = fingerprint_of()
    return fp, begin(place, job, fp)


def completed_part(place: Place, job: Job, fp: str) -> Part | None:
    """This job's record when it proves the job done (same options, outputs' size and sha256), else None."""
    path = place.record(job)
    if not path.is_file():
        return None
    part = read_part(path)
    if part.fingerprint != fp or _outputs_changed(part, digest=True):
        return None
    return part


def find_place(path: str, tag: str | None = None) -> Place:
    """The place of P's parts (the tag found beside P when not given); an ``s3://`` P's parts are in its local
    state dir (:func:`corpus_io.storage.files.state_dir`)."""
    p = state_dir(path) if is_object_url(path) else Path(path)
    if p.is_dir():
        candidates = {m.group(1) for e in os.scandir(p)
                      if (m := re.fullmatch(r"(.+)\.part-\d{6,}-of-\d{6,}\.json", e.name))}
        is_dir = True
    else:
        prefix = re.escape(p.name) + r"\.(.+)\.part-\d{6,}-of-\d{6,}\.json"
        directory = p.parent if p.parent.is_dir() else None
        candidates = {m.group(1) for e in (os.scandir(directory) if directory else ())
                      if (m := re.fullmatch(prefix, e.name))}
        is_dir = False
    if tag:
        candidates &= {tag}
    if not candidates:
        raise DataError(f"merge-jobs found no part records for {path}{f' ({tag})' if tag else ''}: run the jobs "
                        f"first (++num_jobs=N ++job_index=1..N with the same ++ options and this output), then "
                        f"merge.")
    if len(candidates) > 1:
        raise ConfigError(f"{path} has parts of several commands ({', '.join(sorted(candidates))}); say which to "
                          f"merge: ++what={sorted(candidates)[0]}")
    return Place(str(p), candidates.pop(), is_dir)


def load_parts(place: Place, *, digest: bool = False,
               keys_of: Callable[[dict], Iterable[str]] | None = None,
               check: Callable[[Part], None] | None = None) -> list[Part]:
    """All parts of one run at ``place``, in job order, after every check of :func:`merge_jobs`: every record's
    fields (:func:`check_record`, and the command's ``check(part)``), one N, one fingerprint, none missing,
    outputs present and unchanged (size; sha256 with ``digest``), and no key (``keys_of(data)``) in two parts.
    The parts come back without their data (:meth:`Part.payload` reads it again), so a 75,000-part merge holds one
    part's keys at a time, plus 8 bytes per key; they keep its summary, and the small dict ``check`` returns (what
    the command's merge needs of the checks without reading the record again)."""
    hashes = array("q")
    parts = []
    on_objects: set[int] = set()  # jobs whose outputs are objects (checked by the command's merge), not files
    for path in place.records():
        part = read_part(path)
        kept = None
        if check is not None:
            try:
                kept = check(part)
            except RecordProblem as problem:
                raise DataError(f"part record {path}: {problem}. The record was changed after its job wrote it, "
                                f"or is damaged, so nothing in it is trusted and nothing was changed. Delete it and "
                                f"rerun job {part.job_index} (++num_jobs={part.num_jobs} "
                                f"++job_index={part.job_index}), then merge.") from None
        if keys_of is not None:
            hashes.extend(map(hash, keys_of(part.data or {})))  # within this process only: str hash is enough
        if (part.data or {}).get("url"):
            on_objects.add(part.job_index)
        part.data, part.lazy = {"summary": (part.data or {}).get("summary", {}), **(kept or {})}, True
        parts.append(part)
    counts = sorted({p.num_jobs for p in parts})
    if len(counts) > 1:
        a = next(p for p in parts if p.num_jobs == counts[0])
        b = next(p for p in parts if p.num_jobs == counts[1])
        raise DataError(f"{place.path} holds parts of two runs: {a.where} ({a.num_jobs} jobs) and {b.where} "
                        f"({b.num_jobs} jobs). Nothing was changed. Delete the part records of the run you "
                        f"abandoned, then merge.")
    n = counts[0]
    by_index = {p.job_index: p for p in parts}
    missing = [j for j in range(1, n + 1) if j not in by_index]
    if missing:
        record = place.record(Job(missing[0], n))
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"part {missing[0]} of {n} is missing{more}: no {record}. Nothing was changed. Run that job "
                        f"(++num_jobs={n} ++job_index={missing[0]}), then merge again.")
    ordered = [by_index[j] for j in range(1, n + 1)]
    usual = Counter((p.fingerprint, p.total) for p in ordered).most_common(1)[0][0]  # the odd part is the stale one
    first = next(p for p in ordered if (p.fingerprint, p.total) == usual)
    for part in ordered:
        if (part.fingerprint, part.total) != usual:
            raise DataError(f"part {part.where} was made with other options or another input than "
                            f"{first.where}. Nothing was changed. Rerun job {part.job_index} with the run's "
                            f"options, then merge.")
        why = None if part.job_index in on_objects else _outputs_changed(part, digest=digest)
        if why:
            raise DataError(f"part {part.where}: {why}. Nothing was changed. Rerun job {part.job_index} "
                            f"(++num_jobs={n} ++job_index={part.job_index}), then merge.")
    if keys_of is not None and hashes:
        _refuse_repeated_keys(ordered, keys_of, hashes)
    return ordered


def _refuse_repeated_keys(parts: list[Part], keys_of: Callable[[dict], Iterable[str]], hashes: Any) -> None:
    """A key held by two parts (or twice by one) is a refusal naming both parts (a second pass, only then)."""
    import numpy as np

    from corpus_io.keys import duplicate_hashes

    wanted = duplicate_hashes(np.frombuffer(hashes, dtype=np.int64), in_place=True)  # order is not needed
    if not wanted:
        return
    owner: dict[str, str] = {}
    for part in parts:
        for key in keys_of(part.payload()):
            if hash(key) in wanted:
                if key in owner:
                    raise DataError(f"key '{key}' is held by two parts: {owner[key]} and {part.where}. Nothing was "
                                    f"changed. The parts are not of one run: delete the stale one and rerun its "
                                    f"job.")
                owner[key] = part.where


#: for an ``s3://`` P (only pack-shards writes object storage): the function that brings the part records the
#: jobs sent to the bucket into this machine's state dir, so jobs that shared no disk merge anywhere
OBJECT_RECORDS = "corpus_io.shards.pack_merge:fetch_part_records"


def merge_jobs(cfg: Any) -> Any:
    """``corpus-io merge-jobs ++path=P``: check the parts of P, then join them (see the module docstring)."""
    storage_options = dict(getattr(cfg, "storage_options", None) or {})
    if is_object_url(str(cfg.path)):
        _function(OBJECT_RECORDS)(str(cfg.path), storage_options)
    level = CHECKS.get(str(getattr(cfg, "check", "stat")), "stat")
    place = replace(find_place(str(cfg.path), getattr(cfg, "what", None) or None), storage_options=storage_options,
                    check=level)
    records = place.records()
    command = read_part(records[0]).command
    if command not in JOB_COMMANDS:
        raise DataError(f"{records[0]} is a part of '{command}', which merge-jobs does not know.")
    _, _, merge, keys, check = JOB_COMMANDS[command]
    parts = load_parts(place, digest=level == "sha256",
                       keys_of=_function(keys) if keys else None, check=_function(check))
    result = _function(merge)(place, parts)
    print(f"[merge-jobs] {len(parts)} parts of {command} -> {place.path}", flush=True)
    return result


def _function(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def run_job(command: str, overrides: list[str], job_index: int, num_jobs: int) -> Any:
    """Run job ``job_index`` of ``num_jobs`` of ``command`` with the CLI's ``++key=value`` ``overrides``
    (composed exactly as ``corpus-io <command>`` composes them). What an executor submits; returns the
    command's result (its Summary)."""
    if command not in JOB_COMMANDS:
        raise ConfigError(f"'{command}' does not run as jobs; these do: {', '.join(JOB_COMMANDS)}.")
    run = JOB_COMMANDS[command][1]
    overrides = [o for o in overrides if not re.match(r"\+*(num_jobs|job_index)=", o)]
    cfg = copy.deepcopy(_composed(command, tuple(overrides), num_jobs))
    cfg.job_index = job_index  # checked against num_jobs by job_of, as compose would
    return _function(run)(cfg)


@functools.lru_cache(maxsize=8)
def _composed(command: str, overrides: tuple[str, ...], num_jobs: int) -> Any:
    """The config of ``command``'s jobs (job 1's; :func:`run_job` sets each job's index on a copy), composed once per
    process: a Dask worker runs many jobs, and one Hydra composition costs about 0.3 s of CPU, held under a lock."""
    from corpus_io import config

    schema_name = JOB_COMMANDS[command][0]
    return config.compose(getattr(config, schema_name), command.replace("-", "_"),
                          [*overrides, f"++num_jobs={num_jobs}", "++job_index=1"])
