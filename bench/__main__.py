"""Run every ``bench/bench_*.py`` module's ``main()``, or only those named: ``python -m bench pack loader``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    wanted = [f"bench_{a}" if not a.startswith("bench_") else a for a in argv]
    for name in names:
        if wanted and name not in wanted:
            continue
        print(f"\n===== {name} =====", flush=True)
        start = time.perf_counter()
        importlib.import_module(f"bench.{name}").main()
        print(f"===== {name} done in {time.perf_counter() - start:.0f} s =====", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
