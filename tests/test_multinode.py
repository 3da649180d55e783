"""Two torchrun "nodes" on loopback (--nnodes 2, --node_rank 0|1, 2 processes each, gloo on CPU): the loader
partitions exactly once per epoch over 4 ranks, a short train ends without a hang, and a 2 x 2 train killed
mid-epoch resumes as 1 node x 2 processes with every key trained once."""

from __future__ import annotations

import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import BIN, free_port, run_bounded
from tests.loader_data import env_no_threads, make_shards, token_list
from tests.trained_models import torchrun_cmd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("multinode")
    shards, keys = make_shards(root / "shards", copies=2, per_shard=3)  # 48 utterances, 16 shards
    # the same 48 in 5 uneven shards: over 4 ranks, some run out first and the others leave data unused
    uneven, _ = make_shards(root / "uneven", copies=2, sizes=[2, 5, 9, 14, 18])
    return {"shards": shards, "keys": keys, "tokens": token_list(root).token_list, "uneven": uneven}


def two_nodes(args: list[str], timeout: float = 400) -> list:
    """Run ``torchrun <node args> <args>`` as node 0 and node 1 at once; both CompletedProcess results."""
    port = free_port()

    def node(rank: int):
        cmd = [str(BIN / "torchrun"), "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=2",
               "--master_addr=127.0.0.1", f"--master_port={port}", "--max-restarts=0", *args]
        return run_bounded(cmd, timeout, env=env_no_threads())

    with ThreadPoolExecutor(2) as pool:
        return [f.result() for f in [pool.submit(node, 0), pool.submit(node, 1)]]


def lines(out: Path, pattern: str) -> Counter:
    counts: Counter = Counter()
    for path in out.glob(pattern):
        counts.update(tuple(line.split(" ", 1)) for line in path.read_text(encoding="utf-8").splitlines())
    return counts


def test_bench_loader_on_two_nodes_reads_every_key_once_per_epoch(corpus, tmp_path):
    dump = tmp_path / "keys"
    results = two_nodes(["--no-python", str(BIN / "corpus-io"), "bench-loader", f"++data_list={corpus['shards']}",
                         f"++tokenizer.token_list={corpus['tokens']}", f"++dump_keys={dump}", "++epochs=2",
                         "++dataset_conf.batch_size=4", "++dataset_conf.num_workers=1"])
    assert all(r.returncode == 0 for r in results), [r.stderr[-3000:] for r in results]
    for epoch in range(2):
        per_rank = [(dump / f"keys.rank{r}.epoch{epoch}.txt").read_text(encoding="utf-8").split() for r in range(4)]
        assert all(per_rank), f"epoch {epoch}: a rank got no data"
        assert sorted(k for keys in per_rank for k in keys) == sorted(corpus["keys"]), f"epoch {epoch}"


def train_args(out: Path, corpus: dict, *extra: str) -> list[str]:
    cmd = torchrun_cmd(out, corpus, "++model.num_blocks=1", "++train_conf.avg_nbest_model=0",
                       "++dataset_conf.batch_size=2", *extra)
    return cmd[cmd.index("--no-python"):]


def test_a_short_train_on_two_nodes_ends_without_a_hang(corpus, tmp_path):
    out = tmp_path / "exp"
    results = two_nodes(train_args(out, dict(corpus, shards=corpus["uneven"]), "++train_conf.max_epoch=1"))
    assert all(r.returncode == 0 for r in results), [r.stderr[-3000:] for r in results]
    log = (out / "train.log").read_text(encoding="utf-8")
    assert "world_size 4" in log and log.count("training finished") == 1
    done = re.search(r"epoch 0 done .*?: \d+ steps, (\d+) utts trained on 4 ranks.*left unused when the epoch "
                     r"ended: (.*?) \(unused share", log)
    assert done, log
    # the ranks that still had data counted what they left from their loader state, without reading it
    unused = sum(int(n) for n in re.findall(r"(\d+) utts", done.group(2)))
    assert int(done.group(1)) + unused == len(corpus["keys"]), log
    assert unused > 0 and re.search(r"rank \d: [1-9]\d* utts", done.group(2)), log  # no batch count: not read


def test_a_two_node_train_killed_mid_epoch_resumes_on_one_node_and_trains_each_key_once(corpus, tmp_path):
    out = tmp_path / "exp"
    common = ("++train_conf.max_epoch=1", "++train_conf.save_checkpoint_interval=2",
              "++train_conf.dump_trained_keys=true")
    crashed = two_nodes(train_args(out, corpus, *common, "++train_conf.debug_fail_at_step=3"))
    assert any(r.returncode != 0 for r in crashed)
    assert (out / "model.pt.ep0.2").is_file() and not (out / "model.pt.ep0").exists()
    resumed = run_bounded([str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", "--max-restarts=0",
                           *train_args(out, corpus, *common)], 400, env=env_no_threads())
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    log = (out / "train.log").read_text(encoding="utf-8")
    assert "loader state of 4 ranks x 1 workers re-split over 2 ranks x 1 workers" in log, log
    trained, unused = lines(out, "trained_keys.rank*.txt"), lines(out, "unused_keys.rank*.txt")
    assert max(trained.values()) == 1, [k for k, n in trained.items() if n > 1]
    assert sorted([k for _, k in trained] + [k for _, k in unused]) == sorted(corpus["keys"])
