"""A plain DDP training loop written only against corpus_io's documented API (no corpus_io.train, no
corpus_io.loader.dataset): ``for batch in loader:``, a checkpoint every 2 steps holding the model, the optimizer and
every rank's loader state, and resume from it. tests/test_api.py runs it under torchrun, kills it mid-epoch
(``--crash-at-step``: rank 0 SIGKILLs itself), runs it again, and checks the keys each rank trained.

Usage: torchrun --nproc_per_node=2 tests/ddp_loop.py DATA_LIST TOKENS CMVN OUT [--crash-at-step N]
       [--uneven-list LIST]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import corpus_io

EPOCHS = 2
SAVE_EVERY = 2


def loader_conf(data_list: str, tokens: str) -> dict:
    return {"train_data_set_list": data_list, "tokenizer": {"token_list": tokens},
            "dataset_conf": {"batch_size": 2, "num_workers": 1, "shuffle_conf": {"shuffle_size": 4},
                             "sort_conf": {"sort_size": 2}}}


def save(path: Path, model, optimizer, loader, epoch: int, step: int, trained: list[str]) -> None:
    """Collective: every rank's loader state and trained keys; rank 0 writes one file, atomically."""
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, {"loader": loader.state_dict(), "trained": trained})
    if dist.get_rank() == 0:
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step,
                    "loaders": [r["loader"] for r in per_rank], "trained": [r["trained"] for r in per_rank]}, tmp)
        os.replace(tmp, path)
    dist.barrier()


def train(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    out = Path(args.out)
    loader = corpus_io.build_loader(loader_conf(args.data_list, args.tokens))
    tokenizer = corpus_io.build_tokenizer(args.tokens)
    cmvn = corpus_io.load_cmvn(args.cmvn)
    torch.manual_seed(0)
    model = torch.nn.Linear(cmvn.dim, tokenizer.vocab_size)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ctc = torch.nn.CTCLoss(blank=0, zero_infinity=True)
    checkpoint = out / "checkpoint.pt"
    first_epoch, step, trained = 0, 0, []
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch, step, trained = state["epoch"], state["step"], state["trained"][rank]
        loader.load_state_dict(state["loaders"][rank])
        print(f"rank {rank}: resumed epoch {first_epoch} at step {step}", flush=True)
    for epoch in range(first_epoch, EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            feats = cmvn(batch["feats"])
            log_probs = ddp(feats).log_softmax(-1).transpose(0, 1)
            loss = ctc(log_probs, batch["target"].clamp(min=0), batch["feats_lengths"], batch["target_lengths"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            trained.extend(batch["keys"])
            if step % SAVE_EVERY == 0:
                save(checkpoint, model, optimizer, loader, epoch, step, trained)
            if step == args.crash_at_step and rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, one step after a checkpoint
        steps = [None] * dist.get_world_size()
        dist.all_gather_object(steps, step)
        (out / f"trained.rank{rank}.epoch{epoch}.json").write_text(json.dumps(
            {"keys": trained, "steps_of_every_rank": steps, "counts": loader.epoch_counts()}))
        step, trained = 0, []
        save(checkpoint, model, optimizer, loader, epoch + 1, 0, [])


def uneven(args: argparse.Namespace) -> None:
    """The three ``uneven`` modes on a list that gives the ranks different batch counts."""
    conf = loader_conf(args.uneven_list, args.tokens)
    report = {}
    for mode in ("stop", "allow", "error"):
        loader = corpus_io.build_loader(conf, uneven=None if mode == "stop" else mode)  # stop: the default
        loader.set_epoch(0)
        batches, error, sizes = 0, None, []
        try:
            for batch in loader:
                batches += 1
                sizes.append(len(batch["keys"]))
        except corpus_io.DataError as exc:
            error = str(exc)
        report[mode] = {"batches": batches, "error": error, "counts": loader.epoch_counts(), "sizes": sizes}
    Path(args.out, f"uneven.rank{dist.get_rank()}.json").write_text(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("data_list", "tokens", "cmvn", "out"):
        parser.add_argument(name)
    parser.add_argument("--crash-at-step", type=int, default=0)
    parser.add_argument("--uneven-list")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    train(args)
    if args.uneven_list:
        uneven(args)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
