"""corpus-io on a real Slurm (tests/slurm.py: munged + slurmctld + slurmd on 127.0.0.1, started once for this
module): `srun` launches `train` as 2 tasks that take their ranks from Slurm's step variables."""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.conftest import BIN, free_port, run_bounded
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
