"""Checkpoints: atomic save/load, cv-metric ranking, pruning and averaging (FunASR names).

``output_dir/model.pt`` is the latest state (what ``resume`` reads); ``model.pt.ep{E}`` is the end of
epoch E (0-based, as FunASR); ``model.pt.ep{E}.{step}`` a mid-epoch save; ``model.pt.avg{N}`` the
average of the N best epoch checkpoints. ``cv_metrics.json`` records each epoch's cv loss/acc so
ranking never loads every checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from corpus_io.errors import ConfigError, DataError
from corpus_io.files import atomic_write, temp_name

METRICS_FILE = "cv_metrics.json"
_EPOCH_RE = re.compile(r"^model\.pt\.ep(\d+)$")
_STEP_RE = re.compile(r"^model\.pt\.ep(\d+)\.(\d+)$")


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """``torch.save`` to a temp name in the same directory, fsync, then ``os.replace``."""
    import torch

    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(final)
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Make ``dst`` hold the same bytes as ``src`` atomically (hard link, else copy)."""
    import shutil

    dst = Path(dst)
    tmp = temp_name(dst)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def load_checkpoint(path: str | os.PathLike) -> dict:
    import torch

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"checkpoint {p} does not exist. Point checkpoint= at model.pt, model.pt.ep{{E}} "
                          f"or model.pt.avg{{N}} in the training output_dir.")
    try:
        state = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise DataError(f"checkpoint {p} cannot be read ({type(exc).__name__}: {exc}). It is not a corpus-io "
                        f"checkpoint or it is damaged; use another one (e.g. model.pt.ep{{E}}).") from None
    if not isinstance(state, dict) or "model" not in state:
        raise DataError(f"checkpoint {p} has no 'model' entry; it was not written by corpus-io train.")
    return state


def epoch_checkpoints(output_dir: str | os.PathLike) -> dict[int, Path]:
    out = {}
    for p in Path(output_dir).iterdir():
        m = _EPOCH_RE.match(p.name)
        if m:
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


def step_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, int, Path]]:
    out = []
    for p in Path(output_dir).iterdir():
        m = _STEP_RE.match(p.name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), p))
    return sorted(out)


def read_metrics(output_dir: str | os.PathLike) -> dict[int, dict]:
    """``{epoch: {"loss": .., "acc": ..}}`` from cv_metrics.json, else from the epoch checkpoints."""
    path = Path(output_dir) / METRICS_FILE
    if path.is_file():
        return {int(k): v for k, v in json.loads(path.read_text(encoding="utf-8")).items()}
    out = {}
    for epoch, ckpt in epoch_checkpoints(output_dir).items():
        metrics = load_checkpoint(ckpt).get("cv_metrics") or {}
        if metrics:
            out[epoch] = metrics
    return out


def write_metrics(output_dir: str | os.PathLike, epoch: int, metrics: dict) -> None:
    path = Path(output_dir) / METRICS_FILE
    current = read_metrics(output_dir) if path.is_file() else {}
    current[epoch] = metrics
    with atomic_write(path) as f:
        json.dump({str(k): v for k, v in sorted(current.items())}, f, indent=1)
        f.write("\n")


def ranked_epochs(output_dir: str | os.PathLike, metric: str) -> list[int]:
    """Epochs with an existing checkpoint and a cv metric, best first (lowest loss or highest acc)."""
    metrics = read_metrics(output_dir)
    existing = epoch_checkpoints(output_dir)
    usable = [e for e in existing if metric in metrics.get(e, {}) and metrics[e][metric] is not None]
    sign = 1.0 if metric == "loss" else -1.0
    return sorted(usable, key=lambda e: (sign * float(metrics[e][metric]), -e))


def prune(output_dir: str | os.PathLike, keep: int, metric: str, *, current_epoch: int) -> list[Path]:
    """Delete epoch checkpoints outside the ``keep`` best, and mid-epoch saves of finished epochs."""
    removed = []
    if keep > 0:
        ranked = ranked_epochs(output_dir, metric)
        existing = epoch_checkpoints(output_dir)
        for epoch in ranked[keep:]:
            if epoch != current_epoch:
                existing[epoch].unlink(missing_ok=True)
                removed.append(existing[epoch])
    for epoch, _, path in step_checkpoints(output_dir):
        if epoch <= current_epoch:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def average_checkpoints(output_dir: str | os.PathLike, num: int, metric: str = "loss") -> Path:
    """Average the model weights of the ``num`` best epoch checkpoints into ``model.pt.avg{num}``."""

    out_dir = Path(output_dir)
    if not out_dir.is_dir():
        raise ConfigError(f"output_dir {out_dir} does not exist; give the training output_dir.")
    ranked = ranked_epochs(out_dir, metric)
    if not ranked:
        raise ConfigError(f"{out_dir} has no epoch checkpoint (model.pt.ep{{E}}) with a cv '{metric}'. Train with "
                          f"valid_data_set_list set, or average with ++metric=loss|acc that was recorded.")
    chosen = ranked[:num]
    ckpts = epoch_checkpoints(out_dir)
    avg: dict[str, Any] = {}
    last: dict = {}
    for epoch in chosen:
        last = load_checkpoint(ckpts[epoch])
        for k, v in last["model"].items():
            if k not in avg:
                avg[k] = v.detach().clone().double() if v.is_floating_point() else v.detach().clone()
            elif v.is_floating_point():
                avg[k] += v.double()
    for k, v in last["model"].items():
        if v.is_floating_point():
            avg[k] = (avg[k] / len(chosen)).to(v.dtype)
    path = out_dir / f"model.pt.avg{num}"
    metrics = read_metrics(out_dir)
    save_checkpoint(path, {"model": avg, "config": last.get("config"), "averaged_epochs": chosen,
                           "cv_metrics": {e: metrics.get(e) for e in chosen}, "metric": metric})
    return path


def average(cfg: Any) -> Path:
    """``corpus-io average``: write model.pt.avg{num} from the best epoch checkpoints."""
    from corpus_io.config import require

    require(cfg, "output_dir")
    path = average_checkpoints(cfg.output_dir, cfg.num, cfg.metric)
    chosen = load_checkpoint(path)["averaged_epochs"]
    print(f"average: epochs {chosen} (best by cv {cfg.metric}) -> {path}")
    return path
