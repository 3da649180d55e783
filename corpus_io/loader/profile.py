"""Where a batch's time goes: opt-in timers of the loader chain, per worker and in the main process.

Off unless ``CORPUS_IO_LOADER_PROFILE=1`` is in the environment when a loader is iterated; off, nothing
is wrapped or timed (one ``None`` check per shard and per batch). On, each stage's output is wrapped in
a generator that adds the seconds spent in its ``next()`` (inclusive: its upstream stages too); a
stage's own time is its inclusive time minus its upstream's, so a buffer that pulls 500 samples per
output is charged only for its own work. Reading is split further: ``read`` is the time in the file's
``read()`` calls (shards) or in fetching a raw entry's bytes, ``tar parse`` the rest of producing a
sample. A worker's time outside the chain (the DataLoader putting a batch into shared memory and
waiting for the next request) is ``hand-over``; the main process times waiting for the next batch
(``hand-over``, DataLoader's unpickling included) and the loader's own ``unpacking`` of it.

Units: seconds (sums over an epoch); :func:`shares` turns them into fractions of a wall time.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import IO, Iterator

ENV = "CORPUS_IO_LOADER_PROFILE"

#: the categories in print order, and which chain stage (corpus_io.loader.build.loader_chain names) goes where
GROUPS = {
    "read": "read", "tar parse": "tar parse", "decode": "decode", "resample": "resample",
    "speed_perturb": "resample", "count_frames": "features", "waveform_frames": "features", "fbank": "features",
    "mfcc": "features", "raw_features": "features", "precomputed_features": "features", "spec_aug": "features",
    "spec_sub": "features", "spec_trim": "features", "filter_length": "filters", "filter_tokens": "filters",
    "tokenize": "filters", "drop_repeated_keys": "filters", "drop_empty": "filters", "enter": "buffers",
    "shuffle": "buffers", "sort": "buffers", "bucket_batch": "buffers", "batch": "batch/pad/collate",
    "shuffle_batches": "batch/pad/collate", "emit": "batch/pad/collate", "pad": "batch/pad/collate",
    "state": "batch/pad/collate", "hand-over": "hand-over", "unpacking": "unpacking", "consumer": "consumer",
}
ORDER = ("read", "tar parse", "decode", "resample", "features", "filters", "buffers", "batch/pad/collate",
         "hand-over", "unpacking", "consumer")

_CURRENT: Profile | None = None


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


class Profile:
    """Seconds per stage (inclusive of upstream, see the module doc) and the wall time they are shares of."""

    def __init__(self) -> None:
        self.inclusive: Counter = Counter()
        self.own: Counter = Counter()  # seconds that are a stage's alone (read, hand-over, unpacking)
        self.chain: list[str] = []  # stage names, upstream first
        self.start = time.perf_counter()
        self.handed = self.start  # the main process: when the last batch arrived

    def stage(self, samples: Iterator, name: str) -> Iterator:
        """``samples`` with the seconds spent producing each item added to ``name`` (inclusive)."""
        self.chain.append(name)
        return self._timed(samples, name)

    def _timed(self, samples: Iterator, name: str) -> Iterator:
        it = iter(samples)
        clock = time.perf_counter
        while True:
            t = clock()
            try:
                item = next(it)
            except StopIteration:
                self.inclusive[name] += clock() - t
                return
            self.inclusive[name] += clock() - t
            yield item

    def reader(self, f: IO[bytes]) -> IO[bytes]:
        """``f`` with the seconds of its ``read()`` calls added to ``read``."""
        return _TimedFile(f, self.own)

    def add(self, name: str, seconds: float) -> None:
        self.own[name] += seconds

    def totals(self, rest: str | None = None) -> dict[str, float]:
        """Own seconds per category, and ``wall`` (seconds since this profile started); ``rest``: the category
        that gets the wall time no timer saw."""
        out: Counter = Counter()
        upstream = 0.0
        for name in self.chain:
            out[GROUPS.get(name, name)] += self.inclusive[name] - upstream
            upstream = self.inclusive[name]
        out["tar parse"] -= self.own["read"]  # the first stage (the reader) holds the file reads
        for name, seconds in self.own.items():
            out[GROUPS.get(name, name)] += seconds
        wall = time.perf_counter() - self.start
        if rest is not None:
            out[rest] += wall - sum(out.values())
        out["wall"] = wall
        return dict(out)


class _TimedFile:
    def __init__(self, f: IO[bytes], own: Counter) -> None:
        self._f, self._own = f, own

    def read(self, *args):
        t = time.perf_counter()
        try:
            return self._f.read(*args)
        finally:
            self._own["read"] += time.perf_counter() - t

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def start() -> Profile | None:
    """A new profile for this process's loader iteration when profiling is on (else None)."""
    global _CURRENT
    _CURRENT = Profile() if enabled() else None
    return _CURRENT


def current() -> Profile | None:
    return _CURRENT


def shares(totals: dict[str, float]) -> dict[str, float]:
    """Each category's seconds as a fraction of ``totals['wall']`` (categories in :data:`ORDER`, then others)."""
    wall = totals.get("wall") or 1.0
    names = [n for n in ORDER if n in totals] + sorted(n for n in totals if n not in ORDER and n != "wall")
    return {n: totals[n] / wall for n in names}


def merge(parts: list[dict[str, float]]) -> dict[str, float]:
    """Several workers' totals summed (wall too: shares of their summed wall time)."""
    out: Counter = Counter()
    for p in parts:
        out.update(p)
    return dict(out)
