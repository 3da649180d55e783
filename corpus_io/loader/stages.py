"""Loader stages: small generators over sample dicts (keys: docs/DEVELOPING.md "The sample dict").

Each stage is ``stage(samples, <plain args>, counts=None) -> Iterator``. A stage that drops a
sample adds 1 to ``counts[reason]`` (reasons: ``decode.error``, ``decode.empty``,
``filter.too_short``, ``filter.too_long``, ``filter.too_few_tokens``, ``filter.too_many_tokens``,
``filter.ratio_too_low``, ``filter.ratio_too_high``, ``features.error``, ``features.shorter_than_window``);
``batch.over_budget`` counts (never drops) an utterance batched alone because it is over budget.

WeNet's order (composed in corpus_io.loader.build.loader_chain): decode, filter_length, resample,
speed_perturb, count_frames, tokenize, filter_tokens, fbank|mfcc (raw_features: tokens after it;
precomputed_features instead of decode..features), spec_aug, spec_sub, spec_trim, shuffle, sort, batch,
shuffle_batches (train) (or bucket_batch instead of sort+batch), pad. Tokens are filtered before features, so
no features are computed for an utterance the token filter drops.

Randomness: every random stage takes its generator (``random.Random``) from the caller, seeded from (seed,
epoch, rank, worker), except the waveform's and the features' (speed_perturb and dither here, reverb/noise/volume
in corpus_io.loader.waveaug): each utterance draws from its own generator (:func:`draws`, by seed, epoch and key).
A stage draws a fixed number of values per sample in input order, so replaying the same
input with a generator in the same state reproduces the same output.

Buffers (resume): ``shuffle`` and ``sort`` are block buffers: they read ``size`` samples,
reorder them, emit them all and start empty again. After ``k * size`` inputs their state is
only the generator state, so a loader can checkpoint (input position, generator state) at a
block boundary and replay at most one block. ``bucket_batch`` has no such boundary; replay
its input from the epoch start (or checkpoint after ``pad``, counting batches).
"""

from __future__ import annotations

import io
import random
from collections import Counter
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from corpus_io.audio import augment, features
from corpus_io.audio import io as audio
from corpus_io.audio.io import resample_wav
from corpus_io.errors import DataError
from corpus_io.loader.batching import BLOCK_END, batch, bucket_batch, carried, runs, sample_lengths
from corpus_io.loader.batching import pad as pad_batch
from corpus_io.loader.workers import release_freed_memory

__all__ = [
    "decode", "filter_length", "resample", "resample_wav", "draws", "speed_perturb", "fbank", "mfcc", "waveform_frames",
    "drop_empty", "raw_features", "precomputed_features", "spec_aug", "spec_sub", "spec_trim", "tokenize",
    "filter_tokens", "shuffle", "sort", "batch", "bucket_batch", "pad", "num_frames", "as_float",
]


def _where(sample: dict) -> str:
    url = sample.get("__url__")
    return f"utterance '{sample.get('key')}'" + (f" of {url}" if url else "")


def _count(counts: Counter | None, reason: str) -> None:
    if counts is not None:
        counts[reason] += 1


def _guarded(samples: Iterable[dict], fn: Any, on_error: str, counts: Counter | None, stage: str,
             hint: str) -> Iterator[tuple[dict, Any]]:
    """``(sample, (name, array))`` from ``fn``; a DataError names the sample and ``hint``, or is counted
    (``<stage>.error``) and skipped; an empty array is counted (``<stage>.empty``) and skipped."""
    for sample in samples:
        try:
            value = fn(sample)
        except DataError as exc:
            if on_error == "skip":
                _count(counts, f"{stage}.error")
                continue
            raise DataError(f"{_where(sample)}: {exc} {hint}") from None
        if value[1].shape[0] == 0:
            _count(counts, f"{stage}.empty")
            continue
        yield sample, value


def num_frames(sample: dict) -> float:
    """Length in 10 ms frames: the front end's count (``frames``, feats_on=model), else from ``wav``
    (num_samples / sample_rate * 100) or from ``feats``."""
    if "frames" in sample:
        return float(sample["frames"])
    if "wav" in sample:
        return sample["wav"].shape[1] / sample["sample_rate"] * 100
    return float(sample["feats"].shape[0])


# --------------------------------------------------------------------------- decode


def decode(samples: Iterable[dict], *, on_error: str = "fail", int16: bool = False,
           counts: Counter | None = None) -> Iterator[dict]:
    """``audio`` bytes -> ``wav`` (1, num_samples) float32 mono and ``sample_rate``.

    Raw segments: ``start``/``end`` seconds (``end < 0``: to the end) cut the recording
    without decoding the rest. Stereo is averaged to mono. A member that cannot be decoded
    raises :class:`DataError` naming the key and ``__url__``, or with ``on_error='skip'`` is
    counted as ``decode.error`` and skipped.

    ``int16`` (the chain's stages all take it: :func:`corpus_io.loader.build.int16_decode`): a mono 16-bit PCM
    WAV gives its samples as they are stored, an int16 ``wav`` standing for ``wav / 32768`` (no float
    conversion here; the stage that needs floats converts, padding writes them into the batch at once).
    """
    hint = "Re-pack or remove this utterance, or set dataset_conf.on_error=skip to skip and count such members."
    one = _decode_int16 if int16 else _decode_one
    for sample, (rate, wave) in _guarded(samples, one, on_error, counts, "decode", hint):
        data = sample.pop("audio", None)
        sample["sample_rate"] = rate
        if wave.dtype == np.int16:
            sample["wav"] = torch.from_numpy(wave[None])  # (1, num_samples): one torch call, not two
            sample["pcm16"] = True
        else:
            sample["wav"] = torch.from_numpy(np.ascontiguousarray(audio.to_mono(wave), dtype=np.float32)).unsqueeze(0)
            # the samples are exactly k / 32768 (mono 16-bit source): waveform_frames ships them as int16
            sample["pcm16"] = wave.ndim == 1 and audio.is_pcm16(data)
        yield sample


def _decode_one(sample: dict) -> tuple[int, np.ndarray]:
    wave, rate = decode_audio(sample)
    return rate, wave


def _decode_int16(sample: dict) -> tuple[int, np.ndarray]:
    """A whole mono 16-bit PCM WAV as its stored samples (native int16, owned: a read-only view of the member
    would make a read-only tensor); anything else as :func:`_decode_one` decodes it."""
    data = sample.get("audio")
    if isinstance(data, (bytes, bytearray, memoryview)) and "start" not in sample and "end" not in sample:
        layout = audio.wav_layout(data)
        if layout is not None and layout.bits == 16 and not layout.is_float and layout.channels == 1:
            pcm = np.frombuffer(data, dtype="<i2", count=layout.num_frames, offset=layout.data_offset)
            return layout.sample_rate, pcm.astype(np.int16)  # a copy, in native byte order
    return _decode_one(sample)


def as_float(wav: torch.Tensor) -> torch.Tensor:
    """A ``wav`` as float32 in [-1, 1]: int16 samples (:func:`decode` with ``int16``) are ``k / 32768``."""
    return wav.float() * (1.0 / 32768.0) if wav.dtype == torch.int16 else wav


def decode_audio(sample: dict, where: str | None = None) -> tuple[np.ndarray, int]:
    """``(samples[, channels]), sample_rate`` of a sample's ``audio`` bytes (its ``start``/``end`` segment), float32;
    a DataError says why not, after ``where`` (default ``<format> member``; the caller names the sample)."""
    data = sample.get("audio")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DataError("has no audio bytes ('audio' is missing).")
    fmt = sample.get("audio_format", "audio")
    where = f"{fmt} member" if where is None else where
    if "start" not in sample and "end" not in sample:
        return audio.decode_bytes(bytes(data), where=where)
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: cannot decode audio ({audio.soundfile_why(exc)}).") from None
    first, last = audio.segment_samples(float(sample.get("start", 0.0)), float(sample.get("end", -1)),
                                        int(info.samplerate), int(info.frames))
    return audio.decode_bytes(bytes(data), where=where, start=first, stop=last)


# --------------------------------------------------------------------------- filters


def drop_repeated_keys(samples: Iterable[dict], *, owners: dict[str, str | int], track: bool = False,
                       raw: bool = False, on_error: str = "skip", counts: Counter | None = None) -> Iterator[dict]:
    """Read a key that several shards (or raw lines) hold once.

    ``owners`` (from the index, see ``shards.index.repeated_keys``; raw: ``RawList.repeated_entries``): a key is
    kept only from its owner shard (raw: entry), the other copies are dropped and counted as ``duplicate key``.
    ``track`` (remote shards whose index records no keys): this reader remembers where it met each key in this
    epoch (a 64-bit hash and the place, ~100 bytes per utterance); meeting it at another place (shard and
    position) is a DataError naming both (``on_error=fail``) or dropped and counted (``skip``). A place read
    again in a later pass (``epoch_hours``) is not a repeat."""
    seen: dict[int, tuple[str, int]] = {}
    for sample in samples:
        if sample is None:  # the end of a pass of a weighted mix (pipeline.read.iter_source), passed on
            yield sample
            continue
        key = sample["key"]
        owner = owners.get(key)
        if owner is not None:
            if (sample.get("__pos__") if raw else sample.get("__url__")) != owner:
                _count(counts, "duplicate key")
                continue
        elif track:
            place = (sample.get("__url__", ""), int(sample.get("__pos__", -1)))
            first = seen.setdefault(hash(key), place)
            if first != place:
                if on_error != "skip":
                    raise DataError(f"key '{key}' is read twice in one epoch: {_place(first, raw)} and "
                                    f"{_place(place, raw)}; "
                                    f"training would see the utterance twice. Give each utterance its own key, drop "
                                    f"the repeated entry or shard (verify-shards lists them), or set "
                                    f"++dataset_conf.on_error=skip to keep the first and count the rest.")
                _count(counts, "duplicate key")
                continue
        yield sample


def _place(place: tuple[str, int], raw: bool) -> str:
    url, pos = place
    return f"entry {pos + 1} of the raw list {url}" if raw else f"sample {pos + 1} of shard {url}"


def filter_length(samples: Iterable[dict], *, max_length: float = 10240, min_length: float = 10,
                  counts: Counter | None = None) -> Iterator[dict]:
    """Drop utterances outside [min_length, max_length] 10 ms frames (WeNet: before resample)."""
    for sample in samples:
        frames = num_frames(sample)
        if frames < min_length:
            _count(counts, "filter.too_short")
        elif frames > max_length:
            _count(counts, "filter.too_long")
        else:
            yield sample


def filter_tokens(samples: Iterable[dict], *, token_max_length: int = 200, token_min_length: int = 1,
                  min_output_input_ratio: float = 0.0005, max_output_input_ratio: float = 1.0,
                  counts: Counter | None = None) -> Iterator[dict]:
    """Drop by token count and by tokens per 10 ms frame (WeNet's ratio filter); after ``tokenize``."""
    for sample in samples:
        n = len(sample["tokens"])
        frames = num_frames(sample)
        if n < token_min_length:
            _count(counts, "filter.too_few_tokens")
        elif n > token_max_length:
            _count(counts, "filter.too_many_tokens")
        elif frames and n / frames < min_output_input_ratio:
            _count(counts, "filter.ratio_too_low")
        elif frames and n / frames > max_output_input_ratio:
            _count(counts, "filter.ratio_too_high")
        else:
            yield sample


# --------------------------------------------------------------------------- waveform


def resample(samples: Iterable[dict], *, resample_rate: int = 16000, counts: Counter | None = None) -> Iterator[dict]:
    """Resample ``wav`` to ``resample_rate`` Hz (torchaudio sinc); length becomes ceil(n * new / old)."""
    for sample in samples:
        rate = sample["sample_rate"]
        if rate != resample_rate:
            sample["wav"] = audio.resample_wav(as_float(sample["wav"]), rate, resample_rate)
            sample["sample_rate"] = resample_rate
            sample["pcm16"] = False
        yield sample


#: the sample key holding what the augmentation stages drew for it (speed, rir, noise, noise_offset, snr_db,
#: gain_db: plain values), written by bench-loader ``++dump_audio_dir`` as JSON lines
DRAWS = "draws"

#: the sample key holding ``(before, after)``: the samples of digital silence the silence_pad stage
#: (:func:`corpus_io.loader.waveaug.silence_pad`) put around the speech, which the training dither leaves zero
SILENCE = "silence"


def draws(seed: int, epoch: int, key: str, what: str) -> random.Random:
    """The generator of one utterance's ``what`` draws in ``epoch``: the same whatever rank, worker, batch or
    read position the utterance lands in (what makes a resume on another world size reproduce its audio)."""
    return random.Random(f"{seed}:{epoch}:{key}:{what}")


def speed_perturb(samples: Iterable[dict], *, speeds: Sequence[float] = (0.9, 1.0, 1.1), seed: int, epoch: int,
                  counts: Counter | None = None) -> Iterator[dict]:
    """Change speed (and pitch, like sox ``speed``) by a factor drawn per utterance from ``speeds``, by
    ``(seed, epoch, key)`` (:func:`draws`).

    The waveform is read as if sampled at ``round(rate * speed)`` and resampled to ``rate``:
    length becomes about n / speed.
    """
    speeds = list(speeds)
    for sample in samples:
        speed = draws(seed, epoch, sample["key"], "speed").choice(speeds)
        sample.setdefault(DRAWS, {})["speed"] = speed  # what bench-loader ++dump_audio_dir writes beside the audio
        if speed != 1.0:
            rate = sample["sample_rate"]
            sample["wav"] = audio.resample_wav(as_float(sample["wav"]), int(round(rate * speed)), rate)
            sample["pcm16"] = False
        yield sample


# --------------------------------------------------------------------------- features


def _with_feats(samples: Iterable[dict], compute: Any, counts: Counter | None) -> Iterator[dict]:
    """``feats = compute(sample)``; a waveform shorter than one analysis window has no frame (Kaldi) and is
    dropped and counted as ``features.shorter_than_window``."""
    for sample in samples:
        feats = compute(sample)
        if feats.shape[0] == 0:
            _count(counts, "features.shorter_than_window")
            continue
        sample.pop("wav", None)
        sample.pop("frames", None)  # the count made before features (count_frames); feats now tell
        sample["feats"] = feats
        yield sample


#: utterances whose features are computed together: sorted by length and cut into batches of FEATURE_BATCH
FEATURE_WINDOW = 64
FEATURE_BATCH = 16


def _batched_feats(samples: Iterable[dict], compute: Callable[[torch.Tensor, torch.Tensor, int, list], tuple],
                   frame_length: float, frame_shift: float, counts: Counter | None,
                   snip_edges: bool = True, window_size: int = FEATURE_WINDOW) -> Iterator[dict]:
    """What :func:`_with_feats` gives, in the same order, with ``feats`` computed in batches: each window of
    ``window_size`` utterances is sorted by length and cut into batches of :data:`FEATURE_BATCH` (little
    padding), ``compute(wav (B, N), lengths (B,), sample_rate, samples)`` gives ``(feats (B, T, D), frames (B,))`` and
    each utterance gets a copy of its rows. One batched call costs much less than FEATURE_BATCH per-utterance ones;
    ``window_size=1`` reads no sample ahead."""
    window: list[dict] = []
    for sample in samples:
        window.append(sample)
        if len(window) >= window_size:
            yield from _window_feats(window, compute, frame_length, frame_shift, counts, snip_edges)
            window = []
    yield from _window_feats(window, compute, frame_length, frame_shift, counts, snip_edges)


def _window_feats(window: list[dict], compute: Callable, frame_length: float, frame_shift: float,
                  counts: Counter | None, snip_edges: bool = True) -> Iterator[dict]:
    feats: list[torch.Tensor | None] = [None] * len(window)
    # no frame below one window (Kaldi): such an utterance is dropped below, as _with_feats drops it
    kept = [i for i, s in enumerate(window)
            if features.num_frames(s["wav"].shape[-1], s["sample_rate"], frame_length, frame_shift, snip_edges)]
    kept.sort(key=lambda i: (window[i]["sample_rate"], window[i]["wav"].shape[-1]))
    while kept:
        rate = window[kept[0]]["sample_rate"]
        group = [i for i in kept[:FEATURE_BATCH] if window[i]["sample_rate"] == rate]
        kept = kept[len(group):]
        rows = [window[i]["wav"].reshape(-1) for i in group]
        if len({r.dtype for r in rows}) > 1:  # int16 rows (k / 32768) join float rows at their scale
            rows = [as_float(r) for r in rows]
        lengths = torch.tensor([r.shape[0] for r in rows], dtype=torch.int64)
        out, frames = compute(torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), lengths, rate,
                              [window[i] for i in group])
        for j, i in enumerate(group):
            # a copy: a view would keep the whole batch's tensor alive while any of its utterances waits in the
            # shuffle and sort buffers (about 20 MB more per worker with the bench's raw-list buffers, issue 53)
            feats[i] = out[j, :int(frames[j])].clone()
    if torch.utils.data.get_worker_info() is not None:
        # the window's temporaries, back to the system now: a worker's buckets may pull several windows before
        # the batch it hands over (and trims after); 20-30 MB less per worker at its peak (issue 53)
        release_freed_memory()
    for sample, computed in zip(window, feats):
        if computed is None:
            _count(counts, "features.shorter_than_window")
            continue
        sample.pop("wav", None)
        sample.pop("frames", None)
        sample["feats"] = computed
        yield sample


def _dither_seeds(dither: float, seed: int | None, epoch: int) -> Callable[[list], list[int]] | None:
    """The per-utterance dither seeds of a batch's samples (:func:`corpus_io.audio.features.dither_seed`, by
    key); None without dither or without a seed (not the training loader)."""
    if not dither or seed is None:
        return None
    return lambda samples: [features.dither_seed(seed, epoch, s["key"]) for s in samples]


def _silence(samples: list[dict]) -> list | None:
    """Each sample's digital silence ``(before, after)`` in samples (:data:`SILENCE`, the silence_pad stage's),
    which the dither leaves exactly zero; None when no sample has any."""
    spans = [s.get(SILENCE) for s in samples]
    return spans if any(spans) else None


def fbank(samples: Iterable[dict], *, num_mel_bins: int = 80, frame_length: float = 25.0, frame_shift: float = 10.0,
          dither: float = 0.0, low_freq: float = features.LOW_FREQ, high_freq: float = 0.0, snip_edges: bool = True,
          seed: int | None = None, epoch: int = 0, batched: bool = True,
          counts: Counter | None = None) -> Iterator[dict]:
    """Kaldi fbank (:func:`corpus_io.audio.features.fbank`) of ``wav`` as WeNet computes it: ``feats``
    (num_frames, num_mel_bins), num_frames = 1 + (n - frame_length_samples) // shift_samples (snip_edges=false:
    (n + shift_samples // 2) // shift_samples, :func:`corpus_io.audio.features.num_frames`).

    The features are computed in batches (:func:`_batched_feats`, equal to the per-utterance ones within 1e-3),
    which reads :data:`FEATURE_WINDOW` utterances ahead; ``batched=False`` where the reader's state must follow
    each sample into the buffers (:func:`corpus_io.loader.build.reads_ahead`): per utterance. ``dither`` (the
    training loader gives ``seed``; without it there is none) is drawn per utterance by ``(seed, epoch, key)``
    (:func:`corpus_io.audio.features.dither_seed`), as the device front end draws it; the digital silence
    the silence_pad stage added (:data:`SILENCE`) is not dithered: it stays exact zeros, as at decode."""
    seeds_of = _dither_seeds(dither, seed, epoch)
    if seeds_of is not None or batched:
        def compute_batch(wav: torch.Tensor, lengths: torch.Tensor, rate: int, group: list) -> tuple:
            seeds = seeds_of(group) if seeds_of is not None else None
            return features.batch_fbank(wav, lengths, rate, num_mel_bins=num_mel_bins, frame_length=frame_length,
                                        frame_shift=frame_shift, dither=dither if seeds else 0.0, seeds=seeds,
                                        low_freq=low_freq, high_freq=high_freq, snip_edges=snip_edges,
                                        silence=_silence(group) if seeds else None)

        return _batched_feats(samples, compute_batch, frame_length, frame_shift, counts, snip_edges,
                              FEATURE_WINDOW if batched else 1)

    def compute(sample: dict) -> torch.Tensor:
        return features.fbank(as_float(sample["wav"]), sample["sample_rate"], num_mel_bins=num_mel_bins,
                              frame_length=frame_length, frame_shift=frame_shift, low_freq=low_freq,
                              high_freq=high_freq, snip_edges=snip_edges)

    return _with_feats(samples, compute, counts)


def mfcc(samples: Iterable[dict], *, num_mel_bins: int = 40, num_ceps: int = 40, frame_length: float = 25.0,
         frame_shift: float = 10.0, dither: float = 0.0, high_freq: float = -200.0, low_freq: float = 20.0,
         seed: int | None = None, epoch: int = 0, batched: bool = True,
         counts: Counter | None = None) -> Iterator[dict]:
    """Kaldi MFCC (:func:`corpus_io.audio.features.mfcc`) of ``wav``: ``feats`` (num_frames, num_ceps); batched
    and dithered like :func:`fbank`."""
    seeds_of = _dither_seeds(dither, seed, epoch)
    if seeds_of is not None or batched:
        def compute_batch(wav: torch.Tensor, lengths: torch.Tensor, rate: int, group: list) -> tuple:
            seeds = seeds_of(group) if seeds_of is not None else None
            return features.batch_mfcc(wav, lengths, rate, num_mel_bins=num_mel_bins, num_ceps=num_ceps,
                                       frame_length=frame_length, frame_shift=frame_shift,
                                       dither=dither if seeds else 0.0, seeds=seeds, high_freq=high_freq,
                                       low_freq=low_freq, silence=_silence(group) if seeds else None)

        return _batched_feats(samples, compute_batch, frame_length, frame_shift, counts,
                              window_size=FEATURE_WINDOW if batched else 1)

    def compute(sample: dict) -> torch.Tensor:
        return features.mfcc(as_float(sample["wav"]), sample["sample_rate"], num_mel_bins=num_mel_bins,
                             num_ceps=num_ceps, frame_length=frame_length, frame_shift=frame_shift,
                             high_freq=high_freq, low_freq=low_freq)

    return _with_feats(samples, compute, counts)


def count_frames(samples: Iterable[dict], *, frame_length: float = 25.0, frame_shift: float = 10.0,
                 snip_edges: bool = True, counts: Counter | None = None) -> Iterator[dict]:
    """Set ``frames``, the number of 10 ms frames the features of ``wav`` will have (Kaldi's count), so
    the stages that run before features (the token filter) count exactly what features will count."""
    for sample in samples:
        sample["frames"] = features.num_frames(sample["wav"].shape[1], sample["sample_rate"], frame_length,
                                               frame_shift, snip_edges)
        yield sample


def waveform_frames(samples: Iterable[dict], *, frame_length: float = 25.0, frame_shift: float = 10.0,
                    snip_edges: bool = True, counts: Counter | None = None) -> Iterator[dict]:
    """``feats_on=model``: keep ``wav`` for the device front end and set ``frames``, the number of
    frames it will compute (what the filters and batch budgets count; :func:`drop_empty` then drops
    those with none, as the fbank stage does). A waveform still holding a 16-bit source's samples
    (``pcm16``: mono 16-bit PCM, not resampled or perturbed) travels as int16, half the bytes, exactly;
    any other stays float32 in [-1, 1]."""
    for sample in count_frames(samples, frame_length=frame_length, frame_shift=frame_shift, snip_edges=snip_edges):
        if sample.pop("pcm16", False) and sample["wav"].dtype != torch.int16:  # k / 32768 exactly: lossless
            scaled = sample["wav"].numpy() * np.float32(features.INT16_SCALE)
            sample["wav"] = torch.from_numpy(scaled.astype(np.int16))
        yield sample


def drop_empty(samples: Iterable[dict], *, counts: Counter | None = None) -> Iterator[dict]:
    """Drop (and count as ``features.shorter_than_window``) waveforms with no frame (``frames`` 0)."""
    for sample in samples:
        if sample["frames"]:
            yield sample
        else:
            _count(counts, "features.shorter_than_window")


def raw_features(samples: Iterable[dict], *, counts: Counter | None = None) -> Iterator[dict]:
    """The waveform itself as ``feats`` (num_samples, 1), in [-1, 1]: frames are samples here (int16 samples of
    :func:`decode` stay so until padding writes them into the batch as ``k / 32768``)."""
    return _with_feats(samples, lambda sample: sample["wav"].reshape(-1, 1), counts)


_NOT_FEATURES = frozenset({"txt", "json", "audio", "key", "meta", *audio.AUDIO_EXTENSIONS})


def precomputed_features(samples: Iterable[dict], *, field: str | None = None, fields: Sequence[str] = (),
                         on_error: str = "fail", counts: Counter | None = None) -> Iterator[dict]:
    """``feats`` from a stored ``.npy`` member (a (num_frames, dim) array); audio is never decoded
    (``audio`` is dropped). The member: ``field``, else the first of ``fields`` (dataset_conf.fields,
    text/audio names skipped) the sample has, else ``npy``. Unreadable: DataError, or
    ``features.error`` when ``on_error='skip'``."""
    candidates = [field] if field else [f for f in fields if f not in _NOT_FEATURES] + ["npy"]

    def load(sample: dict) -> tuple[str, torch.Tensor]:
        name = next((f for f in candidates if f in sample), candidates[0])
        return name, _load_npy(sample, name)

    hint = "Re-create the field (corpus-io add-field) or set dataset_conf.on_error=skip."
    for sample, (name, feats) in _guarded(samples, load, on_error, counts, "features", hint):
        sample.pop("audio", None)
        sample.pop(name, None)
        sample["feats"] = feats
        yield sample


def _load_npy(sample: dict, field: str) -> torch.Tensor:
    data = sample.get(field)
    if data is None:
        raise DataError(f"has no '{field}' member (feats_type=precomputed reads it).")
    try:
        array = data if isinstance(data, np.ndarray) else np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"'{field}' is not a readable .npy array ({exc}).") from None
    if array.ndim != 2:
        raise DataError(f"'{field}' has shape {array.shape}; expected (num_frames, dim).")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


# --------------------------------------------------------------------------- augmentation (WeNet semantics)


def spec_aug(samples: Iterable[dict], *, num_t_mask: int = 2, num_f_mask: int = 2, max_t: int = 50, max_f: int = 10,
             rng: random.Random, counts: Counter | None = None) -> Iterator[dict]:
    """Zero ``num_t_mask`` time spans (1..max_t frames) and ``num_f_mask`` bands (1..max_f bins)."""
    for sample in samples:
        y = sample["feats"].clone()
        time_masks, freq_masks = augment.draw_spec_aug(rng, *y.shape, num_t_mask=num_t_mask, num_f_mask=num_f_mask,
                                                       max_t=max_t, max_f=max_f)
        for start, end in time_masks:
            y[start:end, :] = 0
        for start, end in freq_masks:
            y[:, start:end] = 0
        sample["feats"] = y
        yield sample


def spec_sub(samples: Iterable[dict], *, max_t: int = 30, num_t_sub: int = 3, rng: random.Random,
             counts: Counter | None = None) -> Iterator[dict]:
    """Replace ``num_t_sub`` spans (1..max_t frames) with the frames ``pos`` earlier (pos in 0..start)."""
    for sample in samples:
        x = sample["feats"]
        y = x.clone()
        for start, end, pos in augment.draw_spec_sub(rng, y.shape[0], max_t=max_t, num_t_sub=num_t_sub):
            y[start:end, :] = x[start - pos:end - pos, :]
        sample["feats"] = y
        yield sample


def spec_trim(samples: Iterable[dict], *, max_t: int = 20, rng: random.Random,
              counts: Counter | None = None) -> Iterator[dict]:
    """Trim 1..max_t end frames, unless that is half the utterance or more."""
    for sample in samples:
        x = sample["feats"]
        kept = augment.draw_spec_trim(rng, x.shape[0], max_t=max_t)
        if kept is not None:
            sample["feats"] = x[:kept].clone()
        yield sample


# --------------------------------------------------------------------------- text


def tokenize(samples: Iterable[dict], *, tokenizer: Any, counts: Counter | None = None) -> Iterator[dict]:
    """``tokens`` = ``tokenizer.encode(txt)`` (a :class:`corpus_io.tokenizer.Tokenizer`).

    Tokens missing from the token list are counted as ``tokenize.unknown_tokens`` (they become ``<unk>``).
    """
    for sample in samples:
        text = sample.get("txt")
        if not isinstance(text, str):
            raise DataError(f"{_where(sample)} has no transcript ('txt'). Every utterance of a training list "
                            f"needs one: add its .txt member or 'txt' field.")
        unknown_before = getattr(tokenizer, "num_unknown", 0)
        sample["tokens"] = tokenizer.encode(text)
        if counts is not None and getattr(tokenizer, "num_unknown", 0) != unknown_before:
            counts["tokenize.unknown_tokens"] += tokenizer.num_unknown - unknown_before
        yield sample


# --------------------------------------------------------------------------- buffers


def shuffle(samples: Iterable[dict], *, shuffle_size: int = 1500, rng: random.Random,
            counts: Counter | None = None) -> Iterator[dict]:
    """Block shuffle (WeNet): read ``shuffle_size`` samples, ``rng.shuffle`` them, emit them all. The carried
    rest of the last epoch (corpus_io.loader.batching.runs) is a block of its own, emitted first."""
    for run in runs(samples):
        buf: list[dict] = []
        for sample in run:
            buf.append(sample)
            if len(buf) >= shuffle_size:
                rng.shuffle(buf)
                yield from buf
                buf = []
        rng.shuffle(buf)
        yield from buf


def sort(samples: Iterable[dict], *, sort_size: int = 500, mark_blocks: bool = False,
         counts: Counter | None = None) -> Iterator[dict]:
    """Block sort (WeNet): read ``sort_size`` samples, emit them by ascending feature frames (stable). The
    carried rest of the last epoch is a block of its own. ``mark_blocks``: the last sample of each block is
    marked (``BLOCK_END``), so its batches can be shuffled (:func:`shuffle_batches`); not a carried block's,
    whose last batch is topped up with the next block's shortest samples."""
    def block(buf: list[dict]) -> list[dict]:
        buf.sort(key=lambda s: sample_lengths(s)[0])
        if mark_blocks and buf and not carried(buf[-1]):
            buf[-1][BLOCK_END] = True
        return buf

    for run in runs(samples):
        buf: list[dict] = []
        for sample in run:
            buf.append(sample)
            if len(buf) >= sort_size:
                yield from block(buf)
                buf = []
        yield from block(buf)


def shuffle_batches(batches: Iterable[list[dict]], *,
                    batch_order: Callable[[list[dict]], bytes]) -> Iterator[list[dict]]:
    """The batches of each sort block in a random order (icefall's bucketing sampler draws batches at random
    too): sorted, a block's longest utterances would always be its last batches, and an epoch cut short (DDP
    ranks holding unequal data stop together) would leave the same, longest, utterances untrained every time.
    A batch holding samples carried from the last epoch leaves at once (they come first). The order is
    :func:`corpus_io.loader.batching.batch_order`'s, so a resumed reader yields the batches as an uninterrupted one."""
    held: list[list[dict]] = []
    for b in batches:
        if carried(b[0]):
            yield b
            continue
        held.append(b)
        if b[-1].get(BLOCK_END):
            yield from sorted(held, key=batch_order)
            held = []
    yield from sorted(held, key=batch_order)


def pad(batches: Iterable[list[dict]], *, frame_shift: float = 0.01, frame_length_ms: float = 25.0,
        frame_shift_ms: float = 10.0, snip_edges: bool = True) -> Iterator[dict]:
    """Each batch (list of samples) -> the padded batch dict (:func:`corpus_io.loader.batching.pad`; a bucket's
    batch to its edge, a waveform batch to the samples of that many frames of ``frame_length_ms`` /
    ``frame_shift_ms``)."""
    for samples in batches:
        yield pad_batch(samples, frame_shift=frame_shift, frame_length_ms=frame_length_ms,
                        frame_shift_ms=frame_shift_ms, snip_edges=snip_edges)
