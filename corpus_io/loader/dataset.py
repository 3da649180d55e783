"""The training/cv loader: an IterableDataset over the pipeline, and :class:`CorpusLoader` around DataLoader.

``build_dataloader(data_list, dataset_conf, tokenizer, train=...)`` is the one entry point, for
training (list and buffers shuffled per epoch, augmentation on) and for cv/test (list order kept,
no augmentation, still split across ranks). ``CorpusLoader``:

* ``set_epoch(e)`` before iterating: epoch ``e`` shuffles with ``(seed, e)``;
* ``__iter__`` yields padded batch dicts (``keys``, ``feats``, ``feats_lengths``, ``target``,
  ``target_lengths``, ``audio_seconds``, ``padding_ratio``);
* ``state_dict()`` / ``load_state_dict()``: the exact read position of every worker as of the
  last batch the caller *consumed* (see corpus_io.loader.partition). A resumed epoch yields exactly the
  utterances the interrupted one had not yet delivered;
* ``counts()``: filter/skip counts aggregated over workers (also logged at each epoch end).

With ``dataset_conf.sources`` the corpora are interleaved by weight; with ``epoch_hours`` an
epoch is that much audio (over all ranks) and the next epoch continues where it stopped.

Ranks hold different amounts of data, so under DDP their batch counts differ. ``uneven`` says what the
loader does about it (one all-reduce per batch, before the batch counts as consumed):

* ``stop``: every rank's epoch ends at the step where the first rank runs out, so a plain ``for batch in
  loader:`` DDP loop cannot desync; what the other ranks still hold is untrained in this epoch (counted as
  ``uneven_ranks.unused`` in ``epoch_counts()``) and carried into the next, which trains it first and leaves
  it out of its own pass (:meth:`CorpusLoader.carry_rest`; ``uneven_ranks.carried``; one log line says both).
  What :func:`corpus_io.build_loader` gives by default;
* ``error``: a DataError on every rank at that step, naming this option;
* ``allow``: no synchronisation; every rank yields all of its batches. The caller keeps the ranks together:
  DDP's ``join()`` context manager, or :func:`corpus_io.loader.partition.ranks_with_data` before each step and
  ``carry_rest`` when some but not all ranks ran out (what the trainer does, so it builds its loaders with
  ``allow``).

There is no ``len()``: the batch count of a streaming epoch is known only at its end (filters, dynamic
batch sizes); ``state_dict()["batches"]`` counts the batches consumed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import time
from collections import Counter
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from corpus_io.config import DatasetConf, check_values
from corpus_io.errors import ConfigError, CorpusIOError, DataError
from corpus_io.loader import handover, profile
from corpus_io.loader.batching import describe_batched, split_counts
from corpus_io.loader.build import build_pipeline, continues_streams, read_options
from corpus_io.loader.elastic import Carry, Resplit, carry_over, resplit, same_topology, utterances_left
from corpus_io.loader.partition import Slot, SlotState, all_ranks_have_data, dist_info, gather_objects, ranks_with_data
from corpus_io.loader.read import Source, open_source
from corpus_io.loader.workers import (
    WorkerStart,
    WorkerStartTimeout,
    main_not_run_again,
    release_freed_memory,
    start_forkserver,
    worker_context,
)
from corpus_io.storage.progress import may_start_processes

log = logging.getLogger(__name__)

__all__ = ["CorpusDataset", "CorpusLoader", "WorkerStartTimeout", "build_dataloader", "all_ranks_have_data"]

STATE_VERSION = 1

#: what the loader does when DDP ranks run out of batches at different steps (see the module doc)
UNEVEN_CHOICES = ("stop", "error", "allow")


def check_uneven(uneven: str) -> None:
    if uneven not in UNEVEN_CHOICES:
        raise ConfigError(f"uneven={uneven!r}, but it must be one of {', '.join(UNEVEN_CHOICES)} (what the loader "
                          f"does when DDP ranks run out of batches at different steps).")


class CorpusDataset(IterableDataset):
    """Batches of one rank; each DataLoader worker reads its own slot (see corpus_io.loader.partition)."""

    def __init__(self, sources: list[Source], conf: DatasetConf, tokenizer: Any, *, train: bool, rank: int,
                 world_size: int):
        super().__init__()
        self.sources = sources
        self.conf = conf
        self.tokenizer = tokenizer
        self.train = train
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start_states: dict[int, dict] = {}
        self.dump_audio_dir: str | None = None  # bench-loader ++dump_audio_dir: each final waveform as <key>.wav

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:  # N workers share the cores; without workers this is the training process
            torch.set_num_threads(1)
            if not self.conf.pin_memory:  # batches through this worker's arena (DataLoader pins only tensors)
                handover.enable(self.conf.prefetch)
        slot = Slot(self.rank, self.world_size, worker, num_workers)
        start = self.start_states.get(worker)
        state = SlotState.from_dict(start) if start else SlotState(epoch=self.epoch)
        state.epoch = self.epoch
        counts: Counter = Counter()
        sent: Counter = Counter()
        prof = profile.start()  # None unless CORPUS_IO_LOADER_PROFILE is set

        def bookkeeping(final: bool = False) -> dict:
            t = time.perf_counter() if prof is not None else 0.0
            delta = counts - sent
            sent.update(delta)
            # pickled bytes: DataLoader passes bytes through as is (a nested list of ~2000 pending ids would
            # cost default_convert a recursive walk per batch), and pickling the pending set is ~8x cheaper
            # than sorting it into JSON per batch; turned into the JSON-able dict only when state_dict() is
            # asked for (see _parsed)
            snapshot = state.fields()
            out = {"__worker__": worker, "__state__": pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL),
                   "__counts__": json.dumps(delta) if delta else "{}", "__final__": final}
            if prof is not None:
                prof.add("state", time.perf_counter() - t)
                out["__profile__"] = json.dumps(prof.totals(rest="hand-over"))
            return out

        try:
            if not state.finished:
                batches = build_pipeline(self.sources, self.conf, self.tokenizer, slot=slot, state=state,
                                         train=self.train, counts=counts, dump_audio_dir=self.dump_audio_dir)
                if info is None:  # in the training process: one thread for the data work, all for the model
                    batches = _one_thread(batches)
                for batch in batches:
                    batch.update(bookkeeping())
                    yield handover.pack(batch)
                    if info is not None:  # what the batch's features freed, back to the system
                        release_freed_memory()
            state.finished = True
            yield bookkeeping(final=True)
        except CorpusIOError as exc:  # re-raised in the main process with its own message
            yield {"__worker__": worker, "__error__": (type(exc).__name__, str(exc))}


def _as_is(batch: dict) -> dict:
    """The DataLoader's collate_fn: a padded batch is already tensors (DataLoader's default would walk every key
    and transcript list of each batch again)."""
    return batch


def _timed_hand_over(batches: Iterator[dict], prof: profile.Profile) -> Iterator[dict]:
    """``batches`` with the wait for each (DataLoader's unpickling included) added to ``hand-over``; ``prof.handed``
    is when the last one arrived (the unpacking after it is timed from there)."""
    while True:
        t = time.perf_counter()
        batch = next(batches, None)
        prof.handed = time.perf_counter()
        prof.add("hand-over", prof.handed - t)
        if batch is None:
            return
        yield batch


def _one_thread(batches: Iterator[dict]) -> Iterator[dict]:
    """Run each step of ``batches`` with one torch thread and give the caller its threads back in between:
    per-utterance features on many threads under load are ~8x slower than on one (num_workers=0)."""
    while True:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            batch = next(batches, None)
        finally:
            torch.set_num_threads(threads)
        if batch is None:
            return
        yield batch


class CorpusLoader:
    """DataLoader with epochs, exact resumable state and aggregated counts (see the module doc)."""

    def __init__(self, dataset: CorpusDataset, conf: DatasetConf, *, uneven: str = "allow"):
        check_uneven(uneven)
        self.dataset = dataset
        self.conf = conf
        self.uneven = uneven
        self.num_workers = max(0, int(conf.num_workers))
        if not may_start_processes(self.num_workers, "DataLoader worker processes (dataset_conf.num_workers)"):
            self.num_workers = 0  # a daemonic process (a dask worker under its nanny): the loader runs inline
        self.epoch = 0
        self._snapshots: dict[int, dict] = {}
        self._resume: dict[int, dict] | None = None
        self._carry: dict[int, dict] = {}
        # after ranks stopped an epoch unevenly: the next epoch's carry and this rank's start states of it
        self._carried: tuple[Carry, dict[int, dict]] | None = None
        # uneven='stop' ended the epoch: (step, ranks that still had batches, world size, what this rank left)
        self._stopped: tuple[int, int, int, int] | None = None
        self._before_last: tuple[int, Any] = (-1, None)  # a worker and its snapshot before the last batch yielded
        self._counts: Counter = Counter()
        self._epoch_counts: Counter = Counter()
        self._batches = 0
        #: what the loader is called in a message (the trainer names its cv loader's validation)
        self.what = ""

    @property
    def world_size(self) -> int:
        return self.dataset.world_size

    @property
    def rank(self) -> int:
        return self.dataset.rank

    def set_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` (shuffle seed ``(seed, epoch)``); a loaded state for another epoch is dropped, and so is
        the rest of an epoch carried into another than ``epoch``."""
        if self._carried is not None and epoch != self._carried[0].epoch:
            carry = self._carried[0]
            log.warning("epoch %d starts without the %d utterances that epoch %d left untrained (ranks ran out of "
                        "batches at different steps), which were to be trained first in epoch %d", epoch,
                        sum(carry.per_rank), carry.epoch - 1, carry.epoch)
            self._carried = None
        if self._resume is not None and epoch != self.epoch:
            if not all(_parsed(s).get("finished") for s in self._resume.values()):
                log.warning("the loaded loader state is in the middle of epoch %d; epoch %d starts from its "
                            "beginning instead", self.epoch, epoch)
            self._resume = None
        if epoch != self.epoch and continues_streams(self.conf) and self._snapshots:
            self._carry = dict(self._snapshots)  # continue the streams where they stopped
        self.epoch = epoch

    def counts(self) -> dict[str, int]:
        """Utterances/shards dropped by reason, summed over workers since the loader was built."""
        return dict(self._counts)

    def epoch_counts(self) -> dict[str, int]:
        return dict(self._epoch_counts)

    def _start_states(self) -> dict[int, dict]:
        if self._resume is not None:
            states, self._resume = self._resume, None
            return states
        self._batches = 0
        if self._carried is not None:  # set_epoch dropped it unless it is this epoch's
            states, self._carried = self._carried[1], None
            return states
        if continues_streams(self.conf) and self._carry:
            out = {w: SlotState.from_dict(_parsed(d)).next_epoch(self.epoch).to_dict() for w, d in self._carry.items()}
            self._carry = {}
            return out
        return {}

    def __iter__(self) -> Iterator[dict]:
        self.dataset.epoch = self.epoch
        self.dataset.start_states = self._start_states()
        self._snapshots = dict(self.dataset.start_states)
        self._epoch_counts = Counter()
        self._stopped = None
        self._before_last = (-1, None)
        kwargs: dict[str, Any] = {"batch_size": None, "num_workers": self.num_workers, "collate_fn": _as_is,
                                  "pin_memory": bool(self.conf.pin_memory)}
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = max(1, int(self.conf.prefetch))
        if self.num_workers > 0 and self.conf.batch_timeout > 0:
            kwargs["timeout"] = float(self.conf.batch_timeout)
        started: list = []
        if self.num_workers > 0:
            method = self.conf.worker_start_method
            ctx = worker_context(method)
            started = [ctx.Event() for _ in range(self.num_workers)]
            kwargs["multiprocessing_context"] = ctx
            kwargs["worker_init_fn"] = WorkerStart(started, dict(os.environ) if method == "forkserver" else None)
        in_step = self.uneven != "allow" and self.world_size > 1
        with main_not_run_again(self.num_workers > 0 and self.conf.worker_start_method != "fork"):
            workers = iter(DataLoader(self.dataset, **kwargs))  # the workers start here
        self._await_start(workers, started)
        batches = self._guarded(workers)
        receiver = handover.Receiver()
        prof = profile.Profile() if profile.enabled() else None  # the main process's side
        if prof is not None:
            self._profiles = {"main": prof}
            batches = _timed_hand_over(batches, prof)
        for batch in batches:
            worker = int(batch.pop("__worker__"))
            if prof is not None and "__profile__" in batch:
                self._profiles[worker] = json.loads(batch.pop("__profile__"))
            if "__error__" in batch:
                name, message = batch["__error__"]
                raise (ConfigError if name == "ConfigError" else DataError)(message)
            batch = receiver.unpack(batch, worker)
            snapshot = batch.pop("__state__")
            delta = json.loads(batch.pop("__counts__"))
            self._counts.update(delta)
            self._epoch_counts.update(delta)
            if batch.pop("__final__"):
                self._snapshots[worker] = snapshot
                continue
            if in_step and not self._every_rank_has_a_batch(True):
                break  # the batch is not consumed: the state stays at the previous one
            self._before_last = (worker, self._snapshots.get(worker))
            self._snapshots[worker] = snapshot
            self._batches += 1
            if prof is not None:
                prof.add("unpacking", time.perf_counter() - prof.handed)
            yield batch
        else:
            if in_step:
                self._every_rank_has_a_batch(False)  # the step the ranks that still have batches wait in
        if self._stopped is not None:  # every rank stopped at one step: the rest of the epoch goes first into the next
            self._report_stop(self.carry_rest())
        dropped, batched = split_counts(self._epoch_counts)
        if dropped:
            log.info("epoch %d rank %d: dropped %s", self.epoch, self.rank,
                     ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())))
        if batched:
            log.info("epoch %d rank %d: %s", self.epoch, self.rank, describe_batched(batched))

    def profile(self) -> dict:
        """The last iteration's profile (``CORPUS_IO_LOADER_PROFILE=1``, see corpus_io.loader.profile):
        ``{"main": seconds per category, "workers": {worker: seconds per category}}``; empty when off."""
        profiles = dict(getattr(self, "_profiles", {}))
        main = profiles.pop("main", None)
        if main is None:
            return {}
        return {"main": main.totals(rest="consumer"), "workers": profiles}

    def _every_rank_has_a_batch(self, mine: bool) -> bool:
        """One all-reduce per step (``uneven`` stop/error): True while every rank has a batch for it."""
        have, world_size = ranks_with_data(mine)
        if have in (0, world_size):
            return have == world_size
        step = self._batches + 1
        if self.uneven == "error":
            raise DataError(f"rank {self.rank}: in epoch {self.epoch}, {world_size - have} of {world_size} ranks "
                            f"ran out of batches at step {step} while the others still had some (ranks hold different "
                            f"amounts of audio). Pass uneven='stop' (every rank ends the epoch at that step; the rest "
                            f"is left unused and counted) or uneven='allow' (every rank yields all its batches; keep "
                            f"the ranks together yourself, e.g. with DDP's join()) to build_loader.")
        left = self.left_in_epoch() if mine else 0
        if left:
            self._epoch_counts["uneven_ranks.unused"] += left
            self._counts["uneven_ranks.unused"] += left
        self._stopped = (step, have, world_size, left)
        return False

    def _report_stop(self, carry: Carry | None) -> None:
        step, have, world_size, left = self._stopped  # type: ignore[misc]
        if carry is not None:
            then = carry.describe(self.rank)
        elif continues_streams(self.conf):
            then = "the next epoch continues the streams where this one stopped"
        else:
            then = "they are not carried into the next epoch (not a training loader); uneven='allow' reads them all"
        (log.warning if left else log.info)(
            "epoch %d rank %d: %d of %d ranks ran out of batches at step %d, so every rank ends the epoch there "
            "(uneven='stop'); %d utterances of this rank are left untrained in this epoch: %s.", self.epoch,
            self.rank, world_size - have, world_size, step, left, then)

    def carry_rest(self, states: list[dict] | None = None, *, last_batch_trained: bool = True) -> Carry | None:
        """Every rank ended this epoch at the step where one of them ran out of batches: what the ranks still
        held is carried into the next epoch, where every rank trains it first and the epoch's own pass leaves it
        out (corpus_io.loader.elastic.carry_over), so nothing stays untrained two epochs in a row.

        Collective: every rank calls it at that step, and the ranks' states are gathered. The loader does it with
        ``uneven='stop'``; a loop that keeps the ranks together itself (``uneven='allow'``, as ``train``) calls it
        when its all-reduce says some but not all ranks have data, with ``last_batch_trained=False`` on a rank
        that fetched a batch it did not train (it is carried too). ``states`` (every rank's ``state_dict()`` at
        that step) computes it here instead, without communication. Counts ``uneven_ranks.carried`` (what this
        rank trains first next epoch) and returns what it did (None: nothing to carry, or the streams continue
        across epochs: ``epoch_hours``, weighted mixes)."""
        if self._carried is not None:
            return self._carried[0]
        if not self.dataset.train or continues_streams(self.conf):
            return None
        if states is None:
            mine = self.state_dict()
            worker, before = self._before_last
            if not last_batch_trained and worker >= 0:
                snapshots = {**self._snapshots, worker: before}
                mine["workers"] = {str(w): _parsed(s) for w, s in snapshots.items() if s is not None}
            states = gather_objects(mine)
        carry = carry_over(self.dataset.sources, self.conf, states, train=True)
        if carry is None:
            return None
        base = self.rank * max(1, self.num_workers)
        self._carried = (carry, {w: carry.states[base + w].to_dict() for w in range(max(1, self.num_workers))})
        if carry.per_rank[self.rank]:
            self._epoch_counts["uneven_ranks.carried"] += carry.per_rank[self.rank]
            self._counts["uneven_ranks.carried"] += carry.per_rank[self.rank]
        return carry

    def describe(self) -> str:
        """This loader in a message: what the trainer named it, else its kind and epoch."""
        return self.what or f"{'train' if self.dataset.train else 'cv/test'} loader in epoch {self.epoch}"

    def _await_start(self, workers: Any, started: list) -> None:
        """Wait until every DataLoader worker ran its ``worker_init_fn``, at most ``worker_start_timeout`` seconds:
        a worker that never starts fails this rank in one paragraph instead of a silent wait for its first batch
        (``batch_timeout``) or in a collective of the other ranks (``train_conf.timeout_s``)."""
        if not started:
            return
        bound = float(self.conf.worker_start_timeout)
        deadline = time.monotonic() + bound
        procs = list(getattr(workers, "_workers", []))
        for w, event in enumerate(started):
            while not event.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
                proc = procs[w] if w < len(procs) else None
                exited = proc is not None and proc.exitcode is not None
                if not exited and time.monotonic() < deadline:
                    continue
                workers._shutdown_workers()
                method = self.conf.worker_start_method
                pid = f" (pid {proc.pid})" if proc is not None else ""
                if exited:
                    why = f"exited with code {proc.exitcode} before it started (its own error, if any, is above)"
                else:
                    why = (f"did not start within {bound:g} s (dataset_conf.worker_start_timeout): its process was "
                           f"created (dataset_conf.worker_start_method={method}) and never ran")
                fork = ("A fork of a process with threads (TensorBoard, gloo, DataLoader queues) can wait forever on a "
                        "lock one of them held: use the default ++dataset_conf.worker_start_method=forkserver. "
                        if method == "fork" else "")
                raise WorkerStartTimeout(
                    f"rank {self.rank}: the {self.describe()}: DataLoader worker {w} of {self.num_workers}{pid} "
                    f"{why}. {fork}On a machine this loaded, raise ++dataset_conf.worker_start_timeout; with "
                    f"++dataset_conf.num_workers=0 the loader runs in the training process.")

    def _guarded(self, batches: Any) -> Iterator[dict]:
        """The DataLoader's batches; a worker silent past ``batch_timeout`` fails this rank naming it (else a
        stuck read would hang every rank in the next collective)."""
        while True:
            awaited = getattr(batches, "_task_info", {}).get(getattr(batches, "_rcvd_idx", -1), (None,))[0]
            try:
                batch = next(batches)
            except StopIteration:
                return
            except RuntimeError as exc:
                if "timed out" not in str(exc):
                    raise
                worker = f"worker {awaited}" if awaited is not None else "a worker"
                raise DataError(f"rank {self.rank}: DataLoader {worker} of {self.num_workers} sent no batch for "
                                f"{self.conf.batch_timeout:g} s (dataset_conf.batch_timeout) in epoch {self.epoch}. "
                                f"A read is stuck (a storage stall, a pipe: command that never ends) or one batch "
                                f"takes that long: check the storage, or raise ++dataset_conf.batch_timeout "
                                f"(0 waits forever).") from None
            yield batch

    def left_in_epoch(self) -> int:
        """Utterances this rank has not consumed yet in this epoch, counted from its readers' states and the
        index without reading anything (what a rank leaves unused when a peer ran out first)."""
        states = {w: SlotState.from_dict(_parsed(s)) for w, s in self._snapshots.items()}
        return utterances_left(self.dataset.sources, self.conf, states, rank=self.rank, world_size=self.world_size,
                               num_workers=self.num_workers, epoch=self.epoch, train=self.dataset.train)

    def state_dict(self) -> dict:
        """The read position as of the last consumed batch (JSON-able). After an epoch the ranks ended unevenly
        (:meth:`carry_rest`), the start of the next epoch: its carried rest first, nothing consumed."""
        epoch, batches, workers = self.epoch, self._batches, self._snapshots
        if self._carried is not None:
            epoch, batches, workers = self._carried[0].epoch, 0, self._carried[1]
        return {"version": STATE_VERSION, "epoch": epoch, "seed": self.conf.seed, "rank": self.rank,
                "world_size": self.world_size, "num_workers": self.num_workers, "batches": batches,
                "data_lists": [s.data_list for s in self.dataset.sources],
                "workers": {str(w): _parsed(s) for w, s in workers.items()}, "counts": dict(self._counts)}

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration of ``state['epoch']`` yields exactly what was not yet consumed."""
        _check_is_state(state, "load_state_dict(state)", "the dict this rank's loader.state_dict() returned (with "
                        "'epoch' and 'workers')")
        self._check_state(state, ("world_size", "num_workers", "seed", "data_lists"),
                          "One rank's state resumes the same world size, dataset_conf.num_workers, seed and "
                          "data lists (load_rank_states re-splits every rank's states over another topology)")
        if state.get("rank") != self.rank:
            raise ConfigError(f"the loader state belongs to rank {state.get('rank')}, but this is rank "
                              f"{self.rank}. Save and load one state per rank.")
        try:
            self.epoch = int(state["epoch"])
            self._carried = None
            self._resume = {int(w): s for w, s in state.get("workers", {}).items()}
            self._batches = int(state.get("batches", 0))
            self._counts = Counter({str(k): int(v) for k, v in state.get("counts", {}).items()})
        except (KeyError, AttributeError, TypeError, ValueError) as exc:
            raise DataError(f"the loader state is malformed ({type(exc).__name__}: {exc}): it was edited or "
                            f"damaged. Drop it (start the epoch afresh) or restore it from a backup.") from None
        for worker, snapshot in self._resume.items():
            # checked here: a worker process would only print a traceback
            check_positions(SlotState.from_dict(_parsed(snapshot)), self.dataset.sources, f"worker {worker}")
        self._snapshots = dict(self._resume)

    def load_rank_states(self, states: list[dict]) -> Resplit | None:
        """Resume from every rank's ``state_dict()`` of one checkpoint, on any world size and worker count.

        The same topology loads this rank's own state (the exact resume above); another one re-splits the
        rest of the epoch over this run's ranks x workers (corpus_io.loader.elastic) and returns what it
        did, for the log. Every rank computes the same re-split.
        """
        what = "the list of every rank's loader.state_dict() of one checkpoint (each a dict with 'epoch' and 'workers')"
        if not isinstance(states, (list, tuple)):
            _check_is_state(states, "load_rank_states(states)", what)
        if not states:
            raise ConfigError("no loader states to resume from: the checkpoint holds none. Start the epoch afresh.")
        for i, state in enumerate(states):
            _check_is_state(state, f"load_rank_states(states): states[{i}]", what)
        ranks = [state.get("rank") for state in states]
        if not all(isinstance(r, int) for r in ranks) or sorted(ranks) != list(range(len(states))):
            repeated = sorted({r for r in ranks if ranks.count(r) > 1}, key=repr)
            missing = [r for r in range(len(states)) if r not in ranks]
            raise ConfigError(f"load_rank_states(states): the {len(states)} loader states are not one per rank 0.."
                              f"{len(states) - 1} (their ranks: {ranks}; "
                              + (f"repeated: {repeated}; " if repeated else "")
                              + f"missing: {missing}). Pass every rank's state_dict() of one checkpoint, each "
                              f"once (as train saves them in loader_states).")
        if same_topology(states, self.world_size, self.num_workers):
            self.load_state_dict(next(s for s in states if s.get("rank") == self.rank))
            return None
        for state in states:
            self._check_state(state, ("seed", "data_lists"), "An elastic resume (another world size or worker "
                              "count) still needs the same seed and data lists")
            for worker, snapshot in (state.get("workers") or {}).items():
                check_positions(SlotState.from_dict(_parsed(snapshot)), self.dataset.sources,
                                f"rank {state.get('rank')} worker {worker}")
        plan = resplit(self.dataset.sources, self.conf, states, world_size=self.world_size,
                       num_workers=max(1, self.num_workers), train=self.dataset.train)
        self.epoch = int(states[0]["epoch"])
        self._carried = None
        base = self.rank * max(1, self.num_workers)
        self._resume = {w: plan.states[base + w].to_dict() for w in range(max(1, self.num_workers))}
        self._snapshots = dict(self._resume)
        self._batches = max(int(s.get("batches", 0)) for s in states)
        self._counts = Counter()
        if self.rank == 0:  # the old ranks' skip counts, once
            for state in states:
                self._counts.update(state.get("counts", {}))
        return plan

    def _check_state(self, state: dict, keys: tuple, need: str) -> None:
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"loader state version {state.get('version')} is not {STATE_VERSION}; it was "
                              f"written by another corpus-io version. Start the epoch afresh (drop the state).")
        mine = {"world_size": self.world_size, "num_workers": self.num_workers, "seed": self.conf.seed,
                "data_lists": [s.data_list for s in self.dataset.sources]}
        for key in keys:
            if state.get(key) != mine[key]:
                raise ConfigError(f"the loader state was saved with {key}={state.get(key)}, but this run has "
                                  f"{key}={mine[key]}. {need}; restore them, or start the epoch afresh without "
                                  f"the state.")


def _check_is_state(state: Any, call: str, want: str) -> None:
    """A loader state that is not a dict (None for a rank that saved none, a path, a list) is a ConfigError
    saying what to pass, not an AttributeError from deep inside."""
    if isinstance(state, dict):
        return
    got = "None" if state is None else f"a {type(state).__name__} ({str(state)[:80]})"
    raise ConfigError(f"{call} got {got}, but takes {want}. A checkpoint that holds None there has no read "
                      f"position to resume: skip the call and start the epoch afresh.")


def check_positions(state: SlotState, sources: list[Source], who: str) -> None:
    """A read position of a loader state that cannot be one of these lists' (a source, unit or position past
    their ends, a negative count or time) is a DataError: resumed, it would silently skip or repeat data."""
    from corpus_io.loader.partition import PASS_STRIDE
    from corpus_io.loader.rawlist import CHUNK_LINES

    def bad(why: str) -> DataError:
        return DataError(f"the loader state's read position of {who} is impossible for "
                         f"{[s.data_list for s in sources]}: {why}. The state was edited, damaged, or saved for other "
                         f"lists; drop it (start the epoch afresh) or restore it from a backup.")

    if state.epoch < 0 or not 0 <= state.seconds < float("inf"):
        raise bad(f"epoch {state.epoch}, seconds {state.seconds}")
    places = [(src, unit, pos) for src, (unit, pos) in state.cursor.items()] + list(state.pending)
    for src, unit, pos in places:
        if not 0 <= src < len(sources):
            raise bad(f"source {src} (there are {len(sources)})")
        source = sources[src]
        pass_, ordinal = divmod(unit, PASS_STRIDE) if unit >= 0 else (-1, -1)
        plan = state.plans.get(src)
        if plan is not None and plan[0] == pass_:  # an elastic re-split: ordinals in its pieces
            units = len(plan[1])
        else:
            units = -(-source.num_units // CHUNK_LINES) if source.data_type == "raw" else source.num_units
        if pass_ < 0 or not 0 <= ordinal < max(units, 1):
            raise bad(f"unit {unit} of {source.data_list} (pass {pass_}, unit {ordinal}; it has {units})")
        # the unit is an ordinal in this slot's share, so a shard position is bounded by the largest shard's count
        most = CHUNK_LINES if source.data_type == "raw" else max(source.num_utts or [0]) if all(
            source.num_utts or [0]) else 0
        if pos < -1 or (most and pos >= most):
            raise bad(f"position {pos} in unit {unit} of {source.data_list}")
    if any(n < 0 for n in state.taken.values()) or any(not 0 <= sec < float("inf") for sec in state.pending.values()):
        raise bad("a negative count or a non-finite time")


def _parsed(snapshot: dict | str | bytes) -> dict:
    """A worker snapshot as the JSON-able dict of SlotState.to_dict (workers send pickled bytes)."""
    if isinstance(snapshot, bytes):
        return SlotState(*pickle.loads(snapshot)).to_dict()  # SlotState.fields()
    return json.loads(snapshot) if isinstance(snapshot, str) else snapshot


def open_sources(data_list: str | None, conf: DatasetConf) -> list[Source]:
    """The data lists of a loader: ``data_list`` alone, or ``dataset_conf.sources`` (weighted mix), each read
    (with its index) as the readers read shards (``dataset_conf.storage_options``, ``read_timeout``, ``retries``)."""
    opts = read_options(conf)
    if conf.sources:
        for i, s in enumerate(conf.sources):
            if s.data_list in ("???", "", None):
                raise ConfigError(f"dataset_conf.sources[{i}].data_list is required.")
            if s.weight < 0:
                raise ConfigError(f"dataset_conf.sources[{i}].weight is {s.weight}; weights must be >= 0.")
        return [open_source(s.data_list, s.data_type, s.weight, opts) for s in conf.sources]
    if not data_list or data_list == "???":
        raise ConfigError("no data list: pass a data.list (or set dataset_conf.sources).")
    return [open_source(data_list, conf.data_type, 1.0, opts)]


def build_dataloader(data_list: str | None, dataset_conf: DatasetConf, tokenizer: Any, *, train: bool,
                     rank: int | None = None, world_size: int | None = None, uneven: str = "allow") -> CorpusLoader:
    """The loader for training (``train=True``) or cv/test (``train=False``) on this rank; ``uneven``: what it
    does when DDP ranks run out of batches at different steps (module doc; the trainer syncs itself: allow)."""
    if rank is None or world_size is None:
        r, w = dist_info()
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    check_values(dataset_conf, "dataset_conf.")  # here, not only at compose: the lazy pipeline would reject a
    # bad batch_size or epoch_hours inside a worker, and tests and the trainer build configs in Python
    f = dataset_conf.filter_conf
    for lo, hi in (("min_length", "max_length"), ("token_min_length", "token_max_length"),
                   ("min_output_input_ratio", "max_output_input_ratio")):
        if getattr(f, lo) > getattr(f, hi):
            raise ConfigError(f"dataset_conf.filter_conf.{lo}={getattr(f, lo)} is above {hi}={getattr(f, hi)}, so "
                              f"every utterance would be dropped. Give {lo} <= {hi}.")
    if dataset_conf.feats_on == "model" and dataset_conf.feats_type not in ("fbank", "mfcc"):
        raise ConfigError(f"dataset_conf.feats_on=model computes fbank or mfcc on the model's device, but "
                          f"dataset_conf.feats_type={dataset_conf.feats_type}. Use ++dataset_conf.feats_type=fbank "
                          f"(or mfcc), or ++dataset_conf.feats_on=loader.")
    edges = list(dataset_conf.bucket_edges or ())
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ConfigError(f"dataset_conf.bucket_edges={edges} must rise strictly (upper bucket edges in seconds, "
                          f"shortest first), e.g. ++dataset_conf.bucket_edges=[2,5,10,20].")
    sizes = list(dataset_conf.bucket_batch_size or ())
    if sizes and len(sizes) != len(edges):
        raise ConfigError(f"dataset_conf.bucket_batch_size gives {len(sizes)} batch sizes, one "
                          f"per bucket, but dataset_conf.bucket_edges gives {len(edges)} "
                          f"edges. Give both lists, of the same length (edges in seconds, ascending), e.g. "
                          f"++dataset_conf.bucket_edges=[2,5,10,20] ++dataset_conf.bucket_batch_size=[96,48,24,12].")
    from corpus_io.loader.shapes import check_shares

    check_shares(dataset_conf)
    if dataset_conf.num_workers > 0:  # its imports overlap the lists' reading, not the first epoch
        start_forkserver(dataset_conf.worker_start_method)
    sources = open_sources(data_list, dataset_conf)
    if dataset_conf.bucketing:  # once, here: every rank and worker pads alike and takes the buckets in one order
        from corpus_io.loader.shapes import bucket_plan, describe

        plan = bucket_plan(sources, dataset_conf, read_options(dataset_conf), train=train)
        dataset_conf = dataclasses.replace(dataset_conf, bucket_edges=plan.edges, bucket_shares=plan.shares,
                                           bucket_batch_size=plan.sizes)
        if rank == 0:
            log.info("%s", describe(dataset_conf.bucket_edges))
    raw = [s for s in sources if s.data_type == "raw"]
    if dataset_conf.fields and raw:
        raise ConfigError(f"dataset_conf.fields={list(dataset_conf.fields)} selects companion fields of shards, but "
                          f"{raw[0].data_list} is a raw list, which has none. Drop ++dataset_conf.fields, or "
                          f"pack the list into shards and run add-field on them.")
    dataset = CorpusDataset(sources, dataset_conf, tokenizer, train=train, rank=rank, world_size=world_size)
    return CorpusLoader(dataset, dataset_conf, uneven=uneven)
