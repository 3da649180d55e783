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

import os
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
from corpus_io.shards.pack import FORMAT_VERSION, PackOptions, _audio_members
from corpus_io.storage.files import (
    atomic_write,
    ensure_dir,
    file_sha256,
    inputs_digest,
    parse_json_object,
    refuse_overwriting_inputs,
)
from corpus_io.storage.progress import Summary, parallel_imap, resolve_num_workers
from corpus_io.tables.inputs import Skip, open_input
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


def _stat_path(output_dir: str, index: int) -> Path:
    return Path(output_dir) / f".export-{index:06d}.json"


def _digest(task: GroupTask) -> str:
    if task.pieces is not None:  # a group of packed shards: their pieces and each shard's identity
        held = [[p.url, p.first, p.count, p.num_utts, list(p.identity)] for p in task.pieces]
    else:
        held = [{k: len(v) if k == INLINE else v for k, v in r.items() if k != "where"} for r in task.records]
    return inputs_digest(["export", FORMAT_VERSION, task.format, task.split, task.num_files, task.index,
                          task.options.digest_part(), held])


def _completed(task: GroupTask, digest: str) -> dict | None:
    """The stat of group ``task.index`` when its files are there as recorded for this digest, else None."""
    path = _stat_path(task.output_dir, task.index)
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
        raise DataError("the sample has no audio member (a features shard, packed with ++feats=true?); export "
                        "writes audio")
    ext, data, info = _audio_members(record, opts)
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
    with atomic_write(_stat_path(task.output_dir, task.index)) as f:
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
    refuse_overwriting_inputs([("++output_dir", str(cfg.output_dir))], [("++input", str(cfg.input))])
    job = job_of(cfg)
    opts = PackOptions(cfg.audio_format, cfg.resample, False, cfg.on_error, cfg.allow_pipe,
                       {**(cfg.storage_options or {}), "pipe_timeout": float(cfg.pipe_timeout)})
    if is_shard_input(str(cfg.input)):
        inp: Any = ShardInput(str(cfg.input), cfg.storage_options)
    else:
        inp = open_input(cfg.input, columns=dict(cfg.columns or {}), storage_options=cfg.storage_options,
                         inline=False)  # a parquet row's audio is read by the worker that writes it
    total = inp.scan(check_keys=True)
    if total == 0:
        raise DataError(f"{inp.describe} holds no utterances, so there is nothing to export (nothing was written). "
                        f"Check ++input.")
    out_dir = str(ensure_dir(cfg.output_dir, what="output_dir").resolve())
    num_files = -(-total // cfg.num_utts_per_file)
    lo, hi = job.span(num_files)
    place = Place(out_dir, "export", True)
    fp = fingerprint(["export", FORMAT_VERSION, cfg.format, cfg.split, cfg.num_utts_per_file, opts.digest_part(),
                      cfg.on_error, dict(cfg.columns or {}),
                      inp.identity() if isinstance(inp, ShardInput) else files_digest(getattr(inp, "files", []))])
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
