"""Checkpoints: atomic save/load, cv-metric ranking, pruning and averaging (FunASR names).

``output_dir/model.pt`` is the latest state (what ``resume`` reads); ``model.pt.ep{E}`` is the end of
epoch E (0-based, as FunASR); ``model.pt.ep{E}.{step}`` a mid-epoch save; ``model.pt.avg{N}`` the
average of the N best epoch checkpoints. ``cv_metrics.json`` records each epoch's cv loss/acc so
ranking never loads every checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from corpus_io.errors import ConfigError, DataError
from corpus_io.storage.files import atomic_write, read_json_object, refuse_remote_output

if TYPE_CHECKING:
    import torch

METRICS_FILE = "cv_metrics.json"
_EPOCH_RE = re.compile(r"^model\.pt\.ep(\d+)$")
_STEP_RE = re.compile(r"^model\.pt\.ep(\d+)\.(\d+)$")


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """``torch.save`` through :func:`corpus_io.storage.files.atomic_write` (a temp file in the same directory,
    fsynced, renamed, the directory fsynced): ``path`` is its old self or the whole new checkpoint."""
    import torch

    with atomic_write(path, "wb", encoding=None, newline=None, fsync=True) as f:
        torch.save(state, f)


def copy_checkpoint(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Make ``dst`` a copy of ``src`` of its own (never a hard link: ``cp other.pt exp/model.pt`` writes into
    model.pt's inode, which must not be an epoch checkpoint's too), written as :func:`save_checkpoint` writes."""
    import shutil

    with open(src, "rb") as f, atomic_write(dst, "wb", encoding=None, newline=None, fsync=True) as out:
        shutil.copyfileobj(f, out, 1 << 20)


def load_checkpoint(path: str | os.PathLike, *, key: str = "checkpoint", storage_options: dict | None = None,
                    finite: bool = True, copy_of: str | None = None) -> dict:
    """A corpus-io checkpoint's state, from a local path or an s3:// / http(s):// URL, loaded weights-only.

    ``key``: the config key that named it (said in errors). ``finite``: refuse a model holding an inf or a nan,
    naming the tensor (it would decode to nothing, or train from poison); reads of metrics and averaging, which
    check the average themselves, pass False. ``copy_of``: ``path`` is a local copy of this URL, which errors name.
    """
    import io

    import torch

    from corpus_io.storage.urls import is_remote, read_url

    local = os.fspath(path)
    where = copy_of or local
    remedy = "Give model.pt, model.pt.ep{E} or model.pt.avg{N} of a corpus-io training output_dir"
    if is_remote(local):
        source: Any = io.BytesIO(read_url(local, storage_options=storage_options))
    elif Path(local).is_dir():
        raise ConfigError(f"{key} {where} is a directory. {remedy}.")
    elif not Path(local).is_file():
        raise ConfigError(f"{key} {where} does not exist. {remedy}.")
    else:
        source = Path(local)
    try:
        # weights_only: tensors and plain containers only. A pickle that names any other callable is
        # refused before it runs (a shared model.pt must not be able to run code).
        state = torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        needs = _forbidden_global(str(exc))
        if needs is None:  # not a pickle torch can read at all (random bytes, another format)
            raise DataError(f"{key} {where} is not a PyTorch checkpoint: its bytes are neither a torch.save "
                            f"archive nor a pickle of tensors (another kind of file, or corrupt data). "
                            f"{remedy}.") from None
        raise DataError(f"{key} {where} was refused: it holds {needs}, not only tensors and plain containers, "
                        f"and loading it would run code it names. corpus-io loads checkpoints with "
                        f"weights_only=True; use a checkpoint written by corpus-io train/average, or re-save the "
                        f"weights of one you trust as a plain state dict (torch.save({{'model': "
                        f"model.state_dict()}}, path)).") from None
    except Exception as exc:  # a truncated or foreign file
        why = str(exc).split(". ")[0] or "it ends early"
        raise DataError(f"{key} {where} cannot be read ({type(exc).__name__}: {why}). It is not a corpus-io "
                        f"checkpoint or it is damaged (truncated, or changed since it was written); use another "
                        f"one (e.g. model.pt.ep{{E}}).") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise DataError(f"{key} {where} is not a corpus-io checkpoint: it has no 'model' entry ({_holds(state)}). "
                        f"A FunASR, ModelScope or WeNet model file holds another toolkit's model, which corpus-io "
                        f"cannot build. {remedy}.")
    bad = nonfinite_tensor(state["model"]) if finite else None
    if bad is not None:
        raise DataError(f"{key} {where} holds non-finite values (inf or nan) in the tensor '{bad}': a model "
                        f"with them decodes to nothing and trains nowhere. Use an earlier checkpoint "
                        f"(model.pt.ep{{E}} of that run) or retrain it (see train_conf.max_nonfinite_steps).")
    return state


def resume_path(output_dir: str | os.PathLike, resume: bool) -> Path | None:
    """``output_dir/model.pt`` when ``train_conf.resume`` continues it (it exists), else None."""
    latest = Path(output_dir) / "model.pt"
    return latest if resume and latest.is_file() else None


def _holds(state: Any) -> str:
    """What a file that is not a corpus-io checkpoint holds, in a few words."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}"
    names = [str(k) for k in list(state)[:3]]
    if state and all(hasattr(v, "shape") for v in state.values()):
        return f"a bare state dict of {len(state)} tensors such as {', '.join(repr(n) for n in names)}"
    more = ", ..." if len(state) > 3 else ""
    return f"its entries are {', '.join(repr(n) for n in names)}{more}" if names else "it is an empty dict"


def _forbidden_global(message: str) -> str | None:
    """The object a weights-only load refused, from torch's message (e.g. 'the global builtins.open'), or None when
    the load failed for another reason (bytes that are no pickle)."""
    m = re.search(r"(?:Unsupported global|GLOBAL):? (?:GLOBAL )?([\w.]+)", message)
    return f"the global {m.group(1)}" if m else None


def saved_model_conf(state: dict) -> dict | None:
    """The ``model`` block of the training config a checkpoint carries, or None (a hand-made checkpoint)."""
    from omegaconf import OmegaConf

    try:
        trained = OmegaConf.to_container(OmegaConf.create(state.get("config") or ""), resolve=True)
    except Exception:  # noqa: BLE001 - no readable config: nothing to compare
        return None
    model = trained.get("model") if isinstance(trained, dict) else None
    return model if isinstance(model, dict) and model else None


def token_list_record(tokenizer: Any) -> dict:
    """What a checkpoint records of the token list it is trained with (``"token_list"``): the file, the number of
    tokens and the sha256 of its canonical form (:func:`corpus_io.tokenizer.token_list_sha256`)."""
    from corpus_io.tokenizer import token_list_sha256

    conf = tokenizer.conf
    return {"file": str(conf.token_list or conf.bpe_model), "size": tokenizer.vocab_size,
            "sha256": token_list_sha256(tokenizer.symbols)}


_UNRECORDED_WARNED: set[str] = set()  # checkpoints without a token list record, warned about once per process


def check_token_list(state: dict, tokenizer: Any, checkpoint: str | os.PathLike) -> None:
    """Refuse a token list other than the one ``state`` was trained with: one with two tokens swapped loads and
    reads every output id as the other token. A checkpoint written before the record: a warning, once."""
    now = token_list_record(tokenizer)
    trained = state.get("token_list")
    if not isinstance(trained, dict):
        if str(checkpoint) not in _UNRECORDED_WARNED:
            _UNRECORDED_WARNED.add(str(checkpoint))
            print(f"warning: checkpoint {checkpoint} does not record its token list (it was written before corpus-io "
                  f"recorded one), so {now['file']} cannot be checked against the token list it was trained with; "
                  f"if that file changed after training, the outputs are read as other tokens.",
                  file=sys.stderr, flush=True)
        return
    if (trained.get("size"), trained.get("sha256")) != (now["size"], now["sha256"]):
        raise DataError(f"the token list {now['file']} ({now['size']} tokens, sha256 {now['sha256'][:12]}…) is not the "
                        f"one checkpoint {checkpoint} was trained with ({trained.get('size')} tokens, sha256 "
                        f"{str(trained.get('sha256'))[:12]}…, then {trained.get('file')}): it changed after training, "
                        f"and the model's outputs would be read as other tokens. Restore the training token list, or "
                        f"train (fine-tune) a model with the new one.")


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
        return _read_metrics_file(path)
    return _metrics_from_checkpoints(output_dir)


def _metrics_from_checkpoints(output_dir: str | os.PathLike, skip: int | None = None) -> dict[int, dict]:
    out = {}
    for epoch, ckpt in epoch_checkpoints(output_dir).items():
        if epoch == skip:
            continue
        metrics = load_checkpoint(ckpt, finite=False).get("cv_metrics") or {}
        if metrics:
            out[epoch] = metrics
    return out


def _read_metrics_file(path: Path) -> dict[int, dict]:
    """Parse cv_metrics.json; anything but ``{"<epoch>": {"loss": number|null, ...}, ...}`` is a DataError."""
    remedy = (f"Delete {path} (the cv metrics are then read from the model.pt.ep{{E}} checkpoints, and the file is "
              f"rewritten after the next epoch) or restore it from a backup.")

    def bad(why: str) -> DataError:
        return DataError(f"{path} (the cv metrics of each epoch, used to rank checkpoints) {why}. {remedy}")

    data = read_json_object(path, bad)
    out: dict[int, dict] = {}
    for key, value in data.items():
        try:
            epoch = int(key)
        except ValueError:
            raise bad(f"has the key {key!r}, which is not an epoch number") from None
        if not isinstance(value, dict):
            raise bad(f"has {type(value).__name__} {value!r} for epoch {key}, not an object of metrics")
        for name in ("loss", "acc"):
            v = value.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise bad(f"has {name}={v!r} for epoch {key}, which is not a number")
        out[epoch] = value
    return out


def write_metrics(output_dir: str | os.PathLike, epoch: int, metrics: dict) -> None:
    """Record ``epoch``'s cv metrics in cv_metrics.json (atomically). Without the file (deleted), the
    other epochs' metrics are recovered from their checkpoints first."""
    path = Path(output_dir) / METRICS_FILE
    current = _read_metrics_file(path) if path.is_file() else _metrics_from_checkpoints(output_dir, skip=epoch)
    current[epoch] = metrics
    with atomic_write(path) as f:
        json.dump({str(k): v for k, v in sorted(current.items())}, f, indent=1)
        f.write("\n")


def nonfinite_tensor(state: dict) -> str | None:
    """The name of the first floating-point tensor of a state dict holding an inf or a nan, or None."""
    import torch

    return next((name for name, t in state.items() if isinstance(t, torch.Tensor) and t.is_floating_point()
                 and not bool(torch.isfinite(t).all())), None)


def ranked_epochs(output_dir: str | os.PathLike, metric: str) -> list[int]:
    """Epochs with an existing checkpoint and a cv metric, best first (lowest loss or highest acc)."""
    metrics = read_metrics(output_dir)
    existing = epoch_checkpoints(output_dir)
    usable = [e for e in existing if metric in metrics.get(e, {}) and isinstance(metrics[e][metric], (int, float))
              and math.isfinite(metrics[e][metric])]  # a nan cv loss ranks nowhere
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


def average_checkpoints(output_dir: str | os.PathLike, num: int, metric: str = "loss", *, key: str | None = None,
                        warn: Callable[[str], None] | None = None) -> Path:
    """Average the model weights of the ``num`` best epoch checkpoints into ``model.pt.avg{num}``.

    The file keeps that name even when fewer than ``num`` epochs have a cv ``metric`` (recipes expect
    it); then a warning naming the averaged epochs goes to ``warn`` (default: a ``warning:`` line on
    stderr), and the checkpoint's ``averaged_epochs`` / ``requested_num`` record it. ``key``: the config
    key that gave ``num`` (``num`` for ``corpus-io average``, ``avg_nbest_model`` for train), named in
    errors and warnings.
    """

    out_dir = Path(output_dir)
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        name = key or "num"
        raise ConfigError(f"{name}={num!r}: the number of epoch checkpoints to average must be >= 1 "
                          f"(e.g. ++{name}=5).")
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
    token_lists: dict[tuple, int] = {}  # (size, sha256) -> an epoch trained with that token list
    models: dict[int, dict] = {}  # an epoch -> its model config
    for epoch in chosen:
        last = load_checkpoint(ckpts[epoch], finite=False)  # the average is checked below, naming the epochs
        _one_token_list(token_lists, last, epoch, out_dir, key)
        _one_model(models, last, epoch, out_dir, key)
        for k, v in last["model"].items():
            if k not in avg:
                avg[k] = v.detach().clone().double() if v.is_floating_point() else v.detach().clone()
            elif v.is_floating_point():
                avg[k] += v.double()
    for k, v in last["model"].items():
        if v.is_floating_point():
            avg[k] = (avg[k] / len(chosen)).to(v.dtype)
    bad = nonfinite_tensor(avg)
    if bad is not None:
        raise DataError(f"the average of epochs {chosen} of {out_dir} has non-finite values in '{bad}', so "
                        f"model.pt.avg{num} was not written. An epoch checkpoint holds inf or nan weights: "
                        f"retrain from an earlier one (see train_conf.max_nonfinite_steps).")
    path = out_dir / f"model.pt.avg{num}"
    metrics = read_metrics(out_dir)
    save_checkpoint(path, {"model": avg, "config": last.get("config"), "token_list": last.get("token_list"),
                           "averaged_epochs": chosen,
                           "requested_num": num, "cv_metrics": {e: metrics.get(e) for e in chosen},
                           "metric": metric})
    message = _shortfall_warning(num, chosen, metric, path, key=key)
    if message is not None:
        if warn is None:
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            warn(message)
    return path


def _one_token_list(seen: dict[tuple, int], state: dict, epoch: int, out_dir: Path, key: str | None) -> None:
    """Refuse to average epochs trained with different token lists (a resume with another list)."""
    record = state.get("token_list")
    if isinstance(record, dict):
        seen.setdefault((record.get("size"), record.get("sha256")), epoch)
    if len(seen) > 1:
        first, other = seen.values()
        fewer = f"a smaller ++{key}" if key else "fewer epochs"
        raise DataError(f"epochs {first} and {other} of {out_dir} were trained with different token lists, so their "
                        f"weights do not average into one model (nothing was written). Average the epochs of one "
                        f"token list ({fewer}), or train again with one token list.")


def _one_model(seen: dict[int, dict], state: dict, epoch: int, out_dir: Path, key: str | None) -> None:
    """Refuse to average epochs of different models (a streaming and a full-context run, a resume with other
    ``model.*`` keys): weights of the same shapes would average into a model that is neither."""
    from corpus_io.model.model import model_conf_changes

    conf = saved_model_conf(state)
    if conf is None:
        return
    for first, other in seen.items():
        changes = model_conf_changes(other, conf)
        if changes:
            named = "; ".join(f"{k}={a} in epoch {first}, {b} in epoch {epoch}" for k, a, b in changes[:4])
            fewer = f"a smaller ++{key}" if key else "fewer epochs"
            raise DataError(f"epochs {first} and {epoch} of {out_dir} are checkpoints of different models ({named}), "
                            f"so their weights do not average into one model (nothing was written). Average the "
                            f"epochs of one run ({fewer}), or keep each run in its own output_dir.")
        break
    seen.setdefault(epoch, conf)


def _shortfall_warning(num: int, chosen: list[int], metric: str, path: str | os.PathLike, *,
                      key: str | None = None) -> str | None:
    """The warning for an average of fewer epochs than asked for, else None."""
    if len(chosen) >= num:
        return None
    epochs = ", ".join(str(e) for e in chosen)
    asked = f"{key}={num} asked for" if key else "asked to average"
    fewer = f"average with a smaller ++{key}" if key else "ask for fewer"
    return (f"{asked} the {num} best epochs, but only {len(chosen)} epoch checkpoint"
            f"{'s have' if len(chosen) != 1 else ' has'} a cv '{metric}', so {Path(path).name} averages only "
            f"{len(chosen)} epoch{'s' if len(chosen) != 1 else ''} ({epochs}). Train more epochs with cv data, "
            f"keep more checkpoints (keep_nbest_models), or {fewer}.")


def average(cfg: Any) -> Path:
    """``corpus-io average``: write model.pt.avg{num} from the best epoch checkpoints."""
    from corpus_io.config import require

    require(cfg, "output_dir")
    refuse_remote_output(cfg.output_dir, "++output_dir", "average")  # it reads and writes a local output_dir
    path = average_checkpoints(cfg.output_dir, cfg.num, cfg.metric, key="num")
    state = load_checkpoint(path)
    chosen = state["averaged_epochs"]
    print(f"average: epochs {chosen} ({ranked_by(state.get('cv_metrics') or {}, cfg.metric)}) -> {path}")
    return path


def ranked_by(metrics: dict[int, dict | None], metric: str) -> str:
    """What the averaged epochs were ranked by: a run without a cv set records its training metrics
    (``"source": "train"``), and saying "cv" for those would misreport the model's selection."""
    train = [e for e, m in metrics.items() if (m or {}).get("source") == "train"]
    if not train:
        return f"best by cv {metric}"
    if len(train) == len(metrics):
        return f"best by training {metric}: the run had no cv set (valid_data_set_list)"
    return (f"best by cv {metric}, but epochs {train} by their training {metric}: they were trained without "
            f"a cv set (valid_data_set_list)")


# --------------------------------------------------------------------------- RNG state (saved with checkpoints)


def rng_state(device: torch.device) -> dict:
    """Every RNG's state as tensors and plain containers (checkpoints load with weights_only=True)."""
    import numpy as np
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what :func:`rng_state` saved (python, numpy, torch, and CUDA on a CUDA device)."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
