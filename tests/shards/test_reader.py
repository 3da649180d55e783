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


def _tarfile_members(path):
    import tarfile

    with tarfile.open(path) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isfile()]


@pytest.mark.parametrize("read_ahead", [512, 700, 1536, 1 << 20])
def test_members_cut_from_large_reads_equal_tarfiles_at_every_buffer_boundary(tmp_path, monkeypatch, read_ahead):
    """Members and headers straddling the read buffer's end (every size from 0 to past a block, a long pax name)
    read as tarfile reads them, as bytes and as views, from a file and from a pipe that returns short reads."""
    import tarfile

    from corpus_io.shards import reader

    monkeypatch.setattr(reader, "READ_AHEAD", read_ahead)
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for i, size in enumerate([0, 1, 511, 512, 513, 700, 1023, 1024, 1500, 3000, 0, 77]):
            name = f"{'k' * (130 if i == 5 else 3)}{i:02d}.wav"
            info = tarfile.TarInfo(name)
            info.size = size
            tf.addfile(info, io.BytesIO(bytes((i + j) % 251 for j in range(size))))
    expected = _tarfile_members(path)
    for views in (False, True):
        with open(path, "rb") as f:
            got = [(name, bytes(data)) for name, data in iter_tar_members(f, url="s.tar", views=views)]
        assert got == expected
    r, w = os.pipe()

    def feed():
        with contextlib.suppress(BrokenPipeError), os.fdopen(w, "wb") as f:
            data = path.read_bytes()
            for i in range(0, len(data), 333):
                f.write(data[i:i + 333])
                f.flush()

    feeder = threading.Thread(target=feed)
    feeder.start()
    with os.fdopen(r, "rb", buffering=0) as f:
        assert [(n, bytes(d)) for n, d in iter_tar_members(f, url="pipe", views=True)] == expected
    feeder.join()


def test_views_are_read_only_and_read_shard_gives_the_same_samples_with_them(tmp_path):
    path = _three(tmp_path / "s.tar")
    copies, views = list(read_shard(str(path))), list(read_shard(str(path), views=True))
    assert isinstance(views[0]["audio"], memoryview) and views[0]["audio"].readonly
    assert isinstance(copies[0]["audio"], bytes)
    for a, b in zip(copies, views):
        assert a.keys() == b.keys()
        assert all(a[k] == b[k] for k in a)  # memoryview == bytes compares contents


def test_the_fast_header_checksum_agrees_with_the_byte_sum_on_every_corruption(tmp_path):
    """An ASCII header's checksum is read from Adler-32; a header with a UTF-8 name is summed. Both must accept
    exactly the headers whose byte sum (checksum field as spaces) is the stored checksum."""
    import random

    from corpus_io.shards.reader import _checksum_ok

    def summed(block):  # unsigned, or signed as some old tars wrote it
        try:
            stored = int(block[148:156].split(b"\0", 1)[0].strip(b" \0"), 8)
        except ValueError:
            return False
        unsigned = sum(block) - sum(block[148:156]) + 8 * 32
        rest = block[:148] + block[156:]
        return stored in (unsigned, unsigned - 256 * sum(1 for b in rest if b >= 128))

    data = _shard(tmp_path / "s.tar", [("k1.txt", b"t"), ("漢字.txt", b"t")]).read_bytes()
    headers = [data[:512], data[1024:1536]]
    assert headers[0].isascii() and not headers[1].isascii()  # one ASCII header, one with a UTF-8 name
    rng = random.Random(0)
    for header in headers:
        assert _checksum_ok(header) and summed(header)
        for _ in range(2000):
            bad = bytearray(header)
            for _ in range(rng.randint(1, 3)):
                bad[rng.randrange(512)] = rng.randrange(256)
            assert _checksum_ok(bytes(bad)) == summed(bytes(bad))


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
