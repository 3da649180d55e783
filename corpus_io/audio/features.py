"""Kaldi features, per utterance and batched: the one home of feature computation.

Per utterance (the loader's fbank/mfcc stages, add-field, the benches): :func:`fbank` and
:func:`mfcc` call ``torchaudio.compliance.kaldi`` on one ``(1, num_samples)`` waveform in [-1, 1],
as WeNet does (int16 scale, energy_floor 0, dither added to the samples from a seeded generator).

Batched (``dataset_conf.feats_on=model``: features on the training device): :func:`batch_fbank` and
:func:`batch_mfcc` take padded waveforms ``(B, N)`` plus their lengths in samples and compute the same
features in plain torch ops on the waveforms' device, every frame from its own samples only, so
padding never changes a valid frame. Options are Kaldi's as torchaudio applies them with our
arguments: povey window, pre-emphasis 0.97, DC offset removed per frame, FFT size the next power of
two, power spectrum, log with a floor of float32 eps. ``snip_edges`` (the default): only frames that fit,
frame k the samples ``[k * shift, k * shift + window)``; ``snip_edges=False`` (kaldi-native-fbank's and
sherpa-onnx's default): a frame centred on every shift, frame k from sample ``k * shift + shift // 2 -
window // 2``, the samples outside the waveform reflected at its ends (:func:`reflect`; :func:`num_frames`).
MFCC adds Kaldi's DCT (C0 weighted sqrt(1/num_mel_bins)) and the 22 lifter (torchaudio's
``use_energy=False``: C0 stays the DCT's).

Units: frame_length/frame_shift in ms, sample rates in Hz, lengths in samples (waveforms) or frames.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

import torch

INT16_SCALE = float(1 << 15)  # WeNet/Kaldi feed the samples as 16-bit integers
EPSILON = torch.finfo(torch.float32).eps  # Kaldi's log floor (numeric_limits<float>::epsilon)
PREEMPHASIS = 0.97
LOW_FREQ = 20.0  # Hz, fbank's default low cutoff


def dither_seed(seed: int, epoch: int, key: str) -> int:
    """The seed of one utterance's training dither in ``epoch`` (``dataset_conf.seed``): the same whatever rank,
    worker, batch or read position it lands in, and whether the loader or the device front end computes it."""
    return random.Random(f"{seed}:{epoch}:{key}:dither").getrandbits(63)


def window_geometry(sample_rate: int, frame_length: float = 25.0, frame_shift: float = 10.0) -> tuple[int, int, int]:
    """``(window, shift, fft_size)`` in samples, exactly as torchaudio.compliance.kaldi derives them."""
    shift = int(sample_rate * frame_shift * 0.001)
    window = int(sample_rate * frame_length * 0.001)
    return window, shift, 1 if window == 0 else 2 ** (window - 1).bit_length()


def num_frames(num_samples: int, sample_rate: int, frame_length: float = 25.0, frame_shift: float = 10.0,
               snip_edges: bool = True) -> int:
    """Frames Kaldi makes from ``num_samples``: snip_edges ``1 + (n - window) // shift``, 0 below one window;
    else ``(n + shift // 2) // shift``."""
    window, shift, _ = window_geometry(sample_rate, frame_length, frame_shift)
    if not snip_edges:
        return (num_samples + shift // 2) // shift
    return 0 if num_samples < window else 1 + (num_samples - window) // shift


def frame_offset(window: int, shift: int, snip_edges: bool = True) -> int:
    """The first sample of frame 0 (frame k starts ``k * shift`` later): 0, or ``shift // 2 - window // 2``
    (negative: before the waveform) without snip_edges."""
    return 0 if snip_edges else shift // 2 - window // 2


def reflect(index: torch.Tensor, length: torch.Tensor | int) -> torch.Tensor:
    """The sample Kaldi reads for each sample ``index`` of a ``length``-sample waveform (snip_edges=false):
    reflected at both ends, repeatedly (-1 -> 0, -2 -> 1, length -> length - 1), as kaldi-native-fbank does.
    ``length`` broadcasts against ``index`` (per row lengths); a length of 0 reads sample 0."""
    n = length.clamp_min(1) if isinstance(length, torch.Tensor) else max(1, int(length))
    folded = torch.remainder(index, 2 * n)
    return torch.where(folded >= n, 2 * n - 1 - folded, folded)


def edge_samples(wav: torch.Tensor, lengths: torch.Tensor, frames: int, window: int, shift: int) -> torch.Tensor:
    """``(B, (frames - 1) * shift + window)``: the samples snip_edges=false frames 0..frames-1 read, each row
    reflected at its own length, so that snip_edges framing of them gives Kaldi's snip_edges=false frames.

    One copy of the samples: only each row's two edges are gathered (the ``-offset`` samples before its start and
    the ``window + shift`` after its end, all that its frames read there); a padded row's samples past that band
    are left as they are, read only by frames past its count, which the features zero."""
    width = (frames - 1) * shift + window
    first = frame_offset(window, shift, False)  # output position p reads sample p + first (> 0 for a short window)
    lengths = lengths.to(wav.device)[:, None]
    # positions past each row's end (a row whose end lies before position 0 has no frame: its values are unread)
    band = torch.arange(window + shift, device=wav.device)[None, :] + (lengths - first).clamp_min(0)
    out = wav.new_zeros(wav.shape[0], max(width, int(band.max()) + 1 if band.numel() else 0))
    lo = max(0, -first)  # the first position that reads a sample at or after 0
    n = max(0, min(width - lo, wav.shape[1] - (lo + first)))
    out[:, lo:lo + n] = wav[:, lo + first:lo + first + n]
    edges = torch.cat([torch.arange(lo, device=wav.device)[None, :].expand(wav.shape[0], -1), band], dim=1)
    out.scatter_(1, edges, wav.gather(1, reflect(edges + first, lengths)))
    return out[:, :width]


# --------------------------------------------------------------------------- per utterance (torchaudio)


def dithered(wav: torch.Tensor, dither: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``wav`` in [-1, 1] at WeNet's int16 scale; dither (if any) drawn from ``generator`` on the samples."""
    wav = wav * INT16_SCALE
    if dither:
        wav = wav + dither * torch.randn(wav.shape, generator=generator, device=wav.device)
    return wav


def fbank(wav: torch.Tensor, sample_rate: int, *, num_mel_bins: int = 80, frame_length: float = 25.0,
          frame_shift: float = 10.0, dither: float = 0.0, low_freq: float = LOW_FREQ, high_freq: float = 0.0,
          snip_edges: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Kaldi fbank ``(num_frames, num_mel_bins)`` of one ``(1, num_samples)`` waveform in [-1, 1]
    (no frames below one window with snip_edges, where torchaudio would raise). ``high_freq`` <= 0: an offset
    from Nyquist. ``snip_edges=False``: the reflected samples (:func:`edge_samples`, which torchaudio's own
    reflection lacks for waveforms shorter than a window) framed by torchaudio."""
    from torchaudio.compliance import kaldi

    count = num_frames(wav.shape[-1], sample_rate, frame_length, frame_shift, snip_edges)
    if count == 0:
        return wav.new_zeros(0, num_mel_bins)
    x = dithered(wav, dither, generator)
    if not snip_edges:
        window, shift, _ = window_geometry(sample_rate, frame_length, frame_shift)
        x = edge_samples(x, torch.tensor([x.shape[-1]]), count, window, shift)
    return kaldi.fbank(x, num_mel_bins=num_mel_bins, frame_length=frame_length,
                       frame_shift=frame_shift, dither=0.0, energy_floor=0.0, sample_frequency=sample_rate,
                       low_freq=low_freq, high_freq=high_freq)


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

_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _povey(window: int, device: torch.device) -> torch.Tensor:
    """Kaldi's povey window (hann, not periodic, to the power 0.85): (window,) on ``device``, built once."""
    key = ("povey", window, str(device))
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.hann_window(window, periodic=False, dtype=torch.float32).pow(0.85).to(device)
    return _CONSTANTS[key]


def _mel(sample_rate: int, fft_size: int, num_mel_bins: int, low_freq: float, high_freq: float,
         device: torch.device) -> torch.Tensor:
    """Kaldi's mel matrix (fft_size // 2 + 1, num_mel_bins) on ``device``, built once (the Nyquist bin weighs 0)."""
    key = ("mel", sample_rate, fft_size, num_mel_bins, low_freq, high_freq, str(device))
    if key not in _CONSTANTS:
        from torchaudio.compliance.kaldi import get_mel_banks

        banks, _ = get_mel_banks(num_mel_bins, fft_size, float(sample_rate), low_freq, high_freq, 100.0, -500.0, 1.0)
        _CONSTANTS[key] = torch.nn.functional.pad(banks.float(), (0, 1)).T.contiguous().to(device)
    return _CONSTANTS[key]


def _frame_samples(wav: torch.Tensor, lengths: torch.Tensor, sample_rate: int, frame_length: float,
                   frame_shift: float, dither: float, seeds: Sequence[int] | None,
                   snip_edges: bool = True,
                   silence: Sequence[tuple[int, int] | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples frames are cut from, ``(B, N')`` (int16 scale, dithered; ``snip_edges=False``: each row's
    reflected samples, :func:`edge_samples`, one gather), and the valid frames per row ``(B,)``: frame k is
    ``[k * shift, k * shift + window)`` of them. ``silence``: per row None or ``(before, after)``, the samples of
    digital silence padded around the speech (``dataset_conf.silence_pad``): the dither covers the speech only,
    so those samples stay exact zeros, as a runtime's padding is."""
    window, shift, _ = window_geometry(sample_rate, frame_length, frame_shift)
    x = wav.float() if wav.dtype == torch.int16 else wav.float() * INT16_SCALE
    if dither and seeds is not None:
        x = x + dither * _noise(lengths, x.shape[1], seeds, x.device, silence)
    if snip_edges:
        frames = torch.where(lengths >= window, torch.div(lengths - window, shift, rounding_mode="floor") + 1, 0)
    else:
        frames = torch.div(lengths + shift // 2, shift, rounding_mode="floor")
        count = (x.shape[1] + shift // 2) // shift
        if count:
            x = edge_samples(x, lengths, count, window, shift)
    return x, frames


def _windowed(raw: torch.Tensor, fft_size: int) -> torch.Tensor:
    """Windowed frames ``(B, T, fft_size)`` of raw frames ``(B, T, window)`` (DC removed, pre-emphasised, povey
    window, zero padded to the FFT size).

    Kaldi's order, frame by frame: s = x - mean(x), y[j] = s[j] - 0.97 s[j - 1], y[0] = 0.03 s[0],
    then the window; the results are written straight into the zero-padded FFT input (no
    concatenated or padded copies). Every frame is computed from its own samples only.
    """
    window = raw.shape[-1]
    centred = raw - raw.mean(dim=-1, keepdim=True)
    out = raw.new_zeros(raw.shape[0], raw.shape[1], fft_size)
    framed = out[..., :window]
    # written as torchaudio rounds it (no fused multiply-add): low-energy mel bins are ill-conditioned
    framed[..., 1:] = centred[..., 1:] - PREEMPHASIS * centred[..., :-1]
    framed[..., 0] = centred[..., 0] - PREEMPHASIS * centred[..., 0]
    framed.mul_(_povey(window, raw.device))
    return out


#: at most this many framed values (batch x frames x FFT size) are windowed and transformed at once: the
#: temporaries of one block (windows, spectra, power: about 6 x 4 bytes a value, 6 MB) bound a batch's features'
#: memory whatever its length (a 1-hour recording, or a loader worker's batch of long utterances: glibc keeps what
#: they freed, issue 53); every frame is computed from its own samples, so the blocks joined equal the whole.
#: 2^18 rather than 2^21: a worker's heap peaked ~135 MB lower between trims, and a block that stays in the cache
#: is faster (batch_fbank, one thread: ~1.6x the audio per CPU second of 2^21; docs/BENCHMARKS.md)
BLOCK_VALUES = 1 << 18


def _framewise(x: torch.Tensor, frames: torch.Tensor, sample_rate: int, frame_length: float, frame_shift: float,
               width: int, per_frame: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``per_frame(windowed frames (B, t, fft_size)) -> (B, t, width)`` over every frame of ``x`` (B, N'), block by
    block (:data:`BLOCK_VALUES`), into ``(B, T, width)`` with the frames past each row's count zeroed."""
    window, shift, fft_size = window_geometry(sample_rate, frame_length, frame_shift)
    if x.shape[1] < window:  # no row has a frame
        return x.new_zeros(x.shape[0], 0, width)
    raw = x.unfold(1, window, shift)  # (B, T, window): a view, every frame its own samples
    total = raw.shape[1]
    block = max(1, BLOCK_VALUES // max(1, x.shape[0] * fft_size))
    if total <= block:
        return _valid(per_frame(_windowed(raw, fft_size)), frames)
    out = x.new_empty(x.shape[0], total, width)
    for first in range(0, total, block):
        out[:, first:first + block] = per_frame(_windowed(raw[:, first:first + block], fft_size))
    return _valid(out, frames)


def _noise(lengths: torch.Tensor, width: int, seeds: Sequence[int], device: torch.device,
           silence: Sequence[tuple[int, int] | None] | None = None) -> torch.Tensor:
    """Gaussian dither per utterance from its own seed, so it does not depend on the batch it is in. A row with
    ``silence`` ``(before, after)`` gets it on its speech only (the samples between), the same values as the
    speech would get unpadded; its padding stays 0."""
    noise = torch.zeros(len(seeds), width, device=device)
    generator = torch.Generator(device=device)
    for i, (seed, n) in enumerate(zip(seeds, lengths.tolist())):
        before, after = (silence[i] or (0, 0)) if silence is not None else (0, 0)
        speech = max(0, int(n) - int(before) - int(after))
        generator.manual_seed(int(seed))
        noise[i, int(before):int(before) + speech] = torch.randn(speech, generator=generator, device=device)
    return noise


def _log_mel(framed: torch.Tensor, sample_rate: int, num_mel_bins: int, low_freq: float,
             high_freq: float) -> torch.Tensor:
    """log(max(mel energies, eps)) of windowed frames ``(B, T, fft_size)``: ``(B, T, num_mel_bins)``."""
    mel = _mel(sample_rate, framed.shape[-1], num_mel_bins, low_freq, high_freq, framed.device)
    spectrum = torch.fft.rfft(framed)
    power = spectrum.real.square() + spectrum.imag.square()
    return torch.matmul(power, mel).clamp_min_(EPSILON).log_()


def _valid(feats: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """Zero every frame at or past its row's length (padding carries no values)."""
    past = torch.arange(feats.shape[1], device=feats.device)[None, :] >= frames[:, None]
    return feats.masked_fill_(past.unsqueeze(-1), 0.0)


def batch_fbank(wav: torch.Tensor, lengths: torch.Tensor, sample_rate: int, *, num_mel_bins: int = 80,
                frame_length: float = 25.0, frame_shift: float = 10.0, dither: float = 0.0,
                seeds: Sequence[int] | None = None, low_freq: float = LOW_FREQ,
                high_freq: float = 0.0, snip_edges: bool = True,
                silence: Sequence[tuple[int, int] | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kaldi fbank of padded waveforms: ``(feats (B, T, num_mel_bins), frames (B,))``.

    ``wav`` (B, N): int16 samples, or float in [-1, 1] (scaled by 2^15 like :func:`fbank`);
    ``lengths`` (B,) samples. Equals :func:`fbank` of each row cut to its length (dither 0), frame
    for frame; frames past a row's count are 0. ``dither`` > 0 needs ``seeds`` (one per row); ``silence``: per row
    None or the ``(before, after)`` samples of digital silence around the speech, left undithered.
    """
    x, frames = _frame_samples(wav, lengths, sample_rate, frame_length, frame_shift, dither, seeds, snip_edges,
                               silence)
    return _framewise(x, frames, sample_rate, frame_length, frame_shift, num_mel_bins,
                      lambda framed: _log_mel(framed, sample_rate, num_mel_bins, low_freq, high_freq)), frames


def _dct(num_mel_bins: int, num_ceps: int, device: torch.device) -> torch.Tensor:
    """Kaldi's DCT (num_mel_bins, num_ceps): orthonormal, C0 weighted sqrt(1/num_mel_bins), built once."""
    key = ("dct", num_mel_bins, num_ceps, str(device))
    if key not in _CONSTANTS:
        from torchaudio.functional import create_dct

        dct = create_dct(num_mel_bins, num_mel_bins, "ortho")
        dct[:, 0] = math.sqrt(1.0 / num_mel_bins)
        _CONSTANTS[key] = dct[:, :num_ceps].contiguous().to(device)
    return _CONSTANTS[key]


def _lifter(num_ceps: int, lifter: float, device: torch.device) -> torch.Tensor:
    key = ("lifter", num_ceps, lifter, str(device))
    if key not in _CONSTANTS:
        i = torch.arange(num_ceps)
        _CONSTANTS[key] = (1.0 + 0.5 * lifter * torch.sin(math.pi * i / lifter)).float().to(device)
    return _CONSTANTS[key]


def batch_mfcc(wav: torch.Tensor, lengths: torch.Tensor, sample_rate: int, *, num_mel_bins: int = 40,
               num_ceps: int = 40, frame_length: float = 25.0, frame_shift: float = 10.0, dither: float = 0.0,
               seeds: Sequence[int] | None = None, high_freq: float = -200.0, low_freq: float = 20.0,
               silence: Sequence[tuple[int, int] | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kaldi MFCC of padded waveforms: ``(feats (B, T, num_ceps), frames (B,))`` (see :func:`batch_fbank`)."""
    x, frames = _frame_samples(wav, lengths, sample_rate, frame_length, frame_shift, dither, seeds,
                               silence=silence)
    dct, lifter = _dct(num_mel_bins, num_ceps, x.device), _lifter(num_ceps, 22.0, x.device)
    return _framewise(x, frames, sample_rate, frame_length, frame_shift, num_ceps,
                      lambda framed: torch.matmul(_log_mel(framed, sample_rate, num_mel_bins, low_freq, high_freq),
                                                  dct) * lifter), frames
