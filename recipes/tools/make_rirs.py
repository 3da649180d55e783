#!/usr/bin/env python3
"""Simulated room impulse responses for ``dataset_conf.add_reverb`` when you have no recorded set.

    pip install -e '.[rir]'             # in a corpus-io checkout: pyroomacoustics, from PyPI
    python recipes/tools/make_rirs.py OUT_DIR [--num 200] [--rate 16000] [--seed 0] [--rt60 0.2 0.9]

Each response is a shoebox room (sides 3-10 m x 3-10 m x 2.5-4 m) with a reverberation time drawn in
``--rt60`` (seconds; Sabine's formula gives the walls' absorption), one source and one microphone placed at
random at least 0.5 m from the walls, simulated with the image source method (pyroomacoustics). Written:
``OUT_DIR/rir/<key>.wav`` (32-bit float, ``--rate`` Hz, mono) and ``OUT_DIR/wav.scp`` (absolute paths), the
list ``++dataset_conf.add_reverb_conf.rir_list=OUT_DIR/wav.scp`` reads. Same ``--seed``: same files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def simulate(rng: np.random.Generator, rate: int, rt60: tuple[float, float]) -> np.ndarray:
    """One impulse response (float32, 1-D) of a random shoebox room."""
    import pyroomacoustics as pra

    room_dim = np.array([rng.uniform(3, 10), rng.uniform(3, 10), rng.uniform(2.5, 4)])
    t60 = rng.uniform(*rt60)
    absorption, max_order = pra.inverse_sabine(t60, room_dim)
    room = pra.ShoeBox(room_dim, fs=rate, materials=pra.Material(absorption), max_order=min(max_order, 40))
    inside = [rng.uniform(0.5, side - 0.5, size=2) for side in room_dim]
    room.add_source([inside[0][0], inside[1][0], inside[2][0]])
    room.add_microphone([inside[0][1], inside[1][1], inside[2][1]])
    room.compute_rir()
    rir = np.asarray(room.rir[0][0], dtype=np.float32)
    return rir / np.abs(rir).max()


def make_rirs(out: Path, *, num: int, rate: int = 16000, seed: int = 0,
              rt60: tuple[float, float] = (0.2, 0.9)) -> Path:
    """``num`` responses under ``out``; returns ``out/wav.scp``."""
    import soundfile as sf

    rng = np.random.default_rng(seed)
    (out / "rir").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(num):
        key = f"rir{i:05d}"
        path = (out / "rir" / f"{key}.wav").resolve()
        sf.write(path, simulate(rng, rate, rt60), rate, subtype="FLOAT")
        lines.append(f"{key} {path}\n")
    scp = out / "wav.scp"
    tmp = scp.with_name(scp.name + ".tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(scp)
    return scp


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--num", type=int, default=200)
    parser.add_argument("--rate", type=int, default=16000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rt60", type=float, nargs=2, default=(0.2, 0.9), metavar=("LOW", "HIGH"))
    args = parser.parse_args(argv)
    try:
        import pyroomacoustics  # noqa: F401
    except ImportError:
        print("make_rirs.py needs pyroomacoustics: pip install -e '.[rir]' (in the corpus-io checkout)",
              file=sys.stderr)
        return 2
    print(make_rirs(args.out, num=args.num, rate=args.rate, seed=args.seed, rt60=tuple(args.rt60)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
