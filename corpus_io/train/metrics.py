"""Where the trainer's numbers go: :class:`Meter` sums a log interval, an epoch or a validation pass and
reduces itself across ranks (icefall's ``MetricsTracker`` is the model); :class:`Board` is the one place
that writes TensorBoard; :class:`RankLog` writes the log lines; :func:`interval_report` and :func:`epoch_report`
make a log interval's and an epoch's line and scalars."""

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


def step_spread(per_rank: list[list[float]]) -> float:
    """How far the ranks' audio per step spreads: for each step every rank took, (max - min) / mean of the ranks'
    audio seconds; the median over the steps (0 with one rank). Synchronised buckets keep it small."""
    import statistics

    steps = min((len(r) for r in per_rank), default=0)
    spreads = []
    for i in range(steps):
        values = [r[i] for r in per_rank]
        mean = sum(values) / len(values)
        if mean > 0:
            spreads.append((max(values) - min(values)) / mean)
    return statistics.median(spreads) if spreads else 0.0


def interval_report(m: Meter, where: str, lr: float, device: torch.device) -> tuple[str, dict]:
    """The log line of a log interval's sums ``m`` (``where``: its epoch and step) and its TensorBoard scalars."""
    t = m.times
    total = max(t["total_time"], 1e-9)
    acc = f"{m.acc:.3f}" if m.acc is not None else "n/a"
    n = max(m.steps, 1)
    wait = t["data_load"] / total
    aps = m.audio_seconds / total
    line = (f"{where}, "
            f"loss: {m.loss:.3f}, acc: {acc}, lr: {lr:.3e}, batch: {m.utts / max(m.batches, 1):.1f} utts, "
            f"padding: {m.padding / max(m.batches, 1):.3f}, "
            f"data_load: {t['data_load'] / n:.3f}, forward_time: {t['forward_time'] / n:.3f}, "
            f"backward_time: {t['backward_time'] / n:.3f}, optim_time: {t['optim_time'] / n:.3f}, "
            f"total_time: {t['total_time'] / n:.3f}, data_wait: {100 * wait:.1f}%, "
            f"audio_s/s: {aps:.1f}, {memory_mb(device)}")
    cuda = device.type == "cuda"
    memory = torch.cuda.max_memory_allocated() / 2**20 if cuda else float(memory_mb(device).split()[-1].rstrip("MB"))
    return line, {
        "train/loss": m.loss, "train/acc": m.acc, "train/lr": lr, "train/batch_utts": m.utts / max(m.batches, 1),
        "train/padding_ratio": m.padding / max(m.batches, 1), **{f"time/{k}": v / n for k, v in t.items()},
        "time/data_wait_share": wait, "throughput/audio_seconds_per_second": aps,
        "memory/cuda_max_allocated_mb" if cuda else "memory/rss_mb": memory}


def epoch_report(every: Meter, per_rank: list[dict], counts: dict, skip: str, *, epoch: int, steps: int,
                 stop_reason: str, resumed: bool, nonfinite: int) -> tuple[str, dict]:
    """The "epoch done" line and TensorBoard scalars of an epoch: ``every`` its sums over the ranks, ``per_rank``
    each rank's own (utts, unused, wall, padded widths, audio per step), ``counts`` the loader's summed counts."""
    utts, audio, wait, total = every.utts, every.audio_seconds, every.times["data_load"], every.times["total_time"]
    loss = every.loss
    unused = ", ".join(f"rank {i}: " + (f"{r['unused_batches']} batches / " if r["unused_batches"] >= 0
                                         else "") + f"{r['unused_utts']} utts"
                       for i, r in enumerate(per_rank))
    unused_utts = sum(r["unused_utts"] for r in per_rank)
    # share of what the ranks read this epoch (trained + left unused); the split differs every epoch,
    # so what is left unused differs too
    unused_share = unused_utts / max(unused_utts + sum(r["utts"] for r in per_rank), 1)
    max_wall = max(r["wall"] for r in per_rank)
    shapes = {w for r in per_rank for w in r["widths"]}  # cuDNN plans each new one: few is fast
    spread = step_spread([r["step_audio"] for r in per_rank])
    padding = 1.0 - every.real_frames / every.padded_frames if every.padded_frames else 0.0
    since = " since the resume" if resumed else ""
    if stop_reason == "data":
        ran_out = any(r["unused_utts"] for r in per_rank)
        stop_reason = "another rank ran out of data" if ran_out else "end of data"
    if counts.get("uneven_ranks.carried"):
        unused += f", carried into epoch {epoch + 1}, which trains them first"
    line = (f"epoch {epoch} done ({stop_reason})"
            f": {steps} steps, {int(utts)} utts trained{since} on {len(per_rank)} ranks "
            f"({', '.join(str(r['utts']) for r in per_rank)} per rank), train loss {loss:.3f}, "
            f"{audio / 3600:.3f} h audio in {max_wall:.1f}s = {audio / max_wall:.1f} audio_s/s, "
            f"data_wait {100 * wait / max(total, 1e-9):.1f}%; {len(shapes)} padded lengths, padding "
            f"{100 * padding:.1f}% of the batches' frames, audio per step across ranks within "
            f"{100 * spread:.1f}% of its mean (median step); left unused when the epoch ended: {unused} "
            f"(unused share {100 * unused_share:.1f}% of the epoch); "
            f"loader skips/filters: {skip}"
            + (f"; non-finite steps skipped: {nonfinite}" if nonfinite else ""))
    return line, {
        "epoch/train_loss": loss, "epoch/audio_seconds_per_second": audio / max_wall,
        "epoch/data_wait_share": wait / max(total, 1e-9), "epoch/unused_utts": unused_utts,
        "epoch/unused_share": unused_share, "epoch/nonfinite_steps": nonfinite,
        "epoch/padded_lengths": len(shapes), "epoch/padding_share": padding,
        "epoch/step_audio_spread": spread}


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
