"""Shared data for the shard tests: the fixture corpus as a FunASR jsonl, packed once per module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corpus_io.kaldi import iter_table
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
