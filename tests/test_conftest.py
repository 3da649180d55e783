"""The suite's hang limits (tests/conftest.py): a figure for a quiet machine, scaled by how busy this one is."""

from __future__ import annotations

import pytest

from tests.conftest import HANG_SCALE_ENV, hang_limit, load_scale, run_bounded


def test_a_hang_limit_is_its_figure_times_the_load_scale_and_never_below_the_figure(monkeypatch):
    monkeypatch.setenv(HANG_SCALE_ENV, "2.5")
    assert hang_limit(10) == 25
    monkeypatch.delenv(HANG_SCALE_ENV)
    assert load_scale() >= 1 and hang_limit(10) >= 10


def test_run_bounded_stops_a_command_at_the_scaled_limit_and_says_both_figures(monkeypatch):
    monkeypatch.setenv(HANG_SCALE_ENV, "0.05")
    with pytest.raises(pytest.fail.Exception, match=r"sleep 30 \.\.\. hung for 1 s \(20 s x load 0\.05\)"):
        run_bounded(["sleep", "30"], 20)
