"""The optimizer and learning-rate scheduler of ``optim_conf`` / ``scheduler_conf``."""

from __future__ import annotations

from typing import Any

import torch


def build_optimizer(params: Any, conf: Any) -> torch.optim.Optimizer:
    """adamw | adam | sgd (momentum 0.9) with ``conf.lr`` and ``conf.weight_decay``."""
    if conf.optim == "adamw":
        return torch.optim.AdamW(params, lr=conf.lr, weight_decay=conf.weight_decay)
    if conf.optim == "adam":
        return torch.optim.Adam(params, lr=conf.lr, weight_decay=conf.weight_decay)
    return torch.optim.SGD(params, lr=conf.lr, weight_decay=conf.weight_decay, momentum=0.9)


def build_scheduler(optimizer: torch.optim.Optimizer, conf: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """warmuplr (ESPnet/FunASR WarmupLR): lr * warmup^0.5 * min(step^-0.5, step * warmup^-1.5); or constant.
    Steps count optimizer steps."""
    if conf.scheduler == "constant" or conf.warmup_steps <= 0:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    warmup = float(conf.warmup_steps)

    def factor(step: int) -> float:
        s = step + 1
        return warmup ** 0.5 * min(s ** -0.5, s * warmup ** -1.5)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
