"""Shared bench helpers: a cached corpus of real espeak speech, process-tree peak RSS, timers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
BIN = Path(sys.executable).parent


def real_corpus(num_files: int = 20000, *, base_utts: int = 400) -> Path:
    """A Kaldi dir of ``num_files`` real audio files (copies of ``base_utts`` espeak utterances).

    Half the base utterances are 16 kHz wav, half 44.1 kHz flac. Copies are real files
    (not links), so every read is a distinct file. Cached under bench/out/.
    """
    from corpus_io import synth

    out = OUT / f"corpus{num_files}"
    if (out / "wav.scp").exists():
        return out
    base = OUT / f"base{base_utts}"
    if not (base / "wav.scp").exists():
        half = base_utts // 2
        synth.make_digits(base / "a", half, seed=1, sample_rate=16000, fmt="wav")
        synth.make_digits(base / "b", base_utts - half, seed=2, sample_rate=44100, fmt="flac")
        with open(base / "wav.scp", "w") as fw, open(base / "text", "w") as ft:
            for part in ("a", "b"):
                for name, f in (("wav.scp", fw), ("text", ft)):
                    f.writelines(f"{part}-{line}\n" for line in (base / part / name).read_text().splitlines())
    wavs = [line.split(" ", 1) for line in (base / "wav.scp").read_text().splitlines()]
    texts = dict(line.split(" ", 1) for line in (base / "text").read_text().splitlines())
    copies = -(-num_files // len(wavs))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "wav").mkdir(parents=True)
    n = 0
    with open(tmp / "wav.scp", "w") as fw, open(tmp / "text", "w") as ft:
        for c in range(copies):
            sub = tmp / "wav" / f"{c:03d}"
            sub.mkdir()
            for key, path in wavs:
                if n >= num_files:
                    break
                new_key = f"c{c:03d}-{key}"
                target = sub / f"{new_key}{Path(path).suffix}"
                shutil.copyfile(path, target)
                fw.write(f"{new_key} {out / 'wav' / f'{c:03d}' / target.name}\n")
                ft.write(f"{new_key} {texts[key]}\n")
                n += 1
    tmp.rename(out)
    return out


def drop_cache(paths) -> None:
    """Evict files from the page cache (cold-cache runs)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_measured(argv: list[str], **kwargs) -> tuple[float, int, subprocess.CompletedProcess]:
    """Run a command; return (wall seconds, peak RSS bytes of its whole process tree, result)."""
    import psutil

    peak = 0
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, CORPUS_IO_NO_PROGRESS="1"), **kwargs)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        try:
            root = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            return
        while not done.is_set():
            try:
                total = root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
                peak = max(peak, total)
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    wall = time.perf_counter() - start
    return wall, peak, subprocess.CompletedProcess(argv, proc.returncode, out, err)


def mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB"
