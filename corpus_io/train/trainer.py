"""The training loop: one process or DDP under torchrun, FunASR ``train_conf`` semantics.

Launch (N processes on this node; add torchrun's --nnodes/--node-rank/--rdzv-endpoint for more)::

    torchrun --nproc_per_node=N --no-python corpus-io train ++train_data_set_list=... ++output_dir=exp/x

Guarantees:

* **No hang at epoch end.** Before every micro-batch all ranks all-reduce a "have data" flag; when
  any rank runs out, every rank leaves the epoch at the same step. The ranks that still had data
  count (and drain) what they leave unused, and rank 0 logs it per rank.
* **Exact resume.** Every checkpoint holds the model, optimizer, scheduler, AMP scaler, each rank's
  RNG state and each rank's loader ``state_dict`` (gathered with ``all_gather_object``); rank 0
  writes it atomically. ``resume=true`` restores all of it, so an interrupted epoch continues at
  the batch after the checkpoint on every rank (``torchrun --max-restarts`` restarts the same way).
  Resumed on another world size or worker count, the rest of the epoch is re-split over the new
  ranks x workers (corpus_io.pipeline.elastic), and every rank logs what it took over.
* **Gradient accumulation.** ``accum_grad`` micro-batches per optimizer step, under DDP ``no_sync``
  on all but the last; the loss of each micro-batch is divided by ``accum_grad``.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from corpus_io.errors import ConfigError, DataError
from corpus_io.files import ensure_dir
from corpus_io.train import checkpoint as ckpt
from corpus_io.train.distributed import (
    DistContext,
    all_gather_object,
    all_ranks_have_data,
    all_reduce_sum,
    average_gradients,
    barrier,
    cleanup,
    init_distributed,
)

# --------------------------------------------------------------------------- step functions


def ctc_loss(log_probs: torch.Tensor, out_lengths: torch.Tensor, target: torch.Tensor,
             target_lengths: torch.Tensor) -> torch.Tensor:
    """Mean over utterances of the CTC loss (sum over each utterance's frames), blank id 0."""
    loss = F.ctc_loss(log_probs.transpose(0, 1).float(), target.clamp(min=0), out_lengths, target_lengths,
                      blank=0, reduction="sum", zero_infinity=True)
    return loss / max(int(log_probs.shape[0]), 1)


def greedy_ids(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best path per utterance: argmax, merge repeats, drop blanks (id 0)."""
    best = log_probs.argmax(dim=-1).cpu()
    out = []
    for row, n in zip(best.tolist(), lengths.cpu().tolist()):
        ids, prev = [], -1
        for t in row[: int(n)]:
            if t != prev and t != 0:
                ids.append(t)
            prev = t
        out.append(ids)
    return out


def token_errors(log_probs: torch.Tensor, lengths: torch.Tensor, target: torch.Tensor,
                 target_lengths: torch.Tensor) -> tuple[int, int]:
    """(edit errors, reference tokens) of the greedy path: accuracy = 1 - errors / tokens."""
    from corpus_io.train.scoring import edit_counts

    errors = total = 0
    for hyp, ref, n in zip(greedy_ids(log_probs, lengths), target.cpu().tolist(), target_lengths.cpu().tolist()):
        counts = edit_counts(ref[: int(n)], hyp)
        errors += counts.errors
        total += counts.ref
    return errors, total


@dataclass
class StepContext:
    """What a micro-step needs besides the batch (built once by the Trainer, or by a test)."""

    model: torch.nn.Module
    device: torch.device = torch.device("cpu")
    accum_grad: int = 1
    amp_dtype: torch.dtype | None = None
    scaler: Any = None
    front_end: Any = None  # feats_on=model: corpus_io.train.frontend.FrontEnd


def to_device(batch: dict, device: torch.device) -> dict:
    non_blocking = device.type == "cuda"
    return {k: (v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v)
            for k, v in batch.items()}


def micro_step(sc: StepContext, batch: dict, *, sync: bool, want_acc: bool = False) -> dict:
    """Forward + backward of one micro-batch; gradients sync across ranks only when ``sync``.

    Returns ``{"loss", "utts", "errors", "tokens", "forward_time", "backward_time"}``.
    """
    from corpus_io.train.frontend import model_inputs

    b = to_device({k: v for k, v in batch.items() if k not in ("feats", "wav")}, sc.device)
    no_sync = getattr(sc.model, "no_sync", None)
    guard = no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()
    with guard:
        t0 = time.perf_counter()
        # outside autocast: the front end computes Kaldi features in float32
        feats, feats_lengths = model_inputs(sc.front_end, batch, sc.device, train=True)
        with _autocast(sc.device, sc.amp_dtype):
            log_probs, out_lengths = sc.model(feats, feats_lengths)
        loss = ctc_loss(log_probs, out_lengths, b["target"], b["target_lengths"])
        _sync_device(sc.device)
        t1 = time.perf_counter()
        scaled = loss / sc.accum_grad
        (sc.scaler.scale(scaled) if sc.scaler is not None else scaled).backward()
        _sync_device(sc.device)
        t2 = time.perf_counter()
    errors, tokens = token_errors(log_probs.detach(), out_lengths, b["target"], b["target_lengths"]) \
        if want_acc else (0, 0)
    return {"loss": float(loss.detach()), "utts": len(batch["keys"]), "errors": errors, "tokens": tokens,
            "forward_time": t1 - t0, "backward_time": t2 - t1}


def optim_step(sc: StepContext, optimizer: torch.optim.Optimizer, scheduler: Any,
               grad_clip: float) -> tuple[float, bool]:
    """Unscale, clip, step (skipped when the norm is not finite), zero the gradients. Returns (norm, stepped)."""
    params = [p for p in sc.model.parameters() if p.grad is not None]
    if sc.scaler is not None:
        sc.scaler.unscale_(optimizer)
    if grad_clip > 0:
        norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    else:
        norm = float(torch.norm(torch.stack([p.grad.detach().float().norm() for p in params]))) if params else 0.0
    stepped = math.isfinite(norm)
    if sc.scaler is not None:
        sc.scaler.step(optimizer)  # skips by itself on inf/nan
        sc.scaler.update()
    elif stepped:
        optimizer.step()
    if stepped and scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, stepped


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- optimizer / scheduler


def build_optimizer(params: Any, conf: Any) -> torch.optim.Optimizer:
    if conf.optim == "adamw":
        return torch.optim.AdamW(params, lr=conf.lr, weight_decay=conf.weight_decay)
    if conf.optim == "adam":
        return torch.optim.Adam(params, lr=conf.lr, weight_decay=conf.weight_decay)
    return torch.optim.SGD(params, lr=conf.lr, weight_decay=conf.weight_decay, momentum=0.9)


def build_scheduler(optimizer: torch.optim.Optimizer, conf: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """warmuplr (ESPnet/FunASR WarmupLR): lr * warmup^0.5 * min(step^-0.5, step * warmup^-1.5); or constant."""
    if conf.scheduler == "constant" or conf.warmup_steps <= 0:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    warmup = float(conf.warmup_steps)

    def factor(step: int) -> float:
        s = step + 1
        return warmup ** 0.5 * min(s ** -0.5, s * warmup ** -1.5)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --------------------------------------------------------------------------- logging


def memory_mb(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda_max_alloc: {torch.cuda.max_memory_allocated(device) / 2**20:.0f}MB"
    try:
        with open("/proc/self/statm") as f:
            rss_pages = int(f.read().split()[1])
        return f"rss: {rss_pages * os.sysconf('SC_PAGE_SIZE') / 2**20:.0f}MB"
    except (OSError, ValueError):
        import resource

        return f"max_rss: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}MB"


@dataclass
class Meter:
    """Sums over a log interval (or an epoch)."""

    steps: int = 0
    utts: int = 0
    loss_sum: float = 0.0  # sum of per-batch mean loss * utts
    errors: int = 0
    tokens: int = 0
    padding: float = 0.0
    batches: int = 0
    audio_seconds: float = 0.0
    times: dict = field(default_factory=lambda: dict.fromkeys(
        ("data_load", "forward_time", "backward_time", "optim_time", "total_time"), 0.0))
    start: float = field(default_factory=time.perf_counter)

    def add_batch(self, out: dict, batch: dict, data_load: float) -> None:
        self.utts += out["utts"]
        self.loss_sum += out["loss"] * out["utts"]
        self.errors += out["errors"]
        self.tokens += out["tokens"]
        self.padding += float(batch.get("padding_ratio", 0.0))
        self.batches += 1
        self.audio_seconds += float(batch.get("audio_seconds", 0.0))
        self.times["data_load"] += data_load
        self.times["forward_time"] += out["forward_time"]
        self.times["backward_time"] += out["backward_time"]

    @property
    def loss(self) -> float:
        return self.loss_sum / self.utts if self.utts else float("nan")

    @property
    def acc(self) -> float | None:
        return max(0.0, 1.0 - self.errors / self.tokens) if self.tokens else None

    @property
    def wall(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)


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


# --------------------------------------------------------------------------- trainer


def rng_state(device: torch.device) -> dict:
    """Every RNG's state as tensors and plain containers (checkpoints load with weights_only=True)."""
    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    import numpy as np

    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class Trainer:
    def __init__(self, cfg: Any, ctx: DistContext) -> None:
        from corpus_io.config import to_yaml
        from corpus_io.dataset import build_dataloader
        from corpus_io.tokenizer import build_tokenizer
        from corpus_io.train.cmvn import eval_dataset_conf
        from corpus_io.train.frontend import build_front_end
        from corpus_io.train.model import build_model, feature_dim, num_parameters

        self.cfg, self.ctx, self.tc = cfg, ctx, cfg.train_conf
        tc = self.tc
        if tc.accum_grad < 1:
            raise ConfigError(f"train_conf.accum_grad={tc.accum_grad}; it must be >= 1.")
        if tc.use_fp16 and tc.use_bf16:
            raise ConfigError("train_conf.use_fp16 and use_bf16 are both true; choose one.")
        if tc.use_fp16 and ctx.device.type != "cuda":
            raise ConfigError("train_conf.use_fp16 needs a CUDA device; on CPU use ++train_conf.use_bf16=true.")
        self.out = Path(cfg.output_dir)
        ensure_dir(self.out, what="output_dir")
        self.log = RankLog(self.out, ctx.rank)
        _absolute_paths(cfg.tokenizer, "token_list", "bpe_model")  # so decode finds them from any directory
        self.config_yaml = to_yaml(cfg)
        if ctx.is_main:
            (self.out / "config.yaml").write_text(self.config_yaml, encoding="utf-8")

        torch.manual_seed(tc.seed)
        self.tokenizer = build_tokenizer(cfg.tokenizer)
        self.input_dim = feature_dim(cfg.dataset_conf)
        model = build_model(dict(cfg.model), self.input_dim, self.tokenizer.vocab_size, cfg.cmvn_file)
        model.to(ctx.device)
        self.module = model
        if ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            model = DDP(model, device_ids=ids)
        self.model = model
        self.optimizer = build_optimizer(self.module.parameters(), cfg.optim_conf)
        self.scheduler = build_scheduler(self.optimizer, cfg.scheduler_conf)
        self.scaler = torch.amp.GradScaler("cuda") if tc.use_fp16 else None
        amp = torch.float16 if tc.use_fp16 else torch.bfloat16 if tc.use_bf16 else None
        self.front_end = build_front_end(cfg.dataset_conf, ctx.device)
        self.sc = StepContext(self.model, ctx.device, tc.accum_grad, amp, self.scaler, self.front_end)
        # seeds differ per rank for dropout/augmentation (model init was shared above)
        random.seed(tc.seed + ctx.rank)
        torch.manual_seed(tc.seed + ctx.rank)

        self.train_loader = build_dataloader(cfg.train_data_set_list or None, cfg.dataset_conf, self.tokenizer,
                                             train=True, rank=ctx.rank, world_size=ctx.world_size)
        self.cv_loader = None
        if cfg.valid_data_set_list:
            self.cv_loader = build_dataloader(cfg.valid_data_set_list, eval_dataset_conf(cfg.dataset_conf),
                                              self.tokenizer, train=False, rank=ctx.rank, world_size=ctx.world_size)
        self.writer = None
        if ctx.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tensorboard"))
        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0
        self.epoch_done = False
        self.keys_file = None
        self.resumed_mid_epoch = False
        self.log(f"world_size {ctx.world_size}, backend {ctx.backend or 'none'}, device {ctx.device}, "
                 f"model {type(self.module).__name__} {num_parameters(self.module) / 1e6:.3f}M params, "
                 f"vocab {self.tokenizer.vocab_size}, input_dim {self.input_dim}", all_ranks=False)

    # ----------------------------------------------------------------- checkpoints

    def _checkpoint_state(self, cv_metrics: dict | None) -> dict | None:
        """Collective: gather every rank's loader/RNG state; rank 0 gets the full state, others None."""
        keys_bytes = 0
        if self.keys_file is not None:
            self.keys_file.flush()
            keys_bytes = self.keys_file.tell()
        per_rank = all_gather_object(self.ctx, {"loader": self.train_loader.state_dict(),
                                                "rng": rng_state(self.ctx.device), "keys_bytes": keys_bytes})
        if not self.ctx.is_main:
            return None
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "loader_states": [r["loader"] for r in per_rank],
            "rng_states": [r["rng"] for r in per_rank],
            "trained_keys_bytes": [r["keys_bytes"] for r in per_rank],
            "trained_keys_files": self._keys_files([r["keys_bytes"] for r in per_rank]),
            "world_size": self.ctx.world_size,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "epoch_done": self.epoch_done,
            "cv_metrics": cv_metrics,
            "config": self.config_yaml,
        }

    def save(self, name: str, cv_metrics: dict | None = None) -> None:
        t0 = time.perf_counter()
        state = self._checkpoint_state(cv_metrics)
        if state is not None:
            path = self.out / name
            ckpt.save_checkpoint(path, state)
            ckpt.link_or_copy(path, self.out / "model.pt")
            self.log(f"saved {path} (and model.pt) in {time.perf_counter() - t0:.2f}s", all_ranks=False)
        barrier(self.ctx)

    def resume(self) -> None:
        latest = self.out / "model.pt"
        state = ckpt.load_checkpoint(latest) if (self.tc.resume and latest.is_file()) else None
        if state is None:
            self._open_keys_file(None)
            return
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.global_step = int(state["epoch"]), int(state["global_step"])
        self.epoch_done = bool(state["epoch_done"])
        if self.epoch_done:
            self.epoch, self.step_in_epoch, self.epoch_done = self.epoch + 1, 0, False
        else:
            self.step_in_epoch = int(state["step_in_epoch"])
            self.train_loader.set_epoch(self.epoch)
            # any world size and worker count: the same topology loads this rank's own state, another one
            # re-splits the rest of the epoch over this run's ranks x workers (corpus_io.pipeline.elastic)
            plan = self.train_loader.load_rank_states(state["loader_states"])
            if plan is None:
                set_rng_state(state["rng_states"][self.ctx.rank], self.ctx.device)
            else:
                mine = [plan.states[self.ctx.rank * max(1, self.train_loader.num_workers) + w]
                        for w in range(max(1, self.train_loader.num_workers))]
                units = sum(len(pieces) for st in mine for _, pieces in st.plans.values())
                self.log(f"epoch {self.epoch}: {plan.describe()}; rank {self.ctx.rank} reads {units} of them, "
                         f"{sum(len(st.pending) for st in mine)} buffered samples")
            self.resumed_mid_epoch = True
        self._open_keys_file(state)
        self.log(f"resumed from {latest}: epoch {self.epoch}, step_in_epoch {self.step_in_epoch}, "
                 f"global_step {self.global_step}", all_ranks=False)

    def _check_ranks_agree(self) -> None:
        """Every rank must resume at the same step and split the same shard list; ranks that read their
        own copies of output_dir or of the lists (per-node disks, stale NFS) would otherwise wait in
        mismatched collectives, or read some shards twice and others never."""
        import hashlib

        sources = [(s.data_list, s.data_type, s.urls, s.durations, s.num_utts,
                    len(s.raw) if s.raw is not None else None) for s in self.train_loader.dataset.sources]
        mine = {"resume": (self.epoch, self.step_in_epoch, self.global_step),
                "lists": hashlib.sha256(repr(sources).encode()).hexdigest()[:16]}
        problem = rank_disagreement(all_gather_object(self.ctx, mine))
        if problem:
            raise ConfigError(problem)

    def _keys_files(self, ranks_bytes: list[int]) -> dict[str, int]:
        """Debug: the length of every trained_keys.rank{R}.txt at a checkpoint, including the files of ranks a
        larger world size wrote before an elastic resume (they no longer grow)."""
        if not self.tc.dump_trained_keys:
            return {}
        sizes = {p.name: p.stat().st_size for p in self.out.glob("trained_keys.rank*.txt")}
        sizes.update({f"trained_keys.rank{r}.txt": n for r, n in enumerate(ranks_bytes)})
        return sizes

    def _open_keys_file(self, state: dict | None) -> None:
        """Debug: output_dir/trained_keys.rank{R}.txt, cut back to what the checkpoint had trained (rank 0 also
        cuts back the files of ranks this run does not have)."""
        if not self.tc.dump_trained_keys:
            return
        state = state or {}
        kept = dict(state.get("trained_keys_files") or {})
        if not kept:  # a checkpoint before trained_keys_files: one length per rank of its world
            kept = {f"trained_keys.rank{r}.txt": n for r, n in enumerate(state.get("trained_keys_bytes") or [])}
        if self.ctx.is_main and state:
            for path in self.out.glob("trained_keys.rank*.txt"):
                rank = int(path.name.split(".rank")[1].split(".")[0])
                if rank >= self.ctx.world_size:
                    with open(path, "r+", encoding="utf-8") as f:
                        f.truncate(kept.get(path.name, 0))
        path = self.out / f"trained_keys.rank{self.ctx.rank}.txt"
        keep_bytes = kept.get(path.name, 0)
        mode = "r+" if path.exists() else "w"
        self.keys_file = open(path, mode, encoding="utf-8")
        self.keys_file.truncate(keep_bytes)
        self.keys_file.seek(keep_bytes)

    # ----------------------------------------------------------------- loop

    def run(self) -> None:
        self.resume()
        self._check_ranks_agree()
        tc = self.tc
        if self.epoch >= tc.max_epoch:
            self.log(f"nothing to train: max_epoch={tc.max_epoch} already reached", all_ranks=False)
        while self.epoch < tc.max_epoch:
            resumed_mid_epoch = self.resumed_mid_epoch
            train_metrics = self.train_epoch()
            if train_metrics["utts"] == 0 and not resumed_mid_epoch:
                # every rank sees the same all-reduced count, so all raise together (no hang), and before
                # a checkpoint or an average of an untrained model is written
                raise DataError(f"train: epoch {self.epoch} trained 0 utterances on {self.ctx.world_size} rank(s) "
                                f"(loader skips/filters: {train_metrics['skips']}), so no checkpoint was written. "
                                f"Nothing usable was read from {self.cfg.train_data_set_list}: with "
                                f"dataset_conf.on_error=skip, unreadable shards are skipped and counted, so check "
                                f"the paths, URLs and storage_options (S3 endpoint, key, secret) and the "
                                f"dataset_conf.filter_conf limits.")
            cv = self.validate() if self.cv_loader is not None else None
            metrics = cv or {"loss": train_metrics["loss"], "acc": train_metrics["acc"], "source": "train"}
            self.epoch_done = True
            self.save(f"model.pt.ep{self.epoch}", metrics)
            if self.ctx.is_main:
                ckpt.write_metrics(self.out, self.epoch, metrics)
                removed = ckpt.prune(self.out, tc.keep_nbest_models, tc.avg_keep_nbest_models_type,
                                     current_epoch=self.epoch)
                if removed:
                    self.log("pruned " + ", ".join(p.name for p in removed), all_ranks=False)
            barrier(self.ctx)
            self.epoch, self.step_in_epoch, self.epoch_done = self.epoch + 1, 0, False
        # the other ranks are done: they exit rather than wait in a barrier (timeout_s) while rank 0 averages
        barrier(self.ctx)
        if self.ctx.is_main and tc.avg_nbest_model > 0 and ckpt.epoch_checkpoints(self.out):
            self._average(tc.avg_nbest_model, tc.avg_keep_nbest_models_type)
        if self.writer is not None:
            self.writer.close()
        if self.keys_file is not None:
            self.keys_file.close()
        self.log("training finished", all_ranks=False)
        self.log.close()

    def _average(self, num: int, metric: str) -> None:
        if not ckpt.ranked_epochs(self.out, metric):
            self.log(f"not averaging: no epoch recorded a '{metric}' (avg_keep_nbest_models_type); average later "
                     f"with `corpus-io average ++output_dir={self.out} ++metric=loss`", all_ranks=False)
            return
        path = ckpt.average_checkpoints(self.out, num, metric, key="train_conf.avg_nbest_model",
                                        warn=lambda message: self.log(f"warning: {message}", all_ranks=False))
        chosen = ckpt.load_checkpoint(path)["averaged_epochs"]
        self.log(f"averaged epochs {chosen} (best cv {metric}) -> {path}", all_ranks=False)

    def _batches(self) -> Iterator[tuple[dict | None, float]]:
        it = iter(self.train_loader)
        while True:
            t0 = time.perf_counter()
            batch = next(it, None)
            yield batch, time.perf_counter() - t0
            if batch is None:
                return

    def train_epoch(self) -> dict:
        tc, ctx = self.tc, self.ctx
        if self.step_in_epoch == 0:
            self.train_loader.set_epoch(self.epoch)
        if self.front_end is not None:
            self.front_end.set_epoch(self.epoch)
        self.model.train()
        epoch_meter, meter = Meter(), Meter()
        micro = 0
        stop_reason = "data"
        unused_batches = unused_utts = 0
        batches = self._batches()
        tick = time.perf_counter()
        for batch, data_load in batches:
            if not all_ranks_have_data(ctx, batch is not None):
                if batch is not None:
                    unused_batches, unused_utts = self._drain(batch, batches)
                break
            micro += 1
            sync = micro % tc.accum_grad == 0
            want_acc = sync and (self.step_in_epoch + 1) % tc.log_interval == 0
            out = micro_step(self.sc, batch, sync=sync, want_acc=want_acc)
            meter.add_batch(out, batch, data_load)
            epoch_meter.add_batch(out, batch, data_load)
            if self.keys_file is not None:
                self.keys_file.write("".join(f"{self.epoch} {k}\n" for k in batch["keys"]))
            if sync:
                tick = self._finish_step(meter, epoch_meter, tick)
                meter = self._after_step(meter)
                if tc.max_steps_per_epoch and self.step_in_epoch >= tc.max_steps_per_epoch:
                    stop_reason = "max_steps_per_epoch"
                    break
            self._maybe_fail()
        if micro % tc.accum_grad:
            # the epoch ended inside an accumulation: DDP did not sync these micro-batches, so average here
            average_gradients(ctx, [p for p in self.module.parameters() if p.requires_grad])
            self._finish_step(meter, epoch_meter, tick)
            self._after_step(meter)
        summary = self._epoch_summary(epoch_meter, stop_reason, unused_batches, unused_utts)
        self.resumed_mid_epoch = False
        return summary

    def _finish_step(self, meter: Meter, epoch_meter: Meter, tick: float) -> float:
        t0 = time.perf_counter()
        optim_step(self.sc, self.optimizer, self.scheduler, self.tc.grad_clip)
        _sync_device(self.ctx.device)
        now = time.perf_counter()
        for m in (meter, epoch_meter):
            m.times["optim_time"] += now - t0
            m.times["total_time"] += now - tick
            m.steps += 1
        self.step_in_epoch += 1
        self.global_step += 1
        return now

    def _after_step(self, meter: Meter) -> Meter:
        tc = self.tc
        if self.step_in_epoch % tc.log_interval == 0:
            self._log_interval(meter)
            meter = Meter()
        if tc.validate_interval and self.step_in_epoch % tc.validate_interval == 0 and self.cv_loader is not None:
            self.validate()
            self.model.train()
        if tc.save_checkpoint_interval and self.step_in_epoch % tc.save_checkpoint_interval == 0:
            self.save(f"model.pt.ep{self.epoch}.{self.step_in_epoch}")
        return meter

    def _maybe_fail(self) -> None:
        """Debug: crash rank 0 once (first torchrun attempt only) to exercise --max-restarts."""
        n = self.tc.debug_fail_at_step
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if n and self.ctx.is_main and self.global_step == n and first_attempt:
            raise RuntimeError(f"debug_fail_at_step={n}: simulated crash at global step {n}")

    def _drain(self, batch: dict, batches: Iterator) -> tuple[int, int]:
        """Count what this rank leaves unused when another ran out: from the loader state and the index,
        without decoding the rest (batches: -1, unknown); with dump_trained_keys, read and list it."""
        if not self.tc.dump_trained_keys:
            return -1, len(batch["keys"]) + self.train_loader.left_in_epoch()
        unused = []
        nb = nu = 0
        while batch is not None:
            nb += 1
            nu += len(batch["keys"])
            unused.extend(batch["keys"])
            batch, _ = next(batches, (None, 0.0))
        if self.tc.dump_trained_keys:
            with open(self.out / f"unused_keys.rank{self.ctx.rank}.txt", "a", encoding="utf-8") as f:
                f.write("".join(f"{self.epoch} {k}\n" for k in unused))
        return nb, nu

    def _log_interval(self, m: Meter) -> None:
        t = m.times
        total = max(t["total_time"], 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        acc = f"{m.acc:.3f}" if m.acc is not None else "n/a"
        n = max(m.steps, 1)
        wait = t["data_load"] / total
        aps = m.audio_seconds / total
        self.log(f"epoch: {self.epoch}/{self.tc.max_epoch}, step: {self.step_in_epoch} (total {self.global_step}), "
                 f"loss: {m.loss:.3f}, acc: {acc}, lr: {lr:.3e}, batch: {m.utts / max(m.batches, 1):.1f} utts, "
                 f"padding: {m.padding / max(m.batches, 1):.3f}, "
                 f"data_load: {t['data_load'] / n:.3f}, forward_time: {t['forward_time'] / n:.3f}, "
                 f"backward_time: {t['backward_time'] / n:.3f}, optim_time: {t['optim_time'] / n:.3f}, "
                 f"total_time: {t['total_time'] / n:.3f}, data_wait: {100 * wait:.1f}%, "
                 f"audio_s/s: {aps:.1f}, {memory_mb(self.ctx.device)}")
        if self.writer is not None:
            w, s = self.writer, self.global_step
            w.add_scalar("train/loss", m.loss, s)
            if m.acc is not None:
                w.add_scalar("train/acc", m.acc, s)
            w.add_scalar("train/lr", lr, s)
            w.add_scalar("train/batch_utts", m.utts / max(m.batches, 1), s)
            w.add_scalar("train/padding_ratio", m.padding / max(m.batches, 1), s)
            for k, v in t.items():
                w.add_scalar(f"time/{k}", v / n, s)
            w.add_scalar("time/data_wait_share", wait, s)
            w.add_scalar("throughput/audio_seconds_per_second", aps, s)
            if self.ctx.device.type == "cuda":
                w.add_scalar("memory/cuda_max_allocated_mb", torch.cuda.max_memory_allocated() / 2**20, s)
            else:
                w.add_scalar("memory/rss_mb", float(memory_mb(self.ctx.device).split()[-1].rstrip("MB")), s)

    def _epoch_summary(self, m: Meter, stop_reason: str, unused_batches: int, unused_utts: int) -> dict:
        from corpus_io.train.cmvn import loader_counts

        wall = m.wall
        sums = all_reduce_sum(self.ctx, [m.utts, m.loss_sum, m.audio_seconds, m.times["data_load"],
                                         m.times["total_time"], m.steps])
        utts, loss_sum, audio, wait, total, _ = sums
        per_rank = all_gather_object(self.ctx, {"unused_batches": unused_batches, "unused_utts": unused_utts,
                                                "utts": m.utts, "counts": loader_counts(self.train_loader, epoch=True),
                                                "wall": wall})
        loss = loss_sum / utts if utts else float("nan")
        counts: dict = {}
        for r in per_rank:
            for k, v in r["counts"].items():
                counts[k] = counts.get(k, 0) + v
        skip = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"
        if self.ctx.is_main:
            unused = ", ".join(f"rank {i}: " + (f"{r['unused_batches']} batches / " if r["unused_batches"] >= 0
                                                 else "") + f"{r['unused_utts']} utts"
                               for i, r in enumerate(per_rank))
            unused_utts = sum(r["unused_utts"] for r in per_rank)
            # share of what the ranks read this epoch (trained + left unused); the split differs every epoch,
            # so what is left unused differs too
            unused_share = unused_utts / max(unused_utts + sum(r["utts"] for r in per_rank), 1)
            max_wall = max(r["wall"] for r in per_rank)
            since = " since the resume" if self.resumed_mid_epoch else ""
            if stop_reason == "data":
                ran_out = any(r["unused_utts"] for r in per_rank)
                stop_reason = "another rank ran out of data" if ran_out else "end of data"
            self.log(f"epoch {self.epoch} done ({stop_reason})"
                     f": {self.step_in_epoch} steps, {int(utts)} utts trained{since} on {self.ctx.world_size} ranks "
                     f"({', '.join(str(r['utts']) for r in per_rank)} per rank), train loss {loss:.3f}, "
                     f"{audio / 3600:.3f} h audio in {max_wall:.1f}s = {audio / max_wall:.1f} audio_s/s, "
                     f"data_wait {100 * wait / max(total, 1e-9):.1f}%; left unused when the epoch ended: {unused} "
                     f"(unused share {100 * unused_share:.1f}% of the epoch); "
                     f"loader skips/filters: {skip}", all_ranks=False)
            if self.writer is not None:
                self.writer.add_scalar("epoch/train_loss", loss, self.epoch)
                self.writer.add_scalar("epoch/audio_seconds_per_second", audio / max_wall, self.epoch)
                self.writer.add_scalar("epoch/data_wait_share", wait / max(total, 1e-9), self.epoch)
                self.writer.add_scalar("epoch/unused_utts", unused_utts, self.epoch)
                self.writer.add_scalar("epoch/unused_share", unused_share, self.epoch)
        acc = m.acc
        return {"loss": loss, "acc": acc, "utts": int(utts), "skips": skip}

    @torch.no_grad()
    def validate(self) -> dict:
        """cv loss and greedy token accuracy; each rank scores its split, the sums are all-reduced."""
        from corpus_io.train.frontend import model_inputs

        self.module.eval()
        self.cv_loader.set_epoch(0)
        loss_sum = utts = errors = tokens = 0.0
        t0 = time.perf_counter()
        for batch in self.cv_loader:
            b = to_device({k: v for k, v in batch.items() if k not in ("feats", "wav")}, self.ctx.device)
            feats, feats_lengths = model_inputs(self.front_end, batch, self.ctx.device, train=False)
            with _autocast(self.ctx.device, self.sc.amp_dtype):
                log_probs, out_lengths = self.module(feats, feats_lengths)
            loss = ctc_loss(log_probs, out_lengths, b["target"], b["target_lengths"])
            n = len(batch["keys"])
            loss_sum += float(loss) * n
            utts += n
            e, t = token_errors(log_probs, out_lengths, b["target"], b["target_lengths"])
            errors += e
            tokens += t
        loss_sum, utts, errors, tokens = all_reduce_sum(self.ctx, [loss_sum, utts, errors, tokens])
        metrics = {"loss": loss_sum / utts if utts else float("nan"),
                   "acc": max(0.0, 1.0 - errors / tokens) if tokens else 0.0, "utts": int(utts)}
        self.log(f"cv epoch {self.epoch} step {self.step_in_epoch}: loss {metrics['loss']:.3f}, "
                 f"acc {metrics['acc']:.3f} (1 - token error rate, greedy), {int(utts)} utts, "
                 f"{time.perf_counter() - t0:.1f}s", all_ranks=False)
        if self.writer is not None:
            self.writer.add_scalar("cv/loss", metrics["loss"], self.global_step)
            self.writer.add_scalar("cv/acc", metrics["acc"], self.global_step)
        self.module.train()
        return metrics


def rank_disagreement(views: list[dict]) -> str | None:
    """What the ranks' ``{"resume": ..., "lists": ...}`` views disagree on, as an error message, or None."""
    for what, explain in (("resume", "resume point (epoch, step in epoch, global step)"),
                          ("lists", "train list (digest of its shards and index)")):
        if len({repr(v[what]) for v in views}) > 1:
            seen = "; ".join(f"rank {r}: {v[what]}" for r, v in enumerate(views))
            return (f"the ranks disagree on their {explain}: {seen}. Every rank must see the same output_dir "
                    f"(checkpoints) and the same data lists and index: put them on storage all nodes share, or "
                    f"copy them identically.")
    return None


def _absolute_paths(section: Any, *keys: str) -> None:
    """Make the local file paths under ``keys`` absolute (URLs stay as they are)."""
    from corpus_io.urls import is_command, is_remote

    for key in keys:
        value = getattr(section, key, None)
        if isinstance(value, str) and value and not (is_remote(value) or is_command(value)):
            setattr(section, key, os.path.abspath(value))


def resolve_intervals(tc: Any) -> None:
    """Check the step intervals of ``train_conf`` and give FunASR's ``validate_interval=-1`` its meaning.

    ``log_interval`` >= 1. ``save_checkpoint_interval``: 0 (epoch ends only) or >= 1 steps.
    ``validate_interval``: 0 (epoch ends), >= 1 steps, or -1: with every mid-epoch checkpoint, as FunASR's
    trainer sets it (``validate_interval = save_checkpoint_interval``). FunASR's code runs
    ``step % -1 == 0`` at every step for ``save_checkpoint_interval=-1``, which nobody means by -1, so that
    one is an error asking for 1 or 0.
    """
    from corpus_io.errors import ConfigError

    if tc.log_interval < 1:
        raise ConfigError(f"train_conf.log_interval={tc.log_interval}: it is the number of steps between log "
                          f"lines and must be at least 1, e.g. ++train_conf.log_interval=10.")
    if tc.save_checkpoint_interval == -1:
        raise ConfigError("train_conf.save_checkpoint_interval=-1 is ambiguous: FunASR's trainer then saves at "
                          "every step (step % -1 == 0). Set ++train_conf.save_checkpoint_interval=0 for checkpoints "
                          "at epoch ends only, or a number of steps (1: every step).")
    if tc.save_checkpoint_interval < 0:
        raise ConfigError(f"train_conf.save_checkpoint_interval={tc.save_checkpoint_interval} must be 0 (epoch ends "
                          f"only) or a number of steps >= 1.")
    if tc.validate_interval == -1:
        tc.validate_interval = tc.save_checkpoint_interval
    elif tc.validate_interval < 0:
        raise ConfigError(f"train_conf.validate_interval={tc.validate_interval} must be 0 (epoch ends), a number of "
                          f"steps >= 1, or -1 (with every mid-epoch checkpoint, as in FunASR).")


def train(cfg: Any) -> None:
    """``corpus-io train``: one process, or one per rank under torchrun (env://)."""
    from corpus_io.config import require

    require(cfg, "output_dir")
    if not cfg.dataset_conf.sources:  # a weighted mix names its own lists
        require(cfg, "train_data_set_list")
    resolve_intervals(cfg.train_conf)
    ctx = init_distributed(cfg.train_conf.device, cfg.train_conf.timeout_s)
    try:
        Trainer(cfg, ctx).run()
    finally:
        cleanup()
