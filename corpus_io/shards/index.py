"""Shard lists (``data.list``) and their ``index.jsonl`` sidecar.

A shard ``data.list`` is WeNet's: one shard path or URL per line, nothing else (a Lhotse Shar shard is named by
its cuts file, ``.../cuts.000000.jsonl.gz``: :mod:`corpus_io.tables.shar`). Its index
sidecar holds one JSON object per shard, keyed by the entry exactly as written in the list:
``path``, ``num_utts``, ``duration`` (seconds, total), ``min_duration``/``max_duration``
(seconds), ``bytes`` (file size), ``sha256`` (hex of the whole file), ``durations`` (each utterance's seconds,
rounded to 10 ms, in shard order: the loader's bucket edges come from them) and ``keys``.

A shard under the index's directory is stored as ``file`` (its path relative to that directory)
instead of ``path``, so a copied shard directory stays self-contained; readers get ``path`` back,
resolved against the index's real directory, so entries match the list's absolute paths. Other
entries (URLs, relative list entries as written, older indexes) keep ``path`` exactly as in the list.

Sidecar location (:func:`index_path_for`): ``DIR/data.list`` -> ``DIR/index.jsonl``;
any other list name ``DIR/NAME.EXT`` -> ``DIR/NAME.index.jsonl`` (so two lists in one
directory never share a sidecar). A list at a URL (``s3://``, ``http(s)://``) has its sidecar at the URL beside
it, read with the same ``storage_options`` as the list; a ``file`` entry there resolves against that URL.
"""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path, PurePosixPath
from typing import IO, Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit

from corpus_io.errors import DataError
from corpus_io.storage.files import atomic_write, parse_json_object

INDEX_FIELDS = ("path", "num_utts", "duration", "min_duration", "max_duration", "bytes", "sha256", "durations", "keys")


def index_path_for(list_path: str | os.PathLike) -> Path | str:
    """The ``index.jsonl`` sidecar of a data.list (see the module docstring for the naming rule): a Path for a
    local list, a URL (str) for a remote one."""
    from corpus_io.storage.urls import beside, is_remote

    text = os.fspath(list_path)
    if is_remote(text):
        name = PurePosixPath(urlsplit(text).path).name
        return beside(text, "index.jsonl" if name == "data.list" else f"{PurePosixPath(name).stem}.index.jsonl")
    p = Path(text)
    if p.name == "data.list":
        return p.with_name("index.jsonl")
    return p.with_name(f"{p.stem}.index.jsonl")


def list_and_sidecar(name: str, list_path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(name, path)`` of a data.list and of its index sidecar: the files a reader of the list reads, for
    :func:`corpus_io.storage.files.refuse_overwriting_inputs`."""
    return [(name, str(list_path)), (f"the index sidecar of {name}", str(index_path_for(list_path)))]


def read_datalist(path: str | os.PathLike, *, storage_options: dict | None = None) -> list[str]:
    """Entries of a data.list (local path or URL, read with ``storage_options``), stripped, blank lines
    skipped."""
    from corpus_io.storage.urls import is_remote, open_url

    path = str(path)
    if not is_remote(path) and os.path.isdir(path):
        hint = f" Did you mean {os.path.join(path, 'data.list')}?" if os.path.isfile(os.path.join(path, "data.list")) \
            else ""
        raise DataError(f"data list {path} is a directory, not a list file.{hint}")
    if not is_remote(path) and not os.path.isfile(path):
        raise DataError(f"data list {path} does not exist. Create it with make-datalist or pack-shards.")
    with open_url(path, storage_options=storage_options) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: invalid UTF-8 at byte {exc.start}; a data.list is UTF-8 text.") from None
    entries = [line.strip() for line in text.splitlines() if line.strip()]
    if entries and entries[0].startswith("{"):
        raise DataError(f"{path} holds JSON lines (a raw list or a FunASR jsonl), not shard paths. Read it as a raw "
                        f"list (the loader: ++dataset_conf.data_type=raw; make-datalist and stats: ++data_type=raw), "
                        f"or pack it into shards with pack-shards first.")
    from corpus_io.tables.shar import is_shar_cuts

    jsonl = next((e for e in entries if e.endswith((".jsonl", ".json", ".jsonl.gz")) and not is_shar_cuts(e)), None)
    if jsonl is not None:
        raise DataError(f"{path} lists JSONL files ('{jsonl}'), as FunASR's multi-file data list does, not shards. "
                        f"Read it as a raw list (the loader: ++dataset_conf.data_type=raw; stats: ++data_type=raw), "
                        f"or pack the JSONL into shards with pack-shards first.")
    return entries


def load_index(list_path: str | os.PathLike, *, keys: bool = False,
               storage_options: dict | None = None) -> dict[str, dict] | None:
    """The sidecar of ``list_path`` keyed by shard entry, or None when there is no sidecar.

    ``keys``: keep each entry's utterance keys (to rewrite the index); readers leave them out, so
    their memory does not grow with the corpus (find repeats with :func:`repeated_keys`).
    ``storage_options``: the list's, for a remote one."""
    return read_index_file(index_path_for(list_path), keys=keys, storage_options=storage_options)


def _iter_shard_keys(index: Path | str, storage_options: dict | None = None) -> Iterator[tuple[str, list[str]]]:
    """``(shard path, its utterance keys)`` per index line, streamed (lines without ``keys`` are skipped)."""
    for entry in read_index_file(index, keys=True, lazy=True, storage_options=storage_options) or ():
        if isinstance(entry.get("keys"), list):
            yield entry["path"], [str(k) for k in entry["keys"]]


def index_shard_keys(list_path: str | os.PathLike, *, storage_options: dict | None = None,
                     only: set[str] | None = None) -> Iterator[tuple[str, list[str]]]:
    """``(shard, its utterance keys)`` of each entry of the index of ``list_path`` that records them (``only``: of
    these shards), streamed; nothing when there is no index."""
    return ((p, keys) for p, keys in _iter_shard_keys(index_path_for(list_path), storage_options)
            if only is None or p in only)


def repeated_keys(list_path: str | os.PathLike, *, storage_options: dict | None = None) -> dict[str, list[str]]:
    """Keys that more than one shard of ``list_path`` holds (or one shard twice), from its index's ``keys``
    (no audio is read); see :func:`find_repeated_keys`. Empty when there is no index or it records no keys."""
    index = index_path_for(list_path)
    if isinstance(index, Path) and not index.is_file():
        return {}
    return find_repeated_keys(lambda: _iter_shard_keys(index, storage_options))


def known_repeated_keys(list_path: str | os.PathLike, *, storage_options: dict | None = None) -> dict[str, list[str]]:
    """:func:`repeated_keys`, without the scan when the index's ``.<index stem>.repeats.json`` sidecar says that this
    very index (same size and mtime) repeats no key; else computed, and the count stored there (best effort:
    a read-only directory just computes it). The loader asks on every rank at start: at 15M keys the scan
    takes seconds and hundreds of MB, the sidecar milliseconds. :func:`write_index` stores it with each index.
    A remote index has no such sidecar: it is scanned."""
    index = index_path_for(list_path)
    if not isinstance(index, Path):
        return repeated_keys(list_path, storage_options=storage_options)
    if not index.is_file():
        return {}
    try:
        stored = json.loads(_repeats_path(index).read_text(encoding="utf-8"))
        if stored.get("index") == _stamp(index) and stored["repeated_keys"] == 0:
            return {}  # the usual case; a list that repeats keys is rare and re-scanned (shard paths move)
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        pass  # absent, stale or damaged: compute it
    return _store_repeats(index)


def index_records_keys(list_path: str | os.PathLike, *, storage_options: dict | None = None) -> bool:
    """Whether the index of ``list_path`` records the utterance keys of every shard (then :func:`known_repeated_keys`
    finds every repeat before reading); from the ``.repeats.json`` stamp when it is fresh, else by a byte scan."""
    index = index_path_for(list_path)
    if not isinstance(index, Path):
        f = _open_index(index, storage_options)
        return f is not None and _every_line_has_keys(f)
    if not index.is_file():
        return False
    try:
        stored = json.loads(_repeats_path(index).read_text(encoding="utf-8"))
        if stored.get("index") == _stamp(index) and isinstance(stored.get("keyed"), bool):
            return stored["keyed"]
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return _every_line_has_keys(open(index, "rb"))


def _every_line_has_keys(f: IO[bytes]) -> bool:
    with f:
        return all(b'"keys":' in raw for raw in f if raw.strip())


def _repeats_path(index: Path) -> Path:
    return index.with_name(f".{index.stem}.repeats.json")  # index.jsonl -> .index.repeats.json


def _stamp(index: Path) -> list[int]:
    st = index.stat()
    return [st.st_size, st.st_mtime_ns]


def _store_repeats(index: Path, known: int | None = None) -> dict[str, list[str]]:
    """Count the repeats of ``index`` (unless the writer ``known``s the count) and store it beside it."""
    repeats = find_repeated_keys(lambda: _iter_shard_keys(index)) if known is None else {}
    try:
        with atomic_write(_repeats_path(index)) as f:
            json.dump({"index": _stamp(index), "repeated_keys": len(repeats) if known is None else known,
                       "keyed": _every_line_has_keys(open(index, "rb"))}, f)
    except OSError:
        pass  # a read-only shard directory: the next start computes it again
    return repeats


def find_repeated_keys(shard_keys: Callable[[], Iterable[tuple[str, list[str]]]], *,
                       most: int = 1_000_000) -> dict[str, list[str]]:
    """``{key: [shard, shard, ...]}`` for every key that occurs more than once among the ``(shard, keys)``
    pairs ``shard_keys()`` yields, shards in that order (the first one owns the key). Two passes over
    ``shard_keys()``, 8 bytes per utterance plus the repeated keys. The hash is Python's own (both passes run in
    this process), 30x cheaper than a stable one at 36M keys."""
    import numpy as np

    from corpus_io.keys import duplicate_hashes

    hashes = array("q")
    for _, keys in shard_keys():
        hashes.extend(map(hash, keys))
    wanted = duplicate_hashes(np.frombuffer(hashes, dtype=np.int64), most=most) if hashes else set()
    if not wanted:
        return {}
    shards: dict[str, list[str]] = {}
    for path, keys in shard_keys():
        for key in keys:
            if hash(key) in wanted:
                shards.setdefault(key, []).append(path)
    return {k: v for k, v in shards.items() if len(v) > 1}


def describe_repeats(repeats: dict[str, list[str]]) -> str:
    """``key 'k' is in shards A and B`` for the first repeated key, plus how many more keys repeat."""
    key, shards = next(iter(repeats.items()))
    where = f"twice in shard {shards[0]}" if len(set(shards)) == 1 else f"in shards {', '.join(dict.fromkeys(shards))}"
    more = f" ({len(repeats) - 1} more keys repeat)" if len(repeats) > 1 else ""
    return f"key '{key}' is {where}{more}"


# --------------------------------------------------------------------------- list and index checks

MAX_UTTERANCE_SECONDS = 86400.0  # an index saying one utterance lasts longer than a day is wrong, not long


def shard_identity(entry: str) -> str:
    """What a list entry points at, for finding a shard listed twice: a local path resolved (``file://``,
    ``./``, ``..``, symbolic links), a URL with its scheme and host lowercased and repeated slashes collapsed."""
    from urllib.parse import urlsplit, urlunsplit

    if entry.startswith("file://"):
        entry = entry[len("file://"):]
    if "://" not in entry:
        return os.path.realpath(entry) if not entry.startswith(("pipe:", "|")) else entry
    parts = urlsplit(entry)
    host = (parts.hostname or "").lower()
    port = parts.port if parts.port not in ({"http": 80, "https": 443}.get(parts.scheme.lower()),) else None
    netloc = host + (f":{port}" if port else "")
    path = "/" + "/".join(p for p in parts.path.split("/") if p) if parts.path else ""
    return urlunsplit((parts.scheme.lower(), netloc, path, parts.query, ""))


def repeated_shard(entries: list[str]) -> tuple[int, int] | None:
    """``(i, j)``, the 1-based numbers of the first two entries of a list that name the same shard (after
    :func:`shard_identity`), or None."""
    seen: dict[str, int] = {}
    for j, entry in enumerate(entries, 1):
        i = seen.setdefault(shard_identity(entry), j)
        if i != j:
            return i, j
    return None


def _number(value: Any, integer: bool) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def index_entry_problems(entry: dict) -> list[str]:
    """What is wrong with one index entry's own values (types, signs, finiteness, order, agreement between
    fields), before any shard is read: ``["duration is nan, not a finite number of seconds >= 0", ...]``."""
    problems = []
    n = entry.get("num_utts")
    if n is not None and (_number(n, True) is None or n < 0):
        problems.append(f"num_utts is {n!r}, not a whole number >= 0")
        n = None
    for name in ("duration", "min_duration", "max_duration"):
        value = entry.get(name)
        if value is None:
            continue
        number = _number(value, False)
        if number is None or number < 0:
            problems.append(f"{name} is {value!r}, not a finite number of seconds >= 0")
        elif number > MAX_UTTERANCE_SECONDS * (n if name == "duration" and n else 1):
            problems.append(f"{name} is {value!r} s, more than {MAX_UTTERANCE_SECONDS:g} s per utterance")
    lo, hi, total = (_number(entry.get(k), False) for k in ("min_duration", "max_duration", "duration"))
    if lo is not None and hi is not None and lo > hi + 1e-6:
        problems.append(f"min_duration {lo} is above max_duration {hi}")
    if hi is not None and total is not None and hi > total + 1e-3:
        problems.append(f"max_duration {hi} is above the shard's total duration {total}")
    size = entry.get("bytes")
    if size is not None and (_number(size, True) is None or size < 0):
        problems.append(f"bytes is {size!r}, not a whole number >= 0")
    sha = entry.get("sha256")
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        problems.append(f"sha256 is {str(sha)[:80]!r}, not 64 lowercase hex digits")
    keys = entry.get("keys")
    if keys is not None:
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            problems.append("keys is not a list of non-empty strings")
        elif n is not None and len(keys) != n:
            problems.append(f"keys lists {len(keys)} keys but num_utts is {n}")
    if "durations" in entry:
        problems.extend(durations_problems(entry["durations"], n, total=total, longest=hi))
    return problems


#: how far an index's ``durations`` (each rounded to 10 ms) may be from the audio, or from the entry's total and
#: longest (rounded to 1 ms), per utterance: half a step of rounding each, and 1 ms for the other side's
DURATION_TOLERANCE = 0.006


def durations_problems(durations: Any, num_utts: int | None = None, *, total: float | None = None,
                       longest: float | None = None) -> list[str]:
    """What is wrong with an index entry's ``durations`` (each utterance's seconds, shard order): not a list, a
    value that is not a finite number of seconds in ``[0, MAX_UTTERANCE_SECONDS]``, a count other than
    ``num_utts``, a sum other than the entry's ``total`` (``duration``) or a largest value other than its
    ``longest`` (``max_duration``), within :data:`DURATION_TOLERANCE` per utterance. The one check of the field:
    the loader, verify-shards, pack-shards and merge-jobs use it. At most two problems (the first bad value)."""
    if not isinstance(durations, list):
        return [f"durations is {str(durations)[:80]!r}, not a list of seconds (one per utterance)"]
    problems = []
    for i, value in enumerate(durations):
        number = _number(value, False)
        if number is None or number < 0:
            return [f"durations[{i}] is {str(value)[:80]!r}, not a finite number of seconds >= 0"]
        if number > MAX_UTTERANCE_SECONDS:
            return [f"durations[{i}] is {value!r} s, more than {MAX_UTTERANCE_SECONDS:g} s per utterance"]
    if num_utts is not None and len(durations) != num_utts:
        problems.append(f"durations lists {len(durations)} values but num_utts is {num_utts}")
    if total is not None and abs(sum(durations) - total) > DURATION_TOLERANCE * max(1, len(durations)):
        problems.append(f"duration is {total} s but durations sum to {sum(durations):.3f} s")
    if longest is not None and durations and abs(max(durations) - longest) > DURATION_TOLERANCE:
        problems.append(f"max_duration is {longest} s but the longest of durations is {max(durations)} s")
    return problems[:2]


def _index_dir(index_path: str | os.PathLike) -> str:
    return os.path.dirname(os.path.realpath(index_path))


def _open_index(path: Path | str, storage_options: dict | None) -> IO[bytes] | None:
    """The index file opened for reading (a URL with the list's ``storage_options``), or None when absent."""
    from corpus_io.storage.urls import open_if_exists

    if isinstance(path, Path):
        return open(path, "rb") if path.is_file() else None
    return open_if_exists(path, storage_options=storage_options)


def _stored(entry: dict, index_dir: str) -> dict:
    """``entry`` as written: ``file`` (relative) first for a local absolute path under ``index_dir``."""
    path = entry["path"]
    if "://" in path or not os.path.isabs(path):
        return entry
    rel = os.path.relpath(path, index_dir)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return entry
    return {"file": rel, **{k: v for k, v in entry.items() if k != "path"}}


def write_index(path: str | os.PathLike, entries: Iterable[dict]) -> None:
    """Write an index atomically, one JSON object per shard (see the module docstring for ``file``)."""
    index_dir = _index_dir(path)
    with atomic_write(path) as f:
        for entry in entries:
            f.write(json.dumps(_stored(entry, index_dir), ensure_ascii=False) + "\n")
    _store_repeats(Path(path))  # once here, offline, so every loader start reads it instead of scanning


def read_index_file(path: Path | str, *, keys: bool = False, lazy: bool = False,
                    storage_options: dict | None = None) -> Any:
    """An ``index.jsonl`` keyed by shard entry (relative paths resolved), or None when ``path`` is not a file.

    ``path``: a local Path, or a URL (str, read with ``storage_options``) as :func:`index_path_for` gives it.
    ``keys``: keep each entry's ``keys`` list; ``lazy``: an iterator of the entries instead of a dict."""
    from corpus_io.storage.urls import is_remote

    path = path if isinstance(path, Path) or is_remote(path) else Path(path)
    f = _open_index(path, storage_options)
    if f is None:
        return None
    entries = _iter_index_file(path, f, keys)
    return entries if lazy else {entry["path"]: entry for entry in entries}


_KEYS_FIELD = b', "keys": ['


def _without_keys(raw: bytes) -> bytes:
    """An index line with its ``keys`` array cut out before parsing: the loader never needs the keys, and
    parsing them is most of the cost at 15M utterances. The cut ends at the first ``"]`` whose quote is not
    escaped, i.e. the end of the last key and of the array (inside a JSON string a quote is always escaped);
    any other shape (an escaped quote there, no keys) keeps the line whole."""
    start = raw.find(_KEYS_FIELD)
    if start < 0:
        return raw
    body = start + len(_KEYS_FIELD)
    if raw[body:body + 1] == b"]":
        return raw[:start] + raw[body + 1:]
    end = raw.find(b'"]', body)
    if end < 0 or raw[end - 1:end] == b"\\":
        return raw
    return raw[:start] + raw[end + 2:]


_DURATIONS_FIELD = b', "durations": ['


def _without_durations(raw: bytes) -> bytes:
    """An index line with its ``durations`` array (numbers only, so its first ``]`` ends it) cut out before
    parsing: a reader that does not ask for them keeps its memory flat in the corpus size."""
    start = raw.find(_DURATIONS_FIELD)
    if start < 0:
        return raw
    end = raw.find(b"]", start + len(_DURATIONS_FIELD))
    return raw if end < 0 else raw[:start] + raw[end + 1:]


def index_durations(list_path: str | os.PathLike, *, storage_options: dict | None = None,
                    listed: list[str] | None = None) -> Iterator[tuple[str, list[float] | None]]:
    """``(shard path, its utterances' seconds)`` per entry of the index of ``list_path``, streamed one shard at a
    time (None for an entry without ``durations``: an older index); nothing when there is no index. Each entry's
    ``durations`` is checked (:func:`index_entry_problems`): a bad one is a DataError naming the index line, the
    shard and (``listed``: the data.list's entries) its line in the list."""
    index = index_path_for(list_path)
    f = _open_index(index, storage_options)
    if f is None:
        return
    where = {u: j for j, u in enumerate(listed or (), 1)}
    for lineno, entry in _iter_index_lines(index, f, keys=False, durations=True):
        if "durations" not in entry:
            yield entry["path"], None
            continue
        problems = index_entry_problems(entry)
        if problems:
            entry_no = where.get(entry["path"])
            in_list = f" (entry {entry_no} of {list_path})" if entry_no else ""
            raise DataError(f"{index}:{lineno}: the index entry of shard {entry['path']}{in_list}: {problems[0]}. "
                            f"The index does not describe the shard: regenerate it with the command that wrote it "
                            f"(pack-shards into the same output_dir; make-datalist for Lhotse Shar and parquet "
                            f"lists) and check the shards with verify-shards.")
        yield entry["path"], [float(v) for v in entry["durations"]]


def _iter_index_file(path: Path | str, f: IO[bytes], keys: bool) -> Iterator[dict]:
    return (entry for _, entry in _iter_index_lines(path, f, keys=keys, durations=keys))


def _iter_index_lines(path: Path | str, f: IO[bytes], *, keys: bool, durations: bool) -> Iterator[tuple[int, dict]]:
    """``(line number, entry)`` of an index file, ``path`` resolved; ``keys``/``durations``: keep those arrays
    (cut out before parsing otherwise)."""
    from corpus_io.storage.urls import beside

    local = isinstance(path, Path)
    index_dir = _index_dir(path) if local else ""
    with f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            text = raw if keys else _without_keys(raw)
            entry = parse_json_object(text if durations else _without_durations(text), f"{path}:{lineno}",
                                      "The index is corrupt: regenerate it with make-datalist or pack-shards.")
            if "path" not in entry and isinstance(entry.get("file"), str):
                resolved = os.path.normpath(os.path.join(index_dir, entry["file"])) if local \
                    else beside(str(path), entry["file"])
                entry = {"path": resolved, **{k: v for k, v in entry.items() if k != "file"}}
            if "path" not in entry:
                raise DataError(f"{path}:{lineno}: an index line needs a 'path' (or 'file', relative to the "
                                f"index's directory) field.")
            if not keys:
                entry.pop("keys", None)
            if not durations:
                entry.pop("durations", None)
            yield lineno, entry


def write_list_and_index(list_path: str | os.PathLike, entries: Iterable[dict], *,
                         repeated_keys: int | None = None) -> int:
    """Write ``data.list`` and its sidecar atomically (index first, so a list never lacks one), streaming
    ``entries`` (a merge of 75,000 parts never holds them all). ``repeated_keys``: the writer already counted
    the keys two shards hold (merge-jobs checks every key), so the index is not scanned again for them.

    The standard keys come first, in :data:`INDEX_FIELDS` order; any other key of an entry (e.g.
    ``fields``, written by add-field) is kept after them.
    """
    index_path = index_path_for(list_path)
    n = 0
    with atomic_write(list_path) as listed, atomic_write(index_path) as index:  # the index commits first
        index_dir = _index_dir(index_path)
        for entry in entries:
            ordered = {k: entry[k] for k in INDEX_FIELDS if k in entry}
            ordered.update((k, v) for k, v in entry.items() if k not in ordered)
            index.write(json.dumps(_stored(ordered, index_dir), ensure_ascii=False) + "\n")
            listed.write(entry["path"] + "\n")
            n += 1
    _store_repeats(Path(index_path), repeated_keys)
    return n
