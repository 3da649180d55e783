"""Who reads what: ranks, DataLoader workers, epochs, and the resumable read position.

A *slot* is one DataLoader worker of one rank (``slot = rank * num_workers + worker``). Every
epoch, all ranks shuffle the list of *units* (shards, or chunks of lines in raw mode) identically,
seeded by ``(seed, epoch)``; units are then assigned to ranks and, inside a rank, to workers,
balancing total audio duration (greedy longest-first, then random moves and swaps seeded by
``(seed, epoch)`` that keep the balance, so the split differs every epoch; durations from the shard
index, else utterance counts, else equal weights). Every utterance is read by exactly one slot per
epoch.

With fewer units than slots, each slot reads every unit and keeps the samples whose
``(unit + position) % slots == slot`` ("stride" mode): still exactly once, never a hang, at the
cost of reading each unit ``slots`` times; a warning says so.

Resume: a sample is identified by ``(source, unit, position)``. :class:`SlotState` is a worker's
snapshot: per source, the *cursor* (the last sample that entered the buffers) and the *pending*
samples (entered the shuffle/sort/batch buffers but not yet emitted in a consumed batch). A
resumed worker re-reads from the earliest unit that is pending or holds the cursor, skips what
was emitted, and refills its buffers: the re-read is bounded by the units open at the checkpoint.

:func:`all_ranks_have_data` lets a DDP trainer stop an epoch on every rank together.
"""

from __future__ import annotations

import functools
import heapq
import logging
import random
from dataclasses import dataclass, field
from typing import Sequence

from corpus_io.errors import ConfigError, DataError

log = logging.getLogger(__name__)

#: unit ordinals are ``pass * PASS_STRIDE + index``: unique across the passes of an infinite stream.
PASS_STRIDE = 10**9


@dataclass(frozen=True)
class Slot:
    """One reader: worker ``worker`` of ``num_workers`` on rank ``rank`` of ``world_size``."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world_size and 0 <= self.worker < self.num_workers):
            raise ConfigError(f"invalid slot: rank {self.rank} of {self.world_size}, worker {self.worker} "
                              f"of {self.num_workers}. Check RANK/WORLD_SIZE and num_workers.")

    @property
    def index(self) -> int:
        return self.rank * self.num_workers + self.worker

    @property
    def count(self) -> int:
        return self.world_size * self.num_workers


@dataclass(frozen=True)
class Assignment:
    """The units a slot reads, in order (indices into the list), and the stride filter if any.

    ``stride`` = 0: keep every sample of ``units``; ``stride`` = k > 0: keep samples with
    ``(ordinal + position) % k == offset`` where ``ordinal`` is the unit's place in ``units``.
    """

    units: list[int]
    stride: int = 0
    offset: int = 0

    def keeps(self, ordinal: int, position: int) -> bool:
        return self.stride == 0 or (ordinal + position) % self.stride == self.offset


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The list order of one epoch: a permutation seeded by ``(seed, epoch)``, identical on all ranks."""
    order = list(range(n))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def balance(items: Sequence[int], weights: Sequence[float], bins: int,
            rng: random.Random | None = None, start: Sequence[float] | None = None) -> list[list[int]]:
    """Split ``items`` (in their given order) into ``bins`` lists of similar total weight (``start``: what each
    bin holds already, so the items go to the lightest bins first).

    Greedy longest-first first; then, with ``rng``, random moves and swaps between bins that keep the
    spread (heaviest minus lightest bin) within ``max(greedy spread, BALANCE_SLACK x mean load)``. Longest-
    first alone gives the same split every epoch whenever the weights differ, so the same shards would
    share a rank, and a rank that runs out first would leave the same utterances unused every epoch; the
    random phase (seeded per epoch, identical on all ranks) varies the split at no cost in balance.
    Each bin keeps its items in the order they had in ``items`` (so a shuffled list stays shuffled).
    """
    w = [float(weights[item]) for item in items]
    loads = [float(x) for x in start] if start is not None else [0.0] * bins
    where = [0] * len(items)
    heap = [(loads[j], 0, j) for j in range(bins)]  # (load, count, bin): the lightest bin, then the emptiest
    heapq.heapify(heap)
    for i in sorted(range(len(items)), key=lambda i: -w[i]):
        load, count, b = heapq.heappop(heap)
        loads[b] = load + w[i]
        where[i] = b
        heapq.heappush(heap, (loads[b], count + 1, b))
    if rng is not None and bins > 1 and len(items) > 1:
        _vary(w, where, loads, bins, rng)
    members: list[list[int]] = [[] for _ in range(bins)]
    for i, item in enumerate(items):
        members[where[i]].append(item)
    return members


#: the spread (heaviest minus lightest bin, as a share of the mean load) the random phase of balance may use
BALANCE_SLACK = 0.01


def _vary(w: list[float], where: list[int], loads: list[float], bins: int, rng: random.Random) -> None:
    """Random moves and swaps between bins that keep the spread within the greedy one (or the slack)."""
    n = len(w)
    spread = max(loads) - min(loads)
    limit = max(spread, BALANCE_SLACK * sum(loads) / bins)
    # every bin stays inside one band of width `limit` around the greedy loads: O(1) per step
    low = min(loads) - (limit - spread) / 2 - 1e-9
    high = low + limit + 2e-9
    members: list[list[int]] = [[] for _ in range(bins)]
    for i, b in enumerate(where):
        members[b].append(i)
    for _ in range(min(8 * n, 50_000)):
        i = rng.randrange(n)
        a, b = where[i], rng.randrange(bins - 1)
        b += b >= a
        j = members[b][rng.randrange(len(members[b]))] if members[b] and rng.random() < 0.5 else None
        delta = w[i] - (w[j] if j is not None else 0.0)
        if not (low <= loads[a] - delta <= high and low <= loads[b] + delta <= high) or (
                j is None and len(members[a]) == 1):
            continue  # it would unbalance (or empty) a bin
        loads[a] -= delta
        loads[b] += delta
        members[a].remove(i)
        members[b].append(i)
        where[i] = b
        if j is not None:
            members[b].remove(j)
            members[a].append(j)
            where[j] = a


def unit_weights(n: int, durations: Sequence[float] | None = None,
                 num_utts: Sequence[int] | None = None) -> list[float]:
    """Durations if known for every unit, else utterance counts, else equal weights."""
    for values in (durations, num_utts):
        if values is not None and len(values) == n and all(v is not None and v > 0 for v in values):
            return [float(v) for v in values]
    return [1.0] * n


_warned: set[tuple[int, int]] = set()


def assign(n_units: int, slot: Slot, *, seed: int, epoch: int, shuffle: bool,
           weights: Sequence[float] | None = None, what: str = "shards", warn: bool = True) -> Assignment:
    """The units ``slot`` reads in ``epoch``: list shuffle, then duration-balanced ranks, then workers.

    ``warn``: say so when there are fewer units than readers (striding re-reads whole shards; a raw chunk's
    skipped entries cost nothing, so raw mode passes False).
    """
    order = epoch_order(n_units, seed=seed, epoch=epoch, shuffle=shuffle)
    if n_units < slot.count:
        key = (n_units, slot.count)
        if warn and key not in _warned and slot.index == 0:
            _warned.add(key)
            log.warning("%d %s for %d readers (%d ranks x %d workers): every reader reads every one of them "
                        "and keeps every %d-th utterance. Pack smaller shards (num_utts_per_shard) so that "
                        "there are at least as many shards as readers.", n_units, what, slot.count,
                        slot.world_size, slot.num_workers, slot.count)
        return Assignment(order, stride=slot.count, offset=slot.index)
    w = tuple(weights) if weights is not None else (1.0,) * n_units
    per_rank = list(_split_ranks(n_units, slot.world_size, seed, epoch, shuffle, w)[slot.rank])
    rng = random.Random(f"{seed}:{epoch}:balance:{slot.rank}") if shuffle else None
    return Assignment(balance(per_rank, w, slot.num_workers, rng)[slot.worker])


@functools.lru_cache(maxsize=4)
def _split_ranks(n_units: int, world_size: int, seed: int, epoch: int, shuffle: bool,
                 weights: tuple) -> tuple[tuple[int, ...], ...]:
    """The units of every rank in one epoch (cached: an elastic re-split asks for every old rank's)."""
    order = epoch_order(n_units, seed=seed, epoch=epoch, shuffle=shuffle)
    # seeded by (seed, epoch) like the order: every rank computes the same split, a new one each epoch
    rng = random.Random(f"{seed}:{epoch}:balance") if shuffle else None
    return tuple(tuple(units) for units in balance(order, weights, world_size, rng))


#: ``Piece.after`` at or above this: no positions after the extras (a piece of pending samples only)
NO_MORE = PASS_STRIDE


@dataclass(frozen=True)
class Piece:
    """What a slot reads of one unit: the unit, its stride filter, and which positions.

    A regular unit is read whole (``after`` = -1). After an elastic re-split (see
    corpus_io.loader.elastic) a piece is the rest of a unit the checkpointed run had opened: the
    positions after ``after`` plus ``extra`` (samples that were pending in the buffers).
    ``pass_`` is the pass the unit belongs to (a raw chunk's lines depend on it). ``skip``: pieces
    whose positions this one leaves out (what the last epoch left untrained and carried into this
    one, read before it: see corpus_io.loader.elastic.carry_over).
    """

    unit: int
    pass_: int
    ordinal: int = 0
    stride: int = 0
    offset: int = 0
    after: int = -1
    extra: frozenset = frozenset()
    skip: tuple = ()

    def in_stride(self, position: int) -> bool:
        return self.stride == 0 or (self.ordinal + position) % self.stride == self.offset

    def keeps(self, position: int) -> bool:
        return (self.in_stride(position) and (position > self.after or position in self.extra)
                and not (self.skip and any(s.keeps(position) for s in self.skip)))

    def first_kept(self) -> int:
        """The first position this piece may keep (a reader that can seek starts there)."""
        return min([*self.extra, self.after + 1]) if self.after >= 0 or self.extra else 0

    def done_after(self, position: int) -> bool:
        """Nothing at or after ``position`` is kept (stop reading the unit early)."""
        return self.after >= NO_MORE and all(e < position for e in self.extra)

    def to_list(self) -> list:
        out = [self.unit, self.pass_, self.ordinal, self.stride, self.offset, self.after, sorted(self.extra)]
        return out + [[s.to_list() for s in self.skip]] if self.skip else out

    @classmethod
    def from_list(cls, v: Sequence) -> Piece:
        skip = tuple(cls.from_list(s) for s in v[7]) if len(v) > 7 else ()  # states before skip have 7 fields
        return cls(int(v[0]), int(v[1]), int(v[2]), int(v[3]), int(v[4]), int(v[5]), frozenset(int(e) for e in v[6]),
                   skip)


def pieces_of(assignment: Assignment, pass_: int) -> list[Piece]:
    """A regular assignment as whole-unit pieces."""
    return [Piece(u, pass_, k, assignment.stride, assignment.offset) for k, u in enumerate(assignment.units)]


# --------------------------------------------------------------------------- resumable state


@dataclass
class SlotState:
    """A worker's read position (JSON-able through :meth:`to_dict`).

    ``cursor[src]`` = ``(unit, position)`` of the last sample of source ``src`` that entered the
    buffers; ``pending`` = samples that entered but were not yet emitted, each with its seconds of
    audio; ``taken[src]`` = samples of ``src`` that entered (weighted interleaving); ``seconds`` =
    audio that entered this epoch (``epoch_hours``), pending samples included. ``plans[src]`` =
    ``(pass, pieces)``: after an elastic re-split, the explicit pieces this slot reads in that pass
    instead of its regular assignment (unit ids of that pass are ordinals in ``pieces``). ``mix_ended``:
    this epoch's weighted mix has ended (a source finished its pass); a resumed reader only brings its
    pending samples back (the pass-end cursor alone cannot tell this epoch's end from the last one's).
    """

    epoch: int = 0
    cursor: dict[int, tuple[int, int]] = field(default_factory=dict)
    pending: dict[tuple[int, int, int], float] = field(default_factory=dict)
    taken: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    finished: bool = False
    plans: dict[int, tuple[int, list[Piece]]] = field(default_factory=dict)
    mix_ended: bool = False

    def enter(self, sid: tuple[int, int, int], seconds: float) -> bool:
        """``sid`` entered the buffers; False for a pending sample of the checkpoint coming back (a resumed
        or continued reader re-enters those: they are already pending and counted). The cursor never moves
        back; it moves past a pending sample only after an elastic re-split, whose plan puts them ahead."""
        src, unit, pos = sid
        cur = self.cursor.get(src)
        if cur is None or (unit, pos) > cur:
            self.cursor[src] = (unit, pos)
        if sid in self.pending:
            return False
        self.pending[sid] = seconds
        self.taken[src] = self.taken.get(src, 0) + 1
        self.seconds += seconds
        return True

    def fields(self) -> tuple:
        """Every field, in order (``SlotState(*fields)`` rebuilds it): a worker's cheap per-batch snapshot."""
        return (self.epoch, self.cursor, self.pending, self.taken, self.seconds, self.finished, self.plans,
                self.mix_ended)

    def emit(self, sid: tuple[int, int, int]) -> None:
        self.pending.pop(sid, None)

    def first_needed(self, src: int, unit: int) -> int:
        """The first position of ``unit`` of ``src`` a resumed reader still needs: its lowest pending sample, else
        the one after the cursor when the cursor is in it (0 when the unit is new to this state)."""
        cur = self.cursor.get(src)
        pending = [pos for s, u, pos in self.pending if s == src and u == unit]
        if cur is None or cur[0] < unit:
            return 0
        if cur[0] == unit:
            return min([*pending, cur[1] + 1])
        return min(pending, default=NO_MORE)

    def start_unit(self, src: int) -> int | None:
        """The first unit a resumed reader of ``src`` must open (None: start from the beginning)."""
        units = [u for s, u, _ in self.pending if s == src]
        if src in self.cursor:
            units.append(self.cursor[src][0])
        return min(units) if units else None

    def already_done(self, sid: tuple[int, int, int]) -> bool:
        """True for a sample the checkpointed run already emitted (skip it on resume)."""
        src, unit, pos = sid
        cur = self.cursor.get(src)
        return cur is not None and (unit, pos) <= cur and sid not in self.pending

    def next_epoch(self, epoch: int) -> SlotState:
        """The state that continues this stream in ``epoch`` (epoch_hours, weighted mixes): the samples
        still pending (in the buffers, not trained: the trainer stopped early) come back first and count
        towards the new epoch's audio."""
        return SlotState(epoch, dict(self.cursor), dict(self.pending), dict(self.taken),
                         sum(self.pending.values()), False, dict(self.plans))

    def to_dict(self) -> dict:
        out = {"epoch": self.epoch,
               "cursor": {str(s): list(c) for s, c in self.cursor.items()},
               "pending": _pack_pending(self.pending),
               "taken": {str(s): n for s, n in self.taken.items()},
               "seconds": self.seconds, "finished": self.finished}
        if self.mix_ended:
            out["mix_ended"] = True
        if self.plans:  # only after an elastic re-split: a regular state stays as small as before
            out["plans"] = {str(s): [p, [piece.to_list() for piece in pieces]] for s, (p, pieces) in self.plans.items()}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> SlotState:
        """The inverse of :meth:`to_dict`; anything else (an edited or damaged state) is a DataError."""
        try:
            return cls(epoch=int(d.get("epoch", 0)),
                       cursor={int(s): (int(c[0]), int(c[1])) for s, c in d.get("cursor", {}).items()},
                       pending=_unpack_pending(d.get("pending", [])),
                       taken={int(s): int(n) for s, n in d.get("taken", {}).items()},
                       seconds=float(d.get("seconds", 0.0)), finished=bool(d.get("finished", False)),
                       plans={int(s): (int(v[0]), [Piece.from_list(x) for x in v[1]])
                              for s, v in d.get("plans", {}).items()},
                       mix_ended=bool(d.get("mix_ended", False)))
        except (AttributeError, TypeError, ValueError, IndexError, KeyError) as exc:
            raise DataError(f"a worker's read position in the loader state is malformed ({type(exc).__name__}: "
                            f"{exc}; got {str(d)[:200]}): the state was edited or damaged. Drop it (start the "
                            f"epoch afresh) or restore it from a backup.") from None

    def copy(self) -> SlotState:
        return SlotState(self.epoch, dict(self.cursor), dict(self.pending), dict(self.taken), self.seconds,
                         self.finished, dict(self.plans))


def _pack_pending(pending: dict[tuple[int, int, int], float]) -> list:
    """Pending samples grouped by unit: ``[src, unit, [position deltas], [seconds]]`` with seconds in 10 ms
    steps (ints) when that is exact (features are 10 ms frames), so a worker's ~1,000 buffered samples cost
    ~8 bytes each in JSON instead of ~28."""
    units: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for (src, unit, pos), sec in pending.items():
        units.setdefault((src, unit), []).append((pos, sec))
    out = []
    for (src, unit), items in sorted(units.items()):
        items.sort()
        positions = [items[0][0], *(b[0] - a[0] for a, b in zip(items, items[1:]))]
        steps = [round(sec * 100) for _, sec in items]
        exact = all(float(n) * 0.01 == sec for n, (_, sec) in zip(steps, items))
        out.append([src, unit, positions, steps if exact else [sec for _, sec in items], int(exact)])
    return out


def _unpack_pending(packed: list) -> dict[tuple[int, int, int], float]:
    """The inverse of :func:`_pack_pending`; also reads the older ``[src, unit, position, seconds]`` entries."""
    pending: dict[tuple[int, int, int], float] = {}
    for p in packed:
        if not isinstance(p[2], list):  # one sample per entry (states written before the packed form)
            pending[(int(p[0]), int(p[1]), int(p[2]))] = float(p[3]) if len(p) > 3 else 0.0
            continue
        pos = 0
        for delta, sec in zip(p[2], p[3]):
            pos += int(delta)
            pending[(int(p[0]), int(p[1]), pos)] = float(sec) * 0.01 if p[4] else float(sec)
    return pending


# --------------------------------------------------------------------------- DDP


def dist_info() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed when initialized, else from RANK/WORLD_SIZE, else (0, 1)."""
    import os

    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def all_ranks_have_data(flag: bool) -> bool:
    """True only if every rank still has data (an all-reduce); ``flag`` alone without DDP.

    A trainer calls it before each step: ``if not all_ranks_have_data(batch is not None): break``,
    so all ranks leave the epoch at the same step instead of one waiting forever in a collective.
    """
    have, world_size = ranks_with_data(flag)
    return have == world_size


def gather_objects(obj: object) -> list:
    """Every rank's ``obj``, in rank order (one ``all_gather_object`` under DDP; ``[obj]`` without)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def ranks_with_data(flag: bool) -> tuple[int, int]:
    """``(ranks whose flag is true, world size)``: one all-reduce (SUM) under DDP, ``(int(flag), 1)`` without."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return int(bool(flag)), 1
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t.item()), dist.get_world_size()
