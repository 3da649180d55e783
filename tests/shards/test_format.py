"""Member names, the grouping rule and the deterministic writer."""

from __future__ import annotations

import hashlib
import io
import tarfile

import numpy as np
import pytest

from corpus_io.errors import DataError
from corpus_io.shards.format import key_from_member_name, safe_member_name, split_member
from corpus_io.shards.writer import ShardWriter


@pytest.mark.parametrize("key", ["spk1-utt_01", "a.b.c", "dir/sub/utt", "../x", "中文 key", "a%2Eb", "A.WAV"])
def test_safe_member_name_is_reversible_and_has_no_dot_or_slash(key):
    stem = safe_member_name(key)
    assert "." not in stem and "/" not in stem and " " not in stem
    assert key_from_member_name(stem) == key


def test_distinct_keys_never_share_a_member_name():
    keys = ["a.b", "a/b", "a%2Eb", "a_b", "a-b", "a%2Fb", "a b"]
    assert len({safe_member_name(k) for k in keys}) == len(keys)


def test_empty_key_is_an_error():
    with pytest.raises(DataError, match="empty key"):
        safe_member_name("")


@pytest.mark.parametrize("name,expected", [
    ("utt1.txt", ("utt1", "txt")),
    ("utt1.wav", ("utt1", "wav")),
    ("a.b.c.flac", ("a.b.c", "flac")),  # WeNet keys with dots: last dot when the ext is known
    ("dir/k.json", ("k", "json")),
    ("k.seg.cls", ("k", "seg.cls")),  # unknown ext: WebDataset's first dot
    ("k.WAV", ("k", "wav")),
    ("noext", ("noext", "")),
])
def test_split_member_rule(name, expected):
    assert split_member(name) == expected


def test_writer_output_is_deterministic_and_readable_by_tarfile(tmp_path):
    for name in ("a.tar", "b.tar"):
        with ShardWriter(tmp_path / name) as w:
            w.add("k1.txt", "héllo".encode())
            w.add("k1.wav", b"\x00" * 1000)
            w.add("x" * 150 + ".json", b"{}")  # long name: pax header
    a, b = (tmp_path / "a.tar").read_bytes(), (tmp_path / "b.tar").read_bytes()
    assert a == b and len(a) % 10240 == 0
    with tarfile.open(fileobj=io.BytesIO(a)) as tf:
        infos = tf.getmembers()
        assert [i.name for i in infos] == ["k1.txt", "k1.wav", "x" * 150 + ".json"]
        assert {(i.mtime, i.uid, i.gid, i.mode, i.uname) for i in infos} == {(1704067200, 0, 0, 0o644, "")}
        assert tf.extractfile("k1.txt").read().decode() == "héllo"
    assert not list(tmp_path.glob(".*tmp*"))


def test_writer_removes_temp_file_on_error(tmp_path):
    with pytest.raises(RuntimeError), ShardWriter(tmp_path / "s.tar") as w:
        w.add("k.txt", b"x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_writer_bytes_and_sha256_do_not_depend_on_how_writes_are_batched(tmp_path, monkeypatch):
    # more pieces than one writev takes and more bytes than one batch, plus a buffer the caller reuses
    rng = np.random.default_rng(0)
    members = [(f"k{i}.{'wav' if i % 3 else 'txt'}", rng.bytes(int(rng.integers(0, 40000)) if i % 3 else i))
               for i in range(1200)]
    reused = bytearray(b"first")

    def write(name: str) -> bytes:
        with ShardWriter(tmp_path / name) as w:
            for member, data in members:
                w.add(member, data)
            w.add("reused.txt", reused)
            reused[:] = b"later"  # after add: the shard keeps what was added
        data = (tmp_path / name).read_bytes()
        assert (w.bytes, w.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        reused[:] = b"first"
        return data

    batched = write("batched.tar")
    monkeypatch.setattr(ShardWriter, "WRITE_BATCH", 1)  # every member written at once
    assert write("each.tar") == batched
    with tarfile.open(fileobj=io.BytesIO(batched)) as tf:
        assert [(i.name, tf.extractfile(i).read()) for i in tf.getmembers()] == members + [("reused.txt", b"first")]
