"""The schema building blocks: :func:`opt` (one field with its help, unit, choices, range and default),
interval ranges, and the introspection every other config module uses.

Units follow Kaldi/WeNet: lengths in 10 ms frames, durations in seconds, rates in Hz.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, List


def _shipped_conf_dir() -> Path:
    """The shipped YAML configs: ``corpus_io/conf`` in an installed wheel, ``conf/`` beside it in a checkout."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "conf"
    return installed if installed.is_dir() else package.parent / "conf"


CONF_DIR = _shipped_conf_dir()

#: failure handling, one word in every command: fail (a DataError naming file, line, key or shard) or skip
#: (drop the item and count it in the closing summary)
FAILURE_CHOICES = ("fail", "skip")


def opt(default: Any = dataclasses.MISSING, help: str = "", *, unit: str = "", choices: tuple = (),
        factory: Any = dataclasses.MISSING, group: str = "", range: str = "", min_items: int = 0) -> Any:
    """A schema field with its help text, unit and allowed values (shown by ``--help``).

    The default given here is the one default: the shipped ``conf/*.yaml`` may restate it, and
    ``tests/test_config.py`` fails when they disagree. ``group`` names a config group directory
    (``conf/<group>/*.yaml`` presets, chosen in the command YAML's ``defaults`` list).
    ``range``: the allowed interval of a number, in interval notation, e.g. ``"[1, 64]"`` or ``"(0, inf)"``
    (``[``/``]`` include the bound, ``(``/``)`` exclude it). Every value that sizes memory, time or
    processes has one; a value outside it is a :class:`ConfigError` (null stays allowed for Optional keys).
    On a list of numbers ``range`` bounds every item, and ``min_items`` is the fewest items it may hold.
    """
    if range:
        parse_range(range)  # a typo in a schema fails at import, not in a user's run
    meta = {"help": help, "unit": unit, "choices": tuple(choices), "group": group, "range": range,
            "min_items": min_items}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def num_jobs_opt() -> Any:
    """``num_jobs`` of a command that runs as jobs (corpus_io.jobs.parts): an int, or ``auto``."""
    return opt(1, "split the work into this many jobs (Kaldi's JOB=1:$nj); each writes a part, merge-jobs joins "
                  "them; auto: the size of the Slurm/SGE/PBS/LSF job array", unit="jobs")


def job_index_opt() -> Any:
    """``job_index`` of a command that runs as jobs: 1..num_jobs, or ``auto``."""
    return opt(1, "which job this is, counting from 1 (1..num_jobs); auto: the job array's task index")


def executor_opt() -> Any:
    """``executor`` of a command that runs as jobs: where its num_jobs jobs run."""
    return opt("local", "local: this process is one job (++job_index); dask: submit all num_jobs jobs to the "
                        "Dask cluster at executor_address and merge them (extra [dask])", choices=("local", "dask"))


def executor_address_opt() -> Any:
    return opt("", "the Dask scheduler for ++executor=dask, e.g. tcp://10.0.0.5:8786")


def on_error_opt(help: str) -> Any:
    """``on_error`` of a command that reads data (fail or skip); ``help`` says which failures it covers."""
    return opt("fail", help, choices=FAILURE_CHOICES)


def allow_pipe_opt(help: str) -> Any:
    """``allow_pipe``: off, so no command entry runs unless asked; ``help`` names the entries it allows."""
    return opt(False, help)


def pipe_timeout_opt() -> Any:
    """``pipe_timeout`` of a command that may run command entries (``allow_pipe``), in seconds."""
    return opt(300.0, "longest run of one command entry (a Kaldi 'cmd |' or a pipe:CMD); past it its processes "
                      "are killed and the entry fails (on_error)", unit="seconds", range="(0, 604800]")


def storage_options_opt(what: str) -> Any:
    """``storage_options``, empty by default: the fsspec options for ``what`` (e.g. "remote shards")."""
    return opt(help=f"fsspec options for {what}", factory=dict)


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



def schema_fields(schema: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(schema)}


def nested_schema(f: dataclasses.Field, owner: type) -> type | None:
    hint = typing.get_type_hints(owner).get(f.name)
    if dataclasses.is_dataclass(hint):
        return hint
    return None


def list_item_schema(f: dataclasses.Field, owner: type) -> type | None:
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
        nested = nested_schema(f, schema)
        if nested:
            keys.extend(all_keys(nested, prefix=path + "."))
    return keys

