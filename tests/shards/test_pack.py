"""pack-shards: round trips, determinism, resume after kill -9, input formats and modes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from corpus_io.config import PackShardsConfig
from corpus_io.errors import DataError
from corpus_io.shards.index import load_index, read_datalist
from corpus_io.shards.pack import pack_shards
from corpus_io.shards.reader import read_shard
from corpus_io.tables.kaldi import iter_table
from tests.conftest import BIN, FIXTURE, REPO, assert_user_error, hang_limit, run_cli
from tests.shards.conftest import fixture_records, write_jsonl
from tests.test_hostile import corpus_io as in_process


def _cfg(input_: Path | str, out: Path, **kw) -> PackShardsConfig:
    kw.setdefault("num_workers", 1)
    kw.setdefault("num_utts_per_shard", 10)
    return PackShardsConfig(input=str(input_), output_dir=str(out), **kw)


def _all_samples(list_path: Path) -> list[dict]:
    return [s for url in read_datalist(list_path) for s in read_shard(url)]


def _tree_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tar"))}


def test_round_trip_scp_to_jsonl_to_shards_is_exact(tmp_path):
    jsonl = tmp_path / "train.jsonl"
    r = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{FIXTURE}/wav.scp,{FIXTURE}/text]",
                f"++jsonl_file_out={jsonl}")
    assert r.returncode == 0, r.stderr
    r = run_cli("pack-shards", f"++input={jsonl}", f"++output_dir={tmp_path / 'out'}", "++num_utts_per_shard=7",
                "++num_workers=2")
    assert r.returncode == 0, r.stderr
    assert "24 utterances" in r.stderr and "shards 4" in r.stderr
    samples = _all_samples(tmp_path / "out" / "data.list")
    wavs = {line.key: (REPO / line.value).read_bytes() for line in iter_table(FIXTURE / "wav.scp")}
    texts = {line.key: line.value for line in iter_table(FIXTURE / "text")}
    assert sorted(s["key"] for s in samples) == sorted(wavs)  # every utterance exactly once
    for s in samples:
        assert s["audio"] == wavs[s["key"]] and s["txt"] == texts[s["key"]]
        info = sf.info(str(REPO / f"tests/fixtures/corpus/wav/{s['key']}.{s['audio_format']}"))
        assert (s["meta"]["sample_rate"], s["meta"]["num_samples"]) == (info.samplerate, info.frames)
        assert s["meta"]["duration"] == pytest.approx(info.duration)
    index = load_index(tmp_path / "out" / "data.list")
    assert [e["num_utts"] for e in index.values()] == [7, 7, 7, 3]
    total = sum(s["meta"]["duration"] for s in samples)
    assert sum(e["duration"] for e in index.values()) == pytest.approx(total, abs=0.01)


def _outputs(out: Path) -> dict[str, bytes]:
    """Every file pack-shards leaves in ``out`` (shards, their sidecars, data.list with ``out`` as ``<out>``, the
    index), but the key-repeat cache (named by the index's mtime)."""
    return {p.name: p.read_bytes().replace(str(out).encode(), b"<out>") for p in sorted(out.iterdir())
            if p.name != ".index.repeats.json"}


def test_jsonl_extras_go_into_json_and_one_or_two_workers_write_the_same_bytes(tmp_path, fixture_jsonl):
    pack_shards(_cfg(fixture_jsonl, tmp_path / "a"))
    pack_shards(_cfg(fixture_jsonl, tmp_path / "b", num_workers=2))
    outputs = _outputs(tmp_path / "a")
    assert {"data.list", "index.jsonl", "shard-000002.tar", ".shard-000002.tar.json"} <= set(outputs)
    assert outputs == _outputs(tmp_path / "b")
    meta = _all_samples(tmp_path / "a" / "data.list")[0]["meta"]
    assert {"key", "duration", "sample_rate", "num_samples", "source_len", "speaker", "language"} <= set(meta)
    assert "source" not in meta


def test_shuffle_is_seeded(tmp_path, fixture_jsonl):
    orders = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        pack_shards(_cfg(fixture_jsonl, tmp_path / name, shuffle=True, seed=seed))
        orders.append([s["key"] for s in _all_samples(tmp_path / name / "data.list")])
    plain = [r["key"] for r in fixture_records()]
    assert orders[0] == orders[1] != orders[2]
    assert orders[0] != plain and sorted(orders[0]) == sorted(plain)


def test_keys_with_dots_and_slashes_get_safe_names_and_keep_the_key(tmp_path):
    recs = fixture_records()[:3]
    recs[0]["key"], recs[1]["key"], recs[2]["key"] = "a.b.c", "dir/utt", "x%2Ey"
    pack_shards(_cfg(write_jsonl(tmp_path / "t.jsonl", recs), tmp_path / "out"))
    import tarfile

    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tf:
        names = tf.getnames()
    assert all(n.count(".") == 1 and "/" not in n for n in names), names
    assert [s["key"] for s in _all_samples(tmp_path / "out" / "data.list")] == ["a.b.c", "dir/utt", "x%2Ey"]


def test_duplicate_key_names_both_lines(tmp_path):
    recs = fixture_records()[:4]
    recs[3]["key"] = recs[1]["key"]
    path = write_jsonl(tmp_path / "t.jsonl", recs)
    r = run_cli("corpus-io", "pack-shards", f"++input={path}", f"++output_dir={tmp_path / 'o'}")
    assert_user_error(r, f"duplicate key '{recs[1]['key']}'", f"{path}:2", f"{path}:4")
    assert not (tmp_path / "o" / "data.list").exists()


def _cli_in_process(capfd, *args: str) -> subprocess.CompletedProcess:
    """``corpus-io ARGS`` through the CLI's error handling (compose, run_with_errors, its exit code) in this
    process: a user error's paragraph and exit status without a process start per case."""
    code, err = in_process(*args, capfd=capfd)
    return subprocess.CompletedProcess(args, code, "", err)


def test_bad_inputs_exit_2_with_one_paragraph(tmp_path, capfd):
    r = run_cli("corpus-io", "pack-shards", f"++input={tmp_path / 'nope.jsonl'}", f"++output_dir={tmp_path}")
    assert_user_error(r, "nope.jsonl does not exist")
    assert r.returncode == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "a", "source": "/no/such.wav", "target": "x"}\n')
    r = _cli_in_process(capfd, "pack-shards", f"++input={bad}", f"++output_dir={tmp_path / 'o'}")
    assert_user_error(r, f"{bad}:1", "key 'a'", "/no/such.wav", "on_error=skip")
    assert r.returncode == 2
    r = _cli_in_process(capfd, "pack-shards", f"++input={bad}", f"++output_dir={tmp_path / 'o'}", "++on_error=skip")
    assert_user_error(r, "unreadable audio: 1", "produced nothing")  # skipping everything is no success
    notjson = tmp_path / "x.jsonl"
    notjson.write_text("{oops\n")
    assert_user_error(_cli_in_process(capfd, "pack-shards", f"++input={notjson}", f"++output_dir={tmp_path}"),
                      f"{notjson}:1")
    assert_user_error(_cli_in_process(capfd, "pack-shards", f"++input={bad}", f"++output_dir={tmp_path}",
                                      "++audio_format=mp4"), "audio_format")


def test_kaldi_dir_with_utt2spk_and_wenet_raw_list_give_the_same_samples(tmp_path):
    pack_shards(_cfg(FIXTURE, tmp_path / "kaldi"))
    raw = [{"key": r["key"], "wav": r["source"], "txt": r["target"]} for r in fixture_records()]
    pack_shards(_cfg(write_jsonl(tmp_path / "data.list", raw), tmp_path / "raw"))
    kaldi = _all_samples(tmp_path / "kaldi" / "data.list")
    wenet = _all_samples(tmp_path / "raw" / "data.list")
    assert [(s["key"], s["audio"], s["txt"]) for s in kaldi] == [(s["key"], s["audio"], s["txt"]) for s in wenet]
    assert kaldi[0]["meta"]["speaker"] == "spk0"


def test_segments_store_only_the_segment_audio(tmp_path):
    pack_shards(_cfg(FIXTURE / "segments_dir", tmp_path / "out"))
    samples = _all_samples(tmp_path / "out" / "data.list")
    long_wave, rate = sf.read(str(FIXTURE / "segments_dir" / "wav" / "long.wav"), dtype="int16")
    assert [s["key"] for s in samples] == [f"long-seg{i:02d}" for i in range(4)]
    total = 0
    for s in samples:
        wave, r = sf.read(__import__("io").BytesIO(s["audio"]), dtype="int16")
        start = int(round(s["meta"]["segment"][0] * rate))
        assert r == rate and np.array_equal(wave, long_wave[start:start + len(wave)])
        total += len(wave)
    assert total == len(long_wave)


def test_reencode_and_resample(tmp_path, fixture_jsonl):
    pack_shards(_cfg(fixture_jsonl, tmp_path / "out", audio_format="flac", resample=16000))
    for s in _all_samples(tmp_path / "out" / "data.list"):
        info = sf.info(__import__("io").BytesIO(s["audio"]))
        assert s["audio_format"] == "flac" and info.samplerate == 16000 == s["meta"]["sample_rate"]
        assert info.frames == s["meta"]["num_samples"]


def test_filter_group_writes_bucketed_subdirs(tmp_path, fixture_jsonl):
    recs = [json.loads(line) for line in fixture_jsonl.read_text().splitlines()]
    # no source_len in the input: lengths come from header probes
    pack_shards(_cfg(fixture_jsonl, tmp_path / "out", filter_group=["0:250", "250:100000"]))
    short = _all_samples(tmp_path / "out" / "0_250" / "data.list")
    long_ = _all_samples(tmp_path / "out" / "250_100000" / "data.list")
    assert len(short) + len(long_) == len(recs) and short and long_
    assert all(s["meta"]["source_len"] < 250 for s in short) and all(s["meta"]["source_len"] >= 250 for s in long_)


def test_features_mode_stores_npy(tmp_path):
    import kaldiio

    data = tmp_path / "data"
    data.mkdir()
    mats = {f"u{i}": np.random.default_rng(i).standard_normal((50 + i, 13)).astype(np.float32) for i in range(3)}
    kaldiio.save_ark(str(data / "feats.ark"), mats, scp=str(data / "feats.scp"))
    (data / "text").write_text("".join(f"{k} hello {k}\n" for k in mats))
    pack_shards(_cfg(data, tmp_path / "out", feats=True))
    samples = _all_samples(tmp_path / "out" / "data.list")
    assert [s["key"] for s in samples] == list(mats)
    for s in samples:
        assert "audio" not in s and s["meta"]["num_frames"] == mats[s["key"]].shape[0]
        assert np.array_equal(np.load(__import__("io").BytesIO(s["npy"])), mats[s["key"]])


def _resume_input(tmp_path: Path) -> Path:
    recs = []
    for copy in range(30):
        recs += [dict(r, key=f"c{copy:02d}-{r['key']}") for r in fixture_records()]
    return write_jsonl(tmp_path / "big.jsonl", recs)  # 720 utterances


def test_kill_9_then_rerun_is_byte_identical_to_an_uninterrupted_run(tmp_path):
    jsonl = _resume_input(tmp_path)
    common = dict(input=str(jsonl), num_utts_per_shard=6, num_workers=2, audio_format="flac")
    args = [f"++{k}={v}" for k, v in common.items()]
    pack_shards(PackShardsConfig(output_dir=str(tmp_path / "ref"), **common))  # in-process: only the kill needs one
    out = tmp_path / "out"
    env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1")
    proc = subprocess.Popen([str(BIN / "corpus-io"), "pack-shards", *args, f"++output_dir={out}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + hang_limit(120)
    while time.time() < deadline and len(list(out.glob(".shard-*.tar.json"))) < 5:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the main process and its workers, mid-run
    proc.wait()
    assert not (out / "data.list").exists(), "the run finished before it was killed; the test proved nothing"
    done_before = len(list(out.glob(".shard-*.tar.json")))
    resumed = pack_shards(PackShardsConfig(output_dir=str(out), **common)).extra["resumed"]  # the rerun
    assert resumed >= done_before - 4 > 0  # only the shards in flight at the kill may be redone
    assert _tree_bytes(out) == _tree_bytes(tmp_path / "ref")
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "path"}  # noqa: E731
                       for x in p.read_text().splitlines()]
    assert strip(out / "index.jsonl") == strip(tmp_path / "ref" / "index.jsonl")
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    assert len(read_datalist(out / "data.list")) == 120


def test_rerun_redoes_a_damaged_shard(tmp_path, fixture_jsonl):
    pack_shards(_cfg(fixture_jsonl, tmp_path / "out"))
    before = _tree_bytes(tmp_path / "out")
    victim = tmp_path / "out" / "shard-000001.tar"
    data = bytearray(victim.read_bytes())
    data[3000] ^= 1
    victim.write_bytes(bytes(data))
    summary = pack_shards(_cfg(fixture_jsonl, tmp_path / "out"))
    assert summary.extra["resumed"] == 2
    assert _tree_bytes(tmp_path / "out") == before


def test_rerun_removes_temp_files_of_a_killed_run(tmp_path, fixture_jsonl):
    out = tmp_path / "out"
    pack_shards(_cfg(fixture_jsonl, out))
    before = _tree_bytes(out)
    stale = [out / ".shard-000001.tar.tmp-4242", out / "..shard-000001.tar.json.tmp-4242"]
    for path in stale:  # what kill -9 leaves when it lands inside a shard or a sidecar write
        path.write_bytes(b"partial")
    pack_shards(_cfg(fixture_jsonl, out))
    assert not any(p.exists() for p in stale)
    assert _tree_bytes(out) == before


def test_rerun_with_fewer_shards_removes_the_earlier_runs_extra_shards(tmp_path, fixture_jsonl):
    out = tmp_path / "out"
    first = pack_shards(_cfg(fixture_jsonl, out, num_utts_per_shard=3))
    assert first.extra["shards"] > 2
    (out / "shard-000002.fbank.tar").write_bytes(b"an add-field companion of a shard about to go stale")
    (out / "notes.txt").write_text("not ours")
    second = pack_shards(_cfg(fixture_jsonl, out, num_utts_per_shard=100))
    assert second.extra["shards"] == 1
    assert second.extra["stale shards removed"] == first.extra["shards"] - 1
    assert sorted(p.name for p in out.iterdir()) == [".index.repeats.json", ".shard-000000.tar.json",
                                                      "data.list", "index.jsonl", "notes.txt", "shard-000000.tar"]
    assert len(_all_samples(out / "data.list")) == first.kept == second.kept


def test_filter_group_on_segments_buckets_each_segment_by_its_own_length(tmp_path):
    # the last segment runs to the end of the recording (end -1): its length is the rest, not the whole file
    pack_shards(_cfg(FIXTURE / "segments_dir", tmp_path / "out", filter_group=["0:200", "200:100000"]))
    short = _all_samples(tmp_path / "out" / "0_200" / "data.list")
    long_ = _all_samples(tmp_path / "out" / "200_100000" / "data.list")
    assert sorted(s["key"] for s in short) == ["long-seg01", "long-seg02", "long-seg03"]
    assert [s["key"] for s in long_] == ["long-seg00"]
    assert all(s["meta"]["source_len"] < 200 for s in short) and long_[0]["meta"]["source_len"] >= 200


def test_a_failed_rerun_leaves_no_list_naming_shards_it_rewrote_and_the_next_run_restores_it(tmp_path):
    records = fixture_records()
    out = tmp_path / "out"
    pack_shards(_cfg(write_jsonl(tmp_path / "good.jsonl", records), out, num_utts_per_shard=1))
    fields = {"fbank": {"file": "x"}}  # what add-field records; an unchanged shard keeps it
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    index[0]["fields"] = fields
    (out / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in index))
    broken = [dict(r) for r in records]
    broken[2]["source"] = str(tmp_path / "gone.wav")
    with pytest.raises(DataError, match="gone.wav"):
        pack_shards(_cfg(write_jsonl(tmp_path / "broken.jsonl", broken), out, num_utts_per_shard=1))
    assert not (out / "data.list").exists() and not (out / "index.jsonl").exists()
    pack_shards(_cfg(tmp_path / "good.jsonl", out, num_utts_per_shard=1))
    assert len(read_datalist(out / "data.list")) == len(records)
    first = json.loads((out / "index.jsonl").read_text().splitlines()[0])
    assert first["fields"] == fields and not list(out.glob(".index.jsonl*"))


def test_gzip_compression_writes_wenet_tar_gz_that_reads_verifies_and_switches_back(tmp_path, fixture_jsonl):
    import gzip
    import tarfile

    from corpus_io.config import VerifyShardsConfig
    from corpus_io.shards.verify import verify_shards

    plain, gz = tmp_path / "plain", tmp_path / "gz"
    pack_shards(_cfg(fixture_jsonl, plain))
    pack_shards(_cfg(fixture_jsonl, gz, compression="gzip"))
    names = sorted(p.name for p in gz.glob("shard-*"))
    assert names == ["shard-000000.tar.gz", "shard-000001.tar.gz", "shard-000002.tar.gz"]
    members = 0
    for name in names:  # the same tar bytes inside, deterministic gzip around them; tarfile reads it as WeNet does
        inner = gzip.decompress((gz / name).read_bytes())
        assert inner == (plain / name.removesuffix(".gz")).read_bytes()
        with tarfile.open(gz / name, "r:gz") as tar:
            members += len(tar.getnames())
    assert members == 24 * 3
    assert [(s["key"], s["audio"]) for s in _all_samples(gz / "data.list")] == \
        [(s["key"], s["audio"]) for s in _all_samples(plain / "data.list")]
    index = load_index(gz / "data.list")
    assert all(e["bytes"] == os.path.getsize(e["path"]) for e in index.values())
    results = verify_shards(VerifyShardsConfig(input=str(gz / "data.list"), num_workers=1))  # sha256 of the .gz
    assert sum(r.num_utts for r in results) == 24 and not any(r.problems for r in results)
    before = {n: (gz / n).read_bytes() for n in names}
    pack_shards(_cfg(fixture_jsonl, gz, compression="gzip", num_workers=2))
    assert {n: (gz / n).read_bytes() for n in names} == before  # deterministic bytes at any worker count
    back = pack_shards(_cfg(fixture_jsonl, gz))  # switching back replaces the .tar.gz, never keeps both
    assert sorted(p.name for p in gz.glob("shard-*")) == [n.removesuffix(".gz") for n in names]
    assert back.extra["stale shards removed"] == 3


def test_a_copied_shard_dir_rerun_resumes_in_place_and_names_only_itself(fixture_jsonl, tmp_path):
    import shutil

    first, copy = tmp_path / "first", tmp_path / "copy"
    pack_shards(_cfg(fixture_jsonl, first))
    index_lines = [json.loads(line) for line in (first / "index.jsonl").read_text().splitlines()]
    assert [e["file"] for e in index_lines] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert not any("path" in e for e in index_lines)
    sidecar = json.loads((first / ".shard-000000.tar.json").read_text())
    assert sidecar["path"] == "shard-000000.tar"  # relative: the directory may move
    shutil.copytree(first, copy)
    # an older corpus-io stored the first run's absolute path in the sidecar: still resumed in place
    old = copy / ".shard-000001.tar.json"
    old.write_text(json.dumps(dict(json.loads(old.read_text()), path=str(first / "shard-000001.tar"))))
    shutil.rmtree(first)
    summary = pack_shards(_cfg(fixture_jsonl, copy))
    assert summary.extra["resumed"] == 3
    listed = read_datalist(copy / "data.list")
    assert listed == [str(copy.resolve() / f"shard-00000{i}.tar") for i in range(3)]
    assert list(load_index(copy / "data.list")) == listed  # index entries resolve to the copy
    result = run_cli("corpus-io", "verify-shards", f"++input={copy / 'data.list'}", "++decode_audio=false")
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_empty_input_or_one_whose_every_utterance_is_skipped_fails_whatever_on_error_says(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = run_cli("pack-shards", f"++input={empty}", f"++output_dir={tmp_path / 'a'}")
    assert_user_error(result, "empty.jsonl holds no utterances")
    assert not (tmp_path / "a" / "data.list").exists()
    unreadable = write_jsonl(tmp_path / "bad.jsonl", [{"key": f"u{i}", "source": str(tmp_path / f"no{i}.wav"),
                                                       "target": "x"} for i in range(3)])
    result = run_cli("pack-shards", f"++input={unreadable}", f"++output_dir={tmp_path / 'b'}", "++on_error=skip")
    assert_user_error(result, "pack-shards produced nothing", "unreadable audio: 3")
    assert result.returncode == 2


def test_a_kaldi_dir_utterance_without_a_transcript_is_named_by_key_and_line(tmp_path):
    import shutil

    kaldi_dir = tmp_path / "kaldi"
    shutil.copytree(FIXTURE, kaldi_dir)
    lines = (kaldi_dir / "text").read_text(encoding="utf-8").splitlines(keepends=True)
    dropped = lines[5].split(" ", 1)[0]
    (kaldi_dir / "text").write_text("".join(lines[:5] + lines[6:]), encoding="utf-8")
    wav_line = next(i for i, line in enumerate((kaldi_dir / "wav.scp").read_text().splitlines(), 1)
                    if line.split(" ", 1)[0] == dropped)
    result = run_cli("corpus-io", "pack-shards", f"++input={kaldi_dir}", f"++output_dir={tmp_path / 'out'}",
                     cwd=REPO)
    assert_user_error(result, f"{kaldi_dir / 'wav.scp'}:{wav_line}: key '{dropped}': missing transcript")
    result = run_cli("corpus-io", "pack-shards", f"++input={kaldi_dir}", f"++output_dir={tmp_path / 'out'}",
                     "++on_error=skip", cwd=REPO)
    assert result.returncode == 0 and "missing transcript: 1" in result.stderr, result.stderr


def test_exclude_keys_leaves_out_the_keys_of_a_flagged_file_counting_them_and_naming_keys_not_in_the_input(
        tmp_path, fixture_jsonl, capfd):
    keys = [json.loads(line)["key"] for line in fixture_jsonl.read_text().splitlines()]
    flagged = tmp_path / "flagged"  # score's format: the key, then its reasons
    flagged.write_text(f"{keys[0]} cer 0.8 > 0.3; loss_per_token 9.1 > 1.1\n{keys[5]} unalignable: 9 tokens\n\n"
                       f"not-in-this-input wer 1 > 0.3\n", encoding="utf-8")
    summary = pack_shards(_cfg(fixture_jsonl, tmp_path / "out", exclude_keys=str(flagged)))
    packed = [s["key"] for s in _all_samples(tmp_path / "out" / "data.list")]
    assert packed == [k for k in keys if k not in (keys[0], keys[5])]
    assert summary.skipped["excluded by ++exclude_keys"] == 2
    err = capfd.readouterr().err
    assert "skipped 2 (excluded by ++exclude_keys: 2)" in err
    assert f"++exclude_keys={flagged}: 2 of its 3 keys left out; 1 is not in the input (e.g. " \
           f"'not-in-this-input')" in err


def test_exclude_keys_that_does_not_exist_is_one_paragraph(tmp_path, fixture_jsonl):
    with pytest.raises(DataError, match=r"\+\+exclude_keys=.*nope does not exist. Give a file of keys"):
        pack_shards(_cfg(fixture_jsonl, tmp_path / "out", exclude_keys=str(tmp_path / "nope")))
    assert not (tmp_path / "out").exists()
