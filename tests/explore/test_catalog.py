"""The explorer's catalog: member byte ranges, every input kind, incremental rebuilds, decode results."""

from __future__ import annotations

import io
import json
import os
import tarfile

import duckdb
import pytest

from corpus_io.decoding.scoring import edit_counts, word_units
from corpus_io.explore import catalog as catalog_mod
from corpus_io.explore.catalog import build
from corpus_io.explore.results import align, diff
from tests.conftest import FIXTURE
from tests.explore.conftest import HYP_EDITS, copy_shards, fixture_texts
from tests.loader_data import make_shards


def rows_of(cat, *cols: str) -> list[dict]:
    names = ", ".join(cols)
    return [dict(zip(cols, r)) for r in duckdb.sql(f"SELECT {names} FROM '{cat.table}' ORDER BY row_id").fetchall()]


def test_shard_catalog_locates_each_audio_member_by_byte_range_and_keeps_its_text(packed, tmp_path):
    cat = build(str(packed / "data.list"), cache_dir=tmp_path / "cache")
    rows = rows_of(cat, "key", "shard_id", "member", "audio_offset", "audio_size", "audio_format", "text",
                   "speaker", "duration", "sample_rate")
    texts = fixture_texts()
    assert sorted(r["key"] for r in rows) == sorted(texts)
    assert {r["audio_format"] for r in rows} == {"wav", "flac"}
    for r in rows:
        shard = cat.shards[r["shard_id"]].url
        with tarfile.open(shard) as tar:
            member = tar.extractfile(r["member"]).read()
        with open(shard, "rb") as f:
            f.seek(r["audio_offset"])
            assert f.read(r["audio_size"]) == member
        assert r["text"] == texts[r["key"]]
        assert r["speaker"] == r["key"].split("-")[0]
        assert r["duration"] > 0.5 and r["sample_rate"] in (8000, 16000, 44100)


def test_foreign_tars_without_duration_get_it_from_the_audio_header(tmp_path):
    data_list, keys = make_shards(tmp_path / "s", per_shard=12)  # .json holds only the key
    cat = build(str(data_list), cache_dir=tmp_path / "cache")
    import soundfile as sf

    wavs = dict(line.split(" ", 1) for line in (FIXTURE / "wav.scp").read_text().splitlines())
    for r in rows_of(cat, "key", "duration", "sample_rate"):
        info = sf.info(str(FIXTURE.parent.parent.parent / wavs[r["key"]]))
        assert r["sample_rate"] == info.samplerate and r["duration"] == pytest.approx(info.duration, abs=1e-3)


def test_kaldi_dir_and_raw_jsonl_catalogs_hold_every_utterance(tmp_path):
    texts = fixture_texts()
    kaldi = build(str(FIXTURE), cache_dir=tmp_path / "k")
    got = {r["key"]: r for r in rows_of(kaldi, "key", "text", "speaker", "source", "duration")}
    assert {k: r["text"] for k, r in got.items()} == texts
    assert all(os.path.isabs(r["source"]) and r["duration"] > 0.5 for r in got.values())
    raw = tmp_path / "train.jsonl"
    raw.write_text("".join(json.dumps({"key": k, "source": r["source"], "target": r["text"], "lang": "x"}) + "\n"
                           for k, r in got.items()), encoding="utf-8")
    cat = build(str(raw), cache_dir=tmp_path / "r")
    assert cat.kind == "raw"
    rows = rows_of(cat, "key", "text", "extra")
    assert {r["key"]: r["text"] for r in rows} == texts and json.loads(rows[0]["extra"]) == {"lang": "x"}


def test_a_rebuild_rescans_only_the_changed_shard(packed, tmp_path, monkeypatch):
    data_list = copy_shards(packed, tmp_path / "s")
    cache = tmp_path / "cache"
    build(str(data_list), cache_dir=cache)
    scanned = []
    real = catalog_mod.scan_shard
    monkeypatch.setattr(catalog_mod, "scan_shard", lambda url, i, **kw: scanned.append(url) or real(url, i, **kw))
    build(str(data_list), cache_dir=cache)
    assert scanned == []  # nothing changed: the cached catalog is used as it is
    shard1 = tmp_path / "s" / "shard-000001.tar"
    with tarfile.open(shard1) as tar:  # rewrite shard 1 with its last utterance's text changed
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    last_txt = [m for m, _ in members if m.name.endswith(".txt")][-1].name
    with tarfile.open(shard1, "w", format=tarfile.USTAR_FORMAT) as tar:
        for m, data in members:
            data = b"changed text" if m.name == last_txt else data
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))
    cat = build(str(data_list), cache_dir=cache)
    assert scanned == [str(shard1)]
    rows = rows_of(cat, "key", "text", "shard_id")
    assert len(rows) == 24 and [r["shard_id"] for r in rows] == sorted(r["shard_id"] for r in rows)
    assert sum(r["text"] == "changed text" for r in rows) == 1
    texts = fixture_texts()
    assert sum(r["text"] == texts[r["key"]] for r in rows) == 23


def test_an_unreadable_shard_becomes_rows_that_say_why(packed, tmp_path):
    data_list = copy_shards(packed, tmp_path / "s")
    index = tmp_path / "s" / "index.jsonl"
    entries = [json.loads(x) for x in index.read_text().splitlines()]
    broken = tmp_path / "s" / "shard-000002.tar"
    broken.write_bytes(b"not a tar at all" * 100)
    cat = build(str(data_list), cache_dir=tmp_path / "cache")
    rows = rows_of(cat, "key", "error", "shard_id")
    bad = [r for r in rows if r["error"]]
    assert len(rows) == 24 and len(bad) == 8 and {r["shard_id"] for r in bad} == {2}
    assert [r["key"] for r in bad] == entries[2]["keys"]
    assert "shard-000002.tar" in bad[0]["error"] and "re-pack" in bad[0]["error"]
    assert cat.shards[2].error and cat.shards[0].error is None


def test_decode_results_give_per_utterance_errors_and_two_runs_compare(packed, decode_dirs, tmp_path):
    cat = build(str(packed / "data.list"), cache_dir=tmp_path / "cache", decode_dirs=[str(d) for d in decode_dirs])
    rows = {r["key"]: r for r in rows_of(cat, "key", "hyp", "wer", "word_errors", "words_ref", "wmr", "cer",
                                         "cer2", "cer_delta")}
    assert rows["spk0-utt008"]["word_errors"] == 1 and rows["spk0-utt008"]["wmr"] == pytest.approx(8 / 9)
    assert rows["spk0-utt012"]["wer"] == pytest.approx(1 / 7)
    assert rows["spk2-utt010"]["word_errors"] == 1
    assert sum(r["cer"] > 0 for r in rows.values()) == 3
    assert {k for k, r in rows.items() if r["cer_delta"] < 0} == {"spk0-utt008", "spk2-utt010"}
    assert all(r["cer_delta"] == 0 for k, r in rows.items() if k not in HYP_EDITS)


def test_a_decode_text_that_repeats_a_key_is_refused_naming_both_lines_before_anything_is_written(packed, decode_dirs,
                                                                                                   tmp_path):
    from corpus_io.errors import DataError

    run = tmp_path / "run"
    run.mkdir()
    lines = (decode_dirs[0] / "text").read_text(encoding="utf-8").splitlines(keepends=True)
    (run / "text").write_text("".join(lines) + lines[4], encoding="utf-8")  # 25 lines for 24 keys
    key = lines[4].split()[0]
    with pytest.raises(DataError) as err:
        build(str(packed / "data.list"), cache_dir=tmp_path / "cache", decode_dirs=[str(run)])
    assert f"duplicate key '{key}' in {run / 'text'}: at {run / 'text'}:5 and {run / 'text'}:25" in str(err.value)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("ref,hyp", [("a b c d", "a x c d"), ("a b c d", "a c d"), ("a b", "a b b c"),
                                     ("今天天气很好", "今天气很好啊"), ("", "x y"), ("x y", "")])
def test_marked_alignment_adds_up_to_the_scorers_counts(ref, hyp):
    ops = align(word_units(ref), word_units(hyp))
    counts = edit_counts(word_units(ref), word_units(hyp))
    assert [sum(o == k for o, _, _ in ops) for k in "SID"] == [counts.sub, counts.ins, counts.dele]
    assert [r for o, r, _ in ops if o != "I"] == word_units(ref)
    assert [h for o, _, h in ops if o != "D"] == word_units(hyp)
    assert diff(ref, hyp)["counts"] == {"S": counts.sub, "I": counts.ins, "D": counts.dele}
