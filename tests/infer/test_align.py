"""corpus-io align (corpus_io/infer/align.py): the known transcripts of the smoke model's test set force-aligned
(CTC Viterbi over the reference tokens), and words that cannot be aligned reported, never placed: text not spoken
(more tokens than the audio's frames) and tokens outside the token list."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli


@pytest.mark.slow
def test_align_places_every_spoken_word_in_order_and_reports_the_words_it_cannot_place(smoke, tmp_path):
    data = tmp_path / "test_digits"
    shutil.copytree(smoke["data"] / "test_digits", data)
    texts = dict(line.split(" ", 1) for line in (data / "text").read_text().splitlines())
    keys = sorted(texts)
    padded, foreign = keys[0], keys[1]
    texts[padded] = texts[padded] + " " + " ".join(["nine"] * 200)  # 200 words more than 2 s can hold
    texts[foreign] = texts[foreign] + " ωμέγα"  # not in the token list
    (data / "text").write_text("".join(f"{k} {texts[k]}\n" for k in keys))
    out = tmp_path / "align"
    result = run_cli("corpus-io", "align", f"++data_list={data}", f"++checkpoint={smoke['exp'] / 'model.pt.avg1'}",
                     f"++output_dir={out}", "++dataset_conf.num_workers=0")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["key"]: r for r in map(json.loads, (out / "alignment.jsonl").read_text().splitlines())}
    assert sorted(rows) == keys
    ctm = [line.split() for line in (out / "ctm").read_text().splitlines()]
    unaligned = [line.split(" ", 3) for line in (out / "unaligned").read_text().splitlines()]
    for key in keys:
        words = rows[key]["words"]
        assert [w["word"] for w in words] == texts[key].split()  # every word of the transcript, in order
        placed = [w for w in words if w["start"] is not None]
        assert [(w["start"], w["end"]) for w in placed] == sorted((w["start"], w["end"]) for w in placed)
        assert all(0 <= w["start"] < w["end"] and 0 <= w["score"] <= 1 for w in placed)
        assert len([row for row in ctm if row[0] == key]) == len(placed)
    # the 200 words not spoken have no path (never squeezed into the audio's end), the foreign word is outside
    reasons = {(k, int(i)): why for k, i, _, why in unaligned}
    spoken = len(texts[padded].split()) - 200
    assert sum(k == padded for k, _ in reasons) >= 200 and all(i >= spoken - 1 for k, i in reasons if k == padded)
    assert reasons[(foreign, len(texts[foreign].split()) - 1)].startswith("tokens outside the token list")
    others = [k for k in keys if k not in (padded, foreign)]
    placed_words = sum(w["start"] is not None for k in others for w in rows[k]["words"])
    assert placed_words >= 0.98 * sum(len(texts[k].split()) for k in others)  # the model's own test set
    assert "unaligned" in result.stdout and "no path" in result.stdout, result.stdout
