"""JSONL manifests: reading, field names (FunASR and WeNet), ``scp2jsonl`` and ``jsonl2scp``.

A manifest line is one utterance. FunASR names its fields ``key``, ``source``,
``source_len``, ``target``, ``target_len``; WeNet's raw lists use ``key``,
``wav``, ``txt`` (+ ``start``/``end`` in seconds). Both are accepted everywhere;
:func:`canonical` maps a line to FunASR names.
"""

from __future__ import annotations

import json
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from corpus_io.audio import io as audio
from corpus_io.errors import ConfigError, DataError
from corpus_io.jobs import parts as jobs
from corpus_io.keys import duplicate_hashes, first_repeated_key, key_hash, one_token, recording_id, speaker_id
from corpus_io.storage import files, urls
from corpus_io.storage.files import atomic_write, iter_raw_lines, parse_json_object
from corpus_io.storage.progress import Summary, WorkerState, parallel_imap, progress, resolve_num_workers
from corpus_io.tables import kaldi

WENET_TO_FUNASR = {"wav": "source", "txt": "target"}


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class ManifestLine:
    record: dict
    path: str
    lineno: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


def iter_jsonl(path: str | os.PathLike) -> Iterator[ManifestLine]:
    """Stream the objects of a JSONL file; blank lines are skipped, bad lines name file:line."""
    path = str(path)
    for lineno, raw in iter_raw_lines(path, what="manifest"):
        if not raw.strip():
            continue
        record = parse_json_object(raw, f"{path}:{lineno}", "Each line must be one JSON object, in UTF-8.")
        yield ManifestLine(record, path, lineno)


def canonical(record: dict, where: str = "") -> dict:
    """FunASR field names (``source``/``target``) for a FunASR or WeNet line; requires ``key`` and ``source``."""
    out = {WENET_TO_FUNASR.get(k, k): v for k, v in record.items()}
    if "key" not in out or "source" not in out:
        raise DataError(f"{where}: a line needs 'key' and 'source' (FunASR) or 'wav' (WeNet); "
                        f"it has {sorted(record)}.")
    out["key"] = key = line_key(out["key"], where)
    check_id_fields(out, f"{where}: key '{key}'")
    for name, (kind, unit) in _NUMBER_FIELDS.items():
        if out.get(name) is not None:
            out[name] = _number(out[name], kind, f"{where}: key '{key}': {name}", unit)
    start, end = out.get("start"), out.get("end")
    if (start is not None and start < 0) or (end is not None and end >= 0 and end <= (start or 0.0)):
        raise DataError(f"{where}: key '{key}': start {start} and end {end} s are not a segment; need 0 <= start "
                        f"< end (end -1: to the end of the recording). Fix the times.")
    for name in ("source_len", "target_len"):
        if out.get(name) is not None and out[name] < 0:
            raise DataError(f"{where}: key '{key}': {name} is {out[name]}, below 0. Fix the line, or drop the field "
                            f"to have it computed.")
    return out


#: a line's fields that name a speaker or recording, each a field of its own in the tables written from them
#: (utt2spk and spk2utt; segments, decode's CTM): checked as keys are (corpus_io.keys.one_token)
ID_FIELDS = {"speaker": speaker_id, "recording": recording_id, "recording_id": recording_id}


def check_id_fields(record: dict, where: str) -> None:
    """A DataError naming ``where`` and the field when a speaker or recording field of ``record`` (:data:`ID_FIELDS`)
    is not one token: empty, or holding whitespace or a control character. An integer id is taken as its digits."""
    for name, check in ID_FIELDS.items():
        value = record.get(name)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise DataError(f"{where}: '{name}' is {json.dumps(value, ensure_ascii=False)}, not a string; a "
                            f"{name} is one word naming it (e.g. \"spk1\"). Fix the line.")
        check(value, f"{where}: '{name}'")


def line_key(key: Any, where: str) -> str:
    """A line's ``key`` as a string: a non-empty string, or an integer id (its digits); anything else (null, a
    number with a fraction, a list, "") is a DataError naming the line."""
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    if not isinstance(key, str) or not key.strip():
        what = f"key '{key}' is empty" if isinstance(key, str) else \
            f"'key' is {json.dumps(key, ensure_ascii=False)}, not a string"
        raise DataError(f"{where}: {what}; every utterance needs its own non-empty key, e.g. \"spk1-utt001\" (it "
                        f"names the utterance in shards, tables and reports). Fix the line.")
    return one_token(key, where)


# numeric fields of a line: (type, unit); a numeric string is accepted, anything else is a DataError
_NUMBER_FIELDS = {"source_len": (int, "10 ms frames"), "target_len": (int, "tokens"),
                  "start": (float, "seconds"), "end": (float, "seconds, negative: to the end")}


def _number(value: Any, kind: type, what: str, unit: str) -> int | float:
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        number = float(value)
        if number != number or number in (float("inf"), float("-inf")) or (kind is int and number != int(number)):
            raise ValueError
        return int(number) if kind is int else number
    except ValueError:
        raise DataError(f"{what} is {value!r}, not a{'n integer' if kind is int else ' number'} ({unit}). Fix the "
                        f"line, or drop the field to have it computed.") from None


def target_len(text: str) -> int:
    """FunASR's rule: whitespace tokens if the text contains a space, else characters."""
    return len(text.split()) if " " in text else len(text)


# --------------------------------------------------------------------------- scp2jsonl


def _is_audio_field(name: str, path: str) -> bool:
    return name == "source" or Path(path).name.endswith("wav.scp")


@dataclass
class _Task:
    key: str
    values: dict[str, str]  # the driving table's own value, if it is one of the fields
    lookups: dict[str, str]  # field -> the key it is looked up by in that field's KeyedTable
    names: tuple[str, ...]  # output field order
    audio_fields: tuple[str, ...]
    where: str
    segment: tuple[float, float] | None = None
    allow_pipe: bool = False
    storage_options: dict = field(default_factory=dict)
    recording: str | None = None  # a segment's recording id (decode's CTM names it)


@dataclass
class _Result:
    key: str
    line: str | None  # the JSONL line, None when skipped
    seconds: float = 0.0
    error: str | None = None  # unreadable audio; None with line None: a key missing from a table
    empty: str | None = None  # the text field that is empty (only with ++on_empty_text=skip)


# The joined tables of this process: workers do the lookups (each reopens the table files), so the main
# process only streams keys and writes lines. Set by _use_tables, the workers' parallel_imap initializer.
_KEYED = WorkerState()  # .values: name -> kaldi.KeyedTable, per thread when inline (jobs side by side in a Dask worker)


def _use_tables(keyed: dict[str, kaldi.KeyedTable]) -> None:
    _KEYED.values = dict(keyed)


def _probe_task(task: _Task) -> _Result:
    values = dict(task.values)
    for name, lookup in task.lookups.items():
        value = _KEYED.values[name].get(lookup)
        if value is None:
            return _Result(task.key, None)
        values[name] = value
    record: dict[str, Any] = {"key": task.key}
    seconds = 0.0
    for name in task.names:
        value = values[name]
        if name in task.audio_fields:
            try:
                info = audio.probe(value, allow_pipe=task.allow_pipe, storage_options=task.storage_options)
            except DataError as exc:
                return _Result(task.key, None, error=f"{task.where}: key '{task.key}': {exc}")
            if task.segment is not None:
                try:
                    first, last = audio.segment_samples(*task.segment, info.sample_rate, info.num_samples)
                except DataError as exc:
                    return _Result(task.key, None, error=f"{task.where}: segment '{task.key}' of {value}: {exc}")
                num_samples = last - first
            else:
                num_samples = info.num_samples
            record[name] = value
            if task.segment is not None and name == task.audio_fields[0]:
                record["start"], record["end"] = task.segment
                record["recording"] = task.recording
            record[f"{name}_len"] = audio.frames_10ms(num_samples, info.sample_rate)
            seconds = max(seconds, num_samples / info.sample_rate)
        else:
            if not value.strip():  # only reachable with ++on_empty_text=skip (else the table refused it)
                return _Result(task.key, None, empty=name)
            record[name] = value
            record[f"{name}_len"] = target_len(value)
    return _Result(task.key, json.dumps(record, ensure_ascii=False) + "\n", seconds)


def _check_lists(cfg: Any) -> None:
    if not cfg.scp_file_list:
        raise ConfigError("scp2jsonl needs ++scp_file_list='[\"wav.scp\",\"text\"]'.")
    if len(cfg.scp_file_list) != len(cfg.data_type_list):
        raise ConfigError(f"scp_file_list has {len(cfg.scp_file_list)} files but data_type_list has "
                          f"{len(cfg.data_type_list)} names; give one name per file, e.g. "
                          f"++data_type_list='[\"source\",\"target\"]'.")
    if len(set(cfg.data_type_list)) != len(cfg.data_type_list):
        raise ConfigError(f"data_type_list {list(cfg.data_type_list)} repeats a name.")
    if cfg.jsonl_file_out in ("", "???"):
        raise ConfigError("scp2jsonl needs ++jsonl_file_out=train.jsonl.")


def _missing_message(missing: dict[str, list[str]], counts: dict[str, int], what: str) -> str:
    parts = []
    for where, keys in missing.items():
        shown = ", ".join(keys)
        more = f" (and {counts[where] - len(keys)} more)" if counts[where] > len(keys) else ""
        parts.append(f"{counts[where]} key(s) {what} {where}: {shown}{more}")
    return "; ".join(parts)


def _bad_audio_message(errors: list[str], count: int) -> str:
    more = f" (and {count - len(errors)} more)" if count > len(errors) else ""
    return (f"{count} utterance(s) have unreadable audio{more}: {' '.join(errors)} Fix or remove those entries, "
            f"or pass ++on_error=skip to drop them (they are counted).")


_DROP_HINT = ("Or let scp2jsonl drop and count such lines: ++on_duplicate=skip (keeps the first line of a key), "
              "++on_empty_text=skip.")


def _first_lines(items: Iterable[tuple[str, Any]], repeated: set[int], dropped: list[int]) -> Iterator[tuple[str, Any]]:
    """``(key, item)`` pairs with the later lines of a repeated key left out (counted in ``dropped[0]``);
    ``repeated`` holds the :func:`kaldi.key_hash` of every repeated key, so only those keys are remembered."""
    seen: set[str] = set()
    for key, item in items:
        if repeated and kaldi.key_hash(key) in repeated:
            if key in seen:
                dropped[0] += 1
                continue
            seen.add(key)
        yield key, item


def scp2jsonl(cfg: Any) -> Summary:
    """Join Kaldi tables into a FunASR JSONL by header probing; returns the job summary.

    With ``++num_jobs=N`` (N > 1) this is one job (corpus_io.jobs.parts): it probes its range of the driving
    table's lines (split_scp.pl's even split) into ``<jsonl_file_out>.scp2jsonl.part-J-of-N`` plus a part
    record; ``merge-jobs ++path=<jsonl_file_out>`` concatenates the parts into the one-job jsonl."""
    _check_lists(cfg)
    job = jobs.job_of(cfg)
    names = list(cfg.data_type_list)
    paths = [str(p) for p in cfg.scp_file_list]
    files.refuse_remote_output(cfg.jsonl_file_out, "++jsonl_file_out", "scp2jsonl")
    files.refuse_overwriting_inputs([("++jsonl_file_out", cfg.jsonl_file_out)],
                              [*((f"++scp_file_list entry {i}", p) for i, p in enumerate(paths, 1)),
                               ("++segments", cfg.segments)])
    audio_fields = tuple(n for n, p in zip(names, paths) if _is_audio_field(n, p))
    for p in paths + ([cfg.segments] if cfg.segments else []):
        if not os.path.isfile(p):
            urls.check_regular_file(p)  # a FIFO or a device: say so, not "does not exist"
            raise DataError(f"table {p} does not exist. Check ++scp_file_list / ++segments.")
    place = jobs.Place(str(cfg.jsonl_file_out), "scp2jsonl", False)
    fp = ""
    if not job.single or place.records():
        fp = jobs.fingerprint(["scp2jsonl", names, jobs.files_digest(paths + ([cfg.segments] if cfg.segments else [])),
                          cfg.on_error, cfg.on_empty_text, cfg.on_duplicate])
        done = jobs.begin(place, job, fp)
        if done is not None:
            summary = jobs.merged_summary([done])
            summary.print(f"scp2jsonl {job} (already complete)")
            return summary
    skip_empty = cfg.on_empty_text == "skip"
    skip_duplicates = cfg.on_duplicate == "skip"

    def table(name: str, path: str) -> kaldi.KeyedTable:
        return kaldi.KeyedTable(path, allow_empty_value=skip_empty and name not in audio_fields,
                                keep_first=skip_duplicates, hint=_DROP_HINT)

    # The driving stream: the first table, or segments (whose recordings index wav.scp).
    if cfg.segments:
        driver_path = cfg.segments
        keyed = {n: table(n, p) for n, p in zip(names, paths)}
        recording_fields = set(audio_fields)
    else:
        driver_path = paths[0]
        keyed = {n: table(n, p) for n, p in zip(names[1:], paths[1:])}
        recording_fields = set()
    driver_empty_ok = skip_empty and not cfg.segments and names[0] not in audio_fields
    summary = Summary()

    def driver_lines() -> Iterator[tuple[str, Any]]:
        if cfg.segments:
            for seg in kaldi.iter_segments(driver_path):
                yield seg.key, seg
        else:
            for line in kaldi.iter_table(driver_path, allow_empty_value=driver_empty_ok):
                yield line.key, line

    # ++on_duplicate=skip: the repeated keys of the driver (hashes only), so both passes keep first lines only
    repeated: set[int] = set()
    if skip_duplicates:
        repeated = duplicate_hashes(array("q", (key_hash(k) for k, _ in driver_lines())), most=None)
    dropped = [0]

    def driver_keys() -> Iterator[tuple[str, dict[str, str]]]:
        """Each utterance key and the key it is looked up by in every other table."""
        for key, item in _first_lines(driver_lines(), repeated, [0]):
            if cfg.segments:
                yield key, {n: (item.recording if n in recording_fields else key) for n in keyed}
            else:
                yield key, {n: key for n in keyed}

    # Pass 1 (cheap, hashes only): unique keys, and every key present in every table?
    missing: dict[str, list[str]] = {}
    missing_counts: dict[str, int] = {}
    hashes = array("q")
    for key, lookups in driver_keys():
        hashes.append(kaldi.key_hash(key))
        for n, lookup in lookups.items():
            if not keyed[n].mark_present(lookup):
                where = keyed[n].path
                missing_counts[where] = missing_counts.get(where, 0) + 1
                if len(missing.setdefault(where, [])) < 10:
                    missing[where].append(key)
    if not hashes:
        raise DataError(f"{driver_path} has no utterances; there is nothing to write. Check "
                        f"{'++segments' if cfg.segments else 'the first file of ++scp_file_list'} "
                        f"(an earlier step may have written an empty table).")
    if not skip_duplicates:
        kaldi.raise_if_duplicates(driver_path, hashes, _DROP_HINT)
    total = len(hashes)
    del hashes
    lo, hi = job.span(total)
    extra = {t.path: t.unused_keys(10) for t in keyed.values() if t.num_unused()} if not cfg.segments else {}
    extra_counts = {t.path: t.num_unused() for t in keyed.values() if t.num_unused()} if not cfg.segments else {}
    if cfg.on_error == "fail" and (missing or extra):
        message = "; ".join(filter(None, [_missing_message(missing, missing_counts, "of " + driver_path +
                                                           " are missing from"),
                                          _missing_message(extra, extra_counts, "are only in")]))
        raise DataError(f"{message}. Fix the tables, or pass ++on_error=skip to drop those "
                        f"utterances (they are counted).")
    for where, n in (missing_counts.items() if job.index == 1 else ()):  # counted once, by job 1
        summary.skip(f"missing in {Path(where).name}", n)
    for where, n in (extra_counts.items() if job.index == 1 else ()):
        summary.skip(f"only in {Path(where).name}", n)

    storage = {**(cfg.storage_options or {}), "pipe_timeout": float(cfg.pipe_timeout)}

    def tasks() -> Iterator[_Task]:
        for i, (_, item) in enumerate(_first_lines(driver_lines(), repeated, dropped)):
            if i < lo:
                continue
            if i >= hi:
                break
            if cfg.segments:
                seg = item
                lookups = {n: (seg.recording if n in recording_fields else seg.key) for n in keyed}
                yield _Task(seg.key, {}, lookups, tuple(names), audio_fields, seg.where, (seg.start, seg.end),
                            cfg.allow_pipe, storage, seg.recording)
            else:
                line = item
                yield _Task(line.key, {names[0]: line.value}, {n: line.key for n in keyed}, tuple(names),
                            audio_fields, line.where, None, cfg.allow_pipe, storage)

    workers = resolve_num_workers(cfg.num_workers)
    bad_audio: list[str] = []  # the first 10 unreadable-audio errors (with on_error=fail)
    bad_audio_count = 0
    keys: list[str] = []
    out_path = cfg.jsonl_file_out if job.single else place.data(job)
    try:
        with atomic_write(out_path) as out:
            results = parallel_imap(_probe_task, tasks(), num_workers=workers, chunksize=256,
                                    initializer=_use_tables, initargs=(keyed,))
            for result in progress(results, total=total, desc="scp2jsonl", unit="utt"):
                if result.line is None:
                    if result.empty is not None:
                        summary.skip(f"empty {result.empty}")
                    elif result.error is None:
                        continue  # missing from a table: counted (or refused) by pass 1
                    elif cfg.on_error == "fail":  # go on probing: the error names 10 keys and the count
                        bad_audio_count += 1
                        if len(bad_audio) < 10:
                            bad_audio.append(result.error)
                    else:
                        summary.skip("unreadable audio")
                    continue
                out.write(result.line)
                if not job.single:
                    keys.append(result.key)
                summary.kept += 1
                summary.seconds += result.seconds
            if bad_audio_count:  # raised inside the block: nothing is written
                raise DataError(_bad_audio_message(bad_audio, bad_audio_count))
            if dropped[0] and job.index == 1:
                summary.skip(f"duplicate key in {Path(driver_path).name}", dropped[0])
            for t in keyed.values() if job.index == 1 else ():
                if t.num_duplicates:
                    summary.skip(f"duplicate key in {Path(t.path).name} (first line kept)", t.num_duplicates)
            if not summary.kept and job.single:  # raised inside the block: no empty JSONL is left behind
                raise DataError(f"no utterance of {driver_path} is left to write ({summary.line()}). "
                                f"Fix the tables or the audio they name.")
    finally:
        _KEYED.values = {}
    for t in keyed.values():
        t.close()
    if not job.single:
        jobs.write_part(place, jobs.Part("scp2jsonl", place.tag, job.count, job.index, fp, [lo, hi], total,
                                         [jobs.output_entry(out_path, place.directory)],
                                         {"keys": keys, "summary": jobs.summary_data(summary)}))
    summary.print("scp2jsonl" if job.single else f"scp2jsonl {job}")
    return summary


def part_keys(data: dict) -> list[str]:
    """The utterance keys of a scp2jsonl part (merge-jobs refuses a key two parts hold)."""
    return data["keys"]


def check_part(part: jobs.Part) -> None:
    """merge-jobs: a scp2jsonl record's keys (strings, as many as the lines it kept) and its one jsonl slice
    (:class:`corpus_io.jobs.parts.RecordProblem` on the first field that cannot be trusted)."""
    keys = jobs.of_type(part.data.get("keys"), "data.keys", list, "a list")
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not key:
            raise jobs.bad(f"data.keys[{i}]", key, "not a key (a non-empty string)")
    kept = part.data.get("summary", {}).get("kept", 0)
    if len(keys) != kept:
        raise jobs.bad("data.keys", f"{len(keys)} keys", f"but data.summary.kept is {kept}")
    if len(part.outputs) != 1:
        raise jobs.bad("outputs", f"{len(part.outputs)} files", "but a scp2jsonl job writes one jsonl slice")


def merge_parts(place: jobs.Place, parts: list[jobs.Part]) -> Summary:
    """``merge-jobs`` of scp2jsonl: the parts' jsonl slices, concatenated in job order into the one-job jsonl."""
    import shutil

    summary = jobs.merged_summary(parts)
    if not summary.kept:
        raise DataError(f"no part of {place.path} holds an utterance ({summary.line()}); nothing was written. Fix the "
                        f"tables or the audio they name.")
    with atomic_write(place.path, "wb") as out:
        for part in parts:
            with open(Path(part.where).parent / part.outputs[0]["file"], "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    summary.print("scp2jsonl (merged)")
    return summary


# --------------------------------------------------------------------------- jsonl2scp


def raise_if_duplicate_keys(paths: Iterable[str | os.PathLike], hashes: Any) -> None:
    """Raise a DataError naming both ``file:line`` of a key repeated in the JSONL ``paths`` (read in
    order), given the :func:`kaldi.key_hash` of ``str(key)`` of every line that has a ``key``.

    Memory: the 8-byte hashes only; the files are re-read to name the lines only when two hashes match.
    """
    paths = list(paths)
    repeat = first_repeated_key(hashes, lambda: ((str(line.record["key"]), line.where) for path in paths
                                                 for line in iter_jsonl(path) if "key" in line.record))
    if repeat:
        key, first, second = repeat
        file_of_first, file_of_second = first.rsplit(":", 1)[0], second.rsplit(":", 1)[0]  # where: path:line
        where = f" in {file_of_second}" if file_of_first == file_of_second else ""
        raise DataError(f"duplicate key '{key}'{where}: at {first} and {second}. "
                        f"Keys must be unique; remove or rename one.")


def _check_outputs(cfg: Any) -> list[str]:
    """The output tables of jsonl2scp; each must be a different file, and none the input."""
    if not cfg.scp_file_list or len(cfg.scp_file_list) != len(cfg.data_type_list):
        raise ConfigError("jsonl2scp needs ++scp_file_list and ++data_type_list of the same length, e.g. "
                          "++scp_file_list='[\"wav.scp\",\"text\"]' ++data_type_list='[\"source\",\"target\"]'.")
    outputs = [str(p) for p in cfg.scp_file_list]
    for i, path in enumerate(outputs, 1):
        files.refuse_remote_output(path, f"++scp_file_list entry {i}", "jsonl2scp")
    files.refuse_overwriting_inputs([(f"++scp_file_list entry {i}", p) for i, p in enumerate(outputs, 1)],
                              [("++jsonl_file_in", cfg.jsonl_file_in)])
    return outputs


def jsonl2scp(cfg: Any) -> int:
    """Write one Kaldi table per field of a JSONL; returns the number of lines."""
    outputs = _check_outputs(cfg)
    sep = "\t" if cfg.separator == "tab" else " "
    names = list(cfg.data_type_list)
    n = 0
    hashes = array("q")
    writers = [atomic_write(p) for p in outputs]
    opened = []
    try:
        for w in writers:
            opened.append(w.__enter__())
        for line in iter_jsonl(cfg.jsonl_file_in):
            record = line.record
            if "key" not in record:
                raise DataError(f"{line.where}: the line has no 'key'.")
            record["key"] = line_key(record["key"], line.where)
            check_id_fields(record, f"{line.where}: key '{record['key']}'")
            hashes.append(kaldi.key_hash(record["key"]))
            for name, f in zip(names, opened):
                value = record.get(name, record.get({"source": "wav", "target": "txt"}.get(name, ""), None))
                if value is None:
                    raise DataError(f"{line.where}: key '{record['key']}' has no field '{name}'. "
                                    f"Fields present: {sorted(record)}.")
                f.write(kaldi.table_line(str(record["key"]), str(value), sep, where=line.where, field=name))
            n += 1
        # Checked before any table is renamed into place: a bad input leaves no output behind.
        if not n:
            raise DataError(f"{cfg.jsonl_file_in} has no utterances; there is nothing to write. Check "
                            f"++jsonl_file_in (an earlier step may have written an empty file).")
        raise_if_duplicate_keys([cfg.jsonl_file_in], hashes)
    except BaseException as exc:
        for w in writers[:len(opened)]:
            w.__exit__(type(exc), exc, exc.__traceback__)
        raise
    for w in writers:
        w.__exit__(None, None, None)
    print(f"[jsonl2scp] {n} utterances -> {', '.join(outputs)}", flush=True)
    return n
