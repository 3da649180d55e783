"""Files of lines sorted on disk, in bounded memory (an external sort): the one-job order that N jobs' parts merge
back into, and rows written as they come (decode, score) put in key order afterwards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def jsonl_key(line: str) -> str:
    """The sort key of a JSON line: its ``key`` field."""
    return json.loads(line)["key"]


#: the most files merge_sorted holds open at once
FAN_IN = 256


def merge_sorted(paths: list[Path], key: Any, out: Any, tmp: Path, fan_in: int = FAN_IN) -> None:
    """The lines of the files ``paths`` (each in ``key`` order) written to ``out`` in ``key`` order, lines of equal
    keys in the files' order; at most ``fan_in`` files open at once (more are merged in groups into files in
    ``tmp`` first, as an external sort's passes)."""
    import heapq
    from contextlib import ExitStack

    def merge(group: list[Path], into: Any) -> None:
        with ExitStack() as stack:
            into.writelines(heapq.merge(*(stack.enter_context(open(p, encoding="utf-8", newline=""))
                                          for p in group), key=key))

    passes = 0
    while len(paths) > fan_in:
        merged = []
        for g in range(0, len(paths), fan_in):
            merged.append(tmp / f"pass{passes}-{g // fan_in}")
            with open(merged[-1], "w", encoding="utf-8", newline="") as f:
                merge(paths[g: g + fan_in], f)
        paths, passes = merged, passes + 1
    merge(paths, out)


#: the most lines sort_file holds in memory at once
SORT_LINES = 100_000


def sort_file(path: Path, key: Any, out: Any, tmp: Path, chunk: int | None = None) -> None:
    """The lines of the file ``path`` written to ``out`` in ``key`` order, lines of equal keys in the file's order;
    at most ``chunk`` (:data:`SORT_LINES`) lines in memory (an external sort: sorted runs in a directory under
    ``tmp``, then :func:`merge_sorted`)."""
    import tempfile
    from itertools import islice

    with tempfile.TemporaryDirectory(prefix="sort-", dir=tmp) as work, \
            open(path, encoding="utf-8", newline="") as f:
        runs = []
        while lines := list(islice(f, chunk or SORT_LINES)):
            lines.sort(key=key)
            runs.append(Path(work) / f"run{len(runs)}")
            with open(runs[-1], "w", encoding="utf-8", newline="") as g:
                g.writelines(lines)
        merge_sorted(runs, key, out, Path(work))


__all__ = ["FAN_IN", "SORT_LINES", "jsonl_key", "merge_sorted", "sort_file"]
