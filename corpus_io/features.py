"""Kaldi features, per utterance and batched: the one home of feature computation.

Per utterance (the loader's fbank/mfcc stages, add-field, the benches): :func:`fbank` and
:func:`mfcc` call ``torchaudio.compliance.kaldi`` on one ``(1, num_samples)`` waveform in [-1, 1],
as WeNet does (int16 scale, energy_floor 0, dither added to the samples from a seeded generator).

Batched (``dataset_conf.feats_on=model``: features on the training device): :func:`batch_fbank` and
:func:`batch_mfcc` take padded waveforms ``(B, N)`` plus their lengths in samples and compute the same
features in plain torch ops on the waveforms' device, every frame from its own samples only, so
padding never changes a valid frame. Options are Kaldi's as torchaudio applies them with our
arguments: povey window, pre-emphasis 0.97, DC offset removed per frame, FFT size the next power of
two, power spectrum, log with a floor of float32 eps, ``snip_edges`` (only frames that fit:
:func:`num_frames`). MFCC adds Kaldi's DCT (C0 weighted sqrt(1/num_mel_bins)) and the 22 lifter
(torchaudio's ``use_energy=False``: C0 stays the DCT's).

Units: frame_length/frame_shift in ms, sample rates in Hz, lengths in samples (waveforms) or frames.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

INT16_SCALE = float(1 << 15)  # WeNet/Kaldi feed the samples as 16-bit integers
EPSILON = torch.finfo(torch.float32).eps  # Kaldi's log floor (numeric_limits<float>::epsilon)
PREEMPHASIS = 0.97
LOW_FREQ = 20.0  # Hz, fbank's default low cutoff


def window_geometry(sample_rate: int, frame_length: float = 25.0, frame_shift: float = 10.0) -> tuple[int, int, int]:
    """``(window, shift, fft_size)`` in samples, exactly as torchaudio.compliance.kaldi derives them."""
    shift = int(sample_rate * frame_shift * 0.001)
    window = int(sample_rate * frame_length * 0.001)
    return window, shift, 1 if window == 0 else 2 ** (window - 1).bit_length()


def num_frames(num_samples: int, sample_rate: int, frame_length: float = 25.0, frame_shift: float = 10.0) -> int:
    """Frames Kaldi makes from ``num_samples`` (snip_edges): ``1 + (n - window) // shift``, 0 below one window."""
    window, shift, _ = window_geometry(sample_rate, frame_length, frame_shift)
    return 0 if num_samples < window else 1 + (num_samples - window) // shift


# --------------------------------------------------------------------------- per utterance (torchaudio)


def dithered(wav: torch.Tensor, dither: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``wav`` in [-1, 1] at WeNet's int16 scale; dither (if any) drawn from ``generator`` on the samples."""
    wav = wav * INT16_SCALE
    if dither:
        wav = wav + dither * torch.randn(wav.shape, generator=generator, device=wav.device)
    return wav


def fbank(wav: torch.Tensor, sample_rate: int, *, num_mel_bins: int = 80, frame_length: float = 25.0,
          frame_shift: float = 10.0, dither: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Kaldi fbank ``(num_frames, num_mel_bins)`` of one ``(1, num_samples)`` waveform in [-1, 1]
    (no frames below one window, where torchaudio would raise)."""
    from torchaudio.compliance import kaldi

    if num_frames(wav.shape[-1], sample_rate, frame_length, frame_shift) == 0:
        return wav.new_zeros(0, num_mel_bins)

    return kaldi.fbank(dithered(wav, dither, generator), num_mel_bins=num_mel_bins, frame_length=frame_length,
                       frame_shift=frame_shift, dither=0.0, energy_floor=0.0, sample_frequency=sample_rate)


def mfcc(wav: torch.Tensor, sample_rate: int, *, num_mel_bins: int = 40, num_ceps: int = 40,
         frame_length: float = 25.0, frame_shift: float = 10.0, dither: float = 0.0, high_freq: float = -200.0,
         low_freq: float = 20.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Kaldi MFCC ``(num_frames, num_ceps)`` of one ``(1, num_samples)`` waveform in [-1, 1] (WeNet's arguments)."""
    from torchaudio.compliance import kaldi

    if num_frames(wav.shape[-1], sample_rate, frame_length, frame_shift) == 0:
        return wav.new_zeros(0, num_ceps)

    return kaldi.mfcc(dithered(wav, dither, generator), num_mel_bins=num_mel_bins, frame_length=frame_length,
                      frame_shift=frame_shift, dither=0.0, num_ceps=num_ceps, high_freq=high_freq,
                      low_freq=low_freq, energy_floor=0.0, sample_frequency=sample_rate)


# --------------------------------------------------------------------------- batched (plain torch ops)

_CONSTANTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _constants(sample_rate: int, window: int, fft_size: int, num_mel_bins: int, low_freq: float, high_freq: float,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The povey window (window,) and the mel matrix (fft_size // 2 + 1, num_mel_bins) on ``device``, built once."""
    key = (sample_rate, window, fft_size, num_mel_bins, low_freq, high_freq, str(device))
    found = _CONSTANTS.get(key)
    if found is None:
        from torchaudio.compliance.kaldi import get_mel_banks

        povey = torch.hann_window(window, periodic=False, dtype=torch.float32).pow(0.85)
        banks, _ = get_mel_banks(num_mel_bins, fft_size, float(sample_rate), low_freq, high_freq, 100.0, -500.0, 1.0)
        mel = torch.nn.functional.pad(banks.float(), (0, 1)).T.contiguous()  # Nyquist bin weighs 0, as in Kaldi
        found = _CONSTANTS[key] = (povey.to(device), mel.to(device))
    return found


def _frame_samples(wav: torch.Tensor, lengths: torch.Tensor, sample_rate: int, frame_length: float,
                   frame_shift: float, dither: float, seeds: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames ``(B, T, window)`` at int16 scale (dithered, DC removed) and valid frames per row ``(B,)``."""
    window, shift, _ = window_geometry(sample_rate, frame_length, frame_shift)
    x = wav.float() if wav.dtype == torch.int16 else wav.float() * INT16_SCALE
    if dither and seeds is not None:
        x = x + dither * _noise(lengths, x.shape[1], seeds, x.device)
    frames = torch.where(lengths >= window, torch.div(lengths - window, shift, rounding_mode="floor") + 1, 0)
    if x.shape[1] < window:  # no row has a frame
        return x.new_zeros(x.shape[0], 0, window), frames
    strided = x.unfold(1, window, shift)  # (B, T, window): a view, every frame its own samples
    strided = strided - strided.mean(dim=-1, keepdim=True)
    return strided, frames


def _noise(lengths: torch.Tensor, width: int, seeds: Sequence[int], device: torch.device) -> torch.Tensor:
    """Gaussian dither per utterance from its own seed, so it does not depend on the batch it is in."""
    noise = torch.zeros(len(seeds), width, device=device)
    generator = torch.Generator(device=device)
    for i, (seed, n) in enumerate(zip(seeds, lengths.tolist())):
        generator.manual_seed(int(seed))
        noise[i, :n] = torch.randn(int(n), generator=generator, device=device)
    return noise


def _log_mel(strided: torch.Tensor, sample_rate: int, num_mel_bins: int, low_freq: float,
             high_freq: float) -> torch.Tensor:
    window = strided.shape[-1]
    fft_size = 1 if window == 0 else 2 ** (window - 1).bit_length()
    povey, mel = _constants(sample_rate, window, fft_size, num_mel_bins, low_freq, high_freq, strided.device)
    # pre-emphasis with the first sample repeated (x[j] - 0.97 x[max(0, j - 1)]), then the window
    previous = torch.cat([strided[..., :1], strided[..., :-1]], dim=-1)
    spectrum = torch.fft.rfft((strided - PREEMPHASIS * previous) * povey, n=fft_size)
    power = spectrum.real.square() + spectrum.imag.square()
    return torch.matmul(power, mel).clamp_min(EPSILON).log()


def _valid(feats: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """Zero every frame at or past its row's length (padding carries no values)."""
    mask = torch.arange(feats.shape[1], device=feats.device)[None, :] < frames[:, None]
    return feats * mask.unsqueeze(-1)


def batch_fbank(wav: torch.Tensor, lengths: torch.Tensor, sample_rate: int, *, num_mel_bins: int = 80,
                frame_length: float = 25.0, frame_shift: float = 10.0, dither: float = 0.0,
                seeds: Sequence[int] | None = None, low_freq: float = LOW_FREQ,
                high_freq: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Kaldi fbank of padded waveforms: ``(feats (B, T, num_mel_bins), frames (B,))``.

    ``wav`` (B, N): int16 samples, or float in [-1, 1] (scaled by 2^15 like :func:`fbank`);
    ``lengths`` (B,) samples. Equals :func:`fbank` of each row cut to its length (dither 0), frame
    for frame; frames past a row's count are 0. ``dither`` > 0 needs ``seeds`` (one per row).
    """
    strided, frames = _frame_samples(wav, lengths, sample_rate, frame_length, frame_shift, dither, seeds)
    if strided.shape[1] == 0:  # the FFT refuses empty input
        return strided.new_zeros(strided.shape[0], 0, num_mel_bins), frames
    return _valid(_log_mel(strided, sample_rate, num_mel_bins, low_freq, high_freq), frames), frames


_DCT: dict[tuple, torch.Tensor] = {}


def _dct_lifter(num_mel_bins: int, num_ceps: int, lifter: float, device: torch.device) -> torch.Tensor:
    """Kaldi's DCT (orthonormal, C0 weighted sqrt(1/num_mel_bins)) times the lifter: (num_mel_bins, num_ceps)."""
    key = (num_mel_bins, num_ceps, lifter, str(device))
    if key not in _DCT:
        n = torch.arange(num_mel_bins, dtype=torch.float64)
        k = torch.arange(num_ceps, dtype=torch.float64)
        dct = torch.cos(math.pi / num_mel_bins * (n[:, None] + 0.5) * k[None, :]) * math.sqrt(2.0 / num_mel_bins)
        dct[:, 0] = math.sqrt(1.0 / num_mel_bins)
        if lifter:
            dct = dct * (1.0 + 0.5 * lifter * torch.sin(math.pi * k / lifter))[None, :]
        _DCT[key] = dct.float().to(device)
    return _DCT[key]


def batch_mfcc(wav: torch.Tensor, lengths: torch.Tensor, sample_rate: int, *, num_mel_bins: int = 40,
               num_ceps: int = 40, frame_length: float = 25.0, frame_shift: float = 10.0, dither: float = 0.0,
               seeds: Sequence[int] | None = None, high_freq: float = -200.0,
               low_freq: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Kaldi MFCC of padded waveforms: ``(feats (B, T, num_ceps), frames (B,))`` (see :func:`batch_fbank`)."""
    strided, frames = _frame_samples(wav, lengths, sample_rate, frame_length, frame_shift, dither, seeds)
    if strided.shape[1] == 0:
        return strided.new_zeros(strided.shape[0], 0, num_ceps), frames
    ceps = torch.matmul(_log_mel(strided, sample_rate, num_mel_bins, low_freq, high_freq),
                        _dct_lifter(num_mel_bins, num_ceps, 22.0, strided.device))
    return _valid(ceps, frames), frames
