"""Benchmarks: `make bench` (python -m bench) runs every bench/bench_*.py; each prints its figures."""

from __future__ import annotations

import pkgutil
from pathlib import Path


def bench_names() -> list[str]:
    """Every bench module (``bench_*``), sorted: what ``python -m bench`` runs and the suite smoke-tests."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
