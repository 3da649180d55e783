"""``bench-loader``: the training loader as ``train`` builds it, iterated for its throughput, padding and drop
counts; ``dump_keys``, ``dump_audio_dir``, and the loader state saved after K batches and resumed (every rank's
state of one save, read back and checked here: :func:`_read_checkpoint_states`).

The command of the loader wing (``corpus_io/commands.py``); ``bench/bench_loader.py`` times the loader itself.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from corpus_io.config import check_values
from corpus_io.errors import ConfigError, DataError
from corpus_io.loader.batching import batch_shape, describe_batched, split_counts
from corpus_io.loader.build import describe_chain, loader_chain
from corpus_io.loader.dataset import build_dataloader
from corpus_io.loader.partition import dist_info
from corpus_io.loader.workers import forkserver_ready
from corpus_io.storage.files import read_json_object


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
    if loader.num_workers > 0:
        # the forkserver's start (its preload of torch and the readers, begun in build_dataloader) timed apart, so
        # the first epoch's rate is the loader's, not the server's start (issue 53)
        summary["worker_server_start_s"] = forkserver_ready(loader.conf.worker_start_method)
        if loader.conf.worker_start_method == "forkserver":
            print(f"rank {rank}: worker start: forkserver ready in {summary['worker_server_start_s']:.2f} s "
                  f"(not counted in the epochs below)", flush=True)
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
