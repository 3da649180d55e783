"""Elastic resume: the rest of a checkpointed epoch, re-split over another world size or worker count.

A checkpoint holds one :class:`~corpus_io.partition.SlotState` per reader (rank x worker) of the run
that wrote it. From those and the deterministic regular assignment, :func:`resplit` lists what each
old reader had left, per source, as :class:`~corpus_io.partition.Piece` s:

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
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from corpus_io.config import DatasetConf
from corpus_io.errors import ConfigError
from corpus_io.partition import NO_MORE, PASS_STRIDE, Piece, Slot, SlotState, balance, unit_weights
from corpus_io.pipeline.build import continues_streams, first_pass, marks_pass_end, source_seed
from corpus_io.pipeline.read import Source, pieces_of_pass
from corpus_io.rawlist import chunk_sizes


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
    if piece.after < 0 and not piece.extra:
        share = 1.0
    elif n:
        share = (len(piece.extra) + (max(0, n - 1 - piece.after) if piece.after < NO_MORE else 0)) / n
    else:
        share = 0.5
    return weight * share / (piece.stride or 1)


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
                out.append((Piece(piece.unit, piece.pass_, piece.ordinal, piece.stride, piece.offset,
                                  max(piece.after, c), frozenset(extra)), mine))
            elif mine:
                out.append((Piece(piece.unit, piece.pass_, piece.ordinal, piece.stride, piece.offset, NO_MORE,
                                  frozenset(mine)), mine))
    return out


def resplit(sources: list[Source], conf: DatasetConf, rank_states: list[dict], *, world_size: int,
            num_workers: int, train: bool) -> Resplit:
    """The start states of every new reader for the rest of the epoch the ``rank_states`` (every old rank's
    ``CorpusLoader.state_dict()``) were saved in; see the module doc."""
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
    new_count = world_size * num_workers
    infinite = continues_streams(conf)
    mark_pass_end = marks_pass_end(conf)
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
        seed = source_seed(conf, i)
        weights, sizes = _unit_sizes(source)
        rest: list[tuple[Piece, dict[int, float]]] = []
        plan_pass = start
        for slot, st in zip(old_slots, olds):
            if st.finished and not infinite:
                continue
            cur_pass = _current_pass(i, st, start=start, mark_pass_end=mark_pass_end)
            plan_pass = max(plan_pass, cur_pass)
            rest += _rest_of_slot(i, source, slot, st, seed=seed, cur_pass=cur_pass, shuffle=shuffle)
        if sizes:  # a cursor on a unit's last utterance leaves nothing of it
            rest = [(p, m) for p, m in rest if p.extra or p.after < sizes[p.unit] - 1]
        left = [_left_weight(p, weights[p.unit], sizes[p.unit] if sizes else None) for p, _ in rest]
        result.whole += sum(1 for p, _ in rest if p.after < 0 and not p.extra)
        result.open += sum(1 for p, _ in rest if p.after >= 0 or p.extra)
        result.pending += sum(len(m) for _, m in rest)
        if source.data_type == "shard" and source.durations and all(source.durations):
            result.hours += sum(left) / 3600
        taken = sum(st.taken.get(i, 0) for st in olds)
        # the same split as an epoch's (corpus_io.partition.assign), on what is left: ranks, then workers
        items = list(range(len(rest)))
        for rank, of_rank in enumerate(balance(items, left, world_size)):
            for worker, mine in enumerate(balance(of_rank, left, num_workers)):
                # pieces with pending samples first: they come back before any new audio (the epoch_hours
                # budget cannot end the stream before them, and the buffers refill with them first)
                mine.sort(key=lambda j: not rest[j][1])
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
