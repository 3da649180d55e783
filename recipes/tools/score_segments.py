#!/usr/bin/env python3
"""How well ``corpus-io segment`` cut long recordings made by ``python -m corpus_io.tables.synth join``, against
where the joins really are (its ``joins.jsonl``): the espeak recipe's stage 10 and the segment tests.

    python recipes/tools/score_segments.py JOINED_DIR SEGMENTED_DIR   # prints the figures as one JSON line

Figures:

* ``cuts_in_speech``: segment bounds (starts and ends) that fall inside an utterance's speech (from the first to the
  last sample above 1 % of its peak);
* ``exact``: the share of segments whose text is exactly the words of the utterances spoken inside them;
* ``order_ok``: every recording's segments' words, in order, with the ``unaligned`` words put back at their
  positions, are its transcript (none lost, none doubled);
* ``unaligned``: the share of transcript words listed in ``unaligned``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def score(joined: str | Path, segmented: str | Path) -> dict:
    joined, segmented = Path(joined), Path(segmented)
    truth = [json.loads(line) for line in (joined / "joins.jsonl").read_text(encoding="utf-8").splitlines()]
    texts = dict(line.split(" ", 1) for line in (joined / "text").read_text(encoding="utf-8").splitlines())
    segs = [json.loads(line) for line in (segmented / "segments.jsonl").read_text(encoding="utf-8").splitlines()]
    unaligned = [line.split(" ", 3) for line in (segmented / "unaligned").read_text(encoding="utf-8").splitlines()]
    by_rec: dict = {}
    for t in truth:
        by_rec.setdefault(t["recording"], []).append(t)
    cuts_in_speech, exact, bad = 0, 0, []
    for s in segs:
        utts = by_rec.get(s["recording"], [])
        for bound in (s["start"], s["end"]):
            if any(u["speech_start"] < bound < u["speech_end"] for u in utts):
                cuts_in_speech += 1
        inside = [w for u in utts if s["start"] <= u["speech_start"] and u["speech_end"] <= s["end"]
                  for w in u["words"]]
        if inside == s["text"].split():
            exact += 1
        else:
            bad.append(s["key"])
    order_ok = True
    placed: dict = {}
    for s in segs:
        for k, word in enumerate(s["text"].split()):
            placed.setdefault(s["recording"], {}).setdefault(s["first_word"] + k, []).append(word)
    for rec, pos, word, _ in unaligned:
        placed.setdefault(rec, {}).setdefault(int(pos), []).append(word)
    for rec, text in texts.items():
        words = text.split()
        got = placed.get(rec, {})
        if sorted(got) != list(range(len(words))) or any(got[i] != [w] for i, w in enumerate(words)):
            order_ok = False
    total = sum(len(t.split()) for t in texts.values())
    return {"segments": len(segs), "cuts_in_speech": cuts_in_speech, "exact": exact / max(1, len(segs)),
            "order_ok": order_ok, "unaligned": len(unaligned) / max(1, total), "words": total,
            "not_exact": bad[:10]}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(json.dumps(score(sys.argv[1], sys.argv[2])))
