"""The parallel map behind every long job: order, bounded read-ahead, errors, and a dying worker."""

from __future__ import annotations

import contextlib
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


def _kill_main_mid_job(cmd: list[str], out_dir, tmp_path) -> tuple[list[int], list[str]]:
    """Start ``cmd`` (a parallel corpus-io job), SIGKILL its main process once its workers are busy;
    return the pids of workers still alive 30 s later and the files left in ``out_dir``."""
    import subprocess

    import psutil

    log = open(tmp_path / "job.log", "wb")
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                           env=dict(os.environ, CORPUS_IO_NO_PROGRESS="1"))
    try:
        main = psutil.Process(job.pid)
        deadline = time.monotonic() + 120
        while len(main.children()) < 2 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # let the workers write
        workers = main.children()
        assert len(workers) >= 2 and job.poll() is None, (tmp_path / "job.log").read_text()
        job.send_signal(signal.SIGKILL)
        job.wait(30)
        _, alive = psutil.wait_procs(workers, timeout=30)
        return [p.pid for p in alive], sorted(p.name for p in out_dir.iterdir()) if out_dir.exists() else []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # whatever is left, so no orphan disturbs later tests
        log.close()


def test_killing_the_main_process_of_scp2jsonl_takes_its_workers_and_leaves_no_temp_file(tmp_path):
    from tests.conftest import BIN, FIXTURE, REPO

    wavs = [line.split(" ", 1)[1] for line in (FIXTURE / "wav.scp").read_text().splitlines() if line.strip()]
    n = 300_000  # many header probes: the job runs for seconds
    (tmp_path / "wav.scp").write_text("".join(f"u{i:07d} {REPO / wavs[i % len(wavs)]}\n" for i in range(n)))
    (tmp_path / "text").write_text("".join(f"u{i:07d} hello\n" for i in range(n)))
    out = tmp_path / "out"
    out.mkdir()
    alive, left = _kill_main_mid_job([str(BIN / "corpus-io"), "scp2jsonl",
                                      f"++scp_file_list=[{tmp_path / 'wav.scp'},{tmp_path / 'text'}]",
                                      f"++jsonl_file_out={out / 'train.jsonl'}", "++num_workers=2"], out, tmp_path)
    assert alive == [], "workers outlived the killed main process"
    assert left == [], f"left behind: {left}"


def test_killing_the_main_process_of_pack_shards_takes_its_workers_and_leaves_no_temp_shard(tmp_path):
    import json

    from tests.conftest import BIN
    from tests.shards.conftest import fixture_records

    records = fixture_records()
    with open(tmp_path / "big.jsonl", "w") as f:
        for i in range(6000):
            f.write(json.dumps(dict(records[i % len(records)], key=f"u{i:06d}")) + "\n")
    out = tmp_path / "shards"
    alive, left = _kill_main_mid_job([str(BIN / "corpus-io"), "pack-shards", f"++input={tmp_path / 'big.jsonl'}",
                                      f"++output_dir={out}", "++num_utts_per_shard=20", "++num_workers=2",
                                      "++audio_format=flac"], out, tmp_path)
    assert alive == [], "workers outlived the killed main process"
    assert not [name for name in left if ".tmp-" in name], left
