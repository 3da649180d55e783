"""``make-datalist``: WeNet raw lists from a jsonl, or shard lists (+ index sidecar) from many sources.

Shard inputs, each one of:

* a directory: its ``data.list`` (with its sidecar) when present, else its ``*.tar`` (and WeNet's
  ``*.tar.gz``/``*.tgz``) sorted;
* a brace pattern ``data-{000000..000099}.tar`` / ``{a,b}`` (expanded here, numeric ranges keep
  their zero padding); local results must exist;
* a glob ``shards/*.tar`` (sorted);
* a ``.tar``, ``.tar.gz`` or ``.tgz`` path or URL;
* a list file (any other file): its entries, and its sidecar when present;
* a Lhotse Shar: its directory (local, or an ``s3://``/``http(s)://`` prefix ending in ``/``), a cuts file
  ``cuts.000000.jsonl.gz`` or a glob of them: one entry per shard (its cuts file), indexed from the cuts' durations
  (no audio is read).

Several inputs are merged in order; a shard named twice is an error naming both sources.
``prefix`` rewrites each entry to ``prefix + <path relative to the deepest directory common to
all entries>``: for one corpus that is the shard's base name; merged corpora keep their
sub-directories, so names never collide.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from array import array
from pathlib import Path
from typing import Any, Iterator

from corpus_io.errors import ConfigError, DataError
from corpus_io.shards.format import SHARD_SUFFIXES
from corpus_io.shards.index import (
    describe_repeats,
    find_repeated_keys,
    index_path_for,
    list_and_sidecar,
    load_index,
    read_datalist,
    write_list_and_index,
)
from corpus_io.storage.files import atomic_write, refuse_overwriting_inputs, refuse_remote_output
from corpus_io.storage.progress import Summary
from corpus_io.storage.urls import is_command, is_remote

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion: ``{000..003}`` (zero-padded ranges) and ``{a,b}``, nested, left to right."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    depth = 0
    for end in range(start, len(pattern)):
        if pattern[end] == "{":
            depth += 1
        elif pattern[end] == "}":
            depth -= 1
            if depth == 0:
                break
    else:
        raise ConfigError(f"unbalanced '{{' in the pattern '{pattern}'.")
    body, head, tail = pattern[start + 1:end], pattern[:start], pattern[end + 1:]
    m = _RANGE.match(body)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        width = len(m.group(1)) if m.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        options = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    else:
        options, depth, current = [], 0, ""
        for ch in body:
            if ch == "," and depth == 0:
                options.append(current)
                current = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            current += ch
        options.append(current)
        options = [x for option in options for x in expand_braces(option)]
    return [x for option in options for x in expand_braces(head + option + tail)]


def _index_by_name(directory: str) -> dict[str, dict]:
    """Index entries of the ``data.list`` in ``directory`` keyed by shard base name."""
    index = load_index(os.path.join(directory, "data.list"), keys=True) or {}
    return {entry["path"].rsplit("/", 1)[-1]: entry for entry in index.values()}


def _tar_entries(paths: list[str]) -> Iterator[tuple[str, dict | None]]:
    """Local tars (absolute) with their index entry looked up in their directory's sidecar."""
    cache: dict[str, dict[str, dict]] = {}
    for path in paths:
        path = os.path.abspath(path)
        directory, name = os.path.split(path)
        if directory not in cache:
            cache[directory] = _index_by_name(directory)
        yield path, cache[directory].get(name)


def _list_entries(path: str, storage_options: dict | None = None) -> Iterator[tuple[str, dict | None]]:
    # a list at a URL has its index beside it too, read with the list's storage_options (else the AWS environment)
    index = load_index(path, keys=True, storage_options=storage_options)
    from corpus_io.tables import shar

    for entry in read_datalist(path, storage_options=storage_options):  # a raw list / jsonl given here is caught there
        found = (index or {}).get(entry)
        if found is None and shar.is_shar_cuts(entry):  # a Shar shard indexes itself from its cuts
            found = {k: v for k, v in shar.index_entry(entry).items() if k != "path"}
        yield entry, found


def _shar_entries(cuts: list[str]) -> Iterator[tuple[str, dict]]:
    """Lhotse Shar shards (their cuts files) with the index entry their cuts give (no audio is read)."""
    from corpus_io.tables import shar

    for url in cuts:
        url = url if is_remote(url) else os.path.abspath(url)
        entry = shar.index_entry(url)
        yield url, {k: v for k, v in entry.items() if k != "path"}


def _parquet_entries(item: str, columns: dict | None, storage_options: dict | None, listed: list[str] | None = None
                     ) -> Iterator[tuple[str, dict | None]]:
    """Each parquet file of ``item`` as one shard, its index entry from one pass over its rows (no audio decoded);
    a column mapping given travels in the list line (:func:`corpus_io.tables.parquet.with_columns`). ``listed``:
    the files of a local directory walked already."""
    from corpus_io.tables import parquet

    for url in parquet.parquet_files(item, storage_options, listed):
        entry = parquet.with_columns(url if is_remote(url) else os.path.abspath(url), columns)
        yield entry, parquet.index_entry(entry, storage_options)


def expand_input(item: str, columns: dict | None = None, storage_options: dict | None = None
                 ) -> Iterator[tuple[str, dict | None]]:
    """``(shard entry, index entry or None)`` for one input of make-datalist shard mode (parquet files: each one
    a shard, read with ``columns`` and ``storage_options``)."""
    from corpus_io.tables import shar
    from corpus_io.tables.inputs import walk_once
    from corpus_io.tables.parquet import is_parquet, parquet_in

    tree = walk_once(item)  # a local directory's one walk
    if is_parquet(item, tree):
        yield from _parquet_entries(item, columns, storage_options, parquet_in(tree) if tree else None)
        return
    if shar.is_shar_cuts(item) and "{" not in item and not glob.has_magic(item):
        yield from _shar_entries([item])
        return
    if shar.is_shar_dir(item):
        yield from _shar_entries(shar.shar_shards(item))
        return
    if "{" in item:
        expanded = expand_braces(item)
        if is_remote(item):
            yield from ((u, None) for u in expanded)
            return
        missing = [p for p in expanded if not glob.has_magic(p) and not os.path.isfile(p)]
        if missing:
            raise DataError(f"the pattern '{item}' names {len(missing)} shard(s) that do not exist, e.g. "
                            f"{missing[0]}. Fix the range or pack the missing shards.")
        for p in expanded:
            yield from expand_input(p)
        return
    if is_remote(item):
        yield from ([(item, None)] if item.endswith(SHARD_SUFFIXES) else _list_entries(item, storage_options))
        return
    if os.path.isdir(item):
        if os.path.isfile(os.path.join(item, "data.list")):
            yield from _list_entries(os.path.join(item, "data.list"))
        else:
            tars = sorted(p for suffix in SHARD_SUFFIXES for p in glob.glob(os.path.join(glob.escape(item),
                                                                                         "*" + suffix)))
            if not tars:
                raise DataError(f"directory {item} has neither a data.list nor *.tar / *.tar.gz shards.")
            yield from _tar_entries(tars)
        return
    if glob.has_magic(item):
        matches = sorted(glob.glob(item))
        if not matches:
            raise DataError(f"the glob '{item}' matches no file. Check the pattern (quote it in the shell).")
        yield from _shar_entries(matches) if all(map(shar.is_shar_cuts, matches)) else _tar_entries(matches)
        return
    if not os.path.isfile(item):
        raise DataError(f"input {item} does not exist. Pass a directory, glob, brace pattern, .tar or list file.")
    yield from _tar_entries([item]) if item.endswith(SHARD_SUFFIXES) else _list_entries(item)


def _common_dir(entries: list[str]) -> str:
    dirs = [e.rsplit("/", 1)[0] + "/" if "/" in e else "" for e in entries]
    common = os.path.commonprefix(dirs)
    return common[:common.rfind("/") + 1]


def make_shard_list(inputs: list[str], output: str, prefix: str | None = None, *, columns: dict | None = None,
                    storage_options: dict | None = None) -> int:
    """Merge shard inputs into ``output`` (+ sidecar when every entry has an index); returns the count."""
    entries: list[tuple[str, dict | None, str]] = []
    for item in inputs:
        entries.extend((e, idx, item) for e, idx in expand_input(str(item), columns, storage_options))
    if not entries:
        raise DataError(f"no shards found in {inputs}.")
    if prefix:
        common = _common_dir([e for e, _, _ in entries])
        base = prefix if prefix.endswith("/") else prefix + "/"
        entries = [(base + e[len(common):], idx, src) for e, idx, src in entries]
    seen: dict[str, str] = {}
    for entry, _, source in entries:
        if entry in seen:
            raise DataError(f"shard '{entry}' is listed twice: from input '{seen[entry]}' and from '{source}'. "
                            f"Merge each corpus once, or pack corpora with different ++shard_prefix.")
        seen[entry] = source
    indexed = [dict(idx, path=e) for e, idx, _ in entries if idx is not None]
    repeats = find_repeated_keys(lambda: ((e["path"], e["keys"]) for e in indexed if isinstance(e.get("keys"), list)))
    if repeats:
        raise DataError(f"the merged list would repeat utterances: {describe_repeats(repeats)} (from the indexes). "
                        f"Training would see them twice; merge each corpus once, or re-pack one of them with "
                        f"unique keys (e.g. a corpus prefix).")
    if len(indexed) == len(entries):
        write_list_and_index(output, indexed)
    else:
        with atomic_write(output) as f:
            f.writelines(e + "\n" for e, _, _ in entries)
        print(f"[make-datalist] {len(entries) - len(indexed)} of {len(entries)} shards have no index entry; "
              f"wrote the list without an index sidecar.", flush=True)
    print(f"[make-datalist] {len(entries)} shards -> {output}", flush=True)
    return len(entries)


def _segment_length(info: Any, start: float, end: float | None, where: str, rec: dict) -> tuple[int, int]:
    """``(num_samples, sample_rate)`` of segment [start, end] s (end None or < 0: to the end) of a recording
    described by ``info`` (an AudioInfo); a segment outside it is a DataError naming the line."""
    from corpus_io.audio import io as audio

    try:
        first, last = audio.segment_samples(float(start), -1.0 if end is None else float(end), info.sample_rate,
                                            info.num_samples)
    except DataError as exc:
        raise DataError(f"{where}: key '{rec['key']}' ({rec['source']}): {exc} Fix the segment times or the "
                        f"recording it names.") from None
    return last - first, info.sample_rate


def _probe(rec: dict, where: str) -> Any:
    """The header of ``rec``'s recording; make-datalist runs no commands, so a command entry is refused."""
    from corpus_io.audio import io as audio

    source = str(rec["source"])
    if is_command(source):
        raise DataError(f"{where}: key '{rec['key']}': the source '{source}' is a command, which make-datalist "
                        f"does not run, so it cannot measure its length. Give the line a source_len (scp2jsonl "
                        f"++allow_pipe=true computes it), or convert the audio to files first.")
    try:
        return audio.probe(source)
    except DataError as exc:  # the audio's own words, then the line and key that name it
        relative = " (a relative path is read from the current directory)" if not (
            os.path.isabs(source) or "://" in source) else ""
        raise DataError(f"{where}: key '{rec['key']}': {str(exc).rstrip('.')}. make-datalist measures each recording "
                        f"from its header, so this line cannot be listed: fix its audio{relative} or remove the "
                        f"line.") from None


def make_raw_list(inputs: list[str], output: str, exclude_keys: str | None = None) -> Summary:
    """WeNet raw lines ``{key, wav, txt, duration, source_len[, start, end]}`` from inputs of any kind of
    :mod:`corpus_io.tables.inputs` (FunASR/WeNet jsonl, Kaldi dir, NeMo, Lhotse); a line without transcript is skipped
    and counted; a key of ``exclude_keys`` (a file, :class:`corpus_io.keys.ExcludedKeys`) is left out and counted."""
    from corpus_io.audio import io as audio
    from corpus_io.keys import ExcludedKeys, key_hash
    from corpus_io.tables.inputs import Skipped, iter_records, raise_if_duplicate_keys

    summary = Summary()
    excluded = ExcludedKeys(exclude_keys) if exclude_keys else None
    probed: dict[str, Any] = {}  # the last recording probed for segments
    hashes = array("q")  # 8 bytes per utterance, for the duplicate-key check
    with atomic_write(output) as out:  # an error below leaves no output behind
        for path in inputs:
            before = len(hashes)
            skipped = Skipped(summary.skip)
            # duplicates: checked below across every input, from 8-byte key hashes
            for rec in iter_records(path, skip=skipped, check_duplicates=False):
                where = rec.pop("where")
                if "source_bytes" in rec:  # tables.parquet.INLINE: a row's audio lives in the parquet file
                    raise ConfigError(f"{where}: a raw list names audio files, and the audio of {path} is held "
                                      f"in its parquet rows. List the parquet files as shards (make-datalist "
                                      f"++data_type=shard ++input={path}) to train on them directly, or pack them "
                                      f"(pack-shards ++input={path}).")
                hashes.append(key_hash(rec["key"]))
                if excluded is not None and excluded.excludes(rec["key"]):
                    summary.skip(excluded.reason)
                    continue
                if rec.get("target") is None:
                    raise DataError(f"{where}: key '{rec['key']}' has no transcript ('target' or 'txt').")
                start, end = rec.get("start"), rec.get("end")
                source_len = rec.get("source_len")
                if start is not None and source_len is not None and is_command(str(rec["source"])):
                    # a measured segment of a command's output (scp2jsonl ++allow_pipe): nothing to probe
                    duration = float(end) - float(start) if end is not None and float(end) >= 0 else source_len / 100
                elif start is not None:  # a segment: its own length, and it must lie inside its recording
                    if str(rec["source"]) not in probed:
                        probed.clear()  # the segments of one recording come together: keep one probe
                        probed[str(rec["source"])] = _probe(rec, where)
                    num_samples, rate = _segment_length(probed[str(rec["source"])], start, end, where, rec)
                    duration = num_samples / rate
                    if source_len is None:
                        source_len = audio.frames_10ms(num_samples, rate)
                else:
                    if source_len is None:
                        info = _probe(rec, where)
                        source_len = audio.frames_10ms(info.num_samples, info.sample_rate)
                    duration = int(source_len) / 100.0
                item: dict[str, Any] = {"key": rec["key"], "wav": rec["source"], "txt": rec["target"],
                                        "duration": round(duration, 3), "source_len": int(source_len)}
                if start is not None:
                    item["start"], item["end"] = start, end
                if rec.get("speaker") is not None:
                    item["speaker"] = rec["speaker"]
                out.write(json.dumps(item, ensure_ascii=False) + "\n")
                summary.kept += 1
                summary.seconds += duration
            if len(hashes) == before:
                raise skipped.nothing_left(path, "there is nothing to list", "++input")
        raise_if_duplicate_keys(inputs, hashes)
        if excluded is not None and not summary.kept:
            raise DataError(f"make-datalist: every utterance of {', '.join(map(str, inputs))} is in ++exclude_keys="
                            f"{exclude_keys} ({len(excluded.met)} left out), so the list would be empty (nothing was "
                            f"written). Check that the file is the one for this input.")
    summary.print("make-datalist")
    if excluded is not None:
        print(excluded.report("make-datalist"), file=sys.stderr, flush=True)
    return summary


def _outputs(cfg: Any) -> list[tuple[str, str]]:
    outputs = [("++output", str(cfg.output))]
    if cfg.data_type == "shard":
        outputs.append(("the index sidecar of ++output", str(index_path_for(cfg.output))))
    return outputs


def _inputs(inputs: list) -> Iterator[tuple[str, str]]:
    """The local lists make-datalist reads, for the collision check: each file input with its index sidecar,
    and a directory's data.list (with its sidecar) when that list exists, as :func:`expand_input` reads it.

    A directory without a data.list names no list: its shards are scanned, so writing ``DIR/data.list``
    creates the directory's own list. The ``DIR/index.jsonl`` left without a list (a crash between the
    two commits of :func:`write_list_and_index`) is then rewritten from its own entries for the shards
    the directory holds, which is the regeneration the user asked for, not a loss."""
    for i, item in enumerate(map(str, inputs), 1):
        name = f"++input entry {i}" if len(inputs) > 1 else "++input"
        if os.path.isdir(item):
            listed = os.path.join(item, "data.list")
            if os.path.isfile(listed):
                yield from list_and_sidecar(f"{name}'s data.list", listed)
        else:
            yield from list_and_sidecar(name, item)


def make_datalist(cfg: Any) -> None:
    """Run make-datalist for a validated :class:`corpus_io.config.MakeDatalistConfig`."""
    inputs = [cfg.input] if isinstance(cfg.input, str) else list(cfg.input)
    if not inputs:
        raise ConfigError("make-datalist needs ++input: raw: ++input='[train.jsonl]'; shard: "
                          "++input='[shards/]' (dirs, globs, brace patterns or list files).")
    if cfg.output in ("", "???"):
        raise ConfigError("make-datalist needs ++output=data.list.")
    refuse_remote_output(cfg.output, "++output", "make-datalist")
    refuse_overwriting_inputs(_outputs(cfg), [*_inputs(inputs), ("++exclude_keys", cfg.exclude_keys)])
    Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
    if cfg.exclude_keys and cfg.data_type != "raw":
        raise ConfigError(f"make-datalist ++exclude_keys={cfg.exclude_keys} leaves utterances out of a raw list; a "
                          f"shard list names whole shards, whose utterances are packed inside. Re-pack without "
                          f"them (pack-shards ++exclude_keys={cfg.exclude_keys}), then list the new shards, or make "
                          f"a raw list (++data_type=raw).")
    if cfg.data_type == "raw":
        make_raw_list(inputs, cfg.output, cfg.exclude_keys)
    else:
        make_shard_list(inputs, cfg.output, cfg.prefix, columns=dict(cfg.columns or {}),
                        storage_options=dict(cfg.storage_options or {}))
