"""``--help`` rows of a schema: every key with the default a run uses, its help, unit, choices and range."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from corpus_io.config.fields import CONF_DIR, nested_schema


def describe(schema: type, prefix: str = "", defaults: Any = None) -> list[tuple[str, str, str]]:
    """``(key, default, help [unit] {choices})`` rows for ``--help``: the values a run without overrides
    uses (the default instance, so per-command defaults such as decode's batch size show); imports nothing
    heavy."""
    defaults = schema() if defaults is None else defaults
    rows = []
    for f in dataclasses.fields(schema):
        path = f"{prefix}{f.name}"
        default = getattr(defaults, f.name)
        nested = nested_schema(f, schema)
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
