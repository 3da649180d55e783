"""Elastic resume: the rest of a checkpointed epoch, re-split over another world size or worker count.

A checkpoint holds one :class:`~corpus_io.loader.partition.SlotState` per reader (rank x worker) of the run
that wrote it. From those and the deterministic regular assignment, :func:`resplit` lists what each
old reader had left, per source, as :class:`~corpus_io.loader.partition.Piece` s:

* the units it had not started (whole);
* the rest of the unit its cursor was in (positions after the cursor);
* the samples pending in its buffers (entered, not yet in a consumed batch), as explicit positions of
  the units they came from.

Those pieces are split over the new readers balanced by remaining audio (the same duration-balanced
split as an epoch's, on the pieces' estimated durations: ranks first, then workers); each new reader
gets them as its plan for that pass (``SlotState.plans``), its pending samples as pending (so the
``epoch_hours`` budget waits for them, and the mix does not count them twice), and an equal share of
the audio and samples the old readers had taken (``epoch_hours`` budget, mix shares). The utterances
consumed before and after the re-split are then one epoch exactly; the re-read is bounded by the units
open at the checkpoint (a piece of pending samples only is read up to its last one). Streams that
continue across epochs (``epoch_hours``, weighted mixes) go on with the next pass after the plan.

Every rank computes the same re-split from the same states, so ranks need no communication.

The same pieces carry an epoch that DDP ranks ended together when one ran out of batches into the next
(:func:`carry_over`): what the other ranks still held is read first there, split over every rank, and left
out of the next pass.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from corpus_io.config import DatasetConf
from corpus_io.errors import ConfigError
from corpus_io.loader.build import continues_streams, first_pass, marks_pass_end, source_seed
from corpus_io.loader.partition import NO_MORE, PASS_STRIDE, Piece, Slot, SlotState, balance, unit_weights
from corpus_io.loader.rawlist import chunk_sizes
from corpus_io.loader.read import Source, chunk_lines, pieces_of_pass


@dataclass
class Resplit:
    """The new readers' start states and what the re-split moved (for the trainer's log)."""

    states: dict[int, SlotState]  # by new slot index (rank * num_workers + worker)
    old: tuple[int, int]  # (world_size, num_workers) of the checkpoint
    new: tuple[int, int]
    whole: int = 0  # units not started
    open: int = 0  # units partly read (their rest)
    pending: int = 0  # samples pending in the old readers' buffers
    hours: float = 0.0  # estimated audio left

    def describe(self) -> str:
        return (f"loader state of {self.old[0]} ranks x {self.old[1]} workers re-split over {self.new[0]} ranks x "
                f"{self.new[1]} workers: {self.whole} units not started, {self.open} open units (their rest), "
                f"{self.pending} buffered samples, about {self.hours:.2f} h of audio left in the epoch")


def _unit_sizes(source: Source) -> tuple[list[float], list[int] | None]:
    """Balancing weight and utterance count of each unit (raw: chunks of lines)."""
    if source.data_type == "raw":
        sizes = chunk_sizes(source.num_units)
        return [float(n) for n in sizes], sizes
    counts = source.num_utts if source.num_utts and all(source.num_utts) else None
    return unit_weights(source.num_units, source.durations, source.num_utts), counts


def _left_weight(piece: Piece, weight: float, n: int | None) -> float:
    """Estimated duration (or count) of what ``piece`` still reads of a unit of ``weight`` and ``n`` utterances."""
    if piece.skip and n:
        return weight * _kept(piece, n) / n
    if piece.after < 0 and not piece.extra:
        share = 1.0
    elif n:
        share = (len(piece.extra) + (max(0, n - 1 - piece.after) if piece.after < NO_MORE else 0)) / n
    else:
        share = 0.5
    return weight * share / (piece.stride or 1)


def _kept(piece: Piece, n: int) -> int:
    """Utterances ``piece`` reads of a unit of ``n``."""
    return sum(1 for pos in range(n) if piece.keeps(pos))


def _current_pass(src: int, state: SlotState, *, start: int, mark_pass_end: bool) -> int:
    """The pass ``state`` reads of source ``src``. In a mix whose epoch ends with a pass, a cursor on the
    first position of a pass that has no plan marks the end of the pass before (nothing of it is left but
    pending samples; the next pass belongs to the next epoch)."""
    cursor = state.cursor.get(src)
    if cursor is None:
        return start
    pass_ = cursor[0] // PASS_STRIDE
    marker = cursor[1] == -1 and cursor[0] % PASS_STRIDE == 0 and state.plans.get(src, (None,))[0] != pass_
    return pass_ - 1 if marker and mark_pass_end else pass_


def _rest_of_slot(src: int, source: Source, slot: Slot, state: SlotState, *, seed: int, cur_pass: int,
                  shuffle: bool) -> list[tuple[Piece, dict[int, float]]]:
    """What ``slot`` had left of ``source``: pieces, each with its pending positions (-> seconds)."""
    pending: dict[int, dict[int, float]] = defaultdict(dict)
    for (s, uid, pos), sec in state.pending.items():
        if s == src:
            pending[uid][pos] = sec
    cursor = state.cursor.get(src)
    out = []
    for pass_ in sorted({uid // PASS_STRIDE for uid in pending} | {cur_pass}):
        for k, piece in enumerate(pieces_of_pass(src, source, slot, state, seed=seed, pass_=pass_, shuffle=shuffle)):
            uid = pass_ * PASS_STRIDE + k
            mine = pending.get(uid, {})
            if pass_ == cur_pass and (cursor is None or uid > cursor[0]):
                out.append((piece, mine))
            elif pass_ == cur_pass and uid == cursor[0]:
                c = cursor[1]
                extra = {e for e in piece.extra if e > c} | set(mine)
                out.append((replace(piece, after=max(piece.after, c), extra=frozenset(extra)), mine))
            elif mine:
                out.append((replace(piece, after=NO_MORE, extra=frozenset(mine)), mine))
    return out


def _old_readers(rank_states: list[dict]) -> tuple[int, list[Slot], list[SlotState]]:
    """The epoch, the readers (rank x worker) and their states of one checkpoint's ``rank_states``."""
    old_world = int(rank_states[0].get("world_size", len(rank_states)))
    old_workers = max(1, int(rank_states[0].get("num_workers", 1)))
    epoch = int(rank_states[0]["epoch"])
    by_rank = {int(s.get("rank", r)): s for r, s in enumerate(rank_states)}
    if sorted(by_rank) != list(range(old_world)) or any(int(s["epoch"]) != epoch for s in rank_states):
        raise ConfigError(f"the loader states are not one checkpoint's: ranks {sorted(by_rank)} of {old_world}, "
                          f"epochs {sorted({int(s['epoch']) for s in rank_states})}. Resume from the states every rank "
                          f"of one run saved together (one checkpoint), or start the epoch afresh without them.")
    old_slots = [Slot(r, old_world, w, old_workers) for r in range(old_world) for w in range(old_workers)]
    olds = [SlotState.from_dict(by_rank[s.rank].get("workers", {}).get(str(s.worker)) or {"epoch": epoch})
            for s in old_slots]
    return epoch, old_slots, olds


def _rest_of_source(i: int, source: Source, conf: DatasetConf, old_slots: list[Slot], olds: list[SlotState], *,
                    start: int, shuffle: bool) -> tuple[list[tuple[Piece, dict[int, float]]], int]:
    """What every old reader had left of source ``i`` (pieces with their pending positions), and the pass to
    plan it in."""
    infinite = continues_streams(conf)
    _, sizes = _unit_sizes(source)
    rest: list[tuple[Piece, dict[int, float]]] = []
    plan_pass = start
    for slot, st in zip(old_slots, olds):
        if st.finished and not infinite:
            continue
        cur_pass = _current_pass(i, st, start=start, mark_pass_end=marks_pass_end(conf))
        plan_pass = max(plan_pass, cur_pass)
        rest += _rest_of_slot(i, source, slot, st, seed=source_seed(conf, i), cur_pass=cur_pass, shuffle=shuffle)
    if sizes:  # a cursor on a unit's last utterance leaves nothing of it
        rest = [(p, m) for p, m in rest if p.extra or p.after < sizes[p.unit] - 1]
    return rest, plan_pass


def resplit(sources: list[Source], conf: DatasetConf, rank_states: list[dict], *, world_size: int,
            num_workers: int, train: bool) -> Resplit:
    """The start states of every new reader for the rest of the epoch the ``rank_states`` (every old rank's
    ``CorpusLoader.state_dict()``) were saved in; see the module doc."""
    epoch, old_slots, olds = _old_readers(rank_states)
    old_world, old_workers = old_slots[-1].world_size, old_slots[-1].num_workers
    new_count = world_size * num_workers
    infinite = continues_streams(conf)
    shuffle = train and conf.shuffle
    start = first_pass(conf, epoch)
    result = Resplit({i: SlotState(epoch=epoch) for i in range(new_count)}, (old_world, old_workers),
                     (world_size, num_workers))
    if not infinite and all(st.finished for st in olds):
        for st in result.states.values():
            st.finished = True
        return result
    seconds = sum(st.seconds for st in olds)
    for i, source in enumerate(sources):
        weights, sizes = _unit_sizes(source)
        rest, plan_pass = _rest_of_source(i, source, conf, old_slots, olds, start=start, shuffle=shuffle)
        left = [_left_weight(p, weights[p.unit], sizes[p.unit] if sizes else None) for p, _ in rest]
        result.whole += sum(1 for p, _ in rest if p.after < 0 and not p.extra)
        result.open += sum(1 for p, _ in rest if p.after >= 0 or p.extra)
        result.pending += sum(len(m) for _, m in rest)
        if source.data_type == "shard" and source.durations and all(source.durations):
            result.hours += sum(left) / 3600
        taken = sum(st.taken.get(i, 0) for st in olds)
        # the same split as an epoch's (corpus_io.loader.partition.assign), on what is left: ranks, then workers
        items = list(range(len(rest)))
        for rank, of_rank in enumerate(balance(items, left, world_size)):
            for worker, mine in enumerate(balance(of_rank, left, num_workers)):
                # the rest of an earlier epoch carried into this one first (batched first), then pieces with
                # pending samples: they come back before any new audio (the epoch_hours budget cannot end the
                # stream before them, and the buffers refill with them first)
                mine.sort(key=lambda j: (rest[j][0].pass_ >= plan_pass, not rest[j][1]))
                st = result.states[rank * num_workers + worker]
                st.plans[i] = (plan_pass, [rest[j][0] for j in mine])
                st.cursor[i] = (plan_pass * PASS_STRIDE, -1)  # nothing of the plan read yet
                for k, j in enumerate(mine):
                    for pos, sec in rest[j][1].items():
                        st.pending[(i, plan_pass * PASS_STRIDE + k, pos)] = sec
                st.taken[i] = taken // new_count + (1 if rank * num_workers + worker < taken % new_count else 0)
    for st in result.states.values():
        # what the old readers took counts towards epoch_hours, shared out; pending samples are in it already
        st.seconds = seconds / new_count
    return result


@dataclass
class Carry:
    """Where the next epoch starts after DDP ranks stopped an epoch together because one ran out of batches."""

    states: dict[int, SlotState]  # every reader's start state, by slot index (rank * num_workers + worker)
    epoch: int  # the epoch they start
    per_rank: list[int]  # utterances of the carried rest each rank reads first (0 where the index has no counts)

    def describe(self, rank: int) -> str:
        return (f"the {sum(self.per_rank)} utterances all ranks left are carried into epoch {self.epoch}, which "
                f"trains them first ({self.per_rank[rank]} on this rank) and leaves them out of its own pass")


def carry_over(sources: list[Source], conf: DatasetConf, rank_states: list[dict], *, train: bool) -> Carry | None:
    """The next epoch's start states when every rank ended an epoch at the step where one ran out of batches
    (``rank_states``: every rank's ``CorpusLoader.state_dict()`` as of that step; the topology stays).

    What the ranks still held (the units not started, the rest of open units, the samples pending in the
    buffers: the pieces of :func:`resplit`) is read first in the next epoch, on every rank, balanced so that
    each rank's total (carried plus its regular share) is even; each reader's regular share of the next pass
    leaves those utterances out. So each key is read at most once per epoch, and what one epoch leaves
    untrained is trained early in the next (its samples are batched apart, first: corpus_io.loader.batching.CARRIED).
    None when nothing is left, or when the streams continue across epochs anyway (``epoch_hours``, mixes).
    """
    if continues_streams(conf):
        return None
    epoch, old_slots, olds = _old_readers(rank_states)
    world_size, num_workers = old_slots[-1].world_size, old_slots[-1].num_workers
    nxt = epoch + 1
    shuffle = train and conf.shuffle
    count = world_size * num_workers
    states = {s: SlotState(epoch=nxt) for s in range(count)}
    per_rank = [0] * world_size
    found = False
    for i, source in enumerate(sources):
        weights, sizes = _unit_sizes(source)
        rest = [q for p, _ in _rest_of_source(i, source, conf, old_slots, olds, start=epoch, shuffle=shuffle)[0]
                for q in _utterances(p, sizes)]
        if not rest:
            continue
        found = True
        seed = source_seed(conf, i)
        left_out = _left_out(source, rest, sizes, seed=seed, shuffle=shuffle, pass_=nxt)
        regular: list[list[Piece]] = []
        for s in range(count):
            slot = Slot(s // num_workers, world_size, s % num_workers, num_workers)
            own = []
            for piece in pieces_of_pass(i, source, slot, states[s], seed=seed, pass_=nxt, shuffle=shuffle):
                skip = left_out.get(piece.unit, ())
                if skip is not None:  # None: the whole unit is carried, read first and not again
                    own.append(replace(piece, skip=skip) if skip else piece)
            regular.append(own)
        # utterances for batch_type=example (when the index counts them: a reader's batches are then known),
        # else the estimated audio that length and token budgets batch by
        by_count = conf.batch_type == "example" and bool(sizes)
        carried = [_weight(p, weights, sizes, by_count) for p in rest]
        loads = [sum(_weight(p, weights, sizes, by_count) for p in own) for own in regular]
        places = _place(carried, loads, world_size, num_workers, conf.batch_size if by_count else 0)
        for s, mine in enumerate(places):
            states[s].plans[i] = (nxt, _merged([rest[j] for j in mine]) + regular[s])
            per_rank[s // num_workers] += sum(_kept(rest[j], sizes[rest[j].unit]) for j in mine) if sizes else 0
    return Carry(states, nxt, per_rank) if found else None


def _weight(piece: Piece, weights: list[float], sizes: list[int] | None, by_count: bool) -> float:
    if by_count:
        return float(_kept(piece, sizes[piece.unit]))  # type: ignore[index]
    return _left_weight(piece, weights[piece.unit], sizes[piece.unit] if sizes else None)


def _place(weights: list[float], loads: list[float], world_size: int, num_workers: int, batch: int) -> list[list[int]]:
    """Which reader (slot index) reads each carried piece (of ``weights``), given what the readers hold already
    (``loads``). ``batch`` = 0: balanced by weight over ranks, then workers. Else weights are utterances and
    ``batch`` utterances make a batch: each piece goes where the ranks' batch counts (a reader makes
    ceil(utterances / batch)) stay the most even, so carried utterances fill the readers' partial batches."""
    out: list[list[int]] = [[] for _ in loads]
    if not batch:
        ranks = [sum(loads[r * num_workers:(r + 1) * num_workers]) for r in range(world_size)]
        for rank, of_rank in enumerate(balance(range(len(weights)), weights, world_size, start=ranks)):
            base = rank * num_workers
            for worker, mine in enumerate(balance(of_rank, weights, num_workers, start=loads[base:base + num_workers])):
                out[base + worker] = mine
        return out
    held = list(loads)
    ranks = [sum(math.ceil(t / batch) for t in held[r * num_workers:(r + 1) * num_workers]) for r in range(world_size)]

    def score(slot: int, add: float) -> tuple:
        rank = slot // num_workers
        mine = ranks[rank] - math.ceil(held[slot] / batch) + math.ceil((held[slot] + add) / batch)
        others = ranks[:rank] + [mine] + ranks[rank + 1:]
        return max(others) - min(others), mine, held[slot] + add, slot

    for j in sorted(range(len(weights)), key=lambda j: -weights[j]):
        slot = min(range(len(held)), key=lambda s: score(s, weights[j]))
        ranks[slot // num_workers] = score(slot, weights[j])[1]
        held[slot] += weights[j]
        out[slot].append(j)
    return out


def _utterances(piece: Piece, sizes: list[int] | None) -> list[Piece]:
    """A carried piece as it is cheapest to keep and to leave out of the next pass, in parts the readers can share:
    a whole unit as it is; a partial one, when the unit's size is known, as one piece per utterance it holds (so
    the ranks can be evened out to the utterance, and the pieces that leave them out never nest; a reader's
    utterances of one unit are merged back: it reads the unit once)."""
    if not sizes or (piece.after < 0 and not piece.extra and not piece.skip):
        return [piece]
    return [Piece(piece.unit, piece.pass_, piece.ordinal, 0, 0, NO_MORE, frozenset([pos]))
            for pos in range(sizes[piece.unit]) if piece.keeps(pos)]


def _merged(pieces: list[Piece]) -> list[Piece]:
    """The utterances of one unit that :func:`_utterances` split apart and one reader got, as one piece again."""
    out: list[Piece] = []
    at: dict[tuple[int, int], int] = {}  # (unit, pass) -> its explicit piece in out
    for p in pieces:
        key = (p.unit, p.pass_)
        if p.after >= NO_MORE and key in at:
            out[at[key]] = replace(out[at[key]], extra=out[at[key]].extra | p.extra)
            continue
        if p.after >= NO_MORE:
            at[key] = len(out)
        out.append(p)
    return out


def _left_out(source: Source, carried: list[Piece], sizes: list[int] | None, *, seed: int, shuffle: bool,
              pass_: int) -> dict[int, tuple[Piece, ...] | None]:
    """For each unit of ``pass_`` that holds carried utterances, the pieces naming them (its ``skip``), or None
    when all of it is carried. A raw chunk holds other lines in every pass, so raw lines are matched by line."""
    out: dict[int, tuple[Piece, ...] | None] = {}
    if source.data_type == "raw":
        lines = np.concatenate([chunk_lines(source, p.unit, p.pass_, seed=seed, shuffle=shuffle)[
            [p.keeps(pos) for pos in range(sizes[p.unit])]] for p in carried])  # type: ignore[index]
        for unit, n in enumerate(sizes or []):
            hit = np.flatnonzero(np.isin(chunk_lines(source, unit, pass_, seed=seed, shuffle=shuffle), lines))
            if len(hit):
                out[unit] = None if len(hit) == n else (Piece(unit, pass_, after=NO_MORE,
                                                              extra=frozenset(hit.tolist())),)
        return out
    for p in carried:
        if p.unit in out and out[p.unit] is None:
            continue
        whole = p.after < 0 and not p.extra and not p.skip and p.stride == 0
        out[p.unit] = None if whole else tuple(_merged([*(out.get(p.unit) or ()), p]))
    return out


def same_topology(rank_states: list[dict], world_size: int, num_workers: int) -> bool:
    """The checkpoint was written by as many ranks and workers as this run has (an exact resume as it was)."""
    first: Any = rank_states[0] if rank_states else {}
    return (len(rank_states) == world_size and int(first.get("world_size", -1)) == world_size
            and int(first.get("num_workers", -1)) == num_workers)


def utterances_left(sources: list[Source], conf: DatasetConf, states: dict[int, SlotState], *, rank: int,
                    world_size: int, num_workers: int, epoch: int, train: bool) -> int:
    """Utterances one rank's readers (``states`` by worker) have not delivered yet in this epoch, counted from
    their states and the index (nothing is read or decoded): the rest of their units plus their buffered
    samples. Units without an utterance count in the index count 0; with ``epoch_hours`` or a weighted mix
    the stream goes on next epoch, so only the buffered samples count."""
    if continues_streams(conf):
        return sum(len(st.pending) for st in states.values())
    total = 0
    for worker in range(max(1, num_workers)):
        state = states.get(worker) or SlotState(epoch=epoch)
        if state.finished:
            continue
        slot = Slot(rank, world_size, worker, max(1, num_workers))
        for i, source in enumerate(sources):
            _, sizes = _unit_sizes(source)
            cur_pass = _current_pass(i, state, start=first_pass(conf, epoch), mark_pass_end=False)
            for piece, _ in _rest_of_slot(i, source, slot, state, seed=source_seed(conf, i), cur_pass=cur_pass,
                                          shuffle=train and conf.shuffle):
                total += sum(1 for pos in range(sizes[piece.unit]) if piece.keeps(pos)) if sizes else 0
    return total
