"""corpus-io stats: the table's totals match the index, and a real PNG is written."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from corpus_io.config import PackShardsConfig
from corpus_io.shards.pack import pack_shards
from tests.conftest import run_cli
from tests.loader_data import make_raw
from tests.shards.conftest import fixture_records, write_jsonl

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    pack_shards(PackShardsConfig(input=str(write_jsonl(root / "t.jsonl", fixture_records())),
                                 output_dir=str(root / "out"), num_utts_per_shard=10, num_workers=1))
    return root / "out"


def _row(table: str, name: str) -> str:
    match = re.search(rf"^{name}\s+(\S+)", table, re.M)
    assert match, table
    return match.group(1)


def test_stats_table_totals_equal_the_index_and_the_png_is_real(packed, tmp_path):
    png = tmp_path / "dur.png"
    result = run_cli("corpus-io", "stats", f"++input={packed / 'data.list'}", f"++output={png}")
    assert result.returncode == 0, result.stderr
    table = result.stdout
    index = [json.loads(line) for line in (packed / "index.jsonl").read_text().splitlines()]
    assert int(_row(table, "utterances")) == sum(e["num_utts"] for e in index) == 24
    assert float(_row(table, "seconds")) == pytest.approx(sum(e["duration"] for e in index), abs=0.01)
    assert float(_row(table, "hours")) == pytest.approx(sum(e["duration"] for e in index) / 3600, abs=0.001)
    assert int(_row(table, "shards")) == 3 and int(_row(table, "speakers")) == 4
    assert "(agrees)" in table and "per-shard balance" in table and "text length" in table
    assert re.search(r"^\s+utts\s+4\s+10\s+8\.0$", table, re.M), table
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 1000


def _tree(root) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_stats_of_a_raw_list_writes_the_default_png_into_the_current_directory_and_leaves_the_data_alone(tmp_path):
    raw, keys = make_raw(tmp_path / "data")
    before = _tree(raw.parent)
    cwd = tmp_path / "work"
    cwd.mkdir()
    result = run_cli("corpus-io", "stats", f"++input={raw}", "++data_type=raw", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert int(_row(result.stdout, "utterances")) == len(keys)
    assert float(_row(result.stdout, "seconds")) > 10
    assert _tree(raw.parent) == before  # nothing written beside the data
    if importlib.util.find_spec("matplotlib") is None:  # the core install: the table only, and it says so
        assert "not drawn (matplotlib is not installed" in result.stdout and list(cwd.iterdir()) == []
    else:
        png = cwd / f"{raw.stem}.stats.png"
        assert [p.name for p in cwd.iterdir()] == [png.name]
        assert png.read_bytes()[:8] == PNG
        assert f"duration histogram: {png}" in result.stdout


def test_stats_of_a_missing_list_is_a_clear_error(tmp_path):
    result = run_cli("corpus-io", "stats", f"++input={tmp_path / 'nope.list'}")
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr
