"""Debug records of what training read (``train_conf.dump_trained_keys``): ``output_dir/trained_keys.rank{R}.txt``
(``{epoch} {key}`` per trained utterance, cut back on resume to what the checkpoint had trained) and
``unused_keys.rank{R}.txt`` (what a rank left unused when another ran out of data)."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any


def keys_files(out: Path, ranks_bytes: list[int]) -> dict[str, int]:
    """The length of every trained_keys.rank{R}.txt at a checkpoint, including the files of ranks a larger world
    size wrote before an elastic resume (they no longer grow)."""
    sizes = {p.name: p.stat().st_size for p in out.glob("trained_keys.rank*.txt")}
    sizes.update({f"trained_keys.rank{r}.txt": n for r, n in enumerate(ranks_bytes)})
    return sizes


def open_keys_file(out: Path, state: dict | None, ctx: Any) -> IO[str]:
    """This rank's trained_keys.rank{R}.txt, cut back to what the checkpoint ``state`` had trained (rank 0 also cuts
    back the files of ranks this run does not have)."""
    state = state or {}
    kept = dict(state.get("trained_keys_files") or {})
    if not kept:  # a checkpoint before trained_keys_files: one length per rank of its world
        kept = {f"trained_keys.rank{r}.txt": n for r, n in enumerate(state.get("trained_keys_bytes") or [])}
    if ctx.is_main and state:
        for path in out.glob("trained_keys.rank*.txt"):
            rank = int(path.name.split(".rank")[1].split(".")[0])
            if rank >= ctx.world_size:
                with open(path, "r+", encoding="utf-8") as f:
                    f.truncate(kept.get(path.name, 0))
    path = out / f"trained_keys.rank{ctx.rank}.txt"
    keep_bytes = kept.get(path.name, 0)
    mode = "r+" if path.exists() else "w"
    keys_file = open(path, mode, encoding="utf-8")
    keys_file.truncate(keep_bytes)
    keys_file.seek(keep_bytes)
    return keys_file


def append_unused_keys(out: Path, rank: int, epoch: int, keys: list[str]) -> None:
    """Add ``keys``, left unused by ``rank`` in ``epoch``, to its unused_keys.rank{R}.txt."""
    with open(out / f"unused_keys.rank{rank}.txt", "a", encoding="utf-8") as f:
        f.write("".join(f"{epoch} {k}\n" for k in keys))
