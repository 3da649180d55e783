"""Ranges are real: every numeric and list key of every command has a declared range, its minimum and maximum
are accepted and one step outside is a one-line ConfigError naming the key; the loader runs at both ends of
every ``dataset_conf`` range (a batch, or a one-paragraph error naming a key, never a traceback)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing

import pytest

from cli.commands import COMMANDS
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
        _set(obj, rel, [value] if is_list else value)
        check_values(obj, prefix)
    for value in outside:
        obj, rel, prefix = _instance(schema, key)
        _set(obj, rel, [value] if is_list else value)
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
    "resample_rate": "384 kHz fbank of the whole corpus is slow; the minimum runs",
    "seed": "any seed is a seed",
    "epoch_hours": "an epoch of 10^9 hours repeats the list for ever (by design); the minimum runs",
    "max_member_bytes": "a limit, not an allocation: the minimum runs",
    "batch_timeout": "a bound on a wait: the minimum runs",
    "read_timeout": "a bound on a wait (local files never wait): the minimum runs",
}


def _loader_cases() -> list[tuple[str, object]]:
    cases = []
    for _, _, key, f in NUMERIC:
        if not key.startswith("dataset_conf."):
            continue
        rel = key[len("dataset_conf."):]
        hint = _hint(DatasetConf, rel)
        is_list = typing.get_origin(hint) in (list, typing.List)
        is_int = hint is int or int in typing.get_args(hint)
        inside, _ = _ends(f, is_int)
        for i, value in enumerate(inside):
            if i == 1 and rel.rsplit(".", 1)[-1] in NOT_RUN_AT_MAX:
                continue
            cases.append((rel, [value] if is_list else value))
    return cases


LOADER_CASES = _loader_cases()


@pytest.fixture(scope="module")
def loader_inputs(tmp_path_factory):
    from tests.loader_data import make_raw, token_list

    root = tmp_path_factory.mktemp("ranges")
    raw, _ = make_raw(root)
    head = root / "head.list"
    head.write_text("".join(raw.read_text(encoding="utf-8").splitlines(keepends=True)[:3]), encoding="utf-8")
    return head, token_list(root)


@pytest.mark.parametrize("key, value", LOADER_CASES, ids=[f"{k}={v}" for k, v in LOADER_CASES])
def test_the_loader_runs_at_each_end_of_every_dataset_conf_range(loader_inputs, key, value):
    """Train mode with every augmentation on, so each key is used: a batch, or a user error naming a key."""
    from corpus_io.dataset import build_dataloader
    from corpus_io.tokenizer import build_tokenizer

    head, tokens = loader_inputs
    conf = DatasetConf(data_type="raw", num_workers=0, speed_perturb=True, spec_aug=True, spec_sub=True,
                       spec_trim=True, batch_size=2)
    conf.filter_conf.token_min_length = 0
    _set(conf, key, value)
    if key == "num_workers" or key == "prefetch":
        conf.num_workers = min(conf.num_workers, 1)
    try:
        batches = list(itertools.islice(build_dataloader(str(head), conf, build_tokenizer(tokens), train=True, rank=0,
                                                         world_size=1), 4))
    except CorpusIOError as exc:
        assert "dataset_conf." in str(exc) or key.rsplit(".", 1)[-1] in str(exc), exc
        return
    for batch in batches:
        assert batch["feats"].shape[0] == len(batch["keys"])
