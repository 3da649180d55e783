"""The parallel map behind every long job: order, bounded read-ahead, errors, and a dying worker."""

from __future__ import annotations

import os
import signal
import time

import pytest

from corpus_io.errors import DataError, WorkerDied
from corpus_io.progress import Summary, parallel_imap


def _square(x: int) -> int:
    time.sleep(0.001 * (x % 3))  # uneven durations: results must still come back in input order
    return x * x


def _fail_on_7(x: int) -> int:
    if x == 7:
        raise DataError("item 7 is bad")
    return x


def _die_on_5(x: int) -> int:
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    return x


def test_results_come_back_in_input_order():
    assert list(parallel_imap(_square, range(200), num_workers=2, chunksize=7)) == [x * x for x in range(200)]
    assert list(parallel_imap(_square, range(5), num_workers=1)) == [0, 1, 4, 9, 16]


def test_the_input_is_read_lazily_a_bounded_window_ahead():
    consumed = []

    def items():
        for i in range(10_000):
            consumed.append(i)
            yield i

    results = parallel_imap(_square, items(), num_workers=2, chunksize=4)
    assert next(results) == 0
    assert len(consumed) <= 4 * 2 * 4 + 4  # window of 4 * num_workers chunks (+ the one being formed)
    results.close()


def test_an_exception_in_a_worker_reaches_the_caller_unchanged():
    with pytest.raises(DataError, match="item 7 is bad"):
        list(parallel_imap(_fail_on_7, range(20), num_workers=2, chunksize=2))


def test_a_worker_killed_by_a_signal_fails_the_job_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(WorkerDied, match="died abruptly.*out-of-memory"):
        list(parallel_imap(_die_on_5, range(50), num_workers=2, chunksize=1))
    assert time.monotonic() - start < 60


def test_summary_line_counts_skips_by_reason():
    s = Summary(kept=3, seconds=7200)
    s.skip("corrupt audio", 2)
    s.skip("no transcript")
    assert s.line() == "3 utterances; 2.000 h; skipped 3 (corrupt audio: 2, no transcript: 1)"
