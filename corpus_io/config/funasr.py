"""FunASR's keys (mapped, accepted with one warning, or refused) and our own old spellings, applied to a
raw config before its keys are checked."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional

from corpus_io.config.fields import FAILURE_CHOICES, nested_schema, schema_fields
from corpus_io.errors import ConfigError


@dataclass(frozen=True)
class FunasrKey:
    """How a key of FunASR's training scripts/configs is taken here (see docs/TRAINING.md, "FunASR keys").

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
    "dataset_conf.persistent_workers": FunasrKey(note="each epoch starts its workers from a forkserver, cheaply "
                                                      "(dataset_conf.worker_start_method)"),
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

#: FunASR's top-level keys of ``train.py``/``train_ds.py`` (as its finetune.sh scripts pass them), read by
#: ``train`` only. ``dataset`` and ``model`` are handled by :func:`_funasr_dataset` and
#: :func:`funasr_group_overrides`; a group (``frontend_conf``) maps key by key through ``FUNASR_GROUP_KEYS``.
FUNASR_TOP_KEYS: Dict[str, FunasrKey] = {
    "model_revision": FunasrKey(note="no model hub is read; the model is built from the model group"),
    "trust_remote_code": FunasrKey(note="no remote code is run"),
    "debug": FunasrKey(note="see train_conf.log_interval"),
    "freeze_param": FunasrKey(note="every parameter is trained", honoured=_off),
    "tokenizer": FunasrKey(note="the tokenizer is the tokenizer group (char, bpe or word)"),  # a class name only
    "tokenizer_conf": FunasrKey(note="the tokenizer is set by tokenizer.* (token_list: '<token> <id>' lines, "
                                     "make-tokenizer writes one)"),
    "frontend": FunasrKey(note="features are Kaldi fbank/mfcc set by dataset_conf.feats_type"),
    "frontend_conf": FunasrKey(note="features are set by dataset_conf.fbank_conf / mfcc_conf"),
    "specaug": FunasrKey(note="SpecAugment is dataset_conf.spec_aug (+ spec_aug_conf)"),
    "specaug_conf": FunasrKey(note="SpecAugment is dataset_conf.spec_aug (+ spec_aug_conf)"),
    "encoder": FunasrKey(note="the model is the model group (model=conformer_tiny | conformer_small)"),
    "encoder_conf": FunasrKey(note="the model's sizes are model.* keys"),
    "decoder": FunasrKey(note="the model is the model group (CTC, no decoder)"),
    "decoder_conf": FunasrKey(note="the model is the model group (CTC, no decoder)"),
    "model_conf": FunasrKey(note="the model's settings are model.* keys"),
    "optim": FunasrKey("optim_conf.optim", note="FunASR's optimizer name is read as optim_conf.optim"),
    "scheduler": FunasrKey("scheduler_conf.scheduler",
                           note="FunASR's scheduler name is read as scheduler_conf.scheduler"),
}
#: keys inside a FunASR top-level group that map to ours: ``group.key`` -> our dotted key
FUNASR_GROUP_KEYS: Dict[str, str] = {"frontend_conf.cmvn_file": "cmvn_file"}
#: FunASR's dataset classes: each reads a JSONL list, which is our raw list
FUNASR_DATASETS = ("AudioDataset", "AudioDatasetHotword", "AudioLLMDataset", "AudioLLMARDataset",
                   "AudioLLMQwenAudioDataset", "AudioLLMVicunaDataset", "SenseVoiceDataset", "SenseVoiceCTCDataset")


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


def _refuse_unless_honoured(path: str, value: Any, rule: FunasrKey) -> None:
    if rule.honoured is not None and not rule.honoured(value):
        raise ConfigError(f"FunASR key '{path}={value}' would change the results and cannot be honoured here: "
                          f"{rule.note}. Remove it (or set it to FunASR's default) to train with corpus-io.")


def _funasr_dataset(raw: dict) -> None:
    """``dataset=AudioDataset`` (FunASR's JSONL dataset) is read as ``dataset_conf.data_type=raw``."""
    if "dataset" not in raw:
        return
    value = raw.pop("dataset")
    if isinstance(value, dict) and value.get("read_as_raw"):  # set by funasr_group_overrides: already applied
        return
    if str(value) not in FUNASR_DATASETS:
        raise ConfigError(f"FunASR key 'dataset={value}' names a dataset class corpus-io does not know. FunASR's "
                          f"JSONL datasets ({', '.join(FUNASR_DATASETS[:2])}, ...) are read as "
                          f"++dataset_conf.data_type=raw, shards as data_type=shard; remove the dataset override.")
    section = raw.setdefault("dataset_conf", {})
    if isinstance(section, dict) and "data_type" not in section:
        section["data_type"] = "raw"
        _warn(f"FunASR key 'dataset={value}' is read as dataset_conf.data_type=raw (the JSONL list, streamed).")
    else:
        _warn(f"FunASR key 'dataset={value}' has no effect in corpus-io (dataset_conf.data_type is set); ignored.")


def _funasr_top_keys(raw: dict, ours: dict) -> None:
    for key, rule in FUNASR_TOP_KEYS.items():
        if key not in raw or (key in ours and isinstance(raw[key], dict)):  # our own tokenizer group
            continue
        value = raw.pop(key)
        _refuse_unless_honoured(key, value, rule)
        for inner, target in FUNASR_GROUP_KEYS.items():
            group, _, leaf = inner.partition(".")
            if group == key and isinstance(value, dict) and leaf in value:
                _set_dotted(raw, target, value.pop(leaf))
                _warn(f"FunASR key '{inner}' is read as '{target}'.")
        if rule.ours is not None:
            _set_dotted(raw, rule.ours, value)
            _warn(f"FunASR key '{key}' is read as '{rule.ours}'.")
        elif value not in ({}, None):
            names = [f"{key}.{k}" for k in value] if isinstance(value, dict) else [key]
            _warn(f"FunASR key{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)} "
                  f"{'have' if len(names) > 1 else 'has'} no effect in corpus-io ({rule.note}); ignored.")


def _set_dotted(raw: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        raw = raw.setdefault(part, {})
    raw[leaf] = value


def funasr_group_overrides(overrides: list[str], groups: dict[str, list[str]]) -> list[str]:
    """FunASR's ``++model=<hub name or dir>`` (and ``+model=``) before Hydra, which refuses a string for a config
    group: a preset name of ours is selected (``model=conformer_small``), anything else (a FunASR model) is
    dropped with one warning, which also says the lists are read as FunASR's JSONL (``dataset_conf.data_type=raw``)
    unless the line names a dataset class or a data_type itself. ``groups``: each config group's preset names."""
    kept = []
    user_type = any(o.lstrip("+").startswith(("dataset_conf.data_type=", "dataset_conf=")) for o in overrides)
    # FunASR's train_ds.py indexes its data lists as JSONL (IndexDSJsonl) whatever the dataset class, which a
    # line may name (++dataset=AudioDataset, paraformer) or leave to the model's config (SenseVoice's finetune.sh):
    # a FunASR model on the command line reads its lists as raw unless a dataset override or the user says
    named_dataset = any(o.lstrip("+").partition("=")[0] == "dataset" for o in overrides)
    for item in overrides:
        key, eq, value = item.lstrip("+").partition("=")
        value = value.strip().strip("\"'")
        if key == "dataset" and eq and value in FUNASR_DATASETS and not user_type:
            kept += ["++dataset_conf.data_type=raw", "+dataset={read_as_raw: true}"]
            _warn(f"FunASR key 'dataset={value}' is read as dataset_conf.data_type=raw (the JSONL list, streamed).")
            continue
        if not eq or key not in groups or not item.startswith("+"):
            kept.append(item)
            continue
        if value in groups[key]:
            kept.append(f"{key}={value}")
            continue
        jsonl = key == "model" and not user_type and not named_dataset
        if jsonl:
            kept.append("++dataset_conf.data_type=raw")
            user_type = True  # once
        _warn(f"FunASR key '{key}={value}' names a model corpus-io does not build; training uses the {key} group "
              f"({', '.join(groups[key])}; select one with {key}=NAME)"
              + (", and reads the data lists as FunASR's JSONL (dataset_conf.data_type=raw)." if jsonl else "."))
    return kept


def apply_funasr_keys(schema: type, raw: dict) -> None:
    """Rename, drop (with one warning line each) or refuse FunASR's keys in ``raw``, in place."""
    groups = schema_fields(schema)
    if "train_conf" in groups and "model" in groups:  # train.py / train_ds.py's top level
        _funasr_dataset(raw)
        _funasr_top_keys(raw, groups)
    if "dataset_conf" in groups and isinstance(raw.get("dataset_conf"), dict):
        _funasr_speed_perturb(raw["dataset_conf"])
    for path, rule in FUNASR_KEYS.items():
        group, key = path.split(".", 1)
        section = raw.get(group)
        if group not in groups or not isinstance(section, dict) or key not in section:
            continue
        value = section.pop(key)
        _refuse_unless_honoured(path, value, rule)
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


def apply_old_spellings(schema: type, raw: dict, prefix: str, explicit: frozenset = frozenset()) -> None:
    """Read the old failure spellings as the new ones, in place, with one warning line each.

    ``explicit``: the keys given on the command line (``on_missing=skip``). An old key there overrides the
    YAML's value of its new key; the new key there overrides an old key of the YAML; old and new given the
    same way with different values is a ConfigError. An old key's value is checked like the new key's."""
    fields = schema_fields(schema)
    for old, new in RENAMED_KEYS.get(schema.__name__, {}).items():
        if old not in raw:
            continue
        value = raw.pop(old)
        value = "fail" if value == OLD_FAIL else value
        choices = fields[new].metadata.get("choices") or ()
        if choices and value not in choices:
            raise ConfigError(f"{prefix}{old}={value} (the old name of {prefix}{new}) must be one of "
                              f"{' | '.join(choices)}, e.g. ++{prefix}{new}=skip.")
        old_given, new_given = f"{prefix}{old}" in explicit, f"{prefix}{new}" in explicit
        if new in raw and raw[new] != value:
            if old_given == new_given:
                raise ConfigError(f"{prefix}{old}={value} and {prefix}{new}={raw[new]} disagree ({prefix}{old} is the "
                                  f"old name of {prefix}{new}); give only ++{prefix}{new}.")
            if new_given:
                _warn(f"'{prefix}{old}' is deprecated; '{prefix}{new}={raw[new]}' given on the command line wins.")
                continue
        _warn(f"'{prefix}{old}' is deprecated; it is read as '{prefix}{new}={value}' (fail | skip).")
        raw[new] = value
    for name, f in fields.items():
        value = raw.get(name)
        if f.metadata.get("choices") == FAILURE_CHOICES and value == OLD_FAIL:
            _warn(f"'{prefix}{name}={OLD_FAIL}' is deprecated; it is read as '{prefix}{name}=fail'.")
            raw[name] = "fail"
        nested = nested_schema(f, schema)
        if nested is not None and isinstance(value, dict):
            apply_old_spellings(nested, value, f"{prefix}{name}.", explicit)


def override_keys(overrides: list[str]) -> frozenset:
    """The keys that command-line overrides set (``a.b=1`` and ``a=1``, each with or without a leading ``+``
    or two: ``a.b``, ``a``)."""
    return frozenset(o.lstrip("+~").split("=", 1)[0].strip() for o in overrides if "=" in o)
