"""``corpus-io export ++format=hf-parquet|lhotse-shar ++input=<any input> ++output_dir=DIR``: any input of
:mod:`corpus_io.tables.inputs`, or packed shards (a shard data.list, local or at a URL, a shard directory, a WeNet
``.tar.gz`` list: :mod:`corpus_io.shards.listed`), written in another toolkit's format.

The input's utterances, in input order, are cut into groups of ``num_utts_per_file`` by their position (a row or
line that is skipped leaves its group one smaller), and each group is handed to the format's writer
(:data:`FORMATS`), which writes that group's files. The audio is the stored bytes, copied (never re-encoded),
unless ``audio_format``/``resample`` ask for it or the utterance is a segment of a longer recording (cut and
written as WAV, or as ``audio_format``).

The writer contract (a format is one entry of :data:`FORMATS`, a ``"module:function"`` imported when used)::

    write(items: list[dict], output_dir: str, index: int, num_files: int, *, split: str) -> list[str]

writes group ``index`` (0-based, of ``num_files``) of the ``split`` under ``output_dir`` and returns the paths
it wrote, relative to ``output_dir``. Each file is written atomically (a temp name, then renamed) and its bytes
depend only on ``items`` (no time stamps, no random names). An item is one utterance::

    {"key": str, "audio": bytes (a whole audio file), "audio_format": "wav" | "flac" | "ogg" | "opus" | "mp3",
     "text": str, "sample_rate": int (Hz), "num_samples": int, "duration": float (seconds),
     "speaker": str | None, "fields": dict (the record's other JSON scalar fields, e.g. language)}

Resumable and deterministic: a hidden ``.export-NNNNNN.json`` beside the files records the digest of each group's
input and the size and sha256 of its files; a rerun keeps a group whose record matches. With ``++num_jobs=N``
each job writes its range of groups and a part record; ``merge-jobs ++path=DIR`` checks that every group is
there (nothing else to write: the files are the output).
"""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from corpus_io.config import check_values
from corpus_io.errors import ConfigError, DataError
from corpus_io.jobs.parts import (
    Part,
    Place,
    begin,
    check_place,
    files_digest,
    fingerprint,
    job_of,
    merged_summary,
    of_type,
    output_entry,
    summary_data,
    whole,
    write_part,
)
from corpus_io.shards.listed import ShardInput, is_shard_input, piece_records
from corpus_io.shards.pack_worker import FORMAT_VERSION, PackOptions, audio_members
from corpus_io.storage.files import (
    atomic_write,
    ensure_dir,
    file_sha256,
    inputs_digest,
    is_url,
    parse_json_object,
    refuse_non_directory,
    refuse_overwriting_inputs,
    refuse_remote_output,
)
from corpus_io.storage.progress import Summary, parallel_imap, resolve_num_workers
from corpus_io.tables.inputs import Skip, open_input, resolve_input, walk_once
from corpus_io.tables.parquet import INLINE

#: format -> its writer (see the module docstring for the contract)
FORMATS: dict[str, str] = {
    "hf-parquet": "corpus_io.tables.parquet:write_hf_group",
    "lhotse-shar": "corpus_io.tables.shar:write_shar_group",
}
_NOT_FIELDS = {"key", "source", "target", "source_len", "target_len", "start", "end", "speaker", "where", INLINE,
               "duration", "sample_rate", "num_samples"}


@dataclass
class GroupTask:
    index: int
    records: list[dict]
    output_dir: str
    num_files: int
    format: str
    split: str
    options: PackOptions
    pieces: list | None = None  # packed shards: the pieces the worker reads (corpus_io.shards.listed), no records


def _writer(name: str) -> Callable[..., list[str]]:
    import importlib

    module, _, function = FORMATS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def _stat_path(output_dir: str, index: int, split: str) -> Path:
    return Path(output_dir) / f".export-{split}-{index:06d}.json"


#: a split name: Hugging Face's (``datasets.NamedSplit``: word characters, dots between them); a Shar split is a
#: directory name and may hold ``-`` too (``dev-clean``). Neither can hold a ``/`` or be ``..``.
_SPLITS = {"hf-parquet": re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*"),
           "lhotse-shar": re.compile(r"[A-Za-z0-9_]+([.-][A-Za-z0-9_]+)*")}


def _check_split(cfg: Any) -> None:
    split = str(cfg.split)
    if not _SPLITS[cfg.format].fullmatch(split):
        extra, role = (("", "the file name prefix under data/ that Hugging Face reads") if cfg.format == "hf-parquet"
                       else (", dashes", "the directory <output_dir>/<split>"))
        raise ConfigError(f"++split={split!r} is not a split name: use letters, digits, _{extra} and single dots "
                          f"between them (no '/', no '..'), e.g. train, dev_clean or test.other; it names {role}. "
                          f"Nothing was written.")


def final_dir(output_dir: str | os.PathLike, fmt: str, split: str) -> Path:
    """Where export's files of ``split`` go: ``data/`` (hf-parquet) or ``<split>/`` (lhotse-shar) in output_dir."""
    return Path(output_dir) / ("data" if fmt == "hf-parquet" else split)


def split_files(output_dir: str | os.PathLike, fmt: str, split: str) -> list[Path]:
    """The files of ``split`` in output_dir now: the parquet files named for it, or every file of its Shar
    directory (``CutSet.from_shar`` reads them all), and export's records of it."""
    out, final = Path(output_dir), final_dir(output_dir, fmt, split)
    if fmt == "hf-parquet":
        mine = sorted(final.glob(f"{glob.escape(split)}-*.parquet")) if final.is_dir() else []
    else:
        mine = sorted(p for p in final.iterdir()) if final.is_dir() else []
    return mine + sorted(out.glob(f".export-{glob.escape(split)}-[0-9]*.json"))


def _input_paths(inp: Any, given: str) -> list[str]:
    """The local paths the input is read from (URLs left out): what was given (a glob: its fixed directory), its
    files, and the shards a list names."""
    paths = [given if not glob.has_magic(given) else os.path.dirname(given.split("*")[0].split("?")[0].split("[")[0])]
    paths += [str(f) for f in getattr(inp, "files", []) or []]
    paths += list(getattr(inp, "urls", []) or [])
    return [p[len("file://"):] if p.startswith("file://") else p for p in paths if p and not is_url(p)
            or p.startswith("file://")]


def _refuse_output_in_input(cfg: Any, inp: Any) -> None:
    """An output that is the input, inside it, or holding it (output_dir and the final directory of the split, as
    real paths) is a ConfigError, before anything is written."""
    out = os.path.realpath(str(cfg.output_dir))
    final = os.path.realpath(final_dir(out, cfg.format, cfg.split))

    def inside(a: str, b: str) -> bool:  # a is b or under it
        return a == b or a.startswith(b.rstrip(os.sep) + os.sep)

    for given in _input_paths(inp, str(cfg.input)):
        real = os.path.realpath(given)
        for name, path, holding in (("++output_dir", out, False), (f"the {cfg.split} files' directory", final, True)):
            how = ("is the input" if real == path else "is inside the input" if inside(path, real) else
                   "holds the input" if holding and inside(real, path) else None)
            if how:
                raise ConfigError(f"{name} ({path}) {how} ({given}): export would write among the files it reads, "
                                  f"mixing its output into the input or replacing it. Nothing was written. Give "
                                  f"++output_dir a directory outside the input (and not above it).")


def _marker_path(output_dir: str, split: str) -> Path:
    return Path(output_dir) / f".export-{split}.json"


def _claim_split(cfg: Any, out_dir: str, fp: str, input_digest: str, num_files: int) -> None:
    """Under a lock on output_dir: refuse an output_dir whose split holds another input's export (or this input's
    with other options), unless ``++replace=true``, which first removes that export's files (each renamed into a
    hidden directory, then deleted); then record this run (``.export-<split>.json``) and remove files of the split
    this run does not write (an interrupted replacement's rest). Nothing of the old export stays beside the new.
    Not one atomic swap: the old files leave before the new ones are written, so a run killed in between leaves
    part of the new export (resumed by a rerun) and the hidden directory, which the next run deletes."""
    import fcntl
    import json
    import shutil

    marker = _marker_path(out_dir, cfg.split)
    trash = Path(out_dir) / f".export-{cfg.split}.replaced"
    with open(Path(out_dir) / f".export-{cfg.split}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if trash.is_dir():  # a replacement killed before it deleted them: the replaced export's files
            shutil.rmtree(trash)
        try:
            old = parse_json_object(marker.read_bytes(), str(marker), "")
        except FileNotFoundError:
            old = None
        except DataError:
            old = {}
        present = split_files(out_dir, cfg.format, cfg.split)
        if (old is None and present) or (old is not None and old.get("fingerprint") != fp):
            if old is None:
                what = f"holds {len(present)} {cfg.split} file(s) that export did not record (e.g. {present[0]})"
            elif old.get("input_digest") != input_digest:
                what = f"holds the {cfg.split} export of another input ({old.get('input', '?')})"
            else:
                what = f"holds a {cfg.split} export of this input made with other options"
            if not cfg.replace:
                raise ConfigError(f"++output_dir={out_dir} {what}; writing beside it would mix the two. Nothing "
                                  f"was written. Give another ++output_dir (or ++split), or pass ++replace=true to "
                                  f"remove that export's files first.")
            trash.mkdir()
            for i, path in enumerate(present):
                os.replace(path, trash / f"{i:06d}-{path.name}")
            for part in Place(out_dir, "export", True).records():
                os.replace(part, trash / part.name)
            with atomic_write(marker) as f:
                f.write(json.dumps({"input": str(cfg.input), "input_digest": input_digest, "fingerprint": fp},
                                   sort_keys=True) + "\n")
            shutil.rmtree(trash)
        elif old is None:
            with atomic_write(marker) as f:
                f.write(json.dumps({"input": str(cfg.input), "input_digest": input_digest, "fingerprint": fp},
                                   sort_keys=True) + "\n")
        wanted = {final_dir(out_dir, cfg.format, cfg.split) / n for i in range(num_files)
                  for n in _names(cfg.format, cfg.split, i, num_files)}
        wanted |= {_stat_path(out_dir, i, cfg.split) for i in range(num_files)}
        for path in split_files(out_dir, cfg.format, cfg.split):
            if path not in wanted and not path.name.startswith("."):
                path.unlink()


def _names(fmt: str, split: str, index: int, num_files: int) -> list[str]:
    """The names group ``index`` writes in :func:`final_dir` (the writers' contract, by format)."""
    if fmt == "hf-parquet":
        return [f"{split}-{index:05d}-of-{num_files:05d}.parquet"]
    return [f"recording.{index:06d}.tar", f"cuts.{index:06d}.jsonl.gz"]


def _digest(task: GroupTask) -> str:
    if task.pieces is not None:  # a group of packed shards: their pieces and each shard's identity
        held = [[p.url, p.first, p.count, p.num_utts, list(p.identity)] for p in task.pieces]
    else:
        held = [{k: len(v) if k == INLINE else v for k, v in r.items() if k != "where"} for r in task.records]
    return inputs_digest(["export", FORMAT_VERSION, task.format, task.split, task.num_files, task.index,
                          task.options.digest_part(), held])


def _completed(task: GroupTask, digest: str) -> dict | None:
    """The stat of group ``task.index`` when its files are there as recorded for this digest, else None."""
    path = _stat_path(task.output_dir, task.index, task.split)
    try:
        stat = parse_json_object(path.read_bytes(), str(path), "")
        if stat.get("digest") != digest:
            return None
        for entry in stat["files"]:
            file = Path(task.output_dir) / entry["file"]
            if os.path.getsize(file) != entry["bytes"] or file_sha256(file) != entry["sha256"]:
                return None
        return stat
    except (OSError, ValueError, KeyError, TypeError, AttributeError, DataError):
        return None


def item_of(record: dict, opts: PackOptions) -> dict:
    """The writer's item of one record (see the module docstring); a DataError for audio that cannot be read."""
    if INLINE in record and record[INLINE] is None:
        raise DataError("the sample has no audio member (a features shard, packed by pack-shards with feats=true?); "
                        "export writes audio")
    ext, data, info = audio_members(record, opts)
    if record.get("target") is None:
        raise DataError("no transcript ('target' / 'txt' field or a line in text)")
    fields = {k: v for k, v in record.items() if k not in _NOT_FIELDS and isinstance(v, (str, int, float, bool))}
    speaker = record.get("speaker")
    return {"key": str(record["key"]), "audio": data, "audio_format": ext, "text": str(record["target"]),
            "sample_rate": int(info["sample_rate"]), "num_samples": int(info["num_samples"]),
            "duration": float(info["duration"]), "speaker": None if speaker is None else str(speaker),
            "fields": fields}


def export_group(task: GroupTask) -> dict:
    """Write one group's files (or keep them when complete for this input); runs in a worker process. Returns its
    stat: ``files`` ([{file, bytes, sha256}]), ``kept``, ``seconds``, ``skipped``, ``keys``, ``resumed``."""
    digest = _digest(task)
    done = _completed(task, digest)
    if done is not None:
        return dict(done, resumed=True)
    items, skipped = [], Counter()
    for record in _records(task, skipped):
        try:
            items.append(item_of(record, task.options))
        except DataError as exc:
            if task.options.on_error == "fail":
                raise DataError(f"{record.get('where', '?')}: key '{record['key']}': {str(exc).rstrip('.')}. Fix "
                                f"the input, or pass ++on_error=skip to drop such utterances (they are "
                                f"counted).") from None
            reason = "missing transcript" if "transcript" in str(exc) else "unreadable audio"
            skipped[reason] += 1
    names = _writer(task.format)(items, task.output_dir, task.index, task.num_files, split=task.split) if items \
        else []
    files = [output_entry(Path(task.output_dir) / n, task.output_dir) for n in names]
    stat = {"digest": digest, "files": files, "kept": len(items), "seconds": sum(i["duration"] for i in items),
            "skipped": dict(skipped), "keys": [i["key"] for i in items]}
    with atomic_write(_stat_path(task.output_dir, task.index, task.split)) as f:
        import json

        f.write(json.dumps(stat, sort_keys=True) + "\n")
    return dict(stat, resumed=False)


def _records(task: GroupTask, skipped: Counter) -> Iterator[dict]:
    """The group's records: held by the task, or read from its pieces of packed shards."""
    if task.pieces is None:
        yield from task.records
        return
    opts = task.options
    storage = {k: v for k, v in opts.storage_options.items() if k != "pipe_timeout"}
    for piece in task.pieces:
        yield from piece_records(piece, skipped, storage_options=storage, allow_pipe=opts.allow_pipe,
                                 on_error=opts.on_error)


def _shard_groups(inp: ShardInput, cfg: Any, lo: int, hi: int, output_dir: str, num_files: int, total: int,
                  opts: PackOptions) -> Iterator[GroupTask]:
    """The tasks of groups ``lo..hi-1`` of packed shards: each names its pieces, read by the worker."""
    per = cfg.num_utts_per_file
    for group in range(lo, hi):
        yield GroupTask(group, [], output_dir, num_files, cfg.format, cfg.split, opts,
                        pieces=inp.pieces(group * per, min((group + 1) * per, total)))


def _groups(inp: Any, cfg: Any, lo: int, hi: int, output_dir: str, num_files: int, opts: PackOptions,
            summary: Summary) -> Iterator[GroupTask]:
    """The tasks of groups ``lo..hi-1``: the records at input positions ``[g * n, (g + 1) * n)`` of each."""
    per = cfg.num_utts_per_file
    group, batch, position = lo, [], lo * per
    for rec in inp.records(False, 0, lo * per):
        if position // per != group:
            yield GroupTask(group, batch, output_dir, num_files, cfg.format, cfg.split, opts)
            group, batch = position // per, []
        if group >= hi:
            return
        position += 1
        if isinstance(rec, Skip):
            if cfg.on_error == "fail":
                raise DataError(f"{rec.where}: {rec.what} ({inp.describe}). Fix the input, or pass "
                                f"++on_error=skip to drop such utterances (they are counted).")
            summary.skip(rec.reason)
            continue
        batch.append(rec)
    if group < hi:
        yield GroupTask(group, batch, output_dir, num_files, cfg.format, cfg.split, opts)


def export(cfg: Any) -> Summary:
    """Run ``export`` for a validated :class:`corpus_io.config.ExportConfig`; returns the summary."""
    check_values(cfg)
    if cfg.format not in FORMATS:
        raise ConfigError(f"++format={cfg.format} is not a format export writes; choose one of "
                          f"{', '.join(FORMATS)}.")
    _check_split(cfg)
    refuse_remote_output(cfg.output_dir, "++output_dir", "export")
    refuse_overwriting_inputs([("++output_dir", str(cfg.output_dir))], [("++input", str(cfg.input))])
    job = job_of(cfg)
    opts = PackOptions(cfg.audio_format, cfg.resample, False, cfg.on_error, cfg.allow_pipe,
                       {**(cfg.storage_options or {}), "pipe_timeout": float(cfg.pipe_timeout)})
    tree = walk_once(str(cfg.input))  # a directory's one walk: the shard check and the input's kind read it
    if is_shard_input(str(cfg.input), tree):
        inp: Any = ShardInput(str(cfg.input), cfg.storage_options)
    else:
        # inline=False: a parquet row's audio is read by the worker that writes it
        inp = open_input(resolve_input(str(cfg.input), tree), columns=dict(cfg.columns or {}),
                         storage_options=cfg.storage_options, inline=False)
    total = inp.scan(check_keys=True)
    _refuse_output_in_input(cfg, inp)
    if total == 0:
        raise DataError(f"{inp.describe} holds no utterances, so there is nothing to export (nothing was written). "
                        f"Check ++input.")
    refuse_non_directory(cfg.output_dir, what="output_dir")
    num_files = -(-total // cfg.num_utts_per_file)
    lo, hi = job.span(num_files)
    held = inp.identity() if isinstance(inp, ShardInput) else files_digest(getattr(inp, "files", []))
    input_digest = inputs_digest([inp.kind, held])
    fp = fingerprint(["export", FORMAT_VERSION, cfg.format, cfg.split, cfg.num_utts_per_file, opts.digest_part(),
                      cfg.on_error, dict(cfg.columns or {}), held])
    out_dir = str(Path(cfg.output_dir).resolve())
    place = Place(out_dir, "export", True)
    if Path(out_dir).is_dir() and place.records() and not cfg.replace:
        check_place(place, job, fp)  # before the split is claimed: another run's part records are refused
    out_dir = str(ensure_dir(cfg.output_dir, what="output_dir").resolve())
    _claim_split(cfg, out_dir, fp, input_digest, num_files)
    if not job.single or place.records():
        done = begin(place, job, fp)
        if done is not None:
            summary = merged_summary([done])
            summary.print(f"export {job} (already complete)")
            return summary
    summary = Summary(what="utterances")
    tasks = _shard_groups(inp, cfg, lo, hi, out_dir, num_files, total, opts) if isinstance(inp, ShardInput) \
        else _groups(inp, cfg, lo, hi, out_dir, num_files, opts, summary)
    workers = max(1, min(resolve_num_workers(cfg.num_workers), hi - lo))
    outputs, keys, resumed = [], [], 0
    for stat in parallel_imap(export_group, tasks, num_workers=workers, chunksize=1):
        summary.kept += stat["kept"]
        summary.seconds += stat["seconds"]
        for reason, n in stat["skipped"].items():
            summary.skip(reason, n)
        outputs += [dict(e) for e in stat["files"]]
        keys += stat["keys"]
        resumed += bool(stat["resumed"])
    summary.extra["files"] = len(outputs)
    summary.extra["resumed"] = resumed
    if not job.single:
        write_part(place, Part("export", place.tag, job.count, job.index, fp, [lo, hi], num_files, outputs,
                               {"summary": summary_data(summary), "keys": keys}))
    summary.print(f"export {cfg.format}" + ("" if job.single else f" {job}"))
    summary.raise_if_empty("export", f"Nothing was written to {out_dir}: check {cfg.input} and the skip reasons "
                                     f"above.")
    return summary


def part_keys(data: dict) -> Iterator[str]:
    """The utterance keys of an export part (merge-jobs refuses a key two parts hold)."""
    return iter(data.get("keys") or ())


def check_part(part: Part) -> None:
    """merge-jobs: an export record's fields before any is trusted (its keys, a list of strings)."""
    keys = of_type(part.data.get("keys", []), "data.keys", list, "a list")
    whole(len(keys), "data.keys")


def merge_parts(place: Place, parts: list[Part]) -> Summary:
    """``merge-jobs`` of export: every group's files are checked by :func:`corpus_io.jobs.parts.load_parts`; the
    files are the output, so nothing else is written."""
    summary = merged_summary(parts)
    summary.extra["files"] = sum(len(p.outputs) for p in parts)
    summary.print("export (merged)")
    return summary
