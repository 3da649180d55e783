"""Hydra composition: a command's YAML plus ``key=value`` / ``++key=value`` overrides, checked against
its schema (no ``outputs/`` folder, no change of cwd; Hydra is imported only when a config is composed)."""

from __future__ import annotations

import dataclasses
import re
import threading
from pathlib import Path
from typing import Any

from corpus_io.config.checks import check_keys, check_values
from corpus_io.config.describe import group_presets
from corpus_io.config.fields import CONF_DIR, schema_fields
from corpus_io.config.funasr import apply_funasr_keys, apply_old_spellings, funasr_group_overrides, override_keys
from corpus_io.errors import ConfigError, redact


def compose(schema: type, config_name: str, overrides: list[str], *, config_path: str | None = None) -> Any:
    """Compose ``conf/<config_name>.yaml`` (or the user's YAML) with overrides; return a checked ``schema``.

    Returns the dataclass instance; ``resolved_yaml(cfg)`` gives the YAML to store with outputs.
    """
    if "train_conf" in schema_fields(schema):
        overrides = funasr_group_overrides(list(overrides), {"model": group_presets("model")})
    overrides, later = _values_named_as_groups(schema, list(overrides))
    raw = compose_raw(config_name, overrides, config_path=config_path)
    raw.update(later)
    keep_given_model(raw, override_keys(overrides))
    return validate(schema, raw, explicit=override_keys(overrides) | frozenset(later))


def _values_named_as_groups(schema: type, overrides: list[str]) -> tuple[list[str], dict]:
    """``(overrides for Hydra, {key: value} set after composing)``: a top-level plain value of ``schema`` named as a
    config group of conf/ (transcribe's ``model``: a checkpoint path, not a ``conf/model/`` preset) would be taken
    by Hydra for a group choice (``++model=X`` refused), so ``key=X`` / ``++key=X`` of those is set afterwards."""
    plain = {name for name, f in schema_fields(schema).items()
             if f.type in ("str", str) and (CONF_DIR / name).is_dir()}
    if not plain:
        return overrides, {}
    kept, later = [], {}
    for o in overrides:
        key, eq, value = o.lstrip("+").partition("=")
        if eq and key.strip() in plain:
            value = value.strip()
            later[key.strip()] = value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" \
                else value
        else:
            kept.append(o)
    return kept, later


def keep_given_model(raw: dict, given: frozenset) -> None:
    """With ``init_param`` set, the model config comes from that checkpoint (corpus_io.train.init_param): ``raw``'s
    ``model`` keeps only the keys ``given`` names (the command line's ``model=PRESET`` or ``model.KEY=``), applied
    over the checkpoint's; the YAML's model defaults are dropped, in place."""
    model = raw.get("model")
    if not raw.get("init_param") or not isinstance(model, dict) or "model" in given:
        return
    raw["model"] = {key: value for key, value in model.items()
                    if any(g == f"model.{key}" or g.startswith(f"model.{key}.") for g in given)}


def compose_raw(config_name: str, overrides: list[str], *, config_path: str | None = None) -> dict:
    """The YAML composed with the overrides, as a plain dict, before any check (what :func:`compose` validates;
    the Python API merges a user's dict over it first)."""
    return _hydra_compose(config_name, overrides, config_path=config_path)


def validate(schema: type, raw: Any, *, explicit: frozenset = frozenset(), missing_ok: tuple[str, ...] = ()) -> Any:
    """Check a DictConfig/dict against ``schema``; return the dataclass instance. ``explicit``: the keys the
    command line set (an old spelling there overrides the YAML's new key). ``missing_ok``: required keys
    that may stay unset (they become ``""``) because the caller does not read them (the API's loader:
    ``output_dir``)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(raw, dict):
        raw = OmegaConf.to_container(raw, resolve=True)
    raw.pop("hydra", None)
    raw.pop("defaults", None)
    apply_funasr_keys(schema, raw)
    apply_old_spellings(schema, raw, prefix="", explicit=explicit)
    check_keys(schema, raw, prefix="")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), raw)
        for key in set(OmegaConf.missing_keys(merged)) & set(missing_ok):
            OmegaConf.update(merged, key, "")  # left empty: `require` names it if someone reads it after all
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


#: names of ``storage_options`` entries that hold credentials (s3fs key/secret/token, HTTP auth, ...)
_SECRET_OPTION = re.compile(r"secret|password|passwd|token|key|credential|auth", re.IGNORECASE)


def to_yaml(obj: Any) -> str:
    """The resolved config as YAML (stored next to outputs and in checkpoints), without credentials: the
    ``storage_options`` entries that hold them read ``***`` and URLs lose their ``user:password@``."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(_without_secrets(OmegaConf.to_container(OmegaConf.structured(obj)))))


def _without_secrets(node: Any, storage: bool = False) -> Any:
    if isinstance(node, dict):
        return {k: "***" if storage and _SECRET_OPTION.search(str(k)) and not isinstance(v, (dict, list))
                else _without_secrets(v, storage or k == "storage_options") for k, v in node.items()}
    if isinstance(node, list):
        return [_without_secrets(v, storage) for v in node]
    return redact(node) if isinstance(node, str) else node


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


# Hydra keeps one GlobalHydra per process: threads that compose side by side (the jobs a Dask worker runs in its
# threads) would clear and initialize it under each other, so they compose one at a time
_HYDRA_LOCK = threading.Lock()


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
    try:
        with _HYDRA_LOCK:
            GlobalHydra.instance().clear()
            try:
                with initialize_config_dir(config_dir=str(conf_dir), version_base=None, job_name=name):
                    cfg = hydra_compose(config_name=name, overrides=hydra_overrides)
            finally:
                GlobalHydra.instance().clear()
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
    return OmegaConf.to_container(cfg, resolve=False)


def _explain_hydra_error(message: str, overrides: list[str]) -> str:
    first = message.strip().splitlines()[0] if message.strip() else "invalid override"
    return (f"could not apply the overrides {overrides}: {first}. Use key=value for existing keys, "
            f"++key=value to set or add, and quote lists: ++key='[a,b]'.")
