"""Install footprint: the core (data preparation, no torch) vs the full install (every extra), side by side.

Target (issue 12): the core runs the data-preparation commands without torch; report its venv size and
install time next to the full install. Both install the same freshly built wheel into a new venv with the
versions of constraints.txt, so pip's cache is warm for both (the figure is install work, not download).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _install(wheel: Path, extra: str, root: Path) -> tuple[float, int]:
    venv.create(root, with_pip=True)
    target = f"corpus-io[{extra}] @ {wheel.as_uri()}" if extra else str(wheel)
    start = time.perf_counter()
    subprocess.run([str(root / "bin" / "pip"), "install", "--quiet", "-c", str(REPO / "constraints.txt"), target],
                   check=True)
    return time.perf_counter() - start, _du(root)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp), str(REPO)], check=True,
                       stdout=subprocess.DEVNULL)
        (wheel,) = tmp.glob("corpus_io-*.whl")
        rows = {}
        for name, extra in (("core", ""), ("full [all]", "all")):
            rows[name] = _install(wheel, extra, tmp / name.split()[0])
            shutil.rmtree(tmp / name.split()[0])
        (t_core, s_core), (t_full, s_full) = rows["core"], rows["full [all]"]
        print(f"{'install':<12} {'time (s)':>9} {'venv (MB)':>10}")
        for name, (t, size) in rows.items():
            print(f"{name:<12} {t:>9.1f} {size / 1e6:>10.0f}")
        print(f"core / full: time {t_core / t_full:.2f}, size {s_core / s_full:.3f}")


if __name__ == "__main__":
    main()
