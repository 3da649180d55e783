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
