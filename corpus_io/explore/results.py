"""Decode results in the explorer: per-utterance errors from a ``corpus-io decode`` output dir, and the
aligned reference/hypothesis diff the row view marks (substitutions, insertions, deletions).

A decode dir holds ``text`` (Kaldi table: ``key hypothesis``). The reference is the catalog's text (the
corpus' own transcript), so the explorer's numbers are about the data the user is looking at. Units are
:mod:`corpus_io.decoding.scoring`'s: CER over non-space characters, WER over words with each CJK character a
word; the word match rate (NeMo's WMR) is the share of reference words the hypothesis got right.
Results are cached as ``<cache>/run-<digest>.parquet``, rebuilt when the ``text`` file or the base changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from corpus_io.errors import ConfigError, DataError
from corpus_io.explore.engine import CATALOG_VERSION

RESULT_COLUMNS = ("hyp", "cer", "char_errors", "chars_ref", "wer", "word_errors", "words_ref", "wmr")
_TYPES = {"key": "VARCHAR", "hyp": "VARCHAR", "cer": "DOUBLE", "char_errors": "INTEGER", "chars_ref": "INTEGER",
          "wer": "DOUBLE", "word_errors": "INTEGER", "words_ref": "INTEGER", "wmr": "DOUBLE"}


def hyp_file(decode_dir: str) -> Path:
    path = Path(decode_dir) / "text"
    if not path.is_file():
        raise ConfigError(f"decode_dir {decode_dir} has no 'text' file of hypotheses; pass the output_dir of "
                          f"corpus-io decode (it writes text, ref, cer.txt and wer.txt).")
    return path


def check_hyps(decode_dir: str) -> Path:
    """The ``text`` of ``decode_dir``, refused (a DataError naming both ``file:line``) when it repeats a key, as the
    catalog refuses a Kaldi dir's ``text`` that does: joined to the catalog, a repeated key would show its
    utterance twice and count it twice in every total."""
    from corpus_io.tables.kaldi import check_unique_keys

    path = hyp_file(decode_dir)
    try:
        check_unique_keys(path)
    except DataError as exc:
        raise DataError(f"{exc} corpus-io decode writes each key once; a text joined from several runs (cat) "
                        f"repeats them: keep one line per key.") from None
    return path


def score(ref: str, hyp: str) -> dict:
    """Per-utterance CER/WER/WMR of ``hyp`` against ``ref``."""
    from corpus_io.decoding.scoring import char_units, edit_counts, word_units

    c = edit_counts(char_units(ref), char_units(hyp))
    w = edit_counts(word_units(ref), word_units(hyp))
    return {"cer": c.errors / c.ref if c.ref else float(bool(c.errors)), "char_errors": c.errors, "chars_ref": c.ref,
            "wer": w.errors / w.ref if w.ref else float(bool(w.errors)), "word_errors": w.errors, "words_ref": w.ref,
            "wmr": (w.ref - w.sub - w.dele) / w.ref if w.ref else None}


def build_results(decode_dir: str, cache_dir: Path) -> Path:
    """``run-<digest>.parquet`` (key + :data:`RESULT_COLUMNS`) for ``decode_dir``, rebuilt when stale."""
    from corpus_io.explore.engine import connect, file_stamp, read_stamp, sql_str, write_json
    from corpus_io.storage.files import temp_name
    from corpus_io.tables.kaldi import iter_table

    hyps = hyp_file(decode_dir)
    digest = hashlib.sha256(str(Path(decode_dir).resolve()).encode()).hexdigest()[:12]
    out, stamp_path = cache_dir / f"run-{digest}.parquet", cache_dir / f"run-{digest}.json"
    want = {"version": CATALOG_VERSION, "text": file_stamp(str(hyps)),
            "base": file_stamp(str(cache_dir / "base.parquet"))}
    if out.is_file() and {k: v for k, v in (read_stamp(stamp_path) or {}).items() if k != "version"} == \
            {k: v for k, v in want.items() if k != "version"}:
        return out
    tmp_hyps, tmp_scores, tmp_out = temp_name(cache_dir / "hyps.jsonl"), temp_name(cache_dir / "scores.jsonl"), \
        temp_name(out)
    con = connect(cache_dir)
    try:
        with open(tmp_hyps, "w", encoding="utf-8") as f:
            for line in iter_table(hyps, allow_empty_value=True):
                f.write(json.dumps({"key": line.key, "hyp": line.value}, ensure_ascii=False) + "\n")
        cur = con.execute(f"SELECT h.key, h.hyp, b.text FROM read_json({sql_str(tmp_hyps)}, format="
                          f"'newline_delimited', columns={{'key': 'VARCHAR', 'hyp': 'VARCHAR'}}) h JOIN "
                          f"read_parquet({sql_str(cache_dir / 'base.parquet')}) b ON b.key = h.key")
        words = WordAccuracy()
        with open(tmp_scores, "w", encoding="utf-8") as f:
            while batch := cur.fetchmany(10000):
                for key, hyp, ref in batch:
                    scores = score(ref or "", hyp or "")
                    words.add(ref or "", hyp or "", exact=scores["word_errors"] == 0)
                    f.write(json.dumps({"key": key, "hyp": hyp, **scores}, ensure_ascii=False) + "\n")
        write_json(words_path(out), words.summary())
        columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in _TYPES.items()) + "}"
        con.execute(f"COPY (SELECT * FROM read_json({sql_str(tmp_scores)}, format='newline_delimited', "
                    f"columns={columns})) TO {sql_str(tmp_out)} (FORMAT parquet)")
    finally:
        con.close()
        tmp_hyps.unlink(missing_ok=True)
        tmp_scores.unlink(missing_ok=True)
    os.replace(tmp_out, out)
    write_json(stamp_path, want)
    return out


WORDS_TOP = 5000


def words_path(run_parquet: Path) -> Path:
    return run_parquet.with_suffix(".words.json")


class WordAccuracy:
    """Per vocabulary word: how often it is in the references and how often the hypothesis has it aligned
    to itself (NeMo's "word accuracy"); kaldialign's C++ alignment when installed, else :func:`align`."""

    def __init__(self) -> None:
        from collections import Counter

        self.count: Counter = Counter()
        self.hits: Counter = Counter()
        try:
            from kaldialign import align as fast

            self._pairs = lambda r, h: fast(r, h, "\x00")
        except ImportError:
            self._pairs = lambda r, h: [(a, b) for _, a, b in align(r, h)]

    def add(self, ref: str, hyp: str, *, exact: bool) -> None:
        from corpus_io.decoding.scoring import word_units

        units = word_units(ref)
        self.count.update(units)
        self.hits.update(units if exact else (a for a, b in self._pairs(units, word_units(hyp)) if a == b))

    def summary(self) -> dict:
        top = self.count.most_common(WORDS_TOP)
        return {"version": CATALOG_VERSION, "num_words": len(self.count),
                "words": [[w, n, self.hits[w]] for w, n in top]}


def align(ref: list[str], hyp: list[str]) -> list[tuple[str, str, str]]:
    """``(op, ref unit, hyp unit)`` along a minimum edit path; op is ``=``, ``S``, ``I`` or ``D``.

    Ties break as Kaldi's compute-wer does (a substitution first, then a deletion, then an insertion), so
    the marks add up to :func:`corpus_io.decoding.scoring.edit_counts`' totals for one utterance."""
    n, m = len(ref), len(hyp)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        cost[i][0] = i
    for j in range(1, m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            diag = cost[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1])
            cost[i][j] = min(diag, cost[i - 1][j] + 1, cost[i][j - 1] + 1)
    ops: list[tuple[str, str, str]] = []
    i, j = n, m
    while i or j:
        if i and j and cost[i][j] == cost[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            ops.append(("=" if ref[i - 1] == hyp[j - 1] else "S", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and cost[i][j] == cost[i - 1][j] + 1:
            ops.append(("D", ref[i - 1], ""))
            i -= 1
        else:
            ops.append(("I", "", hyp[j - 1]))
            j -= 1
    return ops[::-1]


def diff(ref: str, hyp: str) -> dict[str, Any]:
    """The row view's marked diff: word-level (CJK characters as words) and character-level alignments."""
    from corpus_io.decoding.scoring import char_units, word_units

    words = align(word_units(ref), word_units(hyp))
    chars = align(char_units(ref), char_units(hyp))
    count = {op: sum(1 for o, _, _ in words if o == op) for op in "SID"}
    return {"words": words, "chars": chars, "counts": count}


#: the figures of ``corpus-io score`` (scores.jsonl) joined into the catalog, each as ``score_<figure>``
SCORE_FIGURES = ("cer", "wer", "loss_per_frame", "loss_per_token", "chars_per_second", "tokens_per_second")
SCORE_COLUMNS = ("score_flagged", "score_reasons", *(f"score_{f}" for f in SCORE_FIGURES), "score_alignable",
                 "score_hyp")
_SCORE_TYPES = {"key": "VARCHAR", "score_flagged": "BOOLEAN", "score_reasons": "VARCHAR",
                **{f"score_{f}": "DOUBLE" for f in SCORE_FIGURES}, "score_alignable": "BOOLEAN", "score_hyp": "VARCHAR"}


def scores_file(scores: str) -> Path:
    """The ``scores.jsonl`` that ``++scores`` names: the file, or the output_dir of corpus-io score holding it."""
    path = Path(scores)
    if path.is_dir():
        path = path / "scores.jsonl"
    if not path.is_file():
        raise ConfigError(f"scores={scores}: no such file; pass the scores.jsonl of corpus-io score (or its "
                          f"output_dir, which holds it).")
    return path


def build_scores(scores: str, cache_dir: Path) -> Path:
    """``scores-<digest>.parquet`` (key + :data:`SCORE_COLUMNS`) of a score run's ``scores.jsonl``, rebuilt when
    it or the base changes. A line that is not a JSON object with a key is a DataError naming ``file:line``; a key
    scored twice too (joined, it would show its utterance twice)."""
    from corpus_io.explore.engine import connect, file_stamp, read_stamp, sql_str, write_json
    from corpus_io.storage.files import parse_json_object, temp_name

    path = scores_file(scores)
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    out, stamp_path = cache_dir / f"scores-{digest}.parquet", cache_dir / f"scores-{digest}.json"
    want = {"version": CATALOG_VERSION, "scores": file_stamp(str(path)),
            "base": file_stamp(str(cache_dir / "base.parquet"))}
    if out.is_file() and read_stamp(stamp_path) == want:
        return out
    tmp_rows, tmp_out = temp_name(cache_dir / "scores.jsonl"), temp_name(out)
    seen: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as src, open(tmp_rows, "w", encoding="utf-8") as f:
            for lineno, line in enumerate(src, 1):
                if not line.strip():
                    continue
                row = parse_json_object(line, f"{path}:{lineno}", "scores.jsonl of corpus-io score holds a JSON "
                                                                  "object per line")
                key = row.get("key")
                if not isinstance(key, str) or not key:
                    raise DataError(f"{path}:{lineno}: a row without a 'key'; scores.jsonl of corpus-io score has "
                                    f"one per line. Pass that file.")
                if key in seen:
                    raise DataError(f"{path}:{lineno}: key '{key}' was scored on line {seen[key]} too; corpus-io "
                                    f"score writes each key once. Keep one line per key.")
                seen[key] = lineno
                reasons = row.get("reasons") or []
                f.write(json.dumps({"key": key, "score_flagged": bool(row.get("flagged")),
                                    "score_reasons": "; ".join(map(str, reasons)) if isinstance(reasons, list)
                                    else str(reasons),
                                    **{f"score_{fig}": row.get(fig) for fig in SCORE_FIGURES},
                                    "score_alignable": row.get("alignable"), "score_hyp": row.get("hyp")},
                                   ensure_ascii=False) + "\n")
        columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in _SCORE_TYPES.items()) + "}"
        con = connect(cache_dir)
        try:
            con.execute(f"COPY (SELECT * FROM read_json({sql_str(tmp_rows)}, format='newline_delimited', "
                        f"columns={columns})) TO {sql_str(tmp_out)} (FORMAT parquet)")
        finally:
            con.close()
    finally:
        tmp_rows.unlink(missing_ok=True)
    os.replace(tmp_out, out)
    write_json(stamp_path, want)
    return out
