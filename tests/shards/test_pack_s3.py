"""pack-shards straight to S3 (SeaweedFS on 127.0.0.1, the remote tests' server): whole objects only, the list
names s3:// URLs, nothing but shards, list and index in the bucket, and kill -9 + rerun gives the same objects."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import pytest

from corpus_io.config import MergeJobsConfig, PackShardsConfig
from corpus_io.jobs.parts import merge_jobs
from corpus_io.shards.pack import pack_shards
from tests.conftest import BIN, REPO, hang_limit, run_bounded, run_cli
from tests.shards.conftest import fixture_records, write_jsonl

pytestmark = pytest.mark.network


@pytest.fixture
def bucket_prefix(seaweed, tmp_path, monkeypatch):
    """A fresh s3://corpus/<uuid> prefix, the S3 environment for subprocesses, and a tmp state dir."""
    endpoint, fs = seaweed
    monkeypatch.setenv("CORPUS_IO_STATE_DIR", str(tmp_path / "state"))
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "corpusio", "AWS_SECRET_ACCESS_KEY": "corpusio-secret"}
    return f"s3://corpus/{uuid.uuid4().hex[:12]}", fs, env


@pytest.fixture
def s3_env(bucket_prefix, monkeypatch):
    """bucket_prefix with its S3 environment set in this process too: the jobs and merges that are not about the
    command line run in-process (a corpus-io process costs seconds of imports), reaching the bucket as the CLI does."""
    for k, v in bucket_prefix[2].items():
        monkeypatch.setenv(k, v)
    return bucket_prefix


def pack(**options):
    return pack_shards(PackShardsConfig(**options))


def objects_under(fs, url: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    return {p.split("/", 2)[2]: fs.cat_file(p) for p in fs.find(url[len("s3://"):])}


def index_without_paths(text: str) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in ("path", "file")} for line in text.splitlines()]


def test_pack_to_s3_writes_only_shards_list_and_index_naming_s3_urls(bucket_prefix, seaweed, tmp_path):
    prefix, fs, _ = bucket_prefix
    endpoint = seaweed[0]
    jsonl = write_jsonl(tmp_path / "train.jsonl", fixture_records())
    common = dict(input=str(jsonl), num_utts_per_shard=7, num_workers=2)
    pack_shards(PackShardsConfig(output_dir=str(tmp_path / "local"), **common))
    storage = {"anon": True, "client_kwargs": {"endpoint_url": endpoint}}  # the readers' storage_options
    summary = pack_shards(PackShardsConfig(output_dir=prefix, storage_options=storage, **common))
    got = objects_under(fs, prefix)
    shards = sorted(p.name for p in (tmp_path / "local").glob("*.tar"))
    assert sorted(got) == sorted(["data.list", "index.jsonl", *shards])  # no sidecar, no temp object
    for name in shards:  # the very bytes a local run writes
        assert got[name] == (tmp_path / "local" / name).read_bytes()
    assert got["data.list"].decode().splitlines() == [f"{prefix}/{s}" for s in shards]
    index = got["index.jsonl"].decode()
    assert [json.loads(x)["path"] for x in index.splitlines()] == [f"{prefix}/{s}" for s in shards]
    assert index_without_paths(index) == index_without_paths((tmp_path / "local" / "index.jsonl").read_text())
    assert summary.extra["resumed"] == 0
    again = pack_shards(PackShardsConfig(output_dir=prefix, storage_options=storage, **common))
    assert again.extra["resumed"] == len(shards)  # size and digest match: nothing sent again
    assert objects_under(fs, prefix) == got


@pytest.mark.slow
def test_kill_9_mid_pack_to_s3_lists_no_partial_object_and_rerun_gives_the_same_objects(s3_env, tmp_path):
    prefix, fs, env = s3_env
    records = [dict(r, key=f"c{c:02d}-{r['key']}") for c in range(5) for r in fixture_records()]
    jsonl = write_jsonl(tmp_path / "big.jsonl", records)  # 120 utterances, 30 shards of 4, re-encoded
    common = dict(input=str(jsonl), num_utts_per_shard=4, num_workers=2, audio_format="flac")
    args = [f"++{k}={v}" for k, v in common.items()]
    pack(output_dir=str(tmp_path / "ref"), **common)  # the uninterrupted run
    reference = {p.name: p.read_bytes() for p in (tmp_path / "ref").glob("*.tar")}
    proc = subprocess.Popen([str(BIN / "corpus-io"), "pack-shards", *args, f"++output_dir={prefix}"], cwd=REPO,
                            env=dict(os.environ, **env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + hang_limit(120)
    while time.time() < deadline and len(fs.find(prefix[len("s3://"):])) < 5:
        time.sleep(0.02)
        fs.invalidate_cache()
    os.killpg(proc.pid, signal.SIGKILL)  # the main process and its workers, mid-upload or mid-pack
    proc.wait()
    seen = objects_under(fs, prefix)
    assert "data.list" not in seen, "the run finished before it was killed; the test proved nothing"
    assert seen and all(seen[name] == reference[name] for name in seen), "an object under a final name is partial"
    resumed = pack(output_dir=prefix, **common).extra["resumed"]  # the rerun, in-process
    assert resumed >= len(seen) - 4 > 0  # only the shards in flight at the kill may be sent again
    got = objects_under(fs, prefix)
    assert {k: v for k, v in got.items() if k.endswith(".tar")} == reference
    assert got["data.list"].decode().splitlines() == [f"{prefix}/{s}" for s in sorted(reference)]
    assert index_without_paths(got["index.jsonl"].decode()) == \
        index_without_paths((tmp_path / "ref" / "index.jsonl").read_text())


def test_jobs_into_s3_merge_to_the_objects_of_one_job(s3_env, tmp_path):
    prefix, fs, _ = s3_env
    jsonl = write_jsonl(tmp_path / "train.jsonl", fixture_records())
    common = dict(input=str(jsonl), num_utts_per_shard=6, shuffle=True, num_workers=1)  # 4 shards, 2 per job
    pack(output_dir=str(tmp_path / "one"), **common)
    for j in (2, 1):
        pack(output_dir=prefix, num_jobs=2, job_index=j, **common)
    assert "data.list" not in objects_under(fs, prefix)  # no list before the merge
    merge_jobs(MergeJobsConfig(path=prefix))
    got = objects_under(fs, prefix)
    shards = sorted(p.name for p in (tmp_path / "one").glob("*.tar"))
    records = [f"pack-shards.part-{j:06d}-of-000002.json" for j in (1, 2)]
    assert sorted(got) == sorted(["data.list", "index.jsonl", *shards, *records])  # no sidecar in the bucket
    assert all(got[s] == (tmp_path / "one" / s).read_bytes() for s in shards)
    one_list = [line.rsplit("/", 1)[1] for line in (tmp_path / "one" / "data.list").read_text().splitlines()]
    assert got["data.list"].decode().splitlines() == [f"{prefix}/{s}" for s in one_list]
    assert index_without_paths(got["index.jsonl"].decode()) == \
        index_without_paths((tmp_path / "one" / "index.jsonl").read_text())


@pytest.mark.slow
def test_merge_into_s3_refuses_a_shard_object_deleted_after_its_job_and_a_rerun_sends_it_again(s3_env, tmp_path):
    prefix, fs, env = s3_env
    jsonl = write_jsonl(tmp_path / "train.jsonl", fixture_records())
    common = dict(input=str(jsonl), num_utts_per_shard=6, num_workers=1, output_dir=prefix, num_jobs=2)
    for j in (1, 2):
        pack(job_index=j, **common)
    before = objects_under(fs, prefix)
    gone = sorted(k for k in before if k.endswith(".tar"))[0]
    fs.rm(f"{prefix}/{gone}"[len("s3://"):])
    merged = run_cli("corpus-io", "merge-jobs", f"++path={prefix}", env=env)
    assert merged.returncode == 2 and f"its shard {prefix}/{gone} is absent. Nothing was changed." in merged.stderr
    assert "Traceback" not in merged.stderr and "data.list" not in objects_under(fs, prefix)
    for j in (1, 2):  # the job that made it sends it again; the other finds its objects complete
        pack(job_index=j, **common)
    merge_jobs(MergeJobsConfig(path=prefix))
    after = objects_under(fs, prefix)
    assert after == dict(before, **{k: after[k] for k in ("data.list", "index.jsonl")})


@pytest.mark.slow
def test_jobs_on_machines_that_share_no_disk_merge_on_a_third_to_the_objects_of_one_job(s3_env, seaweed, tmp_path,
                                                                                         monkeypatch):
    """Each job and the merge get their own state dir (CORPUS_IO_STATE_DIR), as on nodes without a shared disk:
    the part records travel through the bucket. The second merge has its endpoint from ++storage_options only."""
    prefix, fs, _ = s3_env
    jsonl = write_jsonl(tmp_path / "train.jsonl", fixture_records())
    common = dict(input=str(jsonl), num_utts_per_shard=6, num_workers=1)
    pack(output_dir=str(tmp_path / "one"), **common)

    def on(node: str) -> None:  # this process plays that node: its own state dir
        monkeypatch.setenv("CORPUS_IO_STATE_DIR", str(tmp_path / node))

    for j, node in ((1, "a"), (2, "b")):
        on(node)
        pack(output_dir=prefix, num_jobs=2, job_index=j, **common)
    on("c")
    merge_jobs(MergeJobsConfig(path=prefix))
    got = objects_under(fs, prefix)
    shards = sorted(p.name for p in (tmp_path / "one").glob("*.tar"))
    assert all(got[s] == (tmp_path / "one" / s).read_bytes() for s in shards)
    assert index_without_paths(got["index.jsonl"].decode()) == \
        index_without_paths((tmp_path / "one" / "index.jsonl").read_text())
    no_aws = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    again = run_bounded([str(BIN / "corpus-io"), "merge-jobs", f"++path={prefix}",  # idempotent, anywhere
                         f"++storage_options={{anon:true,client_kwargs:{{endpoint_url:'{seaweed[0]}'}}}}"],
                        120, env=dict(no_aws, CORPUS_IO_STATE_DIR=str(tmp_path / "d"), CORPUS_IO_NO_PROGRESS="1"))
    assert again.returncode == 0, again.stderr
    on("d")  # a rerun on a node that never saw the job: same objects
    pack(output_dir=prefix, num_jobs=2, job_index=2, **common)
    assert objects_under(fs, prefix) == got
