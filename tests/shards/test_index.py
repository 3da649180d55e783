"""corpus_io.shards.index: a data.list at a URL finds its index.jsonl beside it (not ``s3:/bucket/...``, one
slash), read with the list's storage_options, so verify-shards checks sha256/size/counts and the loader balances
by duration and refuses keys two shards hold. Real S3: SeaweedFS on 127.0.0.1 (tests/conftest.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from corpus_io.config import VerifyShardsConfig
from corpus_io.errors import DataError
from corpus_io.loader.read import Source
from corpus_io.shards.index import index_path_for, load_index, write_list_and_index
from corpus_io.shards.verify import verify_shards
from tests.conftest import run_cli
from tests.shards.conftest import packed_with_a_repeat

pytestmark = pytest.mark.network


def test_the_index_of_a_list_at_a_url_is_the_url_beside_it():
    assert index_path_for("s3://corpus/a/b/data.list") == "s3://corpus/a/b/index.jsonl"
    assert index_path_for("https://host:8080/x/train.list?sig=1") == "https://host:8080/x/train.index.jsonl"
    assert index_path_for("s3://corpus/data.list") == "s3://corpus/index.jsonl"
    assert index_path_for("/data/x/dev.list") == Path("/data/x/dev.index.jsonl")


@pytest.fixture(scope="module")
def on_s3(tmp_path_factory, seaweed):
    """The fixture corpus packed (3 shards of 10/10/4) plus a shard holding 4 of its keys again, uploaded:
    ``(endpoint, prefix, local index entries by shard name)``. Lists are written per test."""
    endpoint, fs = seaweed
    merged, a, again = packed_with_a_repeat(tmp_path_factory.mktemp("index_s3"))
    prefix = f"s3://corpus/{uuid.uuid4().hex[:12]}"
    entries = {}
    for name, d in (("a", a), ("again", again)):
        for entry in load_index(d / "data.list", keys=True).values():
            shard = Path(entry["path"])
            fs.put(str(shard), f"{prefix[5:]}/{name}-{shard.name}")
            entries[f"{name}-{shard.name}"] = entry
    return endpoint, prefix, entries


def upload_list(fs, tmp_path: Path, url: str, entries: list[dict]) -> str:
    """``data.list`` + ``index.jsonl`` (entries naming s3:// URLs) written locally, then put at ``url``'s
    directory; returns the list's URL."""
    tmp_path.mkdir(exist_ok=True)
    local = tmp_path / "data.list"
    write_list_and_index(local, entries)
    for name in ("data.list", "index.jsonl"):
        fs.put(str(tmp_path / name), f"{url[5:]}/{name}")
    return f"{url}/data.list"


def s3_entries(prefix: str, entries: dict, names: list[str]) -> list[dict]:
    return [dict(entries[n], path=f"{prefix}/{n}") for n in names]


@pytest.fixture
def aws_env(seaweed, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed[0])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "corpusio")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "corpusio-secret")


def test_verify_shards_of_a_list_on_s3_checks_sha256_and_counts_from_its_index(on_s3, seaweed, aws_env, tmp_path,
                                                                               capfd):
    _, prefix, entries = on_s3
    names = ["a-shard-000000.tar", "a-shard-000001.tar", "a-shard-000002.tar"]
    good = upload_list(seaweed[1], tmp_path / "good", f"{prefix}/good", s3_entries(prefix, entries, names))
    assert sorted(load_index(good)) == [f"{prefix}/{n}" for n in names]
    results = verify_shards(VerifyShardsConfig(input=good, num_workers=1))
    assert sum(r.num_utts for r in results) == 24
    assert "no index sidecar" not in capfd.readouterr().err
    lying = s3_entries(prefix, entries, names)
    lying[1] = dict(lying[1], sha256="0" * 64)
    bad = upload_list(seaweed[1], tmp_path / "lying", f"{prefix}/lying", lying)
    with pytest.raises(DataError) as err:
        verify_shards(VerifyShardsConfig(input=bad, num_workers=1))
    assert f"{prefix}/a-shard-000001.tar: sha256 mismatch" in str(err.value)


def test_the_loader_of_a_list_on_s3_balances_by_the_index_and_refuses_keys_two_shards_hold(on_s3, seaweed, aws_env,
                                                                                           tmp_path):
    _, prefix, entries = on_s3
    names = ["a-shard-000000.tar", "a-shard-000001.tar", "a-shard-000002.tar", "again-shard-000000.tar"]
    listed = upload_list(seaweed[1], tmp_path / "l", f"{prefix}/repeat", s3_entries(prefix, entries, names))
    with pytest.raises(DataError) as err:  # before any shard is read: nothing would be trained
        Source.open(listed, "shard", on_error="fail")
    assert f"key 'spk0-utt000' is in shards {prefix}/a-shard-000000.tar, {prefix}/again-shard-000000.tar" \
           in str(err.value)
    assert f"(from {prefix}/repeat/index.jsonl)" in str(err.value)
    source = Source.open(listed, "shard", on_error="skip")
    assert source.durations == [entries[n]["duration"] for n in names] and not source.track_keys
    assert sorted(source.owners) == sorted(entries["again-shard-000000.tar"]["keys"])


@pytest.fixture
def no_aws_env(monkeypatch, tmp_path):
    """No credentials anywhere but in storage_options: no AWS_* variable, no ~/.aws, no instance metadata."""
    import os

    for name in [n for n in os.environ if n.startswith("AWS_") or n == "S3_ENDPOINT_URL"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "absent"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_credentials_only_in_storage_options_read_the_list_and_its_index(on_s3, seaweed, no_aws_env, tmp_path):
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.tokenizer import build_tokenizer
    from tests.loader_data import small_conf, token_list

    endpoint, prefix, entries = on_s3
    names = ["a-shard-000000.tar", "a-shard-000001.tar", "a-shard-000002.tar"]
    listed = upload_list(seaweed[1], tmp_path / "l", f"{prefix}/creds", s3_entries(prefix, entries, names))
    options = {"key": "corpusio", "secret": "corpusio-secret", "client_kwargs": {"endpoint_url": endpoint}}
    with pytest.raises(DataError, match=r"no credentials for the object store.*storage_options"):
        Source.open(listed, "shard", on_error="fail")  # none given: a message, not botocore's traceback
    tok = build_tokenizer(token_list(tmp_path / "lang"))
    loader = build_dataloader(listed, small_conf(storage_options=options, num_workers=0), tok, train=True, rank=0,
                              world_size=1)
    loader.set_epoch(0)
    keys = [k for batch in loader for k in batch["keys"]]
    assert sorted(keys) == sorted(k for n in names for k in entries[n]["keys"])
    assert loader.dataset.sources[0].durations == [entries[n]["duration"] for n in names]


def test_verify_shards_command_reads_an_s3_list_and_index_with_storage_options_only(on_s3, seaweed, no_aws_env,
                                                                                   tmp_path):
    endpoint, prefix, entries = on_s3
    names = ["a-shard-000000.tar", "a-shard-000002.tar"]
    lying = s3_entries(prefix, entries, names)
    lying[0] = dict(lying[0], num_utts=3, keys=lying[0]["keys"][:3])
    listed = upload_list(seaweed[1], tmp_path / "l", f"{prefix}/cli", lying)
    options = f"{{key:'corpusio',secret:'corpusio-secret',client_kwargs:{{endpoint_url:'{endpoint}'}}}}"
    result = run_cli("corpus-io", "verify-shards", f"++input={listed}", f"++storage_options={options}",
                     "++num_workers=1", env={"AWS_EC2_METADATA_DISABLED": "true"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{prefix}/a-shard-000000.tar: 10 samples, the index says 3." in result.stdout + result.stderr


def test_a_list_over_http_finds_its_index_and_a_list_without_one_is_read_without(tmp_path):
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from tests.loader_data import make_shards

    www = tmp_path / "www"
    make_shards(www / "shards", sizes=[3, 5])
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(SimpleHTTPRequestHandler, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        local = load_index(www / "shards" / "data.list")
        entries = [dict(e, path=f"{base}/shards/{Path(e['path']).name}") for e in local.values()]
        (www / "indexed").mkdir()
        write_list_and_index(www / "indexed" / "train.list", entries)
        (www / "bare").mkdir()
        (www / "bare" / "data.list").write_text("".join(e["path"] + "\n" for e in entries))
        source = Source.open(f"{base}/indexed/train.list", "shard")
        assert source.durations == [e["duration"] for e in entries] and source.num_utts == [3, 5]
        assert Source.open(f"{base}/bare/data.list", "shard").durations == [0.0, 0.0]  # no index: by count
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("durations, why", [
    ([1.0, float("nan")], "durations[1] is 'nan', not a finite number"),
    ([float("inf"), 1.0], "durations[0] is 'inf', not a finite number"),
    ([1.0, None], "durations[1] is 'None', not a finite number"),
    ([1.0, -1.0], "durations[1] is '-1.0', not a finite number of seconds >= 0"),
    ([1.0, "1.0"], "durations[1] is '1.0', not a finite number"),
    (None, "durations is 'None', not a list of seconds"),
    ("1.0 1.0", "durations is '1.0 1.0', not a list of seconds"),
    ([1.0], "durations lists 1 values but num_utts is 2"),
    ([1000.0, 1000.0], "duration is 2.0 s but durations sum to 2000.000 s"),
    ([0.5, 1.5], "max_duration is 1.0 s but the longest of durations is 1.5 s"),
])
def test_an_index_entrys_durations_are_checked_like_its_other_fields(durations, why):
    from corpus_io.shards.index import index_entry_problems

    entry = {"num_utts": 2, "duration": 2.0, "min_duration": 1.0, "max_duration": 1.0, "durations": durations}
    problems = index_entry_problems(entry)
    assert problems and why in problems[0], problems
    assert index_entry_problems({**entry, "durations": [1.0, 1.0]}) == []
    assert index_entry_problems({**entry, "durations": [1.004, 0.995]}) == []  # the 10 ms rounding of pack-shards
