"""Shard lists (``data.list``) and their ``index.jsonl`` sidecar.

A shard ``data.list`` is WeNet's: one shard path or URL per line, nothing else. Its index
sidecar holds one JSON object per shard, keyed by the entry exactly as written in the list:
``path``, ``num_utts``, ``duration`` (seconds, total), ``min_duration``/``max_duration``
(seconds), ``bytes`` (file size) and ``sha256`` (hex of the whole file).

Paths in the index are stored relative to the index's directory when the shard lies under it (a
copied shard directory stays self-contained); readers get them back resolved against the index's
real directory, so entries match the list's absolute paths. Absolute paths and URLs (older
indexes, ``make-datalist ++prefix``) are kept as written.

Sidecar location (:func:`index_path_for`): ``DIR/data.list`` -> ``DIR/index.jsonl``;
any other list name ``DIR/NAME.EXT`` -> ``DIR/NAME.index.jsonl`` (so two lists in one
directory never share a sidecar).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from corpus_io.errors import DataError
from corpus_io.files import atomic_write

INDEX_FIELDS = ("path", "num_utts", "duration", "min_duration", "max_duration", "bytes", "sha256")


def index_path_for(list_path: str | os.PathLike) -> Path:
    """The ``index.jsonl`` sidecar of a data.list (see the module docstring for the naming rule)."""
    p = Path(list_path)
    if p.name == "data.list":
        return p.with_name("index.jsonl")
    return p.with_name(f"{p.stem}.index.jsonl")


def read_datalist(path: str | os.PathLike) -> list[str]:
    """Entries of a data.list (local path or URL), stripped, blank lines skipped."""
    from corpus_io.urls import is_remote, open_url

    path = str(path)
    if not is_remote(path) and os.path.isdir(path):
        hint = f" Did you mean {os.path.join(path, 'data.list')}?" if os.path.isfile(os.path.join(path, "data.list")) \
            else ""
        raise DataError(f"data list {path} is a directory, not a list file.{hint}")
    if not is_remote(path) and not os.path.isfile(path):
        raise DataError(f"data list {path} does not exist. Create it with make-datalist or pack-shards.")
    with open_url(path) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: invalid UTF-8 at byte {exc.start}; a data.list is UTF-8 text.") from None
    entries = [line.strip() for line in text.splitlines() if line.strip()]
    if entries and entries[0].startswith("{"):
        raise DataError(f"{path} holds JSON lines (a raw list or a FunASR jsonl), not shard paths. Read it as a raw "
                        f"list (++dataset_conf.data_type=raw; make-datalist: ++data_type=raw), or pack it into "
                        f"shards with pack-shards first.")
    return entries


def load_index(list_path: str | os.PathLike) -> dict[str, dict] | None:
    """The sidecar of ``list_path`` keyed by shard entry, or None when there is no sidecar."""
    return read_index_file(index_path_for(list_path))


def _index_dir(index_path: str | os.PathLike) -> str:
    return os.path.dirname(os.path.realpath(index_path))


def _stored_path(entry_path: str, index_dir: str) -> str:
    """``entry_path`` relative to ``index_dir`` when it is a local path under it, else unchanged."""
    if "://" in entry_path or not os.path.isabs(entry_path):
        return entry_path
    rel = os.path.relpath(entry_path, index_dir)
    return entry_path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def _resolved_path(stored: str, index_dir: str) -> str:
    if "://" in stored or ":" in stored.split("/", 1)[0] or os.path.isabs(stored):
        return stored  # a URL (s3://, pipe:...) or an absolute path
    return os.path.normpath(os.path.join(index_dir, stored))


def write_index(path: str | os.PathLike, entries: Iterable[dict]) -> None:
    """Write an index atomically, one JSON object per shard, ``path`` stored relative when under its dir."""
    index_dir = _index_dir(path)
    with atomic_write(path) as f:
        for entry in entries:
            stored = dict(entry, path=_stored_path(entry["path"], index_dir))
            f.write(json.dumps(stored, ensure_ascii=False) + "\n")


def read_index_file(path: Path) -> dict[str, dict] | None:
    """An ``index.jsonl`` keyed by shard entry (relative paths resolved), or None when ``path`` is not a file."""
    if not path.is_file():
        return None
    index_dir = _index_dir(path)
    entries: dict[str, dict] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise DataError(f"{path}:{lineno}: not a JSON object; the index is corrupt. Regenerate it "
                                f"with make-datalist or pack-shards.") from None
            if not isinstance(entry, dict) or "path" not in entry:
                raise DataError(f"{path}:{lineno}: an index line needs a 'path' field.")
            entry["path"] = _resolved_path(str(entry["path"]), index_dir)
            entries[entry["path"]] = entry
    return entries


def write_list_and_index(list_path: str | os.PathLike, entries: Iterable[dict]) -> int:
    """Write ``data.list`` and its sidecar atomically (index first, so a list never lacks one).

    The standard keys come first, in :data:`INDEX_FIELDS` order; any other key of an entry (e.g.
    ``fields``, written by add-field) is kept after them.
    """
    entries = list(entries)
    ordered = []
    for entry in entries:
        ordered.append({k: entry[k] for k in INDEX_FIELDS if k in entry})
        ordered[-1].update((k, v) for k, v in entry.items() if k not in ordered[-1])
    write_index(index_path_for(list_path), ordered)
    with atomic_write(list_path) as f:
        for entry in entries:
            f.write(entry["path"] + "\n")
    return len(entries)
