"""DataLoader worker processes (corpus_io.loader.workers): how the forkserver starts, and what it keeps of its rank."""

from __future__ import annotations

import json
import os
import sys

import pytest

from corpus_io.tokenizer import build_tokenizer
from tests.conftest import REPO, run_bounded
from tests.loader_data import make_shards, token_list

# One process reading an epoch with 2 workers, as a rank does. argv: list, tokenizer conf, "quiet" (no other thread:
# the forkserver is forked from it) or "busy" (a thread runs: exec'd). It prints the keys of each batch, how its
# forkserver started, which of its processes catch SIGTERM (the rank's handler) and whether one held the rank's pipe.
_RANK = """
import json, os, signal, sys, threading, time
from corpus_io.config import TokenizerConf
from corpus_io.loader.dataset import build_dataloader
from corpus_io.tokenizer import build_tokenizer
from tests.loader_data import small_conf

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: None)  # as train's stop-and-save handler would
    read_end, write_end = os.pipe()  # a pipe this process writes to: its reader must see EOF once it closes it
    if sys.argv[3] == "busy":
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    tok = build_tokenizer(TokenizerConf(**json.loads(sys.argv[2])))
    loader = build_dataloader(sys.argv[1], small_conf(num_workers=2), tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    batches = iter(loader)
    keys = [list(next(batches)["keys"])]
    import psutil
    from multiprocessing import forkserver

    server = psutil.Process(forkserver._forkserver._forkserver_pid)
    workers = server.children()
    caught = []  # the server, if it catches SIGTERM: the rank's handler, which its workers would inherit (torch's
    for process in [server]:  # worker loop then sets a C handler of its own, so a worker's mask says nothing)
        with open(f"/proc/{process.pid}/status") as f:
            mask = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
        caught += [process.pid] if mask & (1 << (signal.SIGTERM - 1)) else []
    os.close(write_end)
    os.set_blocking(read_end, False)
    try:
        eof = os.read(read_end, 1) == b""
    except BlockingIOError:  # a worker or the server holds the write end
        eof = False
    print(json.dumps({"keys": keys, "server_cmdline": server.cmdline(), "server_parent": server.ppid(),
                      "me": os.getpid(), "workers": len(workers), "pipe_eof": eof, "caught": caught}),
          flush=True)
    os._exit(0)
"""


@pytest.fixture(scope="module")
def rank_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("workers")
    data_list, _ = make_shards(out, copies=2, per_shard=2)
    tok = build_tokenizer(token_list(out))
    script = out / "rank.py"
    script.write_text(_RANK)
    runs = {}
    for mode in ("quiet", "busy"):
        result = run_bounded([sys.executable, str(script), str(data_list),
                              json.dumps({"type": tok.conf.type, "token_list": tok.conf.token_list}), mode],
                             180, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[mode] = json.loads(result.stdout.strip().splitlines()[-1])
    return runs


def test_a_rank_running_no_thread_forks_its_forkserver_and_one_with_a_thread_execs_it(rank_runs):
    """Issue 53: forked, the forkserver shares the rank's torch with every worker (about 250 MB a process less);
    with another thread running (a lock it may hold) the rank's memory is not forked: a fresh interpreter serves."""
    quiet, busy = rank_runs["quiet"], rank_runs["busy"]
    assert quiet["server_parent"] == quiet["me"] and busy["server_parent"] == busy["me"]
    assert "rank.py" in " ".join(quiet["server_cmdline"]), quiet["server_cmdline"]  # this process, forked
    assert "from multiprocessing.forkserver import main" in " ".join(busy["server_cmdline"]), busy["server_cmdline"]
    assert quiet["workers"] == busy["workers"] == 2


def test_workers_of_a_forked_forkserver_read_the_batches_an_execd_one_gives(rank_runs):
    assert rank_runs["quiet"]["keys"] == rank_runs["busy"]["keys"]
    assert rank_runs["quiet"]["keys"][0]


def test_a_forked_forkserver_keeps_neither_the_ranks_signal_handlers_nor_its_open_files(rank_runs):
    """A worker told to stop (SIGTERM) must not run the rank's handler (a checkpoint save, in a worker), and a pipe
    the rank closes must not stay open in its server or workers (a reader waiting for EOF would wait forever)."""
    for mode, run in rank_runs.items():
        assert run["caught"] == [], mode
        assert run["pipe_eof"], mode
