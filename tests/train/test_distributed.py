"""Checks across ranks (corpus_io.train.distributed)."""

from __future__ import annotations

import os
import sys

from corpus_io.train.distributed import rank_disagreement


def test_ranks_that_resume_differently_or_read_different_lists_are_named():
    same = {"resume": (2, 10, 410), "lists": "ab12"}
    assert rank_disagreement([same, dict(same)]) is None
    problem = rank_disagreement([same, {"resume": (1, 0, 200), "lists": "ab12"}])
    assert "resume point" in problem and "rank 0: (2, 10, 410); rank 1: (1, 0, 200)" in problem
    assert "shared" in problem or "share" in problem
    assert "train list" in rank_disagreement([same, {"resume": (2, 10, 410), "lists": "ffff"}])


def test_srun_tasks_get_torchrun_variables_from_slurm_step_variables():
    from corpus_io.train.distributed import first_host, slurm_step_env

    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
            "SLURM_JOB_ID": "41234", "SLURM_STEP_NODELIST": "gpu[07-09,12],cpu1"}
    assert slurm_step_env(step) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07",
                                    "MASTER_PORT": "21234"}
    assert slurm_step_env(dict(step, MASTER_PORT="29500", MASTER_ADDR="h"))["MASTER_PORT"] == "29500"
    assert slurm_step_env({k: v for k, v in step.items() if k != "SLURM_STEP_ID"}) == {}  # the batch script
    assert slurm_step_env(dict(step, WORLD_SIZE="2")) == {}  # srun torchrun: torchrun's variables win
    assert first_host("node1,node2") == "node1" and first_host("localhost") == "localhost"


def test_a_rendezvous_port_in_use_under_srun_says_so_and_what_to_set(monkeypatch):
    import socket

    import pytest

    from corpus_io.errors import ConfigError
    from corpus_io.train.distributed import init_distributed

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.setenv(name, "")  # recorded, so what the srun set-up writes is undone after the test
        monkeypatch.delenv(name)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        for name, value in {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2",
                            "SLURM_JOB_ID": "7", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError) as err:
            init_distributed("cpu", timeout_s=60)
    assert f"rank 0: port {port} on 127.0.0.1 is in use" in str(err.value)
    assert "MASTER_PORT=N" in str(err.value)


_PEER_STOP = """
import sys, torch, torch.distributed as dist
from corpus_io.train.distributed import PeerStop, init_distributed
ctx = init_distributed("cpu", 600)
peers = PeerStop(ctx, poll_s=0.2)
if ctx.rank == 0:  # its cv worker never started: rank 1 waits for it in the validation's all-reduce
    peers.publish("rank 0: the cv loader in the validation of epoch 7: DataLoader worker 0 of 1 did not start.")
    sys.exit(2)
dist.all_reduce(torch.zeros(1))  # rank 0 never joins it
print("rank 1 left a collective rank 0 never joined", flush=True)
"""


def test_a_rank_waiting_in_a_collective_says_why_a_peer_stopped_and_exits_before_the_collective_timeout():
    import os
    import sys
    from pathlib import Path

    from tests.conftest import REPO, free_port, run_bounded

    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node=2", f"--master_port={free_port()}",
           "--no-python", sys.executable, "-c", _PEER_STOP]
    # the collective's timeout is 600 s: run_bounded fails the test as hung long before it
    result = run_bounded(cmd, 60, env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
    assert result.returncode != 0
    assert ("error: rank 1 stops because rank 0 did: rank 0: the cv loader in the validation of epoch 7: "
            "DataLoader worker 0 of 1 did not start.") in result.stderr
    assert "left a collective" not in result.stdout and "gloo" not in result.stderr.lower()



def test_train_whose_loader_workers_cannot_start_in_time_stops_every_rank_with_one_paragraph(corpus, tmp_path):
    from tests.trained_models import run_train, torchrun_cmd

    # a spawned worker is a fresh interpreter: it cannot import torch within 50 ms
    cmd = torchrun_cmd(tmp_path / "exp", corpus, "++dataset_conf.num_workers=1", "++train_conf.max_epoch=1",
                       "++dataset_conf.worker_start_method=spawn", "++dataset_conf.worker_start_timeout=0.05")
    result = run_train(cmd, timeout=120)  # a rank left waiting for a collective would wait 600 s: a hang
    assert result.returncode != 0
    # each rank says it: its own worker's paragraph, or (when the peer's came first) the peer's, as its reason to stop
    paragraph = "the train loader in epoch 0: DataLoader worker 0 of 1 (pid "
    for rank in range(2):
        own, peer = f"error: rank {rank}: {paragraph}", f"error: rank {rank} stops because rank {1 - rank} did: "
        assert own in result.stderr or peer + f"rank {1 - rank}: {paragraph}" in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("did not start within 0.05 s (dataset_conf.worker_start_timeout)") >= 2
    frames = [line for line in result.stderr.splitlines() if line.lstrip().startswith('File "')]
    assert not [f for f in frames if "corpus_io" in f], frames  # the ranks' own: torchrun's report has its own
    assert not [m for m in ("third_party/gloo", "Connection closed by peer", "Timed out waiting") if m in result.stderr]


EXIT_WITH_WORKER_EVENTS = """
import os, sys
from corpus_io.loader.dataset import worker_context
from corpus_io.train.distributed import exit_now
started = [worker_context("forkserver").Event() for _ in range(2)]  # as a multi-worker loader's epoch holds them
(os._exit if sys.argv[1] == "os._exit" else exit_now)(0)
"""


def test_a_rank_that_exits_without_teardown_leaves_the_resource_tracker_no_leaked_semaphore():
    """Multi-rank train ends with os._exit (no interpreter teardown, see corpus_io.commands.leave_process_group);
    the named semaphores of its loader workers' Events and queues are then never unlinked, and the resource tracker says
    so on stderr at the end of the run. exit_now runs multiprocessing's finalizers first."""
    import subprocess

    from tests.conftest import REPO

    def stderr_of(how: str) -> str:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        result = subprocess.run([sys.executable, "-c", EXIT_WITH_WORKER_EVENTS, how], capture_output=True, text=True,
                                timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        return result.stderr  # the tracker writes before it exits: it has, once every holder of its pipe is gone

    assert "leaked semaphore" in stderr_of("os._exit")  # what every 2-rank multi-worker run risked
    assert "leaked semaphore" not in stderr_of("exit_now")
