"""Shared data for the shard tests: the fixture corpus as a FunASR jsonl, packed once per module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corpus_io.tables.kaldi import iter_table
from tests.conftest import FIXTURE, REPO


def fixture_records() -> list[dict]:
    """The fixture corpus as FunASR lines with absolute paths (so tests may run anywhere)."""
    texts = {line.key: line.value for line in iter_table(FIXTURE / "text")}
    spk = {line.key: line.value for line in iter_table(FIXTURE / "utt2spk")}
    return [{"key": line.key, "source": str(REPO / line.value), "target": texts[line.key],
             "speaker": spk[line.key], "language": "mixed"} for line in iter_table(FIXTURE / "wav.scp")]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def fixture_jsonl(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "train.jsonl", fixture_records())


def packed_with_a_repeat(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``(merged data.list, a, again)``: pack-shards of the fixture corpus into ``a`` (24 utts, 3 shards of
    10/10/4) and of its first 4 utterances into ``again`` (1 shard), merged into one list + index, so 4
    keys are held by two shards."""
    from corpus_io.config import PackShardsConfig
    from corpus_io.shards.index import load_index, write_list_and_index
    from corpus_io.shards.pack import pack_shards

    records = fixture_records()
    a, again = tmp_path / "a", tmp_path / "again"
    for out, recs in ((a, records), (again, records[:4])):
        jsonl = write_jsonl(tmp_path / f"{out.name}.jsonl", recs)
        pack_shards(PackShardsConfig(input=str(jsonl), output_dir=str(out), num_workers=1, num_utts_per_shard=10))
    merged = tmp_path / "merged" / "data.list"
    merged.parent.mkdir()
    write_list_and_index(merged, [*load_index(a / "data.list", keys=True).values(),
                                  *load_index(again / "data.list", keys=True).values()])
    return merged, a, again
