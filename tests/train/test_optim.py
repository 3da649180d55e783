"""Optimizer and scheduler builders (corpus_io.train.optim)."""

from __future__ import annotations

import torch

from corpus_io.config import OptimConf, SchedulerConf
from corpus_io.train.optim import build_optimizer, build_scheduler


def test_warmuplr_peaks_at_warmup_steps():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, SchedulerConf(scheduler="warmuplr", warmup_steps=10))
    lrs = []
    for _ in range(30):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert max(range(30), key=lambda i: lrs[i]) == 9 and abs(lrs[9] - 1.0) < 1e-6
    assert lrs[0] < lrs[5] < lrs[9] > lrs[20]


def test_the_optimizer_is_the_one_optim_conf_names_with_its_lr_and_weight_decay():
    params = [torch.nn.Parameter(torch.zeros(2))]
    for name, kind in (("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)):
        opt = build_optimizer(params, OptimConf(optim=name, lr=0.25, weight_decay=0.5))
        assert type(opt) is kind and opt.param_groups[0]["lr"] == 0.25
        assert opt.param_groups[0]["weight_decay"] == 0.5
