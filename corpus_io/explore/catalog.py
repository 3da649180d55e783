"""The explorer's catalog: one row per utterance, columnar (Parquet), built once and cached.

Inputs: a shard ``data.list`` (+ ``index.jsonl``; a directory holding one is taken as it), a raw list or
FunASR JSONL (one file, or FunASR's list of JSONL files), a Kaldi dir (``wav.scp`` + ``text``
[+ ``utt2spk``, ``segments``]). Per utterance: ``key``, where its audio is (shard + tar member byte range,
or the source path and segment), ``duration``, ``sample_rate``, ``text``, ``speaker``, every other metadata
field (``extra``, JSON text) and, for a shard that cannot be read, ``error``.

Cache (data, never code): ``<cache>/base.parquet`` + ``base.json`` (the stamp: the input's size/mtime, and
per shard its size/mtime or index digest). A rerun rescans only shards whose stamp changed and copies
the other rows from the previous ``base.parquet``. ``table.parquet`` is ``base`` joined with the decode
results (:mod:`corpus_io.explore.results`) plus the derived columns every query needs fast: ``row_id``,
characters (non-space), words, chars per second, how many rows share the text, and integer sort ranks of
the string columns (a sort by ``text`` is a sort by ``text_rank``: 10M strings sort in seconds, 10M ints in
milliseconds). Rows go to the engine through a temporary JSONL file, so memory stays flat while scanning.

Tar members are located with :mod:`tarfile` reading headers only (payloads are seeked past; a remote
shard is read with ranged reads), so the server can later serve an audio member by byte range. A list's
Hugging Face parquet file gives a row per parquet row (its audio named by the row's locator) and a Lhotse Shar
shard a row per cut (its audio a member of the recording tar).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from corpus_io.errors import ConfigError, DataError
from corpus_io.explore.engine import CATALOG_VERSION, connect, file_stamp, read_stamp, sql_str, write_json
from corpus_io.stats import SPEAKER_FIELDS
from corpus_io.stats import meta_duration as _duration
from corpus_io.stats import meta_speaker as _speaker

#: columns written while scanning, with their DuckDB types
BASE_COLUMNS: dict[str, str] = {
    "shard_id": "INTEGER", "pos": "BIGINT", "key": "VARCHAR", "member": "VARCHAR", "audio_offset": "BIGINT",
    "audio_size": "BIGINT", "audio_format": "VARCHAR", "source": "VARCHAR", "seg_start": "DOUBLE",
    "seg_end": "DOUBLE", "duration": "DOUBLE", "sample_rate": "INTEGER", "text": "VARCHAR", "speaker": "VARCHAR",
    "extra": "VARCHAR", "error": "VARCHAR",
}
_META_KNOWN = frozenset({"key", "duration", "sample_rate", "num_samples", "source", "target", "wav", "txt",
                         "start", "end", *SPEAKER_FIELDS})


@dataclass
class Shard:
    """One entry of a shard list (or the one pseudo-shard of a raw list / Kaldi dir)."""

    url: str
    stamp: list = field(default_factory=list)
    gz: bool = False
    error: str | None = None
    num_utts: int = 0
    seconds: float = 0.0


@dataclass
class Catalog:
    """A built catalog: where its table is and what it holds."""

    input: str
    kind: str  # shard | raw | kaldi
    cache_dir: Path
    shards: list[Shard]
    storage_options: dict | None = None
    runs: list[str] = field(default_factory=list)  # decode dirs joined in, in order (hyp, hyp2)
    run_files: list[Path] = field(default_factory=list)  # their cached results (run-*.parquet)
    scores: str | None = None  # the scores.jsonl of corpus-io score joined in (score_* columns)

    @property
    def table(self) -> Path:
        return self.cache_dir / "table.parquet"


# --------------------------------------------------------------------------- inputs


def detect(input_path: str) -> tuple[str, str]:
    """``(kind, list path)``: ``shard`` (a data.list), ``raw`` (JSONL) or ``kaldi`` (a directory)."""
    from corpus_io.storage.urls import is_remote
    from corpus_io.tables.shar import is_shar_cuts

    if is_remote(input_path):
        return "shard", input_path
    p = Path(input_path)
    if p.is_dir():
        if (p / "wav.scp").is_file():
            return "kaldi", str(p)
        if (p / "data.list").is_file():
            return "shard", str(p / "data.list")
        raise ConfigError(f"input {p} is a directory with neither wav.scp (a Kaldi dir) nor data.list (packed "
                          f"shards). Pass a data.list, a raw/FunASR JSONL or a Kaldi dir.")
    if not p.is_file():
        raise ConfigError(f"input {p} does not exist. Pass a shard data.list (or its directory), a raw list or "
                          f"FunASR JSONL, or a Kaldi dir.")
    with open(p, "rb") as f:
        head = b""
        for raw in f:
            if raw.strip():
                head = raw.strip()
                break
    shar = is_shar_cuts(head.decode("utf-8", "replace"))  # a Shar's plain cuts.jsonl is a shard line
    if head.startswith(b"{") or (head.endswith((b".jsonl", b".json")) and not shar):
        return "raw", str(p)
    return "shard", str(p)


def default_cache_dir(input_path: str) -> Path:
    """``<input dir>/.explore/<input name>/`` when writable, else under ``~/.cache/corpus-io/explore``."""
    from corpus_io.storage.urls import is_remote

    digest = hashlib.sha256(input_path.encode()).hexdigest()[:16]
    if not is_remote(input_path):
        p = Path(input_path).resolve()
        parent = p if p.is_dir() else p.parent
        if os.access(parent, os.W_OK):
            return parent / ".explore" / (p.name + "-" + digest[:8])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "corpus-io" / "explore" / digest


def _extra(meta: dict) -> str | None:
    rest = {k: v for k, v in meta.items() if k not in _META_KNOWN and not k.endswith("_len")}
    return json.dumps(rest, ensure_ascii=False) if rest else None


# --------------------------------------------------------------------------- shards


def open_shard(url: str, storage_options: dict | None):
    from corpus_io.storage.urls import is_remote, local_path, open_url

    if is_remote(url):
        return open_url(url, storage_options=storage_options, seekable=True, block_size=1 << 20)
    return open(local_path(url), "rb")


def local_stamp(url: str) -> list:
    """Size and mtime of a local shard's files: a tar, a parquet entry's file (its column mapping dropped), or a
    Shar shard's cuts and recording tar."""
    from corpus_io.storage.urls import local_path
    from corpus_io.tables import parquet, shar

    if shar.is_shar_cuts(url):
        return file_stamp(local_path(url)) + file_stamp(local_path(shar.recording_of(url)))
    return file_stamp(local_path(parquet.split_entry(url)[0]))


def scan_shard(url: str, shard_id: int, *, storage_options: dict | None = None) -> tuple[list[dict], bool]:
    """Catalog rows of one shard from its tar headers, ``.txt`` and ``.json`` members (audio is not read),
    and whether the shard is gzip-compressed (then offsets are in the decompressed stream). A parquet file or a
    Lhotse Shar shard listed as a shard is read as the loader reads it (:func:`_scan_parquet`,
    :func:`_scan_shar`)."""
    from corpus_io.shards.format import AUDIO_EXTS, key_from_member_name, split_member
    from corpus_io.tables import parquet, shar

    if shar.is_shar_cuts(url):
        return _scan_shar(url, shard_id, storage_options), False
    if parquet.split_entry(url)[0].endswith(".parquet"):
        return _scan_parquet(url, shard_id, storage_options), False
    rows: list[dict] = []
    with open_shard(url, storage_options) as f:
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        try:
            tar = tarfile.open(fileobj=f, mode="r:gz" if gz else "r:")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataError(f"{url} is not a readable tar ({exc}); re-copy the shard or re-pack it with "
                            f"pack-shards (check it with verify-shards).") from None
        group: dict[str, Any] = {}
        prefix = None

        def finish() -> None:
            meta = group.get("meta") or {}
            key = meta.get("key") if isinstance(meta.get("key"), str) else None
            if not key:
                try:
                    key = key_from_member_name(prefix)
                except UnicodeDecodeError:
                    key = prefix
            dur = _duration(meta)
            rate = meta.get("sample_rate")
            rows.append({"shard_id": shard_id, "pos": len(rows), "key": key, "member": group.get("member"),
                         "audio_offset": group.get("audio_offset"), "audio_size": group.get("audio_size"),
                         "audio_format": group.get("audio_format"), "duration": dur,
                         "sample_rate": int(rate) if isinstance(rate, (int, float)) and rate else None,
                         "text": group.get("txt", ""), "speaker": _speaker(meta), "extra": _extra(meta)})

        try:
            for info in tar:
                if not info.isfile():
                    continue
                name_prefix, ext = split_member(info.name)
                if name_prefix != prefix:
                    if prefix is not None:
                        finish()
                    prefix, group = name_prefix, {}
                if ext == "txt":
                    group["txt"] = tar.extractfile(info).read().decode("utf-8", "replace")
                elif ext == "json":
                    try:
                        meta = json.loads(tar.extractfile(info).read())
                    except ValueError:
                        meta = {}
                    group["meta"] = meta if isinstance(meta, dict) else {}
                elif ext in AUDIO_EXTS:
                    group.update(member=info.name, audio_offset=info.offset_data, audio_size=info.size,
                                 audio_format=ext)
            if prefix is not None:
                finish()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataError(f"{url}: the tar is damaged after {len(rows)} utterances ({exc}); re-copy the shard or "
                            f"re-pack it (check it with verify-shards).") from None
    _probe_missing(rows, url, storage_options, gz)
    return rows, gz


def _probe_missing(rows: list[dict], url: str, storage_options: dict | None, gz: bool) -> None:
    """Duration and rate from the audio header of members whose ``.json`` lacks them (foreign tars), and the
    container of members whose name does not say it (a Shar's ``.original``)."""
    from corpus_io.audio.io import header_info, sniff_audio_format

    todo = [r for r in rows if (r["duration"] is None or r["sample_rate"] is None or r["audio_format"] is None)
            and r["audio_size"]]
    if not todo or gz:
        return
    with open_shard(url, storage_options) as f:
        for r in todo:
            f.seek(r["audio_offset"])
            head = f.read(min(r["audio_size"], 1 << 16))
            r["audio_format"] = r["audio_format"] or sniff_audio_format(head)
            info = header_info(head, r["audio_size"])
            if info is not None and info.sample_rate:
                r["sample_rate"] = r["sample_rate"] or info.sample_rate
                if r["duration"] is None:
                    r["duration"] = info.num_samples / info.sample_rate


def _scan_parquet(entry: str, shard_id: int, storage_options: dict | None) -> list[dict]:
    """Catalog rows of a listed parquet file (its data.list line ``entry``): duration and rate from each audio
    cell's header, the audio named by its row's locator (``source``, read by :func:`corpus_io.tables.parquet.
    read_audio`: parquet pages are compressed, so a cell has no byte range in the file)."""
    from corpus_io.audio.io import probe_bytes, sniff_audio_format
    from corpus_io.tables import parquet

    url, columns = parquet.split_entry(entry)
    rows = []
    for row in parquet.ParquetFileReader(url, columns, storage_options).rows():
        fields = dict(row.fields)
        out = {"shard_id": shard_id, "pos": row.index, "key": row.key,
               "source": parquet.locator(url, columns, row.index), "text": "" if row.text is None else str(row.text),
               "speaker": _speaker(fields), "extra": _extra(fields), "duration": None, "sample_rate": None}
        if row.data is None and not row.path:
            out["error"] = f"{url} row {row.index}: its audio is null"
        elif row.data is not None:  # else not embedded: its path is read when played
            out["audio_size"], out["audio_format"] = len(row.data), sniff_audio_format(row.data)
            try:
                info = probe_bytes(row.data, f"{url} row {row.index}")
                out["sample_rate"], out["duration"] = info.sample_rate, info.num_samples / info.sample_rate
            except DataError as exc:
                out["error"] = str(exc)
        rows.append(out)
    return rows


def _scan_shar(url: str, shard_id: int, storage_options: dict | None) -> list[dict]:
    """Catalog rows of a Shar shard (``url``: its cuts file): the cuts' keys, texts and fields, each audio the byte
    range of its member in the recording tar (``source``), located from the tar's headers."""
    from corpus_io.audio.io import AUDIO_EXTENSIONS
    from corpus_io.tables import shar

    tar_url = shar.recording_of(url)
    rows = []
    for pos, (rec, member, info) in enumerate(shar.locate_shar_shard(url, storage_options=storage_options)):
        ext = member.rsplit(".", 1)[-1].lower()
        fields = {k: v for k, v in rec.items() if k != "where"}
        rows.append({"shard_id": shard_id, "pos": pos, "key": rec["key"], "member": member,
                     "audio_offset": info.offset_data, "audio_size": info.size,
                     "audio_format": ext if ext in AUDIO_EXTENSIONS else None, "source": tar_url,
                     "duration": _duration(fields), "sample_rate": None, "text": rec["target"],
                     "speaker": _speaker(fields), "extra": _extra(fields)})
    _probe_missing(rows, tar_url, storage_options, False)
    return rows


def _shard_stamp(url: str, entry: dict | None) -> list:
    from corpus_io.storage.urls import is_remote

    if not is_remote(url):
        return local_stamp(url)
    if entry is not None and (entry.get("sha256") or entry.get("bytes")):
        return [entry.get("bytes"), entry.get("sha256")]
    return ["remote"]


def _index_keys(list_path: str, storage_options: dict | None) -> dict[str, list[str]]:
    from corpus_io.shards.index import load_index

    index = load_index(list_path, keys=True, storage_options=storage_options) or {}
    return {url: [str(k) for k in e.get("keys") or []] for url, e in index.items()}


def _iter_shard_rows(list_path: str, shards: list[Shard], todo: set[int],
                     storage_options: dict | None) -> Iterator[dict]:
    from corpus_io.storage.progress import progress

    keys_of: dict[str, list[str]] | None = None
    for i in progress(sorted(todo), desc="catalog", unit="shard"):
        shard = shards[i]
        try:
            rows, shard.gz = scan_shard(shard.url, i, storage_options=storage_options)
            shard.error = None
        except DataError as exc:
            shard.error = str(exc)
            if keys_of is None:
                keys_of = _index_keys(list_path, storage_options)
            # the index still names the shard's keys: each becomes a row that says why it cannot play
            rows = [{"shard_id": i, "pos": p, "key": k, "text": "", "error": shard.error}
                    for p, k in enumerate(keys_of.get(shard.url, []))]
        yield from rows


# --------------------------------------------------------------------------- raw lists and Kaldi dirs


def _iter_raw_rows(path: str) -> Iterator[dict]:
    from corpus_io.loader.rawlist import RawList
    from corpus_io.storage.progress import progress

    lst = RawList(path)
    for i in progress(range(len(lst)), desc="catalog", unit="utt"):
        yield _source_row(lst.record(i), i)


def _iter_kaldi_rows(path: str) -> Iterator[dict]:
    from corpus_io.storage.progress import progress
    from corpus_io.tables.kaldi import KeyedTable, iter_segments, iter_table

    d = Path(path)
    if not (d / "text").is_file():
        raise ConfigError(f"Kaldi dir {d} has no text file; the explorer needs wav.scp and text.")
    text = KeyedTable(d / "text", allow_empty_value=True)
    spk = KeyedTable(d / "utt2spk") if (d / "utt2spk").is_file() else None
    if (d / "segments").is_file():
        wavs = KeyedTable(d / "wav.scp")
        items = ((s.key, wavs.get(s.recording), s.start, s.end) for s in iter_segments(d / "segments"))
    else:
        items = ((t.key, t.value, None, None) for t in iter_table(d / "wav.scp"))
    for i, (key, source, start, end) in enumerate(progress(items, desc="catalog", unit="utt")):
        rec = {"key": key, "source": source, "target": text.get(key) or "",
               "speaker": spk.get(key) if spk is not None else None, "start": start, "end": end}
        yield _source_row(rec, i)


def _source_row(rec: dict, i: int) -> dict:
    """A catalog row of a raw/Kaldi utterance: audio stays at its source (header probed, never decoded)."""
    from corpus_io.audio import io as audio
    from corpus_io.storage.urls import is_command, is_remote

    source = None if rec.get("source") is None else str(rec["source"])
    if source and not is_remote(source) and not is_command(source) and os.path.exists(source):
        source = os.path.abspath(source)  # the server may run from another directory
    row = {"shard_id": 0, "pos": i, "key": str(rec["key"]), "source": source, "text": str(rec.get("target") or ""),
           "speaker": _speaker(rec), "extra": _extra(rec), "audio_format": audio.extension_of(source or "") or None}
    start, end = rec.get("start"), rec.get("end")
    row["seg_start"] = float(start) if start is not None else None
    row["seg_end"] = float(end) if end is not None and float(end) >= 0 else None
    dur = _duration(rec)
    try:
        info = audio.probe(source) if source else None
    except DataError as exc:
        info = None
        row["error"] = str(exc)
    if info is not None and info.sample_rate:
        row["sample_rate"] = info.sample_rate
        if dur is None:
            total = info.num_samples / info.sample_rate
            dur = (row["seg_end"] if row["seg_end"] is not None else total) - (row["seg_start"] or 0.0)
    row["duration"] = dur
    return row


# --------------------------------------------------------------------------- build


def _columns_sql() -> str:
    return "{" + ", ".join(f"{sql_str(k)}: {sql_str(v)}" for k, v in BASE_COLUMNS.items()) + "}"


def _write_rows(rows: Iterator[dict], path: Path) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def build_base(input_path: str, cache_dir: Path, *, storage_options: dict | None = None) -> tuple[str, list[Shard]]:
    """Bring ``cache_dir/base.parquet`` up to date with the input; returns ``(kind, shards)``."""
    from corpus_io.storage.files import temp_name

    kind, list_path = detect(input_path)
    cache_dir.mkdir(parents=True, exist_ok=True)
    stamp_path, base = cache_dir / "base.json", cache_dir / "base.parquet"
    old = read_stamp(stamp_path) if base.is_file() else None
    if kind == "shard":
        from corpus_io.shards.index import load_index, read_datalist

        urls = read_datalist(list_path, storage_options=storage_options)
        index = load_index(list_path, storage_options=storage_options) or {}
        shards = [Shard(u, _shard_stamp(u, index.get(u))) for u in urls]
        previous = {} if old is None or old.get("kind") != "shard" else \
            {(s["url"], json.dumps(s["stamp"])): (i, s) for i, s in enumerate(old["shards"])}
        keep: dict[int, int] = {}  # new shard id -> old shard id
        for i, s in enumerate(shards):
            hit = previous.get((s.url, json.dumps(s.stamp)))
            if hit is not None and hit[1].get("error") is None:
                keep[i] = hit[0]
                s.gz = bool(hit[1].get("gz"))
        todo = set(range(len(shards))) - set(keep)
        if old is not None and not todo and len(keep) == len(old["shards"]) and \
                all(k == v for k, v in keep.items()):
            return kind, _shards_from(old)
        rows = _iter_shard_rows(list_path, shards, todo, storage_options)
    else:
        stamp = file_stamp(list_path) if kind == "raw" else \
            [file_stamp(str(Path(list_path) / n)) for n in ("wav.scp", "text", "utt2spk", "segments")]
        shards = [Shard(list_path, stamp)]
        if old is not None and old.get("kind") == kind and old["shards"][0]["stamp"] == stamp:
            return kind, _shards_from(old)
        keep, rows = {}, (_iter_raw_rows(list_path) if kind == "raw" else _iter_kaldi_rows(list_path))
    tmp_rows = temp_name(cache_dir / "rows.jsonl")
    tmp_base = temp_name(base)
    con = connect(cache_dir)
    try:
        _write_rows(rows, tmp_rows)
        fresh = (f"SELECT * FROM read_json({sql_str(tmp_rows)}, format='newline_delimited', "
                 f"columns={_columns_sql()})")
        parts = [fresh]
        if keep:
            pairs = ", ".join(f"({new}, {old_id})" for new, old_id in keep.items())
            cols = ", ".join("m.new_id AS shard_id" if c == "shard_id" else f"b.{c}" for c in BASE_COLUMNS)
            parts.append(f"SELECT {cols} FROM read_parquet({sql_str(base)}) b JOIN (VALUES {pairs}) "
                         f"m(new_id, old_id) ON b.shard_id = m.old_id")
        con.execute(f"COPY (SELECT * FROM ({' UNION ALL '.join(parts)}) ORDER BY shard_id, pos) TO "
                    f"{sql_str(tmp_base)} (FORMAT parquet, COMPRESSION zstd)")
        per_shard = dict(((sid, (n, s)) for sid, n, s in con.execute(
            f"SELECT shard_id, count(*), coalesce(sum(duration), 0) FROM read_parquet({sql_str(tmp_base)}) "
            f"WHERE error IS NULL GROUP BY shard_id").fetchall()))
    finally:
        con.close()
        tmp_rows.unlink(missing_ok=True)
    for i, s in enumerate(shards):
        s.num_utts, s.seconds = per_shard.get(i, (0, 0.0))
    os.replace(tmp_base, base)
    write_json(stamp_path, {"version": CATALOG_VERSION, "kind": kind, "input": input_path,
                             "shards": [vars(s) for s in shards]})
    return kind, shards


def _shards_from(stamp: dict) -> list[Shard]:
    return [Shard(**s) for s in stamp["shards"]]


_DERIVED = """
    b.* EXCLUDE (file_row_number),
    length(regexp_replace(b.text, '\\s', '', 'g'))::INTEGER AS chars,
    CASE WHEN trim(b.text) = '' THEN 0 ELSE len(string_split_regex(trim(b.text), '\\s+')) END::INTEGER AS words,
    CASE WHEN b.duration > 0 THEN length(regexp_replace(b.text, '\\s', '', 'g')) / b.duration END AS cps,
    r.text_count, r.key_rank, r.text_rank, r.speaker_rank
"""
#: the sort ranks and duplicate counts, computed on the string columns alone (a narrow sort, not the whole row);
#: an empty, blank or missing text is "empty" (chars = 0), never a duplicate: its text_count is NULL
_RANKS = """
    SELECT file_row_number AS row_id, dense_rank() OVER (ORDER BY key)::INTEGER AS key_rank,
        dense_rank() OVER (ORDER BY text)::INTEGER AS text_rank,
        CASE WHEN regexp_matches(text, '\\S') THEN count(*) OVER (PARTITION BY text) END::INTEGER AS text_count,
        dense_rank() OVER (ORDER BY speaker NULLS FIRST)::INTEGER AS speaker_rank
    FROM read_parquet({base}, file_row_number=true)
"""


def build(input_path: str, *, cache_dir: str | os.PathLike | None = None, decode_dirs: list[str] = (),
          storage_options: dict | None = None, scores: str | None = None) -> Catalog:
    """Build (or reuse) the catalog of ``input_path`` joined with the given decode result dirs and the
    ``scores.jsonl`` of corpus-io score (``scores``: the file or its output_dir)."""
    from corpus_io.explore.results import build_results, build_scores, check_hyps, scores_file

    runs = [str(Path(d).resolve()) for d in decode_dirs if d]
    for d in runs:  # before anything is written
        check_hyps(d)
    scored = str(scores_file(scores).resolve()) if scores else None
    cache = Path(cache_dir) if cache_dir else default_cache_dir(input_path)
    kind, shards = build_base(input_path, cache, storage_options=storage_options)
    run_files = [build_results(d, cache) for d in runs]
    build_table(cache, run_files, build_scores(scored, cache) if scored else None)
    return Catalog(input_path, kind, cache, shards, storage_options, runs, run_files, scored)


def build_table(cache: Path, results: list[Path], scores: Path | None = None) -> Path:
    """``cache/table.parquet``: ``base.parquet`` joined with decode results (``run-*.parquet``, in order) and score
    figures (``scores-*.parquet``) plus the derived columns and sort ranks, and ``vocab.json``; kept when no input
    changed."""
    from corpus_io.explore.results import RESULT_COLUMNS, SCORE_COLUMNS
    from corpus_io.storage.files import temp_name

    table = cache / "table.parquet"
    want = {"version": CATALOG_VERSION, "base": file_stamp(str(cache / "base.parquet")),
            "runs": [[str(p), file_stamp(str(p))] for p in results]}
    if scores is not None:
        want["scores"] = [str(scores), file_stamp(str(scores))]
    if table.is_file() and read_stamp(cache / "table.json") == want:
        return table
    base = sql_str(cache / "base.parquet")
    selects, joins = ["b.file_row_number AS row_id", _DERIVED], []
    for n, path in enumerate(results, 1):
        suffix = "" if n == 1 else str(n)
        selects.append(", ".join(f"r{n}.{c} AS {c}{suffix}" for c in RESULT_COLUMNS))
        joins.append(f"LEFT JOIN read_parquet({sql_str(path)}) r{n} ON r{n}.key = b.key")
    if len(results) >= 2:
        selects.append("r2.cer - r1.cer AS cer_delta")
    if scores is not None:
        selects.append(", ".join(f"s.{c} AS {c}" for c in SCORE_COLUMNS))
        joins.append(f"LEFT JOIN read_parquet({sql_str(scores)}) s ON s.key = b.key")
    tmp = temp_name(table)
    con = connect(cache)
    try:
        con.execute(f"CREATE TEMP TABLE r AS {_RANKS.format(base=base)}")
        con.execute(f"COPY (SELECT {', '.join(selects)} FROM read_parquet({base}, file_row_number=true) b "
                    f"JOIN r ON r.row_id = b.file_row_number {' '.join(joins)}) TO {sql_str(tmp)} "
                    f"(FORMAT parquet, COMPRESSION snappy, ROW_GROUP_SIZE 100000)")  # scans: snappy ~1.5x zstd
        _build_vocab(con, tmp, cache / "vocab.json")
        # speaker -> its rank: a speaker filter becomes an integer comparison over the table
        con.execute(f"COPY (SELECT DISTINCT speaker, speaker_rank FROM read_parquet({sql_str(tmp)}) WHERE speaker IS "
                    f"NOT NULL) TO {sql_str(cache / 'speakers.parquet')} (FORMAT parquet)")
        _write_page_rows(con, tmp, cache, len(results), scores is not None)
    finally:
        con.close()
    os.replace(tmp, table)
    write_json(cache / "table.json", want)
    return table


#: what a table row shows; the engine finds a page's row ids, these come from ``rows.jsonl`` by offset
PAGE_FIELDS = ("row_id", "key", "shard_id", "duration", "sample_rate", "text", "speaker", "chars", "cps",
               "text_count", "error")
RUN_PAGE_FIELDS = ("hyp", "cer", "wer")


def page_fields(runs: int, scores: bool = False) -> list[str]:
    from corpus_io.explore.results import SCORE_COLUMNS

    cols = list(PAGE_FIELDS)
    for n in range(1, runs + 1):
        cols += [f"{c}{'' if n == 1 else n}" for c in RUN_PAGE_FIELDS]
    return cols + (["cer_delta"] if runs >= 2 else []) + (list(SCORE_COLUMNS) if scores else [])


def _write_page_rows(con: Any, table: Path, cache: Path, runs: int, scores: bool = False) -> None:
    """``rows.jsonl`` (one JSON object per row, in row_id order) and ``rows.idx`` (its line offsets, .npy): a
    page of 50 rows is 50 seeks, whatever the sort, instead of the engine decompressing every text to fetch
    them (see :mod:`corpus_io.explore.query`)."""
    import numpy as np

    from corpus_io.loader.rawlist import build_offsets
    from corpus_io.storage.files import temp_name

    rows, idx = cache / "rows.jsonl", cache / "rows.idx"
    tmp_rows, tmp_idx = temp_name(rows), temp_name(idx)
    con.execute(f"COPY (SELECT {', '.join(page_fields(runs, scores))} FROM read_parquet({sql_str(table)}) ORDER BY "
                f"row_id) TO {sql_str(tmp_rows)} (FORMAT json)")
    with open(tmp_idx, "wb") as f:
        np.save(f, build_offsets(str(tmp_rows)))
    os.replace(tmp_rows, rows)
    os.replace(tmp_idx, idx)


VOCAB_TOP = 5000


def _build_vocab(con: Any, table: Path, out: Path) -> None:
    """Alphabet (every character) and vocabulary (top words) with counts, computed once by the engine."""
    t = sql_str(table)
    chars = con.execute(f"SELECT c, count(*) n FROM (SELECT unnest(string_split(regexp_replace(text, '\\s', '', "
                        f"'g'), '')) c FROM read_parquet({t})) GROUP BY c ORDER BY n DESC, c").fetchall()
    words = con.execute(f"SELECT w, count(*) n FROM (SELECT unnest(string_split_regex(trim(text), '\\s+')) w "
                        f"FROM read_parquet({t}) WHERE trim(text) <> '') GROUP BY w ORDER BY n DESC, w").fetchall()
    write_json(out, {"alphabet": chars, "vocabulary": words[:VOCAB_TOP], "num_words": len(words),
                      "word_tokens": sum(n for _, n in words)})
