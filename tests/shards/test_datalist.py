"""make-datalist: raw lists, shard lists from dirs/globs/braces/lists, merging and prefix rewrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile as sf

from corpus_io.config import MakeDatalistConfig
from corpus_io.errors import DataError
from corpus_io.shards.datalist import expand_braces, make_datalist
from corpus_io.shards.index import load_index, read_datalist
from corpus_io.shards.pack import pack_shards
from tests.conftest import FIXTURE, assert_user_error, run_cli
from tests.shards.test_pack import _cfg


@pytest.fixture
def two_corpora(tmp_path, fixture_jsonl) -> tuple[Path, Path]:
    """Two packed corpora with distinct keys (b's are a's with a 'b-' prefix)."""
    pack_shards(_cfg(fixture_jsonl, tmp_path / "corpora" / "a"))
    b_jsonl = tmp_path / "b.jsonl"
    b_jsonl.write_text("".join(json.dumps(dict(r, key=f"b-{r['key']}")) + "\n"
                               for r in map(json.loads, fixture_jsonl.read_text().splitlines())))
    pack_shards(_cfg(b_jsonl, tmp_path / "corpora" / "b", num_utts_per_shard=12))
    return tmp_path / "corpora" / "a", tmp_path / "corpora" / "b"


def test_merging_lists_that_repeat_a_key_is_refused_naming_both_shards(two_corpora, fixture_jsonl, tmp_path):
    a, _ = two_corpora
    again = tmp_path / "corpora" / "again"
    pack_shards(_cfg(fixture_jsonl, again, num_utts_per_shard=12))  # the same corpus packed a second time
    out = tmp_path / "merged.list"
    result = run_cli("corpus-io", "make-datalist", f"++input=[{a},{again}]", f"++output={out}")
    assert_user_error(result, "would repeat utterances", f"{a}/shard-000000.tar", f"{again}/shard-000000.tar",
                      "23 more keys repeat")
    assert not out.exists()


def test_expand_braces():
    assert expand_braces("d-{000..002}.tar") == ["d-000.tar", "d-001.tar", "d-002.tar"]
    assert expand_braces("{a,b}/{1..2}") == ["a/1", "a/2", "b/1", "b/2"]
    assert expand_braces("x{a,{b,c}}") == ["xa", "xb", "xc"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def test_raw_mode_writes_wenet_fields(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"key": "k1", "source": "/a.wav", "source_len": 250, "target": "hi",
                               "target_len": 1}) + "\n" +
                   json.dumps({"key": "k2", "wav": str(LONG), "txt": "yo", "source_len": 100, "start": 1.0,
                               "end": 2.5}) + "\n")
    make_datalist(MakeDatalistConfig(data_type="raw", input=str(src), output=str(tmp_path / "raw.list")))
    lines = [json.loads(x) for x in (tmp_path / "raw.list").read_text().splitlines()]
    assert lines[0] == {"key": "k1", "wav": "/a.wav", "txt": "hi", "duration": 2.5, "source_len": 250}
    assert lines[1] == {"key": "k2", "wav": str(LONG), "txt": "yo", "duration": 1.5, "source_len": 100,
                        "start": 1.0, "end": 2.5}


LONG = FIXTURE / "segments_dir" / "wav" / "long.wav"  # 8.202 s of real speech


def test_raw_mode_gives_each_segment_its_own_length_and_refuses_one_past_the_end(tmp_path):
    rate = sf.info(str(LONG)).samplerate
    src = tmp_path / "t.jsonl"
    segs = [("s0", 0.0, 3.205), ("s1", "3.205", "5.178"), ("s2", 7.0, -1)]  # numeric strings are numbers
    src.write_text("".join(json.dumps({"key": k, "source": str(LONG), "target": "hi", "start": a, "end": b}) + "\n"
                           for k, a, b in segs))
    make_datalist(MakeDatalistConfig(data_type="raw", input=str(src), output=str(tmp_path / "raw.list")))
    lines = [json.loads(x) for x in (tmp_path / "raw.list").read_text().splitlines()]
    total = sf.info(str(LONG)).frames
    expected = [round(3.205 * rate), round(5.178 * rate) - round(3.205 * rate), total - round(7.0 * rate)]
    assert [x["source_len"] for x in lines] == [n * 100 // rate for n in expected]
    assert [x["duration"] for x in lines] == [round(n / rate, 3) for n in expected]
    for start, end in ((9.0, 10.0), (8.0, 9.5), (1.0, "soon")):
        src.write_text(json.dumps({"key": "bad", "source": str(LONG), "target": "hi", "start": start, "end": end})
                       + "\n")
        result = run_cli("corpus-io", "make-datalist", "++data_type=raw", f"++input={src}",
                         f"++output={tmp_path / 'bad.list'}")
        assert_user_error(result, f"{src}:1", "key 'bad'")
        assert "outside" in result.stderr or "'soon', not a number" in result.stderr
        assert not (tmp_path / "bad.list").exists()


def test_shard_mode_dir_glob_brace_and_list_agree(two_corpora, tmp_path):
    a, _ = two_corpora
    expected = read_datalist(a / "data.list")
    for i, spec in enumerate([str(a), f"{a}/*.tar", f"{a}/shard-{{000000..000002}}.tar", str(a / "data.list")]):
        out = tmp_path / f"l{i}" / "data.list"
        make_datalist(MakeDatalistConfig(data_type="shard", input=spec, output=str(out)))
        assert read_datalist(out) == expected, spec
        assert load_index(out) == load_index(a / "data.list"), spec


def test_merge_and_prefix_rewrite_keys_the_index_by_the_new_url(two_corpora, tmp_path):
    a, b = two_corpora
    out = tmp_path / "merged.list"
    r = run_cli("make-datalist", f"++input=[{a},{b}]", f"++output={out}", "++prefix=s3://bucket/corpus")
    assert r.returncode == 0, r.stderr
    urls = read_datalist(out)
    assert urls == [f"s3://bucket/corpus/a/shard-00000{i}.tar" for i in range(3)] + \
                   [f"s3://bucket/corpus/b/shard-00000{i}.tar" for i in range(2)]
    index = load_index(out)
    assert list(index) == urls and (tmp_path / "merged.index.jsonl").is_file()
    assert index[urls[3]]["num_utts"] == 12
    original = load_index(a / "data.list")[str(a / "shard-000000.tar")]
    assert {k: v for k, v in index[urls[0]].items() if k != "path"} == \
           {k: v for k, v in original.items() if k != "path"}


def test_same_shard_twice_is_an_error_naming_both_inputs(two_corpora, tmp_path):
    a, _ = two_corpora
    with pytest.raises(DataError, match="listed twice"):
        make_datalist(MakeDatalistConfig(data_type="shard", input=[str(a), f"{a}/*.tar"],
                                         output=str(tmp_path / "x.list")))


def test_missing_brace_shard_is_a_user_error(two_corpora, tmp_path):
    a, _ = two_corpora
    r = run_cli("corpus-io", "make-datalist", f"++input='{a}/shard-{{000000..000005}}.tar'",
                f"++output={tmp_path / 'x.list'}")
    assert_user_error(r, "shard-000003.tar")
    assert r.returncode == 2



def _raw_line(key: str, wav: str) -> str:
    return json.dumps({"key": key, "source": wav, "source_len": 100, "target": "hi"}) + "\n"


def test_raw_mode_duplicate_key_names_both_lines(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text(_raw_line("k1", "/a.wav") + _raw_line("k2", "/b.wav") + "\n" + _raw_line("k1", "/c.wav"))
    out = tmp_path / "raw.list"
    r = run_cli("corpus-io", "make-datalist", "++data_type=raw", f"++input={src}", f"++output={out}")
    assert_user_error(r, "duplicate key 'k1'", "t.jsonl:1", "t.jsonl:4")
    assert r.returncode == 2 and not out.exists()


def test_raw_mode_duplicate_key_across_inputs_names_both_files(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(_raw_line("k1", "/a.wav") + _raw_line("k2", "/b.wav"))
    b.write_text(_raw_line("k3", "/c.wav") + _raw_line("k2", "/d.wav"))
    out = tmp_path / "raw.list"
    with pytest.raises(DataError, match=r"duplicate key 'k2': at .*a\.jsonl:2 and .*b\.jsonl:2"):
        make_datalist(MakeDatalistConfig(data_type="raw", input=[str(a), str(b)], output=str(out)))
    assert not out.exists()


def test_raw_mode_empty_jsonl_is_an_error(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text("\n")
    out = tmp_path / "raw.list"
    with pytest.raises(DataError, match="t.jsonl has no utterances"):
        make_datalist(MakeDatalistConfig(data_type="raw", input=str(src), output=str(out)))
    assert list(tmp_path.iterdir()) == [src]


def test_shard_mode_given_a_jsonl_says_to_use_raw(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text("\n" + _raw_line("k1", "/a.wav"))
    out = tmp_path / "data.list"
    r = run_cli("corpus-io", "make-datalist", "++data_type=shard", f"++input={src}", f"++output={out}")
    assert_user_error(r, "t.jsonl holds JSON lines", "raw list", "++data_type=raw")
    assert r.returncode == 2 and not out.exists()


def test_raw_mode_with_an_unmeasured_command_source_says_to_give_source_len_not_a_missing_key(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"key": "p", "source": f"sox {LONG} -t wav - |", "target": "hi"}) + "\n")
    result = run_cli("corpus-io", "make-datalist", "++data_type=raw", f"++input={src}",
                     f"++output={tmp_path / 'raw.list'}")
    assert_user_error(result, f"{src}:1", "key 'p'", "is a command", "source_len")
    assert "allow_pipe=true (or" not in result.stderr  # make-datalist has no such key
    measured = {"key": "p", "source": f"sox {LONG} -t wav - |", "target": "hi", "source_len": 150, "start": 1.0,
                "end": 2.5}
    src.write_text(json.dumps(measured) + "\n")
    make_datalist(MakeDatalistConfig(data_type="raw", input=str(src), output=str(tmp_path / "raw.list")))
    (line,) = [json.loads(x) for x in (tmp_path / "raw.list").read_text().splitlines()]
    assert line["duration"] == 1.5 and line["source_len"] == 150


def test_the_loader_learns_that_an_index_repeats_no_key_from_a_sidecar_without_rescanning(tmp_path, monkeypatch):
    import json

    from corpus_io.shards import index as index_mod
    from tests.shards.conftest import packed_with_a_repeat

    merged, _, _ = packed_with_a_repeat(tmp_path)
    assert len(index_mod.known_repeated_keys(merged)) == 4  # a list that repeats keys: always found by a scan
    clean = tmp_path / "clean"
    clean.mkdir()
    first = json.loads(index_mod.index_path_for(merged).read_text().splitlines()[0])
    index_mod.write_list_and_index(clean / "data.list", [first])
    written = index_mod.index_path_for(clean / "data.list")
    marker = written.with_name(f".{written.stem}.repeats.json")
    assert json.loads(marker.read_text())["repeated_keys"] == 0  # stored when the index was written
    scans = []
    real = index_mod.find_repeated_keys
    monkeypatch.setattr(index_mod, "find_repeated_keys", lambda *a, **k: scans.append(1) or real(*a, **k))
    assert index_mod.known_repeated_keys(clean / "data.list") == {} and scans == []  # no scan at loader start
    written.write_text(written.read_text() + "\n")  # a changed index: the marker no longer applies
    assert index_mod.known_repeated_keys(clean / "data.list") == {} and scans == [1]


def test_index_readers_skip_the_keys_array_exactly_whatever_the_keys_hold(tmp_path):
    import json

    from corpus_io.shards import index as index_mod

    odd = ['plain', 'has "] inside', 'ends with \\', '中文', 'x"]', '', 'a,b]"']
    entries = [{"path": str(tmp_path / f"s{i}.tar"), "num_utts": len(k), "duration": 1.5 + i, "keys": k}
               for i, k in enumerate([odd, [], ["only"], odd[::-1]])]
    entries[0]["fields"] = {"fbank": {"file": "s0.fbank.tar"}}  # a field after the keys survives the cut
    index_mod.write_list_and_index(tmp_path / "data.list", entries)
    read = index_mod.load_index(tmp_path / "data.list")
    with_keys = index_mod.load_index(tmp_path / "data.list", keys=True)
    for e in entries:
        got = read[e["path"]]
        assert "keys" not in got and got == {k: v for k, v in e.items() if k != "keys"}
        assert with_keys[e["path"]]["keys"] == e["keys"]
    lines = (tmp_path / "index.jsonl").read_bytes().splitlines()
    for raw in (lines[0], lines[3]):  # an escaped quote before "]: parsed whole (the keys dropped after)
        assert index_mod._without_keys(raw) == raw
    for raw in lines[1:3]:  # the usual shapes are cut before parsing
        cut = index_mod._without_keys(raw)
        assert b'"keys"' not in cut and json.loads(cut) == {k: v for k, v in json.loads(raw).items() if k != "keys"}


WAV = str(FIXTURE / "wav" / "spk0-utt000.wav")


def _audio_input(tmp: Path, case: str) -> Path:
    """An input of one good line, then a line make-datalist cannot measure."""
    import tarfile

    if case == "missing file":
        path = tmp / "in.jsonl"
        path.write_text("".join(json.dumps({"key": k, "source": s, "target": "hi"}) + "\n"
                                for k, s in (("u1", WAV), ("u2", "audio/nowhere.wav"))))
    elif case == "not audio":
        (tmp / "notes.wav").write_text("not audio\n" * 50)
        path = tmp / "in.jsonl"
        path.write_text("".join(json.dumps({"key": k, "source": s, "target": "hi"}) + "\n"
                                for k, s in (("u1", WAV), ("u2", str(tmp / "notes.wav")))))
    elif case == "NeMo tar member missing":
        with tarfile.open(tmp / "audio_0.tar", "w") as tar:
            tar.add(WAV, arcname="u1.wav")
        path = tmp / "tarred_audio_manifest.json"
        path.write_text("".join(json.dumps({"audio_filepath": f"{k}.wav", "duration": 3.1, "text": "hi",
                                            "shard_id": 0}) + "\n" for k in ("u1", "u2")))
    else:  # "Lhotse source missing"
        from lhotse import CutSet, Recording, SupervisionSegment

        gone = tmp / "u2.wav"
        gone.write_bytes(Path(WAV).read_bytes())
        recordings = [Recording.from_file(p, recording_id=k) for k, p in (("u1", WAV), ("u2", gone))]
        path = tmp / "cuts.jsonl"
        CutSet.from_cuts(_cut_of(r, SupervisionSegment) for r in recordings).to_file(path)
        gone.unlink()
    return path


def _cut_of(recording, supervision):
    cut = recording.to_cut()
    cut.supervisions = [supervision(id=f"{recording.id}-s", recording_id=recording.id, start=0.0,
                                    duration=recording.duration, text="hi")]
    return cut


@pytest.mark.parametrize("case, needles", [
    ("missing file", ["in.jsonl:2", "key 'u2'", "audio/nowhere.wav does not exist", "relative path is read from the "
                      "current directory", "remove the line"]),
    ("not audio", ["in.jsonl:2", "key 'u2'", "notes.wav", "remove the line"]),
    ("NeMo tar member missing", ["tarred_audio_manifest.json:2", "key 'u2'", "has no member 'u2.wav'"]),
    ("Lhotse source missing", ["cuts.jsonl:2", "key 'u2'", "u2.wav does not exist"]),
])
def test_raw_mode_names_the_line_and_key_of_audio_it_cannot_list_and_writes_nothing(tmp_path, case, needles):
    given, out = tmp_path / "in", tmp_path / "out"
    given.mkdir()
    src = _audio_input(given, case)
    before = sorted(p.name for p in given.iterdir())
    with pytest.raises(DataError) as error:
        make_datalist(MakeDatalistConfig(data_type="raw", input=[str(src)], output=str(out / "raw.list")))
    for needle in needles:
        assert needle in str(error.value), str(error.value)
    assert list(out.iterdir()) == [] and sorted(p.name for p in given.iterdir()) == before


def test_raw_mode_exclude_keys_leaves_out_the_flagged_keys_and_shard_mode_says_to_repack(tmp_path, capfd):
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"key": f"k{i}", "source": "/a.wav", "source_len": 100, "target": "hi"}) + "\n"
                           for i in range(5)))
    flagged = tmp_path / "flagged"
    flagged.write_text("k1 cer 1 > 0.3\nk3 unalignable: 40 tokens need 40 frames, the audio has 25\nk9 wer 1 > 0.3\n")
    make_datalist(MakeDatalistConfig(data_type="raw", input=str(src), output=str(tmp_path / "raw.list"),
                                     exclude_keys=str(flagged)))
    assert [json.loads(x)["key"] for x in (tmp_path / "raw.list").read_text().splitlines()] == ["k0", "k2", "k4"]
    err = capfd.readouterr().err
    assert "3 utterances" in err and "skipped 2 (excluded by ++exclude_keys: 2)" in err
    assert "2 of its 3 keys left out; 1 is not in the input (e.g. 'k9')" in err
    with pytest.raises(Exception, match=r"shard list names whole shards.*pack-shards \+\+exclude_keys="):
        make_datalist(MakeDatalistConfig(data_type="shard", input=[str(tmp_path)], output=str(tmp_path / "s.list"),
                                         exclude_keys=str(flagged)))
