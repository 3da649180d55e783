"""bench-loader as the partition and resume test: real torchrun (gloo, CPU), real worker processes, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, assert_user_error, free_port, run_bounded, run_cli
from tests.loader_data import env_no_threads, make_shards, token_list

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_loader")
    data_list, keys = make_shards(out, copies=2, per_shard=3)  # 48 utterances, 16 shards
    tok = token_list(out)
    return data_list, keys, tok.token_list


def overrides(data_list: Path, tokens: str, *extra: str) -> list[str]:
    return [f"++data_list={data_list}", f"++tokenizer.token_list={tokens}", "++dataset_conf.batch_size=4",
            "++dataset_conf.shuffle_conf.shuffle_size=8", "++dataset_conf.sort_conf.sort_size=4", *extra]


def torchrun(data_list: Path, tokens: str, dump: Path) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={free_port()}", "--no-python",
           str(BIN / "corpus-io"), "bench-loader",
           *overrides(data_list, tokens, f"++dump_keys={dump}", "++epochs=2", "++dataset_conf.num_workers=2")]
    result = run_bounded(cmd, 240, env=env_no_threads())
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def read_keys(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split()


def test_torchrun_two_ranks_every_key_once_per_epoch_new_order_each_epoch_same_seed_same_order(corpus, tmp_path):
    data_list, keys, tokens = corpus
    torchrun(data_list, tokens, tmp_path / "a")
    orders = {}
    for epoch in range(2):
        per_rank = [read_keys(tmp_path / "a" / f"keys.rank{r}.epoch{epoch}.txt") for r in range(2)]
        assert all(per_rank), "a rank got no data"
        merged = per_rank[0] + per_rank[1]
        assert sorted(merged) == sorted(keys), f"epoch {epoch}: not every key exactly once"
        orders[epoch] = per_rank
    assert orders[0] != orders[1]
    torchrun(data_list, tokens, tmp_path / "b")
    for epoch in range(2):
        for r in range(2):
            assert read_keys(tmp_path / "b" / f"keys.rank{r}.epoch{epoch}.txt") == orders[epoch][r]


def test_kill_9_after_saving_state_then_resume_is_exact(corpus, tmp_path):
    data_list, keys, tokens = corpus
    state, dump = tmp_path / "state.json", tmp_path / "keys"
    cmd = [str(BIN / "corpus-io"), "bench-loader",
           *overrides(data_list, tokens, f"++dump_keys={dump}", "++dataset_conf.num_workers=2",
                      "++save_state_after=3", f"++state_file={state}")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env_no_threads(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert state.exists(), proc.communicate()[1].decode()
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    before = read_keys(dump / "keys.rank0.epoch0.txt")
    assert len(before) == 12  # 3 batches of 4

    mismatch = run_cli("corpus-io", "bench-loader", *overrides(data_list, tokens, f"++state_file={state}",
                                                               "++dataset_conf.num_workers=1"))
    assert_user_error(mismatch, "num_workers")

    resumed = run_cli("corpus-io", "bench-loader", *overrides(data_list, tokens, f"++dump_keys={dump}",
                                                              "++dataset_conf.num_workers=2",
                                                              f"++state_file={state}"))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming epoch 0 after 3 batches" in resumed.stdout
    everything = read_keys(dump / "keys.rank0.epoch0.txt")
    assert everything[:12] == before
    assert sorted(everything) == sorted(keys)  # none twice, none missing
    assert "resume.reread" in resumed.stdout or "dropped: none" in resumed.stdout
