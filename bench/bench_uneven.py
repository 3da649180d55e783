"""The cost of equal steps per rank (issue 26): the API's loader with ``uneven='stop'`` (one all-reduce per
batch, the default of ``corpus_io.build_loader``) vs ``uneven='allow'`` (none), side by side under
``torchrun --nproc_per_node=2`` (gloo, CPU) on the fixture corpus packed into shards of 3, 4 epochs each,
alternating. Prints the time per batch of each mode, their ratio, and the cost of one all-reduce alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import BIN, sized

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "corpus"
ROUNDS = sized(3, 1)
EPOCHS = sized(4, 1)
ALLREDUCES = sized(1000, 10)  # timed one after another: the cost of one


def child(data_list: str, tokens: str, out: str) -> None:
    import torch.distributed as dist

    import corpus_io
    from corpus_io.loader.partition import ranks_with_data

    dist.init_process_group("gloo")
    conf = {"train_data_set_list": data_list, "tokenizer": {"token_list": tokens},
            "dataset_conf": {"batch_size": 2, "num_workers": 0}}
    seconds = {"stop": 0.0, "allow": 0.0}
    batches = {"stop": 0, "allow": 0}
    for _ in range(ROUNDS):
        for mode in ("allow", "stop"):
            loader = corpus_io.build_loader(conf, uneven=mode)
            dist.barrier()
            start = time.perf_counter()
            for epoch in range(EPOCHS):
                loader.set_epoch(epoch)
                batches[mode] += sum(1 for _ in loader)
            dist.barrier()
            seconds[mode] += time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(ALLREDUCES):
        ranks_with_data(True)
    allreduce = (time.perf_counter() - start) / ALLREDUCES
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"seconds": seconds, "batches": batches, "allreduce_s": allreduce}))
    dist.destroy_process_group()


def main() -> None:
    import corpus_io

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        jsonl = root / "train.jsonl"
        corpus_io.scp2jsonl([FIXTURE / "wav.scp", FIXTURE / "text"], jsonl)
        data_list = corpus_io.pack_shards(jsonl, root / "shards", num_utts_per_shard=3)
        corpus_io.make_tokenizer(jsonl, root / "tokens.txt")
        out = root / "result.json"
        repo = Path(__file__).resolve().parent.parent
        env = dict(os.environ, OMP_NUM_THREADS="1", CORPUS_IO_NO_PROGRESS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
        with socket.socket() as s:  # a free port: other jobs may run beside the bench
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        subprocess.run([str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={port}", "-m",
                        "bench.bench_uneven", data_list, str(root / "tokens.txt"), str(out)],
                       check=True, env=env, cwd=repo)
        result = json.loads(out.read_text())
    per_batch = {m: result["seconds"][m] / max(1, result["batches"][m]) for m in ("allow", "stop")}
    print(f"loader, 2 ranks (gloo, CPU), {result['batches']['stop']} batches per mode on rank 0: "
          f"allow {1e3 * per_batch['allow']:.2f} ms/batch, stop {1e3 * per_batch['stop']:.2f} ms/batch, "
          f"stop/allow {per_batch['stop'] / per_batch['allow']:.3f}; one all-reduce alone "
          f"{1e3 * result['allreduce_s']:.3f} ms", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        child(*sys.argv[1:])
    else:
        main()
