"""WeNet-style ``.tar.gz`` shards (made by GNU ``tar czf``) go through the same streaming loader, verify-shards
and stats as corpus-io tars: same partition, resume, retries and skip-and-count."""

from __future__ import annotations

import functools
import gzip
import shutil
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from corpus_io.errors import DataError
from corpus_io.loader.dataset import build_dataloader
from corpus_io.shards.reader import read_shard
from corpus_io.tokenizer import build_tokenizer
from tests.conftest import run_bounded, run_cli
from tests.loader_data import epoch_keys, fixture_utts, interrupted_epoch, small_conf, token_list
from tests.storage.test_remote import FlakyHandler


def make_wenet_targz(out: Path, *, copies: int = 2, per_shard: int = 4, suffix: str = ".tar.gz") -> tuple[Path, list]:
    """WeNet's layout: ``<key>.txt`` then ``<key>.<wav|flac>`` per utterance, no .json, packed by ``tar czf``."""
    out.mkdir(parents=True, exist_ok=True)
    utts = fixture_utts(copies)
    shards = []
    for s in range(0, len(utts), per_shard):
        stage = out / f"stage{s}"
        stage.mkdir()
        names = []
        for key, audio, text in utts[s:s + per_shard]:
            (stage / f"{key}.txt").write_text(text, encoding="utf-8")
            shutil.copy(audio, stage / f"{key}{Path(audio).suffix}")
            names += [f"{key}.txt", f"{key}{Path(audio).suffix}"]
        shard = out / f"wenet-{s // per_shard:06d}{suffix}"
        result = run_bounded(["tar", "czf", str(shard), "-C", str(stage), *names], timeout=120)
        assert result.returncode == 0, result.stderr
        shutil.rmtree(stage)
        shards.append(str(shard))
    (out / "data.list").write_text("".join(s + "\n" for s in shards))
    return out / "data.list", [k for k, _, _ in utts]


@pytest.fixture(scope="module")
def targz(tmp_path_factory):
    out = tmp_path_factory.mktemp("targz")
    data_list, keys = make_wenet_targz(out)  # 48 utterances in 12 .tar.gz shards
    return data_list, keys, build_tokenizer(token_list(out))


def test_gzip_magic_not_the_name_decides_and_the_samples_equal_wenets_members(targz, tmp_path):
    data_list, keys, _ = targz
    first = data_list.read_text().split()[0]
    renamed = tmp_path / "renamed.tar"  # a .tgz under any name is still recognised by its bytes
    renamed.write_bytes(Path(first).read_bytes())
    samples = list(read_shard(str(renamed)))
    assert [s["key"] for s in samples] == keys[:4]
    assert all(s["audio"][:4] in (b"RIFF", b"fLaC") and s["txt"] for s in samples)
    assert samples[0]["meta"] == {}  # WeNet shards carry no .json


def test_wenet_targz_shards_give_every_key_exactly_once_across_ranks_and_workers(targz):
    data_list, keys, tok = targz
    for epoch in (0, 1):
        got = []
        for rank in range(2):
            loader = build_dataloader(str(data_list), small_conf(num_workers=2), tok, train=True, rank=rank,
                                      world_size=2)
            got += epoch_keys(loader, epoch)
        assert sorted(got) == sorted(keys)


def test_targz_resume_is_exact(targz):
    data_list, keys, tok = targz
    first, rest, _ = interrupted_epoch(
        lambda: build_dataloader(str(data_list), small_conf(), tok, train=True, rank=0, world_size=1),
        epoch=1, batches=5)
    assert sorted(first + rest) == sorted(keys) and len(first) + len(rest) == len(keys)


def test_truncated_targz_is_skipped_and_counted_or_named(tmp_path):
    data_list, keys = make_wenet_targz(tmp_path, copies=1, per_shard=6, suffix=".tgz")
    tok = build_tokenizer(token_list(tmp_path))
    bad = Path(data_list.read_text().split()[1])
    bad.write_bytes(bad.read_bytes()[:20000])
    loader = build_dataloader(str(data_list), small_conf(on_error="skip"), tok, train=True, rank=0, world_size=1)
    got = epoch_keys(loader, 0)
    assert loader.counts()["unreadable shards"] == 1
    assert 18 <= len(got) < len(keys) and len(set(got)) == len(got)
    failing = build_dataloader(str(data_list), small_conf(on_error="fail"), tok, train=True, rank=0, world_size=1)
    with pytest.raises(DataError, match=f"{bad.name}.*truncated gzip shard"):
        epoch_keys(failing, 0)


@pytest.mark.network
def test_targz_over_http_is_retried_after_transient_errors(tmp_path):
    data_list, keys = make_wenet_targz(tmp_path, copies=1, per_shard=12)
    tok = build_tokenizer(token_list(tmp_path))
    shards = [Path(p).name for p in data_list.read_text().split()]
    (tmp_path / f"flaky-{shards[0]}").write_bytes((tmp_path / shards[0]).read_bytes())
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(FlakyHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        remote = tmp_path / "http.list"
        remote.write_text(f"{base}/flaky-{shards[0]}\n{base}/{shards[1]}\n")
        loader = build_dataloader(str(remote), small_conf(retries=4, retry_backoff=0.05, num_workers=0), tok,
                                  train=True, rank=0, world_size=1)
        got = epoch_keys(loader, 0)
    finally:
        server.shutdown()
        server.server_close()
    assert sorted(got) == sorted(keys)
    assert loader.counts()["shard retries"] >= 1


def test_verify_shards_and_stats_read_targz_shards(targz):
    data_list, keys, _ = targz
    result = run_cli("corpus-io", "verify-shards", f"++input={data_list}", "++num_workers=2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 ok, 0 failed" in result.stdout
    result = run_cli("corpus-io", "stats", f"++input={data_list}", f"++output={data_list.parent / 'stats.png'}")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("utterances"))
    assert int(row.split()[-1]) == len(keys)


def test_a_file_that_is_neither_tar_nor_gzip_tar_says_which(tmp_path):
    text = tmp_path / "notes.tar"
    text.write_text("these are notes, not a shard\n" * 40)
    with pytest.raises(DataError, match="neither a tar nor a gzip-compressed tar"):
        list(read_shard(str(text)))
    gz = tmp_path / "notes.tar.gz"
    gz.write_bytes(gzip.compress(text.read_bytes()))
    with pytest.raises(DataError, match="is gzip-compressed, but what is inside is not a tar"):
        list(read_shard(str(gz)))


def test_make_datalist_picks_up_targz_shards_in_a_directory(targz, tmp_path):
    data_list, _, _ = targz
    shards = tmp_path / "shards"  # a directory of shards without a data.list: make-datalist scans it
    shards.mkdir()
    for i, src in enumerate(data_list.read_text().split()[:3]):
        shutil.copy(src, shards / f"part-{i}{'.tgz' if i == 2 else '.tar.gz'}")
    result = run_cli("corpus-io", "make-datalist", f"++input={shards}", f"++output={tmp_path / 'data.list'}")
    assert result.returncode == 0, result.stderr
    assert [Path(p).name for p in (tmp_path / "data.list").read_text().split()] == \
        ["part-0.tar.gz", "part-1.tar.gz", "part-2.tgz"]
