"""Starting a run from another run's weights: ``init_param`` (FunASR's and ESPnet's key; WeNet's ``--checkpoint``,
icefall's ``--init``). The model weights of a corpus-io checkpoint (model.pt, .ep{E}, .ep{E}.{step}, .avg{N}, or an
s3:// / http(s):// URL; loaded weights-only) with a fresh optimizer, scheduler and data position (epoch 0).

* The model config comes from the checkpoint; ``model.*`` keys (or ``model=PRESET``) given on the command line apply
  over it (``config.keep_given_model`` keeps only those). With no token list given, the tokenizer comes from it too.
* ``train_conf.ignore_init_mismatch``: tensors whose shape changed (a new token list: the output layer), or that the
  checkpoint lacks, keep their fresh init and are named in the log; without it they are an error.
  ``init_param_excludes``: name prefixes left at their fresh init.
* A missing file, another toolkit's model, or tensors that do not fit are an error before anything is written to
  output_dir and before any step (:func:`prepare` runs before the process group, :func:`load_weights` before the
  output_dir is made).
* ``train_conf.resume`` finding output_dir/model.pt wins, as in FunASR and WeNet: the run continues where it stopped
  and init_param is not read; a checkpoint there whose weights do not fit the model this run builds is refused
  with the model.* keys (or the tensors) that differ (:func:`model_mismatch`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from corpus_io.config.dataset import FEATURE_KEYS, NOT_FEATURES
from corpus_io.errors import ConfigError, DataError
from corpus_io.model import checkpoint as ckpt
from corpus_io.storage.urls import is_remote

#: dataset_conf keys that decide the features a model was trained on (not the batching or augmentation)
_FIT = ("(a token list of another size changes the output layer, dataset_conf.fbank_conf.num_mel_bins the input "
        "layer, model.* sizes the rest)")


@dataclass
class Start:
    """Where the model starts: ``weights`` to copy into it (None: resuming output_dir/model.pt, init_param not read),
    the record of the token list they were trained with, and the lines to log once the log is open."""

    source: str
    weights: dict | None
    notes: list[str] = field(default_factory=list)
    token_list: dict | None = None


def prepare(cfg: Any, ctx: Any = None) -> Start | None:
    """Before the model is built: read the checkpoint the run starts from and complete ``cfg.model`` (and an unset
    tokenizer) from its config. None without ``init_param``. ``ctx``: the run's DistContext; an ``init_param`` URL
    is then downloaded once per node (:func:`node_copy`), and every rank raises the same error."""
    if not cfg.init_param:
        if cfg.init_param_excludes:
            raise ConfigError(f"init_param_excludes={list(cfg.init_param_excludes)} is set but init_param is not; "
                              f"set ++init_param=<checkpoint> to start from one, or drop init_param_excludes.")
        return None
    resumed = ckpt.resume_path(cfg.output_dir, cfg.train_conf.resume)
    if resumed is not None:
        complete_config(cfg, ckpt.load_checkpoint(resumed), str(resumed), "checkpoint")
        return Start(str(resumed), None, [
            f"train_conf.resume: continuing {resumed}; init_param {cfg.init_param} is not read (it starts a new "
            f"run: give another output_dir, or train_conf.resume=false to start over from it)"])
    source = str(cfg.init_param)
    options = cfg.dataset_conf.storage_options
    if ctx is not None and ctx.distributed and is_remote(source):
        with node_copy(source, ctx, options, key="init_param") as local:
            state = ckpt.load_checkpoint(local or source, key="init_param", storage_options=options,
                                         copy_of=source if local else None)
    else:
        state = ckpt.load_checkpoint(source, key="init_param", storage_options=options)
    return Start(source, state["model"], complete_config(cfg, state, source, "init_param"), state.get("token_list"))


@contextlib.contextmanager
def node_copy(url: str, ctx: Any, storage_options: dict | None, *, key: str) -> Iterator[str | None]:
    """A local copy of ``url`` that one process per node downloads: local rank 0 writes it to a temp dir (under a
    temp name, then renamed), every rank learns where (and any error) from one ``all_gather_object``, which is the
    barrier, reads it, and after a second barrier local rank 0 deletes it. Collective; errors are raised on every
    rank alike. None where this host has no local rank 0 (then read the URL itself)."""
    import shutil
    import socket
    import tempfile

    from corpus_io.errors import CorpusIOError
    from corpus_io.storage.files import atomic_write
    from corpus_io.storage.urls import open_url
    from corpus_io.train.distributed import all_gather_object, barrier

    host = socket.gethostname()
    tmp_dir = path = error = None
    if ctx.local_rank == 0:
        try:
            tmp_dir = tempfile.mkdtemp(prefix="corpus-io-init-param-")
            path = os.path.join(tmp_dir, "checkpoint.pt")
            with open_url(url, storage_options=storage_options) as src, atomic_write(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except CorpusIOError as exc:
            error = (type(exc).__name__ == "ConfigError", str(exc))
        except OSError as exc:  # the temp dir: no space, no permission
            error = (False, f"{key} {url}: cannot store the download in {tempfile.gettempdir()} ({exc.strerror}); "
                            f"free space there, or set TMPDIR to a directory with room for the checkpoint.")
    views = all_gather_object(ctx, {"host": host, "local_rank": ctx.local_rank, "path": path, "error": error})
    mine = next((v for v in views if v["host"] == host and v["local_rank"] == 0), None)
    try:
        if mine is None:  # no local rank 0 on this host (an unusual launcher): the caller reads the URL itself
            yield None
        elif mine["error"] is not None:
            is_config, message = mine["error"]
            raise (ConfigError if is_config else DataError)(message)
        else:
            yield mine["path"]
    finally:
        barrier(ctx)  # every rank of the node has read it
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)


def complete_config(cfg: Any, state: dict, where: str, key: str) -> list[str]:
    """Set ``cfg.model`` to the checkpoint's model config with the command line's keys over it, and an unset
    tokenizer to the checkpoint's; returns what to log (and a warning when the features differ)."""
    from omegaconf import OmegaConf

    from corpus_io.config import TokenizerConf, validate

    try:
        trained = OmegaConf.to_container(OmegaConf.create(state.get("config") or ""), resolve=True)
    except Exception as exc:  # omegaconf/yaml errors: a damaged or hand-made checkpoint
        raise DataError(f"{key} {where}: its training config cannot be read ({type(exc).__name__}). It was not "
                        f"written by corpus-io train, or it is damaged; use another checkpoint.") from None
    model = trained.get("model") if isinstance(trained, dict) else None
    if not isinstance(model, dict) or not model.get("_target_"):
        raise DataError(f"{key} {where} holds no model config (the training config corpus-io train stores with the "
                        f"weights), so the model of its weights cannot be built. Use a checkpoint written by "
                        f"corpus-io train or average.")
    given = dict(cfg.model)
    cfg.model = OmegaConf.to_container(OmegaConf.merge(model, given))
    notes = [f"{key} {where}: model {model['_target_']} as its config has it"
             + (f", with {', '.join(f'model.{k}' for k in given)} from the command line" if given else "")]
    if not (cfg.tokenizer.token_list or cfg.tokenizer.bpe_model):
        cfg.tokenizer = validate(TokenizerConf, dict(trained.get("tokenizer") or {}))
        notes.append(f"tokenizer: the checkpoint's ({cfg.tokenizer.token_list or cfg.tokenizer.bpe_model}), as "
                     f"none was given")
    differ = feature_differences(trained.get("dataset_conf") or {}, cfg.dataset_conf)
    if differ:
        notes.append(f"warning: the features differ from those {key} was trained on ({'; '.join(differ)}); "
                     f"its weights expect the checkpoint's")
    return notes


def feature_differences(trained: dict, conf: Any) -> list[str]:
    """``dataset_conf.<key>: <here> here, <there> in the checkpoint`` for each feature setting that differs."""
    import dataclasses

    from corpus_io.config import SAVED_FEATURE_DEFAULTS

    ours, defaults = dataclasses.asdict(conf), dataclasses.asdict(type(conf)())
    out = []
    for key in FEATURE_KEYS:
        mine, theirs = ours.get(key), trained.get(key)
        if isinstance(mine, dict) and isinstance(theirs, dict):  # a key the checkpoint's config predates: its default
            theirs = {**(defaults.get(key) or {}), **SAVED_FEATURE_DEFAULTS.get(key, {}), **theirs}
            out += [f"dataset_conf.{key}.{k}: {mine.get(k)} here, {theirs.get(k)} in the checkpoint"
                    for k in sorted(set(mine) | set(theirs)) if k not in NOT_FEATURES and mine.get(k) != theirs.get(k)]
        elif key in trained and mine != theirs:
            out.append(f"dataset_conf.{key}: {mine} here, {theirs} in the checkpoint")
    return out


def load_weights(model: Any, start: Start | None, cfg: Any, tokenizer: Any) -> list[str]:
    """Copy ``start``'s weights into ``model`` (built from the completed config and ``tokenizer``, not yet wrapped in
    DDP); raises a ConfigError naming the tensors that do not fit. Returns what to log."""
    if start is None or start.weights is None:
        return start.notes if start is not None else []
    own, theirs = model.state_dict(), start.weights
    excludes = tuple(cfg.init_param_excludes)
    unmatched = [p for p in excludes if not any(name.startswith(p) for name in own)]
    if unmatched:
        tops = sorted({name.split(".")[0] for name in own})
        raise ConfigError(f"init_param_excludes: '{unmatched[0]}' is the start of no tensor name of the model (its "
                          f"names start with {', '.join(tops)}); give prefixes of its names, e.g. '[{tops[-1]}.]'.")
    excluded = [name for name in own if name.startswith(excludes)] if excludes else []
    shared = [name for name in own if name in theirs and name not in excluded]
    if not shared:
        raise DataError(f"init_param {start.source}: none of its {len(theirs)} tensors is a tensor of the model "
                        f"{cfg.model.get('_target_')} (its names: {_names(theirs)}; the model's: {_names(own)}). "
                        f"It holds another model; start from a checkpoint of this model, or remove init_param.")
    missing = [name for name in own if name not in theirs and name not in excluded]
    unused = [name for name in theirs if name not in own and not (excludes and name.startswith(excludes))]
    reshaped = [f"{name} {list(theirs[name].shape)} -> {list(own[name].shape)}" for name in shared
                if theirs[name].shape != own[name].shape]
    problems = ([f"{len(reshaped)} changed shape (checkpoint -> model): {_few(reshaped)}"] if reshaped else []) + (
        [f"{len(missing)} of the model's are not in it: {_few(missing)}"] if missing else []) + (
        [f"{len(unused)} of its tensors are not in the model: {_few(unused)}"] if unused else [])
    if problems and not cfg.train_conf.ignore_init_mismatch:
        raise ConfigError(f"init_param {start.source} does not fit the model {cfg.model.get('_target_')}: "
                          f"{'; '.join(problems)} {_FIT}. Set ++train_conf.ignore_init_mismatch=true to start those "
                          f"tensors from their fresh init, ++init_param_excludes to leave chosen layers out, or "
                          f"train with the checkpoint's settings; nothing was trained or written.")
    _same_tokens(start, tokenizer, excludes)
    loaded = {name: theirs[name] for name in shared if theirs[name].shape == own[name].shape}
    model.load_state_dict(loaded, strict=False)  # the rest keeps the fresh init of build_model
    notes = start.notes + [f"init_param {start.source}: {len(loaded)} of the model's {len(own)} tensors loaded"]
    if problems:
        notes.append(f"init_param: fresh init (train_conf.ignore_init_mismatch) where {'; '.join(problems)}")
    if excluded:
        notes.append(f"init_param: fresh init (init_param_excludes {list(excludes)}): {_few(excluded)}")
    if cfg.cmvn_file and any(name.startswith("cmvn.") for name in loaded):
        notes.append(f"init_param: the CMVN stats come from the checkpoint (its weights were trained with them), not "
                     f"from cmvn_file {os.path.basename(str(cfg.cmvn_file))}; ++init_param_excludes='[cmvn.]' uses "
                     f"cmvn_file's")
    return notes


def _same_tokens(start: Start, tokenizer: Any, excludes: tuple) -> None:
    """A token list of the checkpoint's size but with other tokens (or another order) leaves every shape alone and
    reads each output id as another token: refused, unless ``init_param_excludes`` leave output layers fresh."""
    record, now = start.token_list, ckpt.token_list_record(tokenizer)
    if not isinstance(record, dict) or record.get("size") != now["size"] or record.get("sha256") == now["sha256"]:
        return  # no record (an older checkpoint), another size (a shape mismatch above), or the same list
    if not excludes:
        raise ConfigError(f"the token list {now['file']} has as many tokens ({now['size']}) as the one init_param "
                          f"{start.source} was trained with ({record.get('file')}), but not the same tokens in the "
                          f"same order, so its output layer would read every id as another token. Train with that "
                          f"token list, or leave the output layers at their fresh init with ++init_param_excludes "
                          f"(e.g. '[ctc.]').")


def _few(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _names(state: dict) -> str:
    return _few(list(state), 3)


def load_resumed_model(path: Path, state: dict, cfg: Any, module: Any) -> None:
    """Load a resumed checkpoint's weights into the model this run built, refused (one paragraph) when the run's
    ``model.*`` keys differ from the checkpoint's: a resume continues the same model, even where the weights would
    fit (``model.causal`` changes no shape, and the epochs of both would be averaged as one model)."""
    from corpus_io.model.checkpoint import saved_model_conf
    from corpus_io.model.model import model_conf_changes

    saved = saved_model_conf(state)
    if saved is not None and model_conf_changes(saved, dict(cfg.model)):
        raise ConfigError(model_mismatch(path, state, cfg, module))
    try:
        module.load_state_dict(state["model"])
    except RuntimeError:  # missing, unexpected or reshaped tensors: the run's model.* keys changed
        raise ConfigError(model_mismatch(path, state, cfg, module)) from None


def model_mismatch(path: Path, state: dict, cfg: Any, module: Any) -> str:
    """The one paragraph for a resumed checkpoint whose model is not the one this run builds: the model.* keys that
    differ from the checkpoint's config, else the tensors that differ."""
    from corpus_io.model.checkpoint import saved_model_conf
    from corpus_io.model.model import model_conf_changes

    changes = model_conf_changes(saved_model_conf(state) or {}, dict(cfg.model))
    keys = [f"{k}={a} in the checkpoint, {b} now" for k, a, b in changes]
    if keys:
        what = f"its model.* keys differ: {'; '.join(keys[:6])}" + (f" and {len(keys) - 6} more" if len(keys) > 6
                                                                    else "")
    else:
        own, saved = module.state_dict(), state["model"]
        shapes = [f"{n} {list(saved[n].shape)} -> {list(t.shape)}" for n, t in own.items()
                  if n in saved and saved[n].shape != t.shape]
        missing = [n for n in own if n not in saved] + [n for n in saved if n not in own]
        what = ("its tensors differ: " + ", ".join((shapes + missing)[:4])
                + " (a token list of another size, or other features: dataset_conf.fbank_conf)")
    return (f"train_conf.resume: {path} holds a model that does not fit the one this run builds: {what}. A resume "
            f"continues the same model: drop or restore those keys on the command line, or start a new run in "
            f"another ++output_dir (++init_param={path}, with ++train_conf.ignore_init_mismatch=true, to start from "
            f"its weights).")
