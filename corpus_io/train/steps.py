"""One training or validation step on a batch: the forward pass and CTC loss written once
(:func:`forward_loss`), the micro-step (forward + backward) and the optimizer step.

Everything here takes a :class:`StepContext` and a padded batch (docs/DEVELOPING.md, "The sample dict");
nothing reads the config, the loader or the process group, so a test drives it with a real model alone.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from corpus_io.errors import DataError
from corpus_io.model.frontend import sync_device


def ctc_loss(log_probs: torch.Tensor, out_lengths: torch.Tensor, target: torch.Tensor,
             target_lengths: torch.Tensor) -> torch.Tensor:
    """Mean over utterances of the CTC loss (sum over each utterance's frames), blank id 0."""
    loss = F.ctc_loss(log_probs.transpose(0, 1).float(), target.clamp(min=0), out_lengths, target_lengths,
                      blank=0, reduction="sum", zero_infinity=True)
    return loss / max(int(log_probs.shape[0]), 1)


def greedy_ids(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best path per utterance: argmax, merge repeats, drop blanks (id 0)."""
    from corpus_io.decoding.beam import best_path_ids

    return best_path_ids(log_probs, lengths)


def token_errors(log_probs: torch.Tensor, lengths: torch.Tensor, target: torch.Tensor,
                 target_lengths: torch.Tensor) -> tuple[int, int]:
    """(edit errors, reference tokens) of the greedy path: accuracy = 1 - errors / tokens."""
    from corpus_io.decoding.scoring import edit_counts

    errors = total = 0
    for hyp, ref, n in zip(greedy_ids(log_probs, lengths), target.cpu().tolist(), target_lengths.cpu().tolist()):
        counts = edit_counts(ref[: int(n)], hyp)
        errors += counts.errors
        total += counts.ref
    return errors, total


@dataclass
class StepContext:
    """What a step needs besides the batch (built once by the Trainer, or by a test)."""

    model: torch.nn.Module
    device: torch.device = torch.device("cpu")
    accum_grad: int = 1
    amp_dtype: torch.dtype | None = None
    scaler: Any = None
    front_end: Any = None  # feats_on=model: corpus_io.model.frontend.FrontEnd


@dataclass
class Forward:
    """What :func:`forward_loss` returns: the mean CTC loss and what accuracy is scored from."""

    loss: torch.Tensor
    log_probs: torch.Tensor
    out_lengths: torch.Tensor
    target: torch.Tensor
    target_lengths: torch.Tensor

    def token_errors(self) -> tuple[int, int]:
        return token_errors(self.log_probs.detach(), self.out_lengths, self.target, self.target_lengths)


def to_device(batch: dict, device: torch.device) -> dict:
    non_blocking = device.type == "cuda"
    return {k: (v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v)
            for k, v in batch.items()}


def forward_loss(sc: StepContext, batch: dict, *, train: bool) -> Forward:
    """Model inputs (the device front end's features with ``feats_on=model``, augmented when ``train``),
    the forward pass under autocast, and the CTC loss (for a hybrid CTC/attention model, one with
    ``needs_target``, weighted with its attention loss): the one forward of training and validation."""
    from corpus_io.model.frontend import model_inputs

    b = to_device({k: v for k, v in batch.items() if k not in ("feats", "wav")}, sc.device)
    # outside autocast: the front end computes Kaldi features in float32
    feats, feats_lengths = model_inputs(sc.front_end, batch, sc.device, train=train)
    inner = getattr(sc.model, "module", sc.model)  # under DDP
    hybrid = getattr(inner, "needs_target", False)  # CTC/attention: the model also returns its attention loss
    with _autocast(sc.device, sc.amp_dtype):
        if hybrid:
            log_probs, out_lengths, att_loss = sc.model(feats, feats_lengths, b["target"], b["target_lengths"])
        else:
            log_probs, out_lengths = sc.model(feats, feats_lengths)
    loss = ctc_loss(log_probs, out_lengths, b["target"], b["target_lengths"])
    if hybrid:
        loss = inner.ctc_weight * loss + (1.0 - inner.ctc_weight) * att_loss.float()
    return Forward(loss, log_probs, out_lengths, b["target"], b["target_lengths"])


def micro_step(sc: StepContext, batch: dict, *, sync: bool, want_acc: bool = False) -> dict:
    """Forward + backward of one micro-batch; gradients sync across ranks only when ``sync``.

    Returns ``{"loss", "utts", "errors", "tokens", "forward_time", "backward_time"}`` (times in seconds).
    """
    no_sync = getattr(sc.model, "no_sync", None)
    guard = no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()
    with guard:
        t0 = time.perf_counter()
        out = forward_loss(sc, batch, train=True)
        sync_device(sc.device)
        t1 = time.perf_counter()
        scaled = out.loss / sc.accum_grad
        (sc.scaler.scale(scaled) if sc.scaler is not None else scaled).backward()
        sync_device(sc.device)
        t2 = time.perf_counter()
    errors, tokens = out.token_errors() if want_acc else (0, 0)
    return {"loss": float(out.loss.detach()), "utts": len(batch["keys"]), "errors": errors, "tokens": tokens,
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


@dataclass
class SkippedSteps:
    """Optimizer steps skipped for a non-finite loss or gradient norm (icefall skips such batches too): counted in a
    row, in the run and in the epoch (since it began or was resumed); ``limit`` in a row stop training, naming the
    likely :attr:`causes` (of the run's ``cmvn_file`` and learning rate ``lr``). The norm is of the gradients DDP
    averaged, so every rank counts the same at the same step (no rank is left waiting)."""

    limit: int
    cmvn_file: str | None = None
    lr: float = 0.0
    in_a_row: int = 0
    total: int = 0
    epoch: int = 0

    def count(self, stepped: bool, norm: float, where: str, rank: int, keys: list[str]) -> str | None:
        """Count one optimizer step at ``where`` (``epoch E step S``); for a skipped one, the warning to log, naming
        ``rank``'s batch ``keys`` (which rank's batch held the bad value is not known after the all-reduce)."""
        if stepped:
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        self.total += 1
        self.epoch += 1
        more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
        return (f"warning: {where}: non-finite loss or gradient norm ({norm}); the step was skipped ({self.in_a_row} "
                f"in a row, {self.total} in all); rank {rank}'s batch: keys {', '.join(keys[:5])}{more}")

    @property
    def causes(self) -> str:
        return nonfinite_causes(self.cmvn_file, self.lr)

    def check(self, where: str) -> None:
        """A DataError once ``limit`` steps in a row were skipped."""
        if self.in_a_row >= self.limit:
            raise DataError(f"train: {self.in_a_row} optimizer steps in a row had a non-finite loss or gradient norm "
                            f"(train_conf.max_nonfinite_steps={self.limit}; each was skipped), at {where}. Training "
                            f"stopped; no checkpoint of this state was written. {self.causes}")


def nonfinite_causes(cmvn_file: str | None, lr: float) -> str:
    """The likely causes of a non-finite loss or model, in the order to check them."""
    cmvn = (f"the CMVN file (cmvn_file={cmvn_file}: recompute it with compute-cmvn on the training list)"
            if cmvn_file else "unnormalised features (no cmvn_file: compute one with compute-cmvn)")
    return (f"Likely causes: {cmvn}, a learning rate too high for this model (optim_conf.lr={lr}: lower it, or "
            f"lengthen scheduler_conf.warmup_steps; train_conf.grad_clip bounds each step), or bad data (an empty or "
            f"corrupt utterance: check the list with verify-shards and dataset_conf.filter_conf).")


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
