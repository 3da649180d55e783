"""Benches that cannot rot: every ``bench/bench_*.py`` runs to the end on the landed code in smoke mode (a tiny
real corpus, one round: ``python -m bench --smoke``), so a format change that breaks a bench fails here."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_names
from tests.conftest import REPO, one_at_a_time, run_bounded


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory) -> Path:
    """One BENCH_OUT for every bench here, as bench/out is for a full run: the tiny espeak corpus each builds
    (bench.common.real_corpus, cached under it) is synthesised once, not once per bench."""
    return tmp_path_factory.mktemp("bench-out")


# bench_gpu runs below as a user runs it without a GPU (no --smoke): its sizes must be the smoke ones there
@pytest.mark.parametrize("name", [n.removeprefix("bench_") for n in bench_names() if n != "bench_gpu"])
@pytest.mark.slow
def test_every_bench_runs_to_the_end_in_smoke_mode(name, bench_out, tmp_path_factory):
    env = dict(os.environ, OMP_NUM_THREADS="1", CORPUS_IO_NO_PROGRESS="1", BENCH_OUT=str(bench_out))
    # bench_install runs python -m build in the checkout, as tests/test_packaging.py's wheel fixture does
    with one_at_a_time(tmp_path_factory, "build-in-tree") if name == "install" else contextlib.nullcontext():
        result = run_bounded([sys.executable, "-m", "bench", "--smoke", name], 300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "smoke mode: figures are not measurements" in result.stdout
    assert f"===== bench_{name} done in" in result.stdout


@pytest.mark.slow
def test_bench_gpu_without_cuda_runs_the_smoke_sizes_to_the_end(bench_out):
    """`make bench BENCH=gpu` on a machine without CUDA: the CPU figures measure nothing about a GPU, so the run
    takes the smoke sizes (48 utterances, 2 workers), not 8,000 utterances and 8 workers for minutes."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CORPUS_IO_NO_PROGRESS="1", BENCH_OUT=str(bench_out),
               CUDA_VISIBLE_DEVICES="")
    env.pop("BENCH_SMOKE", None)
    result = run_bounded([sys.executable, "-m", "bench", "gpu"], 300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "no GPU was seen" in result.stdout
    assert "48 utterances, length batches of 3000 frames, 2 workers" in result.stdout, result.stdout[-2000:]
    assert "===== bench_gpu done in" in result.stdout


def test_a_smoke_run_keeps_its_corpus_out_of_bench_out_and_removes_it():
    """A tiny corpus left in bench/out would be reused by the next full run as if it were the real one."""
    env = {k: v for k, v in os.environ.items() if k != "BENCH_OUT"} | {"BENCH_SMOKE": "1"}
    code = "from bench.common import OUT; (OUT / 'corpus48').mkdir(); print(OUT)"
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    out = Path(result.stdout.strip())
    assert REPO / "bench" / "out" not in [out, *out.parents] and not out.exists()


def test_bench_loader_subsets_a_packed_list_with_its_index(tmp_path):
    """bench_loader stopped with KeyError 'path' once the index stored shards as 'file'."""
    import json

    from bench.bench_loader import subset_list
    from corpus_io.shards.index import index_path_for, load_index, write_index
    from tests.loader_data import make_raw, make_shards

    data_list, _ = make_shards(tmp_path / "shards", per_shard=4)
    index = load_index(data_list)
    write_index(index_path_for(data_list), index.values())  # as pack-shards stores it: 'file', relative
    assert all("file" in json.loads(line) for line in index_path_for(data_list).read_text().splitlines())
    raw, _ = make_raw(tmp_path / "raw")
    sub, rsub = subset_list(data_list, raw, 1000)
    urls = sub.read_text().split()
    assert urls == data_list.read_text().split()[:1]
    assert list(load_index(sub)) == urls and len(rsub.read_text().splitlines()) == 24
