"""Companion field files: add-field writes them next to the shards, the loader reads them in lockstep."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

from corpus_io.config import AddFieldConfig, DatasetConf, PackShardsConfig
from corpus_io.errors import DataError
from corpus_io.loader.dataset import build_dataloader
from corpus_io.shards.add_field import add_field
from corpus_io.shards.fields import open_shard_fields
from corpus_io.shards.index import load_index, read_datalist
from corpus_io.shards.pack import pack_shards
from corpus_io.shards.reader import iter_tar_members, read_shard
from corpus_io.shards.writer import ShardWriter
from corpus_io.tokenizer import build_tokenizer
from tests.conftest import assert_user_error, run_cli
from tests.loader_data import token_list
from tests.shards.conftest import fixture_records, write_jsonl


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """24 real utterances in 3 shards with the fbank field added; copied per test (tests modify it)."""
    root = tmp_path_factory.mktemp("fields")
    pack_shards(PackShardsConfig(input=str(write_jsonl(root / "t.jsonl", fixture_records())),
                                 output_dir=str(root / "out"), num_utts_per_shard=10, num_workers=1))
    main_sha = {p.name: _sha(p) for p in (root / "out").glob("shard-??????.tar")}
    add_field(AddFieldConfig(input=str(root / "out" / "data.list"), field="fbank", num_workers=1))
    return root / "out", main_sha


@pytest.fixture
def shards(packed, tmp_path):
    src, main_sha = packed
    out = tmp_path / "out"
    shutil.copytree(src, out)
    urls = [str(out / Path(u).name) for u in read_datalist(src / "data.list")]
    (out / "data.list").write_text("".join(u + "\n" for u in urls))  # the index is relative: copied as is
    return out, main_sha


def _feats_by_key(data_list: Path, conf: DatasetConf) -> dict[str, np.ndarray]:
    tok = build_tokenizer(token_list(data_list.parent / "tok"))
    conf.batch_size, conf.num_workers, conf.filter_conf.token_min_length = 5, 0, 0
    loader = build_dataloader(str(data_list), conf, tok, train=False, rank=0, world_size=1)
    got = {}
    for batch in loader:
        for i, key in enumerate(batch["keys"]):
            got[key] = batch["feats"][i, :int(batch["feats_lengths"][i])].numpy()
    return got


def test_precomputed_fbank_field_equals_the_loaders_on_the_fly_fbank(shards):
    out, _ = shards
    on_the_fly = _feats_by_key(out / "data.list", DatasetConf(feats_type="fbank"))
    stored = _feats_by_key(out / "data.list", DatasetConf(feats_type="precomputed", fields=["fbank", "txt"]))
    assert set(stored) == set(on_the_fly) == {r["key"] for r in fixture_records()}
    for key, feats in on_the_fly.items():
        assert stored[key].shape == feats.shape and stored[key].shape[1] == 80
        np.testing.assert_allclose(stored[key], feats, rtol=1e-5, atol=1e-4)


def test_precomputed_fields_never_read_the_main_tar(shards):
    out, _ = shards
    expected = _feats_by_key(out / "data.list", DatasetConf(feats_type="precomputed", fields=["fbank", "txt"]))
    for tar in out.glob("shard-??????.tar"):  # the audio is gone: keys and txt come from the meta companion
        tar.unlink()
    got = _feats_by_key(out / "data.list", DatasetConf(feats_type="precomputed", fields=["fbank", "txt"]))
    assert set(got) == set(expected)
    assert all(np.array_equal(got[k], expected[k]) for k in got)


def test_without_meta_companion_the_main_tar_is_read_without_its_audio(shards):
    out, _ = shards
    url = read_datalist(out / "data.list")[0]
    for meta in out.glob("*.meta.jsonl.gz"):
        meta.unlink()
    samples = list(open_shard_fields(url, ["fbank", "txt"]))
    full = list(read_shard(url))
    assert [s["key"] for s in samples] == [s["key"] for s in full]
    assert [s["txt"] for s in samples] == [s["txt"] for s in full]
    assert all("audio" not in s and isinstance(s["fbank"], bytes) for s in samples)


def _rewrite_tar(path: Path, edit) -> None:
    with open(path, "rb") as f:
        members = list(iter_tar_members(f, url=str(path)))
    with ShardWriter(path) as w:
        for name, data in edit(members):
            w.add(name, data)


def test_a_shuffled_companion_file_is_caught_naming_shard_file_position_and_keys(shards):
    out, _ = shards
    url = read_datalist(out / "data.list")[0]
    field_file = Path(url[:-4] + ".fbank.tar")
    _rewrite_tar(field_file, lambda m: [m[0], m[2], m[1], *m[3:]])
    keys = [s["key"] for s in read_shard(url)]
    with pytest.raises(DataError) as err:
        list(open_shard_fields(url, ["fbank", "txt"]))
    msg = str(err.value)
    assert url in msg and str(field_file) in msg and "position 1" in msg
    assert f"expected key '{keys[1]}'" in msg and f"found '{keys[2]}'" in msg
    with pytest.raises(DataError, match="out of step"):  # the loader fails with the same message
        _feats_by_key(out / "data.list", DatasetConf(feats_type="precomputed", fields=["fbank", "txt"]))


def test_a_missing_key_in_a_companion_file_is_caught_by_name(shards):
    out, _ = shards
    url = read_datalist(out / "data.list")[1]
    field_file = Path(url[:-4] + ".fbank.tar")
    _rewrite_tar(field_file, lambda m: m[:-1])  # the last utterance has no entry at all
    keys = [s["key"] for s in read_shard(url)]
    with pytest.raises(DataError) as err:
        list(open_shard_fields(url, ["fbank", "txt"]))
    assert str(field_file) in str(err.value) and f"expected key '{keys[-1]}'" in str(err.value)


def test_jsonl_field_with_a_missing_value_is_an_explicit_null(shards, tmp_path):
    out, _ = shards
    recs = fixture_records()
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"key": r["key"], "gender": f"g{i % 2}"}) + "\n"
                              for i, r in enumerate(recs[1:])))
    add_field(AddFieldConfig(input=str(out / "data.list"), field="gender", from_jsonl=str(labels), num_workers=1))
    got = {s["key"]: s["gender"] for u in read_datalist(out / "data.list")
           for s in open_shard_fields(u, ["gender", "txt"])}
    assert got[recs[0]["key"]] is None and got[recs[1]["key"]] == "g0" and len(got) == len(recs)
    first = read_datalist(out / "data.list")[0]
    with gzip.open(first[:-4] + ".gender.jsonl.gz", "rt") as f:
        assert json.loads(f.readline()) == {"key": recs[0]["key"], "gender": None}


def test_index_records_each_field_file_with_its_sha256_and_main_shards_are_untouched(shards):
    out, main_sha = shards
    index = load_index(out / "data.list")
    for url, entry in index.items():
        shard = Path(url)
        assert _sha(shard) == main_sha[shard.name] == entry["sha256"]
        for name in ("fbank", "meta"):
            info = entry["fields"][name]
            assert _sha(shard.with_name(info["file"])) == info["sha256"]
            assert info["num_utts"] == entry["num_utts"] and info["missing"] == 0


def test_webdataset_and_the_wenet_reader_still_read_the_main_shards_unchanged(shards):
    out, _ = shards
    urls = read_datalist(out / "data.list")
    expected = {r["key"]: (Path(r["source"]).read_bytes(), r["target"]) for r in fixture_records()}
    got = {}
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        audio = next(sample[k] for k in ("wav", "flac") if k in sample)
        got[json.loads(sample["json"])["key"]] = (audio, sample["txt"].decode())
        assert "fbank" not in sample
    assert got == expected
    wenet = {s["key"]: (s["audio"], s["txt"]) for u in urls for s in read_shard(u)}
    assert wenet == expected


def test_from_scp_imports_kaldi_features_with_missing_placeholders(shards, tmp_path):
    import kaldiio

    out, _ = shards
    recs = fixture_records()
    mats = {r["key"]: np.random.default_rng(i).standard_normal((7 + i, 5)).astype(np.float32)
            for i, r in enumerate(recs) if i != 3}
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'feats.ark'},{tmp_path / 'feats.scp'}") as w:
        for key, mat in mats.items():
            w(key, mat)
    add_field(AddFieldConfig(input=str(out / "data.list"), field="kfeats", from_scp=str(tmp_path / "feats.scp"),
                             num_workers=1))
    got = {s["key"]: s["kfeats"] for u in read_datalist(out / "data.list")
           for s in open_shard_fields(u, ["kfeats", "txt"])}
    assert got[recs[3]["key"]] is None
    for key, mat in mats.items():
        np.testing.assert_array_equal(np.load(__import__("io").BytesIO(got[key])), mat)
    assert sum(e["fields"]["kfeats"]["missing"] for e in load_index(out / "data.list").values()) == 1


def test_rerun_resumes_and_a_damaged_file_is_rewritten(shards):
    out, _ = shards
    field_file = out / "shard-000001.fbank.tar"
    before = field_file.read_bytes()
    field_file.write_bytes(before[:1000])  # a torn write
    summary = add_field(AddFieldConfig(input=str(out / "data.list"), field="fbank", num_workers=1))
    assert summary.extra["resumed"] == 2
    assert field_file.read_bytes() == before


def test_rerun_removes_temp_files_a_killed_run_left_but_not_pack_shards_ones(shards):
    out, _ = shards
    ours = [out / ".shard-000001.fbank.tar.tmp-4242", out / "..shard-000001.fbank.tar.json.tmp-4242",
            out / ".shard-000000.meta.jsonl.gz.tmp-77"]
    packs = out / ".shard-000001.tar.tmp-4242"
    for path in [*ours, packs]:
        path.write_bytes(b"partial")
    add_field(AddFieldConfig(input=str(out / "data.list"), field="fbank", num_workers=1))
    assert not any(p.exists() for p in ours)
    assert packs.exists()


class _Logged(http.server.SimpleHTTPRequestHandler):
    requested: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        _Logged.requested.append(self.path)
        super().do_GET()

    def do_HEAD(self) -> None:  # noqa: N802
        _Logged.requested.append(self.path)
        super().do_HEAD()


def test_fields_over_http_never_fetch_the_main_tar(shards):
    out, _ = shards
    handler = lambda *a, **k: _Logged(*a, directory=str(out), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        local = read_datalist(out / "data.list")
        http_list = out / "http.list"
        http_list.write_text("".join(f"{base}/{Path(u).name}\n" for u in local))
        _Logged.requested.clear()
        got = _feats_by_key(http_list, DatasetConf(feats_type="precomputed", fields=["fbank", "txt"]))
        assert len(got) == 24
        assert not [p for p in _Logged.requested if p.endswith(("0.tar", "1.tar", "2.tar"))], _Logged.requested
        assert any(p.endswith(".fbank.tar") for p in _Logged.requested)
    finally:
        server.shutdown()
        server.server_close()


def test_a_pack_shards_rerun_keeps_the_fields_of_unchanged_shards(tmp_path):
    jsonl = write_jsonl(tmp_path / "t.jsonl", fixture_records())
    conf = PackShardsConfig(input=str(jsonl), output_dir=str(tmp_path / "out"), num_utts_per_shard=10,
                            num_workers=1)
    pack_shards(conf)
    labels = tmp_path / "spk.jsonl"
    labels.write_text("".join(json.dumps({"key": r["key"], "speaker": "s"}) + "\n" for r in fixture_records()))
    add_field(AddFieldConfig(input=str(tmp_path / "out" / "data.list"), field="speaker", from_jsonl=str(labels),
                             num_workers=1))
    before = load_index(tmp_path / "out" / "data.list")
    assert all("speaker" in e["fields"] for e in before.values())
    pack_shards(conf)  # resumes: same bytes, so the companion files still match
    assert load_index(tmp_path / "out" / "data.list") == before


def test_fields_of_gzip_shards_sit_beside_them_under_the_shard_stem(tmp_path):
    jsonl = write_jsonl(tmp_path / "t.jsonl", fixture_records())
    pack_shards(PackShardsConfig(input=str(jsonl), output_dir=str(tmp_path / "out"), num_utts_per_shard=10,
                                 num_workers=1, compression="gzip"))
    labels = tmp_path / "spk.jsonl"
    labels.write_text("".join(json.dumps({"key": r["key"], "speaker": r["speaker"]}) + "\n"
                              for r in fixture_records()))
    add_field(AddFieldConfig(input=str(tmp_path / "out" / "data.list"), field="speaker", from_jsonl=str(labels),
                             num_workers=1))
    assert (tmp_path / "out" / "shard-000000.speaker.jsonl.gz").is_file()
    got = {s["key"]: s["speaker"] for u in read_datalist(tmp_path / "out" / "data.list")
           for s in open_shard_fields(u, ["speaker", "txt"])}
    assert got == {r["key"]: r["speaker"] for r in fixture_records()}


def test_from_scp_with_a_damaged_ark_names_the_scp_path_and_key(shards, tmp_path):
    import kaldiio

    out, _ = shards
    first = fixture_records()[0]["key"]
    scp = tmp_path / "feats.scp"
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'feats.ark'},{scp}") as w:
        w(first, np.zeros((7, 5), dtype=np.float32))
    (tmp_path / "feats.ark").write_bytes(b"garbage")  # the offset now points past the end
    result = run_cli("corpus-io", "add-field", f"++input={out / 'data.list'}", "++field=kf", f"++from_scp={scp}",
                     "++num_workers=1")
    assert_user_error(result, f"{scp}: cannot read the features of '{first}'")
    assert "[" not in result.stderr.split("cannot read")[0]  # the path, not the internal [path, size, mtime]
