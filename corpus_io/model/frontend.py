"""The device front end (``dataset_conf.feats_on=model``): padded waveforms -> Kaldi features -> augmentation.

The loader ships ``wav`` (B, N), ``wav_lengths`` and ``feats_lengths`` (the frames Kaldi makes from
each row: what its filters and batch budgets counted). Train, cv, decode and compute-cmvn call
:func:`model_inputs`, which runs :func:`corpus_io.audio.features.batch_fbank` (or ``batch_mfcc``) on the
model's device, then in train mode spec_aug / spec_sub / spec_trim (:mod:`corpus_io.audio.augment`), and
hands ``(feats, feats_lengths)`` to the model (which applies CMVN). Before features, in train mode, the
waveform augmentation the loader drew (``augment``: impulse response, noise samples, SNR, gain) runs batched
there (:func:`corpus_io.audio.mix.apply_plans`, the function the loader path applies per utterance). With
``feats_on=loader`` the batch already carries ``feats`` and passes through unchanged.

Randomness: each utterance draws its augmentation from ``random.Random(f"{seed}:{epoch}:{key}")`` and its
dither from :func:`corpus_io.audio.features.dither_seed` (the loader's fbank/mfcc stages use the same seed), with
``dataset_conf.seed``: the same utterance in the same epoch is augmented and dithered the same way whatever batch,
rank or worker it lands in, and after a resume. Dither is training's only: cv and decode compute it without; the
digital silence the loader padded (``silence_pad``) is never dithered.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch

from corpus_io.audio import augment, features, mix
from corpus_io.errors import ConfigError


class FrontEnd:
    """Features (and, in train mode, augmentation) of waveform batches on ``device``."""

    def __init__(self, conf: Any, device: torch.device | str = "cpu") -> None:
        self.conf = conf
        self.device = torch.device(device)
        self.epoch = 0
        self.kind = conf.feats_type
        c = conf.fbank_conf if self.kind == "fbank" else conf.mfcc_conf
        self.options = {k: v for k, v in dataclasses.asdict(c).items() if k != "dither"}
        self.dither = float(c.dither)
        self.bins = int(c.num_mel_bins if self.kind == "fbank" else c.num_ceps)
        self.augment = {name: dataclasses.asdict(getattr(conf, f"{name}_conf"))
                        for name in ("spec_aug", "spec_sub", "spec_trim") if getattr(conf, name)}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __call__(self, batch: dict, *, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``(feats (B, T, D), feats_lengths (B,))`` on the device from a (CPU) waveform batch."""
        wav = batch["wav"].to(self.device, non_blocking=True)
        lengths = batch["wav_lengths"].to(self.device, non_blocking=True)
        if train and batch.get("augment"):  # reverb, noise, volume as the loader drew them (audio.mix)
            wav = mix.apply_plans(mix.as_float(wav), lengths, batch["augment"], int(batch["sample_rate"]))
        rngs = None
        if train and self.augment:
            rngs = [random.Random(f"{self.conf.seed}:{self.epoch}:{key}") for key in batch["keys"]]
        seeds = ([features.dither_seed(self.conf.seed, self.epoch, key) for key in batch["keys"]]
                 if train and self.dither else None)
        compute = features.batch_fbank if self.kind == "fbank" else features.batch_mfcc
        # the loader's digital silence (silence_pad) is not dithered: exact zeros, as decode computes them
        silence = [(plan or {}).get("silence") for plan in batch.get("augment") or []] if seeds else None
        feats, frames = compute(wav, lengths, int(batch["sample_rate"]), dither=self.dither if seeds else 0.0,
                                seeds=seeds, silence=silence if silence and any(silence) else None, **self.options)
        if rngs is not None:
            plans = [augment.plan(rng, int(n), self.bins, **self.augment)
                     for rng, n in zip(rngs, batch["feats_lengths"].tolist())]
            feats, frames = augment.apply(feats, frames, plans)
        return feats, frames


def resolve_device_defaults(conf: Any, device: torch.device) -> str:
    """Settle ``dataset_conf``'s device-dependent defaults in place and say what they became (for the log).

    ``feats_on=auto``: features on the model's device when it is a GPU (a fast GPU waits for loader-side
    features: 35-44 % of its time on an H100 at 8 workers), in the loader workers on a CPU (the model's own
    cores are busy). ``pin_memory`` unset: pinned on CUDA (asynchronous copies), off on a CPU."""
    cuda = torch.device(device).type == "cuda"
    if conf.feats_on == "auto":
        conf.feats_on = "model" if cuda and conf.feats_type in ("fbank", "mfcc") else "loader"
    if conf.pin_memory is None:
        conf.pin_memory = cuda
    where = f"on the model's device ({device})" if conf.feats_on == "model" else "in the loader workers"
    return f"features {conf.feats_type} computed {where} (feats_on={conf.feats_on}), pin_memory={conf.pin_memory}"


def build_front_end(conf: Any, device: torch.device | str = "cpu") -> FrontEnd | None:
    """The front end of ``conf`` (None with feats_on=loader: the loader computed the features)."""
    return FrontEnd(conf, device) if conf.feats_on == "model" else None


def model_inputs(front_end: FrontEnd | None, batch: dict, device: torch.device, *,
                 train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(feats, feats_lengths)`` on ``device`` for the model, from either kind of batch."""
    if "wav" in batch:
        if front_end is None:
            raise ConfigError("the loader shipped waveforms (dataset_conf.feats_on=model) but no front end was "
                              "built; pass the same dataset_conf to the loader and the front end.")
        return front_end(batch, train=train)
    non_blocking = device.type == "cuda"
    return (batch["feats"].to(device, non_blocking=non_blocking),
            batch["feats_lengths"].to(device, non_blocking=non_blocking))


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock time covers it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
