"""Questions the page asks, answered by DuckDB over the catalog's Parquet table (never Python loops).

Every request's parameters are checked here: unknown columns, a negative page or one past the last, a page
size over :data:`MAX_PAGE_SIZE` or a regex the engine (RE2) rejects raise :class:`BadRequest` (the server's
HTTP 400), and every value reaches the engine as a bound parameter, never spliced into SQL. Sorting by a
string column sorts by its precomputed integer rank (see :mod:`corpus_io.explore.catalog`); ties break by
``row_id``, so pages are stable.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any, Mapping

from corpus_io.explore.catalog import Catalog
from corpus_io.explore.engine import read_stamp, sql_str
from corpus_io.explore.results import SCORE_FIGURES, words_path

MAX_PAGE_SIZE = 1000
MAX_BINS = 200
#: column the page sorts by -> the expression the engine sorts
SORT_EXPR = {"row_id": "row_id", "key": "key_rank", "text": "text_rank", "speaker": "speaker_rank",
             "shard": "shard_id", "duration": "duration", "sample_rate": "sample_rate", "chars": "chars",
             "words": "words", "cps": "cps", "text_count": "text_count"}
RUN_SORTS = ("cer", "wer", "wmr", "char_errors", "word_errors")
HIST_COLUMNS = ("duration", "cps", "chars", "words", "sample_rate", "text_count")
#: the score figures (``++scores``) the page sorts, filters (``<column>_min``/``_max``) and draws
SCORE_COLUMNS_SORTED = tuple(f"score_{f}" for f in SCORE_FIGURES)


class BadRequest(ValueError):
    """A request the explorer refuses (HTTP 400), with a sentence saying what is allowed."""


def int_param(params: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise BadRequest(f"{name}={value} is outside [{lo}, {hi}]")
    return value


def float_param(params: Mapping[str, str], name: str) -> float | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise BadRequest(f"{name}={raw!r} is not a finite number")
    return value


class Explorer:
    """The catalog's table as a DuckDB view, plus the answers the HTTP API serves."""

    def __init__(self, catalog: Catalog, *, token_list: str | None = None, memory_limit: str = "512MB",
                 threads: int | None = None, dump_audio_dir: str | None = None):
        import duckdb

        self.catalog = catalog
        self.token_list = token_list
        self.dump_audio_dir = dump_audio_dir  # bench-loader's <key>.wav files, served instead of the stored audio
        self._con = duckdb.connect()
        self._con.execute(f"SET memory_limit='{memory_limit}'")
        self._con.execute(f"SET temp_directory={sql_str(catalog.cache_dir / '.duckdb-tmp')}")
        if threads:
            self._con.execute(f"SET threads={int(threads)}")
        self._con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({sql_str(catalog.table)})")
        self.columns = [r[0] for r in self._con.execute("DESCRIBE t").fetchall()]
        self.speakers = catalog.cache_dir / "speakers.parquet"
        import numpy as np

        self._offsets = np.load(catalog.cache_dir / "rows.idx", mmap_mode="r")  # 8 bytes a row, paged in on use
        self.runs = len(catalog.runs)
        self.sorts = dict(SORT_EXPR)
        for n in range(1, self.runs + 1):
            suffix = "" if n == 1 else str(n)
            self.sorts.update({f"{c}{suffix}": f"{c}{suffix}" for c in RUN_SORTS})
        if self.runs >= 2:
            self.sorts["cer_delta"] = "cer_delta"
        self.scored = "score_flagged" in self.columns  # corpus-io score's figures joined in (++scores)
        if self.scored:
            self.sorts.update({c: c for c in ("score_flagged", *SCORE_COLUMNS_SORTED)})
        self._lock = threading.Lock()
        self._dataset_lock = threading.Lock()

    def _query(self, sql: str, args: list | None = None) -> list[tuple]:
        with self._lock:  # one connection, many server threads: cursors are cheap, but keep order simple
            cur = self._con.cursor()
        try:
            return cur.execute(sql, args or []).fetchall()
        finally:
            cur.close()

    # ----------------------------------------------------------------- filters

    def check_regex(self, name: str, pattern: str) -> None:
        """Refuse a pattern the engine's regex dialect (RE2) rejects: lookarounds and backreferences are valid
        Python but not RE2, so the engine itself is asked, on an empty string, before the real query."""
        import duckdb

        try:
            self._query("SELECT regexp_matches('', ?)", [pattern])
        except duckdb.InvalidInputException as exc:
            reason = str(exc).removeprefix("Invalid Input Error: ")
            raise BadRequest(f"{name}={pattern!r} is not a regular expression the engine accepts ({reason}; "
                             f"RE2 syntax: no lookarounds or backreferences)") from None

    def where(self, params: Mapping[str, str]) -> tuple[str, list]:
        """The WHERE clause and its bound values for the filter parameters of a request."""
        conds, args = [], []
        for name, col, op in (("dur_min", "duration", ">="), ("dur_max", "duration", "<="),
                              ("cps_min", "cps", ">="), ("cps_max", "cps", "<="),
                              ("cer_min", "cer", ">="), ("cer_max", "cer", "<="),
                              ("cer2_min", "cer2", ">="), ("cer2_max", "cer2", "<=")):
            value = float_param(params, name)
            if value is not None:
                if col not in self.columns:
                    raise BadRequest(f"{name} needs decode results (++decode_dir=...)")
                conds.append(f"{col} {op} ?")
                args.append(value)
        for col in SCORE_COLUMNS_SORTED:
            for name, op in ((f"{col}_min", ">="), (f"{col}_max", "<=")):
                value = float_param(params, name)
                if value is not None:
                    if not self.scored:
                        raise BadRequest(f"{name} needs the figures of a score run: explore "
                                         f"++scores=<its scores.jsonl>")
                    conds.append(f"{col} {op} ?")
                    args.append(value)
        text = params.get("text")
        if text:
            self.check_regex("text", text)
            conds.append("regexp_matches(text, ?)")
            args.append(text)
        if params.get("key"):
            conds.append("contains(key, ?)")
            args.append(params["key"])
        if params.get("speaker"):
            ranks = self._query(f"SELECT speaker_rank FROM read_parquet({sql_str(self.speakers)}) WHERE speaker = ?",
                                [params["speaker"]]) if self.speakers.is_file() else []
            conds.append("speaker_rank = ?")
            args.append(ranks[0][0] if ranks else -1)
        if params.get("shard") not in (None, ""):
            conds.append("shard_id = ?")
            args.append(int_param(params, "shard", 0, 0, max(0, len(self.catalog.shards) - 1)))
        flag = params.get("flag", "")
        if flag == "duplicate":
            conds.append("text_count > 1")
        elif flag == "empty":
            conds.append("chars = 0")
        elif flag == "error":
            conds.append("error IS NOT NULL")
        elif flag in ("flagged", "unflagged"):
            if not self.scored:
                raise BadRequest(f"flag={flag} needs the figures of a score run: explore ++scores=<its scores.jsonl>")
            conds.append("score_flagged" if flag == "flagged" else "NOT score_flagged")
        elif flag in ("better", "worse"):
            if "cer_delta" not in self.columns:
                raise BadRequest(f"flag={flag} needs two decode runs (++decode_dir and ++compare_dir)")
            conds.append("cer_delta < 0" if flag == "better" else "cer_delta > 0")
        elif flag:
            raise BadRequest(f"flag={flag!r}: use duplicate, empty, error, better, worse, flagged or unflagged")
        return (" WHERE " + " AND ".join(conds)) if conds else "", args

    # ----------------------------------------------------------------- answers

    def page(self, params: Mapping[str, str]) -> dict:
        page = int_param(params, "page", 0, 0, 10 ** 12)
        size = int_param(params, "size", 50, 1, MAX_PAGE_SIZE)
        sort = params.get("sort") or "row_id"
        if sort not in self.sorts:
            raise BadRequest(f"sort={sort!r}: sortable columns are {', '.join(sorted(self.sorts))}")
        desc = params.get("desc") in ("1", "true")
        where, args = self.where(params)
        order = f"{self.sorts[sort]} {'DESC' if desc else 'ASC'} NULLS LAST, row_id"
        # the engine sorts and filters the narrow columns and returns row ids; the rows themselves come from
        # rows.jsonl by offset (a wide top-N would decompress every text of the table to keep 50)
        total = self._query(f"SELECT count(*) FROM t{where}", args)[0][0] if where else self.size()
        if page and page * size >= total:  # refused before the sort; page 0 of no rows is an empty page
            last = max(0, -(-total // size) - 1)
            raise BadRequest(f"page={page} is past the last page ({last}): {total} rows at size={size}, "
                             f"pages count from 0")
        ids = [r[0] for r in self._query(f"SELECT row_id FROM t{where} ORDER BY {order} LIMIT ? OFFSET ?",
                                         args + [size, page * size])]
        out = [self.page_row(i) for i in ids]
        for r in out:
            r["shard"] = self.shard_name(r["shard_id"])
        if self.catalog.kind != "shard" and ids:  # one pseudo-shard: the page names each row's own file instead
            sources = dict(self._query(f"SELECT row_id, source FROM t WHERE row_id IN ({', '.join('?' * len(ids))})",
                                       list(ids)))
            for r in out:
                r["source"] = sources.get(r["row_id"])
        return {"page": page, "size": size, "total": total, "rows": out}

    def page_row(self, row_id: int) -> dict:
        """The table fields of one row, read from ``rows.jsonl`` at its offset (one seek)."""
        with open(self.catalog.cache_dir / "rows.jsonl", "rb") as f:
            f.seek(int(self._offsets[row_id]))
            return json.loads(f.readline())

    def size(self) -> int:
        if not hasattr(self, "_size"):
            self._size = self._query("SELECT count(*) FROM t")[0][0]
        return self._size

    def shard_name(self, shard_id: int | None) -> str | None:
        if shard_id is None or not 0 <= shard_id < len(self.catalog.shards):
            return None
        return self.catalog.shards[shard_id].url

    def row(self, row_id: int) -> dict | None:
        rows = self._query("SELECT * FROM t WHERE row_id = ?", [row_id])
        if not rows:
            return None
        r = dict(zip(self.columns, rows[0]))
        shard = self.catalog.shards[r["shard_id"]] if r["shard_id"] is not None else None
        if self.catalog.kind == "shard" and shard is not None:
            r["shard"] = shard.url
            if shard.error and not r.get("error"):
                r["error"] = shard.error
        r["extra"] = json.loads(r["extra"]) if r.get("extra") else {}
        if r.get("hyp") is not None or r.get("hyp2") is not None:
            from corpus_io.explore.results import diff

            r["diff"] = diff(r["text"] or "", r.get("hyp") or "") if r.get("hyp") is not None else None
            if r.get("hyp2") is not None:
                r["diff2"] = diff(r["text"] or "", r["hyp2"] or "")
        return r

    def histogram(self, params: Mapping[str, str]) -> dict:
        column = params.get("column", "duration")
        allowed = HIST_COLUMNS + tuple(c for c in ("cer", "wer", "cer2", "wer2", "cer_delta", *SCORE_COLUMNS_SORTED)
                                       if c in self.columns)
        if column not in allowed:
            raise BadRequest(f"column={column!r}: histograms exist for {', '.join(allowed)}")
        bins = int_param(params, "bins", 40, 1, MAX_BINS)
        where, args = self.where(params)
        cond = f"{where} {'AND' if where else 'WHERE'} {column} IS NOT NULL"
        lo, hi, n = self._query(f"SELECT min({column}), max({column}), count(*) FROM t{cond}", args)[0]
        if not n:
            return {"column": column, "edges": [], "counts": []}
        lo, hi = float(lo), float(hi)
        width = (hi - lo) / bins if hi > lo else 1.0
        got = dict(self._query(f"SELECT least(floor(({column} - ?) / ?)::BIGINT, ?) b, count(*) FROM t{cond} "
                               f"GROUP BY b", [lo, width, bins - 1] + args))
        nb = bins if hi > lo else 1
        return {"column": column, "edges": [lo + i * width for i in range(nb + 1)],
                "counts": [int(got.get(i, 0)) for i in range(nb)]}

    def info(self) -> dict:
        """What the page needs to draw its first table at once: the input, row count, runs and shards."""
        out: dict[str, Any] = {"input": self.catalog.input, "kind": self.catalog.kind, "utterances": self.size(),
                               "runs": self.catalog.runs, "scores": self.catalog.scores}
        if self.catalog.kind == "shard":
            out["shards"] = [{"id": i, "url": s.url, "utterances": s.num_utts, "hours": s.seconds / 3600,
                              "error": s.error} for i, s in enumerate(self.catalog.shards)]
        return out

    def dataset(self) -> dict:
        """:meth:`_dataset`, computed once: the catalog does not change while it is served."""
        with self._dataset_lock:  # not self._lock: _query takes that one
            if not hasattr(self, "_dataset_cache"):
                self._dataset_cache = self._dataset()
            return self._dataset_cache

    def _dataset(self) -> dict:
        """Totals, per-shard balance, alphabet and vocabulary (with tokens missing from the token list)."""
        (utts, secs, speakers, empty, dup_rows, errors) = self._query(
            "SELECT count(*), coalesce(sum(duration), 0), count(DISTINCT speaker), count(*) FILTER (chars = 0),"
            " count(*) FILTER (text_count > 1), count(*) FILTER (error IS NOT NULL) FROM t")[0]
        out = self.info()
        # None, not 0, when no row names a speaker (a raw list without spk): the page then shows "-"
        out.update({"utterances": utts, "hours": secs / 3600, "speakers": speakers or None, "empty_text": empty,
                    "duplicate_text_rows": dup_rows, "errors": errors})
        for n in range(1, self.runs + 1):
            sfx = "" if n == 1 else str(n)
            ce, cr, we, wr, scored = self._query(
                f"SELECT sum(char_errors{sfx}), sum(chars_ref{sfx}), sum(word_errors{sfx}), sum(words_ref{sfx}), "
                f"count(hyp{sfx}) FROM t")[0]
            out[f"run{n}"] = {"dir": self.catalog.runs[n - 1], "scored": scored,
                              "cer": (ce or 0) / cr if cr else None, "wer": (we or 0) / wr if wr else None}
            if n - 1 < len(self.catalog.run_files):
                words = read_stamp(words_path(self.catalog.run_files[n - 1])) or {}
                out[f"run{n}"]["word_accuracy"] = words.get("words", [])
        if self.scored:
            scored, flagged = self._query("SELECT count(score_flagged), count(*) FILTER (score_flagged) FROM t")[0]
            out["score"] = {"file": self.catalog.scores, "scored": scored, "flagged": flagged}
        if self.runs >= 2:
            better, worse = self._query("SELECT count(*) FILTER (cer_delta < 0), count(*) FILTER (cer_delta > 0) "
                                        "FROM t")[0]
            out["compare"] = {"better": better, "worse": worse}
        vocab_path = self.catalog.cache_dir / "vocab.json"
        vocab = json.loads(vocab_path.read_text(encoding="utf-8")) if vocab_path.is_file() else {}
        out.update(vocab)
        if self.token_list:
            out["missing_tokens"] = missing_tokens(self.token_list, vocab)
        return out


def missing_tokens(token_list: str, vocab: dict) -> list[list]:
    """Units of the corpus that the token list lacks, with their counts, most frequent first.

    A token list is WeNet's ``units.txt`` (``token id`` per line) or one token per line. A list of mostly
    single characters (a char tokenizer's) is checked against the corpus alphabet; any other (words) against
    its vocabulary (the top words the catalog keeps)."""
    from corpus_io.storage.files import iter_raw_lines

    tokens = set()
    for _, raw in iter_raw_lines(token_list, what="token list"):
        line = raw.decode("utf-8", "replace").strip()
        if line:
            tokens.add(line.split()[0])
    chars = sum(len(t) == 1 for t in tokens) * 2 >= len(tokens)
    units = vocab.get("alphabet" if chars else "vocabulary", [])
    return [[u, n] for u, n in units if u not in tokens]
