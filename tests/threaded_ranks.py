"""A rank as training has it when it starts its cv loader: 2 gloo ranks in a real process group, rank 0's
TensorBoard writer writing from another thread, and a train loader in the middle of its epoch (its index
queue's feeder thread alive), and with ``--draw`` a thread drawing from torch's CPU generator, as augmentation
in a helper thread would (a fork taken while it holds the generator's lock leaves that lock held forever in the
child, whose DataLoader worker seeds torch before anything else). Each rank then starts its cv loader
(``feats_on=model``, one worker) ``EPOCHS`` times, all-reducing what it read after each, as the trainer's
validation does. tests/loader/test_dataset.py runs it under torchrun; a worker that never starts would stop it
(worker_start_timeout) or hang it (its faulthandler dumps every thread's stack after ``--hang-s``).

Usage: torchrun --nproc_per_node=2 tests/threaded_ranks.py TRAIN_LIST CV_LIST TOKENS TB_DIR EPOCHS [--hang-s S]
       [--start-method fork|forkserver|spawn] [--draw]
"""

from __future__ import annotations

import argparse
import faulthandler
import threading

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

from corpus_io.config import TokenizerConf
from corpus_io.loader.dataset import build_dataloader
from corpus_io.model.cmvn import eval_dataset_conf
from corpus_io.tokenizer import build_tokenizer
from tests.loader_data import small_conf


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("train_list", "cv_list", "tokens", "tb_dir"):
        parser.add_argument(name)
    parser.add_argument("epochs", type=int)
    parser.add_argument("--hang-s", type=float, default=120.0)
    parser.add_argument("--start-method", default=None)
    parser.add_argument("--draw", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    tok = build_tokenizer(TokenizerConf(type="char", token_list=args.tokens))
    overrides = {"worker_start_method": args.start_method} if args.start_method else {}
    conf = small_conf(num_workers=1, feats_on="model", batch_size=1, prefetch=2, **overrides)
    train = build_dataloader(args.train_list, conf, tok, train=True)
    cv = build_dataloader(args.cv_list, eval_dataset_conf(conf), tok, train=False)
    writing = threading.Event()
    stop = threading.Event()

    def board() -> None:  # what the trainer's Board does, without pause: the writer thread always has work
        writer = SummaryWriter(args.tb_dir) if rank == 0 else None
        step = 0
        while not stop.is_set():
            if writer is not None:
                writer.add_scalar("loss", float(step), step)
                if step % 20 == 0:
                    writer.flush()
            step += 1
            writing.set()
            stop.wait(0.01)
        if writer is not None:
            writer.close()

    def draw() -> None:  # about half the time inside torch's CPU generator, holding its lock
        while not stop.is_set():
            torch.randn(2_000_000)
            stop.wait(0.01)

    threads = [threading.Thread(target=board, daemon=True)]
    if args.draw:
        threads.append(threading.Thread(target=draw, daemon=True))
    for thread in threads:
        thread.start()
    writing.wait()
    batches = iter(train)
    next(batches)  # the train loader holds its worker and index queue (and the queue's feeder thread) from here
    for epoch in range(args.epochs):
        faulthandler.dump_traceback_later(args.hang_s, exit=True)
        utts = sum(len(batch["keys"]) for batch in cv)
        total = torch.tensor([utts])
        dist.all_reduce(total)
        if next(batches, None) is None:  # keep a train epoch in flight, as between the trainer's steps
            train.set_epoch(epoch + 1)
            batches = iter(train)
            next(batches)
    faulthandler.cancel_dump_traceback_later()
    stop.set()
    for thread in threads:
        thread.join()
    print(f"rank {rank}: started the cv loader {args.epochs} times, {utts} utterances each", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
