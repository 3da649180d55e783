"""Hugging Face parquet as an input (issue 32): the 40 utterances written by the real ``datasets``, read row group by
row group, packed with every key's audio bytes and text unchanged, listed as shards, and malformed files named."""

from __future__ import annotations

import functools
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_io.config import MakeDatalistConfig, PackShardsConfig
from corpus_io.errors import ConfigError, DataError
from corpus_io.shards.datalist import make_datalist
from corpus_io.shards.index import load_index, read_datalist
from corpus_io.shards.pack import pack_shards
from corpus_io.shards.reader import read_shard
from corpus_io.tables import parquet
from corpus_io.tables.inputs import detect, iter_records, open_input
from tests.loader_data import make_hf_parquet


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """``(data dir, {key: (audio bytes, text)})``: 40 utterances in 2 files of 3 row groups, by ``datasets``."""
    return make_hf_parquet(tmp_path_factory.mktemp("hf"))


def _rewrite(src: Path, dst: Path, change) -> Path:
    """``src`` with its arrow table changed by ``change(table) -> table``, written to ``dst`` (row groups of 8)."""
    table = change(pq.read_table(src))
    dst.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, dst, row_group_size=8)
    return dst


def test_pack_from_hf_parquet_keeps_every_keys_audio_bytes_and_text(hf, tmp_path):
    data, utts = hf
    summary = pack_shards(PackShardsConfig(input=str(data), output_dir=str(tmp_path / "out"), num_utts_per_shard=16,
                                           num_workers=1))
    samples = [s for url in read_datalist(tmp_path / "out" / "data.list") for s in read_shard(url)]
    assert summary.kept == 40 and len(samples) == 40
    assert {s["key"]: (s["audio"], s["txt"]) for s in samples} == utts  # bytes copied (audio_format=keep)
    assert {s["meta"]["speaker"] for s in samples} == {"spk0", "spk1", "spk2", "spk3"}  # speaker_id, found by name
    assert all(s["meta"]["duration"] > 0 for s in samples)


def test_a_directory_a_glob_and_a_file_are_read_with_their_rows_in_file_order(hf):
    data, utts = hf
    files = sorted(str(p) for p in data.glob("*.parquet"))
    assert detect(str(data)) == detect(files[0]) == "hf-parquet"
    from_dir = [r["key"] for r in iter_records(str(data))]
    assert from_dir == list(utts)  # file order, row order
    assert [r["key"] for r in iter_records(str(data / "train-*.parquet"))] == from_dir
    assert [r["key"] for r in iter_records(files[1])] == from_dir[20:]


def test_shuffle_permutes_row_groups_and_their_rows_holding_one_row_group(hf):
    inp = open_input(str(hf[0]))
    inp.scan()
    keys = [r["key"] for r in inp.records(shuffle=True, seed=3)]
    assert sorted(keys) == sorted(hf[1]) and keys != list(hf[1])
    assert keys == [r["key"] for r in open_input(str(hf[0])).records(shuffle=True, seed=3)]  # seeded
    assert keys[5:12] == [r["key"] for r in inp.records(shuffle=True, seed=3, start=5)][:7]  # a job's start


def test_columns_are_found_by_their_common_names_or_named_and_else_listed(hf, tmp_path):
    data, utts = hf
    src = sorted(data.glob("*.parquet"))[0]
    renamed = _rewrite(src, tmp_path / "cv" / "a.parquet",
                       lambda t: t.rename_columns(["id", "audio", "sentence", "client_id"]))  # Common Voice's names
    records = list(iter_records(str(renamed)))
    assert [r["target"] for r in records] == [t for _, t in list(utts.values())[:20]]
    assert records[0]["speaker"] == "spk0"
    odd = _rewrite(src, tmp_path / "odd" / "a.parquet", lambda t: t.rename_columns(["uid", "speech_data", "words",
                                                                                  "who"]))
    with pytest.raises(DataError, match=r"cannot tell which column holds the text .* its columns: uid \(string\), "
                                        r"speech_data .*words \(string\).*export with columns\.text=<column>"):
        list(iter_records(str(odd)))
    named = list(iter_records(str(odd), columns={"text": "words", "key": "uid"}))
    assert [(r["key"], r["target"]) for r in named] == [(k, t) for k, (_, t) in list(utts.items())[:20]]
    with pytest.raises(DataError, match="has no column 'sentence' .*its columns: uid"):
        list(iter_records(str(odd), columns={"text": "sentence"}))
    with pytest.raises(ConfigError, match="columns.txt is not a column role"):
        list(iter_records(str(odd), columns={"txt": "words"}))


def test_decoded_array_audio_is_encoded_and_null_path_keys_come_from_the_file_and_row(tmp_path):
    import numpy as np
    import soundfile as sf

    wave = (np.sin(np.arange(16000) / 10) * 0.3).astype(np.float32)
    table = pa.table({"audio": [{"array": wave.tolist(), "sampling_rate": 16000}], "text": ["hello"]})
    pq.write_table(table, tmp_path / "decoded.parquet")
    (rec,) = iter_records(str(tmp_path / "decoded.parquet"))
    assert rec["key"] == "decoded-00000000"
    back, rate = sf.read(__import__("io").BytesIO(rec["source_bytes"]), dtype="float32")
    assert rate == 16000 and np.abs(back - wave).max() < 1e-4  # 16-bit WAV


def test_array_audio_holding_inf_is_refused_naming_file_row_and_key_or_skipped_and_counted(tmp_path):
    import numpy as np

    from tests.conftest import assert_user_error, run_cli

    cells = []
    for i in range(3):
        wave = (np.sin(np.arange(8000) / 10) * 0.3).astype(np.float32)
        if i == 1:
            wave[7] = np.inf
        cells.append({"array": wave.tolist(), "sampling_rate": 16000})
    src = tmp_path / "arrays.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "audio": cells, "text": ["x", "y", "z"]}), src)
    before = src.read_bytes()
    result = run_cli("corpus-io", "pack-shards", f"++input={src}", f"++output_dir={tmp_path / 'o1'}")
    assert_user_error(result, f"{src} row 1: key 'b': its audio cell: the audio holds 1 non-finite samples (NaN or "
                              "infinity), the first at sample 7", "++on_error=skip")
    result = run_cli("corpus-io", "pack-shards", f"++input={src}", f"++output_dir={tmp_path / 'o2'}",
                     "++on_error=skip")
    assert result.returncode == 0, result.stderr
    assert "skipped 1 (unreadable audio: 1)" in result.stdout + result.stderr
    keys = [s["key"] for t in sorted((tmp_path / "o2").glob("*.tar")) for s in read_shard(str(t))]
    assert keys == ["a", "c"] and src.read_bytes() == before


def test_a_directory_of_several_splits_is_refused_with_the_glob_of_one(hf, tmp_path):
    data, _ = hf
    both = tmp_path / "both" / "data"
    shutil.copytree(data, both)
    shutil.copy(both / "train-00000-of-00002.parquet", both / "test-00000-of-00001.parquet")
    with pytest.raises(DataError, match=r"2 splits \(test, train\).*'\S*both/data/test-\*\.parquet'"):
        open_input(str(both))
    assert len(list(iter_records(str(both / "test-*.parquet")))) == 20


def test_malformed_parquet_gets_a_clear_error_or_a_counted_skip(hf, tmp_path):
    data, utts = hf
    src = sorted(data.glob("*.parquet"))[0]
    no_audio = _rewrite(src, tmp_path / "noaudio" / "a.parquet", lambda t: t.drop_columns(["audio"]))
    with pytest.raises(DataError, match=r"cannot tell which column holds the audio .* its columns: id \(string\), "
                                        r"text \(string\), speaker_id"):
        open_input(str(no_audio)).scan()

    def null_audio(t, text_too=False):
        audio = t.column("audio").to_pylist()
        text = t.column("text").to_pylist()
        audio[3] = None
        if text_too:
            text[5] = None
        return t.set_column(1, "audio", pa.array(audio, t.schema.field("audio").type)).set_column(
            2, "text", pa.array(text, pa.string()))

    keys = list(utts)
    no_audio = _rewrite(src, tmp_path / "hole" / "a.parquet", null_audio)
    with pytest.raises(DataError, match=rf"a.parquet row 3: key '{keys[3]}': .*its audio is null.*on_error=skip"):
        pack_shards(PackShardsConfig(input=str(no_audio), output_dir=str(tmp_path / "o1"), num_workers=1))
    with pytest.raises(DataError, match=rf"a.parquet row 3: key '{keys[3]}': no audio \(its audio is null\)"):
        list(iter_records(str(no_audio)))  # records that hold the audio (the API, stats) find it in the input
    holes = _rewrite(src, tmp_path / "holes" / "a.parquet", lambda t: null_audio(t, text_too=True))
    with pytest.raises(DataError, match=rf"a.parquet row 5: key '{keys[5]}': missing transcript .*on_error=skip"):
        pack_shards(PackShardsConfig(input=str(holes), output_dir=str(tmp_path / "o2"), num_workers=1))
    summary = pack_shards(PackShardsConfig(input=str(holes), output_dir=str(tmp_path / "o3"), num_workers=1,
                                           on_error="skip"))
    assert summary.kept == 18 and summary.skipped == {"unreadable audio": 1, "missing transcript": 1}

    def not_audio(t):
        audio = t.column("audio").to_pylist()
        audio[2] = {"bytes": b"this is text, not audio" * 10, "path": "x.wav"}
        return t.set_column(1, "audio", pa.array(audio, t.schema.field("audio").type))

    junk = _rewrite(src, tmp_path / "junk" / "a.parquet", not_audio)
    with pytest.raises(DataError, match=rf"a.parquet row 2: key '{keys[2]}': .*not a known audio format"):
        pack_shards(PackShardsConfig(input=str(junk), output_dir=str(tmp_path / "o4"), num_workers=1))
    summary = pack_shards(PackShardsConfig(input=str(junk), output_dir=str(tmp_path / "o5"), num_workers=1,
                                           on_error="skip"))
    assert summary.kept == 19 and summary.skipped == {"unreadable audio": 1}

    truncated = tmp_path / "cut" / "a.parquet"
    truncated.parent.mkdir()
    truncated.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(DataError, match=r"cut/a.parquet is not a readable parquet file .*truncated download"):
        open_input(str(truncated)).scan()


def test_a_key_repeated_across_files_is_refused_naming_both_rows(hf, tmp_path):
    data, _ = hf
    twice = tmp_path / "twice"
    twice.mkdir()
    src = sorted(data.glob("*.parquet"))[0]
    shutil.copy(src, twice / "train-00000-of-00002.parquet")
    shutil.copy(src, twice / "train-00001-of-00002.parquet")
    with pytest.raises(DataError, match=r"duplicate key 'c0-spk\d-utt\d+' .*00000-of-00002.parquet row (\d+) and "
                                        r"\S*00001-of-00002.parquet row \1\. .*with columns.key"):
        open_input(str(twice)).scan()


def test_make_datalist_lists_each_parquet_file_as_a_shard_with_its_index_from_the_headers(hf, tmp_path):
    import soundfile as sf

    data, utts = hf
    out = tmp_path / "list" / "data.list"
    make_datalist(MakeDatalistConfig(data_type="shard", input=[str(data)], output=str(out)))
    entries = read_datalist(out)
    assert entries == sorted(str(p) for p in data.glob("*.parquet"))
    index = load_index(out, keys=True)
    assert [index[e]["keys"] for e in entries] == [list(utts)[:20], list(utts)[20:]]
    want = sum(sf.info(__import__("io").BytesIO(b)).duration for b, _ in list(utts.values())[:20])
    assert index[entries[0]]["duration"] == pytest.approx(want, abs=1e-3)
    assert index[entries[0]]["bytes"] == Path(entries[0]).stat().st_size
    with pytest.raises(ConfigError, match=r"held in its parquet rows.*make-datalist \+\+data_type=shard"):
        make_datalist(MakeDatalistConfig(data_type="raw", input=[str(data)], output=str(tmp_path / "raw.list")))


def test_a_parquet_directory_is_walked_once_by_input_detection_make_datalist_and_export(hf, tmp_path, monkeypatch):
    """Input kind is decided once (tables.inputs.resolve_input) and passed down: its TypedInput holds the files and
    split the one walk found, and neither make-datalist nor export walks the directory again (each walked it for
    the parquet check, then again for the kind or the file list)."""
    import os

    from corpus_io.config import ExportConfig
    from corpus_io.shards.export import export
    from corpus_io.tables.inputs import resolve_input

    data, _ = hf
    files = tuple(sorted(str(p) for p in data.glob("*.parquet")))
    listings: list[str] = []
    real_scandir = os.scandir

    def scandir(path="."):
        if os.path.realpath(path) == os.path.realpath(data):
            listings.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    typed = resolve_input(data)
    assert (typed.kind, typed.files, typed.split) == ("hf-parquet", files, "train")
    assert len(listings) == 1
    make_datalist(MakeDatalistConfig(data_type="shard", input=[str(data)], output=str(tmp_path / "data.list")))
    assert len(listings) == 2
    export(ExportConfig(input=str(data), output_dir=str(tmp_path / "out"), format="hf-parquet", num_workers=1))
    assert len(listings) == 3


def test_a_column_mapping_travels_in_the_list_line_to_the_loaders_reader(hf, tmp_path):
    data, utts = hf
    odd = _rewrite(sorted(data.glob("*.parquet"))[0], tmp_path / "odd" / "a.parquet",
                   lambda t: t.rename_columns(["uid", "speech_data", "words", "who"]))
    out = tmp_path / "data.list"
    make_datalist(MakeDatalistConfig(data_type="shard", input=[str(odd)], output=str(out),
                                     columns={"text": "words", "key": "uid"}))
    (entry,) = read_datalist(out)
    assert entry == f"{odd}#key=uid&text=words"
    samples = list(parquet.read_samples(entry))
    assert [(s["key"], s["audio"], s["txt"], s["__pos__"]) for s in samples] == \
        [(k, b, t, i) for i, (k, (b, t)) in enumerate(list(utts.items())[:20])]


@pytest.fixture
def http_dir(tmp_path):
    """A directory served over HTTP with Range support (what the Hub and object stores answer)."""

    class Ranged(SimpleHTTPRequestHandler):
        def send_head(self):
            rng = self.headers.get("Range")
            path = Path(self.translate_path(self.path))
            if not rng or not path.is_file():
                return super().send_head()
            size = path.stat().st_size
            lo, _, hi = rng.removeprefix("bytes=").partition("-")
            lo, hi = int(lo), min(int(hi) if hi else size - 1, size - 1)
            self.served.append(hi - lo + 1)
            f = open(path, "rb")
            f.seek(lo)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
            self.send_header("Content-Length", str(hi - lo + 1))
            self.end_headers()
            return _Limited(f, hi - lo + 1)

        def log_message(self, *args):
            pass

    Ranged.served = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Ranged, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}", Ranged.served
    finally:
        server.shutdown()
        server.server_close()


class _Limited:
    def __init__(self, f, n):
        self.f, self.n = f, n

    def read(self, size=-1):
        data = self.f.read(self.n if size < 0 else min(size, self.n))
        self.n -= len(data)
        return data

    def close(self):
        self.f.close()


def test_a_parquet_file_over_http_is_read_by_ranges_not_whole(hf, http_dir):
    data, utts = hf
    root, base, served = http_dir
    src = sorted(data.glob("*.parquet"))[0]
    shutil.copy(src, root / "a.parquet")
    url = f"{base}/a.parquet"
    assert detect(url) == "hf-parquet"
    inp = open_input(url)
    assert inp.scan() == 20
    keys_read = sum(served)
    assert keys_read < src.stat().st_size / 4  # keys and texts only: the audio column is not fetched
    assert [(r["key"], r["source_bytes"], r["target"]) for r in inp.records()] == \
        [(k, b, t) for k, (b, t) in list(utts.items())[:20]]


@pytest.fixture
def plain_http_dir(tmp_path):
    """A directory served by ``python -m http.server``'s handler: no Range support (every GET answers 200 whole)."""

    class Plain(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Plain, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_parquet_file_on_a_server_without_range_support_is_read_whole_or_past_the_bound_refused(hf, plain_http_dir,
                                                                                                  tmp_path):
    from corpus_io.storage import urls
    from tests.conftest import run_cli

    data, utts = hf
    root, base = plain_http_dir
    src = sorted(data.glob("*.parquet"))[0]
    shutil.copy(src, root / "a.parquet")
    url = f"{base}/a.parquet"
    assert [(r["key"], r["source_bytes"], r["target"]) for r in iter_records(url)] == \
        [(k, b, t) for k, (b, t) in list(utts.items())[:20]]  # was fsspec's ValueError traceback
    assert [s["key"] for s in parquet.read_samples(url)] == list(utts)[:20]  # the loader's reader
    result = run_cli("corpus-io", "pack-shards", f"++input={url}", f"++output_dir={tmp_path / 'out'}")
    assert result.returncode == 0, result.stderr
    assert "does not answer Range requests; reading the file whole" in result.stderr
    packed = {s["key"]: s["audio"] for t in sorted((tmp_path / "out").glob("*.tar")) for s in read_shard(str(t))}
    assert packed == {k: b for k, (b, _) in list(utts.items())[:20]}
    with pytest.raises(DataError) as err:
        urls.read_whole(url, max_bytes=1000)
    assert str(err.value).startswith(f"{url}: the server does not answer Range requests (it sends the whole file), "
                                     f"so this file would have to be read whole into memory, and it is larger than "
                                     f"1000 bytes")
    assert (root / "a.parquet").read_bytes() == src.read_bytes()


def test_stats_and_the_api_read_parquet_as_an_input_and_as_a_listed_shard(hf, tmp_path):
    import soundfile as sf

    from corpus_io import api
    from corpus_io.stats import collect

    data, utts = hf
    hours = sum(sf.info(__import__("io").BytesIO(b)).duration for b, _ in utts.values())
    raw = collect(str(data), "raw")
    assert len(raw.durations) == 40 and raw.no_duration == 0 and sum(raw.durations) == pytest.approx(hours, abs=1e-3)
    assert set(raw.speakers) == {"spk0", "spk1", "spk2", "spk3"}
    out = tmp_path / "data.list"
    make_datalist(MakeDatalistConfig(data_type="shard", input=[str(data)], output=str(out)))
    listed = collect(str(out), "shard")
    assert sorted(listed.durations) == pytest.approx(sorted(raw.durations), abs=1e-3) and len(listed.units) == 2
    assert {r["key"]: (r["source_bytes"], r["target"]) for r in api.read_manifest(data)} == utts


@pytest.mark.network
def test_parquet_files_on_s3_are_listed_by_a_glob_indexed_and_read_by_ranges(hf, seaweed, tmp_path):
    import uuid

    data, utts = hf
    endpoint, fs = seaweed
    prefix = f"corpus/{uuid.uuid4().hex[:12]}/data"
    for p in sorted(data.glob("*.parquet")):
        fs.put_file(str(p), f"{prefix}/{p.name}")
    options = {"anon": True, "client_kwargs": {"endpoint_url": endpoint}}
    pattern = f"s3://{prefix}/train-*.parquet"
    got = {r["key"]: (r["source_bytes"], r["target"])
           for r in open_input(pattern, storage_options=options).records()}
    assert got == utts
    out = tmp_path / "data.list"
    make_datalist(MakeDatalistConfig(data_type="shard", input=[pattern], output=str(out), storage_options=options))
    entries = read_datalist(out)
    assert entries == [f"s3://{prefix}/train-0000{i}-of-00002.parquet" for i in range(2)]
    assert load_index(out, keys=True)[entries[1]]["keys"] == list(utts)[20:]
    samples = [s for e in entries for s in parquet.read_samples(e, storage_options=options)]
    assert {s["key"]: (s["audio"], s["txt"]) for s in samples} == utts


def test_records_for_a_packer_name_each_rows_audio_which_its_reader_reads_a_row_group_at_a_time(hf):
    data, utts = hf
    records = list(open_input(str(data), inline=False).records())
    assert not any("source_bytes" in r for r in records)  # the tasks pack-shards keeps in flight hold no audio
    assert records[21]["source"] == f"{sorted(data.glob('*.parquet'))[1]}#row=1"
    assert {r["key"]: (parquet.read_audio(r["source"]), r["target"]) for r in records} == utts
