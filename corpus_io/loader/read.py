"""The reading end of the pipeline: one slot's units of each source, opened, read and mixed.

Every sample leaves here with ``__sid__ = (source, unit, position)`` (see corpus_io.loader.partition):
``unit`` is ``pass * PASS_STRIDE + ordinal`` in the slot's unit list of that pass and ``position``
is the utterance's index inside the shard (or raw chunk). Resumed readers start at
``state.start_unit(src)`` and drop samples ``state.already_done`` says were emitted, before any
decoding.

Remote shards are streamed sequentially (no seek). Any read failure but a corrupt shard (connection,
stall past ``read_timeout``, HTTP 5xx, an exception of any other type) re-opens the shard after a
backoff (``retries``, ``retry_backoff`` doubling) and skips the utterances already delivered; a
corrupt shard, or one still failing, is skipped and counted with the utterances it lost
(``on_error=skip``) or raised as a DataError naming the shard (``on_error=fail``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterator

from corpus_io.errors import DataError, redact
from corpus_io.loader import profile
from corpus_io.loader.batching import CARRIED
from corpus_io.loader.partition import PASS_STRIDE, Assignment, Piece, Slot, SlotState, assign, pieces_of, unit_weights
from corpus_io.loader.rawlist import CHUNK_LINES, RawList, chunk_sizes, permuted_lines

log = logging.getLogger(__name__)
_NO_INDEX_WARNED: set[str] = set()


def _warn_no_index(data_list: str, index_file: str) -> None:
    """Once per list and process (rank 0 under torchrun): without an index (``index_file``), shards are balanced
    by count."""
    import os
    import sys

    if data_list in _NO_INDEX_WARNED or os.environ.get("RANK", "0") != "0":
        return
    _NO_INDEX_WARNED.add(data_list)
    print(f"warning: {data_list} has no index ({index_file}), so ranks and workers share its shards "
          f"by count, not by duration or utterances. Write one with make-datalist (or pack-shards).",
          file=sys.stderr, flush=True)


@dataclass
class Source:
    """One data list: its units (shard URLs, or the lines of a raw list) and balancing weights."""

    data_list: str
    data_type: str = "shard"
    weight: float = 1.0
    urls: list[str] = field(default_factory=list)
    durations: list[float] | None = None
    num_utts: list[int] | None = None
    raw: RawList | None = None
    owners: dict[str, str | int] = field(default_factory=dict)  # a repeated key -> the shard (raw: entry) keeping it
    track_keys: bool = False  # no index records every shard's keys: readers find repeats from the samples

    @classmethod
    def open(cls, data_list: str, data_type: str, weight: float = 1.0, *, on_error: str = "skip",
             storage_options: dict | None = None) -> Source:
        """``on_error=fail``: a key the index records in two shards is a DataError here, before any reading;
        ``skip``: the first shard keeps it (``owners``) and the others' copies are dropped and counted.
        ``storage_options``: the readers', also for a list (and its index) at a URL."""
        if data_type == "raw":
            return cls._open_raw(data_list, weight, on_error)
        from corpus_io.shards.index import (
            describe_repeats,
            index_entry_problems,
            index_path_for,
            load_index,
            read_datalist,
            repeated_shard,
        )

        index_file = str(index_path_for(data_list))  # the list's index sidecar, named in what is said below
        urls = read_datalist(data_list, storage_options=storage_options)
        if not urls:
            raise DataError(f"{data_list} lists no shards. Run make-datalist on the packed shards.")
        twice = repeated_shard(urls)
        if twice:
            i, j = twice
            raise DataError(f"{data_list} names the same shard twice: entry {i} ({urls[i - 1]}) and entry {j} "
                            f"({urls[j - 1]}); every utterance in it would be trained twice per epoch. Remove one "
                            f"of the lines (lists joined with cat?), or merge lists with make-datalist, which "
                            f"refuses repeats.")
        index = load_index(data_list, storage_options=storage_options)
        if index is None:
            _warn_no_index(data_list, index_file)
        index = index or {}
        entries = [index.get(u) for u in urls]
        for url, entry in zip(urls, entries):
            problems = index_entry_problems(entry) if entry else []
            if problems:
                raise DataError(f"{index_file}: the entry of shard {url}: {problems[0]}. The index "
                                f"does not describe the shard; rebuild it (make-datalist ++input=<the shards' "
                                f"directory>) and check the shards with verify-shards.")
        durations = [float(e["duration"]) if e and e.get("duration") else 0.0 for e in entries]
        num_utts = [int(e["num_utts"]) if e and e.get("num_utts") else 0 for e in entries]
        repeats, found_in, keyed = shard_repeats(data_list, urls, index, storage_options)
        if repeats and on_error == "fail":
            raise DataError(f"{data_list}: {describe_repeats(repeats)} (from {found_in}); training "
                            f"would see those utterances twice. Give each utterance its own key and re-pack, drop "
                            f"the repeated list, or set ++dataset_conf.on_error=skip to read each key from its first "
                            f"shard only (the rest are counted as 'duplicate key').")
        owners = {key: shards[0] for key, shards in repeats.items()}
        return cls(data_list, "shard", weight, urls, durations, num_utts, owners=owners, track_keys=not keyed)

    @classmethod
    def _open_raw(cls, data_list: str, weight: float, on_error: str) -> Source:
        """A raw list whose repeated keys are known before reading: every reader keeps a key from its first entry
        only (``owners``: key -> entry), whatever worker or rank reads the other entries."""
        raw = RawList(data_list)
        repeats = raw.repeated_entries()
        if repeats and on_error == "fail":
            key, entries = next(iter(repeats.items()))
            more = f" ({len(repeats) - 1} more keys repeat)" if len(repeats) > 1 else ""
            raise DataError(f"{data_list}: key '{key}' is in entries {entries[0] + 1} and {entries[1] + 1} "
                            f"({raw.where(entries[0])} and {raw.where(entries[1])}){more}; training would see "
                            f"the utterance twice. Give each utterance its own key or drop the repeated lines "
                            f"(lists joined with cat?), or set ++dataset_conf.on_error=skip to keep each key's "
                            f"first entry and count the rest as 'duplicate key'.")
        return cls(data_list, "raw", weight, raw=raw, owners={key: entries[0] for key, entries in repeats.items()})

    @property
    def num_units(self) -> int:
        return len(self.urls) if self.data_type == "shard" else len(self.raw)  # type: ignore[arg-type]


def shard_repeats(data_list: str, urls: list[str], index: dict,
                  storage_options: dict | None = None) -> tuple[dict[str, list[str]], str, bool]:
    """``(repeats, found_in, keyed)`` of a shard list: ``{key: [shard, shard, ...]}`` for each key several shards
    hold (the first owns it), from the index's keys, else the local tars' member names; where they were found;
    whether every shard's keys are known (else readers track keys). ``index``: the list's index, by shard."""
    from corpus_io.shards.index import index_path_for, index_records_keys, index_shard_keys, known_repeated_keys

    keyed = index_records_keys(data_list, storage_options=storage_options)
    found_in = str(index_path_for(data_list))
    unindexed = [u for u in urls if index.get(u) is None]
    repeats = known_repeated_keys(data_list, storage_options=storage_options) if keyed and not unindexed else {}
    if keyed and unindexed:
        # shards the index has no entry for (a copy appended to the list?): their keys are not in it, so they
        # come from their tar headers, checked against the index's keys of the other shards
        listed = set(urls)
        indexed = partial(index_shard_keys, data_list, storage_options=storage_options, only=listed)
        scanned = _repeats_from_headers(unindexed, indexed) if all(_local_tar(u) for u in unindexed) else None
        keyed, repeats = scanned is not None, scanned or {}
        found_in += f" and the member names of the {len(unindexed)} listed shard(s) it has no entry for"
    elif not keyed and all(_local_tar(u) for u in urls):
        # no index names the keys, but the shards are local tars: their headers do, without reading audio
        scanned = _repeats_from_headers(urls)
        if scanned is not None:
            keyed, repeats, found_in = True, scanned, "the shards' member names"
    return repeats, found_in, keyed


def _local_tar(url: str) -> bool:
    from corpus_io.storage.urls import is_command, is_remote

    return url.endswith(".tar") and not is_remote(url) and not is_command(url) and not url.startswith("file://")


def _repeats_from_headers(urls: list[str], known: Callable[[], Iterator[tuple[str, list[str]]]] | None = None
                          ) -> dict[str, list[str]] | None:
    """Keys several local shards hold, from their tar headers (two passes, 8 bytes per utterance), after the
    ``(shard, keys)`` that ``known()`` gives (an index's, which then own a repeated key); None when a shard cannot be
    scanned (the reader then reports it under on_error, and readers track keys instead)."""
    from itertools import chain

    from corpus_io.shards.index import find_repeated_keys
    from corpus_io.shards.reader import member_keys

    try:
        return find_repeated_keys(lambda: chain(known() if known else (), ((u, member_keys(u)) for u in urls)))
    except (DataError, OSError):
        return None


@dataclass
class ReadOptions:
    storage_options: dict
    allow_pipe: bool = False
    max_member_bytes: int = 256 * 1024 * 1024
    retries: int = 3
    retry_backoff: float = 0.5
    on_error: str = "fail"
    fields: tuple = ()  # dataset_conf.fields: read only these (companion files in lockstep)


def _is_transient(exc: BaseException) -> bool:
    """Worth a retry: anything but a DataError that says the bytes themselves are wrong (a corrupt or
    truncated shard reads the same way twice). Unknown exception types count as transient, so every
    read failure goes through retries and then on_error."""
    if isinstance(exc, DataError):
        return bool(getattr(exc, "transient", False))
    return not isinstance(exc, FileNotFoundError)


def open_source(data_list: str, data_type: str, weight: float, opts: ReadOptions) -> Source:
    """:meth:`Source.open` with a shard's retries: a transient failure reading the list or its index (a stall, a
    refused connection, an HTTP 5xx, an object store's error) is retried ``opts.retries`` times with a doubling
    ``opts.retry_backoff``; then one DataError says it is an outage to wait out. ``on_error=skip`` does not apply:
    without its list there is nothing to skip to."""
    attempt = 0
    delay = opts.retry_backoff
    while True:
        attempt += 1
        try:
            return Source.open(data_list, data_type, weight, on_error=opts.on_error,
                               storage_options=opts.storage_options)
        except Exception as exc:  # noqa: BLE001 - every read failure: retried, then one paragraph
            if not _is_transient(exc):
                raise
            why = redact(_why(exc, opts))
            if attempt < max(1, opts.retries):
                log.warning("data list %s (or its index): %s; retrying in %.1f s (attempt %d of %d)",
                            redact(data_list), why, delay, attempt, opts.retries)
                time.sleep(delay)
                delay *= 2
                continue
            raise DataError(f"data list {data_list} (or its index sidecar) could not be read after {attempt} "
                            f"attempt(s): {why}. The storage did not answer: an outage or an overloaded server, not "
                            f"a fault of the list. Wait until it answers and rerun (a train resumes from its last "
                            f"checkpoint), or let the loader wait longer for it with ++dataset_conf.retries and "
                            f"++dataset_conf.retry_backoff.") from None


def read_shard_unit(url: str, opts: ReadOptions, counts: Counter, *, expected: int | None = None,
                    kept: Callable[[int], bool] = lambda pos: True, start: int = 0) -> Iterator[dict]:
    """The samples of one shard; retries transient failures, then skips-and-counts or fails.

    ``expected``: the shard's utterance count from the index; a skipped shard then also counts the
    utterances it loses (those at or after the break that ``kept`` says this reader would keep). ``start``: the
    first position wanted; a parquet file seeks to its row group (a tar is read from its start).
    """
    from corpus_io.shards.kinds import PARQUET, sample_reader, shard_kind

    prof = profile.current()  # CORPUS_IO_LOADER_PROFILE: time a tar's file reads
    # members as views of the read buffer: decode copies the samples it keeps (one copy instead of two)
    read_shard = sample_reader(url, fields=opts.fields, counts=counts, wrap=prof.reader if prof is not None else None,
                               views=True)
    seeks = shard_kind(url) == PARQUET
    delivered = start if seeks else 0  # positions before it were never wanted: not lost if the shard breaks
    attempt = 0
    delay = opts.retry_backoff
    while True:
        attempt += 1
        try:
            where = {"start": max(start, delivered)} if seeks else {}  # a retry seeks past what it delivered too
            for sample in read_shard(url, storage_options=opts.storage_options,
                                     max_member_bytes=opts.max_member_bytes, allow_pipe=opts.allow_pipe, **where):
                if sample["__pos__"] < delivered:
                    continue
                delivered = sample["__pos__"] + 1
                yield sample
            return
        except Exception as exc:  # noqa: BLE001 - every read failure: retries, then on_error
            if _is_transient(exc) and attempt < max(1, opts.retries):
                log.warning("shard %s: %s; retrying in %.1f s (attempt %d of %d)", redact(url), redact(_why(exc, opts)),
                            delay, attempt, opts.retries)
                counts["shard retries"] += 1
                time.sleep(delay)
                delay *= 2
                continue
            why = _why(exc, opts)
            if opts.on_error == "skip":
                lost = "" if expected is None else sum(1 for p in range(delivered, expected) if kept(p))
                log.warning("skipping the rest of shard %s after %d utterances%s: %s", redact(url), delivered,
                            f" ({lost} utterances lost)" if lost != "" else "", redact(why))
                counts["unreadable shards"] += 1
                if lost:
                    counts["utterances lost in unreadable shards"] += lost
                return
            tries = f" after {attempt} attempts" if attempt > 1 else ""
            if url in why:
                raise DataError(f"{why}{tries} (set dataset_conf.on_error=skip to skip and count broken "
                                f"shards)") from None
            raise DataError(f"shard {url}: {why}{tries}. Check the shard (verify-shards), or set "
                            f"dataset_conf.on_error=skip to skip and count broken shards.") from None


def _why(exc: BaseException, opts: ReadOptions) -> str:
    if isinstance(exc, DataError):
        return str(exc).rstrip(".")
    why = f"{type(exc).__name__}: {exc}".rstrip(": ") or type(exc).__name__
    if "timeout" in type(exc).__name__.lower():  # s3fs/botocore's own timeouts: name the bound that set them
        from corpus_io.storage.urls import read_timeout, timeout_key

        why += f" (the bound is {timeout_key(opts.storage_options)}={read_timeout(opts.storage_options):g} s)"
    return why


def read_raw_entry(lst: RawList, i: int, opts: ReadOptions, counts: Counter) -> dict | None:
    prof = profile.current()
    t = time.perf_counter() if prof is not None else 0.0
    try:
        return lst.sample(i, storage_options=opts.storage_options, allow_pipe=opts.allow_pipe)
    except DataError as exc:
        if opts.on_error == "skip":
            log.warning("skipping entry %d of %s: %s", i, lst.path, exc)
            counts["unreadable utterances"] += 1
            return None
        raise
    finally:
        if prof is not None:
            prof.add("read", time.perf_counter() - t)


def _units_of_pass(source: Source, slot: Slot, *, seed: int, pass_: int, shuffle: bool) -> Assignment:
    if source.data_type == "raw":
        # units are chunks of CHUNK_LINES entries of the list's (seed, pass) permutation, assigned like shards;
        # a reader computes its chunks' lines when it reaches them (rawlist.permuted_lines)
        sizes = chunk_sizes(source.num_units)
        return assign(len(sizes), slot, seed=seed, epoch=pass_, shuffle=shuffle, weights=sizes, what="raw chunks",
                      warn=False)
    weights = unit_weights(source.num_units, source.durations, source.num_utts)
    return assign(source.num_units, slot, seed=seed, epoch=pass_, shuffle=shuffle, weights=weights)


def pieces_of_pass(src: int, source: Source, slot: Slot, state: SlotState, *, seed: int, pass_: int,
                   shuffle: bool) -> list[Piece]:
    """What ``slot`` reads of ``source`` in ``pass_``: the re-split plan of an elastic resume for that pass,
    else its regular assignment (whole units)."""
    plan = state.plans.get(src)
    if plan is not None and plan[0] == pass_:
        return plan[1]
    return pieces_of(_units_of_pass(source, slot, seed=seed, pass_=pass_, shuffle=shuffle), pass_)


def chunk_lines(source: Source, unit: int, pass_: int, *, seed: int, shuffle: bool) -> Any:
    """The entries (line indices) of raw chunk ``unit`` in ``pass_``, by position (int64 array)."""
    return permuted_lines(source.num_units, unit * CHUNK_LINES, min(source.num_units, (unit + 1) * CHUNK_LINES),
                          seed=seed, epoch=pass_, shuffle=shuffle)


def read_piece(source: Source, piece: Piece, opts: ReadOptions, counts: Counter, *, seed: int, shuffle: bool,
               done: Callable[[int], bool], carried: bool = False, start: int = 0) -> Iterator[tuple[int, dict]]:
    """``(position, sample)`` for the positions ``piece`` keeps, in order. Positions the checkpointed run
    already had (outside the piece, or ``done``) are skipped before decoding (a raw entry is not even read)
    and count as ``resume.reread``; a piece of pending samples only stops after its last one. Positions a
    ``carried`` piece (the last epoch's rest) passes over, or that this one leaves out because they were
    carried (``skip``), are not re-reads of a resume: they are not counted."""
    def wanted(pos: int) -> bool | None:
        if not piece.in_stride(pos):
            return False
        if piece.keeps(pos) and not done(pos):
            return True
        if piece.done_after(pos):
            return None  # nothing more to keep in this unit
        if not carried and not any(s.keeps(pos) for s in piece.skip):
            counts["resume.reread"] += 1
        return False

    if source.data_type == "raw":
        for pos, line in enumerate(chunk_lines(source, piece.unit, piece.pass_, seed=seed, shuffle=shuffle)):
            want = wanted(pos)
            if want is None:
                return
            if want:
                sample = read_raw_entry(source.raw, int(line), opts, counts)  # type: ignore[arg-type]
                if sample is not None:
                    sample["__url__"], sample["__pos__"] = source.data_list, int(line)
                    yield pos, sample
        return
    url = source.urls[piece.unit]
    expected = source.num_utts[piece.unit] if source.num_utts and source.num_utts[piece.unit] else None
    # a reader that can seek (a parquet file, by row group) starts at the first position still needed
    for sample in read_shard_unit(url, opts, counts, expected=expected, kept=piece.keeps,
                                  start=max(start, piece.first_kept())):
        want = wanted(sample["__pos__"])
        if want is None:
            return
        if want:
            yield sample["__pos__"], sample


def _done(state: SlotState, src: int, uid: int, pos: int) -> bool:
    return state.already_done((src, uid, pos))


def iter_source(src: int, source: Source, slot: Slot, state: SlotState, opts: ReadOptions, counts: Counter, *,
                seed: int, first_pass: int, shuffle: bool, infinite: bool,
                mark_pass_end: bool = False) -> Iterator[dict | None]:
    """Samples of one source for one slot, passes ``first_pass``, ``first_pass + 1``, ... (one unless infinite).

    ``mark_pass_end``: yield ``None`` after each completed pass (:func:`mix` ends its epoch there).
    """
    start = state.start_unit(src)
    pass_ = first_pass if start is None else max(first_pass, start // PASS_STRIDE)
    while True:
        pieces = pieces_of_pass(src, source, slot, state, seed=seed, pass_=pass_, shuffle=shuffle)
        planned = state.plans.get(src, (None,))[0] == pass_
        if infinite and not pieces and not planned:
            return  # this slot gets nothing from this source, in any pass
        taken_before = state.taken.get(src, 0)
        for ordinal, piece in enumerate(pieces):
            uid = pass_ * PASS_STRIDE + ordinal
            if start is not None and uid < start:
                continue
            # a piece of an earlier pass in this pass's plan: the last epoch's rest, carried (batched first)
            carried = not infinite and piece.pass_ < pass_
            for pos, sample in read_piece(source, piece, opts, counts, seed=seed, shuffle=shuffle,
                                          done=partial(_done, state, src, uid), carried=carried,
                                          start=state.first_needed(src, uid)):
                sample["__sid__"] = (src, uid, pos)
                if carried:
                    sample[CARRIED] = True
                yield sample
        if not infinite:
            return
        pass_end = ((pass_ + 1) * PASS_STRIDE, -1)  # a cursor before the next pass's first sample
        if mark_pass_end and state.cursor.get(src, (-1, -1)) < pass_end:
            # first time this pass ends (not a re-read for samples still pending from it): mark it done
            state.cursor[src] = pass_end
            yield None
        if (state.taken.get(src, 0) == taken_before and not planned
                and (start is None or start < pass_ * PASS_STRIDE)):
            # a whole pass put nothing into the buffers (all unreadable, filtered, or strided away): every
            # later pass would be the same, so end this stream instead of re-reading it forever
            log.warning("%s: a whole pass gave this reader (rank %d, worker %d) no usable sample; its "
                        "epoch_hours stream ends here", source.data_list, slot.rank, slot.worker)
            counts["epoch_hours.empty_pass"] += 1
            return
        pass_ += 1


def mix(streams: list[Iterator[dict | None]], weights: list[float], state: SlotState) -> Iterator[dict]:
    """Interleave ``streams`` by weight, deterministically: next is the one furthest below its share.

    The shares count samples that entered the buffers (``state.taken``), so the mix resumes from a
    checkpoint. The checkpoint's pending samples (each stream re-reads them first) all come back before
    anything new is picked, and are not counted twice: a stream whose pass ends right after its own
    pending samples would otherwise end the mix while another stream still owed its pending ones. A
    ``None`` from a stream (the end of its pass, see ``iter_source(mark_pass_end=True)``) ends the mix:
    the epoch of a weighted mix ends when the source with the least data per weight has been read once,
    and the next epoch continues every stream where it stopped, so the shares follow the weights in
    every epoch. A stream that simply ends leaves the mix; the others go on.
    """
    live = {i: s for i, s in enumerate(streams) if weights[i] > 0}
    picked = Counter({i: state.taken.get(i, 0) for i in live})
    ahead: dict[int, dict | None] = {}  # a stream's first sample after its pending ones, read while draining them
    owed = Counter(sid[0] for sid in state.pending)
    for i in list(live):
        while owed[i] > 0:
            try:
                sample = next(live[i])
            except StopIteration:
                del live[i]
                break
            if sample is None or sample["__sid__"] not in state.pending:
                ahead[i] = sample  # a pending sample did not come back (unreadable now): go on without it
                break
            owed[i] -= 1
            yield sample
    if state.mix_ended:
        return  # the checkpointed run had ended this epoch's mix: only its pending samples were owed
    while live:
        i = min(live, key=lambda j: ((picked[j] + 1) / weights[j], j))
        if i in ahead:
            sample = ahead.pop(i)
        else:
            try:
                sample = next(live[i])
            except StopIteration:
                del live[i]
                continue
        if sample is None:
            state.mix_ended = True
            return
        if sample["__sid__"] not in state.pending:
            picked[i] += 1
        yield sample
