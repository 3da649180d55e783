"""The streaming reader: non-seekable streams, grouping, caps, truncation and corruption."""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading

import pytest

from corpus_io.errors import DataError
from corpus_io.shards.index import index_path_for, load_index, read_datalist
from corpus_io.shards.reader import group_samples, iter_tar_members, read_shard
from corpus_io.shards.writer import ShardWriter


def _shard(path, members):
    with ShardWriter(path) as w:
        for name, data in members:
            w.add(name, data)
    return path


def _three(path):
    return _shard(path, [
        ("k1.txt", "一 two".encode()), ("k1.wav", b"RIFF-one"), ("k1.json", json.dumps({"key": "k.1"}).encode()),
        ("k2.txt", b"three"), ("k2.flac", b"fLaC-two"), ("k2.json", b"{}"), ("k2.npy", b"NPY"), ("k2.spk", b"s1"),
    ])


def test_group_samples_builds_the_pipeline_dict(tmp_path):
    samples = list(read_shard(str(_three(tmp_path / "s.tar"))))
    assert [s["key"] for s in samples] == ["k.1", "k2"]  # key from the .json when present
    first, second = samples
    assert list(first) == ["key", "audio", "audio_format", "txt", "meta", "__url__", "__pos__"]
    assert (first["audio"], first["audio_format"], first["txt"], first["__pos__"]) == (b"RIFF-one", "wav", "一 two", 0)
    assert second["audio_format"] == "flac" and second["npy"] == b"NPY" and second["spk"] == b"s1"
    assert second["meta"] == {} and second["__pos__"] == 1 and second["__url__"] == str(tmp_path / "s.tar")


def test_reader_streams_from_a_pipe_without_seeking(tmp_path):
    data = _three(tmp_path / "s.tar").read_bytes()
    r, w = os.pipe()

    def feed():
        # the reader stops at the end-of-archive marker and closes its end before the zero padding
        with contextlib.suppress(BrokenPipeError), os.fdopen(w, "wb") as f:
            for i in range(0, len(data), 700):  # short writes: the reader must loop on short reads
                f.write(data[i:i + 700])
                f.flush()

    t = threading.Thread(target=feed)
    t.start()
    with os.fdopen(r, "rb", buffering=0) as f:
        assert not f.seekable()
        keys = [s["key"] for s in group_samples(iter_tar_members(f, url="pipe", max_member_bytes=1 << 20), url="pipe")]
    t.join()
    assert keys == ["k.1", "k2"]


def test_read_shard_through_a_pipe_url(tmp_path):
    path = _three(tmp_path / "s.tar")
    samples = list(read_shard(f"pipe:cat {path}", allow_pipe=True))
    assert len(samples) == 2
    with pytest.raises(DataError, match="allow_pipe"):
        list(read_shard(f"pipe:cat {path}"))


def test_member_over_the_cap_is_rejected_naming_url_and_member(tmp_path):
    path = _shard(tmp_path / "s.tar", [("big.txt", b"x"), ("big.wav", b"\0" * 5000)])
    with pytest.raises(DataError, match=r"s\.tar.*big\.wav.*5000 bytes"):
        list(read_shard(str(path), max_member_bytes=4096))


def test_truncated_shard_names_shard_and_last_good_member(tmp_path):
    data = _three(tmp_path / "s.tar").read_bytes()
    cut = data.index(b"fLaC-two") + 3
    with pytest.raises(DataError) as err:
        list(iter_tar_members(io.BytesIO(data[:cut]), url="cut.tar", max_member_bytes=1 << 20))
    assert "cut.tar" in str(err.value) and "k2.flac" in str(err.value) and "k2.txt" in str(err.value)
    with pytest.raises(DataError, match="truncated.*k2.json"):  # cut at a header boundary: no end marker
        list(iter_tar_members(io.BytesIO(data[:data.index(b"NPY") - 512]), url="c.tar", max_member_bytes=1 << 20))


class _CountingFile(io.BufferedReader):
    """A local file that counts the bytes handed out by read()."""

    bytes_read = 0

    def read(self, n=-1):
        data = super().read(n)
        self.bytes_read += len(data)
        return data


def _skip_audio(name):
    return name.endswith((".wav", ".flac", ".npy"))


def test_skip_payload_yields_empty_payloads_and_a_local_file_never_reads_them(tmp_path):
    path = _shard(tmp_path / "s.tar", [("a.txt", b"one"), ("a.wav", b"\1" * 300_000),
                                       ("b.txt", b"two"), ("b.wav", b"\2" * 300_000)])
    with _CountingFile(open(path, "rb", buffering=0), buffer_size=4096) as f:
        members = list(iter_tar_members(f, url=str(path), skip_payload=_skip_audio))
        assert f.bytes_read < 10_000  # headers and transcripts only: the 600 kB of audio was seeked past
    assert members == [("a.txt", b"one"), ("a.wav", b""), ("b.txt", b"two"), ("b.wav", b"")]
    r, w = os.pipe()  # a forward-only stream reads past them instead, with the same result
    def feed():
        with contextlib.suppress(BrokenPipeError), os.fdopen(w, "wb") as f:
            f.write(path.read_bytes())

    feeder = threading.Thread(target=feed)
    feeder.start()
    with os.fdopen(r, "rb") as f:
        assert list(iter_tar_members(f, url="pipe", skip_payload=_skip_audio)) == members
    feeder.join()


def test_a_shard_cut_inside_a_skipped_member_is_still_reported_as_truncated(tmp_path):
    data = _three(tmp_path / "s.tar").read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:data.index(b"fLaC-two") + 3])
    with open(cut, "rb") as f, pytest.raises(DataError, match="truncated shard: member 'k2.flac'.*'k2.txt'"):
        list(iter_tar_members(f, url=str(cut), skip_payload=_skip_audio))
    with open(cut, "rb") as f, pytest.raises(DataError, match="truncated shard: member 'k2.flac'.*'k2.txt'"):
        list(iter_tar_members(io.BufferedReader(io.BytesIO(f.read())), url="stream", skip_payload=_skip_audio))


def test_corrupt_header_is_reported_with_last_good_member(tmp_path):
    data = bytearray(_three(tmp_path / "s.tar").read_bytes())
    data[512 * 2 + 10] ^= 0xFF  # inside the k1.wav header name
    with pytest.raises(DataError, match="corrupt tar header after member 'k1.txt'"):
        list(iter_tar_members(io.BytesIO(bytes(data)), url="bad.tar", max_member_bytes=1 << 20))


def test_dotdot_and_absolute_names_are_just_names(tmp_path):
    import tarfile

    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in [("../../etc/k.txt", b"hi"), ("/abs/k.wav", b"RIFF")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    before = set(os.listdir(tmp_path))
    samples = list(read_shard(str(path)))
    assert [(s["key"], s["txt"]) for s in samples] == [("k", "hi")]
    assert set(os.listdir(tmp_path)) == before


def test_non_utf8_txt_names_the_member(tmp_path):
    path = _shard(tmp_path / "s.tar", [("k.txt", "中".encode("gbk")), ("k.wav", b"RIFF")])
    with pytest.raises(DataError, match=r"'k\.txt' is not UTF-8"):
        list(read_shard(str(path)))


def test_audio_without_txt_is_an_error(tmp_path):
    path = _shard(tmp_path / "s.tar", [("k.wav", b"RIFF"), ("k.json", b"{}")])
    with pytest.raises(DataError, match="no .txt member"):
        list(read_shard(str(path)))


def test_tarfile_gnu_and_pax_archives_are_read(tmp_path):
    import tarfile

    for format_ in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = tmp_path / f"f{format_}.tar"
        long_key = "k" * 120
        with tarfile.open(path, "w", format=format_) as tf:
            d = tarfile.TarInfo("somedir")
            d.type = tarfile.DIRTYPE
            tf.addfile(d)
            for name, data in [(f"{long_key}.txt", b"t"), (f"{long_key}.wav", b"w")]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        assert [s["key"] for s in read_shard(str(path))] == [long_key]


def test_index_helpers(tmp_path):
    assert index_path_for(tmp_path / "data.list") == tmp_path / "index.jsonl"
    assert index_path_for(tmp_path / "train.list") == tmp_path / "train.index.jsonl"
    (tmp_path / "data.list").write_text("a.tar\n\n b.tar \n")
    assert read_datalist(tmp_path / "data.list") == ["a.tar", "b.tar"]
    assert load_index(tmp_path / "data.list") is None
    (tmp_path / "index.jsonl").write_text('{"path": "a.tar", "num_utts": 3}\n')
    assert load_index(tmp_path / "data.list") == {"a.tar": {"path": "a.tar", "num_utts": 3}}


def test_a_data_list_that_is_a_directory_or_a_raw_list_says_what_to_pass(tmp_path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "data.list").write_text("a.tar\n")
    with pytest.raises(DataError, match=r"is a directory.*Did you mean .*shards/data\.list"):
        read_datalist(tmp_path / "shards")
    (tmp_path / "raw.list").write_text('{"key": "k", "wav": "k.wav", "txt": "hi"}\n')
    with pytest.raises(DataError, match=r"raw\.list holds JSON lines.*data_type=raw"):
        read_datalist(tmp_path / "raw.list")


def test_read_shard_over_http(tmp_path):
    import http.server

    path = _three(tmp_path / "s.tar")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{path.name}"
        assert [s["key"] for s in read_shard(url)] == ["k.1", "k2"]
    finally:
        server.shutdown()
        server.server_close()
