"""``merge-jobs`` of ``pack-shards``: the part records of its N jobs checked (:func:`check_part`, before any is
trusted; :func:`part_keys` for the keys two parts hold) and against the shards they name, then each directory's
``data.list`` + ``index.jsonl`` written as one job writes them (:func:`merge_parts`). On object storage: a job's
record sent beside its shards (:func:`publish_record`), the records fetched into the merging machine's state dir
(:func:`fetch_part_records`) and every shard checked to be an object of its recorded size.
"""


from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

from corpus_io.errors import DataError
from corpus_io.jobs.parts import (
    Part,
    Place,
    RecordProblem,
    bad,
    inner_path,
    merged_summary,
    of_type,
    sealed,
    sha256_hex,
    whole,
)
from corpus_io.shards.index import index_entry_problems
from corpus_io.shards.pack_list import withdraw_list, write_list
from corpus_io.storage import objects
from corpus_io.storage.files import (
    atomic_write,
    file_sha256,
    state_dir,
)
from corpus_io.storage.progress import Summary


def publish_record(record: Path, url: str, storage_options: dict) -> None:
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


def absent_object(url: str, parts: list[Part], storage_options: dict | None = None) -> tuple[Part, str] | None:
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
    absent = absent_object(url, parts, storage_options)
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
        write_list(out_dir / sub, first["prefix"], withdraw_list(out_dir / sub / "data.list"), entries, summary,
                    repeated_keys=0,  # load_parts refused any key held twice
                    url=objects.join(url, sub) if url else "", storage_options=options)
    summary.extra["shards"] = sum(len(p.outputs) for p in parts)
    summary.print("pack-shards (merged)")
    return summary
