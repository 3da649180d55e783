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

from corpus_io.config import PackShardsConfig
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


def test_kill_9_mid_pack_to_s3_lists_no_partial_object_and_rerun_gives_the_same_objects(bucket_prefix, tmp_path):
    prefix, fs, env = bucket_prefix
    records = [dict(r, key=f"c{c:02d}-{r['key']}") for c in range(5) for r in fixture_records()]
    jsonl = write_jsonl(tmp_path / "big.jsonl", records)  # 120 utterances, 30 shards of 4, re-encoded
    args = [f"++input={jsonl}", "++num_utts_per_shard=4", "++num_workers=2", "++audio_format=flac"]
    ref = run_cli("corpus-io", "pack-shards", *args, f"++output_dir={tmp_path / 'ref'}")
    assert ref.returncode == 0, ref.stderr
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
    rerun = run_cli("corpus-io", "pack-shards", *args, f"++output_dir={prefix}", env=env)
    assert rerun.returncode == 0, rerun.stderr
    resumed = int(rerun.stderr.split("resumed ")[1].split(";")[0])
    assert resumed >= len(seen) - 4 > 0  # only the shards in flight at the kill may be sent again
    got = objects_under(fs, prefix)
    assert {k: v for k, v in got.items() if k.endswith(".tar")} == reference
    assert got["data.list"].decode().splitlines() == [f"{prefix}/{s}" for s in sorted(reference)]
    assert index_without_paths(got["index.jsonl"].decode()) == \
        index_without_paths((tmp_path / "ref" / "index.jsonl").read_text())


def test_jobs_into_s3_merge_to_the_objects_of_one_job(bucket_prefix, tmp_path):
    prefix, fs, env = bucket_prefix
    jsonl = write_jsonl(tmp_path / "train.jsonl", fixture_records())
    args = [f"++input={jsonl}", "++num_utts_per_shard=3", "++shuffle=true", "++num_workers=1"]
    one = run_cli("corpus-io", "pack-shards", *args, f"++output_dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr
    for j in (2, 1):
        job = run_cli("corpus-io", "pack-shards", *args, f"++output_dir={prefix}", "++num_jobs=2", f"++job_index={j}",
                      env=env)
        assert job.returncode == 0, job.stderr
    assert "data.list" not in objects_under(fs, prefix)  # no list before the merge
    merged = run_cli("corpus-io", "merge-jobs", f"++path={prefix}", env=env)
    assert merged.returncode == 0, merged.stderr
    got = objects_under(fs, prefix)
    shards = sorted(p.name for p in (tmp_path / "one").glob("*.tar"))
    records = [f"pack-shards.part-{j:06d}-of-000002.json" for j in (1, 2)]
    assert sorted(got) == sorted(["data.list", "index.jsonl", *shards, *records])  # no sidecar in the bucket
    assert all(got[s] == (tmp_path / "one" / s).read_bytes() for s in shards)
    one_list = [line.rsplit("/", 1)[1] for line in (tmp_path / "one" / "data.list").read_text().splitlines()]
    assert got["data.list"].decode().splitlines() == [f"{prefix}/{s}" for s in one_list]
    assert index_without_paths(got["index.jsonl"].decode()) == \
        index_without_paths((tmp_path / "one" / "index.jsonl").read_text())


def test_merge_into_s3_refuses_a_shard_object_deleted_after_its_job_and_a_rerun_sends_it_again(bucket_prefix,
                                                                                                 tmp_path):
    prefix, fs, env = bucket_prefix
    jsonl = write_jsonl(tmp_path / "train.jsonl", fixture_records())
    args = [f"++input={jsonl}", "++num_utts_per_shard=3", "++num_workers=1", f"++output_dir={prefix}",
            "++num_jobs=2"]
    for j in (1, 2):
        job = run_cli("corpus-io", "pack-shards", *args, f"++job_index={j}", env=env)
        assert job.returncode == 0, job.stderr
    before = objects_under(fs, prefix)
    gone = sorted(k for k in before if k.endswith(".tar"))[0]
    fs.rm(f"{prefix}/{gone}"[len("s3://"):])
    merged = run_cli("corpus-io", "merge-jobs", f"++path={prefix}", env=env)
    assert merged.returncode == 2 and f"its shard {prefix}/{gone} is absent. Nothing was changed." in merged.stderr
    assert "Traceback" not in merged.stderr and "data.list" not in objects_under(fs, prefix)
    for j in (1, 2):  # the job that made it sends it again; the other finds its objects complete
        job = run_cli("corpus-io", "pack-shards", *args, f"++job_index={j}", env=env)
        assert job.returncode == 0, job.stderr
    merged = run_cli("corpus-io", "merge-jobs", f"++path={prefix}", env=env)
    assert merged.returncode == 0, merged.stderr
    after = objects_under(fs, prefix)
    assert after == dict(before, **{k: after[k] for k in ("data.list", "index.jsonl")})


def test_jobs_on_machines_that_share_no_disk_merge_on_a_third_to_the_objects_of_one_job(bucket_prefix, seaweed,
                                                                                         tmp_path):
    """Each job and the merge get their own state dir (CORPUS_IO_STATE_DIR), as on nodes without a shared disk:
    the part records travel through the bucket. The second merge has its endpoint from ++storage_options only."""
    prefix, fs, env = bucket_prefix
    jsonl = write_jsonl(tmp_path / "train.jsonl", fixture_records())
    args = [f"++input={jsonl}", "++num_utts_per_shard=3", "++num_workers=1"]
    one = run_cli("corpus-io", "pack-shards", *args, f"++output_dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr

    def on(node: str) -> dict:
        return dict(env, CORPUS_IO_STATE_DIR=str(tmp_path / node))

    for j, node in ((1, "a"), (2, "b")):
        job = run_cli("corpus-io", "pack-shards", *args, f"++output_dir={prefix}", "++num_jobs=2",
                      f"++job_index={j}", env=on(node))
        assert job.returncode == 0, job.stderr
    merged = run_cli("corpus-io", "merge-jobs", f"++path={prefix}", env=on("c"))
    assert merged.returncode == 0, merged.stderr
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
    rerun = run_cli("corpus-io", "pack-shards", *args, f"++output_dir={prefix}", "++num_jobs=2", "++job_index=2",
                    env=on("d"))  # a rerun on a node that never saw the job: same objects
    assert rerun.returncode == 0, rerun.stderr
    assert objects_under(fs, prefix) == got
