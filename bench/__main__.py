"""Run every ``bench/bench_*.py`` module's ``main()``, or only those named: ``python -m bench pack loader``.

``--smoke`` (or ``BENCH_SMOKE=1``) runs them on a tiny corpus, one round, in a temp dir: seconds per bench,
so the suite proves each still runs on the code (``bench.common.SMOKE``); its figures measure nothing.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

from bench import bench_names


def main(argv: list[str]) -> None:
    if "--smoke" in argv:
        argv = [a for a in argv if a != "--smoke"]
        os.environ["BENCH_SMOKE"] = "1"  # before bench.common is imported; the benches' children inherit it
    from bench.common import SMOKE

    names = bench_names()
    wanted = [a if a.startswith("bench_") else f"bench_{a}" for a in argv]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SystemExit(f"no such bench: {', '.join(unknown)} (benches: {', '.join(names)})")
    for name in names:
        if wanted and name not in wanted:
            continue
        print(f"\n===== {name} =====", flush=True)
        if SMOKE:
            print("smoke mode: figures are not measurements (tiny corpus, one round)", flush=True)
        start = time.perf_counter()
        importlib.import_module(f"bench.{name}").main()
        print(f"===== {name} done in {time.perf_counter() - start:.0f} s =====", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
