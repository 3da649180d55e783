"""The training loop: one process or DDP under torchrun, FunASR ``train_conf`` semantics.

Launch (N processes on this node; add torchrun's --nnodes/--node-rank/--rdzv-endpoint for more)::

    torchrun --nproc_per_node=N --no-python corpus-io train ++train_data_set_list=... ++output_dir=exp/x

Guarantees:

* **No hang at epoch end.** Before every micro-batch all ranks all-reduce a "have data" flag; when
  any rank runs out, every rank leaves the epoch at the same step. The ranks that still had data
  count (and drain) what they leave unused, and rank 0 logs it per rank; that rest of the epoch is
  carried into the next, which trains it first (``CorpusLoader.carry_rest``).
* **Exact resume.** Every checkpoint holds the model, optimizer, scheduler, AMP scaler, each rank's
  RNG state and each rank's loader ``state_dict`` (gathered with ``all_gather_object``); rank 0
  writes it atomically. ``resume=true`` restores all of it, so an interrupted epoch continues at
  the batch after the checkpoint on every rank (``torchrun --max-restarts`` restarts the same way).
  Resumed on another world size or worker count, the rest of the epoch is re-split over the new
  ranks x workers (corpus_io.loader.elastic), and every rank logs what it took over.
* **Gradient accumulation.** ``accum_grad`` micro-batches per optimizer step, under DDP ``no_sync``
  on all but the last; the loss of each micro-batch is divided by ``accum_grad``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from corpus_io.errors import ConfigError, DataError
from corpus_io.loader.partition import ranks_with_data
from corpus_io.model import checkpoint as ckpt
from corpus_io.model.frontend import sync_device
from corpus_io.storage.files import atomic_write, refuse_non_directory, refuse_remote_output
from corpus_io.train.distributed import (
    DistContext,
    LauncherGone,
    LauncherWatch,
    PeerStop,
    all_gather_object,
    all_reduce_sum,
    average_gradients,
    barrier,
    cleanup,
    init_distributed,
    rank_disagreement,
)
from corpus_io.train.init_param import Start, load_resumed_model, load_weights, prepare
from corpus_io.train.metrics import Board, Meter, RankLog, epoch_report, interval_report
from corpus_io.train.optim import build_optimizer, build_scheduler
from corpus_io.train.output_dir import claim_output_dir, run_inputs
from corpus_io.train.steps import SkippedSteps, StepContext, forward_loss, micro_step, optim_step
from corpus_io.train.trained_keys import append_unused_keys, keys_files, open_keys_file

# --------------------------------------------------------------------------- trainer


class Trainer:
    def __init__(self, cfg: Any, ctx: DistContext, start: Start | None = None) -> None:
        from corpus_io.config import to_yaml
        from corpus_io.loader.build import describe_chain, loader_chain
        from corpus_io.loader.dataset import build_dataloader
        from corpus_io.loader.shapes import describe
        from corpus_io.model.cmvn import eval_dataset_conf
        from corpus_io.model.frontend import build_front_end, resolve_device_defaults
        from corpus_io.model.model import build_model, feature_dim, num_parameters
        from corpus_io.tokenizer import build_tokenizer

        self.cfg, self.ctx, self.tc = cfg, ctx, cfg.train_conf
        tc = self.tc
        if tc.accum_grad < 1:
            raise ConfigError(f"train_conf.accum_grad={tc.accum_grad}; it must be >= 1.")
        if tc.use_fp16 and tc.use_bf16:
            raise ConfigError("train_conf.use_fp16 and use_bf16 are both true; choose one.")
        if tc.use_fp16 and ctx.device.type != "cuda":
            raise ConfigError("train_conf.use_fp16 needs a CUDA device; on CPU use ++train_conf.use_bf16=true.")
        # the same command trains the same weights: the thread count and kernels decide the order of float sums
        torch.set_num_threads(tc.num_threads)
        torch.use_deterministic_algorithms(tc.deterministic, warn_only=True)
        torch.manual_seed(tc.seed)
        devices_note = resolve_device_defaults(cfg.dataset_conf, ctx.device)  # before config.yaml: it records them
        self.tokenizer = build_tokenizer(cfg.tokenizer)
        self.input_dim = feature_dim(cfg.dataset_conf)
        model = build_model(dict(cfg.model), self.input_dim, self.tokenizer.vocab_size, cfg.cmvn_file)
        start_notes = load_weights(model, start, cfg, self.tokenizer)  # init_param: raises before anything is written
        self.out = Path(cfg.output_dir)
        self.init_param = start.source if start is not None and start.weights is not None else None
        # one run per output_dir, and a fresh run never beside an old run's checkpoints: before anything is written
        self.lock, claim_notes = claim_output_dir(self.out, ctx, tc, run_inputs(cfg, self.init_param))
        self.launcher = LauncherWatch()
        self.log = RankLog(self.out, ctx.rank)
        for note in claim_notes:
            self.log(note, all_ranks=False)
        for note in start_notes:
            self.log(note, all_ranks=False)
        _absolute_paths(cfg.tokenizer, "token_list", "bpe_model")  # so decode finds them from any directory
        self.config_yaml = to_yaml(cfg)  # output_dir/config.yaml: written once the resume (if any) fits this config
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
        np.random.seed((tc.seed + ctx.rank) % 2**32)  # saved with every checkpoint: unseeded, no two runs match
        torch.manual_seed(tc.seed + ctx.rank)

        self.train_loader = build_dataloader(cfg.train_data_set_list or None, cfg.dataset_conf, self.tokenizer,
                                             train=True, rank=ctx.rank, world_size=ctx.world_size)
        self.cv_loader = None
        if cfg.valid_data_set_list:
            self.cv_loader = build_dataloader(cfg.valid_data_set_list, eval_dataset_conf(cfg.dataset_conf),
                                              self.tokenizer, train=False, rank=ctx.rank, world_size=ctx.world_size)
        self.board = Board(self.out, enabled=ctx.is_main)
        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0
        self.epoch_done = False
        self.keys_file = None
        self.resumed_mid_epoch = False
        self.skipped = SkippedSteps(tc.max_nonfinite_steps, cfg.cmvn_file, cfg.optim_conf.lr)  # non-finite loss/norm
        self.step_keys: list[str] = []  # this rank's keys of the micro-batches of the step being accumulated
        self.log(f"world_size {ctx.world_size}, backend {ctx.backend or 'none'}, device {ctx.device}, "
                 f"model {type(self.module).__name__} {num_parameters(self.module) / 1e6:.3f}M params, "
                 f"vocab {self.tokenizer.vocab_size}, input_dim {self.input_dim}", all_ranks=False)
        self.log(devices_note + "; " + describe(self.train_loader.dataset.conf.bucket_edges), all_ranks=False)
        self.log("loader chain (train):\n" + describe_chain(loader_chain(self.train_loader.dataset.conf, self.tokenizer,
                                                                         train=True)), all_ranks=False)

    # ----------------------------------------------------------------- checkpoints

    def _checkpoint_state(self, cv_metrics: dict | None) -> dict | None:
        """Collective: gather every rank's loader/RNG state; rank 0 gets the full state, others None."""
        keys_bytes = 0
        if self.keys_file is not None:
            self.keys_file.flush()
            keys_bytes = self.keys_file.tell()
        per_rank = all_gather_object(self.ctx, {"loader": self.train_loader.state_dict(),
                                                "rng": ckpt.rng_state(self.ctx.device), "keys_bytes": keys_bytes})
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
            "trained_keys_files": keys_files(self.out, [r["keys_bytes"] for r in per_rank])
            if self.tc.dump_trained_keys else {},
            "world_size": self.ctx.world_size,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "epoch_done": self.epoch_done,
            "cv_metrics": cv_metrics,
            "config": self.config_yaml,
            "token_list": ckpt.token_list_record(self.tokenizer),
        }

    def save(self, name: str, cv_metrics: dict | None = None) -> None:
        t0 = time.perf_counter()
        bad = ckpt.nonfinite_tensor(self.module.state_dict())  # the same on every rank: all raise together
        if bad is not None:
            raise DataError(f"train: the model holds non-finite values in '{bad}' at epoch {self.epoch} step "
                            f"{self.step_in_epoch}, so {self.out / name} was not written (nor any average). "
                            f"{self.skipped.causes}")
        state = self._checkpoint_state(cv_metrics)
        if state is not None:
            path = self.out / name
            ckpt.save_checkpoint(path, state)
            ckpt.copy_checkpoint(path, self.out / "model.pt")  # its own file: writing one never changes the other
            self.log(f"saved {path} (and model.pt) in {time.perf_counter() - t0:.2f}s", all_ranks=False)
        barrier(self.ctx)

    def resume(self) -> None:
        latest = ckpt.resume_path(self.out, self.tc.resume)
        state = ckpt.load_checkpoint(latest) if latest is not None else None
        if state is None:
            self.keys_file = open_keys_file(self.out, None, self.ctx) if self.tc.dump_trained_keys else None
            return
        load_resumed_model(latest, state, self.cfg, self.module)  # refused if the run's model.* keys changed
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.global_step = int(state["epoch"]), int(state["global_step"])
        self.epoch_done = bool(state["epoch_done"])
        if self.epoch_done:
            self.epoch, self.step_in_epoch, self.epoch_done = self.epoch + 1, 0, False
            if int(state["loader_states"][0]["epoch"]) == self.epoch:  # the rest of the last epoch, carried into this
                self.train_loader.set_epoch(self.epoch)
                self.train_loader.load_rank_states(state["loader_states"])
        else:
            self.step_in_epoch = int(state["step_in_epoch"])
            self.train_loader.set_epoch(self.epoch)
            # any world size and worker count: the same topology loads this rank's own state, another one
            # re-splits the rest of the epoch over this run's ranks x workers (corpus_io.loader.elastic)
            plan = self.train_loader.load_rank_states(state["loader_states"])
            if plan is None:
                ckpt.set_rng_state(state["rng_states"][self.ctx.rank], self.ctx.device)
            else:
                mine = [plan.states[self.ctx.rank * max(1, self.train_loader.num_workers) + w]
                        for w in range(max(1, self.train_loader.num_workers))]
                units = sum(len(pieces) for st in mine for _, pieces in st.plans.values())
                self.log(f"epoch {self.epoch}: {plan.describe()}; rank {self.ctx.rank} reads {units} of them, "
                         f"{sum(len(st.pending) for st in mine)} buffered samples")
            self.resumed_mid_epoch = True
        self.keys_file = open_keys_file(self.out, state, self.ctx) if self.tc.dump_trained_keys else None
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

    # ----------------------------------------------------------------- loop

    def run(self) -> None:
        self.resume()
        self._check_ranks_agree()
        if self.ctx.is_main:
            with atomic_write(self.out / "config.yaml") as f:
                f.write(self.config_yaml)
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
        self.board.close()
        if self.keys_file is not None:
            self.keys_file.close()
        self.log("training finished", all_ranks=False)
        self.log.close()
        if self.lock is not None:
            self.lock.release()

    def _average(self, num: int, metric: str) -> None:
        if not ckpt.ranked_epochs(self.out, metric):
            self.log(f"not averaging: no epoch recorded a '{metric}' (avg_keep_nbest_models_type); average later "
                     f"with `corpus-io average ++output_dir={self.out} ++metric=loss`", all_ranks=False)
            return
        path = ckpt.average_checkpoints(self.out, num, metric, key="train_conf.avg_nbest_model",
                                        warn=lambda message: self.log(f"warning: {message}", all_ranks=False))
        chosen = ckpt.load_checkpoint(path)["averaged_epochs"]
        ranked = f"best cv {metric}" if self.cv_loader is not None else \
            f"best train {metric}: no valid_data_set_list, so the epochs are ranked by their training {metric}"
        self.log(f"averaged epochs {chosen} ({ranked}) -> {path}", all_ranks=False)

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
        self.skipped.epoch = 0
        if self.front_end is not None:
            self.front_end.set_epoch(self.epoch)
        self.model.train()
        epoch_meter, meter = Meter(), Meter()
        self.step_audio: list[float] = []  # audio seconds of each step of this rank (the ranks' spread, per epoch)
        step_seconds = 0.0
        micro = 0
        stop_reason = "data"
        unused_batches = unused_utts = 0
        batches = self._batches()
        tick = time.perf_counter()
        for batch, data_load in batches:
            self.launcher.check(ctx.rank, f"epoch {self.epoch} step {self.step_in_epoch + 1}", str(self.out))
            have, world_size = ranks_with_data(batch is not None)
            if have < world_size:
                if have:  # another rank ran out first: every rank carries the rest into the next epoch
                    self.train_loader.carry_rest(last_batch_trained=batch is None)
                if batch is not None:
                    unused_batches, unused_utts = self._drain(batch, batches)
                break
            micro += 1
            sync = micro % tc.accum_grad == 0
            want_acc = sync and (self.step_in_epoch + 1) % tc.log_interval == 0
            out = micro_step(self.sc, batch, sync=sync, want_acc=want_acc)
            self.step_keys += batch["keys"]
            step_seconds += float(batch.get("audio_seconds", 0.0))
            if math.isfinite(out["loss"]):  # a non-finite one poisons the step (skipped in _finish_step)
                meter.add_batch(out, batch, data_load)
                epoch_meter.add_batch(out, batch, data_load)
            if self.keys_file is not None:
                self.keys_file.write("".join(f"{self.epoch} {k}\n" for k in batch["keys"]))
            if sync:
                self.step_audio.append(step_seconds)
                step_seconds = 0.0
                tick = self._finish_step(meter, epoch_meter, tick)
                if self.global_step == 1:
                    self._warn_unknown_tokens()
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
        norm, stepped = optim_step(self.sc, self.optimizer, self.scheduler, self.tc.grad_clip)
        self._count_nonfinite(stepped, norm)
        sync_device(self.ctx.device)
        now = time.perf_counter()
        for m in (meter, epoch_meter):
            m.times["optim_time"] += now - t0
            m.times["total_time"] += now - tick
            m.steps += 1
        self.step_in_epoch += 1
        self.global_step += 1
        return now

    def _warn_unknown_tokens(self) -> None:
        """After the first step of a run: the transcripts read so far that hold tokens outside the token list (they
        train as ``<unk>``), counted over every rank, with what to do. Collective (every rank takes step 1)."""
        counts = self.train_loader.epoch_counts()
        unknown = all_reduce_sum(self.ctx, [counts.get("tokenize.unknown_tokens", 0)])[0]
        if not unknown:
            return
        where = self.tokenizer.conf.token_list or self.tokenizer.conf.bpe_model
        if self.init_param is not None:
            todo = (f"the checkpoint init_param {self.init_param} was trained with that token list, so its output "
                    f"layer has no place for them. Make a token list that holds them (corpus-io make-tokenizer on "
                    f"this training text), give it as ++tokenizer.token_list, and start the output layer fresh "
                    f"with ++train_conf.ignore_init_mismatch=true")
        else:
            todo = ("make a token list from this training text (corpus-io make-tokenizer) and give it as "
                    "++tokenizer.token_list")
        self.log(f"warning: the transcripts read for the first step hold {int(unknown)} token(s) outside the token "
                 f"list {where} (tokenize.unknown_tokens, on {self.ctx.world_size} rank(s)); they train as "
                 f"'{self.tokenizer.conf.unk}', and the epoch's count is in its 'epoch done' line. To learn them, "
                 f"{todo}.", all_ranks=False)

    def _count_nonfinite(self, stepped: bool, norm: float) -> None:
        keys, self.step_keys = self.step_keys, []
        where = f"epoch {self.epoch} step {self.step_in_epoch + 1}"
        warning = self.skipped.count(stepped, norm, where, self.ctx.rank, keys)
        if warning is not None:
            self.log(warning, all_ranks=True)  # every rank its own keys
            self.skipped.check(where)

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
            append_unused_keys(self.out, self.ctx.rank, self.epoch, unused)
        return nb, nu

    def _log_interval(self, m: Meter) -> None:
        lr = self.optimizer.param_groups[0]["lr"]
        line, scalars = interval_report(m, f"epoch: {self.epoch}/{self.tc.max_epoch}, step: {self.step_in_epoch} "
                                           f"(total {self.global_step})", lr, self.ctx.device)
        self.log(line)
        self.board.scalars(self.global_step, scalars)

    def _epoch_summary(self, m: Meter, stop_reason: str, unused_batches: int, unused_utts: int) -> dict:
        from corpus_io.model.cmvn import loader_counts

        wall = m.wall
        every = m.reduced(self.ctx)
        per_rank = all_gather_object(self.ctx, {"unused_batches": unused_batches, "unused_utts": unused_utts,
                                                "utts": m.utts, "counts": loader_counts(self.train_loader, epoch=True),
                                                "wall": wall, "widths": sorted(m.widths),
                                                "step_audio": getattr(self, "step_audio", [])})
        counts: dict = {}
        for r in per_rank:
            for k, v in r["counts"].items():
                counts[k] = counts.get(k, 0) + v
        skip = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"
        if self.ctx.is_main:
            line, scalars = epoch_report(every, per_rank, counts, skip, epoch=self.epoch, steps=self.step_in_epoch,
                                         stop_reason=stop_reason, resumed=self.resumed_mid_epoch,
                                         nonfinite=self.skipped.epoch)
            self.log(line, all_ranks=False)
            self.board.scalars(self.epoch, scalars)
        return {"loss": every.loss, "acc": m.acc, "utts": int(every.utts), "skips": skip}

    @torch.no_grad()
    def validate(self) -> dict:
        """cv loss and greedy token accuracy; each rank scores its split, the sums are all-reduced."""
        self.module.eval()
        self.cv_loader.set_epoch(0)
        self.cv_loader.what = f"cv loader in the validation of epoch {self.epoch}"
        meter = Meter()
        # the bare module, not DDP: ranks' cv splits differ in batches, and DDP's forward broadcasts buffers (each
        # rank's extra batch would wait for the others forever)
        sc = dataclasses.replace(self.sc, model=self.module)
        for batch in self.cv_loader:
            self.launcher.check(self.ctx.rank, f"the validation of epoch {self.epoch}", str(self.out))
            out = forward_loss(sc, batch, train=False)
            meter.add_scored(float(out.loss), len(batch["keys"]), *out.token_errors())
        every = meter.reduced(self.ctx)
        metrics = {"loss": every.loss, "acc": every.acc or 0.0, "utts": int(every.utts)}
        self.log(f"cv epoch {self.epoch} step {self.step_in_epoch}: loss {metrics['loss']:.3f}, "
                 f"acc {metrics['acc']:.3f} (1 - token error rate, greedy), {int(every.utts)} utts, "
                 f"{meter.wall:.1f}s", all_ranks=False)
        self.board.scalars(self.global_step, {"cv/loss": metrics["loss"], "cv/acc": metrics["acc"]})
        self.module.train()
        return metrics


def _absolute_paths(section: Any, *keys: str) -> None:
    """Make the local file paths under ``keys`` absolute (URLs stay as they are)."""
    from corpus_io.storage.urls import is_command, is_remote

    for key in keys:
        value = getattr(section, key, None)
        if isinstance(value, str) and value and not (is_remote(value) or is_command(value)):
            setattr(section, key, os.path.abspath(value))


def train(cfg: Any) -> None:
    """``corpus-io train``: one process, or one per rank under torchrun (env://)."""
    from corpus_io.config import require, resolve_intervals
    from corpus_io.loader.dataset import WorkerStartTimeout

    require(cfg, "output_dir")
    refuse_remote_output(cfg.output_dir, "++output_dir", "train")
    refuse_non_directory(cfg.output_dir, what="output_dir")  # before the tokenizer, model and init_param are read
    if not cfg.dataset_conf.sources:  # a weighted mix names its own lists
        require(cfg, "train_data_set_list")
    resolve_intervals(cfg.train_conf)
    if cfg.dataset_conf.num_workers > 0:  # forked now, while no thread runs (loader.workers): it shares our torch
        from corpus_io.loader.workers import start_forkserver

        start_forkserver(cfg.dataset_conf.worker_start_method)
    ctx = init_distributed(cfg.train_conf.device, cfg.train_conf.timeout_s)
    launcher = LauncherWatch()
    peers = PeerStop(ctx)
    try:
        start = prepare(cfg, ctx)  # init_param: read (or refused on every rank) before any file is written
        Trainer(cfg, ctx, start).run()
    except LauncherGone:
        raise
    except WorkerStartTimeout as exc:  # the other ranks wait in a collective: they say it too, and stop now
        peers.publish(str(exc))
        raise
    except Exception as exc:
        if not launcher.gone():
            raise
        # a peer that saw its launcher gone first left a collective this rank waits in: say why, not gloo's error
        raise LauncherGone(f"rank {ctx.rank}: its torchrun launcher (pid {launcher.pid}) is gone (killed, or it "
                           f"crashed), and the run stopped ({type(exc).__name__} in a collective with a rank that "
                           f"saw it first). {cfg.output_dir} holds the last checkpoint: rerun the same torchrun "
                           f"command to resume from it.") from None
    finally:
        peers.close()
        cleanup()
