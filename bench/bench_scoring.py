"""CER/WER scoring: kaldialign (Kaldi's alignment in C++) vs the pure-Python DP it replaced.

The pairs are 1,810 real transcripts of the fixture corpus (zh, en, mixed), two or three joined per
utterance as a decode set has, each against a seeded random edit of itself. Both scorers run on the
same pairs in this run; the figure is their time ratio (target, issue 13: >= 20x), and the sub/ins/del
totals of the new one are printed next to the old one's (they differ only where Kaldi's tie rule splits
an equal-cost alignment differently).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from bench.common import sized
from corpus_io.decoding.scoring import EditCounts, char_units, edit_counts, word_units

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "corpus"
NUM_PAIRS = sized(1810, 100)
ROUNDS = sized(5, 1)  # interleaved; the best counts (the least disturbed run)


def python_edit_counts(ref: list[str], hyp: list[str]) -> EditCounts:
    """The scorer before issue 13, unchanged: a Levenshtein DP in Python, ties to substitution (the baseline)."""
    n, m = len(ref), len(hyp)
    # each cell: (cost, sub, ins, del)
    prev = [(j, 0, j, 0) for j in range(m + 1)]
    for i in range(1, n + 1):
        cur = [(i, 0, 0, i)] + [None] * m  # type: ignore[list-item]
        r = ref[i - 1]
        for j in range(1, m + 1):
            d = prev[j - 1]
            diag = (d[0], d[1], d[2], d[3]) if r == hyp[j - 1] else (d[0] + 1, d[1] + 1, d[2], d[3])
            u = prev[j]
            up = (u[0] + 1, u[1], u[2], u[3] + 1)
            left_cell = cur[j - 1]
            left = (left_cell[0] + 1, left_cell[1], left_cell[2] + 1, left_cell[3])
            best = diag
            if up[0] < best[0]:
                best = up
            if left[0] < best[0]:
                best = left
            cur[j] = best
        prev = cur
    cost, sub, ins, dele = prev[m]
    return EditCounts(ref=n, sub=sub, ins=ins, dele=dele)


def pairs(num: int = NUM_PAIRS, seed: int = 13) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    texts = [line.split(maxsplit=1)[1] for line in (FIXTURE / "text").read_text(encoding="utf-8").splitlines()]
    vocab = sorted({u for t in texts for u in word_units(t)})
    out = []
    for _ in range(num):
        ref = " ".join(rng.choice(texts) for _ in range(rng.randint(2, 3)))
        units = word_units(ref)
        for _ in range(rng.randint(0, max(1, len(units) // 5))):
            op, pos = rng.choice("sid"), rng.randrange(len(units) + 1)
            if op == "i":
                units.insert(pos, rng.choice(vocab))
            elif pos < len(units):
                units[pos:pos + 1] = [] if op == "d" else [rng.choice(vocab)]
        out.append((ref, " ".join(units)))
    return out


def _score(fn, data: list[tuple[list[str], list[str]]]) -> tuple[float, EditCounts]:
    total = EditCounts()
    start = time.perf_counter()
    for ref, hyp in data:
        total.add(fn(ref, hyp))
    return time.perf_counter() - start, total


def main() -> None:
    texts = pairs()
    old_total = new_total = 0.0
    for name, units in (("CER (characters)", char_units), ("WER (words, CJK chars)", word_units)):
        data = [(units(r), units(h)) for r, h in texts]
        runs = [(_score(python_edit_counts, data), _score(edit_counts, data)) for _ in range(ROUNDS)]
        old_s, old = min((r[0] for r in runs), key=lambda t: t[0])
        new_s, new = min((r[1] for r in runs), key=lambda t: t[0])
        old_total, new_total = old_total + old_s, new_total + new_s
        print(f"{name}: {len(data)} pairs, {sum(len(r) for r, _ in data)} ref units")
        print(f"  pure Python DP  {old_s * 1000:8.1f} ms   S={old.sub} I={old.ins} D={old.dele} errors={old.errors}")
        print(f"  kaldialign      {new_s * 1000:8.1f} ms   S={new.sub} I={new.ins} D={new.dele} errors={new.errors}")
        print(f"  speed-up {old_s / new_s:.0f}x; same total errors: {old.errors == new.errors}")
    print(f"CER + WER (what decode scores per utterance): speed-up {old_total / new_total:.0f}x (target >= 20x)")


if __name__ == "__main__":
    main()
