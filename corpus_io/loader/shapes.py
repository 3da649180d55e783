"""The shapes of an epoch's batches: bucket edges every rank and worker shares.

A GPU step costs what its shapes cost: cuDNN plans each new input shape on the CPU, and padding is computed like
speech. So batches are padded to a few lengths, the bucket edges, chosen to waste the least padding on this
corpus's durations (:func:`optimal_edges`). The edges are estimated once, in the process that builds the loader,
before any worker starts, from:

* the user's ``dataset_conf.bucket_edges`` (seconds), when given;
* else every utterance's duration, from the shard index's ``durations`` (pack-shards writes them; Shar and
  parquet index entries too), held as a histogram in 10 ms steps (memory flat in the corpus size);
* else the first ``dataset_conf.bucket_sample`` utterances of each list (a raw list's records or audio headers,
  an older index's first shards' metadata).

With ``speed_perturb`` the histogram is the mix of every speed's durations, so the top edge holds the longest
utterance slowed down. Every rank computes the same edges from the same lists.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator

from corpus_io.config import DatasetConf
from corpus_io.errors import ConfigError, DataError
from corpus_io.loader.read import ReadOptions, Source

log = logging.getLogger("corpus_io.loader")

#: histogram step of the durations (seconds): one 10 ms frame
STEP = 0.01
#: edges are chosen among at most this many candidate lengths (quantiles of the histogram)
CANDIDATES = 400


def _steps(seconds: float) -> int:
    """``seconds`` as whole histogram steps, rounded up (an edge covers the utterance)."""
    return max(1, math.ceil(seconds / STEP - 1e-6))


def optimal_edges(histogram: Counter, num_buckets: int) -> list[float]:
    """At most ``num_buckets`` ascending upper edges (seconds) that minimise the padding of batches padded to
    their bucket's edge: ``sum(edge(d) - d)`` over the ``histogram`` (duration step -> count). The last edge is
    the longest duration. Exact dynamic programming over at most :data:`CANDIDATES` candidate edges (the
    histogram's quantiles), O(num_buckets x CANDIDATES^2) in numpy."""
    import numpy as np

    if not histogram:
        return []
    values = np.array(sorted(histogram), dtype=np.float64)
    counts = np.array([histogram[int(v)] for v in values], dtype=np.float64)
    cum = np.cumsum(counts)
    if len(values) > CANDIDATES:  # candidates at count quantiles, and always the longest
        at = np.searchsorted(cum, np.linspace(0, cum[-1], CANDIDATES + 1)[1:], side="left")
        keep = np.unique(np.append(np.clip(at, 0, len(values) - 1), len(values) - 1))
    else:
        keep = np.arange(len(values))
    cand = values[keep]
    # n[j], s[j]: how many utterances, and their steps summed, lie at or below candidate j
    s_all = np.cumsum(counts * values)
    n, s = np.concatenate([[0.0], cum[keep]]), np.concatenate([[0.0], s_all[keep]])
    m = len(cand)
    # cost[i, j]: padding of one bucket holding the utterances in (cand[i-1], cand[j]] (i <= j), padded to cand[j]
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    cost = np.where(i <= j, cand[j] * (n[j + 1] - n[i]) - (s[j + 1] - s[i]), np.inf)
    k_max = min(num_buckets, m)
    best = cost[0].copy()  # best[j]: least padding of k buckets covering everything up to cand[j]
    starts = []  # starts[k - 2][j]: where the k-th (last) bucket of that best starts (a candidate index)
    for _ in range(1, k_max):
        total = np.concatenate([[np.inf], best[:-1]])[:, None] + cost  # the last bucket starts at cand[i], i >= 1
        arg = np.argmin(total, axis=0)
        starts.append(arg)
        best = total[arg, np.arange(m)]
    edges, j = [cand[m - 1]], m - 1
    for arg in reversed(starts):  # walk back from the longest utterance
        j = int(arg[j]) - 1
        edges.append(cand[j])
    return sorted({round(float(e) * STEP, 2) for e in edges})


def duration_histogram(sources: list[Source], conf: DatasetConf, opts: ReadOptions, *, train: bool) -> Counter:
    """Steps (10 ms) -> utterances, over every source (see the module doc); speed perturbation mixed in."""
    hist: Counter = Counter()
    for source in sources:
        for seconds in _durations(source, conf, opts):
            hist[_steps(seconds)] += 1
    if train and conf.speed_perturb and hist:
        speeds = [float(s) for s in conf.speed_perturb_conf.speeds]
        mixed: Counter = Counter()
        for step, count in hist.items():
            for speed in speeds:  # each speed is drawn about as often: every step keeps its weight per speed
                mixed[_steps(step * STEP / speed)] += count
        hist = mixed
    return hist


def _durations(source: Source, conf: DatasetConf, opts: ReadOptions) -> Iterator[float]:
    if source.data_type == "shard":
        from corpus_io.shards.index import index_durations, index_path_for

        listed = set(source.urls)
        found: dict[str, list[float] | None] = {}
        for path, seconds in index_durations(source.data_list, storage_options=conf.storage_options or None,
                                             listed=source.urls):
            if path in listed:
                found[path] = seconds
        with_durations = [u for u in source.urls if found.get(u) is not None]
        if with_durations and len(with_durations) == len(source.urls):
            for url in source.urls:
                yield from found[url]  # type: ignore[misc]
            return
        lacking = next((u for u in source.urls if u in found and found[u] is None), None)
        if with_durations and lacking is not None:
            raise DataError(f"{index_path_for(source.data_list)}: the entry of shard {lacking} (entry "
                            f"{source.urls.index(lacking) + 1} of {source.data_list}) has no 'durations', while "
                            f"the entry of {with_durations[0]} has them: the bucket edges would come from a part of "
                            f"the corpus. Regenerate the index with the command that wrote it (pack-shards into the "
                            f"same output_dir; make-datalist for Lhotse Shar and parquet lists) so that every entry "
                            f"records them.")
        yield from _first_shards(source, conf, opts)  # an older index (no durations), or shards it does not list
        return
    yield from _first_raw(source, conf)


def _first_shards(source: Source, conf: DatasetConf, opts: ReadOptions) -> Iterator[float]:
    """Durations of the first ``bucket_sample`` utterances of the list's shards (an index without ``durations``:
    written before they were recorded, or by hand), from each member's audio header as the loader reads it."""
    from corpus_io.audio.io import probe_bytes
    from corpus_io.loader.read import read_shard_unit

    left, counts = int(conf.bucket_sample), Counter()
    for url in source.urls:
        found: list[float] = []
        try:
            for sample in read_shard_unit(url, opts, counts):
                audio = sample.get("audio")
                seconds = _record_seconds(sample, partial(probe_bytes, bytes(audio), url)) if audio is not None \
                    else None
                if seconds is not None:
                    found.append(seconds)
                    if len(found) >= left:
                        break
        except (DataError, OSError):
            pass  # a sample of durations: the loader's own read reports a broken shard, as configured
        yield from found
        left -= len(found)
        if left <= 0:
            return


def _first_raw(source: Source, conf: DatasetConf) -> Iterator[float]:
    """Durations of the first ``bucket_sample`` entries of a raw list: a record's ``duration`` (seconds) or
    ``source_len`` (10 ms frames, FunASR), else its audio header."""
    from corpus_io.audio.io import probe

    raw = source.raw
    assert raw is not None
    try:
        for i in range(min(len(raw), int(conf.bucket_sample))):
            try:
                record = raw.record(i)
            except DataError:
                continue
            seconds = _record_seconds(record, partial(probe, str(record.get("source"))))
            if seconds is not None:
                yield seconds
    finally:
        raw.close()  # the loader's workers fork from this process: they must not share its file offsets


def _record_seconds(record: dict, header: Any) -> float | None:
    """An entry's seconds: a Kaldi segment's span, its ``duration``, its ``source_len`` (10 ms frames), else its
    audio header (None when none of them is readable)."""
    if isinstance(record.get("end"), (int, float)) and record["end"] > 0:
        return float(record["end"]) - float(record.get("start") or 0.0)
    seconds = record.get("duration")
    if not isinstance(seconds, (int, float)) and isinstance(record.get("source_len"), int):
        seconds = record["source_len"] / 100.0
    if not isinstance(seconds, (int, float)):
        try:
            info = header()
            seconds = info.num_samples / info.sample_rate if info.sample_rate else None
        except (DataError, OSError, KeyError, ValueError):
            seconds = None
    return float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None


@dataclass
class BucketPlan:
    """A loader's buckets (:func:`bucket_plan`): ``edges`` (seconds, ascending; None: learnt per worker),
    ``shares`` (each bucket's share of the utterances, for ``sync_buckets``; None: not synced), ``sizes`` (the
    user's ``bucket_batch_size``, one per edge, or None) and ``longest`` (seconds: the longest utterance
    measured, None when nothing was)."""

    edges: list[float] | None = None
    shares: list[float] | None = None
    sizes: list[int] | None = None
    longest: float | None = None


def capped(edges: list[float], longest: float) -> int:
    """How many of the ascending ``edges`` stay below ``longest`` (seconds): the edges at and above it are one
    bucket, whose edge is ``longest`` (a batch is never padded beyond the longest utterance)."""
    import bisect

    return bisect.bisect_left(edges, longest - 1e-9)


def bucket_plan(sources: list[Source], conf: DatasetConf, opts: ReadOptions, *, train: bool) -> BucketPlan:
    """The buckets of a loader over ``sources`` (:class:`BucketPlan`): the edges (the user's, or estimated: module
    doc) and each bucket's share of the utterances (the user's, or from the durations). A top edge above the
    longest utterance measured (the index's durations, or the sampled ones; slowed by speed perturbation) becomes
    that utterance's length: padding, and memory, stay bounded by the data whatever edge is given; the shares and
    per-bucket batch sizes of the edges it replaces go to it. Empty when bucketing is off or nothing could be
    measured for estimated edges (the buckets then learn edges per worker)."""
    if not conf.bucketing:
        return BucketPlan()
    given = sorted(float(e) for e in conf.bucket_edges) if conf.bucket_edges else None
    hist = duration_histogram(sources, conf, opts, train=train)
    longest = round(max(hist) * STEP, 2) if hist else None
    if given is None and not hist:
        log.warning("no utterance durations to estimate bucket edges from (no index durations, no readable "
                    "header): each loader worker estimates its own from its first samples, so batches take more "
                    "shapes. Pack the list with pack-shards, or give ++dataset_conf.bucket_edges=[...] (seconds).")
        return BucketPlan()
    sizes = [int(x) for x in conf.bucket_batch_size] if conf.bucket_batch_size else None
    shares = [float(x) for x in conf.bucket_shares] if conf.bucket_shares else None
    if given is not None and longest is not None and capped(given, longest) < len(given):
        keep = capped(given, longest)
        if given[keep] > longest:
            log.info("bucket edge %g s is above the longest utterance (%g s): its batches are padded to %g s, and "
                     "the %d edge(s) above it are not used", given[keep], longest, longest, len(given) - keep - 1)
        given = given[:keep] + [longest]
        sizes = sizes[:keep + 1] if sizes else None
        shares = shares[:keep] + [sum(shares[keep:])] if shares else None
    edges = given if given is not None else optimal_edges(hist, int(conf.num_buckets))
    if not conf.sync_buckets:
        return BucketPlan(edges, None, sizes, longest)
    if shares:
        return BucketPlan(edges, shares, sizes, longest)
    import bisect

    per_bucket = [0] * len(edges)
    for step, count in hist.items():
        b = bisect.bisect_left(edges, round(step * STEP, 2) - 1e-9)
        if b < len(edges):
            per_bucket[b] += count
    total = sum(per_bucket)
    shares = [n / total for n in per_bucket] if total else [1.0 / len(edges)] * len(edges)
    return BucketPlan(edges, [round(x, 6) for x in shares], sizes, longest)


def check_shares(conf: DatasetConf) -> None:
    """``dataset_conf.bucket_shares``: one per bucket edge, summing to 1 (a ConfigError naming the key otherwise;
    each in [0, 1]: its ``range``); shares of estimated edges cannot be given, their number is not known in
    advance."""
    shares = list(conf.bucket_shares or ())
    if not shares:
        return
    edges = list(conf.bucket_edges or ())
    example = "e.g. ++dataset_conf.bucket_edges=[2,5,10,20] ++dataset_conf.bucket_shares=[0.1,0.4,0.3,0.2]"
    if not edges:
        raise ConfigError(f"dataset_conf.bucket_shares={shares} gives each bucket's share of the utterances, but "
                          f"dataset_conf.bucket_edges is not given: the estimated edges are not known in advance "
                          f"(there may be fewer than num_buckets). Give both lists, of the same length, {example}; "
                          f"or drop bucket_shares (they are then measured with the edges).")
    if len(shares) != len(edges):
        raise ConfigError(f"dataset_conf.bucket_shares gives {len(shares)} shares, one per bucket, but "
                          f"dataset_conf.bucket_edges gives {len(edges)} edges. Give both lists, of the same length, "
                          f"{example}.")
    if abs(sum(shares) - 1.0) > 1e-3:
        raise ConfigError(f"dataset_conf.bucket_shares={shares} sums to {sum(shares):g}, not 1: they are the "
                          f"buckets' shares of the utterances. Give shares that sum to 1, {example}.")


def edge_frames(edges: list[float], conf: DatasetConf) -> list[int]:
    """Bucket edges in the loader's length unit: feature frames (fbank/mfcc: Kaldi's count at the resampled
    rate; precomputed: 10 ms frames), or samples (``feats_type=raw``)."""
    rate = int(conf.resample_conf.resample_rate)
    if conf.feats_type == "raw":
        return [int(round(e * rate)) for e in edges]
    if conf.feats_type == "precomputed":
        return [int(round(e * 100)) for e in edges]
    from corpus_io.audio.features import num_frames

    frames = conf.fbank_conf if conf.feats_type == "fbank" else conf.mfcc_conf
    return [max(1, num_frames(int(round(e * rate)), rate, frames.frame_length, frames.frame_shift,
                              getattr(frames, "snip_edges", True))) for e in edges]


def describe(edges: list[float] | None) -> str:
    if not edges:
        return "bucket edges: learnt per worker from its first samples"
    shown = ", ".join(f"{e:g}" for e in edges)
    return f"bucket edges ({len(edges)}, seconds; each batch padded to its bucket's edge): {shown}"


def summary(widths: Counter, real: float, padded: float) -> dict[str, Any]:
    """An epoch's shapes for its summary: distinct padded lengths and the padding share."""
    return {"shapes": len(widths), "padding": (1.0 - real / padded) if padded else 0.0}
