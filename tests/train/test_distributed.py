"""Checks across ranks (corpus_io.train.distributed)."""

from __future__ import annotations

from corpus_io.train.distributed import rank_disagreement


def test_ranks_that_resume_differently_or_read_different_lists_are_named():
    same = {"resume": (2, 10, 410), "lists": "ab12"}
    assert rank_disagreement([same, dict(same)]) is None
    problem = rank_disagreement([same, {"resume": (1, 0, 200), "lists": "ab12"}])
    assert "resume point" in problem and "rank 0: (2, 10, 410); rank 1: (1, 0, 200)" in problem
    assert "shared" in problem or "share" in problem
    assert "train list" in rank_disagreement([same, {"resume": (2, 10, 410), "lists": "ffff"}])
