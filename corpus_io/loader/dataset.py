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

import contextlib
import dataclasses
import importlib.machinery
import json
import logging
import multiprocessing
import os
import pickle
import sys
import threading
import time
from collections import Counter
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from corpus_io.config import DatasetConf, check_values
from corpus_io.errors import ConfigError, CorpusIOError, DataError
from corpus_io.loader import handover, profile
from corpus_io.loader.batching import batch_shape, describe_batched, split_counts
from corpus_io.loader.build import build_pipeline, continues_streams, describe_chain, loader_chain, read_options
from corpus_io.loader.elastic import Carry, Resplit, carry_over, resplit, same_topology, utterances_left
from corpus_io.loader.partition import Slot, SlotState, all_ranks_have_data, dist_info, gather_objects, ranks_with_data
from corpus_io.loader.read import Source, open_source
from corpus_io.storage.files import read_json_object
from corpus_io.storage.progress import may_start_processes

log = logging.getLogger(__name__)

__all__ = ["CorpusDataset", "CorpusLoader", "WorkerStartTimeout", "build_dataloader", "all_ranks_have_data"]

STATE_VERSION = 1

#: what the loader does when DDP ranks run out of batches at different steps (see the module doc)
UNEVEN_CHOICES = ("stop", "error", "allow")


class WorkerStartTimeout(DataError):
    """A DataLoader worker did not start within ``dataset_conf.worker_start_timeout`` (or exited before it did).
    ``train`` says it on every rank (corpus_io.train.distributed.PeerStop), not only on this one."""


#: imported once in the forkserver, before it forks a worker: a worker's start is then a fork and an unpickling
_FORKSERVER_PRELOAD = ["__main__", "torch", "numpy.random", "multiprocessing.queues", "multiprocessing.synchronize",
                       "corpus_io.tokenizer", "corpus_io.loader.dataset", "corpus_io.loader.stages",
                       "corpus_io.loader.waveaug", "corpus_io.loader.shapes", "corpus_io.shards.kinds",
                       "corpus_io.shards.reader", "corpus_io.tables.shar", "corpus_io.audio.features"]
_preloaded = False


def worker_context(method: str) -> Any:
    """The multiprocessing context DataLoader workers start with (``dataset_conf.worker_start_method``).

    The default, forkserver, never forks this process: its workers are forked from one helper process started
    (fork + exec) at the first use, which runs no threads. A fork of a process whose other threads hold a lock
    (TensorBoard's writer, a DataLoader queue's feeder, gloo's, an OpenMP pool, fsspec's loop) can leave the child
    waiting forever for it before it runs a line of Python: the hang of issue 47, a cv worker stuck in
    ``Popen._launch`` at a random epoch."""
    global _preloaded
    ctx = multiprocessing.get_context(method)
    if method == "forkserver" and not _preloaded:
        ctx.set_forkserver_preload(_FORKSERVER_PRELOAD + _main_imports())  # ignored once the forkserver runs
        _preloaded = True
    return ctx


def _main_imports() -> list[str]:
    """The modules the main script took its functions from (``corpus-io``: ``cli.main``). Each worker runs the main
    script again (as ``__mp_main__``), and Python 3.11's forkserver never preloads it (it looks for a
    ``main_path`` its preparation data calls ``init_main_from_path``): preloaded, what it imports is already there
    (a worker's start: 0.1 s instead of 0.5 s with the CLI's imports)."""
    main = sys.modules.get("__main__")
    names = {getattr(value, "__module__", None) for value in vars(main).values() if callable(value)} if main else set()
    return sorted(n for n in names if isinstance(n, str) and n not in ("__main__", "builtins") and n in sys.modules)


class _WorkerStart:
    """The DataLoader's ``worker_init_fn``: the worker says it started (the main process waits for it, bounded);
    from a forkserver it first takes the main process's environment as of now, as a forked worker would (the
    forkserver's is the one of the first loader's start)."""

    def __init__(self, started: list, environ: dict | None):
        self.started = started
        self.environ = environ
        self.main_pid = os.getpid()

    def __call__(self, worker: int) -> None:
        if self.environ is not None and self.environ != os.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        if os.getppid() != self.main_pid:
            threading.Thread(target=_exit_when_gone, args=(self.main_pid,), daemon=True).start()
        self.started[worker].set()


@contextlib.contextmanager
def _main_not_run_again(starting: bool) -> Iterator[None]:
    """While forkserver/spawn workers start: they do not run the main script again. multiprocessing runs it in each
    worker (as ``__mp_main__``) before unpickling, so a script without ``if __name__ == "__main__":`` would build
    its loader again in every worker (a RuntimeError), and one that trains at top level would train there. The
    dataset and tokenizer are corpus_io's, found by module name: nothing the workers need lives in the script. A
    main module whose spec is named ``__main__`` is the one multiprocessing leaves alone."""
    main = sys.modules.get("__main__")
    if not starting or main is None:
        yield
        return
    spec = getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = spec


def _exit_when_gone(main_pid: int, interval: float = 1.0) -> None:
    """A worker not forked by its main process (forkserver, spawn) ends when that process is gone (kill -9).
    torch's worker watches only its parent, here the forkserver, which lives as long as a worker holds its
    alive pipe: without this, the workers of a killed rank and their forkserver would live on, forever."""
    while True:
        time.sleep(interval)
        if not _running(main_pid):
            os._exit(0)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: a killed process its parent has not reaped yet (a zombie) does not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # the pid was reused by another user's process: ours is gone
            return False
        return True


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
            kwargs["worker_init_fn"] = _WorkerStart(started, dict(os.environ) if method == "forkserver" else None)
        in_step = self.uneven != "allow" and self.world_size > 1
        with _main_not_run_again(self.num_workers > 0 and self.conf.worker_start_method != "fork"):
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


# --------------------------------------------------------------------------- bench-loader


def _init_distributed() -> tuple[int, int]:
    """Join the gloo process group torchrun describes (WORLD_SIZE > 1); ``(rank, world_size)``."""
    import os

    import torch.distributed as dist

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist_info()


def _dump_waveforms(directory: str, batch: dict, *, train: bool, epoch: int) -> None:
    """Each row of a waveform batch after the augmentation the loader drew for it (what
    corpus_io.model.frontend applies on the device, :func:`corpus_io.audio.mix.apply_plans`) as ``<key>.wav``."""
    from corpus_io.audio import mix
    from corpus_io.loader.waveaug import write_draws, write_dump

    wav, lengths, rate = mix.as_float(batch["wav"]), batch["wav_lengths"], int(batch["sample_rate"])
    if train and batch.get("augment"):
        wav = mix.apply_plans(wav, lengths, batch["augment"], rate)
    drawn = batch.get("draws") or [None] * len(batch["keys"])
    for key, row, n, values in zip(batch["keys"], wav, lengths.tolist(), drawn):
        write_dump(directory, key, row[:n], rate)
        write_draws(directory, key, epoch, values)


def bench_loader(cfg: Any) -> dict:
    """Iterate the training loader as ``train`` builds it; print throughput, padding and drop counts.

    ``dump_keys``: write ``DIR/keys.rank{R}.epoch{E}.txt`` in consumption order (appended to when
    resuming). ``save_state_after=K`` + ``state_file``: save the loader state after K batches and
    exit; ``state_file`` alone: resume from it when it exists.
    """
    import json
    import os
    import time
    from pathlib import Path

    from corpus_io.config import require
    from corpus_io.storage.files import atomic_write, refuse_remote_output

    if not cfg.dataset_conf.sources:
        require(cfg, "data_list")
    check_values(cfg)
    refuse_remote_output(cfg.dump_keys, "++dump_keys", "bench-loader")
    refuse_remote_output(cfg.dump_audio_dir, "++dump_audio_dir", "bench-loader")
    refuse_remote_output(cfg.state_file, "++state_file", "bench-loader")
    if cfg.save_state_after and not cfg.state_file:
        raise ConfigError("save_state_after needs state_file: ++state_file=loader_state.json")
    rank, world_size = _init_distributed()
    tokenizer = None
    if cfg.tokenizer.token_list or cfg.tokenizer.bpe_model:
        from corpus_io.tokenizer import build_tokenizer

        tokenizer = build_tokenizer(cfg.tokenizer)
    state_path = None
    if cfg.state_file:
        state_path = Path(cfg.state_file.replace("{rank}", str(rank)))
        if world_size > 1 and "{rank}" not in cfg.state_file:
            state_path = state_path.with_name(f"{state_path.name}.rank{rank}")
    saved_states: list[dict] = []
    saved_paths: list[Path] = []
    if state_path is not None and not cfg.save_state_after:
        # every rank's state of the last save, whatever world size saved it (an elastic resume re-splits them)
        saved_paths, saved_states = _read_checkpoint_states(cfg.state_file)
        if saved_states and int(saved_states[0]["epoch"]) >= cfg.epochs:
            raise ConfigError(f"the loader state {saved_paths[0]} is in epoch {saved_states[0]['epoch']}, but "
                              f"epochs={cfg.epochs} ends before it, so there is nothing to resume. Raise ++epochs "
                              f"above {saved_states[0]['epoch']}, or delete {saved_paths[0]} to start afresh.")
    data_list = None if cfg.data_list in ("???", "") else cfg.data_list
    loader = build_dataloader(data_list, cfg.dataset_conf, tokenizer, train=cfg.train, rank=rank,
                              world_size=world_size)
    loader.dataset.dump_audio_dir = cfg.dump_audio_dir
    if cfg.dump_audio_dir and not saved_states:  # a fresh run's draws, not appended to an earlier run's
        from corpus_io.loader.waveaug import DRAWS_FILE

        if rank == 0:
            Path(cfg.dump_audio_dir, DRAWS_FILE).unlink(missing_ok=True)
        if world_size > 1:
            _barrier()
    if rank == 0:
        # the loader's own conf: the bucket edges (and shares) planned from the data, as the workers use them
        print("loader chain:\n" + describe_chain(loader_chain(loader.conf, tokenizer, train=cfg.train,
                                                             dump_audio_dir=cfg.dump_audio_dir)),
              file=sys.stderr, flush=True)
    resumed_epoch = None
    if saved_states:
        plan = loader.load_rank_states(saved_states)
        resumed_epoch = loader.epoch
        how = f" ({plan.describe()})" if plan is not None else ""
        print(f"rank {rank}: resuming epoch {loader.epoch} after {loader.state_dict()['batches']} batches{how}",
              flush=True)
        _barrier()  # every rank has read the states before any removes them
    dump = Path(cfg.dump_keys) if cfg.dump_keys else None
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    first_epoch = resumed_epoch if resumed_epoch is not None else 0
    consumed = 0
    summary: dict = {"epochs": []}
    for epoch in range(first_epoch, cfg.epochs):
        loader.set_epoch(epoch)
        keys_file = None
        if dump is not None:
            keys_file = open(dump / f"keys.rank{rank}.epoch{epoch}.txt", "a" if epoch == resumed_epoch else "w",
                             encoding="utf-8")
        utts = batches = 0
        seconds = padded = real = 0.0
        widths: Counter = Counter()  # the padded tensors' lengths (what the GPU computes), batches of each
        start = time.perf_counter()
        for batch in loader:
            batches += 1
            consumed += 1
            utts += len(batch["keys"])
            seconds += batch["audio_seconds"]
            width, rows_real, rows_padded = batch_shape(batch)  # the padded tensor, not each batch's longest
            widths[width] += 1
            padded += rows_padded
            real += rows_real
            if keys_file is not None:
                keys_file.write("".join(k + "\n" for k in batch["keys"]))
            if cfg.dump_audio_dir and "wav" in batch:  # feats_on=model: the waveforms as the front end mixes them
                _dump_waveforms(cfg.dump_audio_dir, batch, train=cfg.train, epoch=epoch)
            if cfg.save_state_after and consumed >= cfg.save_state_after:
                if keys_file is not None:
                    keys_file.flush()
                    os.fsync(keys_file.fileno())
                with atomic_write(state_path) as f:
                    f.write(json.dumps(loader.state_dict()))
                print(f"rank {rank}: saved loader state after {consumed} batches to {state_path}", flush=True)
                if keys_file is not None:
                    keys_file.close()
                return {"saved": str(state_path), "batches": consumed}
            if cfg.max_batches and batches >= cfg.max_batches:
                break
        elapsed = time.perf_counter() - start
        if keys_file is not None:
            keys_file.close()
        counts = loader.epoch_counts()
        row = {"epoch": epoch, "rank": rank, "utterances": utts, "batches": batches, "audio_seconds": seconds,
               "elapsed_s": elapsed, "utts_per_s": utts / elapsed if elapsed else 0.0,
               "audio_s_per_s": seconds / elapsed if elapsed else 0.0,
               "padding_ratio": (padded - real) / padded if padded else 0.0, "padded_lengths": len(widths)}
        row["dropped"], row["batched"] = split_counts(counts)
        summary["epochs"].append(row)
        reread = counts.get("resume.reread", 0)  # read again to reach the checkpoint's position: not a drop
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(row["dropped"].items()) if k != "resume.reread") or "none"
        batched = describe_batched(row["batched"])
        print(f"epoch {epoch} rank {rank}: {utts} utterances, {batches} batches, {seconds:.1f} s of audio in "
              f"{elapsed:.2f} s: {row['utts_per_s']:.1f} utt/s, {row['audio_s_per_s']:.1f} audio-s/s, "
              f"padding {100 * row['padding_ratio']:.1f}% of the padded tensors, {len(widths)} padded lengths, "
              f"dropped: {dropped}" + (f"; {batched}" if batched else "")
              + (f"; re-read after the resume: {reread} utterances" if epoch == resumed_epoch else ""), flush=True)
    if state_path is not None and not cfg.save_state_after:
        # the resumed run finished: the states are spent (rank 0 also removes those of ranks this run lacks)
        for path in {state_path, *(saved_paths if rank == 0 else [])}:
            path.unlink(missing_ok=True)
    return summary


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _checkpoint_state_paths(state_file: str) -> list[Any]:
    """Every file a save to ``state_file`` may have written: the file itself (one rank), ``<file>.rank{R}``,
    or ``state_file`` with ``{rank}`` filled in."""
    from pathlib import Path

    if "{rank}" in state_file:
        pattern = Path(state_file.replace("{rank}", "*"))
        return sorted(pattern.parent.glob(pattern.name))
    path = Path(state_file)
    return sorted(p for p in [path, *path.parent.glob(path.name + ".rank*")] if p.is_file())


def _read_checkpoint_states(state_file: str) -> tuple[list[Any], list[dict]]:
    """The states of the last save (the world size of the newest file), every rank of it, in rank order."""
    paths = _checkpoint_state_paths(state_file)
    if not paths:
        return [], []
    states = {p: _read_loader_state(p) for p in paths}
    newest = max(paths, key=lambda p: p.stat().st_mtime_ns)
    world = int(states[newest].get("world_size", 1))
    mine = {int(st.get("rank", 0)): p for p, st in states.items() if int(st.get("world_size", 1)) == world}
    missing = [r for r in range(world) if r not in mine]
    if missing:
        raise ConfigError(f"the loader state {newest} was saved by {world} ranks, but the states of rank(s) "
                          f"{', '.join(map(str, missing))} are missing next to it. Resume needs every rank's state of "
                          f"one save: restore them, or delete {newest} and its siblings to start afresh.")
    ordered = [mine[r] for r in range(world)]
    return ordered, [states[p] for p in ordered]


def _read_loader_state(path: Any) -> dict:
    """The JSON loader state bench-loader saved (``CorpusLoader.state_dict``); anything else is a DataError."""
    remedy = ("Point ++state_file= at a loader state saved by `bench-loader ++save_state_after=K ++state_file=...`, "
              "or at a path that does not exist yet to start afresh.")

    def bad(why: str) -> DataError:
        return DataError(f"state_file {path} {why}, so it is not a loader state. {remedy}")

    state = read_json_object(path, bad)
    missing = [k for k in ("version", "epoch", "workers") if k not in state]
    if missing:
        raise bad(f"has no {', '.join(repr(k) for k in missing)} entr{'y' if len(missing) == 1 else 'ies'}")
    if isinstance(state["epoch"], bool) or not isinstance(state["epoch"], int) or state["epoch"] < 0:
        raise bad(f"has epoch={state['epoch']!r}, not an epoch number")
    workers = state["workers"]
    if not isinstance(workers, dict) or not all(k.isdigit() and isinstance(w, dict) for k, w in workers.items()):
        raise bad("has a 'workers' entry that is not an object of per-worker read positions")
    if not isinstance(state.get("batches", 0), int) or not isinstance(state.get("counts", {}), dict):
        raise bad("has a malformed 'batches' or 'counts' entry")
    return state
