"""Where the trainer's numbers go: :class:`Meter` sums a log interval, an epoch or a validation pass and
reduces itself across ranks (icefall's ``MetricsTracker`` is the model); :class:`Board` is the one place
that writes TensorBoard; :class:`RankLog` writes the log lines."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from corpus_io.storage.files import ensure_dir

TIMES = ("data_load", "forward_time", "backward_time", "optim_time", "total_time")


@dataclass
class Meter:
    """Sums over a log interval, an epoch or a validation pass (times in seconds)."""

    steps: int = 0
    utts: int = 0
    loss_sum: float = 0.0  # sum of per-batch mean loss * utts
    errors: int = 0
    tokens: int = 0
    padding: float = 0.0
    batches: int = 0
    audio_seconds: float = 0.0
    real_frames: float = 0.0  # rows' own lengths (frames, or samples for a waveform batch)
    padded_frames: float = 0.0  # rows x the padded length
    times: dict = field(default_factory=lambda: dict.fromkeys(TIMES, 0.0))
    start: float = field(default_factory=time.perf_counter)
    widths: set = field(default_factory=set)  # this rank's distinct padded lengths (not reduced: gathered)

    def add_batch(self, out: dict, batch: dict, data_load: float) -> None:
        """A trained micro-batch: ``out`` is :func:`corpus_io.train.steps.micro_step`'s result."""
        self.add_scored(out["loss"], out["utts"], out["errors"], out["tokens"])
        self.padding += float(batch.get("padding_ratio", 0.0))
        self.batches += 1
        self.audio_seconds += float(batch.get("audio_seconds", 0.0))
        if "wav" in batch or "feats" in batch:
            from corpus_io.loader.batching import batch_shape

            width, real, padded = batch_shape(batch)
            self.widths.add(width)
            self.real_frames += real
            self.padded_frames += padded
        self.times["data_load"] += data_load
        self.times["forward_time"] += out["forward_time"]
        self.times["backward_time"] += out["backward_time"]

    def add_scored(self, loss: float, utts: int, errors: int, tokens: int) -> None:
        """A batch's mean loss over ``utts`` utterances and its greedy token errors."""
        self.utts += utts
        self.loss_sum += loss * utts
        self.errors += errors
        self.tokens += tokens

    def reduced(self, ctx: Any) -> Meter:
        """The sums of every rank (a collective: every rank calls it); ``start`` stays this rank's."""
        from corpus_io.train.distributed import all_reduce_sum

        names = [f.name for f in fields(self) if f.name not in ("times", "start", "widths")]
        values = all_reduce_sum(ctx, [float(getattr(self, n)) for n in names] + [self.times[k] for k in TIMES])
        out = Meter(start=self.start)
        for name, value in zip(names, values):
            setattr(out, name, type(getattr(self, name))(value))
        out.times = dict(zip(TIMES, values[len(names):]))
        return out

    @property
    def loss(self) -> float:
        return self.loss_sum / self.utts if self.utts else float("nan")

    @property
    def acc(self) -> float | None:
        """1 - token error rate of the greedy path; None when no tokens were scored."""
        return max(0.0, 1.0 - self.errors / self.tokens) if self.tokens else None

    @property
    def wall(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)


class Board:
    """TensorBoard scalars in ``output_dir/tensorboard`` (rank 0; a no-op on other ranks)."""

    def __init__(self, output_dir: Path, enabled: bool) -> None:
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(output_dir / "tensorboard"))

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """Write ``{"group/name": value}`` at ``step``; None values are left out."""
        if self.writer is None:
            return
        for tag, value in values.items():
            if value is not None:
                self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def memory_mb(device: torch.device) -> str:
    """This process's memory for the log line: CUDA peak allocated, else resident set size."""
    if device.type == "cuda":
        return f"cuda_max_alloc: {torch.cuda.max_memory_allocated(device) / 2**20:.0f}MB"
    try:
        with open("/proc/self/statm") as f:
            rss_pages = int(f.read().split()[1])
        return f"rss: {rss_pages * os.sysconf('SC_PAGE_SIZE') / 2**20:.0f}MB"
    except (OSError, ValueError):
        import resource

        return f"max_rss: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}MB"


class RankLog:
    """Log lines to stderr and to ``output_dir/log/train.rank{R}.log`` (rank 0 also to ``train.log``)."""

    def __init__(self, output_dir: Path, rank: int) -> None:
        ensure_dir(output_dir / "log")
        self.rank = rank
        self.file = open(output_dir / "log" / f"train.rank{rank}.log", "a", encoding="utf-8")
        self.main = open(output_dir / "train.log", "a", encoding="utf-8") if rank == 0 else None

    def __call__(self, msg: str, *, all_ranks: bool = True) -> None:
        if not all_ranks and self.rank != 0:
            return
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] [rank {self.rank}] {msg}"
        print(line, file=sys.stderr, flush=True)
        self.file.write(line + "\n")
        self.file.flush()
        if self.main is not None:
            self.main.write(line + "\n")
            self.main.flush()

    def close(self) -> None:
        self.file.close()
        if self.main is not None:
            self.main.close()
