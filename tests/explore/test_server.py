"""The explorer's HTTP API on a real server (127.0.0.1, port from the OS): 4xx for bad requests, audio by
byte range straight from tar members, and a clear message for a row whose shard is gone."""

from __future__ import annotations

import json
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from corpus_io.explore.catalog import build
from tests.conftest import assert_user_error, hang_limit, run_bounded, run_cli
from tests.explore.conftest import Served, copy_shards, fixture_texts

pytestmark = pytest.mark.network


def get(url: str, headers: dict | None = None, method: str = "GET") -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=hang_limit(30)) as r:  # noqa: S310 - loopback test server
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
        exc.close()
        return exc.code, dict(exc.headers), body


@pytest.fixture(scope="module")
def served(packed, decode_dirs, tmp_path_factory):
    cat = build(str(packed / "data.list"), cache_dir=tmp_path_factory.mktemp("cache"),
                decode_dirs=[str(d) for d in decode_dirs])
    s = Served(cat)
    yield s
    s.close()


def member_bytes(shard: str, member: str) -> bytes:
    with tarfile.open(shard) as tar:
        return tar.extractfile(member).read()


@pytest.mark.parametrize(("path", "reason"), [
    ("/api/rows?page=-1", "page=-1"), ("/api/rows?size=1000000000", "size=1000000000"),
    ("/api/rows?size=0", "size=0"), ("/api/rows?page=x", "page='x'"), ("/api/rows?sort=__import__", "sort="),
    ("/api/rows?text=(unclosed", "text='(unclosed'"), ("/api/rows?dur_min=nan", "dur_min="),
    ("/api/rows?flag=drop", "flag="),
    # valid Python regexes that the engine's RE2 rejects: a lookahead, a backreference
    ("/api/rows?text=(%3F%3Da)", "text='(?=a)'"), ("/api/rows?text=(a)%5C1", "text='(a)\\\\1'"),
    ("/api/hist?text=(%3F%3Da)", "text='(?=a)'"),
    # pages past the last (24 rows; the key filter leaves 1) are refused before the engine sorts
    ("/api/rows?page=1000000000000", "page=1000000000000 is past the last page (0)"),
    ("/api/rows?page=1&size=24", "page=1 is past the last page (0)"),
    ("/api/rows?page=3&size=10", "page=3 is past the last page (2)"),
    ("/api/rows?page=1&size=1&key=spk0-utt008", "page=1 is past the last page (0)"),
    ("/api/hist?column=key", "column='key'"), ("/api/hist?bins=100000", "bins=100000"),
    ("/api/waveform/0?width=-5", "width=-5"),
])
def test_bad_parameters_are_400_with_a_reason_naming_the_parameter(served, path, reason):
    status, _, body = get(served.base + path)
    assert status == 400, body
    assert reason in json.loads(body)["error"]


@pytest.mark.parametrize(("path", "rows"), [("/api/rows?page=2&size=10", 4), ("/api/rows?page=0&key=no-such-key", 0)])
def test_the_last_page_and_an_empty_first_page_are_served(served, path, rows):
    status, _, body = get(served.base + path)
    assert status == 200
    assert len(json.loads(body)["rows"]) == rows


@pytest.mark.parametrize("path", [
    "/etc/passwd", "/../../etc/passwd", "/static/../catalog.py", "/static/server.py", "/api/audio/999999",
    "/api/row/24", "/api/audio/-1", "/api/audio/0/../../x", "/api/spectrogram/0", "/api/audio/0.png",
    "/api/audio/%2Fetc%2Fpasswd",
])
def test_paths_outside_the_catalog_are_404(served, path):
    status, _, body = get(served.base + path)
    assert status == 404, path
    assert b"root:" not in body


def test_the_server_is_read_only(served):
    status, _, _ = get(served.base + "/api/rows", method="POST")
    assert status == 405


def test_pages_sort_and_filter_through_the_engine(served):
    _, _, body = get(served.base + "/api/rows?size=5&sort=duration&desc=1")
    page = json.loads(body)
    durs = [r["duration"] for r in page["rows"]]
    assert page["total"] == 24 and len(durs) == 5 and durs == sorted(durs, reverse=True)
    _, _, body = get(served.base + "/api/rows?size=100&sort=text")
    texts = [r["text"] for r in json.loads(body)["rows"]]
    assert texts == sorted(texts)
    _, _, body = get(served.base + "/api/rows?text=%5Ethe%20quick&speaker=spk0")
    assert [r["key"] for r in json.loads(body)["rows"]] == ["spk0-utt008"]
    _, _, body = get(served.base + "/api/rows?cer_min=0.0001&sort=cer&desc=1")
    assert {r["key"] for r in json.loads(body)["rows"]} == {"spk0-utt008", "spk0-utt012", "spk2-utt010"}
    _, _, body = get(served.base + "/api/rows?flag=better")
    assert {r["key"] for r in json.loads(body)["rows"]} == {"spk0-utt008", "spk2-utt010"}
    _, _, body = get(served.base + "/api/rows?shard=1&dur_min=2&dur_max=3")
    rows = json.loads(body)["rows"]
    assert rows and all(r["shard_id"] == 1 and 2 <= r["duration"] <= 3 for r in rows)
    _, _, body = get(served.base + "/api/hist?column=duration&bins=4")
    assert sum(json.loads(body)["counts"]) == 24


def test_audio_is_the_member_bytes_with_range_support_for_wav_and_flac(served):
    _, _, body = get(served.base + "/api/rows?size=100")
    seen = set()
    for r in json.loads(body)["rows"]:
        row = json.loads(get(f"{served.base}/api/row/{r['row_id']}")[2])
        fmt = row["audio_format"]
        if fmt in seen:
            continue
        seen.add(fmt)
        want = member_bytes(row["shard"], row["member"])
        status, headers, data = get(f"{served.base}/api/audio/{r['row_id']}")
        assert status == 200 and data == want and headers["Content-Type"] == f"audio/{fmt}"
        assert headers["Accept-Ranges"] == "bytes"
        status, headers, data = get(f"{served.base}/api/audio/{r['row_id']}", {"Range": "bytes=100-199"})
        assert status == 206 and data == want[100:200]
        assert headers["Content-Range"] == f"bytes 100-199/{len(want)}"
        status, _, data = get(f"{served.base}/api/audio/{r['row_id']}", {"Range": "bytes=-10"})
        assert status == 206 and data == want[-10:]
        status, headers, _ = get(f"{served.base}/api/audio/{r['row_id']}", {"Range": f"bytes={len(want)}-"})
        assert status == 416 and headers["Content-Range"] == f"bytes */{len(want)}"
    assert seen == {"wav", "flac"}


def test_a_key_bench_loader_dumped_plays_its_dumped_waveform_and_the_others_their_stored_audio(served, tmp_path):
    import numpy as np
    import soundfile as sf
    import torch

    from corpus_io.config import ExploreConfig
    from corpus_io.errors import ConfigError
    from corpus_io.explore.server import explore
    from corpus_io.loader.waveaug import write_dump

    rows = json.loads(get(served.base + "/api/rows?size=2")[2])["rows"]
    dumped, stored = rows
    wave = torch.from_numpy(np.random.default_rng(0).uniform(-0.5, 0.5, (1, 12345)).astype(np.float32))
    write_dump(str(tmp_path), dumped["key"], wave, 16000)  # as bench-loader ++dump_audio_dir writes it
    want = (tmp_path / f"{dumped['key']}.wav").read_bytes()
    s = Served(served.explorer.catalog, dump_audio_dir=str(tmp_path))
    try:
        status, headers, data = get(f"{s.base}/api/audio/{dumped['row_id']}")
        assert status == 200 and data == want and headers["Content-Type"] == "audio/wav"
        status, _, data = get(f"{s.base}/api/audio/{dumped['row_id']}", {"Range": "bytes=100-199"})
        assert status == 206 and data == want[100:200]
        row = json.loads(get(f"{s.base}/api/row/{dumped['row_id']}")[2])
        assert row["audio_dumped"] is True and row["audio_bytes"] == len(want)
        waveform = json.loads(get(f"{s.base}/api/waveform/{dumped['row_id']}?width=10")[2])
        assert (waveform["num_samples"], waveform["sample_rate"]) == (12345, 16000)
        assert np.array_equal(sf.read(tmp_path / f"{dumped['key']}.wav", dtype="float32")[0], wave[0].numpy())
        row = json.loads(get(f"{s.base}/api/row/{stored['row_id']}")[2])
        assert row["audio_dumped"] is False
        assert get(f"{s.base}/api/audio/{stored['row_id']}")[2] == member_bytes(row["shard"], row["member"])
    finally:
        s.close()
    with pytest.raises(ConfigError, match="dump_audio_dir=.*nope is not a directory.*bench-loader"):
        explore(ExploreConfig(input=str(Path(row["shard"]).parent / "data.list"), port=0,
                              dump_audio_dir=str(tmp_path / "nope")))


def test_dataset_view_has_word_accuracy_per_vocabulary_word(served):
    info = json.loads(get(served.base + "/api/info")[2])
    assert info["utterances"] == 24 and len(info["runs"]) == 2 and len(info["shards"]) == 3
    d = json.loads(get(served.base + "/api/dataset")[2])
    assert json.loads(get(served.base + "/api/dataset")[2]) == d  # computed once, served again
    acc = {w: (n, hit) for w, n, hit in d["run1"]["word_accuracy"]}
    texts = fixture_texts()
    the = sum(t.split().count("the") for t in texts.values())
    assert acc["the"] == (the, the - 1)  # run 1 dropped one "the"
    assert acc["fox"] == (1, 0) and acc["hello"] == (1, 1) and acc["world"] == (1, 1)
    assert acc["five"] == (sum(t.split().count("five") for t in texts.values()),) * 2
    assert d["run2"]["word_accuracy"] and d["compare"] == {"better": 2, "worse": 0}


def test_row_view_marks_substitutions_insertions_and_deletions(served):
    _, _, body = get(served.base + "/api/rows?key=spk0-utt012")
    row = json.loads(get(f"{served.base}/api/row/{json.loads(body)['rows'][0]['row_id']}")[2])
    assert row["diff"]["counts"] == {"S": 0, "I": 0, "D": 1}
    assert ["D", "the", ""] in row["diff"]["words"]
    status, headers, png = get(f"{served.base}/api/spectrogram/{row['row_id']}.png")
    assert status == 200 and png.startswith(b"\x89PNG") and headers["Content-Type"] == "image/png"
    wave = json.loads(get(f"{served.base}/api/waveform/{row['row_id']}?width=100")[2])
    assert len(wave["peaks"]) == 100 and wave["num_samples"] / wave["sample_rate"] == pytest.approx(row["duration"])


def test_dataset_view_counts_and_lists_characters_missing_from_the_token_list(packed, tmp_path):
    cat = build(str(packed / "data.list"), cache_dir=tmp_path / "cache")
    units = tmp_path / "units.txt"
    alphabet = {c for t in fixture_texts().values() for c in t if not c.isspace()}
    units.write_text("".join(f"{c} {i}\n" for i, c in enumerate(sorted(alphabet - {"z", "天"}))), encoding="utf-8")
    s = Served(cat, token_list=str(units))
    try:
        d = json.loads(get(s.base + "/api/dataset")[2])
    finally:
        s.close()
    assert d["utterances"] == 24 and d["speakers"] == 4 and len(d["shards"]) == 3
    assert sum(x["utterances"] for x in d["shards"]) == 24 and d["hours"] == pytest.approx(sum(
        x["hours"] for x in d["shards"]))
    counts = dict(d["alphabet"])
    assert set(counts) == alphabet and counts["天"] == sum(t.count("天") for t in fixture_texts().values())
    assert sorted(u for u, _ in d["missing_tokens"]) == sorted(["z", "天"])


def test_a_missing_shard_gives_a_message_on_the_row_not_a_crash(packed, tmp_path):
    data_list = copy_shards(packed, tmp_path / "s")
    cat = build(str(data_list), cache_dir=tmp_path / "cache")
    (tmp_path / "s" / "shard-000000.tar").unlink()
    s = Served(cat)
    try:
        row = json.loads(get(s.base + "/api/row/0")[2])
        assert "shard-000000.tar is missing" in row["audio_error"] and "restart corpus-io explore" in row["audio_error"]
        status, _, body = get(s.base + "/api/audio/0")
        assert status == 404 and "is missing" in json.loads(body)["error"]
        status, _, body = get(s.base + "/api/audio/9")  # another shard still plays
        assert status == 200 and body[:4] in (b"RIFF", b"fLaC")
    finally:
        s.close()


def test_explore_refuses_a_missing_input_in_one_paragraph_and_never_imports_torch(tmp_path):
    result = run_cli("corpus-io", "explore", f"++input={tmp_path / 'nope.list'}", "++port=0", timeout=60)
    assert_user_error(result, "nope.list does not exist", "Kaldi dir")
    probe = run_bounded([sys.executable, "-c", "import sys; import corpus_io.explore.server; "
                         "from corpus_io.explore.results import score; score('a b', 'a c'); "
                         "print('torch' in sys.modules)"], 60)
    assert probe.stdout.strip() == "False", probe.stderr


def test_a_port_in_use_says_so_and_which_key_picks_another_before_any_catalog_is_built(packed, tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run_cli("corpus-io", "explore", f"++input={packed / 'data.list'}", f"++port={port}",
                         f"++cache_dir={tmp_path / 'cache'}", timeout=60)
    assert_user_error(result, f"port {port} on 127.0.0.1 is in use", "Pick another port with ++port=N, or ++port=0")
    assert "free space" not in result.stderr
    assert not (tmp_path / "cache").exists()


def test_kaldi_dir_audio_is_the_source_file_and_a_segment_is_cut_to_its_span(tmp_path):
    import io

    import soundfile as sf

    from tests.conftest import FIXTURE

    whole = build(str(FIXTURE), cache_dir=tmp_path / "k")
    segs = build(str(FIXTURE / "segments_dir"), cache_dir=tmp_path / "s")
    s1, s2 = Served(whole), Served(segs)
    try:
        row = json.loads(get(s1.base + "/api/row/0")[2])
        status, headers, data = get(s1.base + "/api/audio/0", {"Range": "bytes=0-"})
        assert status == 206 and data == Path(row["source"]).read_bytes()
        row = json.loads(get(s2.base + "/api/row/1")[2])
        assert (row["key"], row["seg_start"], row["seg_end"]) == ("long-seg01", 3.205, 5.178)
        status, headers, data = get(s2.base + "/api/audio/1")
        info = sf.info(io.BytesIO(data))
        assert status == 200 and headers["Content-Type"] == "audio/wav"
        assert info.duration == pytest.approx(5.178 - 3.205, abs=1e-3) == pytest.approx(row["duration"], abs=1e-3)
    finally:
        s1.close()
        s2.close()


def test_empty_texts_are_empty_not_duplicates_and_a_list_without_speakers_has_no_speaker_count(tmp_path):
    from tests.conftest import FIXTURE

    wav = sorted((FIXTURE / "wav").iterdir())[0]
    texts = {"a": "", "b": "", "c": " \t", "d": "hello world", "e": "hello world", "f": "unique"}
    raw = tmp_path / "train.jsonl"
    raw.write_text("".join(json.dumps({"key": k, "source": str(wav), "target": t}) + "\n" for k, t in texts.items()),
                   encoding="utf-8")
    s = Served(build(str(raw), cache_dir=tmp_path / "cache"))
    try:
        def keys(query: str) -> dict:
            return {r["key"]: r["text_count"] for r in json.loads(get(s.base + "/api/rows?" + query)[2])["rows"]}

        assert keys("flag=duplicate") == {"d": 2, "e": 2}
        assert keys("flag=empty") == {"a": None, "b": None, "c": None}
        d = json.loads(get(s.base + "/api/dataset")[2])
        assert (d["duplicate_text_rows"], d["empty_text"]) == (2, 3)
        assert d["speakers"] is None, "a list with no speaker field has unknown speakers, not 0"
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["parquet", "shar"])
def test_a_parquet_or_lhotse_shar_list_lists_every_row_and_plays_its_stored_audio(kind, tmp_path):
    """A shard list of Hugging Face parquet files (written by ``datasets``) or of Lhotse Shar shards (written by
    Lhotse): each row's key, text and duration, and its audio the stored bytes (the parquet cell; the Shar tar
    member), by range too."""
    import gc
    import io

    import soundfile as sf

    from corpus_io.shards.datalist import make_shard_list
    from tests.loader_data import make_hf_parquet, make_shar

    if kind == "parquet":
        data, utts = make_hf_parquet(tmp_path / "hf", num_utts=10, num_files=2, row_group=4)
        texts, stored = {k: t for k, (_, t) in utts.items()}, {k: b for k, (b, _) in utts.items()}
    else:
        data, texts = make_shar(tmp_path / "shar", windows=2, shard_size=10)
        stored = {}
        for tar in sorted(data.glob("recording.*.tar")):
            with tarfile.open(tar) as t:
                stored.update({m.name.rsplit(".", 1)[0]: t.extractfile(m).read() for m in t
                               if not m.name.endswith(".json")})
    make_shard_list([str(data)], str(tmp_path / "data.list"))
    s = Served(build(str(tmp_path / "data.list"), cache_dir=tmp_path / "cache"))
    try:
        rows = json.loads(get(s.base + "/api/rows?size=100")[2])["rows"]
        assert {r["key"]: r["text"] for r in rows} == texts
        for r in rows:
            assert r.get("error") is None and r["duration"] > 0.5, r
            status, headers, body = get(f"{s.base}/api/audio/{r['row_id']}")
            info = sf.info(io.BytesIO(body))
            assert status == 200 and body == stored[r["key"]], r["key"]
            assert headers["Content-Type"] == f"audio/{info.format.lower()}"
            assert info.duration == pytest.approx(r["duration"], abs=0.01)
        status, _, part = get(f"{s.base}/api/audio/{rows[-1]['row_id']}", {"Range": "bytes=100-199"})
        assert status == 206 and part == stored[rows[-1]["key"]][100:200]
    finally:
        s.close()
        # pyarrow's garbage collected in a later test's forked DataLoader worker (after duckdb ran in this process)
        # segfaults it: collect it here, in the process that made it
        gc.collect()


def test_the_figures_of_corpus_io_score_sort_filter_and_flag_with_the_audio_a_click_away(packed, tmp_path):
    """++scores: scores.jsonl of corpus-io score joined by key (a row it lacks shows none): every figure sorts and
    filters, flag=flagged keeps the flagged rows, the row view carries the reasons and plays the audio."""
    keys = sorted(fixture_texts())
    out = tmp_path / "score"
    out.mkdir()
    rows = [{"key": k, "flagged": i % 6 == 0, "reasons": [f"loss_per_token {i}.5 > 1"] if i % 6 == 0 else [],
             "cer": i / 100, "wer": i / 50, "loss_per_frame": 0.01 * i, "loss_per_token": 0.1 * (23 - i),
             "chars_per_second": 10.0 + i, "tokens_per_second": 2.0 + i / 10, "alignable": True, "hyp": "h"}
            for i, k in enumerate(keys[:-1])]  # the last key was not scored
    (out / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    s = Served(build(str(packed / "data.list"), cache_dir=tmp_path / "cache", scores=str(out)))
    try:
        assert json.loads(get(s.base + "/api/info")[2])["scores"] == str((out / "scores.jsonl").resolve())
        page = json.loads(get(s.base + "/api/rows?size=100&sort=score_loss_per_token&desc=1")[2])
        ranked = [r["key"] for r in page["rows"]]
        assert ranked[:-1] == keys[:-1] and ranked[-1] == keys[-1]  # unscored: last (nulls last)
        assert page["rows"][0]["score_flagged"] is True and page["rows"][0]["score_reasons"] == "loss_per_token 0.5 > 1"
        for figure in ("cer", "wer", "loss_per_frame", "loss_per_token", "chars_per_second", "tokens_per_second"):
            col = f"score_{figure}"
            got = json.loads(get(f"{s.base}/api/rows?size=100&sort={col}")[2])["rows"]
            values = [r[col] for r in got if r[col] is not None]
            assert values == sorted(values) and len(values) == 23, figure
            assert json.loads(get(f"{s.base}/api/hist?column={col}&bins=4")[2])["counts"]
        got = json.loads(get(s.base + "/api/rows?size=100&score_loss_per_token_min=1.05&score_cer_max=0.05")[2])
        assert {r["key"] for r in got["rows"]} == {keys[i] for i in range(23) if 0.1 * (23 - i) >= 1.05 and i <= 5}
        flagged = json.loads(get(s.base + "/api/rows?size=100&flag=flagged")[2])["rows"]
        assert [r["key"] for r in flagged] == [keys[i] for i in range(0, 23, 6)]
        assert json.loads(get(s.base + "/api/rows?size=100&flag=unflagged")[2])["total"] == 23 - len(flagged)
        status, headers, _ = get(f"{s.base}/api/audio/{flagged[0]['row_id']}")  # the audio, a click away
        assert status == 200 and headers["Content-Type"].startswith("audio/")
        assert json.loads(get(f"{s.base}/api/dataset")[2])["score"]["flagged"] == len(flagged)
    finally:
        s.close()
    s = Served(build(str(packed / "data.list"), cache_dir=tmp_path / "cache"))  # without ++scores: none of it
    try:
        status, _, body = get(s.base + "/api/rows?flag=flagged")
        assert status == 400 and "++scores" in json.loads(body)["error"]
        assert get(s.base + "/api/rows?sort=score_cer")[0] == 400
    finally:
        s.close()
