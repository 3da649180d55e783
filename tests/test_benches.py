"""Benches that cannot rot: every ``bench/bench_*.py`` imports on the landed code, and the helpers that read the
formats the code writes (the index's ``file`` field) run on a tiny real corpus."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from tests.conftest import REPO

BENCHES = sorted(m.name for m in pkgutil.iter_modules([str(REPO / "bench")]) if m.name.startswith("bench_"))


@pytest.mark.parametrize("name", BENCHES)
def test_every_bench_imports_and_has_a_main(name):
    module = importlib.import_module(f"bench.{name}")
    assert callable(getattr(module, "main", None)), name


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


@pytest.mark.parametrize("name", ["batching", "segments", "scoring"])
def test_the_second_long_benches_run_to_the_end(name):
    """The benches small enough to run whole in the suite (seconds each) do, so a format change that breaks
    them fails here; the corpus-sized ones (loader, pack, frontend, ...) run with `make bench`."""
    import os
    import sys

    from tests.conftest import run_bounded

    result = run_bounded([sys.executable, "-m", "bench", name], 240,
                         env=dict(os.environ, OMP_NUM_THREADS="1", CORPUS_IO_NO_PROGRESS="1"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert f"===== bench_{name} done in" in result.stdout
