"""Ranges are real: every numeric and list key of every command has a declared range, its minimum and maximum
are accepted and one step outside is a one-line ConfigError naming the key; the loader runs at both ends of
every ``dataset_conf`` range and gives a batch (an end that rightly keeps nothing is listed, with what it drops),
and refuses one step outside with a one-line ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing

import pytest

from corpus_io.commands import COMMANDS
from corpus_io.config import DatasetConf, check_values, parse_range
from corpus_io.config.fields import nested_schema
from corpus_io.errors import CorpusIOError

#: lists of words or paths (no numbers, no range): what a bad one does is checked where it is read
WORD_LISTS = {"splits", "scp_file_list", "data_type_list", "filter_group", "fields", "input", "sources"}


def _numeric_keys() -> list[tuple[str, type, str, dataclasses.Field]]:
    """``(command, its schema, dotted key, field)`` for every int/float/number-list key, each block's key once."""
    seen, found = set(), []

    def walk(command: str, top: type, schema: type, prefix: str) -> None:
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            nested = nested_schema(f, schema)
            if nested:
                walk(command, top, nested, f"{prefix}{f.name}.")
                continue
            hint = hints[f.name]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            base = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint
            item = typing.get_args(base)[0] if typing.get_origin(base) in (list, typing.List) else None
            if base in (int, float) or item in (int, float):
                if (schema, f.name) not in seen:
                    seen.add((schema, f.name))
                    found.append((command, top, prefix + f.name, f))

    for c in COMMANDS:
        walk(c.name, c.schema, c.schema, "")
    return found


NUMERIC = _numeric_keys()


def _ends(f: dataclasses.Field, is_int: bool) -> tuple[list, list]:
    """(values inside: both ends, values outside: one step past each end) of the field's range."""
    lo, lo_in, hi, hi_in = parse_range(f.metadata["range"])
    step = 1 if is_int else 1e-6 * max(1.0, abs(lo), abs(hi) if math.isfinite(hi) else 1.0)
    inside, outside = [], []
    if math.isfinite(lo):
        inside.append(lo if lo_in else lo + step)
        outside.append(lo - step if lo_in else lo)
    else:
        outside.append(float("nan"))
    if math.isfinite(hi):
        inside.append(hi if hi_in else hi - step)
        outside.append(hi + step if hi_in else hi)
    else:
        inside.append(10 ** 9)
        outside.append(float("inf"))
    cast = int if is_int else float
    return [cast(v) for v in inside], [v if not math.isfinite(v) else cast(v) for v in outside]


def test_every_numeric_and_number_list_key_declares_a_range():
    missing = [f"{cmd}: {key}" for cmd, _, key, f in NUMERIC if not f.metadata.get("range")]
    assert not missing, "numeric keys without a range (opt(range=...)): " + ", ".join(missing)


def _given(f: dataclasses.Field, value, is_list: bool):
    """``value`` as the key takes it: a list key gets as many items as its ``min_items`` ([low, high]: both)."""
    return [value] * max(1, f.metadata.get("min_items", 0)) if is_list else value


def _set(obj, key: str, value) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, leaf, value)


def _instance(schema: type, key: str):
    if key.startswith("dataset_conf."):  # the loader block is checked alone, as build_dataloader does
        return DatasetConf(), key[len("dataset_conf."):], "dataset_conf."
    return schema(), key, ""


def _hint(schema: type, key: str):
    return typing.get_type_hints(type(_owner(schema(), key)))[key.rsplit(".", 1)[-1]]


@pytest.mark.parametrize("command, schema, key, f", NUMERIC, ids=[f"{c}:{k}" for c, _, k, _ in NUMERIC])
def test_each_range_takes_its_ends_and_refuses_one_step_outside_naming_the_key(command, schema, key, f):
    hint = _hint(schema, key)
    is_list = typing.get_origin(hint) in (list, typing.List)
    is_int = int in (typing.get_args(hint) or (hint,)) or hint is int
    inside, outside = _ends(f, is_int)
    for value in inside:
        obj, rel, prefix = _instance(schema, key)
        if rel in ("fbank_conf.low_freq", "fbank_conf.high_freq"):  # the default feats_type checks its band
            obj.resample_conf.resample_rate = 384000  # Nyquist 192 kHz: the widest band the ranges allow
            _set(obj, "fbank_conf.low_freq" if rel.endswith("high_freq") else "fbank_conf.high_freq", 0.0)
        _set(obj, rel, _given(f, value, is_list))
        check_values(obj, prefix)
    for value in outside:
        obj, rel, prefix = _instance(schema, key)
        _set(obj, rel, _given(f, value, is_list))
        with pytest.raises(CorpusIOError) as err:
            check_values(obj, prefix)
        message = str(err.value)
        assert key in message and "\n" not in message, message


def _owner(obj, key: str):
    for part in key.split(".")[:-1]:
        obj = getattr(obj, part)
    return obj


#: dataset_conf keys not run at their maximum here, with the reason (their range is still checked above)
NOT_RUN_AT_MAX = {
    "num_workers": "256 worker processes on a 2-core CI machine",
    "epoch_hours": "an epoch of 10^9 hours repeats the list for ever (by design; seconds to reach 4 batches): the "
                   "minimum runs",
}
#: the filter bounds that come in pairs: a bound past its partner is a ConfigError naming both (build_dataloader)
PAIRS = {"min_length": "max_length", "token_min_length": "token_max_length",
         "min_output_input_ratio": "max_output_input_ratio"}
PAIRS.update({hi: lo for lo, hi in list(PAIRS.items())})
#: the ends where the loader rightly yields no batch: every utterance of the fixture is dropped, under this count
DROPS_ALL = {
    ("filter_conf.max_length", 1): "filter.too_long",  # every utterance is longer than 10 ms
    ("filter_conf.min_length", 10 ** 9): "filter.too_short",
    ("filter_conf.token_max_length", 1): "filter.too_many_tokens",  # every transcript has 2 tokens or more
    ("filter_conf.token_min_length", 10 ** 9): "filter.too_few_tokens",
    ("filter_conf.min_output_input_ratio", 10.0 ** 9): "filter.ratio_too_low",
    ("filter_conf.max_output_input_ratio", 1e-06): "filter.ratio_too_high",
}
#: the ends where reading rightly fails: a one-paragraph user error naming the key
REFUSES = {("max_member_bytes", 1): "++dataset_conf.max_member_bytes",  # every tar member is over a 1-byte cap
           ("bucket_shares", 0.0): "dataset_conf.bucket_shares=[0.0] sums to 0, not 1"}  # one bucket, no share


def _loader_settings(key: str, value) -> dict:
    """What ``key=value`` needs besides: its stage on, and the keys tied to it consistent with it (the loader
    refuses, naming both, a min above its max, num_ceps above num_mel_bins or an mfcc band outside Nyquist)."""
    leaf = key.rsplit(".", 1)[-1]
    settings = {}
    if key.startswith("mfcc_conf."):
        settings["feats_type"] = "mfcc"
    if leaf in PAIRS:  # the partner moves with the bound: min <= max
        partner, low = f"filter_conf.{PAIRS[leaf]}", leaf.startswith("min") or leaf.startswith("token_min")
        settings[partner] = 10 ** 9 if low else 0
    if leaf == "frame_shift" and value >= 1000:  # 1-3 frames an utterance, fewer than its tokens: CTC's ratio
        settings["filter_conf.max_output_input_ratio"] = 10 ** 9  # filter would drop all; features are the point
    if key == "mfcc_conf.num_mel_bins":
        settings["mfcc_conf.num_ceps"] = min(value, 40)
    if key == "mfcc_conf.num_ceps":
        settings["mfcc_conf.num_mel_bins"] = max(value, 40)
    if key in ("mfcc_conf.high_freq", "mfcc_conf.low_freq", "fbank_conf.high_freq", "fbank_conf.low_freq"):
        block = key.split(".", 1)[0]
        settings["resample_conf.resample_rate"] = 384000  # Nyquist 192 kHz: the widest band the ranges allow
        settings[f"{block}.low_freq" if key.endswith("high_freq") else f"{block}.high_freq"] = 0.0
    if leaf == "max_batch_size":
        settings.update(batch_type="token", batch_size=10 ** 8)  # the cap is what binds
    if leaf == "num_buckets":
        settings["bucketing"] = True
    if leaf in ("bucket_batch_size", "bucket_shares"):
        settings["bucket_edges"] = [60.0]  # one batch size (share) per edge
    if leaf == "prefetch":
        settings["num_workers"] = 1
    if leaf == "max_member_bytes":
        settings["data_type"] = "shard"  # a raw list reads no tar member
    return settings


def _loader_cases() -> list[tuple[str, object, bool]]:
    """``(dataset_conf key, value, inside its range)``: both ends, and one step outside each."""
    cases = []
    for _, _, key, f in NUMERIC:
        if not key.startswith("dataset_conf."):
            continue
        rel = key[len("dataset_conf."):]
        hint = _hint(DatasetConf, rel)
        if typing.get_origin(hint) is typing.Union:  # Optional[X]: X
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        is_list = typing.get_origin(hint) in (list, typing.List)
        is_int = hint is int or int in typing.get_args(hint)
        inside, outside = _ends(f, is_int)
        for i, value in enumerate(inside):
            if i == 1 and rel.rsplit(".", 1)[-1] in NOT_RUN_AT_MAX:
                continue
            cases.append((rel, _given(f, value, is_list), True))
        cases += [(rel, _given(f, value, is_list), False) for value in outside]
    return cases


LOADER_CASES = _loader_cases()


@pytest.fixture(scope="module")
def loader_inputs(tmp_path_factory):
    """Three utterances of the fixture corpus (8 and 16 kHz, wav and flac): a raw list and one shard."""
    from tests.loader_data import fixture_utts, make_raw, make_shards, token_list

    root = tmp_path_factory.mktemp("ranges")
    raw, _ = make_raw(root)
    head = root / "head.list"
    head.write_text("".join(raw.read_text(encoding="utf-8").splitlines(keepends=True)[:3]), encoding="utf-8")
    shards, _ = make_shards(root / "shards", utts=fixture_utts()[:3], per_shard=3)
    return {"raw": head, "shard": shards}, token_list(root)


@pytest.mark.parametrize("key, value, inside", LOADER_CASES,
                         ids=[f"{k}={v}{'' if i else '-outside'}" for k, v, i in LOADER_CASES])
def test_the_loader_runs_at_each_end_of_every_dataset_conf_range(loader_inputs, key, value, inside):
    """Train mode with every augmentation on, so each key is used: a batch at each end (or, where the end rightly
    keeps nothing, no batch and every utterance counted as dropped), and one step outside a one-line ConfigError
    naming the key, before anything is read."""
    import torch

    from corpus_io.errors import ConfigError
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.tokenizer import build_tokenizer

    lists, tokens = loader_inputs
    conf = DatasetConf(data_type="raw", num_workers=0, speed_perturb=True, spec_aug=True, spec_sub=True,
                       spec_trim=True, batch_size=2)
    conf.filter_conf.token_min_length = 0
    for other, setting in (_loader_settings(key, value) if inside else {}).items():
        _set(conf, other, setting)
    _set(conf, key, value)

    def load():
        loader = build_dataloader(str(lists[conf.data_type]), conf, build_tokenizer(tokens), train=True, rank=0,
                                  world_size=1)
        return list(itertools.islice(loader, 4)), loader.counts()

    if not inside:
        with pytest.raises(ConfigError) as err:
            load()
        message = str(err.value)
        assert f"dataset_conf.{key}" in message and "\n" not in message, message
        return
    leaf_value = (key, value[0] if isinstance(value, list) else value)
    if leaf_value in REFUSES:
        with pytest.raises(CorpusIOError) as err:
            load()
        assert REFUSES[leaf_value] in str(err.value) and "\n" not in str(err.value), err.value
        return
    batches, counts = load()
    if leaf_value in DROPS_ALL:
        assert batches == [] and counts == {DROPS_ALL[leaf_value]: 3}, (batches, counts)
        return
    assert batches, f"no batch at dataset_conf.{key}={value} (counts: {counts})"
    for batch in batches:
        assert batch["feats"].shape[0] == len(batch["keys"]) > 0
        assert bool(torch.isfinite(batch["feats"]).all()), f"non-finite features at dataset_conf.{key}={value}"
