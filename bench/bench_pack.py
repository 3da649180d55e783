"""pack-shards throughput vs a plain ``tarfile`` writer, at 1 and 2 workers, and peak RSS vs corpus size.

Targets (issue 3), measured side by side in one run on >= 20k real espeak utterances
(half 16 kHz wav, half 44.1 kHz flac; ``bench.common.real_corpus``), ``audio_format=keep``:

* pack at 1 worker >= 0.9x the plain tarfile writer (same input, same members: txt, audio, json);
* pack at 2 workers >= 1.7x pack at 1 worker;
* peak RSS flat as the corpus grows (5k vs 20k utterances).

Each run also reports its CPU seconds (the process and its workers, user + system) and those of its main
thread: on a shared machine the wall times say how much of the cores a run got, the CPU seconds what it
needed. One worker runs on its main thread with sha256 on a second thread, so on 2 free cores it takes about
its main thread's CPU seconds, and 2 workers at least half their CPU seconds: the 2-worker ratio is at most
about ``2 * main thread CPU(1 worker) / CPU(2 workers)``, which the bench prints next to the ratio.

Each run is a fresh subprocess (``python -m bench.bench_pack --child ...``) that reports its own
wall time and peak RSS: ``max(ru_maxrss(self), ru_maxrss(children))``, the largest single process
of the tree (main or a worker). The page cache is warmed first so every run reads from memory;
each configuration runs ``ROUNDS`` times and the fastest is kept (the machine is shared).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import OUT, corpus_jsonl, real_corpus, sized

ROUNDS = sized(2, 1)
SIZES = sized((5000, 20000), (24, 48))  # utterances
PER_SHARD = sized(1000, 16)


def _jsonl(n: int) -> Path:
    """FunASR jsonl of the first ``n`` utterances of the cached corpus of max(SIZES) (cached under bench/out/pack/)."""
    out = OUT / "pack" / f"train{n}.jsonl"
    if out.exists():
        return out
    full = corpus_jsonl(real_corpus(max(SIZES)), OUT / "pack" / f"train{max(SIZES)}.jsonl")
    if n != max(SIZES):
        with open(full, encoding="utf-8") as src, open(out, "w", encoding="utf-8") as dst:
            for i, line in enumerate(src):
                if i >= n:
                    break
                dst.write(line)
    return out


# --------------------------------------------------------------------------- children


def plain_tarfile(jsonl: str, out_dir: str) -> None:
    """The baseline: stream the jsonl, read each audio file, write txt/audio/json members with tarfile."""
    import io
    import tarfile

    os.makedirs(out_dir, exist_ok=True)
    tf = None
    with open(jsonl, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i % PER_SHARD == 0:
                if tf is not None:
                    tf.close()
                tf = tarfile.open(os.path.join(out_dir, f"shard-{i // PER_SHARD:06d}.tar"), "w")
            rec = json.loads(line)
            with open(rec["source"], "rb") as a:
                audio = a.read()
            meta = {k: v for k, v in rec.items() if k not in ("source", "target")}
            members = [("txt", rec["target"].encode()), (rec["source"].rsplit(".", 1)[1], audio),
                       ("json", json.dumps(meta, ensure_ascii=False).encode())]
            for ext, data in members:
                info = tarfile.TarInfo(f"{rec['key']}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    if tf is not None:
        tf.close()


def child(mode: str, jsonl: str, out_dir: str, workers: int) -> None:
    start, cpu, main_cpu = time.perf_counter(), os.times(), time.thread_time()
    if mode == "tarfile":
        plain_tarfile(jsonl, out_dir)
    else:
        from corpus_io.config import PackShardsConfig
        from corpus_io.shards.pack import pack_shards

        pack_shards(PackShardsConfig(input=jsonl, output_dir=out_dir, num_utts_per_shard=PER_SHARD,
                                     num_workers=workers))
    seconds, main_cpu = time.perf_counter() - start, time.thread_time() - main_cpu
    now = os.times()
    cpu_s = sum(getattr(now, f) - getattr(cpu, f) for f in ("user", "system", "children_user", "children_system"))
    size = sum(p.stat().st_size for p in Path(out_dir).glob("*.tar"))
    rss_kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                 resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"seconds": seconds, "cpu_s": cpu_s, "main_cpu_s": main_cpu, "bytes": size,
                      "rss_mb": rss_kb / 1024}), flush=True)


def _run(mode: str, jsonl: Path, workers: int) -> dict:
    out = OUT / "pack" / f"run-{mode}-{workers}"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1")
    r = subprocess.run([sys.executable, "-m", "bench.bench_pack", "--child", mode, str(jsonl), str(out), str(workers)],
                       capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parent.parent)
    if r.returncode != 0:
        raise SystemExit(f"bench child {mode} failed:\n{r.stderr}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _warm(jsonl: Path) -> None:
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            with open(json.loads(line)["source"], "rb") as a:
                a.read()


def main() -> None:
    big = _jsonl(max(SIZES))
    small = _jsonl(min(SIZES))
    n = sum(1 for _ in open(big))
    _warm(big)
    best: dict[str, dict] = {}
    for _ in range(ROUNDS):
        for name, mode, workers in (("tarfile", "tarfile", 1), ("pack1", "pack", 1), ("pack2", "pack", 2)):
            r = _run(mode, big, workers)
            print(f"  {name:8s} {r['seconds']:7.2f} s  {r['cpu_s']:6.2f} CPU-s  {r['bytes'] / 1e9:.3f} GB  peak RSS "
                  f"{r['rss_mb']:.0f} MB  load {os.getloadavg()[0]:.1f}", flush=True)
            if name not in best or r["seconds"] < best[name]["seconds"]:
                best[name] = r
    rss_small = _run("pack", small, 2)["rss_mb"]
    rss_big = best["pack2"]["rss_mb"]
    t, p1, p2 = best["tarfile"]["seconds"], best["pack1"]["seconds"], best["pack2"]["seconds"]
    print(f"pack-shards on {n} real utterances ({best['pack1']['bytes'] / 1e9:.2f} GB of shards, keep format, "
          f"{PER_SHARD} utts/shard), best of {ROUNDS}:")
    print(f"  plain tarfile writer : {t:.2f} s ({n / t:.0f} utt/s)")
    c1, m1, c2 = best["pack1"]["cpu_s"], best["pack1"]["main_cpu_s"], best["pack2"]["cpu_s"]
    print(f"  pack 1 worker        : {p1:.2f} s ({n / p1:.0f} utt/s)  -> {t / p1:.2f}x tarfile (target >= 0.9x); "
          f"{c1:.2f} CPU-s, {m1:.2f} on the main thread")
    print(f"  pack 2 workers       : {p2:.2f} s ({n / p2:.0f} utt/s)  -> {p1 / p2:.2f}x 1 worker (target >= 1.7x); "
          f"{c2:.2f} CPU-s: on 2 free cores at most ~{2 * m1 / c2:.2f}x")
    print(f"  peak RSS (largest process), 2 workers: {min(SIZES)} utts {rss_small:.0f} MB, {max(SIZES)} utts "
          f"{rss_big:.0f} MB -> {rss_big / rss_small:.2f}x for {max(SIZES) / min(SIZES):.0f}x the corpus "
          f"(target: flat)")
    print(f"  cpus available: {len(os.sched_getaffinity(0))}, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
