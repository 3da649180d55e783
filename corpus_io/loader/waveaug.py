"""Waveform augmentation stages (reverberation, noise, volume, digital silence) and the pools of noise and impulse
responses they draw from. The math is :mod:`corpus_io.audio.mix`; this module draws what each utterance gets.

Draws: every utterance draws from its own ``random.Random(f"{seed}:{epoch}:{key}:<what>")``
(:func:`corpus_io.loader.stages.draws`, as speed_perturb does), never from a reader's generator, so an
utterance gets the same reverberation, noise and gain in the same epoch whatever rank, worker or batch it
lands in, also after a resume on another world size, and other ones the next epoch.

Pools (the streaming buffer): each loader worker holds, per list and epoch, up to ``buffer_seconds`` of
audio: a window of consecutive entries (shards, or lines of a record list) read sequentially from an entry
chosen by ``(seed, epoch, list)``, wrapping round at the list's end; a segment longer than what is left of
the budget is cut. An utterance draws a segment of that window and an offset in it (noise loops from the
offset). The window depends on ``(seed, epoch)`` only, not on the read position: that is what makes a
draw reproducible across resumes and world sizes. The price: every worker reads the same window (not a
share of the list), ``buffer_seconds`` per worker and epoch, and one epoch's variety is the window's;
successive epochs move the window over the whole list. Memory is ``buffer_seconds`` of samples (int16 for
16-bit sources) whatever the list's size; shards are read as streams (no seek, no random read), a record
list's entries are opened in list order.

With ``feats_on=model`` the stages only draw: each sample carries ``augment`` (the impulse response, the
noise samples cut to the utterance, the SNR and the gain), and the device front end applies it batched
(:func:`corpus_io.audio.mix.apply_plans`, the loader path's function too).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from corpus_io.audio import io as audio
from corpus_io.audio import mix
from corpus_io.errors import DataError
from corpus_io.loader import stages
from corpus_io.loader.read import ReadOptions, read_shard_unit
from corpus_io.loader.stages import draws

log = logging.getLogger(__name__)

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def _first_entry(path: str) -> str:
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line in f:
            if line.strip():
                return line.strip()
    return ""


def is_shard_list(path: str) -> bool:
    """A data.list of tar shards (local or remote list), as opposed to a record input."""
    from corpus_io.storage.urls import is_remote

    if is_remote(path):
        return True  # record inputs are read locally; a remote list is a shard data.list
    import os

    if os.path.isdir(path) or not os.path.exists(path):
        return False
    return _first_entry(path).split()[0].endswith(SHARD_SUFFIXES) if _first_entry(path) else False


def _is_wav_scp(path: str) -> bool:
    """A bare Kaldi ``<key> <source>`` table (ESPnet's noise_scp / rir_scp), or a directory holding only one."""
    import os

    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "wav.scp")) and not os.path.isfile(os.path.join(path, "text"))
    first = _first_entry(path)
    return bool(first) and not first.startswith(("{", "[")) and len(first.split(None, 1)) == 2


class _Entries:
    """The entries of one list, by index: ``count`` and ``read(start)`` (samples in list order from entry
    ``start``, wrapping round once)."""

    def __init__(self, path: str, opts: ReadOptions, counts: Counter | None) -> None:
        import os

        self.path, self.opts, self.counts = path, opts, counts if counts is not None else Counter()
        self.kind = "shard" if is_shard_list(path) else "scp" if _is_wav_scp(path) else "records"
        if self.kind == "shard":
            from corpus_io.shards.index import read_datalist

            self.urls = read_datalist(path, storage_options=opts.storage_options)
            self.count = len(self.urls)
        elif self.kind == "scp":
            from corpus_io.tables.kaldi import iter_table

            self.table = os.path.join(path, "wav.scp") if os.path.isdir(path) else path
            self.count = sum(1 for _ in iter_table(self.table))
        else:
            from corpus_io.loader.rawlist import RawList

            self.raw = RawList(path)
            self.count = len(self.raw)

    def read(self, start: int) -> Iterator[dict]:
        """Samples (``key``, ``audio`` bytes, ``__url__``) from entry ``start`` on, each entry once."""
        order = [*range(start, self.count), *range(start)]
        if self.kind == "shard":
            for i in order:
                yield from read_shard_unit(self.urls[i], self.opts, self.counts)
        elif self.kind == "scp":
            from corpus_io.tables.kaldi import iter_table

            for part in (range(start, self.count), range(start)):
                for i, line in enumerate(iter_table(self.table)):
                    if i >= part.stop:
                        break
                    if i >= part.start:
                        yield self._source(line.key, line.value, f"{line.path}:{line.lineno}")
        else:
            from corpus_io.loader.read import read_raw_entry

            for i in order:
                sample = read_raw_entry(self.raw, i, self.opts, self.counts)
                if sample is not None:
                    sample["__entry__"] = i
                    yield sample

    def where(self, sample: dict) -> str:
        """The place of an entry's sample for a message: ``<list>:<line>`` and its audio file, or the shard and
        the member's key."""
        if self.kind == "shard":
            return f"shard {sample.get('__url__')}, key '{sample.get('key')}'"
        if self.kind == "scp":
            return f"{sample['__url__']}: key '{sample['key']}' ({sample['__source__']})"
        return f"{self.raw.where(sample['__entry__'])}: key '{sample['key']}' ({sample['meta'].get('source')})"

    def _source(self, key: str, source: str, where: str) -> dict:
        try:
            data = audio.read_source_bytes(source, allow_pipe=self.opts.allow_pipe,
                                           storage_options=self.opts.storage_options)
        except DataError as exc:
            raise DataError(f"{where}: key '{key}': {exc}") from None
        return {"key": key, "audio": data, "audio_format": audio.extension_of(source) or "wav", "__url__": where,
                "__source__": source}


class Pool:
    """Up to ``seconds`` of the audio of one list at ``sample_rate`` Hz: the window of ``(seed, epoch)``
    (module docstring). Filled on first use; ``segments`` are 1-D int16 (16-bit sources) or float32 arrays."""

    def __init__(self, path: str, *, seconds: float, sample_rate: int, opts: ReadOptions, what: str,
                 counts: Counter | None = None) -> None:
        self.path, self.seconds, self.rate, self.opts, self.what = path, seconds, sample_rate, opts, what
        self.counts = counts
        self.segments: list[np.ndarray] = []
        self.keys: list[str] = []  # the key of each segment's entry (the draws dump names it)
        self.epoch: tuple[int, int] | None = None
        self._refused = 0  # entries refused and skipped (on_error=skip), in this process

    def for_epoch(self, seed: int, epoch: int) -> list[np.ndarray]:
        if self.epoch != (seed, epoch):
            self.keys = []
            self.segments = self._fill(seed, epoch)
            self.epoch = (seed, epoch)
        return self.segments

    def _fill(self, seed: int, epoch: int) -> list[np.ndarray]:
        entries = _Entries(self.path, self.opts, self.counts)
        if entries.count == 0:
            raise DataError(f"the {self.what} list {self.path} holds no entries; give a list with at least one "
                            f"recording.")
        start = random.Random(f"{seed}:{epoch}:{self.path}:window").randrange(entries.count)
        budget = max(1, int(self.seconds * self.rate))
        segments: list[np.ndarray] = []
        held = 0
        for sample in entries.read(start):
            decoded = self._usable(sample, entries)
            if decoded is None:
                continue
            wav, rate, pcm16 = decoded
            if rate != self.rate:
                wav, pcm16 = audio.resample_wav(wav, rate, self.rate), False
            samples = wav.reshape(-1).numpy()[:budget - held]
            if samples.size == 0 or not samples.any():  # a silent cut of a usable file: nothing to draw
                continue
            segments.append(np.round(samples * 32768.0).astype(np.int16) if pcm16 else samples.copy())
            self.keys.append(str(sample["key"]))
            held += samples.size
            if held >= budget:
                break
        if not segments:
            raise DataError(f"the {self.what} list {self.path}: no entry could be used (window from entry "
                            f"{start + 1}; {self._refused} refused as undecodable, silent or non-finite); check "
                            f"the list.")
        log.debug("%s pool of epoch %d: %d segments, %.1f s from entry %d of %s", self.what, epoch, len(segments),
                  held / self.rate, start + 1, self.path)
        return segments

    def _usable(self, sample: dict, entries: _Entries) -> tuple[torch.Tensor, int, bool] | None:
        """``(wav (1, n) float32 mono, sample_rate, pcm16)`` of one entry, or None for a refused one skipped and
        counted (``<noise|rir>.refused``, ``on_error=skip``). An entry that is not decodable audio, holds NaN or
        infinity, or is all zeros is refused: noise of no energy cannot reach any SNR, and an all-zero impulse
        response would silence the utterance (or make it NaN)."""
        try:
            wave, rate = stages.decode_audio(sample, "the file")
            if wave.size and not wave.any():
                raise DataError("the file: every sample is zero (a silent file)")
            if wave.size == 0:
                raise DataError("the file: it holds no samples")
        except DataError as exc:
            why = str(exc).rstrip(".")
            tag = "rir" if self.what == "impulse response" else self.what
            if self.opts.on_error == "skip":
                log.warning("the %s list %s: %s: %s; skipped, never applied", self.what, self.path,
                            entries.where(sample), why)
                if self.counts is not None:
                    self.counts[f"{tag}.refused"] += 1
                self._refused += 1
                return None
            raise DataError(f"the {self.what} list {self.path}: {entries.where(sample)}: {why}. Every entry of a "
                            f"{self.what} list must be a decodable audio file with finite samples, not all zero: "
                            f"fix or remove that line, or set ++dataset_conf.on_error=skip to skip such entries "
                            f"(counted as {tag}.refused, never applied).") from None
        data = sample.get("audio")
        pcm16 = wave.ndim == 1 and "start" not in sample and "end" not in sample and audio.is_pcm16(data)
        return torch.from_numpy(np.ascontiguousarray(audio.to_mono(wave), dtype=np.float32))[None], rate, pcm16


def _pick(rng: random.Random, pool: Pool, seed: int, epoch: int) -> tuple[torch.Tensor, str]:
    """A segment of ``pool``'s window of ``(seed, epoch)`` drawn with ``rng``, and its entry's key."""
    segments = pool.for_epoch(seed, epoch)
    i = rng.randrange(len(segments))
    return torch.from_numpy(segments[i]), pool.keys[i]


def _drawn(sample: dict, **values: Any) -> None:
    sample.setdefault(stages.DRAWS, {}).update(values)


def _apply(sample: dict, plan: dict, on_model: bool) -> dict:
    """Apply ``plan`` to ``wav`` now (loader path), or add it to the sample's ``augment`` for the device."""
    if on_model:
        sample.setdefault("augment", {}).update(plan)
        return sample
    wav = sample["wav"]
    lengths = torch.tensor([wav.shape[1]])
    sample["wav"] = mix.apply_plans(wav.float(), lengths, [plan], int(sample["sample_rate"]))
    sample["pcm16"] = False
    return sample


def add_reverb(samples: Iterable[dict], *, rir_list: str | None, prob: float = 0.5, buffer_seconds: float = 60.0,
               seed: int, epoch: int, sample_rate: int, opts: ReadOptions, on_model: bool = False,
               counts: Counter | None = None) -> Iterator[dict]:
    """With probability ``prob`` per utterance, convolve ``wav`` with an impulse response drawn from the pool
    of ``rir_list`` (:func:`corpus_io.audio.mix.reverberate`: aligned to its direct path, same energy)."""
    pool = Pool(str(rir_list), seconds=buffer_seconds, sample_rate=sample_rate, opts=opts, what="impulse response",
                counts=counts)
    for sample in samples:
        rng = draws(seed, epoch, sample["key"], "reverb")
        if rng.random() < prob:
            rir, key = _pick(rng, pool, seed, epoch)
            _drawn(sample, rir=key)
            sample = _apply(sample, {"rir": rir}, on_model)
        yield sample


def add_noise(samples: Iterable[dict], *, noise_list: str | None, snr_db: Sequence[float] = (5.0, 20.0),
              prob: float = 1.0, sets: Sequence[Any] = (), buffer_seconds: float = 300.0, seed: int, epoch: int,
              sample_rate: int, opts: ReadOptions, on_model: bool = False,
              counts: Counter | None = None) -> Iterator[dict]:
    """With probability ``prob`` per utterance, add noise at an SNR drawn in ``snr_db`` (dB, on the speech's
    active samples): a set drawn by weight (``sets``, else ``noise_list``), a segment of its pool and an offset
    in it; a segment shorter than the utterance loops (:func:`corpus_io.audio.mix.add_noise`)."""
    choices = [(s.noise_list, float(s.weight), list(s.snr_db) if s.snr_db is not None else list(snr_db))
               for s in sets] or [(noise_list, 1.0, list(snr_db))]
    pools = [Pool(str(path), seconds=buffer_seconds, sample_rate=sample_rate, opts=opts, what="noise", counts=counts)
             for path, _, _ in choices]
    weights = [w for _, w, _ in choices]
    for sample in samples:
        rng = draws(seed, epoch, sample["key"], "noise")
        if rng.random() < prob:
            which = rng.choices(range(len(choices)), weights)[0] if len(choices) > 1 else 0
            low, high = choices[which][2]
            snr = rng.uniform(low, high)
            segment, key = _pick(rng, pools[which], seed, epoch)
            offset = rng.randrange(segment.shape[0])
            noise = mix.looped(segment, offset, sample["wav"].shape[1])
            _drawn(sample, noise=key, noise_offset=offset, snr_db=snr)
            sample = _apply(sample, {"noise": noise, "snr_db": snr}, on_model)
        yield sample


def volume_perturb(samples: Iterable[dict], *, gain_db: Sequence[float] = (-6.0, 6.0), seed: int, epoch: int,
                   on_model: bool = False, counts: Counter | None = None) -> Iterator[dict]:
    """Scale ``wav`` by a gain drawn uniformly in ``gain_db`` (dB) per utterance (a peak above full scale is
    scaled down: :func:`corpus_io.audio.mix.apply_gain`)."""
    low, high = gain_db
    for sample in samples:
        gain = draws(seed, epoch, sample["key"], "volume").uniform(low, high)
        _drawn(sample, gain_db=gain)
        yield _apply(sample, {"gain_db": gain}, on_model)


def silence_pad(samples: Iterable[dict], *, prob: float = 0.5, seconds: Sequence[float] = (0.1, 1.0), seed: int,
                epoch: int, on_model: bool = False, counts: Counter | None = None) -> Iterator[dict]:
    """With probability ``prob`` per utterance, pad ``wav`` with digital silence (exact zeros) before the speech,
    after it, or both (one of the three drawn alike), each side's length drawn uniformly in ``seconds``: the
    zeros runtimes (sherpa-onnx's online tool: 0.5 s before, 0.8 s after) and recorders pad with. The training
    dither leaves them zero (``SILENCE``, :func:`corpus_io.audio.features.batch_fbank`), so the model hears
    the features decode computes from zeros, not dithered silence. Runs after the other waveform augmentation:
    no reverberation, noise or gain reaches the padding (``feats_on=model``: the plan's ``silence``, which
    :func:`corpus_io.audio.mix.apply_plans` keeps the other steps off)."""
    low, high = seconds
    for sample in samples:
        rng = draws(seed, epoch, sample["key"], "silence")
        if rng.random() < prob:
            side, first, last = rng.randrange(3), rng.uniform(low, high), rng.uniform(low, high)
            rate = int(sample["sample_rate"])
            before = int(round(first * rate)) if side != 1 else 0  # 0: before, 1: after, 2: both
            after = int(round(last * rate)) if side != 0 else 0
            if before or after:
                sample["wav"] = torch.nn.functional.pad(sample["wav"], (before, after))  # exact zeros, any dtype
                sample[stages.SILENCE] = (before, after)
                _drawn(sample, silence=[before, after])
                if on_model:
                    sample.setdefault("augment", {})["silence"] = (before, after)
        yield sample


def dump_audio(samples: Iterable[dict], *, dump_audio_dir: str, epoch: int = 0,
               counts: Counter | None = None) -> Iterator[dict]:
    """Write each utterance's waveform as it stands (after augmentation, before features) to
    ``<dump_audio_dir>/<key>.wav`` (:func:`write_dump`) and what was drawn for it as a line of
    ``<dump_audio_dir>/draws.jsonl`` (:func:`write_draws`)."""
    for sample in samples:
        write_dump(dump_audio_dir, sample["key"], sample["wav"], int(sample["sample_rate"]))
        write_draws(dump_audio_dir, sample["key"], epoch, sample.get(stages.DRAWS))
        yield sample


DRAWS_FILE = "draws.jsonl"


def write_draws(directory: str, key: str, epoch: int, drawn: dict | None) -> None:
    """Append ``{"key", "epoch", <what was drawn>}`` to ``<directory>/draws.jsonl``: ``speed``, ``rir`` (the impulse
    response's key), ``noise`` (the noise's key), ``noise_offset`` (samples into it), ``snr_db``, ``gain_db``,
    ``silence`` (``[before, after]``: samples of digital silence around the speech); a
    stage that was off or did not fire for the utterance leaves its fields out. One ``write`` of one line with
    O_APPEND, so the loader's worker processes append whole lines side by side."""
    import json
    import os

    line = json.dumps({"key": key, "epoch": epoch, **(drawn or {})}, ensure_ascii=False) + "\n"
    fd = os.open(os.path.join(directory, DRAWS_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def write_dump(directory: str, key: str, wav: torch.Tensor, sample_rate: int) -> None:
    """``<directory>/<key>.wav`` (:func:`corpus_io.audio.io.dump_name`), 32-bit float (the samples exactly as
    the features see them), written to a temporary name and renamed."""
    from pathlib import Path

    from corpus_io.storage.files import atomic_write

    data = audio.encode_float_wav(mix.as_float(wav.reshape(-1)).numpy(), sample_rate)
    with atomic_write(Path(directory) / audio.dump_name(key), mode="wb") as f:
        f.write(data)
