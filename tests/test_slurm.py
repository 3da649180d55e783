"""corpus-io on a real Slurm (tests/slurm.py: munged + slurmctld + slurmd on 127.0.0.1, started once for this
module): `srun` launches `train` as 2 tasks that take their ranks from Slurm's step variables; run_jobs.sh and a
recipe's pack stage run as an sbatch array plus a dependent merge."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import BIN, REPO, free_port, hang_limit, run_bounded
from tests.loader_data import make_shards, token_list

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_corpus")
    shards, keys = make_shards(root / "shards", copies=1, per_shard=4)
    return {"shards": shards, "keys": keys, "tokens": token_list(root).token_list}


def test_srun_launches_train_as_two_ranks_from_slurm_variables(slurm, corpus, tmp_path):
    out = tmp_path / "exp"
    env = dict(slurm.env, MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", CORPUS_IO_NO_PROGRESS="1",
               PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    result = run_bounded(["srun", "--ntasks=2", "--kill-on-bad-exit=1", "--export=ALL", str(BIN / "corpus-io"),
                          "train", f"++train_data_set_list={corpus['shards']}", f"++output_dir={out}",
                          f"++tokenizer.token_list={corpus['tokens']}", "++model.num_blocks=1",
                          "++dataset_conf.num_workers=0", "++dataset_conf.batch_size=2",
                          "++dataset_conf.filter_conf.token_min_length=0", "++train_conf.max_epoch=1",
                          "++train_conf.max_steps_per_epoch=2", "++train_conf.avg_nbest_model=0",
                          "++train_conf.log_interval=1"], 240, env=env)
    assert result.returncode == 0, result.stderr[-5000:] + slurm.logs()
    log = (out / "train.log").read_text(encoding="utf-8")
    assert "world_size 2" in log and log.count("training finished") == 1, log
    assert (out / "model.pt.ep0").is_file()


def test_run_jobs_slurm_submits_an_array_waits_and_names_the_log_of_a_failed_task(slurm, tmp_path):
    from tests.recipes.test_run_jobs import JOB, RUN_JOBS

    env = dict(slurm.env, OUT=str(tmp_path), RUN_JOBS_POLL="0.3", RC_2="3")
    result = run_bounded(["bash", str(RUN_JOBS), "slurm", "--time=10", "JOB=1:3", f"{tmp_path}/log/fake.JOB.log",
                          "--", sys.executable, "-c", JOB], 120, env=env)
    assert result.returncode == 1, result.stderr
    assert re.search(r"job 2 of 3 \(Slurm \d+, task 2\) failed \(exit 3\): see .*/log/fake\.2\.log", result.stderr), \
        result.stderr
    for j in (1, 2, 3):  # every task ran as its own array task, with N and J on its command line
        assert (tmp_path / f"job.{j}").read_text().split()[1:] == ["3", str(j)]
        assert (tmp_path / "log" / f"fake.{j}.log").read_text().startswith(f"job {j} of 3 running")


def test_recipe_pack_stage_on_slurm_survives_a_cancelled_task_and_equals_one_job(slurm, tmp_path):
    """The espeak recipe's stage 4 with --cmd slurm --nj 3: an sbatch --array=1-3 plus an afterok merge. Task 2 is
    cancelled (scancel): the stage fails naming it; the same line again resubmits, and the result is the bytes
    of one job."""
    from tests.shards.conftest import fixture_records, write_jsonl

    data = tmp_path / "data"
    for name in ("train", "dev"):
        (data / name).mkdir(parents=True)
        write_jsonl(data / name / "data.jsonl", fixture_records())
    env = dict(slurm.env, PATH=f"{BIN}:{os.environ['PATH']}", RUN_JOBS_POLL="0.3", CORPUS_IO_NO_PROGRESS="1",
               PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    stage = [str(REPO / "recipes" / "espeak" / "run.sh"), "--stage", "4", "--stop_stage", "4", "--data", str(data),
             "--nj", "3", "--cmd", "slurm", "--num_utts_per_shard", "3", "--num_utts_per_shard_dev", "5"]
    proc = subprocess.Popen(stage, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + hang_limit(60)
        task = None
        while task is None and time.monotonic() < deadline:
            out = slurm.client("squeue", "-h", "-r", "-o", "%i %j", check=False).stdout.split("\n")
            task = next((line.split()[0] for line in out if line.endswith(" pack") and line.split()[0].endswith("_2")),
                        None)
            time.sleep(0.05)
        assert task, "the array was never seen in the queue"
        slurm.client("scancel", task)
        _, err = proc.communicate(timeout=hang_limit(120))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err
    assert re.search(r"job 2 of 3 \(Slurm \d+, task 2\) did not finish.*see .*train/log/pack\.2\.log", err), err
    assert not (data / "train" / "shards" / "data.list").exists()  # no merge without every part
    again = run_bounded(stage, 180, env=env)
    assert again.returncode == 0, again.stderr + slurm.logs()
    one = tmp_path / "one"
    ref = run_bounded([str(BIN / "corpus-io"), "pack-shards", f"++input={data / 'train' / 'data.jsonl'}",
                       f"++output_dir={one}", "++num_utts_per_shard=3", "++shuffle=true", "++num_workers=1"], 120,
                      env=env)
    assert ref.returncode == 0, ref.stderr
    got = data / "train" / "shards"
    shards = sorted(p.name for p in one.glob("*.tar"))
    assert len(shards) == 8 and sorted(p.name for p in got.glob("*.tar")) == shards
    assert all((got / s).read_bytes() == (one / s).read_bytes() for s in shards)
    assert (got / "index.jsonl").read_bytes() == (one / "index.jsonl").read_bytes()
    assert [line.rsplit("/", 1)[1] for line in (got / "data.list").read_text().splitlines()] == shards
