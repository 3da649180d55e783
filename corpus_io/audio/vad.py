"""Where a recording's speech is, found from the audio itself: its *speech regions* (seconds), parted by pauses of
at least ``min_pause`` seconds. ``corpus-io segment`` cuts only in these pauses, never where a CTC path's word times
happen to leave a gap (they fill real pauses: a word's last token is often emitted well after its sound ends).

Two detectors, chosen by segment's ``++vad`` (``auto``, the default: silero when installed, else energy):

* ``energy`` (the core, no extra): the frames whose energy is speech by :func:`corpus_io.decoding.align.speech_frames`'
  rule (10 ms fbank frames within 50 dB of the loudest and 10 dB above the quietest tenth), pauses shorter than
  ``min_pause`` filled (a stop's closure, a breath between words). Fast and exact on clean recordings; in room tone
  louder than 10 dB below speech it hears speech everywhere.
* ``silero``: silero-vad's model, which ships inside its wheel (``pip install -e '.[vad]'`` in a checkout), run
  with torch over the recording at 16 kHz in 32 ms windows: robust to room tone, breaths and music beds.

Both return ``[(start, end), ...]`` in seconds, sorted, parted by at least ``min_pause``.
"""

from __future__ import annotations

from typing import Any, Sequence

#: segment's ++vad choices (auto: silero when its package is installed, else energy)
DETECTORS = ("auto", "energy", "silero")


def detector(name: str) -> str:
    """The detector ``name`` runs: ``auto`` is ``silero`` when silero-vad is installed (the ``[vad]`` extra, which
    ``make install`` sets up), else ``energy``."""
    if name != "auto":
        return name
    import importlib.util

    return "silero" if importlib.util.find_spec("silero_vad") is not None else "energy"
#: the sample rate silero-vad's model runs at (Hz)
SILERO_RATE = 16000


def regions_from_frames(speech: Sequence[bool], frame_seconds: float, min_pause: float) -> list[tuple[float, float]]:
    """The speech regions of per-frame speech flags (``frame_seconds`` apart, frame ``t`` spanning
    ``[t, t + 1) * frame_seconds``): runs of speech frames, joined across silences shorter than ``min_pause``."""
    runs: list[tuple[float, float]] = []
    start = None
    for t, is_speech in enumerate([*speech, False]):
        if is_speech and start is None:
            start = t
        elif not is_speech and start is not None:
            runs.append((start * frame_seconds, t * frame_seconds))
            start = None
    return [(round(s, 3), round(e, 3)) for s, e in join_close(runs, min_pause)]


def join_close(regions: Sequence[tuple[float, float]], min_pause: float) -> list[tuple[float, float]]:
    """``regions`` (sorted) with those parted by less than ``min_pause`` seconds joined."""
    out: list[list[float]] = []
    for s, e in regions:
        if out and s - out[-1][1] < min_pause:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


_silero: list = []  # the loaded model, once a process


def silero_model() -> Any:
    """silero-vad's model (TorchScript) from its wheel, loaded once a process (a missing package: the CLI names the
    ``[vad]`` extra, :mod:`corpus_io.extras`)."""
    if not _silero:
        from silero_vad import load_silero_vad

        _silero.append(load_silero_vad(onnx=False))  # TorchScript: torch is here already; onnxruntime is [onnx]'s
    return _silero[0]


def silero_regions(samples: Any, rate: int, min_pause: float, *, threshold: float = 0.5) -> list[tuple[float, float]]:
    """The speech regions of mono ``samples`` (float, ``rate`` Hz) by silero-vad (resampled to 16 kHz), pauses of
    at least ``min_pause`` seconds between them (its ``min_silence_duration_ms``), each padded by its 30 ms."""
    import numpy as np
    import torch
    from silero_vad import get_speech_timestamps

    from corpus_io.audio.io import resample

    wave = np.asarray(samples, dtype=np.float32)
    if rate != SILERO_RATE:
        wave = resample(wave, rate, SILERO_RATE)
    model = silero_model()
    model.reset_states()
    stamps = get_speech_timestamps(torch.from_numpy(np.ascontiguousarray(wave)), model, threshold=threshold,
                                   sampling_rate=SILERO_RATE, min_silence_duration_ms=int(min_pause * 1000),
                                   min_speech_duration_ms=100, speech_pad_ms=30)
    regions = [(s["start"] / SILERO_RATE, s["end"] / SILERO_RATE) for s in stamps]
    return [(round(s, 3), round(e, 3)) for s, e in join_close(regions, min_pause)]


__all__ = ["DETECTORS", "detector", "join_close", "regions_from_frames", "silero_regions"]
