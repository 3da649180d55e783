"""Typed configs for every subcommand, and their Hydra composition.

Where each concern lives (import from here; the modules are the homes):

* :mod:`.fields`: :func:`opt` (a field's help, unit, choices, range and its one default), ranges, schema
  introspection;
* :mod:`.dataset`: ``dataset_conf`` and ``tokenizer`` (the loader's blocks, shared by many commands);
* :mod:`.data`: the data-preparation commands' schemas (no torch);
* :mod:`.training`: train, decode, compute-cmvn, average, export-model, bench-loader;
* :mod:`.alignment`: align and segment (long recordings, known transcripts);
* :mod:`.scoring`: score (wrong labels found with a model);
* :mod:`.funasr`: FunASR's keys and our old spellings, applied before keys are checked;
* :mod:`.checks`: unknown keys (with the closest valid one), required keys, choices and ranges;
* :mod:`.compose`: Hydra composition and :func:`validate`;
* :mod:`.describe`: ``--help`` rows.

A new command's schema goes into the family module it belongs to. Nothing here imports torch or Hydra at
import time, so ``--help`` is fast. Units follow Kaldi/WeNet: lengths in 10 ms frames, durations in seconds,
rates in Hz.
"""

from corpus_io.config.alignment import AlignConfig, SegmentConfig
from corpus_io.config.checks import SUGGEST_CUTOFF, check_keys, check_values, coerce_fields, require, schema
from corpus_io.config.compose import compose, compose_raw, keep_given_model, to_dict, to_yaml, validate
from corpus_io.config.data import (
    AddFieldConfig,
    ExploreConfig,
    ExportConfig,
    Jsonl2ScpConfig,
    MakeDatalistConfig,
    MakeTokenizerConfig,
    MergeJobsConfig,
    PackShardsConfig,
    PrepareConfig,
    Scp2JsonlConfig,
    StatsConfig,
    VerifyShardsConfig,
)
from corpus_io.config.dataset import (
    SAVED_FEATURE_DEFAULTS,
    AddNoiseConf,
    AddReverbConf,
    DatasetConf,
    FbankConf,
    FilterConf,
    MfccConf,
    NoiseSetConf,
    ResampleConf,
    ShuffleConf,
    SortConf,
    SourceConf,
    SpecAugConf,
    SpecSubConf,
    SpecTrimConf,
    SpeedPerturbConf,
    TokenizerConf,
    VolumePerturbConf,
    saved_features,
)
from corpus_io.config.describe import describe, group_presets
from corpus_io.config.fields import CONF_DIR, FAILURE_CHOICES, all_keys, in_range, opt, parse_range
from corpus_io.config.funasr import FUNASR_KEYS, FUNASR_TOP_KEYS, OLD_FAIL, RENAMED_KEYS, FunasrKey, override_keys
from corpus_io.config.scoring import ScoreConfig
from corpus_io.config.training import (
    AverageConfig,
    BenchLoaderConfig,
    ComputeCmvnConfig,
    DecodeConfig,
    DecodingConf,
    ExportModelConfig,
    MakeLmConfig,
    OptimConf,
    SchedulerConf,
    TextRuleConf,
    TrainConf,
    TrainConfig,
    TranscribeConfig,
    TuneLmConfig,
    resolve_intervals,
)

__all__ = [
    "AddFieldConfig", "AlignConfig", "AverageConfig", "BenchLoaderConfig", "CONF_DIR", "ComputeCmvnConfig",
    "DatasetConf",
    "DecodeConfig", "DecodingConf", "ExploreConfig", "ExportConfig", "ExportModelConfig", "FAILURE_CHOICES",
    "FUNASR_KEYS", "FUNASR_TOP_KEYS",
    "FbankConf", "FilterConf", "FunasrKey", "Jsonl2ScpConfig", "MakeDatalistConfig", "MakeLmConfig",
    "MakeTokenizerConfig", "MergeJobsConfig", "MfccConf", "OLD_FAIL", "OptimConf", "PackShardsConfig",
    "PrepareConfig", "RENAMED_KEYS", "SAVED_FEATURE_DEFAULTS", "ResampleConf", "SUGGEST_CUTOFF", "SchedulerConf",
    "ScoreConfig", "Scp2JsonlConfig", "SegmentConfig", "TextRuleConf",
    "ShuffleConf", "SortConf", "SourceConf", "SpecAugConf", "SpecSubConf", "SpecTrimConf", "SpeedPerturbConf",
    "AddNoiseConf", "AddReverbConf", "NoiseSetConf", "VolumePerturbConf",
    "StatsConfig", "TokenizerConf", "TrainConf", "TrainConfig", "TranscribeConfig", "TuneLmConfig",
    "VerifyShardsConfig", "all_keys",
    "check_keys", "check_values", "coerce_fields", "compose", "compose_raw", "describe", "group_presets",
    "in_range", "keep_given_model", "opt", "override_keys", "parse_range", "require", "resolve_intervals",
    "saved_features", "schema", "to_dict", "to_yaml", "validate",
]
