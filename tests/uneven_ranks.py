"""Ranks that hold unequal data, trained for several epochs with the plain loop docs/API.md shows: the loader
built by ``corpus_io.build_loader`` (``uneven='stop'``, its default), ``for batch in loader:``. Each rank is a real
process in one gloo group (no torchrun agent: the launcher below starts them as torchrun would), and writes the
keys it got in each epoch; tests/loader/test_dataset.py reads them.

    python tests/uneven_ranks.py SPEC.json        # launches spec["world_size"] ranks and waits for them

SPEC: ``world_size`` and ``runs``, run one after the other by the same ranks, each with ``data_list``, ``tokens``,
``dataset_conf`` (overrides of the defaults), ``epochs``, ``out`` (a directory); ``save_after``: ``[epoch,
batches]``: every rank's ``state_dict()`` after that many batches of that epoch goes to ``out/states.json`` and
the run ends there; ``resume``: start from ``out/states.json`` (``load_rank_states``, as ``train`` does). Output:
``out/rank{R}.epoch{E}.json`` = ``{"keys": [...], "counts": loader.epoch_counts(), "widths": [padded length of
each batch]}`` (a resumed epoch appends its keys and widths to the interrupted one's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def one_run(run: dict) -> None:
    import torch.distributed as dist

    import corpus_io

    rank = dist.get_rank()
    out = Path(run["out"])
    loader = corpus_io.build_loader({"train_data_set_list": run["data_list"],
                                     "tokenizer": {"token_list": run["tokens"]},
                                     "dataset_conf": run.get("dataset_conf", {})})
    first = 0
    if run.get("resume"):
        loader.load_rank_states(json.loads((out / "states.json").read_text()))
        first = loader.epoch
    for epoch in range(first, run["epochs"]):
        loader.set_epoch(epoch)
        path = out / f"rank{rank}.epoch{epoch}.json"
        before = json.loads(path.read_text()) if run.get("resume") and epoch == first else {}
        keys, widths = before.get("keys", []), before.get("widths", [])
        for n, batch in enumerate(loader, 1):
            keys += batch["keys"]
            widths.append(int(batch["feats"].shape[1]))
            if [epoch, n] == run.get("save_after"):
                states = [None] * dist.get_world_size()
                dist.all_gather_object(states, loader.state_dict())
                path.write_text(json.dumps({"keys": keys, "counts": loader.epoch_counts(), "widths": widths}))
                if rank == 0:
                    (out / "states.json").write_text(json.dumps(states))
                return
        path.write_text(json.dumps({"keys": keys, "counts": loader.epoch_counts(), "widths": widths}))


def launch(spec_path: str) -> int:
    """Start every rank of the spec on this host (RANK, WORLD_SIZE, MASTER_ADDR/PORT, as torchrun sets them)."""
    import socket

    spec = json.loads(Path(spec_path).read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(spec["world_size"]):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(spec["world_size"]),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, spec_path, "--rank"], env=env))
    codes = [p.wait() for p in procs]
    return max(codes, key=abs)


def main() -> None:
    import torch.distributed as dist

    spec = json.loads(Path(sys.argv[1]).read_text())
    dist.init_process_group("gloo")
    for run in spec["runs"]:
        one_run(run)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "--rank" in sys.argv:
        main()
    else:
        sys.exit(launch(sys.argv[1]))
