"""The output directory of ``pack-shards`` around its shards: a previous run's list withdrawn before any shard is
rewritten, ``data.list`` + ``index.jsonl`` written at the end (add-field's entries carried over, sent to object
storage when the output is there), the shards of an earlier run that the new list no longer names removed, and
the temp files of a killed run; another run's shards (another prefix) refused.
"""


from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Iterator

from corpus_io.errors import DataError
from corpus_io.shards import format as fmt
from corpus_io.shards.index import index_path_for, read_index_file, write_list_and_index
from corpus_io.storage import objects
from corpus_io.storage.files import (
    file_sha256,
    remove_temp_files,
)
from corpus_io.storage.progress import Summary


def clean_temp_files(out_dir: Path, prefix: str) -> None:
    """Remove the temp files of shards and sidecars (``.<prefix>-NNNNNN.tar.json``) a killed run left."""
    shard_or_sidecar = re.compile(rf"\.?{fmt.shard_stem_pattern(prefix)}\.tar(\.gz)?(\.json)?")
    remove_temp_files(out_dir, shard_or_sidecar.fullmatch)



def write_list(out_dir: Path, prefix: str, previous_index: Path, entries: Iterable[dict], summary: Summary,
                repeated_keys: int | None = None, url: str = "", storage_options: dict | None = None) -> None:
    """The end of a one-job run (or of merge-jobs): data.list + index.jsonl (sent to ``url`` when the output is
    on object storage), then stale shards removed."""
    names: set[str] = set()

    def named() -> Iterator[dict]:
        for entry in _keep_companion_fields(previous_index, entries):
            names.add(Path(entry["path"]).name)
            yield entry

    write_list_and_index(out_dir / "data.list", named(), repeated_keys=repeated_keys)
    if url:
        _publish_list(out_dir / "data.list", url, storage_options or {})
    previous_index.unlink(missing_ok=True)
    removed = _remove_stale_shards(out_dir, prefix, names)
    if removed:
        summary.extra["stale shards removed"] = summary.extra.get("stale shards removed", 0) + removed



def refuse_other_prefix(out_dir: Path, prefix: str) -> None:
    """Two runs with different shard_prefix in one output_dir would leave one run's shards orphaned."""
    listed = out_dir / "data.list"
    mine = re.compile(rf"{fmt.shard_stem_pattern(prefix)}(\..+)?")
    others = []
    if listed.is_file():
        others = [e for e in read_index_file(index_path_for(listed)) or {} if not mine.fullmatch(Path(e).name)]
    if not others:
        others = [e.name for e in os.scandir(out_dir) if e.is_file() and e.name.endswith((".tar", ".tar.gz", ".tgz"))
                  and not mine.fullmatch(e.name)]
    if others:
        raise DataError(f"output_dir {out_dir} holds shards of another run ({Path(others[0]).name}: not "
                        f"'{prefix}-NNNNNN'). Nothing was written. Use another output_dir, or delete that run's "
                        f"shards, data.list and index.jsonl first.")


def _publish_list(list_path: Path, url: str, storage_options: dict) -> None:
    """Send a written list's index, then the list (so a list never lacks its index), to object storage."""
    for path in (index_path_for(list_path), list_path):
        objects.put_object(path, objects.join(url, path.name), storage_options, sha256=file_sha256(path))


def _remove_stale_shards(out_dir: Path, prefix: str, current: set[str]) -> int:
    """Delete shards (with their sidecars and add-field companions) of an earlier run that this run's
    list no longer names, e.g. after a rerun with a larger num_utts_per_shard; a directory glob would
    otherwise read them twice. Runs after the new list is in place. Returns the number of shards."""
    pattern = re.compile(rf"\.?({fmt.shard_stem_pattern(prefix)})\..+")
    current_stems = {fmt.shard_stem(name) for name in current}
    removed = 0
    for entry in os.scandir(out_dir):
        match = pattern.fullmatch(entry.name)
        if not match or not entry.is_file():
            continue
        stem = match.group(1)
        name = entry.name.lstrip(".").removesuffix(".json")  # a shard's hidden sidecar goes with the shard
        is_shard = fmt.shard_stem(name) == stem  # stem + .tar / .tar.gz / .tgz
        # stale: nothing of this run has the stem, or a shard of this stem with another suffix (compression
        # switched between runs), which a directory glob would otherwise read next to the new one
        if stem not in current_stems or (is_shard and name not in current):
            os.unlink(entry.path)
            removed += is_shard and not entry.name.startswith(".")
    return removed


def withdraw_list(list_path: Path) -> Path:
    """Take a previous run's list out of the way before any shard is rewritten, so a run that fails
    halfway leaves no list naming shards that no longer match it. Its index moves to a hidden name,
    which the end of the run reads (add-field's entries) and then deletes. Returns that name."""
    index = index_path_for(list_path)
    kept = index.with_name(f".{index.name}.previous")
    if index.is_file() and not kept.is_file():  # a kept one is from a run that failed: it is the older truth
        os.replace(index, kept)
    index.unlink(missing_ok=True)
    list_path.unlink(missing_ok=True)
    return kept


def _keep_companion_fields(previous_index: Path, entries: Iterable[dict]) -> Iterator[dict]:
    """Carry add-field's ``fields`` over from the old index for shards whose bytes did not change."""
    old = read_index_file(previous_index) or {}  # only its add-field entries are carried over
    for entry in entries:
        previous = old.get(entry["path"])
        if previous and previous.get("sha256") == entry.get("sha256") and "fields" in previous:
            entry["fields"] = previous["fields"]
        yield entry

