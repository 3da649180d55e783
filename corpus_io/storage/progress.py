"""Progress bars, end-of-job summaries and the parallel map used by long jobs.

Every long job shows its progress on stderr (a tqdm bar in a terminal, a line every 30 s or 10 % in
a log file) and ends with one summary line: counts, hours, and skipped items by reason.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, TypeVar

from corpus_io.errors import WorkerDied

T = TypeVar("T")
R = TypeVar("R")


def default_num_workers() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_num_workers(num_workers: int | None) -> int:
    """``None``/``0``/negative mean "all cores"."""
    if not num_workers or num_workers < 0:
        return default_num_workers()
    return num_workers


LOG_INTERVAL_S = 30.0  # a non-terminal stderr gets a progress line at most this often ...
LOG_STEP = 0.10  # ... or when another 10 % of the total is done
MIN_GAP_S = 1.0  # ... but never two within a second, and none for a job done in less


def progress(iterable: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "it") -> Iterator[T]:
    """Show progress on stderr while iterating: a tqdm bar in a terminal; in a log file or pipe, a plain
    line every ``LOG_INTERVAL_S`` seconds or ``LOG_STEP`` of the total (at most one per ``MIN_GAP_S``), and
    one at the end (so a one-hour job leaves ~100 lines, not thousands of bar redraws; a sub-second job none).
    ``CORPUS_IO_NO_PROGRESS=1`` turns both off."""
    if os.environ.get("CORPUS_IO_NO_PROGRESS") == "1":
        return iter(iterable)
    if not sys.stderr.isatty():
        return _log_lines(iterable, total=total, desc=desc, unit=unit)
    from tqdm import tqdm

    return iter(tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                     mininterval=0.5))


def _log_lines(iterable: Iterable[T], *, total: int | None, desc: str, unit: str) -> Iterator[T]:
    start = last_time = time.monotonic()
    next_share = LOG_STEP
    done = 0

    def line(now: float) -> str:
        elapsed = now - start
        rate = f"{done / elapsed:.1f} {unit}/s" if elapsed > 0 else ""
        of_total = f"/{total} ({100 * done / total:.0f} %)" if total else ""
        return f"[{desc or 'progress'}] {done}{of_total} {unit}, {elapsed:.0f} s, {rate}"

    for item in iterable:
        yield item
        done += 1
        now = time.monotonic()
        crossed = bool(total) and done / total >= next_share and now - last_time >= MIN_GAP_S
        if crossed or now - last_time >= LOG_INTERVAL_S:
            if crossed:
                next_share = (int(done / total / LOG_STEP) + 1) * LOG_STEP
            if not (total and done >= total):  # the closing line below covers 100 %
                print(line(now), file=sys.stderr, flush=True)
            last_time = now
    if time.monotonic() - start >= MIN_GAP_S:  # a sub-second job says nothing (its summary line suffices)
        print(line(time.monotonic()), file=sys.stderr, flush=True)


@dataclass
class Summary:
    """Counts for the closing line of a job: items kept, seconds of audio, and skips by reason."""

    what: str = "utterances"
    kept: int = 0
    seconds: float = 0.0
    bytes: int = 0
    skipped: Counter = field(default_factory=Counter)
    extra: dict = field(default_factory=dict)

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] += n

    def merge(self, other: Summary) -> None:
        self.kept += other.kept
        self.seconds += other.seconds
        self.bytes += other.bytes
        self.skipped.update(other.skipped)

    def line(self) -> str:
        parts = [f"{self.kept} {self.what}", f"{self.seconds / 3600:.3f} h"]
        if self.bytes:
            parts.append(f"{self.bytes / 1e9:.3f} GB")
        for key, value in self.extra.items():
            parts.append(f"{key} {value}")
        total_skipped = sum(self.skipped.values())
        if total_skipped:
            reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.skipped.items()))
            parts.append(f"skipped {total_skipped} ({reasons})")
        else:
            parts.append("skipped 0")
        return "; ".join(parts)

    def print(self, prefix: str) -> None:
        print(f"[{prefix}] {self.line()}", file=sys.stderr, flush=True)

    def raise_if_empty(self, job: str, what_to_do: str) -> None:
        """A job that kept nothing failed, whatever on_error said: a DataError with the counts."""
        if self.kept == 0:
            from corpus_io.errors import DataError

            raise DataError(f"{job} produced nothing: {self.line()}. {what_to_do}")


def may_start_processes(num_workers: int, what: str = "worker processes") -> bool:
    """Whether to start ``num_workers`` ``what``: not inside a daemonic process (a ``dask worker`` under its
    nanny, the default; a multiprocessing pool's worker), which Python forbids children (``AssertionError:
    daemonic processes are not allowed to have children``). The caller then runs the work inline, in this
    process, and the log says so once per process."""
    global _SAID_INLINE
    if num_workers < 1 or not mp.current_process().daemon:
        return num_workers >= 1
    with _SAID_LOCK:
        said, _SAID_INLINE = _SAID_INLINE, True
    if not said:
        print(f"[corpus-io] this process is daemonic (a dask worker under its nanny, or a pool's worker) and may not "
              f"start processes: the work of its {num_workers} {what} runs inline, in this process (the cluster's "
              f"workers and threads run the jobs side by side).", file=sys.stderr, flush=True)
    return False


_SAID_INLINE = False
_SAID_LOCK = threading.Lock()


class WorkerState(threading.local):
    """What a :func:`parallel_imap` ``initializer`` gives the workers (``.values``, set by the initializer), per
    thread: jobs that run inline side by side in one process's threads (a Dask worker's) never see each other's."""

    def __init__(self) -> None:
        self.values: dict = {}


def parallel_imap(fn: Callable[[T], R], items: Iterable[T], *, num_workers: int, chunksize: int = 64,
                  initializer: Callable[..., None] | None = None, initargs: tuple = (),
                  start_method: str | None = None) -> Iterator[R]:
    """Ordered ``map`` over processes; runs inline when ``num_workers == 1`` or in a daemonic process
    (:func:`may_start_processes`).

    Results come back in input order. The input is consumed lazily with at most
    ``4 * num_workers`` chunks in flight (``Pool.imap`` would read it all ahead),
    so memory stays bounded by the window, not by the input length. A worker that dies (the OOM
    killer, a crash in a native decoder) fails the job with :class:`WorkerDied`; a
    ``multiprocessing.Pool`` would wait for its lost result forever.

    ``initializer(*initargs)`` runs once in every worker before its first item (in this process when
    the job runs inline): the way to give workers state a job builds (open tables, loaded sources),
    which then works under any start method, not only fork (keep it in a :class:`WorkerState`). ``start_method``:
    None is :func:`default_start_method`.
    """
    if num_workers <= 1 or not may_start_processes(num_workers):
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, items)
        return
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    if start_method is None:
        start_method = default_start_method()
    ctx = mp.get_context(start_method)
    window: deque = deque()
    pool = ProcessPoolExecutor(num_workers, mp_context=ctx, initializer=_start_worker,
                               initargs=(os.getpid(), initializer, initargs))
    try:
        for chunk in _chunks(items, chunksize):
            window.append(pool.submit(_map_chunk, fn, chunk))
            if len(window) >= 4 * num_workers:
                yield from window.popleft().result()
        while window:
            yield from window.popleft().result()
    except BrokenProcessPool:
        raise WorkerDied("a worker process of this job died abruptly (killed, e.g. by the out-of-memory killer, "
                         "or crashed in a native library); nothing it was writing was kept. Rerun with fewer "
                         "workers (++num_workers) or more memory; jobs that resume skip finished work.") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def default_start_method() -> str | None:
    """fork on Linux (workers share the parent's tables copy-on-write, and start at once), except once this
    process runs fsspec's event-loop thread (after an s3:// or http(s):// read or write): a forked child
    inherits that loop's aiohttp/SSL objects mid-use, and a pack-shards worker writing to S3 died of a
    segfault while collecting them. Then spawn. Elsewhere the platform's default."""
    if not sys.platform.startswith("linux"):
        return None
    asyn = sys.modules.get("fsspec.asyn")
    loop_thread = asyn.iothread[0] if asyn is not None else None
    return "spawn" if loop_thread is not None and loop_thread.is_alive() else "fork"


def _start_worker(parent_pid: int, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    _die_with_parent(parent_pid)
    if initializer is not None:
        initializer(*initargs)


def _die_with_parent(parent_pid: int) -> None:
    """Worker start: the kernel sends this worker SIGKILL when the job's main process dies (even by
    SIGKILL, which leaves it no chance to stop its pool), so no worker outlives the job. Linux only;
    what a killed worker was writing has no name yet (files.UnnamedFile), so nothing is left behind."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _map_chunk(fn: Callable[[T], R], chunk: list[T]) -> list[R]:
    return [fn(item) for item in chunk]


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
