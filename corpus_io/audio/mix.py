"""Waveform augmentation math, batched: reverberation, noise at an SNR, gain, and the peak guard.

Every function takes padded float waveforms ``wav`` (B, N) in [-1, 1] and ``lengths`` (B,) in samples, and
works on whatever device they are on: the loader calls it with one row on the CPU, the device front end
(``feats_on=model``) with a batch on the model's device, so both paths compute the same thing (equal within
float rounding: the FFT sizes follow the batch). Samples at or past a row's length stay 0.

* Active samples (:func:`active_mask`): the signal cut in 20 ms frames; a frame is active when its mean power
  is above 1 % (-20 dB) of the row's mean frame power (ESPnet's ``detect_non_silence`` rule). SNRs and the
  reverberation's energy are measured on them, so leading/trailing silence does not dilute the speech.
* Reverberation (:func:`reverberate`): FFT convolution with the row's impulse response, cut so that the
  response's direct path (its largest magnitude) lands on sample 0 (the labels keep their timing), then
  scaled to the dry signal's active power (ESPnet's ``_convolve_rir`` normalisation; Lhotse's
  ``normalize_output`` keeps the energy the same way).
* Noise (:func:`add_noise`): the noise scaled so that speech active power / noise power on the same samples
  is ``10^(snr_db/10)``, then added.
* Peak guard (:func:`peak_guard`): a row whose peak passes full scale is scaled down as a whole (the SNR
  stays), so a 16-bit write never clips.
"""

from __future__ import annotations

import torch

FRAME_SECONDS = 0.02
ACTIVE_RATIO = 0.01  # -20 dB below the mean frame power (ESPnet's detect_non_silence threshold)
FULL_SCALE = 32767.0 / 32768.0  # the largest int16 sample, at the [-1, 1] scale


def valid_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) bool: the samples before each row's length."""
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def active_mask(wav: torch.Tensor, lengths: torch.Tensor, sample_rate: int) -> torch.Tensor:
    """(B, N) bool: the samples of the active 20 ms frames of each row (all valid samples of a silent row)."""
    batch, width = wav.shape
    frame = max(1, int(sample_rate * FRAME_SECONDS))
    frames = -(-width // frame)
    padded = torch.nn.functional.pad(wav * valid_mask(lengths, width), (0, frames * frame - width))
    power = padded.reshape(batch, frames, frame).pow(2).mean(dim=2)
    counted = torch.arange(frames, device=wav.device)[None, :] < (-(-lengths // frame))[:, None]
    mean = (power * counted).sum(dim=1) / counted.sum(dim=1).clamp(min=1)
    active = (power > ACTIVE_RATIO * mean[:, None]) & counted
    active |= (~active.any(dim=1, keepdim=True)) & counted  # silence: every valid sample counts
    mask = active.repeat_interleave(frame, dim=1)[:, :width]
    return mask & valid_mask(lengths, width)


def masked_power(wav: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) mean square of each row over ``mask``."""
    return (wav.pow(2) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def peak_guard(wav: torch.Tensor) -> torch.Tensor:
    """Rows whose peak passes full scale, scaled down as a whole to peak at it."""
    peak = wav.abs().amax(dim=1, keepdim=True) if wav.shape[1] else wav.new_zeros(wav.shape[0], 1)
    return wav * torch.where(peak > FULL_SCALE, FULL_SCALE / peak.clamp(min=FULL_SCALE), torch.ones_like(peak))


def direct_path(rirs: torch.Tensor) -> torch.Tensor:
    """(B,) int64: each impulse response's direct path, the index of its largest magnitude."""
    return rirs.abs().argmax(dim=1)


def reverberate(wav: torch.Tensor, lengths: torch.Tensor, rirs: torch.Tensor, rir_lengths: torch.Tensor,
                sample_rate: int) -> torch.Tensor:
    """``wav`` (B, N) convolved with ``rirs`` (B, R) (zero padded past ``rir_lengths``), aligned to the direct
    path, same lengths, scaled to the dry active power."""
    batch, width = wav.shape
    if width == 0:
        return wav
    rirs = rirs * valid_mask(rir_lengths, rirs.shape[1])
    n = width + rirs.shape[1] - 1
    size = 1 << (n - 1).bit_length()
    wet = torch.fft.irfft(torch.fft.rfft(wav, size) * torch.fft.rfft(rirs, size), size)
    index = direct_path(rirs)[:, None] + torch.arange(width, device=wav.device)[None, :]
    wet = wet.gather(1, index) * valid_mask(lengths, width)
    dry_power = masked_power(wav, active_mask(wav, lengths, sample_rate))
    wet_power = masked_power(wet, active_mask(wet, lengths, sample_rate))
    return wet * torch.sqrt(dry_power / wet_power.clamp(min=1e-20))[:, None]


def add_noise(wav: torch.Tensor, lengths: torch.Tensor, noise: torch.Tensor, snr_db: torch.Tensor,
              sample_rate: int) -> torch.Tensor:
    """``wav`` plus ``noise`` (B, N, already cut to each row) scaled to ``snr_db`` (B,) on the speech's
    active samples, through the peak guard. A silent noise row adds nothing."""
    mask = active_mask(wav, lengths, sample_rate)
    speech, noise_power = masked_power(wav, mask), masked_power(noise, mask)
    ratio = torch.pow(10.0, snr_db.to(wav.dtype) / 10.0)
    gain = torch.where(noise_power > 0, torch.sqrt(speech / (noise_power.clamp(min=1e-20) * ratio)),
                       torch.zeros_like(speech))
    return peak_guard(wav + gain[:, None] * noise * valid_mask(lengths, wav.shape[1]))


def apply_gain(wav: torch.Tensor, gain_db: torch.Tensor) -> torch.Tensor:
    """``wav`` times ``10^(gain_db/20)`` (B,), through the peak guard."""
    return peak_guard(wav * torch.pow(10.0, gain_db.to(wav.dtype) / 20.0)[:, None])


def looped(segment: torch.Tensor, offset: int, length: int) -> torch.Tensor:
    """``length`` samples of ``segment`` (1-D) from ``offset``, wrapping round to its start (short noise loops)."""
    index = (offset + torch.arange(length)) % segment.shape[0]
    return segment[index]


def as_float(x: torch.Tensor) -> torch.Tensor:
    """int16 samples at the [-1, 1] scale (k / 32768, exact); float ones as float32."""
    return x.float() / 32768.0 if x.dtype == torch.int16 else x.float()


def _rows(plans: list[dict], name: str) -> list[int]:
    return [i for i, p in enumerate(plans) if p and p.get(name) is not None]


def _stack(rows: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([r.shape[0] for r in rows], dtype=torch.int64)
    padded = torch.nn.utils.rnn.pad_sequence([as_float(r) for r in rows], batch_first=True)
    return padded.to(device), lengths.to(device)


def apply_plans(wav: torch.Tensor, lengths: torch.Tensor, plans: list[dict | None], sample_rate: int) -> torch.Tensor:
    """Each row's drawn augmentation, in the chain's order: reverberation (``rir``: the impulse response),
    noise (``noise``: the samples already cut to the row's length, ``snr_db``), gain (``gain_db``); a plan
    without a key (or None) skips that step. ``silence`` (``(before, after)``, the loader's silence_pad: the row
    already holds that many zeros around its speech): the steps apply to the speech alone, as the loader path
    applies them before it pads, and the padding stays exact zeros. ``wav`` float (B, N); returns a new tensor."""
    wav = wav.clone()
    silent = [(i, *plans[i]["silence"]) for i in _rows(plans, "silence")]
    if silent:  # each such row's speech moved to its start, its length the speech's
        lengths = lengths.clone()
        for i, before, after in silent:
            speech = int(lengths[i]) - before - after
            wav[i, :speech] = wav[i, before:before + speech].clone()
            wav[i, speech:] = 0.0
            lengths[i] = speech
    rows = _rows(plans, "rir")
    if rows:
        idx = torch.tensor(rows, device=wav.device)
        rirs, rir_lengths = _stack([plans[i]["rir"] for i in rows], wav.device)
        wav[idx] = reverberate(wav[idx], lengths[idx], rirs, rir_lengths, sample_rate)
    rows = _rows(plans, "noise")
    if rows:
        idx = torch.tensor(rows, device=wav.device)
        noise, _ = _stack([plans[i]["noise"] for i in rows], wav.device)
        noise = torch.nn.functional.pad(noise, (0, wav.shape[1] - noise.shape[1]))
        snr = torch.tensor([float(plans[i]["snr_db"]) for i in rows], device=wav.device)
        wav[idx] = add_noise(wav[idx], lengths[idx], noise, snr, sample_rate)
    rows = _rows(plans, "gain_db")
    if rows:
        idx = torch.tensor(rows, device=wav.device)
        wav[idx] = apply_gain(wav[idx], torch.tensor([float(plans[i]["gain_db"]) for i in rows], device=wav.device))
    for i, before, _ in silent:  # and back between its zeros
        speech = int(lengths[i])
        row = wav[i, :speech].clone()
        wav[i] = 0.0
        wav[i, before:before + speech] = row
    return wav
