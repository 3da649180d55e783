"""corpus_io/tables/synth.py: the espeak-ng + sox speech the tests and recipes train on."""

from __future__ import annotations

import hashlib
from pathlib import Path

from corpus_io.tables import synth


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.wav"))}


def test_the_same_seed_synthesizes_the_same_bytes_so_that_make_smoke_trains_the_same_model(tmp_path):
    """Issue 60: two `make smoke` runs trained different models because sox dithered each file with a fresh random
    seed (every wav differed), so the smoke-model tests passed or failed by chance. With sox -R the same seed gives
    the same files, joined recordings included; another seed still gives other speech."""
    for name in ("a", "b"):
        synth.make_digits(tmp_path / name, 4, seed=3)
        synth.join(tmp_path / name, tmp_path / f"{name}_long", per_recording=2, seed=0)
    synth.make_digits(tmp_path / "other", 4, seed=4)
    first = _digests(tmp_path / "a") | _digests(tmp_path / "a_long")
    assert len(first) == 4 + 2
    assert first == _digests(tmp_path / "b") | _digests(tmp_path / "b_long")
    assert set(_digests(tmp_path / "other").values()).isdisjoint(_digests(tmp_path / "a").values())
