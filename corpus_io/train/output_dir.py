"""A training run's output_dir, claimed before anything is written: rank 0 takes its lock (``train.lock``, one run
per output_dir); a fresh run never starts beside another run's checkpoints (``train_conf.overwrite_output_dir``
clears them, never a file the run reads); the files the run writes or appends to are never its inputs nor
symbolic links out of the dir."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from corpus_io.errors import ConfigError, DataError
from corpus_io.model import checkpoint as ckpt
from corpus_io.storage.files import HeldLock, ensure_dir, input_of, try_lock
from corpus_io.train.distributed import DistContext, all_gather_object

LOCK_FILE = "train.lock"
#: what a run leaves in output_dir that a fresh run must not rank, prune or average with its own
_RUN_FILES = re.compile(r"^(model\.pt(\.ep\d+(\.\d+)?|\.avg\d+)?|cv_metrics\.json"
                        r"|(trained|unused)_keys\.rank\d+\.txt)$")


def claim_output_dir(out: Path, ctx: DistContext, tc: Any,
                     reads: list[tuple[str, str | None]] = ()) -> tuple[HeldLock | None, list[str]]:
    """Rank 0 makes ``out`` and takes its lock (``train.lock``) for the run; a fresh run (no ``model.pt`` to resume)
    into a dir holding another run's checkpoints is refused, or clears them with ``train_conf.overwrite_output_dir``
    (never one of the files the run reads, ``reads``: :func:`run_inputs`). Collective: every rank raises the same
    ConfigError. Returns rank 0's lock and what to log.

    Only rank 0 holds the lock: it alone writes what two runs would mix (checkpoints, model.pt, cv_metrics.json,
    averages, train.log), and no other rank can take a step without it (every step is a collective with rank 0),
    while a lock every rank held would have to be a shared lock, which a second run's ranks could share too.
    The lock file keeps the pid of its last holder: a refused run puts back the one it found (a killed run's)."""
    problem, lock, notes = None, None, []
    if ctx.is_main:
        ensure_dir(out, what="output_dir")
        try:
            held = try_lock(out / LOCK_FILE)
        except DataError as exc:
            held, problem = None, str(exc)
        if isinstance(held, str):
            pid, _, host = held.partition(" ")
            problem = (f"output_dir {out} is in use by another training run: its rank 0, pid {pid}"
                       f"{f' on {host}' if host else ''}, holds {out / LOCK_FILE}, and two runs in one output_dir "
                       f"would overwrite each other's checkpoints and train keys twice. Wait for that run to end "
                       f"(or stop it: kill {pid}), or give this run another ++output_dir. Nothing was written.")
        elif held is not None:
            lock = held
            problem = _linked_appends(out) or _written_inputs(out, reads)
            if problem is None:
                problem, notes = _fresh_start(out, tc, reads)
            if problem is not None:
                lock.release(restore=True)
                lock = None
    problems = all_gather_object(ctx, problem)
    if problems[0] is not None:
        raise ConfigError(problems[0])
    return lock, notes


def run_inputs(cfg: Any, init_param: str | None) -> list[tuple[str, str | None]]:
    """``(name, path)`` of the files a training run reads (the init checkpoint, CMVN stats, token list, BPE model,
    the data lists and their index sidecars): what ``overwrite_output_dir`` must never delete, and what the run's
    own files in output_dir must not be."""
    from corpus_io.model.cmvn import source_inputs
    from corpus_io.shards.index import list_and_sidecar

    return [("++init_param", init_param), ("++cmvn_file", cfg.cmvn_file),
            ("++tokenizer.token_list", cfg.tokenizer.token_list), ("++tokenizer.bpe_model", cfg.tokenizer.bpe_model),
            *source_inputs(cfg.dataset_conf),
            *(named for key in ("train_data_set_list", "valid_data_set_list") if getattr(cfg, key)
              for named in list_and_sidecar(f"++{key}", getattr(cfg, key)))]


#: the files of output_dir every run writes under these names (epoch checkpoints: see _fresh_start)
_WRITTEN = ("model.pt", "config.yaml", "train.log", ckpt.METRICS_FILE)


def _written_inputs(out: Path, reads: list[tuple[str, str | None]]) -> str | None:
    """The refusal of an output_dir where a file the run writes is one of the files it reads."""
    from corpus_io.storage.files import refuse_overwriting_inputs

    try:
        refuse_overwriting_inputs([(f"output_dir's {name}", out / name) for name in _WRITTEN], reads)
    except ConfigError as exc:
        return f"{exc} Nothing was written."
    return None


#: the files of output_dir a run opens and appends to (not written under a temp name and renamed)
_APPENDED = ("train.log", "log/train.rank*.log", "trained_keys.rank*.txt", "unused_keys.rank*.txt")


def _linked_appends(out: Path) -> str | None:
    """The refusal of an output_dir whose log or key-record files are symbolic links: appending to them would
    write into the files they point to, outside output_dir (checkpoints and metrics are renamed into place, which
    replaces a link, not its target)."""
    links = sorted(p for pattern in _APPENDED for p in out.glob(pattern) if p.is_symlink())
    if not links:
        return None
    shown = ", ".join(f"{p} -> {os.readlink(p)}" for p in links[:3]) + (f" and {len(links) - 3} more"
                                                                        if len(links) > 3 else "")
    return (f"output_dir {out} holds symbolic links where training appends its logs and key records ({shown}); "
            f"the run would write into the files they point to. Remove the links (the run creates its own files), "
            f"or give another ++output_dir. Nothing was written.")


def _fresh_start(out: Path, tc: Any, reads: list[tuple[str, str | None]] = ()) -> tuple[str | None, list[str]]:
    """``(refusal, notes)`` for a run that starts afresh in ``out``: None when it resumes model.pt or the dir holds
    no checkpoint; with ``overwrite_output_dir`` the old run's files are deleted and named in the notes, unless one
    of them is a file this run reads (``reads``), which refuses the run, nothing deleted."""
    if tc.resume and (out / "model.pt").is_file():
        if tc.overwrite_output_dir:
            return None, [f"train_conf.overwrite_output_dir is not applied: {out / 'model.pt'} is there to resume "
                          f"(train_conf.resume=true), so this run continues it and deletes nothing. To start "
                          f"afresh over it, pass ++train_conf.resume=false as well."]
        return None, []
    old = sorted(p.name for p in out.iterdir() if _RUN_FILES.match(p.name))
    if not any(name.startswith("model.pt") or name == ckpt.METRICS_FILE for name in old):
        return None, []
    shown = ", ".join(old[:4]) + (f" and {len(old) - 4} more" if len(old) > 4 else "")
    if tc.overwrite_output_dir:
        for name in old:
            found = input_of(out / name, reads)
            if found is not None:
                key, path, how = found
                return (f"train_conf.overwrite_output_dir would delete {out / name}, one of the previous run's files "
                        f"in output_dir {out}, but this run reads it: it is {key}={path}{how} (and the new run "
                        f"would write its own {name} there). Copy it out of output_dir first (e.g. cp {out / name} "
                        f"init.pt, then ++init_param=init.pt), or give this run another ++output_dir. Nothing was "
                        f"deleted or written."), []
        for name in old:
            (out / name).unlink(missing_ok=True)
        return None, [f"train_conf.overwrite_output_dir: deleted the previous run's {shown} from {out}"]
    why = "train_conf.resume=false" if not tc.resume else "there is no model.pt to resume"
    return (f"output_dir {out} holds another run's checkpoints ({shown}), and this run would start afresh ({why}): "
            f"its epochs would then be ranked, pruned and averaged (model.pt.avg{{N}}) together with that run's. "
            f"Start the new run in another ++output_dir, continue that run with ++train_conf.resume=true (its "
            f"model.pt), or replace it with ++train_conf.overwrite_output_dir=true (its checkpoints, "
            f"cv_metrics.json and key lists are deleted first). Nothing was written."), []
