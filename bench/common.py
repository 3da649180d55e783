"""Shared bench helpers: the smoke switch, a cached corpus of real espeak speech, process-tree peak RSS, timers."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Smoke mode (`python -m bench --smoke`, or BENCH_SMOKE=1): every bench on a tiny corpus, one round, seconds in all,
# so the suite proves it still runs on the code. Benches pick their sizes with sized(); the figures measure nothing.
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")
BIN = Path(sys.executable).parent


def sized(full, smoke):
    """``smoke`` in smoke mode, else ``full``: a bench's sizes, rounds and repeats in one obvious way."""
    return smoke if SMOKE else full


def _out_dir() -> Path:
    """Where benches cache their corpora: BENCH_OUT, else bench/out; a smoke run without BENCH_OUT gets a temp dir
    (removed at exit), so it never leaves a tiny corpus where a full run would reuse it."""
    if os.environ.get("BENCH_OUT"):
        return Path(os.environ["BENCH_OUT"]).resolve()
    if not SMOKE:
        return Path(__file__).resolve().parent / "out"
    out = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    os.environ["BENCH_OUT"] = str(out)  # the bench's child processes share it
    return out


OUT = _out_dir()


def real_corpus(num_files: int = 20000, *, base_utts: int = 400, sample_rates: tuple[int, int] = (16000, 44100),
                formats: tuple[str, str] = ("wav", "flac")) -> Path:
    """A Kaldi dir of ``num_files`` real audio files (copies of ``base_utts`` espeak utterances).

    The base utterances are two halves (seeds 1 and 2): half ``a`` at ``sample_rates[0]`` Hz stored
    as ``formats[0]``, half ``b`` at ``sample_rates[1]`` as ``formats[1]``. The default is the mixed
    corpus (16 kHz wav + 44.1 kHz flac, ``bench/out/corpus20000``); ``sample_rates=(16000, 16000),
    formats=("wav", "wav")`` is a 16 kHz wav corpus as WeNet shards hold (``corpus20000_16k``): the
    same texts and voices. Copies are real files (not links), so every read is a distinct file.
    Cached under OUT (bench/out/, or BENCH_OUT). Smoke mode: at most 48 files of 24 base utterances.
    """
    from corpus_io.tables import synth

    num_files, base_utts = sized(num_files, min(num_files, 48)), sized(base_utts, min(base_utts, 24))

    mixed = tuple(sample_rates) == (16000, 44100) and tuple(formats) == ("wav", "flac")
    tag = "" if mixed else "_" + "_".join(f"{r // 1000 if r % 1000 == 0 else r / 1000:g}k{f}"
                                          for r, f in zip(sample_rates, formats))
    if tag == "_16kwav_16kwav":
        tag = "_16k"
    out = OUT / f"corpus{num_files}{tag}"
    if (out / "wav.scp").exists():
        return out
    base = OUT / f"base{base_utts}{tag}"
    if not (base / "wav.scp").exists():
        half = base_utts // 2
        tmp_base = base.with_name(base.name + ".tmp")
        shutil.rmtree(tmp_base, ignore_errors=True)
        for part, num, seed, rate, fmt in (("a", half, 1, sample_rates[0], formats[0]),
                                           ("b", base_utts - half, 2, sample_rates[1], formats[1])):
            shared = OUT / f"base{base_utts}" / part  # the mixed corpus's half at this rate/format: reuse it
            if (rate, fmt) == ((16000, "wav") if part == "a" else (44100, "flac")) and (shared / "wav.scp").exists():
                shutil.copytree(shared, tmp_base / part)
                lines = (tmp_base / part / "wav.scp").read_text().splitlines()
                (tmp_base / part / "wav.scp").write_text("".join(
                    line.replace(str(shared), str(base / part)) + "\n" for line in lines))
            else:
                synth.make_digits(tmp_base / part, num, seed=seed, sample_rate=rate, fmt=fmt)
                lines = (tmp_base / part / "wav.scp").read_text().splitlines()
                (tmp_base / part / "wav.scp").write_text("".join(
                    line.replace(str(tmp_base.resolve()), str(base)) + "\n" for line in lines))
        with open(tmp_base / "wav.scp", "w") as fw, open(tmp_base / "text", "w") as ft:
            for part in ("a", "b"):
                for name, f in (("wav.scp", fw), ("text", ft)):
                    f.writelines(f"{part}-{line}\n" for line in (tmp_base / part / name).read_text().splitlines())
        if base.exists():
            shutil.rmtree(base)
        tmp_base.rename(base)
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


def corpus_jsonl(corpus: Path, out: Path) -> Path:
    """The FunASR JSONL of a Kaldi dir (``corpus_io.scp2jsonl``: the command's code path), cached at ``out``."""
    if not out.exists():
        import corpus_io

        out.parent.mkdir(parents=True, exist_ok=True)
        corpus_io.scp2jsonl([corpus / "wav.scp", corpus / "text"], out)
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


def run_child(module: str, *args: str, peaks: dict | None = None) -> tuple[dict, int]:
    """Run ``python -m <module> <args>`` from the repo root under :func:`run_measured`; return the JSON object
    its last stdout line holds and the tree's peak RSS (bytes). A failing child stops the bench with its stderr."""
    import json

    _, peak, result = run_measured([sys.executable, "-m", module, *args], peaks=peaks,
                                   cwd=Path(__file__).resolve().parent.parent)
    if result.returncode != 0:
        raise SystemExit(f"{module} {' '.join(args)}: {result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1]), peak


def run_measured(argv: list[str], *, peaks: dict | None = None,
                 **kwargs) -> tuple[float, int, subprocess.CompletedProcess]:
    """Run a command; return (wall seconds, peak RSS bytes of its whole process tree, result).

    ``peaks``: also record ``peaks["pss"]``, the peak PSS of the tree (shared pages, e.g. the torch pages
    forked DataLoader workers share, counted once; sampling it reads /proc/*/smaps, so it is opt-in).
    """
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
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree))
                if peaks is not None:
                    peaks["pss"] = max(peaks.get("pss", 0), sum(p.memory_full_info().pss for p in tree))
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


@contextlib.contextmanager
def seaweed_server(data: Path):
    """A SeaweedFS server with its S3 gateway on 127.0.0.1 (``.venv/bin/weed``) and a bucket ``scale``:
    ``(endpoint, s3fs filesystem)``; stopped on exit."""
    import random
    import socket

    import s3fs

    def free_pair() -> int:  # weed also listens on port + 10000 (gRPC)
        while True:
            p = random.randint(20000, 29999)
            try:
                for q in (p, p + 10000):
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", q))
                return p
            except OSError:
                continue

    data.mkdir(parents=True, exist_ok=True)
    ports = {name: free_pair() for name in ("master", "volume", "filer", "s3")}
    cmd = [str(BIN / "weed"), "server", "-s3", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           "-volume.max=20", f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
           f"-filer.port={ports['filer']}", f"-s3.port={ports['s3']}", "-s3.port.iceberg=0", "-s3.port.lance=0"]
    with open(data / "weed.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        try:
            deadline = time.time() + 90
            while True:
                try:
                    fs = s3fs.S3FileSystem(anon=True, client_kwargs={"endpoint_url": endpoint},
                                           skip_instance_cache=True)
                    fs.mkdir("scale")
                    fs.pipe("scale/ready", b"ok")
                    break
                except Exception as exc:  # noqa: BLE001 - not up yet
                    if proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError(f"SeaweedFS did not start: {(data / 'weed.log').read_text()[-2000:]}") \
                            from exc
                    time.sleep(0.5)
            yield endpoint, fs
        finally:
            proc.kill()  # its data dir is a throwaway; weed may sit out SIGTERM for 20 s
            proc.wait()
            shutil.rmtree(data, ignore_errors=True)
