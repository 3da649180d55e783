"""SpecAugment, spec_sub and spec_trim (WeNet semantics): the random draws, and their batched application.

The loader's stages (``corpus_io.loader.stages``, one utterance at a time) and the device front end
(``corpus_io.model.frontend``, a padded batch at once) draw the same values from a ``random.Random``
through :func:`plan`, so both apply identical augmentation for the same generator state. Per
utterance, in this order: spec_aug (``num_t_mask`` time spans of 1..max_t frames, then ``num_f_mask``
bands of 1..max_f bins, zeroed), spec_sub (``num_t_sub`` spans of 1..max_t frames replaced by the
frames ``pos`` earlier, pos in 0..start), spec_trim (1..max_t end frames cut unless that is half the
utterance or more). Spans are drawn inside the utterance's own frames, so padding is never touched.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class Plan:
    """The augmentation of one utterance: spans are ``[start, end)`` in frames / mel bins."""

    frames: int
    time_masks: list[tuple[int, int]] = field(default_factory=list)
    freq_masks: list[tuple[int, int]] = field(default_factory=list)
    subs: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, pos)
    trimmed: int | None = None  # frames kept after spec_trim, None: not trimmed


def draw_spec_aug(rng: random.Random, frames: int, bins: int, *, num_t_mask: int = 2, num_f_mask: int = 2,
                  max_t: int = 50, max_f: int = 10) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    time_masks, freq_masks = [], []
    for _ in range(num_t_mask):
        start = rng.randint(0, frames - 1)
        time_masks.append((start, min(frames, start + rng.randint(1, max_t))))
    for _ in range(num_f_mask):
        start = rng.randint(0, bins - 1)
        freq_masks.append((start, min(bins, start + rng.randint(1, max_f))))
    return time_masks, freq_masks


def draw_spec_sub(rng: random.Random, frames: int, *, max_t: int = 30,
                  num_t_sub: int = 3) -> list[tuple[int, int, int]]:
    subs = []
    for _ in range(num_t_sub):
        start = rng.randint(0, frames - 1)
        end = min(frames, start + rng.randint(1, max_t))
        subs.append((start, end, rng.randint(0, start)))
    return subs


def draw_spec_trim(rng: random.Random, frames: int, *, max_t: int = 20) -> int | None:
    length = rng.randint(1, max_t)
    return frames - length if length < frames / 2 else None


def plan(rng: random.Random, frames: int, bins: int, *, spec_aug: dict | None = None, spec_sub: dict | None = None,
         spec_trim: dict | None = None) -> Plan:
    """The draws for one utterance of ``frames`` x ``bins``; a ``None`` conf skips that augmentation."""
    p = Plan(frames)
    if spec_aug is not None:
        p.time_masks, p.freq_masks = draw_spec_aug(rng, frames, bins, **spec_aug)
    if spec_sub is not None:
        p.subs = draw_spec_sub(rng, frames, **spec_sub)
    if spec_trim is not None:
        p.trimmed = draw_spec_trim(rng, frames, **spec_trim)
    return p


def _span_tensor(spans: Sequence[Sequence[tuple]], width: int, device: torch.device) -> torch.Tensor:
    """(B, K, width) int64 of each row's spans, rows padded with empty spans (0, 0, 0...)."""
    k = max((len(s) for s in spans), default=0)
    rows = [list(s) + [(0,) * width] * (k - len(s)) for s in spans]
    return torch.tensor(rows, dtype=torch.int64).reshape(len(spans), k, width).to(device)


def apply(feats: torch.Tensor, lengths: torch.Tensor, plans: Sequence[Plan]) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply one :class:`Plan` per row of padded ``feats`` (B, T, D); returns ``(feats, lengths)``.

    Equal to the loader stages on each row cut to its length; frames at or past a row's (new) length
    are 0, and after spec_trim the width is the longest kept row (as the loader pads a trimmed batch).
    """
    device = feats.device
    batch, width, bins = feats.shape
    t = torch.arange(width, device=device)
    if any(p.time_masks or p.freq_masks for p in plans):
        spans = _span_tensor([p.time_masks for p in plans], 2, device)
        hit_t = ((t[None, None, :] >= spans[..., :1]) & (t[None, None, :] < spans[..., 1:])).any(dim=1)
        f = torch.arange(bins, device=device)
        bands = _span_tensor([p.freq_masks for p in plans], 2, device)
        hit_f = ((f[None, None, :] >= bands[..., :1]) & (f[None, None, :] < bands[..., 1:])).any(dim=1)
        feats = feats.masked_fill(hit_t[:, :, None] | hit_f[:, None, :], 0.0)
    if any(p.subs for p in plans):
        subs = _span_tensor([p.subs for p in plans], 3, device)
        source = t.expand(batch, width)
        for j in range(subs.shape[1]):  # later spans win where they overlap, as sequential assignment does
            start, end, pos = subs[:, j, 0:1], subs[:, j, 1:2], subs[:, j, 2:3]
            source = torch.where((t >= start) & (t < end), t - pos, source)
        feats = feats.gather(1, source.unsqueeze(-1).expand(batch, width, bins))
    if any(p.trimmed is not None for p in plans):
        kept = [p.frames if p.trimmed is None else p.trimmed for p in plans]
        lengths = torch.tensor(kept, dtype=lengths.dtype).to(device)
        width = int(lengths.max()) if len(kept) else 0  # the padded width follows the longest kept row,
        feats = (feats * (t[None, :] < lengths[:, None]).unsqueeze(-1))[:, :width]  # as the loader pads
    return feats, lengths
