"""++executor=dask on a real Dask cluster on 127.0.0.1 (`dask scheduler` + `dask worker`s, ports from the OS), one
scheduler for the module:

* the Dask lines of docs/CLUSTERS.md on a default `dask worker` (nanny on: tasks run in a daemonic process, which
  may not start the commands' worker processes) with the commands' default num_workers: pack-shards and compute-cmvn
  give one local job's bytes;
* pack-shards' jobs on two `--no-nanny` workers, one killed mid-run: the merged result equals one job's bytes; then
  compute-cmvn's jobs on the worker left;
* segment's jobs (the model `make smoke` trains, two joined espeak recordings) on a default worker: one job's bytes."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import distributed  # noqa: F401 - [dev] brings it ([dask]): a broken install fails this test, never skips it
import pytest

from corpus_io import api
from tests.conftest import BIN, doc_search, free_port, hang_limit, run_cli, wait_for_port
from tests.recipes.test_smoke import smoke  # noqa: F401  (`make smoke`, built once a session: segment's model)
from tests.shards.conftest import fixture_records, write_jsonl

pytestmark = pytest.mark.slow


class Cluster:
    """A scheduler for the module; each test starts its workers and :meth:`stop_workers` ends them."""

    def __init__(self, logs: Path):
        self.logs, self.procs, self.workers = logs, [], []
        port = free_port()
        scheduler = self._start("scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0",
                                "--no-show")
        wait_for_port(port, scheduler, self.logs / "dask0.log", "dask scheduler")
        self.address = f"tcp://127.0.0.1:{port}"

    def _start(self, *args: str) -> subprocess.Popen:
        log = open(self.logs / f"dask{len(self.procs)}.log", "wb")
        proc = subprocess.Popen([str(BIN / "dask"), *args], stdout=log, stderr=subprocess.STDOUT, cwd=self.logs,
                                env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
        self.procs.append(proc)
        return proc

    def start_worker(self, *args: str) -> tuple[subprocess.Popen, Path]:
        """``dask worker <scheduler> ARGS`` on 127.0.0.1: the process and its log."""
        proc = self._start("worker", self.address, "--host", "127.0.0.1", "--dashboard-address", ":0", *args)
        self.workers.append(proc)
        return proc, self.logs / f"dask{len(self.procs) - 1}.log"

    def stop_workers(self) -> None:
        """Kill this test's workers (a nanny with its worker: the process group) and wait until the scheduler has
        dropped them, so the next test's jobs run only on its own workers."""
        from distributed import Client

        for proc in self.workers:
            _kill(proc)
        self.workers = []
        with Client(self.address, timeout=60) as client:
            deadline = time.monotonic() + 60
            while client.scheduler_info()["workers"] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not client.scheduler_info()["workers"], "the scheduler still lists killed workers"

    def close(self) -> None:
        for proc in self.procs:
            _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("dask"))
    yield cluster
    cluster.close()


@pytest.fixture
def cluster(dask_cluster):
    yield dask_cluster
    dask_cluster.stop_workers()


def _readme_dask_lines() -> tuple[list[str], list[str]]:
    """The documented pack-shards line on a Dask cluster (its ```bash block after "On a Dask cluster", in
    docs/CLUSTERS.md), split as a shell splits it, and its executor keys (what "the same two keys" adds to another
    command)."""
    block = doc_search(r"On a Dask cluster.*?```bash\n(.*?)```", re.S).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["corpus-io", "pack-shards"], block
    return argv, [a for a in argv if a.startswith(("++num_jobs=", "++executor=", "++executor_address="))]


def _readme_compute_cmvn() -> list[str]:
    return shlex.split(doc_search(r"^corpus-io compute-cmvn .*$", re.M).group(0))


def _at(argv: list[str], places: dict[str, str]) -> list[str]:
    """``argv`` with the documented addresses (paths, the scheduler) replaced by this test's."""
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        out.append(f"{key}={places[value]}" if value in places else arg)
    assert out != argv
    return [str(BIN / out[0]), *out[1:]]


def _same_files(a: Path, b: Path, pattern: str) -> None:
    names = sorted(p.name for p in a.glob(pattern))
    assert names and names == sorted(p.name for p in b.glob(pattern))
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def test_the_readme_dask_lines_on_a_default_worker_give_one_local_jobs_bytes(cluster, tmp_path):
    """The documented block (docs/CLUSTERS.md), verbatim apart from the paths and the scheduler's address, on
    `dask worker <address>` (nanny on, its default threads) with default num_workers; pack-shards gets
    ``++num_utts_per_shard=1`` so that this small corpus (96 utterances) makes more shards than the block's 64 jobs:
    a job packs two shards, which opens its pool of workers (one shard a job would run inline and prove nothing)."""
    _, log = cluster.start_worker()
    jsonl = write_jsonl(tmp_path / "train.jsonl", [dict(r, key=f"c{c}-{r['key']}") for c in range(4)
                                                    for r in fixture_records()])
    argv, executor = _readme_dask_lines()
    pack = [*_at(argv, {"train.jsonl": str(jsonl), "/shared/shards": str(tmp_path / "dask"),
                        "tcp://10.0.0.5:8786": cluster.address}), "++num_utts_per_shard=1"]
    api.pack_shards(jsonl, tmp_path / "one", num_utts_per_shard=1)  # one local job, here
    result = run_cli(*pack, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:] + log.read_text(errors="replace")[-5000:]
    assert "[merge-jobs] 64 parts of pack-shards" in result.stdout + result.stderr
    _same_files(tmp_path / "dask", tmp_path / "one", "*.tar")
    _same_files(tmp_path / "dask", tmp_path / "one", "index.jsonl")
    # compute-cmvn: the documented line (README.md's pipeline) with "the same two keys" (and the block's job count)
    data_list = str(tmp_path / "dask" / "data.list")
    api.compute_cmvn(data_list, tmp_path / "one.cmvn.json")
    places = {"data/train/shards/data.list": data_list, "data/train/cmvn.json": str(tmp_path / "dask.cmvn.json"),
              "tcp://10.0.0.5:8786": cluster.address}
    result = run_cli(*_at([*_readme_compute_cmvn(), *executor], places), timeout=600)
    assert result.returncode == 0, result.stderr[-5000:] + log.read_text(errors="replace")[-5000:]
    assert "[merge-jobs] 64 parts of compute-cmvn" in result.stdout + result.stderr
    assert (tmp_path / "dask.cmvn.json").read_bytes() == (tmp_path / "one.cmvn.json").read_bytes()
    # the worker said once why its jobs ran their pools inline
    assert log.read_text(errors="replace").count("this process is daemonic") == 1


def test_dask_executor_survives_a_killed_worker_and_merges_to_one_jobs_bytes(cluster, tmp_path):
    address = cluster.address
    workers = [cluster.start_worker("--nthreads", "1", "--no-nanny")[0] for _ in range(2)]
    records = [dict(r, key=f"c{c}-{r['key']}") for c in range(4) for r in fixture_records()]
    jsonl = write_jsonl(tmp_path / "train.jsonl", records)  # 96 utterances, 24 shards of 4
    args = [f"++input={jsonl}", "++num_utts_per_shard=4", "++audio_format=flac", "++num_workers=1"]
    api.pack_shards(jsonl, tmp_path / "one", num_utts_per_shard=4, audio_format="flac", num_workers=1)  # one job
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
    _same_files(out, tmp_path / "one", "*.tar")
    assert (out / "index.jsonl").read_bytes() == (tmp_path / "one" / "index.jsonl").read_bytes()
    # compute-cmvn's jobs on the worker left alive: the statistics of one job, byte for byte
    cmvn = ["compute-cmvn", f"++data_list={out / 'data.list'}", "++dataset_conf.num_workers=0"]
    api.compute_cmvn(out / "data.list", tmp_path / "one.cmvn.json", dataset_conf={"num_workers": 0})
    jobs = run_cli("corpus-io", *cmvn, f"++output={tmp_path / 'jobs.cmvn.json'}", "++num_jobs=3", "++executor=dask",
                   f"++executor_address={address}", timeout=240)
    assert jobs.returncode == 0, jobs.stderr
    assert "[merge-jobs] 3 parts of compute-cmvn" in jobs.stdout + jobs.stderr
    assert (tmp_path / "jobs.cmvn.json").read_bytes() == (tmp_path / "one.cmvn.json").read_bytes()


def test_segment_jobs_on_dask_give_one_local_jobs_bytes(cluster, smoke, tmp_path):  # noqa: F811
    """``corpus-io segment ++num_jobs=2 ++executor=dask``: a recording a job, on a default `dask worker` (nanny on,
    the loader inline), merged here into the files one local job writes, byte for byte."""
    from corpus_io.infer.segment import SEGMENT_OUTPUTS
    from corpus_io.tables import synth

    _, log = cluster.start_worker("--nthreads", "1")
    synth.make_digits(tmp_path / "utts", 40, seed=11)
    joined = synth.join(tmp_path / "utts", tmp_path / "long", per_recording=20, seed=0)
    args = [f"++input={joined}", f"++checkpoint={smoke['exp'] / 'model.pt.avg1'}", "++dataset_conf.num_workers=0"]
    one = run_cli("corpus-io", "segment", *args, f"++output_dir={tmp_path / 'one'}", timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    result = run_cli("corpus-io", "segment", *args, f"++output_dir={tmp_path / 'dask'}", "++num_jobs=2",
                     "++executor=dask", f"++executor_address={cluster.address}", timeout=600)
    assert result.returncode == 0, result.stderr[-5000:] + log.read_text(errors="replace")[-5000:]
    assert "[merge-jobs] 2 parts of segment" in result.stdout + result.stderr
    for name in SEGMENT_OUTPUTS:
        assert (tmp_path / "dask" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    assert len((tmp_path / "one" / "wav.scp").read_text().splitlines()) == 2
