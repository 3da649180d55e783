"""The one place that composes the loader chain, in WeNet's order, as a value.

    list shuffle -> partition -> open -> tar group | raw read      (corpus_io.loader.read)
    -> decode -> filter -> resample -> speed perturb -> reverb -> noise -> volume -> frame count -> tokenize
    -> token filter -> features -> augmentation
       (feats_on=model: ... -> speed perturb -> frame count -> filter -> drop empty -> tokenize -> token
       filter; features and augmentation run batched on the model's device, corpus_io.model.frontend)
    -> [enter: resume bookkeeping, epoch_hours budget]
    -> shuffle buffer -> sort buffer | bucketing -> batch -> shuffle the batches of a sort block (train)
    -> [emit: resume bookkeeping] -> pad

:func:`loader_chain` turns a :class:`DatasetConf` into a list of named :class:`Stage` values (printable:
``bench-loader`` and ``train`` log it at start); :func:`build_pipeline` folds it over the read samples
of one slot. A stage takes its config block whole: every key of the block that its function names is
passed (tests/loader/test_build.py checks that every key of a block reaches some stage). Tokens are
counted and filtered before features, so no features are computed for an utterance the token filter
drops (WeNet's order). Augmentation and speed perturbation run only in train mode; cv/test reads the
list unshuffled, split across ranks. The two bookkeeping taps keep :class:`~corpus_io.loader.partition.SlotState`
up to date so every padded batch carries the worker's exact read position (``__state__``) and its
filter/skip count deltas (``__counts__``).
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from corpus_io.config import DatasetConf
from corpus_io.errors import ConfigError
from corpus_io.loader import profile
from corpus_io.loader.partition import Slot, SlotState
from corpus_io.loader.read import ReadOptions, Source, iter_source, mix


def read_options(conf: DatasetConf) -> ReadOptions:
    if not conf.read_timeout > 0:
        raise ConfigError(f"dataset_conf.read_timeout={conf.read_timeout}: the longest wait for a remote read must "
                          f"be > 0 seconds (default 30), e.g. ++dataset_conf.read_timeout=60.")
    from corpus_io.storage.urls import TIMEOUT_KEY_OPTION

    storage_options = {**(conf.storage_options or {}), "read_timeout": float(conf.read_timeout),
                       "pipe_timeout": float(conf.pipe_timeout), TIMEOUT_KEY_OPTION: "dataset_conf.read_timeout"}
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
    pass: see :func:`corpus_io.loader.read.mix`)."""
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


def enter(samples: Iterator[dict], *, state: SlotState, budget: float | None) -> Iterator[dict]:
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
            return


def emit(batches: Iterator[list[dict]], *, state: SlotState) -> Iterator[list[dict]]:
    for batch in batches:
        for sample in batch:
            state.emit(sample["__sid__"])
        yield batch


#: what a fold supplies to the stages that name it: per slot and epoch, not config (int16: see int16_decode;
#: batched: see reads_ahead)
RUNTIME = ("counts", "rng", "state", "budget", "batch_order", "epoch", "int16", "batched")


@dataclass(frozen=True)
class Stage:
    """One named step of the loader chain: ``fn(samples, **kwargs)`` -> samples (or batches).

    ``block``: a config dataclass passed whole; every key of it that ``fn`` names is passed. ``args``:
    plain arguments from elsewhere in the config. Runtime values (:data:`RUNTIME`) are supplied when the
    chain is folded, to the stages whose function names them.
    """

    name: str
    fn: Callable[..., Iterator]
    block: Any = None
    args: Mapping[str, Any] = field(default_factory=dict)

    def config_kwargs(self) -> dict[str, Any]:
        params = inspect.signature(self.fn).parameters
        out = {}
        if self.block is not None:
            out.update({f.name: getattr(self.block, f.name) for f in dataclasses.fields(self.block)
                        if f.name in params})
        out.update(self.args)
        return out

    def __call__(self, samples: Iterator, runtime: Mapping[str, Any]) -> Iterator:
        params = inspect.signature(self.fn).parameters
        return self.fn(samples, **self.config_kwargs(), **{k: v for k, v in runtime.items() if k in params})

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.config_kwargs().items() if k not in ("tokenizer", "opts"))
        return f"{self.name}({shown})"


def describe_chain(chain: list[Stage]) -> str:
    """The chain one stage per line, with the configuration each stage runs with."""
    return "\n".join(f"  {i:2d}. {stage}" for i, stage in enumerate(chain, 1))


def waveform_augmentation(conf: DatasetConf, *, train: bool, dump_audio_dir: str | None = None) -> list[Stage]:
    """reverb -> noise -> volume -> silence_pad (train only; with feats_on=model drawn here, applied on the device;
    the silence is padded here), then the
    waveforms written to ``dump_audio_dir`` (bench-loader) when given."""
    from corpus_io.loader import waveaug

    chain: list[Stage] = []
    if train:
        common = {"seed": conf.seed, "on_model": conf.feats_on == "model"}
        reads = {**common, "sample_rate": conf.resample_conf.resample_rate, "opts": read_options(conf)}
        if conf.add_reverb:
            chain.append(Stage("add_reverb", waveaug.add_reverb, conf.add_reverb_conf, args=reads))
        if conf.add_noise:
            chain.append(Stage("add_noise", waveaug.add_noise, conf.add_noise_conf, args=reads))
        if conf.volume_perturb:
            chain.append(Stage("volume_perturb", waveaug.volume_perturb, conf.volume_perturb_conf, args=common))
        if conf.silence_pad:  # last: no reverberation, noise or gain reaches the zeros
            chain.append(Stage("silence_pad", waveaug.silence_pad, conf.silence_pad_conf, args=common))
    if dump_audio_dir and conf.feats_on != "model":  # feats_on=model: bench-loader writes them after the device's
        chain.append(Stage("dump_audio", waveaug.dump_audio, args={"dump_audio_dir": dump_audio_dir}))
    return chain


def loader_chain(conf: DatasetConf, tokenizer: Any, *, train: bool, dump_audio_dir: str | None = None) -> list[Stage]:
    """The stages after reading, in order, for ``conf`` (see the module docstring)."""
    from corpus_io.loader import batching, stages

    chain: list[Stage] = []
    f = conf.filter_conf
    tokens = [Stage("tokenize", stages.tokenize, args={"tokenizer": tokenizer}),
              Stage("filter_tokens", stages.filter_tokens, f)] if tokenizer is not None else []
    if conf.feats_type == "precomputed":
        chain += [Stage("precomputed_features", stages.precomputed_features,
                        args={"fields": list(conf.fields), "on_error": conf.on_error}),
                  Stage("filter_length", stages.filter_length, f), *tokens]
    else:
        on_model = conf.feats_on == "model"
        chain.append(Stage("decode", stages.decode, args={"on_error": conf.on_error}))
        if not on_model:
            chain.append(Stage("filter_length", stages.filter_length, f))
        chain.append(Stage("resample", stages.resample, conf.resample_conf))
        if train and conf.speed_perturb:
            chain.append(Stage("speed_perturb", stages.speed_perturb, conf.speed_perturb_conf,
                               args={"seed": conf.seed}))
        chain += waveform_augmentation(conf, train=train, dump_audio_dir=dump_audio_dir)
        frames = conf.fbank_conf if conf.feats_type == "fbank" else conf.mfcc_conf
        if on_model:  # waveforms to the device front end; the length filter counts its exact frames
            chain += [Stage("waveform_frames", stages.waveform_frames, frames),
                      Stage("filter_length", stages.filter_length, f), Stage("drop_empty", stages.drop_empty),
                      *tokens]
        elif conf.feats_type == "raw":  # a frame is a sample: the token ratio counts samples, after features
            chain += [Stage("raw_features", stages.raw_features), *tokens]
        else:  # the exact feature frame count first, so the token filter counts what it did after features
            # dither: training's only, drawn by (seed, epoch, key); cv and test compute the features without
            dither = {"seed": conf.seed} if train else {"dither": 0.0}
            chain += [Stage("count_frames", stages.count_frames, frames), *tokens,
                      Stage(conf.feats_type, stages.fbank if conf.feats_type == "fbank" else stages.mfcc, frames,
                            args=dither)]
    if train and conf.feats_on != "model":  # feats_on=model: the device front end augments (auto: train settles it)
        for name in ("spec_aug", "spec_sub", "spec_trim"):
            if getattr(conf, name):
                chain.append(Stage(name, getattr(stages, name), getattr(conf, f"{name}_conf")))
    chain.append(Stage("enter", enter))
    if train and conf.shuffle:
        chain.append(Stage("shuffle", stages.shuffle, conf.shuffle_conf))
    batch_args = {"batch_type": conf.batch_type, "batch_size": conf.batch_size, "max_batch_size": conf.max_batch_size}
    # train: batches leave a sort block (or the buckets' final emptying) in a random order, so an epoch cut short
    # by uneven ranks does not always leave the longest utterances untrained
    shuffled = train and conf.shuffle
    if conf.bucketing:
        from corpus_io.loader.shapes import edge_frames

        # edges (estimated once, before the workers: build_dataloader) shared by every rank and worker: few shapes
        edges = edge_frames(conf.bucket_edges, conf) if conf.bucket_edges else None
        chain.append(Stage("bucket_batch", batching.bucket_batch,
                           args={**batch_args, "num_buckets": conf.num_buckets, "boundaries": edges,
                                 "pad_to_edge": edges is not None, "bucket_batch_size": conf.bucket_batch_size,
                                 "bucket_shares": conf.bucket_shares if conf.sync_buckets else None,
                                 "seed": conf.seed,
                                 "shuffle_batches": shuffled}))
    else:
        if conf.sort:
            chain.append(Stage("sort", stages.sort, conf.sort_conf, args={"mark_blocks": shuffled}))
        chain.append(Stage("batch", batching.batch, args=batch_args))
        if conf.sort and shuffled:
            chain.append(Stage("shuffle_batches", stages.shuffle_batches))
    # feats_type=raw: a "frame" is one sample, so audio_seconds counts samples / rate, not 10 ms frames
    shift = 1.0 / conf.resample_conf.resample_rate if conf.feats_type == "raw" else 0.01
    frame = conf.mfcc_conf if conf.feats_type == "mfcc" else conf.fbank_conf  # a waveform batch padded to frames
    chain += [Stage("emit", emit), Stage("pad", stages.pad, args={"frame_shift": shift,
                                                                  "frame_length_ms": frame.frame_length,
                                                                  "frame_shift_ms": frame.frame_shift,
                                                                  "snip_edges": getattr(frame, "snip_edges", True)})]
    return chain


#: stages that take the int16 waveforms of ``decode(int16=True)`` (they convert where they need floats)
TAKES_INT16 = frozenset({"filter_length", "resample", "speed_perturb", "count_frames", "tokenize", "filter_tokens",
                         "fbank", "mfcc", "waveform_frames", "drop_empty", "raw_features", "spec_aug", "spec_sub",
                         "spec_trim", "silence_pad"})


def reads_ahead(conf: DatasetConf) -> bool:
    """May a stage before the buffers read ahead (batched features take a window of samples)? Not for streams
    that continue across epochs (``epoch_hours``, a weighted mix): their readers mark a pass's end in the slot
    state when they reach it, so every sample read must enter the buffers before the next is read."""
    return not continues_streams(conf)


def int16_decode(chain: list[Stage]) -> bool:
    """Can ``decode`` give 16-bit PCM as stored (no float conversion)? When every stage between it and the
    buffers takes it; a stage not known to (a new one) keeps the float waveforms."""
    names = [s.name for s in chain]
    if "decode" not in names or "enter" not in names:
        return False
    return all(n in TAKES_INT16 for n in names[names.index("decode") + 1:names.index("enter")])


def build_pipeline(sources: list[Source], conf: DatasetConf, tokenizer: Any, *, slot: Slot, state: SlotState,
                   train: bool, counts: Counter, dump_audio_dir: str | None = None) -> Iterator[dict]:
    """Padded batch dicts of one slot (see docs/DEVELOPING.md "The sample dict"), without bookkeeping keys."""
    from corpus_io.loader import batching, stages

    epoch = state.epoch
    seed = conf.seed
    # seeded by (seed, epoch, rank, worker) and, on resume, by the position (a resumed worker's buffers
    # are refilled in a new order; the *set* of utterances is what resume keeps exact)
    tag = f"{seed}:{epoch}:{slot.rank}:{slot.worker}:{sum(state.taken.values())}"
    shuffle = train and conf.shuffle
    infinite = continues_streams(conf)
    mark_pass_end = marks_pass_end(conf)
    opts = read_options(conf)

    # list shuffle -> partition -> open -> tar group | raw read (-> weighted mix)
    streams = [iter_source(i, src, slot, state, opts, counts, seed=source_seed(conf, i),
                           first_pass=first_pass(conf, epoch), shuffle=shuffle, infinite=infinite,
                           mark_pass_end=mark_pass_end)
               for i, src in enumerate(sources)]
    # a key several shards hold is read once, from its owner shard (per stream: the owners are the source's)
    streams = [stages.drop_repeated_keys(stream, owners=src.owners, track=src.track_keys, raw=src.data_type == "raw",
                                         on_error=conf.on_error, counts=counts)
               if src.owners or src.track_keys else stream for stream, src in zip(streams, sources)]
    samples = streams[0] if len(streams) == 1 else mix(streams, [s.weight for s in sources], state)
    prof = profile.current()  # CORPUS_IO_LOADER_PROFILE: every stage timed (corpus_io.loader.profile)
    if prof is not None:
        samples = prof.stage(samples, "tar parse")
    runtime = {"counts": counts, "rng": random.Random(tag), "state": state,
               "budget": slot_budget_seconds(conf, slot),
               "batch_order": batching.batch_order(seed, epoch, slot.rank, slot.worker), "epoch": epoch}
    chain = loader_chain(conf, tokenizer, train=train, dump_audio_dir=dump_audio_dir)
    runtime["int16"], runtime["batched"] = int16_decode(chain), reads_ahead(conf)
    for stage in chain:
        samples = stage(samples, runtime)
        if prof is not None:
            samples = prof.stage(samples, stage.name)
    return samples
