"""Install footprint: the core (data preparation, no torch) vs the full install (every extra), side by side.

Target (issue 12): the core runs the data-preparation commands without torch; report its venv size and
install time next to the full install. Both install the same freshly built wheel into a new venv with the
versions of constraints.txt, so pip's cache is warm for both (the figure is install work, not download).

Smoke mode installs the core wheel alone (``--no-deps --no-index``: no download) with this interpreter's pip
(``pip --python``: a venv without its own pip, seconds less), lets the venv see this interpreter's packages for
the core's dependencies, and checks that its ``corpus-io --help`` runs; the full install needs the package index
and is not run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import venv
from pathlib import Path

from bench.common import SMOKE

REPO = Path(__file__).resolve().parent.parent
# the venvs see only what was installed in them: a PYTHONPATH naming the source tree (its corpus_io.egg-info
# included) would make pip skip the wheel as already installed, and the check run the tree instead of the wheel
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _install(wheel: Path, extra: str, root: Path) -> tuple[float, int]:
    venv.create(root, with_pip=not SMOKE)
    target = f"corpus-io[{extra}] @ {wheel.as_uri()}" if extra else str(wheel)
    offline = ["--no-deps", "--no-index"] if SMOKE else []
    pip = [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python")] if SMOKE else [
        str(root / "bin" / "pip")]
    start = time.perf_counter()
    subprocess.run([*pip, "install", "--quiet", *offline, "-c", str(REPO / "constraints.txt"), target], check=True,
                   env=CLEAN_ENV)
    seconds, size = time.perf_counter() - start, _du(root)
    if SMOKE:  # the installed scripts and package run, on this interpreter's copies of the dependencies
        (site,) = root.glob("lib/python*/site-packages")
        (site / "bench-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([str(root / "bin" / "corpus-io"), "--help"], check=True, stdout=subprocess.DEVNULL, cwd=root,
                       env=CLEAN_ENV)
    return seconds, size


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        tmp = Path(tmp)
        built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp), str(REPO)],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise SystemExit(f"python -m build failed:\n{built.stdout[-3000:]}{built.stderr[-3000:]}")
        (wheel,) = tmp.glob("corpus_io-*.whl")
        rows = {}
        for name, extra in (("core", ""),) if SMOKE else (("core", ""), ("full [all]", "all")):
            rows[name] = _install(wheel, extra, tmp / name.split()[0])
            shutil.rmtree(tmp / name.split()[0])
        print(f"{'install':<12} {'time (s)':>9} {'venv (MB)':>10}")
        for name, (t, size) in rows.items():
            print(f"{name:<12} {t:>9.1f} {size / 1e6:>10.0f}")
        if SMOKE:
            print("smoke mode: core wheel only, --no-deps (corpus-io --help ran); the full install needs the "
                  "package index: not run")
            return
        (t_core, s_core), (t_full, s_full) = rows["core"], rows["full [all]"]
        print(f"core / full: time {t_core / t_full:.2f}, size {s_core / s_full:.3f}")


if __name__ == "__main__":
    main()
