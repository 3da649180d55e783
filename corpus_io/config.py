"""Typed configs for every subcommand, and their Hydra composition.

Each subcommand has one dataclass schema here. ``conf/<command>.yaml`` (or the
user's ``--config-path/--config-name``) plus trailing Hydra overrides
(``key=value``, ``+key=value``, ``++key=value``) are composed with Hydra's
compose API (no ``outputs/`` folder, no change of cwd), then checked against
the schema:

* an unknown key is a :class:`ConfigError` naming the key, and the closest valid one when one is
  really close (a typo); FunASR's own keys are mapped or accepted first (:data:`FUNASR_KEYS`);
* a value of the wrong type is a :class:`ConfigError` naming the key, the
  expected type and the value;
* a value outside a field's ``choices`` is a :class:`ConfigError` listing them.

This module imports neither torch nor Hydra at import time, so ``--help`` is fast.
Units follow Kaldi/WeNet: lengths in 10 ms frames, durations in seconds, rates in Hz.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from corpus_io.errors import ConfigError


def _shipped_conf_dir() -> Path:
    """The shipped YAML configs: ``corpus_io/conf`` in an installed wheel, ``conf/`` beside it in a checkout."""
    here = Path(__file__).resolve().parent
    installed = here / "conf"
    return installed if installed.is_dir() else here.parent / "conf"


CONF_DIR = _shipped_conf_dir()


def opt(default: Any = dataclasses.MISSING, help: str = "", *, unit: str = "", choices: tuple = (),
        factory: Any = dataclasses.MISSING, group: str = "", range: str = "") -> Any:
    """A schema field with its help text, unit and allowed values (shown by ``--help``).

    The default given here is the one default: the shipped ``conf/*.yaml`` may restate it, and
    ``tests/test_config.py`` fails when they disagree. ``group`` names a config group directory
    (``conf/<group>/*.yaml`` presets, chosen in the command YAML's ``defaults`` list).
    ``range``: the allowed interval of a number, in interval notation, e.g. ``"[1, 64]"`` or ``"(0, inf)"``
    (``[``/``]`` include the bound, ``(``/``)`` exclude it). Every value that sizes memory, time or
    processes has one; a value outside it is a :class:`ConfigError` (null stays allowed for Optional keys).
    """
    if range:
        parse_range(range)  # a typo in a schema fails at import, not in a user's run
    meta = {"help": help, "unit": unit, "choices": tuple(choices), "group": group, "range": range}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_range(spec: str) -> tuple[float, bool, float, bool]:
    """``"[1, 64]"`` -> ``(1, True, 64, True)``: (low, low included, high, high included)."""
    text = spec.strip()
    lo_text, _, hi_text = text[1:-1].partition(",")
    if text[:1] not in "[(" or text[-1:] not in "])" or not _:
        raise ValueError(f"bad range {spec!r}: use interval notation like '[1, 64]' or '(0, inf)'")
    return float(lo_text), text[0] == "[", float(hi_text), text[-1] == "]"


def in_range(value: float, spec: str) -> bool:
    lo, lo_in, hi, hi_in = parse_range(spec)
    return (lo < value or (lo_in and value == lo)) and (value < hi or (hi_in and value == hi))


# --------------------------------------------------------------------------- dataset_conf


#: failure handling, one word in every command: fail (a DataError naming file, line, key or shard) or skip
#: (drop the item and count it in the closing summary)
FAILURE_CHOICES = ("fail", "skip")


@dataclass
class FilterConf:
    max_length: int = opt(10240, "drop utterances longer than this", unit="frames (10 ms)")
    min_length: int = opt(10, "drop utterances shorter than this", unit="frames (10 ms)")
    token_max_length: int = opt(200, "drop utterances with more tokens than this", unit="tokens")
    token_min_length: int = opt(1, "drop utterances with fewer tokens than this", unit="tokens")
    min_output_input_ratio: float = opt(0.0005, "drop if tokens/frames is below this", unit="tokens per frame")
    max_output_input_ratio: float = opt(1.0, "drop if tokens/frames is above this", unit="tokens per frame")


@dataclass
class ResampleConf:
    resample_rate: int = opt(16000, "every waveform is resampled to this rate", unit="Hz", range="[1000, 384000]")


@dataclass
class SpeedPerturbConf:
    speeds: List[float] = opt(help="one speed factor is drawn per utterance", factory=lambda: [0.9, 1.0, 1.1])


@dataclass
class FbankConf:
    num_mel_bins: int = opt(80, "mel filterbank channels", range="[1, 512]")
    frame_length: float = opt(25.0, "analysis window", unit="ms", range="[1, 1000]")
    frame_shift: float = opt(10.0, "hop between frames", unit="ms", range="[1, 1000]")
    dither: float = opt(0.0, "dither added before the FFT (0 = deterministic)", range="[0, inf)")


@dataclass
class MfccConf:
    num_mel_bins: int = opt(40, "mel filterbank channels", range="[1, 512]")
    num_ceps: int = opt(40, "cepstral coefficients kept", range="[1, 512]")
    frame_length: float = opt(25.0, "analysis window", unit="ms", range="[1, 1000]")
    frame_shift: float = opt(10.0, "hop between frames", unit="ms", range="[1, 1000]")
    dither: float = opt(0.0, "dither added before the FFT", range="[0, inf)")
    high_freq: float = opt(-200.0, "high cutoff (negative: offset from Nyquist)", unit="Hz")
    low_freq: float = opt(20.0, "low cutoff", unit="Hz")


@dataclass
class SpecAugConf:
    num_t_mask: int = opt(2, "time masks per utterance", range="[0, 100]")
    num_f_mask: int = opt(2, "frequency masks per utterance", range="[0, 100]")
    max_t: int = opt(50, "longest time mask", unit="frames", range="[0, 100000]")
    max_f: int = opt(10, "widest frequency mask", unit="mel bins", range="[0, 512]")


@dataclass
class SpecSubConf:
    max_t: int = opt(30, "longest substituted span", unit="frames", range="[0, 100000]")
    num_t_sub: int = opt(3, "substitutions per utterance", range="[0, 100]")


@dataclass
class SpecTrimConf:
    max_t: int = opt(20, "most frames trimmed from the end", unit="frames", range="[0, 100000]")


@dataclass
class ShuffleConf:
    shuffle_size: int = opt(1500, "utterances held by the shuffle buffer", unit="utterances", range="[1, 1000000]")


@dataclass
class SortConf:
    sort_size: int = opt(500, "utterances sorted by length together", unit="utterances", range="[1, 1000000]")


@dataclass
class SourceConf:
    data_list: str = opt("???", "a data.list (shard or raw) of one corpus")
    weight: float = opt(1.0, "relative share of this corpus in the mix", range="[0, inf)")
    data_type: str = opt("shard", "format of this list", choices=("raw", "shard"))


@dataclass
class DatasetConf:
    data_type: str = opt("shard", "raw: JSONL list of utterances; shard: list of tar URLs", choices=("raw", "shard"))
    fields: List[str] = opt(help="fields to read (empty: all of the main shard), e.g. [fbank, txt]", factory=list)
    seed: int = opt(777, "seed of the list shuffle and the buffers; epoch e uses (seed, e)")
    filter_conf: FilterConf = opt(factory=FilterConf)
    resample_conf: ResampleConf = opt(factory=ResampleConf)
    speed_perturb: bool = opt(False, "apply speed perturbation (train only)")
    speed_perturb_conf: SpeedPerturbConf = opt(factory=SpeedPerturbConf)
    feats_type: str = opt("fbank", "features computed by the loader",
                          choices=("fbank", "mfcc", "raw", "precomputed"))
    feats_on: str = opt("loader", "where fbank/mfcc and spec_aug/sub/trim run: loader (DataLoader workers, per "
                                  "utterance), or model (the loader ships padded waveforms; train/cv/decode compute "
                                  "them batched on the model's device)", choices=("loader", "model"))
    fbank_conf: FbankConf = opt(factory=FbankConf)
    mfcc_conf: MfccConf = opt(factory=MfccConf)
    spec_aug: bool = opt(False, "SpecAugment masks (train only)")
    spec_aug_conf: SpecAugConf = opt(factory=SpecAugConf)
    spec_sub: bool = opt(False, "substitute time spans with earlier frames (train only)")
    spec_sub_conf: SpecSubConf = opt(factory=SpecSubConf)
    spec_trim: bool = opt(False, "trim a random number of end frames (train only)")
    spec_trim_conf: SpecTrimConf = opt(factory=SpecTrimConf)
    shuffle: bool = opt(True, "shuffle the list per epoch and shuffle utterances in a buffer")
    shuffle_conf: ShuffleConf = opt(factory=ShuffleConf)
    sort: bool = opt(True, "sort utterances by length inside a buffer before batching")
    sort_conf: SortConf = opt(factory=SortConf)
    bucketing: bool = opt(False, "batch from duration buckets instead of the sort buffer")
    num_buckets: int = opt(30, "duration buckets when bucketing=true; memory: up to num_buckets x 4 batches "
                                   "of samples are held", range="[1, 1000]")
    batch_type: str = opt("example", "example: utterances; length: padded frames; token: padded frames+tokens",
                          choices=("example", "length", "token"))
    batch_size: int = opt(16, "example: utterances per batch; length: max(source_len)*n; "
                              "token: max(source_len+target_len)*n", unit="utterances | frames | frames+tokens",
                          range="[1, 100000000]")
    max_batch_size: int = opt(200, "cap on utterances per batch for length/token batching", unit="utterances",
                              range="[1, 100000]")
    num_workers: int = opt(2, "DataLoader worker processes per rank", range="[0, 256]")
    prefetch: int = opt(2, "batches prefetched per worker", range="[1, 64]")
    batch_timeout: float = opt(1800.0, "longest wait for the next batch of a DataLoader worker; past it the rank "
                                       "fails naming the rank and worker (0: wait forever)", unit="seconds",
                               range="[0, 604800]")
    pin_memory: bool = opt(False, "pin batches in page-locked memory (GPU)")
    on_error: str = opt("fail", "a corrupt shard/member or an unreachable URL: fail, or skip and count it",
                        choices=FAILURE_CHOICES)
    retries: int = opt(3, "attempts to open a remote URL before on_error applies", range="[0, 100]")
    retry_backoff: float = opt(0.5, "first wait between retries, doubled each time", unit="seconds", range="[0, 600]")
    read_timeout: float = opt(30.0, "longest wait for a connection or the next byte of a remote read, per "
                                    "attempt; a stall past it is retried, then on_error", unit="seconds",
                              range="(0, 86400]")
    max_member_bytes: int = opt(256 * 1024 * 1024, "a tar member larger than this is rejected", unit="bytes",
                                range="[1, 17179869184]")
    storage_options: Dict[str, Any] = opt(help="fsspec options for remote URLs (e.g. endpoint_url, key, secret)",
                                          factory=dict)
    allow_pipe: bool = opt(False, "allow pipe:CMD URLs in lists (runs CMD without a shell)")
    sources: List[SourceConf] = opt(help="mix several lists by weight: [{data_list, weight, data_type}]",
                                    factory=list)
    epoch_hours: Optional[float] = opt(None, "define an epoch as this much audio instead of one pass", unit="hours",
                                       range="(0, inf)")


# --------------------------------------------------------------------------- tokenizer


@dataclass
class TokenizerConf:
    type: str = opt("char", "char: CJK chars + Latin words/letters; bpe: sentencepiece; word: jieba + whitespace",
                    choices=("char", "bpe", "word"))
    token_list: Optional[str] = opt(None, "token list file: '<token> <id>' per line")
    bpe_model: Optional[str] = opt(None, "sentencepiece model (type=bpe)")
    latin_unit: str = opt("word", "how char splits Latin text", choices=("word", "letter"))
    remove_cjk_spaces: bool = opt(True, "drop spaces between CJK characters before tokenizing")
    lowercase: bool = opt(False, "lowercase text before tokenizing")
    unk: str = opt("<unk>", "symbol for unknown tokens")
    blank: str = opt("<blank>", "CTC blank symbol (id 0)")
    space: str = opt("▁", "symbol for a word boundary when latin_unit=letter")


# --------------------------------------------------------------------------- training


@dataclass
class TrainConf:
    max_epoch: int = opt(10, "epochs to train", range="[1, 1000000]")
    log_interval: int = opt(10, "steps between log lines", unit="steps", range="[1, 1000000000]")
    resume: bool = opt(True, "continue from output_dir/model.pt with the exact data position")
    validate_interval: int = opt(0, "steps between validations (0: at each epoch end; -1: with each mid-epoch "
                                    "checkpoint, as FunASR)", unit="steps", range="[-1, 1000000000]")
    save_checkpoint_interval: int = opt(0, "steps between mid-epoch checkpoints (0: epoch ends only)",
                                        unit="steps", range="[0, 1000000000]")
    keep_nbest_models: int = opt(5, "keep this many epoch checkpoints, best by the cv metric", range="[0, 100000]")
    avg_nbest_model: int = opt(5, "average this many best epoch checkpoints into model.pt.avg{N}", range="[0, 100000]")
    avg_keep_nbest_models_type: str = opt("loss", "cv metric that ranks checkpoints", choices=("loss", "acc"))
    accum_grad: int = opt(1, "micro-batches per optimizer step", range="[1, 10000]")
    grad_clip: float = opt(5.0, "max gradient norm (<= 0: off)")
    use_fp16: bool = opt(False, "float16 autocast with a grad scaler (GPU)")
    use_bf16: bool = opt(False, "bfloat16 autocast (CPU or GPU)")
    max_steps_per_epoch: int = opt(0, "step mode: an epoch ends after this many steps (0: one pass)",
                                   unit="steps", range="[0, 1000000000000]")
    seed: int = opt(1234, "seed of model init and dropout")
    device: str = opt("auto", "auto: cuda when available, else cpu", choices=("auto", "cpu", "cuda"))
    timeout_s: int = opt(600, "collective timeout", unit="seconds", range="[1, 604800]")
    dump_trained_keys: bool = opt(False, "debug: write output_dir/trained_keys.rank{R}.txt ('epoch key' per trained "
                                         "utterance, cut back to the checkpoint on resume) and unused_keys.rank{R}.txt")
    debug_fail_at_step: int = opt(0, "debug: rank 0 raises at this global step on the first torchrun attempt "
                                     "(tests --max-restarts); 0: off", unit="steps")


@dataclass
class OptimConf:
    optim: str = opt("adamw", "optimizer", choices=("adam", "adamw", "sgd"))
    lr: float = opt(0.001, "peak learning rate", range="(0, 10]")
    weight_decay: float = opt(1e-6, "weight decay", range="[0, 10]")


@dataclass
class SchedulerConf:
    scheduler: str = opt("warmuplr", "warmuplr: linear warmup then inverse sqrt; constant",
                         choices=("warmuplr", "constant"))
    warmup_steps: int = opt(500, "warmup length", unit="steps", range="[0, 1000000000]")


# --------------------------------------------------------------------------- subcommands


@dataclass
class Scp2JsonlConfig:
    scp_file_list: List[str] = opt(help="Kaldi tables, first one drives the order, e.g. [wav.scp, text]",
                                   factory=list)
    data_type_list: List[str] = opt(help="a field name per table", factory=lambda: ["source", "target"])
    jsonl_file_out: str = opt("???", "output JSONL (written to a temp name, then renamed)")
    segments: Optional[str] = opt(None, "Kaldi segments file: utterances are cut from wav.scp recordings")
    num_workers: int = opt(0, "header-probe processes (0: all cores)", range="[0, 1024]")
    on_error: str = opt("fail", "a key missing from a table, or unreadable audio: fail, or skip and count",
                        choices=FAILURE_CHOICES)
    on_empty_text: str = opt("fail", "an utterance whose transcript (or other text field) is empty: fail, or "
                                     "drop and count it", choices=FAILURE_CHOICES)
    on_duplicate: str = opt("fail", "a key repeated in a table: fail, or keep its first line and drop and count "
                                    "the others", choices=FAILURE_CHOICES)
    allow_pipe: bool = opt(False, "allow Kaldi pipe entries like 'sox a.flac -t wav - |' (run without a shell)")
    storage_options: Dict[str, Any] = opt(help="fsspec options for http(s)/s3 sources", factory=dict)


@dataclass
class Jsonl2ScpConfig:
    jsonl_file_in: str = opt("???", "input JSONL")
    scp_file_list: List[str] = opt(help="output tables, one per field", factory=list)
    data_type_list: List[str] = opt(help="the field written to each table",
                                    factory=lambda: ["source", "target"])
    separator: str = opt("space", "between key and value: Kaldi's space or FunASR's tab", choices=("space", "tab"))


@dataclass
class PrepareConfig:
    corpus: str = opt("???", "the on-disk layout under root", choices=("aishell", "librispeech"))
    root: str = opt("???", "aishell: the dir holding data_aishell/ (wav/{train,dev,test}/<spk>/*.wav, transcript/); "
                           "librispeech: the dir holding <subset>/<reader>/<chapter>/*.flac")
    output_dir: str = opt("data", "one Kaldi dir per split: <output_dir>/<split>/{wav.scp,text,utt2spk,spk2utt}")
    splits: List[str] = opt(help="splits to prepare (empty: all found), e.g. [train,dev,test] or "
                                 "[train-clean-100,dev-clean,test-clean]", factory=list)
    remove_spaces: bool = opt(True, "aishell: drop the transcript's word spaces (WeNet/ESPnet); false keeps them")


@dataclass
class PackShardsConfig:
    input: str = opt("???", "train.jsonl (FunASR), a WeNet raw data.list, or a Kaldi data dir")
    output_dir: str = opt("???", "where shards, data.list and index.jsonl go")
    num_utts_per_shard: int = opt(1000, "utterances per shard", range="[1, 10000000]")
    num_workers: int = opt(0, "packing processes (0: all cores)", range="[0, 1024]")
    shuffle: bool = opt(False, "shuffle utterances before sharding (seeded)")
    seed: int = opt(777, "shuffle seed")
    audio_format: str = opt("keep", "keep original bytes, or re-encode", choices=("keep", "wav", "flac"))
    resample: Optional[int] = opt(None, "re-encode at this rate (null: keep the rate)", unit="Hz",
                                  range="[1000, 384000]")
    filter_group: List[str] = opt(help="length buckets 'lo:hi' in frames, each packed into its own sub-directory",
                                  factory=list)
    shard_prefix: str = opt("shard", "shard file name prefix: <prefix>-000000.tar")
    compression: str = opt("none", "none: plain tar; gzip: WeNet-style <prefix>-000000.tar.gz (smaller only for "
                                   "uncompressed audio; slower to pack and read, and readers cannot seek past audio)",
                           choices=("none", "gzip"))
    feats: bool = opt(False, "features mode: pack a Kaldi dir's feats.scp (kaldiio) as <key>.npy, no audio")
    on_error: str = opt("fail", "unreadable audio or a missing transcript: fail, or skip and count",
                        choices=FAILURE_CHOICES)
    allow_pipe: bool = opt(False, "allow Kaldi pipe entries in wav.scp (run without a shell)")
    storage_options: Dict[str, Any] = opt(help="fsspec options for remote sources", factory=dict)


@dataclass
class MakeDatalistConfig:
    data_type: str = opt("shard", "raw: utterance list from a JSONL; shard: list of shard URLs",
                         choices=("raw", "shard"))
    input: Any = opt(help="raw: a JSONL; shard: dirs, globs, brace patterns or list files (one, or a list)",
                     factory=list)
    output: str = opt("???", "the data.list to write")
    prefix: Optional[str] = opt(None, "rewrite each shard's directory to this prefix, e.g. s3://bucket/corpus/")


@dataclass
class VerifyShardsConfig:
    input: str = opt("???", "a shard data.list (its index.jsonl sidecar is used when present)")
    num_workers: int = opt(0, "checking processes (0: all cores)", range="[0, 1024]")
    decode_audio: bool = opt(True, "decode every audio member")
    storage_options: Dict[str, Any] = opt(help="fsspec options for remote shards", factory=dict)


@dataclass
class MakeTokenizerConfig:
    input: str = opt("???", "a Kaldi text file or a JSONL with target/txt")
    output: str = opt("???", "token list to write (bpe also writes <output stem>.model)")
    tokenizer: TokenizerConf = opt(factory=TokenizerConf)
    vocab_size: int = opt(500, "bpe vocabulary size", range="[1, 10000000]")
    min_count: int = opt(1, "char/word: drop tokens seen fewer times")


@dataclass
class BenchLoaderConfig:
    data_list: str = opt("", "the data.list to read (required unless dataset_conf.sources is set)")
    dataset_conf: DatasetConf = opt(factory=DatasetConf)
    tokenizer: TokenizerConf = opt(factory=TokenizerConf)
    epochs: int = opt(1, "epochs to iterate", range="[1, 1000000]")
    max_batches: int = opt(0, "stop each epoch after this many batches (0: all)", range="[0, 1000000000000]")
    dump_keys: Optional[str] = opt(None, "write DIR/keys.rank{R}.epoch{E}.txt in consumption order")
    save_state_after: int = opt(0, "save the loader state after this many batches and exit", unit="batches",
                                range="[0, 1000000000000]")
    state_file: Optional[str] = opt(None, "where to save, or resume from, the loader state")
    train: bool = opt(True, "train mode (shuffle, augment) or cv mode")


@dataclass
class TrainConfig:
    train_data_set_list: str = opt("", "training data.list (required unless dataset_conf.sources is set)")
    valid_data_set_list: Optional[str] = opt(None, "cv data.list (split across ranks)")
    output_dir: str = opt("???", "checkpoints, logs and tensorboard/")
    cmvn_file: Optional[str] = opt(None, "global CMVN stats: compute-cmvn JSON, WeNet JSON, Kaldi cmvn.ark or "
                                         "FunASR am.mvn")
    dataset_conf: DatasetConf = opt(factory=DatasetConf)
    tokenizer: TokenizerConf = opt(factory=TokenizerConf)
    model: Dict[str, Any] = opt(help="the model, built with Hydra _target_", factory=dict, group="model")
    train_conf: TrainConf = opt(factory=TrainConf)
    optim_conf: OptimConf = opt(factory=OptimConf)
    scheduler_conf: SchedulerConf = opt(factory=SchedulerConf)


@dataclass
class DecodeConfig:
    data_list: str = opt("???", "data.list to decode")
    checkpoint: str = opt("???", "model.pt, model.pt.ep{E} or model.pt.avg{N}")
    output_dir: str = opt("???", "writes text (hypotheses) and cer.txt / wer.txt")
    # bigger batches (no backward pass) and no filter that would leave an utterance undecoded
    dataset_conf: DatasetConf = opt(factory=lambda: DatasetConf(
        batch_size=32, filter_conf=FilterConf(token_min_length=0, min_output_input_ratio=0.0,
                                              max_output_input_ratio=1000.0)))
    device: str = opt("auto", "auto, cpu or cuda", choices=("auto", "cpu", "cuda"))


@dataclass
class ComputeCmvnConfig:
    data_list: str = opt("???", "training data.list")
    output: str = opt("???", "CMVN stats file to write")
    output_format: str = opt("json", "json (WeNet-style sums, mean, istd) or kaldi (compute-cmvn-stats' binary "
                                      "2 x (dim+1) matrix, a cmvn.ark)", choices=("json", "kaldi"))
    dataset_conf: DatasetConf = opt(factory=lambda: DatasetConf(batch_size=32))
    max_utts: int = opt(0, "use at most this many utterances (0: all)", range="[0, 1000000000000]")


@dataclass
class AverageConfig:
    output_dir: str = opt("???", "the training output_dir")
    num: int = opt(5, "checkpoints to average", range="[1, 100000]")
    metric: str = opt("loss", "rank epoch checkpoints by this cv metric", choices=("loss", "acc"))


@dataclass
class AddFieldConfig:
    input: str = opt("???", "a shard data.list")
    field: str = opt("???", "the field name, e.g. fbank or speaker")
    from_scp: Optional[str] = opt(None, "import a Kaldi feats.scp (kaldiio)")
    from_jsonl: Optional[str] = opt(None, "import values by key from a JSONL")
    dataset_conf: DatasetConf = opt(factory=DatasetConf)
    num_workers: int = opt(0, "processes (0: all cores)", range="[0, 1024]")


@dataclass
class StatsConfig:
    input: str = opt("???", "a shard or raw data.list")
    output: Optional[str] = opt(None, "PNG histogram path (default: next to the list)")
    data_type: str = opt("shard", "format of the list", choices=("raw", "shard"))
    bins: int = opt(30, "histogram bins", range="[1, 100000]")


# --------------------------------------------------------------------------- FunASR keys


@dataclass(frozen=True)
class FunasrKey:
    """How a key of FunASR's training scripts/configs is taken here (see README, "FunASR keys").

    ``ours``: our key in the same group that receives the value (None: the key has no effect here and is
    dropped with one warning line). ``note``: said in that warning, or, for a mapped key whose meaning
    differs slightly, in a warning of its own. ``honoured``: the values we can honour (a predicate on the
    value); any other value would change results, so it is an error that says so.
    """

    ours: Optional[str] = None
    note: str = ""
    honoured: Any = None


def _off(value: Any) -> bool:
    return value in (None, False, "", "null", "None", "none", "false", "False", 0, [], {})


FUNASR_KEYS: Dict[str, FunasrKey] = {
    "dataset_conf.batch_size_sample_max": FunasrKey("max_batch_size"),
    "dataset_conf.sort_size": FunasrKey("sort_conf.sort_size"),
    "dataset_conf.prefetch_factor": FunasrKey("prefetch"),
    "dataset_conf.retry": FunasrKey("retries"),
    "dataset_conf.max_source_length": FunasrKey("filter_conf.max_length"),
    "dataset_conf.min_source_length": FunasrKey("filter_conf.min_length"),
    "dataset_conf.max_target_length": FunasrKey("filter_conf.token_max_length"),
    "dataset_conf.min_target_length": FunasrKey("filter_conf.token_min_length"),
    "dataset_conf.max_token_length": FunasrKey(
        "filter_conf.max_length", "FunASR drops an utterance when source_len + target_len exceeds it; here it "
        "caps the frames (source_len) and filter_conf.token_max_length caps the tokens"),
    "dataset_conf.index_ds": FunasrKey(note="the list is read by data_type (raw JSONL or shards), offset-indexed"),
    "dataset_conf.batch_sampler": FunasrKey(note="batches are formed by batch_type/batch_size (and bucketing)"),
    "dataset_conf.data_split_num": FunasrKey(note="the list is streamed, never loaded whole, so it needs no split"),
    "dataset_conf.data_split_i": FunasrKey(note="the list is streamed, never loaded whole, so it needs no split"),
    "dataset_conf.buffer_size": FunasrKey(note="FunASR never reads it either; see shuffle_conf.shuffle_size"),
    "dataset_conf.batch_size_scale_ratio_max": FunasrKey(note="batch sizes follow batch_type/batch_size"),
    "dataset_conf.rank_split": FunasrKey(note="every rank and worker reads its exact share of every epoch"),
    "dataset_conf.persistent_workers": FunasrKey(note="workers are kept for the whole run"),
    "dataset_conf.preprocessor_speech": FunasrKey(  # SpeechPreprocessSpeedPerturb: _funasr_speed_perturb
        note="no other FunASR preprocessor runs here; for speed perturbation set dataset_conf.speed_perturb=true",
        honoured=_off),
    "dataset_conf.preprocessor_text": FunasrKey(note="no FunASR preprocessor runs here", honoured=_off),
    "dataset_conf.preprocessor_speech_conf": FunasrKey(note="no FunASR preprocessor runs here"),
    "dataset_conf.preprocessor_text_conf": FunasrKey(note="no FunASR preprocessor runs here"),
    "dataset_conf.dataloader": FunasrKey(note="the loader streams the list (an IterableDataset)"),
    "dataset_conf.min_token_length": FunasrKey(note="FunASR's samplers do not apply it either; see "
                                               "filter_conf.min_length and token_min_length"),
    "train_conf.best_model_criterion": FunasrKey(note="epoch checkpoints are ranked by "
                                                 "train_conf.avg_keep_nbest_models_type (acc or loss)"),
    "train_conf.val_scheduler_criterion": FunasrKey(note="no plateau scheduler here; see scheduler_conf"),
    "train_conf.use_deepspeed": FunasrKey(note="training uses torch DDP (torchrun); DeepSpeed is not supported",
                                          honoured=_off),
    "train_conf.deepspeed_config": FunasrKey(note="training uses torch DDP (torchrun), not DeepSpeed"),
    "train_conf.grad_clip_type": FunasrKey(note="gradients are clipped by their L2 norm (FunASR's default 2)",
                                           honoured=lambda v: str(v) in ("2", "2.0")),
    "train_conf.effective_save_name_excludes": FunasrKey(note="checkpoints hold the whole model"),
    "train_conf.avg_checkpoint_interval": FunasrKey(note="averaging uses epoch checkpoints (avg_nbest_model)"),
    "train_conf.reset_gpu_cache": FunasrKey(note="the CUDA cache is left to torch"),
    "train_conf.find_unused_parameters": FunasrKey(note="DDP is set up for the model by corpus-io"),
    "train_conf.use_ddp": FunasrKey(note="DDP is used whenever torchrun starts more than one process"),
    "train_conf.use_fsdp": FunasrKey(note="training uses torch DDP; FSDP is not supported", honoured=_off),
    "train_conf.use_wandb": FunasrKey(note="logs go to output_dir/tensorboard", honoured=_off),
    "train_conf.freeze_param": FunasrKey(note="every parameter is trained", honoured=_off),
}


def _warn(message: str) -> None:
    if os.environ.get("RANK", "0") == "0":  # once per run under torchrun, not once per rank
        print(f"warning: {message}", file=sys.stderr, flush=True)


FUNASR_SPEED_PERTURB = "SpeechPreprocessSpeedPerturb"


def _funasr_speed_perturb(section: dict) -> None:
    """FunASR's recipes perturb speed through a preprocessor; that one is honoured by our own stage."""
    if section.get("preprocessor_speech") != FUNASR_SPEED_PERTURB:
        return
    section.pop("preprocessor_speech")
    speeds = (section.pop("preprocessor_speech_conf", None) or {}).get("speed_perturb")
    section["speed_perturb"] = True
    if speeds:
        section.setdefault("speed_perturb_conf", {})["speeds"] = list(speeds)
    _warn(f"FunASR key 'dataset_conf.preprocessor_speech={FUNASR_SPEED_PERTURB}' is read as "
          f"dataset_conf.speed_perturb=true" + (f" with speeds {list(speeds)}." if speeds else "."))


def _apply_funasr_keys(schema: type, raw: dict) -> None:
    """Rename, drop (with one warning line each) or refuse FunASR's keys in ``raw``, in place."""
    groups = _schema_fields(schema)
    if "dataset_conf" in groups and isinstance(raw.get("dataset_conf"), dict):
        _funasr_speed_perturb(raw["dataset_conf"])
    for path, rule in FUNASR_KEYS.items():
        group, key = path.split(".", 1)
        section = raw.get(group)
        if group not in groups or not isinstance(section, dict) or key not in section:
            continue
        value = section.pop(key)
        if rule.honoured is not None and not rule.honoured(value):
            raise ConfigError(f"FunASR key '{path}={value}' would change the results and cannot be honoured here: "
                              f"{rule.note}. Remove it (or set it to FunASR's default) to train with corpus-io.")
        if rule.ours is None:
            _warn(f"FunASR key '{path}' has no effect in corpus-io ({rule.note}); ignored.")
            continue
        target = section
        *parents, leaf = rule.ours.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
        if rule.note:
            _warn(f"FunASR key '{path}' is read as '{group}.{rule.ours}': {rule.note}.")


# --------------------------------------------------------------------------- old spellings

#: keys renamed to the one failure word, per command schema: old key -> new key (same group)
RENAMED_KEYS: Dict[str, Dict[str, str]] = {"Scp2JsonlConfig": {"on_missing": "on_error"}}
#: the old value of "fail" (pack-shards' on_error and scp2jsonl's on_* keys said "error")
OLD_FAIL = "error"


def _apply_old_spellings(schema: type, raw: dict, prefix: str) -> None:
    """Read the old failure spellings as the new ones, in place, with one warning line each."""
    fields = _schema_fields(schema)
    for old, new in RENAMED_KEYS.get(schema.__name__, {}).items():
        if old in raw:
            value = raw.pop(old)
            value = "fail" if value == OLD_FAIL else value
            _warn(f"'{prefix}{old}' is deprecated; it is read as '{prefix}{new}={value}' (fail | skip).")
            raw.setdefault(new, value)
    for name, f in fields.items():
        value = raw.get(name)
        if f.metadata.get("choices") == FAILURE_CHOICES and value == OLD_FAIL:
            _warn(f"'{prefix}{name}={OLD_FAIL}' is deprecated; it is read as '{prefix}{name}=fail'.")
            raw[name] = "fail"
        nested = _nested_schema(f, schema)
        if nested is not None and isinstance(value, dict):
            _apply_old_spellings(nested, value, f"{prefix}{name}.")


# --------------------------------------------------------------------------- composition


def compose(schema: type, config_name: str, overrides: list[str], *, config_path: str | None = None) -> Any:
    """Compose ``conf/<config_name>.yaml`` (or the user's YAML) with overrides; return a checked ``schema``.

    Returns the dataclass instance; ``resolved_yaml(cfg)`` gives the YAML to store with outputs.
    """
    raw = _hydra_compose(config_name, overrides, config_path=config_path)
    return validate(schema, raw)


def validate(schema: type, raw: Any) -> Any:
    """Check a DictConfig/dict against ``schema``; return the dataclass instance."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(raw, dict):
        raw = OmegaConf.to_container(raw, resolve=True)
    raw.pop("hydra", None)
    raw.pop("defaults", None)
    _apply_funasr_keys(schema, raw)
    _apply_old_spellings(schema, raw, prefix="")
    _check_keys(schema, raw, prefix="")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), raw)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"config key '{missing[0]}' is required but not set. Set it with "
                              f"++{missing[0]}=<value> (required keys: {', '.join(missing)}).")
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        msg = str(exc).splitlines()[0]
        if "ListConfig" in msg:  # OmegaConf's words for "a list was expected"
            msg, example = "it takes a list, not a single value", f"++{key}='[a,b]'"
        else:
            example = f"++{key}=<value>"
        raise ConfigError(f"config key '{key}': {msg}. Fix the value in your YAML or override, "
                          f"e.g. {example}.") from None
    check_values(obj)
    return obj


def to_yaml(obj: Any) -> str:
    """The resolved config as YAML (stored next to outputs and in checkpoints)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(obj))


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


def _hydra_compose(config_name: str, overrides: list[str], *, config_path: str | None) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    conf_dir = Path(config_path).resolve() if config_path else CONF_DIR
    name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    if not (conf_dir / f"{name}.yaml").is_file():
        raise ConfigError(f"config file {conf_dir / (name + '.yaml')} does not exist. "
                          f"Pass --config-path DIR --config-name NAME.yaml with an existing file.")
    hydra_overrides = list(overrides)
    if conf_dir != CONF_DIR.resolve():  # a user's YAML may use the shipped groups (dataset_conf: shard, ...)
        hydra_overrides.append(f"hydra.searchpath=[file://{CONF_DIR.resolve()}]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base=None, job_name=name):
            cfg = hydra_compose(config_name=name, overrides=hydra_overrides)
    except HydraException as exc:
        raise ConfigError(_explain_hydra_error(str(exc), overrides)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"a YAML file under {conf_dir} (config {name}.yaml or a group it uses) is not UTF-8 "
                          f"(byte {exc.start}). Save it as UTF-8.") from None
    except Exception as exc:  # yaml.YAMLError: a syntax error or a key given twice
        import yaml

        if not isinstance(exc, yaml.YAMLError):
            raise
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{conf_dir / (name + '.yaml')} (or a config group it uses) is not valid YAML{where}: "
                          f"{problem}. Fix the file.") from None
    finally:
        GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg, resolve=False)


def _explain_hydra_error(message: str, overrides: list[str]) -> str:
    first = message.strip().splitlines()[0] if message.strip() else "invalid override"
    return (f"could not apply the overrides {overrides}: {first}. Use key=value for existing keys, "
            f"++key=value to set or add, and quote lists: ++key='[a,b]'.")


def _schema_fields(schema: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(schema)}


def _nested_schema(f: dataclasses.Field, owner: type) -> type | None:
    hint = typing.get_type_hints(owner).get(f.name)
    if dataclasses.is_dataclass(hint):
        return hint
    return None


def _list_item_schema(f: dataclasses.Field, owner: type) -> type | None:
    hint = typing.get_type_hints(owner).get(f.name)
    if typing.get_origin(hint) in (list, List):
        (item,) = typing.get_args(hint) or (None,)
        if dataclasses.is_dataclass(item):
            return item
    return None


def all_keys(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key of a schema (for suggestions and ``--help``)."""
    keys = []
    for f in dataclasses.fields(schema):
        path = f"{prefix}{f.name}"
        keys.append(path)
        nested = _nested_schema(f, schema)
        if nested:
            keys.extend(all_keys(nested, prefix=path + "."))
    return keys


def _check_keys(schema: type, raw: dict, prefix: str) -> None:
    fields = _schema_fields(schema)
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(_unknown_key_message(path, schema, prefix))
        f = fields[key]
        nested = _nested_schema(f, schema)
        if nested and not isinstance(value, dict):
            first = dataclasses.fields(nested)[0].name
            raise ConfigError(f"config key '{path}' is a group of keys, not the single value {value!r}. Set its "
                              f"keys instead, e.g. ++{path}.{first}=<value> (--help lists them).")
        if nested:
            _check_keys(nested, value, prefix=path + ".")
        item_schema = _list_item_schema(f, schema)
        if item_schema and isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    _check_keys(item_schema, item, prefix=f"{path}[{i}].")


#: How similar (difflib ratio) a key must be to a valid one to be suggested: typos, not look-alikes.
SUGGEST_CUTOFF = 0.8


def _unknown_key_message(path: str, schema: type, prefix: str) -> str:
    leaf = path[len(prefix):]
    siblings = [f.name for f in dataclasses.fields(schema)]
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=SUGGEST_CUTOFF)
    if close:
        suggestion = prefix + close[0]
    else:  # a key that slipped one level up or down: match the leaf names of the whole group
        by_leaf = {c.rsplit(".", 1)[-1]: c for c in all_keys(schema, prefix=prefix)}
        near = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=SUGGEST_CUTOFF)
        suggestion = by_leaf[near[0]] if near else None
    hint = f" The closest valid key is '{suggestion}'." if suggestion else ""
    return f"unknown config key '{path}'.{hint} Run the subcommand with --help to list every key."


def check_values(obj: Any, prefix: str = "") -> None:
    """Every field of a config instance (nested ones too) within its ``choices`` and ``range``, else one
    ConfigError naming the key. :func:`validate` runs it on composed configs; entry points that also take
    configs built in Python (``build_dataloader``, ``pack_shards``, ``bench_loader``) run it too."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        choices = f.metadata.get("choices") if f.metadata else None
        if choices and value not in choices:
            raise ConfigError(f"config key '{path}' is '{value}', but it must be one of "
                              f"{', '.join(map(str, choices))}. Example: ++{path}={choices[0]}")
        bounds = f.metadata.get("range") if f.metadata else None
        if bounds and value is not None and not in_range(value, bounds):
            unit = f" {f.metadata['unit']}" if f.metadata.get("unit") else ""
            example = "null" if f.default is None else f.default
            raise ConfigError(f"{path}={value}{unit} is outside its range {bounds} "
                              f"({f.metadata.get('help')}). Give a value in range, e.g. ++{path}={example}.")
        if dataclasses.is_dataclass(value):
            check_values(value, path + ".")
        if isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    check_values(item, f"{path}[{i}].")


def require(obj: Any, *keys: str) -> None:
    """Raise a ConfigError for any of ``keys`` still at its '???' placeholder."""
    for key in keys:
        value = obj
        for part in key.split("."):
            value = getattr(value, part)
        if value in ("???", "") or value == [] or value is None:
            raise ConfigError(f"config key '{key}' is required. Set it with ++{key}=...")


def describe(schema: type, prefix: str = "", defaults: Any = None) -> list[tuple[str, str, str]]:
    """``(key, default, help [unit] {choices})`` rows for ``--help``: the values a run without overrides
    uses (the default instance, so per-command defaults such as decode's batch size show); imports nothing
    heavy."""
    defaults = schema() if defaults is None else defaults
    rows = []
    for f in dataclasses.fields(schema):
        path = f"{prefix}{f.name}"
        default = getattr(defaults, f.name)
        nested = _nested_schema(f, schema)
        if nested:
            rows.extend(describe(nested, prefix=path + ".", defaults=default))
            continue
        meta = f.metadata or {}
        text = meta.get("help", "")
        if meta.get("unit"):
            text += f" [{meta['unit']}]"
        if meta.get("choices"):
            text += " {" + "|".join(map(str, meta["choices"])) + "}"
        if meta.get("range"):
            text += f" range {meta['range']}"
        if meta.get("group"):
            presets = group_presets(meta["group"])
            default = f"preset {presets[0]}" if presets else default
            text += f"; presets in conf/{meta['group']}/: {', '.join(sorted(presets))} " \
                    f"(choose with {meta['group']}=NAME, change keys with ++{meta['group']}.KEY=VALUE)"
        rows.append((path, "null" if default is None else str(default), text))
    return rows


def group_presets(group: str, config_name: str = "train") -> list[str]:
    """The YAML presets of a config group, the one ``conf/<config_name>.yaml`` chooses first."""
    names = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    # the command YAML's defaults list holds "- <group>: <name>"; read that one line, not the whole YAML
    chosen = re.search(rf"^\s*-\s*{re.escape(group)}\s*:\s*(\S+)", (CONF_DIR / f"{config_name}.yaml").read_text(),
                       re.M)
    if chosen and chosen.group(1) in names:
        names.remove(chosen.group(1))
        names.insert(0, chosen.group(1))
    return names
