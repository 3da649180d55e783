"""The trainer's numbers (corpus_io.train.metrics): sums, their reduction across ranks, TensorBoard."""

from __future__ import annotations

import pytest

from corpus_io.train.distributed import DistContext
from corpus_io.train.metrics import Board, Meter, step_spread


def test_a_meter_sums_batches_and_derives_loss_and_accuracy():
    m = Meter()
    m.add_batch({"loss": 2.0, "utts": 3, "errors": 1, "tokens": 4, "forward_time": 0.5, "backward_time": 0.25},
                {"padding_ratio": 0.1, "audio_seconds": 6.0}, data_load=0.125)
    m.add_scored(1.0, 1, 0, 4)
    assert (m.utts, m.batches, m.audio_seconds, m.times["data_load"]) == (4, 1, 6.0, 0.125)
    assert m.loss == (2.0 * 3 + 1.0) / 4 and m.acc == 1 - 1 / 8
    assert Meter().acc is None


def test_a_single_process_meter_reduces_to_itself_with_its_types():
    m = Meter(steps=2, utts=5, loss_sum=7.5, errors=1, tokens=9, padding=0.5, batches=2, audio_seconds=3.0)
    m.times["optim_time"] = 0.25
    r = m.reduced(DistContext())
    assert (r.steps, r.utts, r.errors, r.tokens, r.batches) == (2, 5, 1, 9, 2)
    assert isinstance(r.utts, int) and (r.loss_sum, r.padding, r.audio_seconds) == (7.5, 0.5, 3.0)
    assert r.times == m.times and r.start == m.start


def test_the_board_writes_scalars_on_rank_0_and_nothing_elsewhere(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = Board(tmp_path / "main", enabled=True)
    board.scalars(3, {"cv/loss": 1.5, "cv/acc": None})
    board.close()
    Board(tmp_path / "other", enabled=False).scalars(3, {"cv/loss": 1.5})
    events = EventAccumulator(str(tmp_path / "main" / "tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["cv/loss"]
    assert [(e.step, e.value) for e in events.Scalars("cv/loss")] == [(3, 1.5)]
    assert not (tmp_path / "other").exists()


def test_step_spread_is_the_median_relative_range_of_the_ranks_audio_per_step():
    assert step_spread([[10.0, 10.0, 8.0]]) == 0.0  # one rank
    # steps: (10, 10) -> 0, (10, 30) -> 20/20 = 1, (8, 8) -> 0; the median is 0; a rank's extra steps are not compared
    assert step_spread([[10.0, 10.0, 8.0], [10.0, 30.0, 8.0, 5.0]]) == 0.0
    assert step_spread([[10.0, 10.0], [30.0, 30.0]]) == pytest.approx(1.0)
