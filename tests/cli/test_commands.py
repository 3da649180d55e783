"""The command table: every subcommand registered in one place, each with its YAML and its function."""

from __future__ import annotations

import importlib

from corpus_io.commands import COMMANDS
from tests.conftest import REPO, run_cli


def test_every_shipped_command_yaml_has_a_row_and_every_row_a_yaml():
    shipped = {p.stem.replace("_", "-") for p in (REPO / "conf").glob("*.yaml")}
    assert {c.name for c in COMMANDS} == shipped


def test_every_row_names_a_function_that_exists():
    for cmd in COMMANDS:
        module, _, function = cmd.run.partition(":")
        assert callable(getattr(importlib.import_module(module), function, None)), cmd


def test_a_standalone_script_is_the_subcommand_with_the_same_keys():
    standalone = run_cli("pack-shards", "--help")
    sub = run_cli("corpus-io", "pack-shards", "--help")
    assert standalone.returncode == sub.returncode == 0
    assert standalone.stdout == sub.stdout and "num_utts_per_shard" in sub.stdout
    assert "Usage: corpus-io pack-shards" in standalone.stdout


def test_an_unknown_key_of_a_torch_command_is_one_paragraph_before_its_import():
    result = run_cli("corpus-io", "train", "++no_such_key=1")
    assert result.returncode == 2 and "no_such_key" in result.stderr and "Traceback" not in result.stderr
