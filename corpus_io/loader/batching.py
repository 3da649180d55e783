"""Batch budgets, duration bucketing and padding.

Units. ``source_len`` is the number of feature frames of an utterance (``feats.shape[0]``,
10 ms frames for fbank/mfcc; for a waveform sample of ``feats_on=model``, ``frames``: what the
device front end will compute); ``target_len`` is its number of tokens (``len(tokens)``).

``batch_type`` (FunASR names, WeNet semantics):

* ``example``: a batch holds ``batch_size`` utterances.
* ``length``: padded input frames: ``max(source_len) * n <= batch_size`` (frames).
* ``token``: ``max(source_len + target_len) * n <= batch_size`` (frames + tokens).

For ``length``/``token``, ``max_batch_size`` caps ``n`` (utterances). An utterance whose
own cost is over the budget forms a batch of one: it is counted in ``counts`` under
``batch.over_budget``, never dropped.

Determinism: every function here is a plain generator whose output depends only on its
arguments and the order of its input. Nothing here draws random numbers: a random order of
batches comes from a :func:`batch_order` key passed in.

Blocks: samples marked :data:`CARRIED` (the rest of the previous epoch, read first after DDP ranks
stopped it unevenly: corpus_io.loader.elastic) come first and never share a shuffle, sort or bucket
buffer with the others, so they fill the first batches (the last of them topped up with the epoch's
own first samples); a sample marked :data:`BLOCK_END` (the last of a sort block, when the batches of
a block are shuffled) closes its batch.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections import Counter
from typing import Callable, Iterable, Iterator, Sequence

BATCH_TYPES = ("example", "length", "token")
Lengths = Callable[[dict], "tuple[int, int]"]

#: sample key: the sample is part of the previous epoch's rest, carried into this one and batched first
CARRIED = "__carried__"
#: sample key: the last sample of a sort block (its batch closes there)
BLOCK_END = "__block_end__"


def carried(sample: dict) -> bool:
    return bool(sample.get(CARRIED))


def batch_order(seed: int, epoch: int, rank: int, worker: int) -> Callable[[list[dict]], bytes]:
    """A sort key that puts batches in a seeded random order, new every epoch: a keyed hash of each batch's first
    utterance key. Unlike the buffers' generator (seeded by the read position too), it gives the batches a resumed
    reader rebuilds the places they had, so a resume yields the batches an uninterrupted run would have."""
    tag = f"{seed}:{epoch}:{rank}:{worker}:".encode()

    def order(batch: list[dict]) -> bytes:
        return hashlib.blake2b(tag + str(batch[0].get("key")).encode(), digest_size=8).digest()

    return order


def runs(samples: Iterable[dict]) -> Iterator[Iterator[dict]]:
    """``samples`` cut where :func:`carried` changes (lazily): a buffer never mixes the carried rest of the last
    epoch with this epoch's samples."""
    for _, run in itertools.groupby(samples, key=carried):
        yield run


def sample_lengths(sample: dict) -> tuple[int, int]:
    """``(source_len, target_len)``: feature frames (``frames``, the device front end's count, for a
    waveform sample; else ``feats.shape[0]``) and tokens of a sample dict."""
    frames = sample["frames"] if "frames" in sample else sample["feats"].shape[0]
    return int(frames), len(sample.get("tokens", ()))


class Budget:
    """Does a batch of ``n`` utterances with these maxima fit? (see the module docstring for units)."""

    def __init__(self, batch_type: str, batch_size: int, max_batch_size: int = 200) -> None:
        if batch_type not in BATCH_TYPES:
            raise ValueError(f"batch_type must be one of {BATCH_TYPES}, got {batch_type!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_type = batch_type
        self.batch_size = batch_size
        self.max_batch_size = batch_size if batch_type == "example" else max(1, max_batch_size)

    def cost(self, source_len: int, target_len: int) -> int:
        """Per-utterance padded unit: 1 (example), frames (length) or frames + tokens (token)."""
        if self.batch_type == "example":
            return 1
        if self.batch_type == "length":
            return source_len
        return source_len + target_len

    def fits(self, max_cost: int, n: int) -> bool:
        if n > self.max_batch_size:
            return False
        return self.batch_type == "example" or max_cost * n <= self.batch_size


class _Open:
    """A batch being filled: its samples and its largest cost."""

    __slots__ = ("items", "max_cost")

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.max_cost = 0


def _add(open_batch: _Open, sample: object, cost: int, budget: Budget, counts: Counter | None) -> list | None:
    """Add ``sample``; return the batch it closed (the one before it) when it does not fit."""
    closed = None
    if open_batch.items and not budget.fits(max(open_batch.max_cost, cost), len(open_batch.items) + 1):
        closed = open_batch.items
        open_batch.items, open_batch.max_cost = [], 0
    if not open_batch.items and not budget.fits(cost, 1) and counts is not None:
        counts["batch.over_budget"] += 1
    open_batch.items.append(sample)
    open_batch.max_cost = max(open_batch.max_cost, cost)
    return closed


def batch(samples: Iterable[dict], *, batch_type: str = "example", batch_size: int = 16, max_batch_size: int = 200,
          counts: Counter | None = None, lengths: Lengths = sample_lengths) -> Iterator[list[dict]]:
    """Group consecutive samples into batches within the budget (WeNet static/dynamic batching); a batch
    also closes after a :data:`BLOCK_END` sample."""
    budget = Budget(batch_type, batch_size, max_batch_size)
    yield from _group(samples, budget, counts, lambda s: budget.cost(*lengths(s)), closes=lambda s: s.get(BLOCK_END))


def _group(items: Iterable, budget: Budget, counts: Counter | None, cost: Callable[[object], int],
           closes: Callable[[object], object] = lambda item: False) -> Iterator[list]:
    """Consecutive ``items`` in batches within ``budget``; a batch also closes after an item ``closes``."""
    current = _Open()
    for item in items:
        closed = _add(current, item, cost(item), budget, counts)
        if closed:
            yield closed
        if closes(item):
            yield current.items
            current = _Open()
    if current.items:
        yield current.items


def quantile_boundaries(costs: Sequence[float], num_buckets: int) -> list[float]:
    """``num_buckets - 1`` upper bucket edges at equal-count quantiles of ``costs`` (sorted, unique)."""
    if not costs or num_buckets <= 1:
        return []
    ordered = sorted(costs)
    edges = {ordered[min(len(ordered) - 1, (i * len(ordered)) // num_buckets)] for i in range(1, num_buckets)}
    return sorted(edges)


def geometric_boundaries(min_cost: float, max_cost: float, num_buckets: int) -> list[float]:
    """``num_buckets - 1`` edges growing by a constant ratio from ``min_cost`` to ``max_cost``."""
    lo, hi = max(1.0, float(min_cost)), max(float(min_cost) + 1.0, float(max_cost))
    ratio = (hi / lo) ** (1.0 / num_buckets)
    return [lo * ratio ** i for i in range(1, num_buckets)]


def bucket_batch(samples: Iterable[dict], *, batch_type: str = "token", batch_size: int = 16,
                 max_batch_size: int = 200, num_buckets: int = 30, boundaries: Sequence[float] | None = None,
                 pad_to_edge: bool = False, bucket_batch_size: Sequence[int] | None = None,
                 bucket_shares: Sequence[float] | None = None, seed: int = 0, epoch: int = 0, warmup: int = 1000,
                 bucket_batches: int = 4, shuffle_batches: bool = False,
                 batch_order: Callable[[list[dict]], bytes] | None = None, counts: Counter | None = None,
                 lengths: Lengths = sample_lengths) -> Iterator[list[dict]]:
    """Duration bucketing: batches are cut from length buckets, so an utterance is batched with
    utterances of about its own length.

    Each sample joins the buffer of its bucket (by cost: frames, or frames + tokens for
    ``token``; frames for ``example``). When a bucket holds ``bucket_batches`` budgets' worth,
    it is sorted by that key and cut greedily into batches; all but the last (possibly partial)
    batch are emitted, the last stays in the bucket. At the end every bucket is sorted and
    emitted in bucket order.

    Edges: ``boundaries`` (ascending upper edges, e.g. from the data list's index), else
    the equal-count quantiles of the first ``warmup`` samples, which are held until then and
    bucketed in arrival order. Memory: ``warmup`` samples, then ``num_buckets *
    bucket_batches`` batches at most.

    ``pad_to_edge`` (with ``boundaries``, frames, the last one the top edge): the few-shapes mode. A batch of
    bucket ``b`` is a :class:`Batch` padded to ``boundaries[b]`` frames, and the budget counts that width, so
    an epoch has at most ``len(boundaries) + 1`` padded lengths (the one more: batches of utterances above the
    top edge, padded to their longest). A bucket's batch leaves as soon as it is full (nothing to sort: every
    utterance of it is padded to the same edge); memory: one batch per bucket. ``bucket_batch_size``: each
    bucket's own ``batch_size`` (one per edge). ``bucket_shares`` (each bucket's share of the utterances): the
    buckets take turns by a schedule every reader computes alike (:func:`_synced`), so DDP ranks draw the same
    bucket at each step.

    ``shuffle_batches`` (with ``batch_order``): the batches of the final emptying leave in that random order
    instead of bucket order, so a stream cut short (uneven DDP ranks) does not always lose its longest bucket.
    Samples :func:`carried` from the last epoch are bucketed on their own, first (edges of their own).
    """
    order = batch_order if shuffle_batches else None
    if pad_to_edge and boundaries:
        sizes = list(bucket_batch_size) if bucket_batch_size else [batch_size] * len(boundaries)
        budgets = [Budget(batch_type, size, max_batch_size) for size in sizes + [batch_size]]  # + above the top
        edges = [int(e) for e in boundaries]
        shares = _batch_shares(bucket_shares, edges, budgets) if bucket_shares else None
        turns = Turns(shares) if shares else None
        for run in runs(samples):
            first = next(run, None)
            if first is None:
                continue
            run = itertools.chain([first], run)
            if turns is not None and carried(first):  # see _carried_in_step
                yield from _carried_in_step(run, budgets[-1], edges, counts, lengths, turns)
                continue
            yield from _edge_run(run, budgets=budgets, edges=edges, order=order, counts=counts, lengths=lengths,
                                 turns=turns, tail=f"{seed}:{epoch}:{shuffle_batches}")
        return
    for run in runs(samples):
        yield from _bucket_run(run, batch_type=batch_type, batch_size=batch_size, max_batch_size=max_batch_size,
                               num_buckets=num_buckets, boundaries=boundaries, warmup=warmup,
                               bucket_batches=bucket_batches, order=batch_order if shuffle_batches else None,
                               counts=counts, lengths=lengths)


def _bucket_run(samples: Iterable[dict], *, batch_type: str, batch_size: int, max_batch_size: int, num_buckets: int,
                boundaries: Sequence[float] | None, warmup: int, bucket_batches: int,
                order: Callable[[list[dict]], bytes] | None, counts: Counter | None,
                lengths: Lengths) -> Iterator[list[dict]]:
    budget = Budget(batch_type, batch_size, max_batch_size)
    full = Budget(batch_type, batch_size * bucket_batches, max_batch_size * bucket_batches)
    bucket_cost = Budget("length" if batch_type == "example" else batch_type, 1)
    held: list[tuple[dict, int, int]] = []
    edges: list[float] | None = list(boundaries) if boundaries is not None else None
    buckets: list[_Open] = []

    def cut(bucket: _Open, final: bool) -> Iterator[list[dict]]:
        # sorted by the bucket key (frames; frames + tokens for token): for batch_type=example the
        # budget cost is 1 per utterance, so sorting by cost would leave the bucket in arrival order
        bucket.items.sort(key=lambda item: item[2])
        batches = list(_group(bucket.items, budget, counts, lambda item: item[1]))
        bucket.items = [] if final else batches.pop()
        bucket.max_cost = max((item[1] for item in bucket.items), default=0)
        for b in batches:
            yield [item[0] for item in b]

    def place(sample: dict, cost: int, key: float) -> Iterator[list[dict]]:
        bucket = buckets[bisect.bisect_left(edges, key)]
        if bucket.items and not full.fits(max(cost, bucket.max_cost), len(bucket.items) + 1):
            yield from cut(bucket, final=False)
        bucket.items.append((sample, cost, key))
        bucket.max_cost = max(bucket.max_cost, cost)

    for sample in samples:
        src, tgt = lengths(sample)
        held.append((sample, budget.cost(src, tgt), bucket_cost.cost(src, tgt)))
        if edges is None:
            if len(held) < warmup:
                continue
            edges = quantile_boundaries([k for _, _, k in held], num_buckets)
        if not buckets:
            buckets = [_Open() for _ in range(len(edges) + 1)]
        for queued in held:
            yield from place(*queued)
        held = []
    if edges is None:
        edges = quantile_boundaries([k for _, _, k in held], num_buckets)
    if not buckets:
        buckets = [_Open() for _ in range(len(edges) + 1)]
    for queued in held:
        yield from place(*queued)
    last = [b for bucket in buckets for b in cut(bucket, final=True)]
    yield from sorted(last, key=order) if order is not None else last


def _batch_shares(utterance_shares: Sequence[float], edges: list[int], budgets: list[Budget]) -> list[float]:
    """Each bucket's expected batches per utterance: its share of utterances over the utterances a batch of it
    holds (the budget at the bucket's edge)."""
    out = []
    for b, share in enumerate(utterance_shares[:len(edges)]):
        budget = budgets[b]
        per_batch = budget.batch_size if budget.batch_type == "example" else \
            max(1, min(budget.max_batch_size, budget.batch_size // max(1, edges[b])))
        out.append(float(share) / per_batch)
    return out


class Batch(list):
    """A batch (list of samples) with the padded length it is to have: ``frames`` (its bucket's edge; None: its
    longest utterance)."""

    __slots__ = ("frames",)

    def __init__(self, items: Iterable = (), frames: int | None = None) -> None:
        super().__init__(items)
        self.frames = frames


def _edge_run(samples: Iterable[dict], *, budgets: list[Budget], edges: list[int],
              order: Callable[[list[dict]], bytes] | None, counts: Counter | None, lengths: Lengths,
              turns: Turns | None = None, tail: str = "") -> Iterator[Batch]:
    """Batches cut per bucket of ``edges`` (ascending upper edges, frames), each padded to its edge, within its
    bucket's budget (``budgets[b]``; the last: above the top edge). ``turns``: see :func:`_synced`."""
    buckets = [_Open() for _ in range(len(edges) + 1)]

    def located(sample: dict) -> tuple[int, int]:
        src, tgt = lengths(sample)
        b = bisect.bisect_left(edges, src)  # an utterance of exactly an edge's length is in that edge's bucket
        if b == len(edges) and counts is not None:
            counts["batch.above_top_edge"] += 1
        return b, budgets[b].cost(edges[b] if b < len(edges) else src, tgt)

    def edge(b: int) -> int | None:
        return edges[b] if b < len(edges) else None

    if turns is not None:
        yield from _synced(samples, buckets, budgets, located, edge, turns, counts, tail)
        return
    for sample in samples:
        b, cost = located(sample)
        closed = _add(buckets[b], sample, cost, budgets[b], counts)
        if closed:
            yield Batch(closed, edge(b))
    last = [Batch(bucket.items, edge(b)) for b, bucket in enumerate(buckets) if bucket.items]
    yield from sorted(last, key=order) if order is not None else last


class Turns:
    """Whose turn it is among the buckets (:func:`_synced`): next is the bucket furthest below its share of batches,
    so every reader computes the same sequence. One per reader and epoch, shared by its carried rest and its own
    samples: a carried batch takes a turn too, so readers that carried different amounts are in step again once
    the longest rest is trained."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = [max(0.0, float(w)) for w in weights]
        self.buckets = [b for b, w in enumerate(self.weights) if w > 0]
        self.emitted: Counter = Counter()

    def due(self) -> int:
        return min(self.buckets, key=lambda b: ((self.emitted[b] + 1) / self.weights[b], b))

    def taken(self, b: int | None = None) -> None:
        """Bucket ``b`` (None: the due one) took its turn."""
        self.emitted[self.due() if b is None else b] += 1


def _carried_in_step(samples: Iterable[dict], budget: Budget, edges: list[int], counts: Counter | None,
                     lengths: Lengths, turns: Turns) -> Iterator[Batch]:
    """The last epoch's rest under synchronised buckets: sorted by length and cut by the plain budget, each batch
    padded to the edge above its longest. Each batch takes a turn of ``turns``: ranks carry different amounts, and
    once the longest rest is trained every reader is at the same turn again."""
    items = sorted(samples, key=lambda sample: lengths(sample)[0])
    for group in _group(items, budget, counts, lambda sample: budget.cost(*lengths(sample))):
        longest = max(lengths(sample)[0] for sample in group)
        b = bisect.bisect_left(edges, longest)
        if turns.buckets:
            turns.taken()
        yield Batch(group, edges[b] if b < len(edges) else None)


def _synced(samples: Iterable[dict], buckets: list[_Open], budgets: list[Budget],
            located: Callable[[dict], tuple[int, int]], edge: Callable[[int], int | None], turns: Turns,
            counts: Counter | None, tail: str = "") -> Iterator[Batch]:
    """Synchronised buckets: the n-th batch of every reader (rank x worker) comes from the same bucket.

    The buckets take turns by a schedule every reader computes alike: next is the bucket furthest below its share
    of batches (``shares[b]``: the expected batches of bucket ``b`` per batch, from the corpus's durations), so
    DDP ranks step on batches of one padded length and about one size. Full batches of other buckets wait for
    their turn. When the readers hold more than one batch per bucket, the due bucket leaves with what it has
    (a smaller batch of the same length); only when it has nothing does the fullest bucket go out of turn
    (counted as ``batch.unsynced``). Utterances above the top edge leave when their batch is full, out of turn.
    At the end the buckets are emptied one by one, in an order drawn from ``tail`` (seed and epoch: the same on
    every rank).
    """
    from collections import deque

    ready: list[deque] = [deque() for _ in buckets]
    held = 0
    cap = sum(max(1, budgets[b].max_batch_size if budgets[b].batch_type != "example" else budgets[b].batch_size)
              for b in turns.buckets)  # one batch per bucket: what num_buckets' help promises

    def take(b: int, in_turn: bool = True) -> Batch:
        nonlocal held
        if ready[b]:
            items = ready[b].popleft()
        else:
            items, buckets[b].items, buckets[b].max_cost = buckets[b].items, [], 0
        held -= len(items)
        if in_turn:  # out of turn: the schedule goes on as on the other readers
            turns.taken(b)
        return Batch(items, edge(b))

    for sample in samples:
        b, cost = located(sample)
        closed = _add(buckets[b], sample, cost, budgets[b], counts)
        held += 1
        if closed:
            if b in turns.buckets:
                ready[b].append(closed)
            else:  # above the top edge: out of turn
                held -= len(closed)
                if counts is not None:
                    counts["batch.unsynced"] += 1
                yield Batch(closed, edge(b))
        while turns.buckets and ready[turns.due()]:
            yield take(turns.due())
        if turns.buckets and held > cap:
            b = turns.due()
            if buckets[b].items:
                yield take(b)
            else:
                b = max(range(len(buckets)), key=lambda k: (sum(map(len, ready[k])) + len(buckets[k].items), -k))
                if counts is not None:
                    counts["batch.unsynced"] += 1
                yield take(b, in_turn=False)
    # the rest, bucket by bucket in an order drawn from (seed, epoch): the same on every rank, new every epoch, so
    # the batches ranks ending unevenly leave are not always the longest
    last = sorted(range(len(buckets)), key=lambda b: hashlib.blake2b(f"{tail}:{b}".encode(), digest_size=8).digest())
    for b in last:
        while ready[b] or buckets[b].items:
            yield take(b, in_turn=False)


#: counts of how utterances were batched (not drops): what each means
BATCHING_COUNTS = {
    "batch.above_top_edge": "above the top bucket edge (batched apart, padded to their own length)",
    "batch.over_budget": "over the batch budget (batched alone)",
    "batch.unsynced": "batches out of the bucket schedule",
}


def split_counts(counts: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """``(dropped, batched)``: a loader's counts split into what it dropped (or read again, or retried) and how it
    batched utterances it kept (``batch.*``, :data:`BATCHING_COUNTS`): an utterance above the top edge is trained,
    not dropped."""
    batched = {k: v for k, v in counts.items() if k.startswith("batch.")}
    return {k: v for k, v in counts.items() if k not in batched}, batched


def describe_batched(batched: dict[str, int]) -> str:
    """``batched: 3 above the top bucket edge (...)``, or empty when nothing was batched apart."""
    if not batched:
        return ""
    return "batched: " + ", ".join(f"{v} {BATCHING_COUNTS.get(k, k)}" for k, v in sorted(batched.items()))


def padding_ratio(source_lens: Sequence[int]) -> float:
    """Padding frames / all frames of the padded (B, T) tensor."""
    if not source_lens:
        return 0.0
    total = max(source_lens) * len(source_lens)
    return (total - sum(source_lens)) / total if total else 0.0


def segment_of(sample: dict) -> list | None:
    """``[recording id, start seconds]`` of a raw segment sample (None for a whole recording). The recording id is
    the line's ``recording_id`` or ``recording`` field, else the audio file's name without its extension (Kaldi
    recipes name recordings so; the fixture's ``long`` is ``wav/long.wav``)."""
    if "start" not in sample:
        return None
    meta = sample.get("meta") or {}
    reco = meta.get("recording_id") or meta.get("recording")
    if not isinstance(reco, str) or not reco:
        source = str(meta.get("source") or meta.get("wav") or sample["key"])
        reco = source.rstrip("/").rsplit("/", 1)[-1].split("//")[-1]
        reco = reco.rsplit(".", 1)[0] if "." in reco else reco
    return [reco, float(sample["start"])]


#: token targets are padded to a multiple of this (tensor-core friendly, few shapes)
TARGET_MULTIPLE = 8


def padded_units(tokens: list) -> int:
    """The padded token length of a batch: its longest target rounded up to :data:`TARGET_MULTIPLE` (at least one
    multiple)."""
    longest = max((len(t) for t in tokens), default=0)
    return max(TARGET_MULTIPLE, -(-longest // TARGET_MULTIPLE) * TARGET_MULTIPLE)


def pad(samples: list[dict], *, frame_shift: float = 0.01, frame_length_ms: float = 25.0,
        frame_shift_ms: float = 10.0, snip_edges: bool = True) -> dict:
    """The batch dict of docs/DEVELOPING.md from a list of samples with ``feats`` (and ``tokens``).

    ``feats`` (B, T, D) float32, zero padded; ``feats_lengths`` (B,) int64 frames; ``target``
    (B, U) int64 padded with -1 (U: the longest target rounded up to a multiple of 8); ``target_lengths`` (B,);
    ``audio_seconds`` = sum of
    ``feats_lengths`` * ``frame_shift`` (seconds per frame); ``padding_ratio`` = padding
    frames / (B * T); ``txt`` the transcripts as read (None where a sample has none: decode scores
    these, not the token ids); ``segments`` (only when a sample is a raw segment: per row ``[recording id, start
    seconds]`` or None, :func:`segment_of`). Batch order is kept.

    Waveform samples (``wav`` + ``frames``, feats_on=model) give ``wav`` (B, N) zero padded (int16
    when every row is int16, else float32 in [-1, 1]), ``wav_lengths`` (B,) samples, ``sample_rate``
    (Hz), ``feats_lengths`` = the frames the front end will compute, and ``audio_seconds`` from the
    samples; no ``feats``; ``augment`` (a list: each row's drawn reverberation/noise/gain or None) when the
    loader drew waveform augmentation for the device.

    A :class:`Batch` with ``frames`` is padded to that many frames (its bucket's edge), not to its longest row:
    a waveform batch to the most samples that give that many frames (``frame_length_ms``/``frame_shift_ms``,
    Kaldi's count, ``snip_edges`` as the features). ``padding_ratio`` counts that padding too.
    """
    import torch

    if not samples:
        raise ValueError("pad() needs at least one sample")
    waveform = "feats" not in samples[0]
    if waveform:
        rows = [s["wav"].reshape(-1) for s in samples]
        if len({r.dtype for r in rows}) > 1:  # int16 rows join float rows at their [-1, 1] scale
            rows = [r.float() / 32768.0 if r.dtype == torch.int16 else r for r in rows]
    else:
        rows = [s["feats"] for s in samples]
    # feats of int16 samples (feats_type=raw after an int16 decode) are k / 32768: scaled as they are written
    int16 = [r.dtype == torch.int16 for r in rows] if not waveform else [False]
    pcm = all(int16)
    if any(int16) and not pcm:  # int16 rows join float rows at their scale
        rows = [r.float() * (1.0 / 32768.0) if r.dtype == torch.int16 else r for r in rows]
    tokens = [s.get("tokens") or [] for s in samples]
    width = max(r.shape[0] for r in rows)
    edge = getattr(samples, "frames", None)
    if edge is not None:
        if waveform:
            from corpus_io.audio.features import window_geometry

            window, hop, _ = window_geometry(int(samples[0]["sample_rate"]), frame_length_ms, frame_shift_ms)
            # the most samples that give ``edge`` frames: every row fits
            edge = edge * hop + window - 1 if snip_edges else (edge + 1) * hop - 1 - hop // 2
        width = max(width, int(edge))
    shared = _shared_batch(rows, tokens, pcm=pcm, width=width)
    if shared is not None:
        padded, row_lengths, target, target_lengths = shared
    else:
        row_lengths = torch.tensor([f.shape[0] for f in rows], dtype=torch.int64)
        if pcm:
            rows = [r.float() * (1.0 / 32768.0) for r in rows]
        padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0.0)
        if padded.shape[1] < width:
            padded = torch.nn.functional.pad(padded, (0, 0) * (padded.dim() - 2) + (0, width - padded.shape[1]))
        target_lengths = torch.tensor([len(t) for t in tokens], dtype=torch.int64)
        target = torch.full((len(samples), padded_units(tokens)), -1, dtype=torch.int64)
        for i, t in enumerate(tokens):
            if t:
                target[i, :len(t)] = torch.as_tensor(t, dtype=torch.int64)
    batch: dict = {"keys": [s["key"] for s in samples], "txt": [s.get("txt") for s in samples]}
    if any("start" in s for s in samples):  # raw segments: where each lies in its recording (decode's times)
        batch["segments"] = [segment_of(s) for s in samples]
    if waveform:
        rate = int(samples[0]["sample_rate"])
        feats_lengths = torch.tensor([int(s["frames"]) for s in samples], dtype=torch.int64)
        batch.update(wav=padded, wav_lengths=row_lengths, sample_rate=rate, feats_lengths=feats_lengths)
        if any("augment" in s for s in samples):  # drawn in the loader, applied by the device front end
            batch["augment"] = [s.get("augment") for s in samples]
        if any("draws" in s for s in samples):  # what was drawn (bench-loader ++dump_audio_dir writes it)
            batch["draws"] = [s.get("draws") for s in samples]
        seconds = float(row_lengths.sum()) / rate
    else:
        feats_lengths = row_lengths
        batch.update(feats=padded, feats_lengths=feats_lengths)
        seconds = float(feats_lengths.sum()) * frame_shift
    real = row_lengths.tolist()
    batch.update(target=target, target_lengths=target_lengths, audio_seconds=seconds,
                 padding_ratio=1.0 - sum(real) / (len(real) * width) if width else 0.0)
    return batch


def _shared_batch(feats: list, tokens: list, *, pcm: bool = False, width: int | None = None) -> tuple | None:
    """In a DataLoader worker: the four batch tensors as views of one shared-memory block.

    A worker hands every tensor of a batch to the main process through shared memory; letting
    DataLoader do it creates one shm segment per tensor and copies each tensor into it (~2 ms per
    batch of 16 at 80-dim fbank, as much as the fbank of one utterance). Writing the padded
    values straight into one segment (what DataLoader's own collate does for its stacks) saves the
    copies and three of the four segments. Same values, shapes and dtypes as the plain path;
    None outside a worker or for mixed feature dtypes/dims (the plain path then). ``pcm``: the rows are int16
    samples, written as float32 ``k / 32768`` (cast in the copy, then scaled in one pass over the batch).
    The block is a region of the worker's arena where it has one (:mod:`corpus_io.loader.handover`).
    """
    import torch
    from torch.utils.data import get_worker_info

    from corpus_io.loader import handover

    if get_worker_info() is None:
        return None
    first = feats[0]
    if any(f.dtype != first.dtype or f.shape[1:] != first.shape[1:] or f.device.type != "cpu" for f in feats):
        return None
    n = len(feats)
    lengths = [f.shape[0] for f in feats]
    width = max(max(lengths), width or 0)
    row = 1
    for d in first.shape[1:]:
        row *= int(d)
    dtype = torch.float32 if pcm else first.dtype
    item = dtype.itemsize
    feats_bytes = (n * width * row * item + 7) // 8 * 8
    units = padded_units(tokens)
    storage, at = handover.storage_for(feats_bytes + 8 * (2 * n + n * units))
    padded = torch.empty(0, dtype=dtype).set_(storage, at // item, (n, width, *first.shape[1:]))
    if pcm:  # int16 rows cast and scaled in one pass each, in numpy (a quarter cheaper than torch's indexing)
        import numpy as np

        out, scale = padded.numpy(), np.float32(1.0 / 32768.0)  # exact: a power of two
        for i, f in enumerate(feats):
            np.multiply(f.numpy(), scale, out=out[i, :lengths[i]])
            out[i, lengths[i]:] = 0
    else:
        for i, f in enumerate(feats):
            padded[i, :lengths[i]] = f
            if lengths[i] < width:
                padded[i, lengths[i]:] = 0
    ints = torch.empty(0, dtype=torch.int64).set_(storage, (at + feats_bytes) // 8, (2 * n + n * units,))
    feats_lengths, target_lengths = ints[:n], ints[n:2 * n]
    target = ints[2 * n:].view(n, units)
    feats_lengths.copy_(torch.tensor(lengths, dtype=torch.int64))
    target_lengths.copy_(torch.tensor([len(t) for t in tokens], dtype=torch.int64))
    target.fill_(-1)
    for i, t in enumerate(tokens):
        if t:
            target[i, :len(t)] = torch.as_tensor(t, dtype=torch.int64)
    return padded, feats_lengths, target, target_lengths


def batch_shape(batch: dict) -> tuple[int, int, int]:
    """``(padded length, real frames, padded frames)`` of a padded batch dict: its rows' time axis (samples for a
    waveform batch), the sum of its rows' own lengths, and rows x the padded length (what a GPU computes)."""
    rows, lengths = (batch["wav"], batch["wav_lengths"]) if "wav" in batch else (batch["feats"], batch["feats_lengths"])
    return int(rows.shape[1]), int(lengths.sum()), int(rows.shape[0] * rows.shape[1])


def mean_padding_ratio(batches: Iterable[list[dict]], lengths: Lengths = sample_lengths) -> float:
    """Padding frames / all padded frames over many batches (what a bench reports)."""
    padded = real = 0
    for b in batches:
        src = [lengths(s)[0] for s in b]
        padded += max(src) * len(src)
        real += sum(src)
    return (padded - real) / padded if padded else 0.0


__all__ = ["BATCH_TYPES", "Batch", "Budget", "batch", "batch_shape", "bucket_batch", "describe_batched",
           "geometric_boundaries", "mean_padding_ratio", "pad", "padding_ratio", "quantile_boundaries",
           "sample_lengths", "split_counts"]

