"""Shards streamed from real servers on 127.0.0.1: Python's http.server and SeaweedFS's S3 gateway."""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from corpus_io.errors import DataError
from corpus_io.loader.dataset import build_dataloader
from corpus_io.tokenizer import build_tokenizer
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
    got, counts = load_keys(data_list, tok, retries=4, retry_backoff=0.05, num_workers=0, on_error="skip")
    assert sorted(got) == sorted(keys) and counts["duplicate key"] == 4  # the copy's keys: read once
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


# --------------------------------------------------------------------------- plain http, stalls, 5xx


@pytest.fixture
def plain_http_server(tmp_path):
    """``python -m http.server`` (no Range support) over ``tmp_path/www``; yields (base URL, log path)."""
    from tests.conftest import free_port, wait_for_port

    www = tmp_path / "www"
    www.mkdir()
    port = free_port()
    log_path = tmp_path / "http.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(www)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_port(port, proc, log_path, "http.server")
    yield f"http://127.0.0.1:{port}", www, log_path
    proc.kill()
    proc.wait()
    log.close()


def test_http_server_without_range_support_serves_each_shard_with_one_get(tmp_path, plain_http_server):
    base, www, log_path = plain_http_server
    data_list, keys = make_shards(www, copies=2, per_shard=24)  # 2 shards of ~2 MB: more than one 1 MiB block
    shards = sorted(p.name for p in www.glob("shard-*.tar"))
    assert all((www / s).stat().st_size > 1 << 20 for s in shards)
    tok = build_tokenizer(token_list(tmp_path / "lang"))
    got, counts = load_keys(remote_list(www, base, "lists"), tok, num_workers=2)
    assert sorted(got) == sorted(keys) and not counts.get("unreadable shards")
    requests = [line for line in log_path.read_text().splitlines() if ".tar HTTP" in line]
    for s in shards:  # read exactly once: one GET per shard, no HEAD, no ranged re-reads
        assert sum(f"GET /{s} " in line for line in requests) == 1, requests
    assert not any("HEAD" in line for line in requests), requests


class _StallServer:
    """A TCP server on 127.0.0.1 that accepts and then stalls: before answering (``body=False``) or after
    the headers and a few bytes of the body (``body=True``)."""

    def __init__(self, body: bool):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.body = body
        self.conns: list[socket.socket] = []
        self.accepts = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepts += 1
            self.conns.append(conn)
            if self.body:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"\0" * 100)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("body", [False, True], ids=["stalled-server", "stalled-body"])
def test_stalled_http_read_fails_within_read_timeout_naming_url_bound_and_key(tmp_path, shard_dir, body):
    out, _, tok = shard_dir
    server = _StallServer(body)
    url = f"{server.base}/shard-000000.tar"
    try:
        data_list = tmp_path / "stall.list"
        data_list.write_text(url + "\n")
        start = time.monotonic()
        with pytest.raises(DataError) as info:
            load_keys(data_list, tok, num_workers=0, read_timeout=1.0, retries=2, retry_backoff=0.01)
        elapsed = time.monotonic() - start
    finally:
        server.close()
    message = str(info.value)
    assert url in message and "dataset_conf.read_timeout=1 s" in message, message
    assert "does not exist" not in message and "after 2 attempts" in message, message
    assert server.accepts == 2  # every attempt went through the retries
    assert elapsed < 120  # two 1-second stalls, not the 5 minutes per attempt of the old default


def test_http_5xx_is_retried_and_never_called_missing(tmp_path, shard_dir, http_base):
    out, keys, tok = shard_dir
    FlakyHandler.failures["flaky-000099.tar"] = -10**6  # answers 503 to every request
    (out / "flaky-000099.tar").write_bytes((out / "shard-000000.tar").read_bytes())
    data_list = tmp_path / "5xx.list"
    data_list.write_text(f"{http_base}/flaky-000099.tar\n")
    with pytest.raises(DataError) as info:
        load_keys(data_list, tok, num_workers=0, retries=3, retry_backoff=0.01)
    assert "HTTP 503" in str(info.value) and "does not exist" not in str(info.value), str(info.value)
    got, counts = load_keys(data_list, tok, num_workers=0, retries=3, retry_backoff=0.01, on_error="skip")
    assert got == [] and counts["shard retries"] == 2 and counts["unreadable shards"] == 1


def test_a_stalled_header_probe_fails_naming_the_url_and_the_bound():
    from corpus_io.audio import io as audio

    server = _StallServer(body=False)
    url = f"{server.base}/a.wav"
    try:
        with pytest.raises(DataError) as info:
            audio.probe(url, storage_options={"read_timeout": 1})
    finally:
        server.close()
    assert url in str(info.value) and "read_timeout=1 s" in str(info.value), str(info.value)
    assert "does not exist" not in str(info.value)
