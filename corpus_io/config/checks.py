"""Checks of a raw or built config: unknown keys (with the closest valid one), required keys, every value
within its choices and range, and (:func:`schema`, at construction) every value of its declared type."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import typing
from typing import Any, Dict, List, Union

from corpus_io.config.fields import all_keys, in_range, list_item_schema, nested_schema, schema_fields
from corpus_io.errors import ConfigError


def check_keys(schema: type, raw: dict, prefix: str) -> None:
    fields = schema_fields(schema)
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(_unknown_key_message(path, schema, prefix))
        f = fields[key]
        nested = nested_schema(f, schema)
        if nested and not isinstance(value, dict):
            first = dataclasses.fields(nested)[0].name
            raise ConfigError(f"config key '{path}' is a group of keys, not the single value {value!r}. Set its "
                              f"keys instead, e.g. ++{path}.{first}=<value> (--help lists them).")
        if nested:
            check_keys(nested, value, prefix=path + ".")
        item_schema = list_item_schema(f, schema)
        if item_schema and isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    check_keys(item_schema, item, prefix=f"{path}[{i}].")


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
        if isinstance(value, list) and f.metadata:
            _check_items(f, value, path)
        elif bounds and value is not None and not in_range(value, bounds):
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
    if hasattr(obj, "check_together"):  # limits joining two keys of one block (e.g. DatasetConf's mfcc band)
        obj.check_together(prefix)


def _check_items(f: dataclasses.Field, value: list, path: str) -> None:
    """A list key's ``min_items`` and, for a list of numbers, every item within its ``range``."""
    bounds, fewest = f.metadata.get("range"), f.metadata.get("min_items", 0)
    example = _list_example(f)
    if len(value) < fewest:
        raise ConfigError(f"{path}={value} holds {len(value)} items; it needs at least {fewest} "
                          f"({f.metadata.get('help')}). Give e.g. ++{path}='{example}'.")
    for i, item in enumerate(value):
        if bounds and isinstance(item, (int, float)) and not in_range(item, bounds):
            raise ConfigError(f"{path}[{i}]={item} is outside its range {bounds} ({f.metadata.get('help')}). "
                              f"Give items in range, e.g. ++{path}='{example}'.")


def _list_example(f: dataclasses.Field) -> str:
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return "[" + ",".join(map(str, default or [])) + "]"


def require(obj: Any, *keys: str) -> None:
    """Raise a ConfigError for any of ``keys`` still at its '???' placeholder."""
    for key in keys:
        value = obj
        for part in key.split("."):
            value = getattr(value, part)
        if value in ("???", "") or value == [] or value is None:
            raise ConfigError(f"config key '{key}' is required. Set it with ++{key}=...")


# --------------------------------------------------------------------------- typed construction


def schema(cls: type) -> type:
    """``@schema`` instead of ``@dataclass`` for a config block: a dataclass whose constructor checks every
    field against its type hint, so a config built in Python fails where it is built, naming the key.

    A nested block given as a plain dict (``DatasetConf(fbank_conf={"num_mel_bins": 40})``) becomes that
    block (its keys checked like the CLI's, with the closest valid key suggested), as do the dicts of a list
    of blocks (``sources``); a path-like value of a string key becomes a string; an int is a valid float.
    Any other mismatch (``batch_size="16"``, ``shuffle=1``, ``speeds=0.9``) is a :class:`ConfigError` naming
    the key. Choices and ranges are checked on the whole config (:func:`check_values`), as the CLI does.
    """
    own = cls.__dict__.get("__post_init__")

    def __post_init__(self: Any) -> None:
        coerce_fields(self)
        if own is not None:
            own(self)

    cls.__post_init__ = __post_init__
    return dataclasses.dataclass(cls)


def coerce_fields(obj: Any) -> None:
    """Check (and convert dict -> block, path -> str) every field of ``obj`` in place; see :func:`schema`."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, str) and value == "???":  # OmegaConf's required marker: `require` reports it
            continue
        setattr(obj, f.name, _coerce(value, hints[f.name], f.name))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin is Union:
        if value is None and type(None) in typing.get_args(hint):
            return None
        for arg in typing.get_args(hint):
            if arg is not type(None):
                try:
                    return _coerce(value, arg, key)
                except ConfigError:
                    pass
        raise _wrong_type(value, hint, key)
    if origin in (list, List):
        if not isinstance(value, (list, tuple)):
            raise _wrong_type(value, hint, key)
        (item,) = typing.get_args(hint) or (Any,)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise _wrong_type(value, hint, key)
        return value
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise _wrong_type(value, hint, key)
        check_keys(hint, value, prefix=key + ".")
        try:
            return hint(**value)
        except ConfigError as exc:  # name the inner key with its block: fbank_conf.num_mel_bins
            raise ConfigError(str(exc).replace("config key '", f"config key '{key}.", 1)) from None
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is str and isinstance(value, os.PathLike):
        return os.fspath(value)
    wrong = not isinstance(value, hint) or (hint is not bool and isinstance(value, bool))
    if hint in (int, float, str, bool) and wrong:
        raise _wrong_type(value, hint, key)
    return value


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if origin in (list, List):
        (item,) = typing.get_args(hint) or (Any,)
        return f"a list of {_type_name(item)}"
    if origin in (dict, Dict):
        return "a mapping"
    if hint is type(None):
        return "null"
    if dataclasses.is_dataclass(hint):
        return f"a {hint.__name__} (or a dict of its keys)"
    return getattr(hint, "__name__", str(hint))


def _wrong_type(value: Any, hint: Any, key: str) -> ConfigError:
    return ConfigError(f"config key '{key}' takes {_type_name(hint)}, but got {type(value).__name__} {value!r}. "
                       "Pass a value of that type (the command line converts override strings; Python code must).")
