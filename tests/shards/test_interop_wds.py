"""Interop with the real webdataset package, both directions."""

from __future__ import annotations

import json

import webdataset as wds

from corpus_io.shards.index import read_datalist
from corpus_io.shards.pack import pack_shards
from corpus_io.shards.reader import read_shard
from tests.shards.conftest import fixture_records, write_jsonl
from tests.shards.test_pack import _cfg


def test_webdataset_reads_our_shards_exactly(tmp_path):
    recs = fixture_records()
    recs[0]["key"] = "key.with.dots/and-slash"
    pack_shards(_cfg(write_jsonl(tmp_path / "t.jsonl", recs), tmp_path / "out"))
    urls = read_datalist(tmp_path / "out" / "data.list")
    got = {}
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        meta = json.loads(sample["json"])
        audio_ext = next(k for k in sample if k in ("wav", "flac"))
        got[meta["key"]] = (sample[audio_ext], sample["txt"].decode("utf-8"))
    expected = {r["key"]: (open(r["source"], "rb").read(), r["target"]) for r in recs}
    assert got == expected


def test_our_reader_reads_wenet_layout_written_by_wds_tarwriter(tmp_path):
    recs = fixture_records()[:6]
    path = tmp_path / "wenet-000000.tar"
    with wds.TarWriter(str(path)) as sink:
        for r in recs:
            ext = r["source"].rsplit(".", 1)[1]
            sink.write({"__key__": r["key"], "txt": r["target"], ext: open(r["source"], "rb").read()})
    samples = list(read_shard(str(path)))
    assert [(s["key"], s["txt"], s["audio"]) for s in samples] == \
           [(r["key"], r["target"], open(r["source"], "rb").read()) for r in recs]
    assert all(s["meta"] == {} for s in samples)
    assert [s["__pos__"] for s in samples] == list(range(6))


UNICODE_KEYS = ["中文004", "日本語_テスト-1", "café-ü", "한국어7"]


def test_unicode_keys_appear_unchanged_so_wenet_and_webdataset_group_by_the_original_key(tmp_path):
    import tarfile

    recs = fixture_records()[:6]
    for rec, key in zip(recs, UNICODE_KEYS + ["dotted.key/x", "with%25percent\\back"]):  # a space: refused (one token)
        rec["key"] = key
    pack_shards(_cfg(write_jsonl(tmp_path / "t.jsonl", recs), tmp_path / "out"))
    (url,) = read_datalist(tmp_path / "out" / "data.list")
    with tarfile.open(url) as tar:  # WeNet's reader: tarfile, key = the name before the last dot
        wenet_keys = list(dict.fromkeys(m.name[:m.name.rfind(".")] for m in tar.getmembers()))
    assert wenet_keys[:4] == UNICODE_KEYS
    assert all("." not in k and "/" not in k and "\\" not in k for k in wenet_keys)
    wds_keys = [s["__key__"] for s in wds.WebDataset([url], shardshuffle=False, empty_check=False)]
    assert wds_keys == wenet_keys
    assert [s["key"] for s in read_shard(url)] == [r["key"] for r in recs]


def test_shards_with_the_old_percent_escaped_names_still_read_by_the_original_key(tmp_path):
    from corpus_io.config import VerifyShardsConfig
    from corpus_io.shards.format import legacy_member_name
    from corpus_io.shards.verify import verify_shards
    from corpus_io.shards.writer import ShardWriter

    recs = fixture_records()[:4]
    path = tmp_path / "old-000000.tar"
    with ShardWriter(path) as w:  # as pack-shards wrote them before: %E4%B8%AD%E6%96%87004.txt, ...
        for rec, key in zip(recs, UNICODE_KEYS):
            stem = legacy_member_name(key)
            assert "%" in stem
            w.add(f"{stem}.txt", rec["target"].encode("utf-8"))
            w.add(f"{stem}.{rec['source'].rsplit('.', 1)[1]}", open(rec["source"], "rb").read())
            if key != UNICODE_KEYS[0]:  # one sample without .json: its key comes from the member name
                w.add(f"{stem}.json", json.dumps({"key": key}, ensure_ascii=False).encode("utf-8"))
    assert [s["key"] for s in read_shard(str(path))] == UNICODE_KEYS
    (tmp_path / "data.list").write_text(f"{path}\n")
    results = verify_shards(VerifyShardsConfig(input=str(tmp_path / "data.list"), num_workers=1))
    assert sum(r.num_utts for r in results) == 4 and not any(r.problems for r in results)
