"""The one place that composes the loader chain, in WeNet's order.

    list shuffle -> partition -> open -> tar group | raw read      (corpus_io.pipeline.read)
    -> decode -> filter -> resample -> speed perturb -> features -> augmentation -> tokenize
       (feats_on=model: ... -> speed perturb -> frame count -> filter -> drop empty -> tokenize; features and
       augmentation run batched on the model's device, corpus_io.train.frontend)
    -> [enter: resume bookkeeping, epoch_hours budget]
    -> shuffle buffer -> sort buffer | bucketing -> batch
    -> [emit: resume bookkeeping] -> pad

Each stage is a generator from corpus_io.pipeline.stages taking plain arguments. Augmentation and
speed perturbation run only in train mode; cv/test reads the list unshuffled, split across ranks.
The two bookkeeping taps keep :class:`~corpus_io.partition.SlotState` up to date so every padded
batch carries the worker's exact read position (``__state__``) and its filter/skip count deltas
(``__counts__``).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Iterator

from corpus_io.config import DatasetConf
from corpus_io.errors import ConfigError
from corpus_io.partition import Slot, SlotState
from corpus_io.pipeline.read import ReadOptions, Source, iter_source, mix


def read_options(conf: DatasetConf) -> ReadOptions:
    if not conf.read_timeout > 0:
        raise ConfigError(f"dataset_conf.read_timeout={conf.read_timeout}: the longest wait for a remote read must "
                          f"be > 0 seconds (default 30), e.g. ++dataset_conf.read_timeout=60.")
    storage_options = {**(conf.storage_options or {}), "read_timeout": float(conf.read_timeout)}
    return ReadOptions(storage_options=storage_options, allow_pipe=conf.allow_pipe,
                       max_member_bytes=conf.max_member_bytes, retries=conf.retries,
                       retry_backoff=conf.retry_backoff, on_error=conf.on_error,
                       fields=tuple(conf.fields))


def slot_budget_seconds(conf: DatasetConf, slot: Slot) -> float | None:
    """``epoch_hours`` split evenly over every reader (ranks x workers)."""
    if not conf.epoch_hours:
        return None
    return conf.epoch_hours * 3600.0 / slot.count


def sample_seconds(sample: dict) -> float:
    if "feats" in sample and hasattr(sample["feats"], "shape"):
        return float(sample["feats"].shape[0]) * 0.01
    if "wav" in sample:
        return float(sample["wav"].shape[-1]) / float(sample.get("sample_rate") or 16000)
    return 0.0


def continues_streams(conf: DatasetConf) -> bool:
    """Epochs continue the streams where the last one stopped instead of starting a new pass: with
    ``epoch_hours``, and with a weighted mix of ``sources`` (its epoch ends when one source finishes a
    pass: see :func:`corpus_io.pipeline.read.mix`)."""
    return bool(conf.epoch_hours) or len(conf.sources) > 1


def marks_pass_end(conf: DatasetConf) -> bool:
    """A weighted mix without epoch_hours: its epoch ends when a source's pass does (a cursor at the start of
    the next pass marks it)."""
    return len(conf.sources) > 1 and not conf.epoch_hours


def source_seed(conf: DatasetConf, src: int) -> int:
    """The list-shuffle seed of source ``src`` (each source of a mix has its own order)."""
    return conf.seed + 7919 * src


def first_pass(conf: DatasetConf, epoch: int) -> int:
    """The pass an epoch's streams start in: the epoch itself, or 0 for streams that continue across epochs."""
    return 0 if continues_streams(conf) else epoch


def enter(samples: Iterator[dict], state: SlotState, budget: float | None, stop: list[bool]) -> Iterator[dict]:
    """Record each sample entering the buffers; end the stream once the epoch_hours budget is spent.

    The samples pending at the start (a checkpoint's buffers, or what the last epoch left in them) come
    back first; they were counted when they first entered, so the budget can only end the stream once
    all of them are back in the buffers.
    """
    owed = set(state.pending)
    for sample in samples:
        sid = sample["__sid__"]
        owed.discard(sid)
        state.enter(sid, sample_seconds(sample))
        yield sample
        if budget is not None and state.seconds >= budget and not owed:
            stop[0] = True
            return


def emit(batches: Iterator[list[dict]], state: SlotState) -> Iterator[list[dict]]:
    for batch in batches:
        for sample in batch:
            state.emit(sample["__sid__"])
        yield batch


def build_pipeline(sources: list[Source], conf: DatasetConf, tokenizer: Any, *, slot: Slot, state: SlotState,
                   train: bool, counts: Counter) -> Iterator[dict]:
    """Padded batch dicts of one slot (see docs/DEVELOPING.md "The sample dict"), without bookkeeping keys."""
    from corpus_io import batching
    from corpus_io.pipeline import stages

    epoch = state.epoch
    seed = conf.seed
    # seeded by (seed, epoch, rank, worker) and, on resume, by the position (a resumed worker's buffers
    # are refilled in a new order; the *set* of utterances is what resume keeps exact)
    tag = f"{seed}:{epoch}:{slot.rank}:{slot.worker}:{sum(state.taken.values())}"
    rng = random.Random(tag)
    generator = None
    if (conf.fbank_conf.dither if conf.feats_type == "fbank" else conf.mfcc_conf.dither) and train:
        import torch

        generator = torch.Generator().manual_seed(random.Random(tag + ":dither").getrandbits(63))
    shuffle = train and conf.shuffle
    infinite = continues_streams(conf)
    mark_pass_end = marks_pass_end(conf)
    opts = read_options(conf)
    stop = [False]

    # list shuffle -> partition -> open -> tar group | raw read (-> weighted mix)
    streams = [iter_source(i, src, slot, state, opts, counts, seed=source_seed(conf, i),
                           first_pass=first_pass(conf, epoch), shuffle=shuffle, infinite=infinite,
                           mark_pass_end=mark_pass_end)
               for i, src in enumerate(sources)]
    streams = [stages.drop_repeated_keys(stream, owners=src.owners, counts=counts) if src.owners else stream
               for stream, src in zip(streams, sources)]
    samples = streams[0] if len(streams) == 1 else mix(streams, [s.weight for s in sources], state,
                                                       stop=lambda: stop[0])
    f = conf.filter_conf
    if conf.feats_type == "precomputed":
        samples = stages.precomputed_features(samples, fields=list(conf.fields), on_error=conf.on_error,
                                              counts=counts)
        samples = stages.filter_length(samples, min_length=f.min_length, max_length=f.max_length, counts=counts)
    else:
        samples = stages.decode(samples, on_error=conf.on_error, counts=counts)
        on_model = conf.feats_on == "model"
        if not on_model:
            samples = stages.filter_length(samples, min_length=f.min_length, max_length=f.max_length, counts=counts)
        samples = stages.resample(samples, resample_rate=conf.resample_conf.resample_rate, counts=counts)
        if train and conf.speed_perturb:
            samples = stages.speed_perturb(samples, speeds=conf.speed_perturb_conf.speeds, rng=rng, counts=counts)
        if on_model:  # waveforms to the device front end; the length filter counts its exact frames
            c = conf.fbank_conf if conf.feats_type == "fbank" else conf.mfcc_conf
            samples = stages.waveform_frames(samples, frame_length=c.frame_length, frame_shift=c.frame_shift,
                                             counts=counts)
            samples = stages.filter_length(samples, min_length=f.min_length, max_length=f.max_length, counts=counts)
            samples = stages.drop_empty(samples, counts=counts)
        else:
            samples = _features(stages, samples, conf, counts, generator)
    augment = train and conf.feats_on == "loader"  # feats_on=model: the device front end augments
    if augment and conf.spec_aug:
        a = conf.spec_aug_conf
        samples = stages.spec_aug(samples, num_t_mask=a.num_t_mask, num_f_mask=a.num_f_mask, max_t=a.max_t,
                                  max_f=a.max_f, rng=rng, counts=counts)
    if augment and conf.spec_sub:
        samples = stages.spec_sub(samples, max_t=conf.spec_sub_conf.max_t, num_t_sub=conf.spec_sub_conf.num_t_sub,
                                  rng=rng, counts=counts)
    if augment and conf.spec_trim:
        samples = stages.spec_trim(samples, max_t=conf.spec_trim_conf.max_t, rng=rng, counts=counts)
    if tokenizer is not None:
        samples = stages.tokenize(samples, tokenizer=tokenizer, counts=counts)
        samples = stages.filter_tokens(samples, token_min_length=f.token_min_length,
                                       token_max_length=f.token_max_length,
                                       min_output_input_ratio=f.min_output_input_ratio,
                                       max_output_input_ratio=f.max_output_input_ratio, counts=counts)

    samples = enter(samples, state, slot_budget_seconds(conf, slot), stop)
    if shuffle:
        samples = stages.shuffle(samples, shuffle_size=conf.shuffle_conf.shuffle_size, rng=rng, counts=counts)
    if conf.bucketing:
        batches = batching.bucket_batch(samples, batch_type=conf.batch_type, batch_size=conf.batch_size,
                                        max_batch_size=conf.max_batch_size, num_buckets=conf.num_buckets,
                                        counts=counts)
    else:
        if conf.sort:
            samples = stages.sort(samples, sort_size=conf.sort_conf.sort_size, counts=counts)
        batches = batching.batch(samples, batch_type=conf.batch_type, batch_size=conf.batch_size,
                                 max_batch_size=conf.max_batch_size, counts=counts)
    batches = emit(batches, state)
    # feats_type=raw: a "frame" is one sample, so audio_seconds counts samples / rate, not 10 ms frames
    shift = 1.0 / conf.resample_conf.resample_rate if conf.feats_type == "raw" else 0.01
    return stages.pad(batches, frame_shift=shift)


def _features(stages: Any, samples: Iterator[dict], conf: DatasetConf, counts: Counter,
              generator: Any) -> Iterator[dict]:
    if conf.feats_type == "fbank":
        c = conf.fbank_conf
        return stages.fbank(samples, num_mel_bins=c.num_mel_bins, frame_length=c.frame_length,
                            frame_shift=c.frame_shift, dither=c.dither, generator=generator, counts=counts)
    if conf.feats_type == "mfcc":
        c = conf.mfcc_conf
        return stages.mfcc(samples, num_mel_bins=c.num_mel_bins, num_ceps=c.num_ceps, frame_length=c.frame_length,
                           frame_shift=c.frame_shift, dither=c.dither, high_freq=c.high_freq, low_freq=c.low_freq,
                           generator=generator, counts=counts)
    return stages.raw_features(samples, counts=counts)
