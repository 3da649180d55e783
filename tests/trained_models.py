"""Shared by the model, training and inference tests: real shards/raw lists from the espeak fixture corpus, real
torchrun, and the trained models (each built once per session, see tests.conftest.built_once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import built_once, run_bounded
from tests.loader_data import make_raw, make_shards, token_list

BIN = Path(sys.executable).parent


def torchrun_cmd(output_dir: Path, corpus: dict, *overrides: str, nproc: int = 2, max_restarts: int = 0) -> list[str]:
    """``torchrun --standalone --nproc_per_node=N --no-python corpus-io train`` with a tiny, fast config."""
    return [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", f"--max-restarts={max_restarts}",
            "--no-python", str(BIN / "corpus-io"), "train",
            f"++train_data_set_list={corpus['shards']}", f"++output_dir={output_dir}",
            f"++tokenizer.token_list={corpus['tokens']}",
            "++dataset_conf.num_workers=0", "++dataset_conf.batch_size=4",
            "++dataset_conf.shuffle_conf.shuffle_size=8", "++dataset_conf.sort_conf.sort_size=4",
            "++dataset_conf.filter_conf.token_min_length=0",
            "++scheduler_conf.warmup_steps=4", "++train_conf.log_interval=1", "++train_conf.grad_clip=5",
            *overrides]


def run_train(cmd: list[str], timeout: float = 150,
              cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    return run_bounded(cmd, timeout, env=env, cwd=cwd)


@pytest.fixture
def one_process(monkeypatch):
    """``train`` called in this process: no torchrun variables, one torch thread (restored after)."""
    import torch

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict:
    """48 real utterances in 3 shards of 16 (uneven over 2 ranks), a raw list of 24, a char token list."""
    def build(root: Path) -> dict:
        shards, keys = make_shards(root / "shards", copies=2, per_shard=16)
        raw, raw_keys = make_raw(root / "raw")
        return {"root": str(root), "shards": str(shards), "keys": keys, "raw": str(raw), "raw_keys": raw_keys,
                "tokens": token_list(root).token_list}

    built = built_once(tmp_path_factory, "train_corpus", build)
    return {**built, **{k: Path(built[k]) for k in ("root", "shards", "raw")}}


@pytest.fixture(scope="session")
def trained(corpus, tmp_path_factory) -> dict:
    """One 2-rank gloo training run (3 epochs, cv set, per-step checkpoints) shared by several tests."""
    def build(root: Path) -> dict:
        out = root / "exp"
        cmd = torchrun_cmd(out, corpus, f"++valid_data_set_list={corpus['shards']}",
                           "++train_conf.max_epoch=3", "++train_conf.accum_grad=2", "++dataset_conf.batch_size=3",
                           "++train_conf.keep_nbest_models=2", "++train_conf.avg_nbest_model=2",
                           "++train_conf.save_checkpoint_interval=2", "++train_conf.dump_trained_keys=true",
                           "++optim_conf.lr=0.002")
        result = run_train(cmd)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
        return {"out": str(out), "cmd": cmd, "stdout": result.stdout, "stderr": result.stderr}

    built = built_once(tmp_path_factory, "trained", build)
    result = subprocess.CompletedProcess(built["cmd"], 0, built["stdout"], built["stderr"])
    return {"out": Path(built["out"]), "result": result, "cmd": built["cmd"]}


@pytest.fixture(scope="session")
def streaming_trained(corpus, tmp_path_factory) -> dict:
    """A streaming model (model.causal, model.use_dynamic_chunk) trained on 2 ranks with a cv set, default
    bucketing and features on the model device (3 epochs): its output_dir (model.pt.avg2) and torchrun's result."""
    def build(root: Path) -> dict:
        out = root / "exp"
        cmd = torchrun_cmd(out, corpus, f"++valid_data_set_list={corpus['shards']}", "++dataset_conf.feats_on=model",
                           "++dataset_conf.spec_aug=true", "++dataset_conf.spec_aug_conf.max_t=10",
                           "++dataset_conf.num_workers=1", "++train_conf.max_epoch=3", "++dataset_conf.batch_size=3",
                           "++train_conf.avg_nbest_model=2", "++optim_conf.lr=0.002", "++model.causal=true",
                           "++model.use_dynamic_chunk=true", "++model.use_dynamic_left_chunk=true")
        result = run_train(cmd)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
        assert "leaked semaphore" not in result.stderr, result.stderr[-3000:]  # 2 ranks x 1 worker, then os._exit
        return {"out": str(out), "stdout": result.stdout, "stderr": result.stderr}

    built = built_once(tmp_path_factory, "streaming_trained", build)
    return {**built, "out": Path(built["out"])}


@pytest.fixture(scope="session")
def one_step_run(corpus, tmp_path_factory) -> dict:
    """One process, one step, no cv set, run from the token list's directory with the token list named relative
    to it, averaging by a metric no epoch records (``acc``): its output_dir (model.pt.ep0) and its result. For a
    checkpoint whose token list is relative, and for a run that has nothing to average by."""
    def build(root: Path) -> dict:
        out = root / "exp"
        tokens = str(corpus["tokens"])
        cmd = torchrun_cmd(out, corpus, "++train_conf.max_epoch=1", "++train_conf.max_steps_per_epoch=1",
                           "++train_conf.log_interval=1000", "++train_conf.avg_keep_nbest_models_type=acc",
                           f"++tokenizer.token_list={os.path.basename(tokens)}")
        result = run_train(cmd[cmd.index("--no-python") + 1:], cwd=os.path.dirname(tokens))
        return {"out": str(out), "returncode": result.returncode, "stderr": result.stderr}

    built = built_once(tmp_path_factory, "one_step_run", build)
    return {**built, "out": Path(built["out"])}
