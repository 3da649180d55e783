"""++executor=dask on a real Dask cluster on 127.0.0.1 (`dask scheduler` + two `dask worker`s, ports from the OS):
pack-shards' jobs are submitted, one worker is killed mid-run, and the merged result equals one job's bytes; then
compute-cmvn's jobs on the worker left."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import distributed  # noqa: F401 - [dev] brings it ([dask]): a broken install fails this test, never skips it
import pytest

from tests.conftest import BIN, free_port, hang_limit, run_cli, wait_for_port
from tests.shards.conftest import fixture_records, write_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture
def dask_cluster(tmp_path):
    port = free_port()
    procs = []

    def start(*args: str) -> subprocess.Popen:
        log = open(tmp_path / f"dask{len(procs)}.log", "wb")
        proc = subprocess.Popen([str(BIN / "dask"), *args], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
        procs.append(proc)
        return proc

    scheduler = start("scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0",
                      "--no-show")
    wait_for_port(port, scheduler, tmp_path / "dask0.log", "dask scheduler")
    address = f"tcp://127.0.0.1:{port}"
    workers = [start("worker", address, "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1",
                     "--dashboard-address", ":0") for _ in range(2)]
    yield address, workers
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_dask_executor_survives_a_killed_worker_and_merges_to_one_jobs_bytes(dask_cluster, tmp_path):
    address, workers = dask_cluster
    records = [dict(r, key=f"c{c}-{r['key']}") for c in range(4) for r in fixture_records()]
    jsonl = write_jsonl(tmp_path / "train.jsonl", records)  # 96 utterances, 24 shards of 4
    args = [f"++input={jsonl}", "++num_utts_per_shard=4", "++audio_format=flac", "++num_workers=1"]
    one = run_cli("corpus-io", "pack-shards", *args, f"++output_dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr
    out = tmp_path / "out"
    proc = subprocess.Popen([str(BIN / "corpus-io"), "pack-shards", *args, f"++output_dir={out}", "++num_jobs=6",
                             "++executor=dask", f"++executor_address={address}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, CORPUS_IO_NO_PROGRESS="1"))
    deadline = time.monotonic() + hang_limit(120)
    while time.monotonic() < deadline and not list(out.glob("pack-shards.part-*.json")):
        time.sleep(0.05)
    os.kill(workers[0].pid, signal.SIGKILL)  # mid-run: the scheduler reruns its job on the other worker
    assert len(list(out.glob("pack-shards.part-*.json"))) < 6, "every job was done before the kill: proved nothing"
    try:
        stdout, stderr = proc.communicate(timeout=hang_limit(240))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-5000:]
    assert "[merge-jobs] 6 parts of pack-shards" in stdout + stderr
    shards = sorted(p.name for p in (tmp_path / "one").glob("*.tar"))
    assert sorted(p.name for p in out.glob("*.tar")) == shards
    assert all((out / s).read_bytes() == (tmp_path / "one" / s).read_bytes() for s in shards)
    assert (out / "index.jsonl").read_bytes() == (tmp_path / "one" / "index.jsonl").read_bytes()
    # compute-cmvn's jobs on the worker left alive: the statistics of one job, byte for byte
    cmvn = ["compute-cmvn", f"++data_list={out / 'data.list'}", "++dataset_conf.num_workers=0"]
    one = run_cli("corpus-io", *cmvn, f"++output={tmp_path / 'one.cmvn.json'}", timeout=240)
    assert one.returncode == 0, one.stderr
    jobs = run_cli("corpus-io", *cmvn, f"++output={tmp_path / 'jobs.cmvn.json'}", "++num_jobs=3", "++executor=dask",
                   f"++executor_address={address}", timeout=240)
    assert jobs.returncode == 0, jobs.stderr
    assert "[merge-jobs] 3 parts of compute-cmvn" in jobs.stdout + jobs.stderr
    assert (tmp_path / "jobs.cmvn.json").read_bytes() == (tmp_path / "one.cmvn.json").read_bytes()
