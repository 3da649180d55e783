"""torchrun / env:// set-up and the few collectives the trainer needs.

One process (no ``WORLD_SIZE`` in the environment) runs without a process group; every helper
then works locally. Under torchrun the backend is NCCL when the process has a CUDA device and gloo
otherwise; multi-node runs use torchrun's own flags (``--nnodes``, ``--rdzv-endpoint``, ...).
Under ``srun`` without torchrun (one task per GPU, ``srun --ntasks-per-node=G corpus-io train``) the
ranks come from Slurm's step variables (:func:`slurm_step_env`); ``srun torchrun`` keeps torchrun's.
"""

from __future__ import annotations

import datetime
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from corpus_io.errors import CorpusIOError


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str = ""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SLURM_PORT_BASE = 20000  # MASTER_PORT under srun when none is set: base + job id % SLURM_PORT_SPAN
SLURM_PORT_SPAN = 20000


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist (``gpu[07-09,12],cpu1`` -> ``gpu07``), without calling scontrol."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", nodelist.strip())
    prefix, ranges = match.group(1), match.group(2)
    return prefix + ranges.split(",", 1)[0].split("-", 1)[0] if ranges else prefix


def slurm_step_env(environ: dict) -> dict[str, str]:
    """torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) for a task that ``srun``
    started directly, from ``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS``/``SLURM_LOCALID`` and the step's first
    node; empty outside an srun step (a batch script has no ``SLURM_STEP_ID``) or when torchrun set them.
    MASTER_ADDR/MASTER_PORT already in the environment win; otherwise the port is derived from the job id,
    so every task of the step agrees on it without talking."""
    if "WORLD_SIZE" in environ or "SLURM_STEP_ID" not in environ or "SLURM_PROCID" not in environ:
        return {}
    world = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or "1"
    port = SLURM_PORT_BASE + int(environ.get("SLURM_JOB_ID", "0")) % SLURM_PORT_SPAN
    return {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": world, "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
            "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(environ.get("SLURM_STEP_NODELIST", "")
                                                                    or environ.get("SLURM_NODELIST", "localhost")),
            "MASTER_PORT": environ.get("MASTER_PORT") or str(port)}


def init_distributed(device: str = "auto", timeout_s: int = 600) -> DistContext:
    """Read RANK/WORLD_SIZE/LOCAL_RANK (torchrun, or srun's via :func:`slurm_step_env`), pick the device and
    init the process group."""
    os.environ.update(slurm_step_env(dict(os.environ)))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        from corpus_io.errors import ConfigError

        raise ConfigError("train_conf.device=cuda but no CUDA device is visible. Use ++train_conf.device=auto or cpu.")
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank, device=dev)
    if world > 1 and not dist.is_initialized():
        ctx.backend = "nccl" if use_cuda else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        kwargs: dict[str, Any] = {"backend": ctx.backend, "timeout": timeout}
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun shares its rendezvous TCPStore with the workers, and it outlives a restart:
            # without a per-attempt prefix a restarted gloo/NCCL group reads the dead attempt's
            # addresses (pytorch#135712). Same store as env://, keys isolated by restart count.
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                  is_master=False, timeout=timeout)
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            kwargs.update(store=dist.PrefixStore(f"corpus_io/attempt{attempt}", store), rank=rank, world_size=world)
        else:
            kwargs["init_method"] = "env://"
        if use_cuda:
            kwargs["device_id"] = dev
        try:
            dist.init_process_group(**kwargs)
        except dist.DistNetworkError as exc:
            if "EADDRINUSE" not in str(exc):
                raise
            from corpus_io.errors import ConfigError

            raise ConfigError(f"rank {rank}: port {os.environ.get('MASTER_PORT')} on {os.environ.get('MASTER_ADDR')} "
                              f"is in use, so this run's rendezvous server (rank 0 listens on MASTER_PORT) cannot "
                              f"start there: another training run on this node holds it. Set another free port in "
                              f"the environment, MASTER_PORT=N (under srun without it the port is {SLURM_PORT_BASE} + "
                              f"the job id % {SLURM_PORT_SPAN}; torchrun: --master_port=N or --rdzv-endpoint)."
                              ) from None
    return ctx


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _tensor(ctx: DistContext, values: list[float], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    # NCCL needs device tensors; gloo works on CPU tensors.
    dev = ctx.device if ctx.backend == "nccl" else torch.device("cpu")
    return torch.tensor(values, dtype=dtype, device=dev)


def all_reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise sum over ranks (local values when not distributed)."""
    if not ctx.distributed:
        return list(values)
    t = _tensor(ctx, values)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().tolist()


def all_gather_object(ctx: DistContext, obj: Any) -> list[Any]:
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(ctx: DistContext, obj: Any, src: int = 0) -> Any:
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def average_gradients(ctx: DistContext, params: list[torch.nn.Parameter]) -> None:
    """Mean of ``.grad`` over ranks, for a step DDP did not sync (the last, partial accumulation)."""
    if not ctx.distributed:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(ctx.world_size)


def rank_disagreement(views: list[dict]) -> str | None:
    """What the ranks' ``{"resume": ..., "lists": ...}`` views disagree on, as an error message, or None."""
    for what, explain in (("resume", "resume point (epoch, step in epoch, global step)"),
                          ("lists", "train list (digest of its shards and index)")):
        if len({repr(v[what]) for v in views}) > 1:
            seen = "; ".join(f"rank {r}: {v[what]}" for r, v in enumerate(views))
            return (f"the ranks disagree on their {explain}: {seen}. Every rank must see the same output_dir "
                    f"(checkpoints) and the same data lists and index: put them on storage all nodes share, or "
                    f"copy them identically.")
    return None



class LauncherGone(CorpusIOError):
    """This rank's torchrun launcher died (killed, or its node agent crashed), so the rank stops instead of
    training on as an orphan. One paragraph in the CLI, exit 1 (not the user's mistake, but theirs to rerun)."""

    exit_code = 1


class LauncherWatch:
    """Under torchrun (``TORCHELASTIC_RUN_ID`` set) a rank is a child of its node's agent, the launcher; when the
    launcher dies the kernel re-parents the rank (to init or a subreaper), so :func:`os.getppid` changes. A check
    costs one system call, so the trainer makes it before every micro-batch; a rank started any other way (one
    process, srun) has no launcher to watch, and a parent that exits (nohup, a closed shell) stops nothing.

    Not ``PR_SET_PDEATHSIG``: it fires when the parent *thread* that started the rank exits, which a launcher that
    starts workers from a helper thread does while alive; and it would kill a rank wherever it is, e.g. between
    a checkpoint's write and its rename (harmless with atomic writes, but a check at a step is a clean stop)."""

    def __init__(self, environ: dict | None = None) -> None:
        env = os.environ if environ is None else environ
        self.pid = os.getppid() if env.get("TORCHELASTIC_RUN_ID") else None

    def gone(self) -> bool:
        return self.pid is not None and os.getppid() != self.pid

    def check(self, rank: int, where: str, output_dir: str) -> None:
        """Raise :class:`LauncherGone` when the launcher died."""
        if self.gone():
            raise LauncherGone(f"rank {rank}: its torchrun launcher (pid {self.pid}) is gone (killed, or it "
                               f"crashed), so this rank stops at {where} instead of training on alone, beside a "
                               f"rerun. {output_dir} holds the last checkpoint: rerun the same torchrun command "
                               f"to resume from it.")


class PeerStop:
    """One rank's failure said on every rank. A rank that stops on an error the others cannot see (its DataLoader
    worker never started) :meth:`publish`\\ es its paragraph to the process group's store; a daemon thread on every
    rank checks the store once per ``poll_s``, and a rank that finds a peer's paragraph prints it and exits at once
    (it may be waiting in a collective that will never complete: without this it would sit there until
    ``train_conf.timeout_s`` and end with gloo's traceback). The publisher waits (at most ``ack_s``) until every
    peer said it, then raises its own error as usual."""

    KEY = "corpus_io/peer_stop"

    def __init__(self, ctx: DistContext, poll_s: float = 1.0, ack_s: float = 10.0) -> None:
        import threading

        self.ctx, self.poll_s, self.ack_s = ctx, poll_s, ack_s
        self.store = dist.distributed_c10d._get_default_store() if ctx.distributed else None
        self._done = threading.Event()
        if self.store is not None:
            threading.Thread(target=self._watch, name="corpus-io-peer-stop", daemon=True).start()

    def publish(self, message: str) -> None:
        """Tell the other ranks why this rank stops; returns once they said it (or after ``ack_s``)."""
        if self.store is None:
            return
        self._done.set()  # this rank reports its own error: the watcher leaves it alone
        self.store.set(self.KEY, f"{self.ctx.rank}\n{message}")
        self.store.add(self.KEY + "/told", 1)  # every rank that said it: this one, peers that printed or stopped too
        deadline = time.monotonic() + self.ack_s
        while self.store.add(self.KEY + "/told", 0) < self.ctx.world_size and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            try:
                if not self.store.check([self.KEY]):
                    continue
                rank, message = self.store.get(self.KEY).decode("utf-8", "replace").split("\n", 1)
            except Exception:  # the store is gone: the run is ending anyway
                return
            if self._done.is_set() or int(rank) == self.ctx.rank:
                return
            sys.stderr.write(f"error: rank {self.ctx.rank} stops because rank {rank} did: {message}\n")
            sys.stderr.flush()
            try:
                self.store.add(self.KEY + "/told", 1)
            finally:
                exit_now(CorpusIOError.exit_code)


def exit_now(code: int) -> None:
    """``os._exit(code)``: no interpreter teardown (where gloo's and the TCPStore's C++ threads can abort a rank),
    but multiprocessing's own clean-up first. Loader workers started from a forkserver share Events and queues
    whose named semaphores the resource tracker holds until their finalizers run; os._exit skips them, and the
    tracker then ends the run with ``resource_tracker: ... leaked semaphore objects``. So: unreachable objects
    collected, and the finalizers multiprocessing runs at exit (``exitpriority >= 0``: the semaphores unlinked)."""
    import gc
    from multiprocessing import util

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        gc.collect()
        util._run_finalizers(0)
    finally:
        os._exit(code)
