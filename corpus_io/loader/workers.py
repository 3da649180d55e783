"""DataLoader worker processes: how they start, what the forkserver preloads, and how they watch their rank.

* :func:`worker_context`: the multiprocessing context of ``dataset_conf.worker_start_method``; the default,
  forkserver, never forks a worker from the training process once its threads run (the hang of issue 47), and
  preloads what a worker needs.
* :func:`start_forkserver`: start that forkserver early (``train`` before it joins its process group,
  :func:`corpus_io.loader.dataset.build_dataloader` before it reads the lists): a fork of the rank while no other
  thread runs (:func:`_forkable`; it shares the rank's torch with the workers), else exec'd, its imports then
  overlapping the loader's set-up; :func:`forkserver_ready` waits until it can fork a worker (the bench times the
  start apart with it).
* :class:`WorkerStart` (``worker_init_fn``): a worker says it started and takes the main process's environment;
  not forked by its rank, it ends when the rank is gone (:func:`_exit_when_gone`).
* :func:`release_freed_memory`: a worker hands the pages it freed back to the system after each batch (glibc's
  heap otherwise keeps the peak of the batched features' temporaries in every worker).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib.machinery
import logging
import multiprocessing
import os
import sys
import threading
import time
from typing import Any, Iterator

from corpus_io.errors import DataError

log = logging.getLogger(__name__)


class WorkerStartTimeout(DataError):
    """A DataLoader worker did not start within ``dataset_conf.worker_start_timeout`` (or exited before it did).
    ``train`` says it on every rank (corpus_io.train.distributed.PeerStop), not only on this one."""


#: imported once in the forkserver, before it forks a worker: a worker's start is then a fork and an unpickling
_FORKSERVER_PRELOAD = ["__main__", "torch", "numpy.random", "multiprocessing.queues", "multiprocessing.synchronize",
                       "corpus_io.tokenizer", "corpus_io.loader.dataset", "corpus_io.loader.workers",
                       "corpus_io.loader.stages", "corpus_io.loader.waveaug", "corpus_io.loader.shapes",
                       "corpus_io.shards.kinds", "corpus_io.shards.reader", "corpus_io.tables.shar",
                       "corpus_io.audio.features"]
#: imported after the preload (and the main script's imports): freezes what they made (gc.freeze)
_FORKSERVER_LAST = ["corpus_io.loader.preloaded"]
_preloaded = False


def worker_context(method: str) -> Any:
    """The multiprocessing context DataLoader workers start with (``dataset_conf.worker_start_method``).

    The default, forkserver, never forks a worker from this process: its workers are forked from one helper
    process, which runs no threads (:func:`start_forkserver`: forked from this process before any other thread
    runs, else exec'd). A fork of a process whose other threads hold a lock
    (TensorBoard's writer, a DataLoader queue's feeder, gloo's, an OpenMP pool, fsspec's loop) can leave the child
    waiting forever for it before it runs a line of Python: the hang of issue 47, a cv worker stuck in
    ``Popen._launch`` at a random epoch."""
    global _preloaded
    ctx = multiprocessing.get_context(method)
    if method == "forkserver" and not _preloaded:
        # ignored once the forkserver runs
        ctx.set_forkserver_preload(_preload_modules())
        _preloaded = True
    return ctx


def _preload_modules() -> list[str]:
    """What the forkserver imports before it forks a worker: the preload, the main script's imports, then the
    freeze (:data:`_FORKSERVER_LAST`)."""
    return _FORKSERVER_PRELOAD + _main_imports() + _FORKSERVER_LAST


def _main_imports() -> list[str]:
    """The modules the main script took its functions from (``corpus-io``: ``cli.main``). Each worker runs the main
    script again (as ``__mp_main__``), and Python 3.11's forkserver never preloads it (it looks for a
    ``main_path`` its preparation data calls ``init_main_from_path``): preloaded, what it imports is already there
    (a worker's start: 0.1 s instead of 0.5 s with the CLI's imports)."""
    main = sys.modules.get("__main__")
    names = {getattr(value, "__module__", None) for value in vars(main).values() if callable(value)} if main else set()
    return sorted(n for n in names if isinstance(n, str) and n not in ("__main__", "builtins") and n in sys.modules)


class WorkerStart:
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
def main_not_run_again(starting: bool) -> Iterator[None]:
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


def start_forkserver(method: str) -> None:
    """Start the forkserver of ``method`` now, if it is one and not running, so the first epoch does not wait for it.

    Forked from this process when that is safe (:func:`_forkable`): the server then shares this process's torch
    (about 250 MB a process holds privately once it imports torch) with every worker, instead of importing its
    own. Otherwise started as Python's forkserver is (fork + exec: a fresh interpreter importing the preload, in
    seconds, while this process reads its lists). ``train`` calls it before it joins its process group."""
    if method != "forkserver" or multiprocessing.current_process().daemon:  # a daemon's loader runs inline
        return
    from multiprocessing import forkserver

    worker_context(method)  # the preload list, before the server starts
    with main_not_run_again(True):
        if not _fork_forkserver():
            forkserver.ensure_running()


#: a process holding more than this (RSS, bytes) starts its forkserver by exec: a forked server would keep a
#: copy of each page this process later writes (a model built before the loader, then trained)
FORK_SERVER_MAX_RSS = 2 << 30


def _forkable() -> str:
    """Why this process must not fork its forkserver ("" when it may). A fork is safe while no other thread can
    hold a lock the child needs: no other Python thread, no process group (gloo's and NCCL's threads), no CUDA
    context. Threads of OpenBLAS and torch's OpenMP pool may run: they reset themselves in a forked child (a
    DataLoader's fork workers rely on it too)."""
    if sys.version_info >= (3, 13):  # the server's private layout checked below is Python 3.11/3.12's
        return "Python >= 3.13"
    if threading.active_count() > 1:
        return f"{threading.active_count() - 1} other Python thread(s)"
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return "a process group"
        if torch.cuda.is_initialized():
            return "a CUDA context"
    try:
        with open("/proc/self/statm", "rb") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return "no /proc"
    return "over 2 GiB resident" if resident > FORK_SERVER_MAX_RSS else ""


def _fork_forkserver() -> bool:
    """Start Python's forkserver as a fork of this process (:func:`start_forkserver`), when :func:`_forkable`;
    False when it was not (the caller starts it the usual way). The server runs ``multiprocessing.forkserver.main``
    as the exec'd one would, with only its listener, its alive pipe and stdio open, and the default signal
    handlers (a worker must not run this process's)."""
    from multiprocessing import connection, forkserver, resource_tracker, util

    server = forkserver._forkserver
    if not all(hasattr(server, name) for name in ("_lock", "_forkserver_pid", "_forkserver_alive_fd",
                                                  "_forkserver_address")):
        return False
    with server._lock:
        if server._forkserver_pid is not None:
            return False  # started: ensure_running checks that it still runs
        why_not = _forkable()
        if why_not:
            log.debug("forkserver started by exec, not forked from this process: %s", why_not)
            return False
        resource_tracker.ensure_running()  # fork + exec of its own, before the server forks
        preload = [name for name in _preload_modules() if name != "__main__"]  # forked: __main__ is there
        import socket

        listener = socket.socket(socket.AF_UNIX)
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # else the server's children would print this process's buffer
            with contextlib.suppress(Exception):
                stream.flush()
        import gc

        # what this process holds now (torch's objects, mostly) is never walked by its collector again: a
        # collection writes to each object it visits, and so would copy their shared pages into this process
        gc.collect()
        gc.freeze()
        import warnings

        try:
            with warnings.catch_warnings():  # Python 3.12 warns of any fork beside threads (OpenBLAS's: _forkable)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:  # no memory or process left for it: the usual start says why, if it fails too
            listener.close()
            os.close(alive_r)
            os.close(alive_w)
            return False
        if pid == 0:
            server._lock = threading.Lock()  # held by the parent's ``with`` at the fork
            _run_forked_server(listener.fileno(), alive_r, alive_w, preload)
        listener.close()
        os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
    return True


def _run_forked_server(listener_fd: int, alive_r: int, alive_w: int, preload: list[str]) -> None:
    """The forked forkserver's life (never returns): what this process had open and its signal handlers are
    dropped first, then the server loop runs until every client is gone."""
    import gc
    import signal

    code = 0
    try:
        gc.freeze()  # this process's objects stay as they are: none is collected (and its file closed) here
        os.close(alive_w)
        keep = {0, 1, 2, listener_fd, alive_r}
        for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
            if int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        for sig in signal.valid_signals():
            with contextlib.suppress(OSError, ValueError, TypeError):
                if sig == signal.SIGINT:
                    signal.signal(sig, signal.default_int_handler)
                elif callable(signal.getsignal(sig)):
                    signal.signal(sig, signal.SIG_DFL)
        from multiprocessing import forkserver

        forkserver.main(listener_fd, alive_r, preload)
    except SystemExit:
        pass  # every client is gone
    except BaseException:
        code = 1
        with contextlib.suppress(Exception):
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
    finally:
        os._exit(code)


def forkserver_ready(method: str) -> float:
    """Seconds until a process of ``method`` has started and ended (a forkserver's preload done): how long a
    worker start waits for the server. 0 without a forkserver."""
    if method != "forkserver":
        return 0.0
    t = time.perf_counter()
    start_forkserver(method)
    with main_not_run_again(True):
        probe = worker_context(method).Process(target=_nothing)
        probe.start()
    probe.join()
    return time.perf_counter() - t


def _nothing() -> None:
    """The forkserver's readiness probe (:func:`forkserver_ready`)."""


_malloc_trim: Any = None


def release_freed_memory() -> None:
    """Give the heap pages free in this process back to the system (glibc ``malloc_trim``; nothing elsewhere).

    A worker's batched features allocate tens of MB of temporaries per call; glibc serves them from its heap
    (after the first, its mmap threshold rises to their size) and keeps what they freed: without this, every
    worker held 200-300 MB of freed heap (issue 53). Called in a worker after each batch it hands over."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)
