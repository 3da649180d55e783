"""pack-shards as 1, 2 and 4 jobs on this machine (same bytes; time and peak RSS per job, side by side), and
the cost of ``merge-jobs`` on a simulated 75,000-part run (the 100,000-hour plan of docs/BENCHMARKS.md).

* Jobs: the same real espeak corpus (``bench.common.real_corpus``) packed by N = 1, 2, 4 jobs started
  together as separate processes (as a scheduler would start them; the machine's cores are split between
  them: ``num_workers = max(1, cores // N)``), then ``merge-jobs``. Each job is a fresh process measured by
  ``bench.common.run_measured`` (wall time, peak RSS of its tree). The merged ``data.list``/``index.jsonl``
  and every shard must equal the one-job run's bytes, or the bench stops.
* Merge at scale: ``BENCH_JOBS_PARTS`` part records (default 75,000), one shard of ``BENCH_JOBS_KEYS``
  utterance keys each (default 480: 36M utterances, 100,000 hours at 10 s), sealed as pack-shards jobs
  write them, each shard a real tar of its utterances' metadata members (tiny payloads, ~1 MB per 480 keys), or
  a one-member stand-in where real ones would take over half the free disk (75,000 x 480: 73 GB);
  ``merge-jobs`` (its default ``++check=stat``) is then timed in a fresh process (wall, peak RSS).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import threading
import time
from pathlib import Path

from bench.common import OUT, corpus_jsonl, mb, real_corpus, run_child, run_measured, sized

FILES = sized(int(os.environ.get("BENCH_JOBS_FILES", 4000)), 48)  # utterances of the packed corpus
PER_SHARD = sized(200, 8)
JOBS = sized((1, 2, 4), (1, 2))  # the first is the reference the others' merged bytes must equal
PARTS = sized(int(os.environ.get("BENCH_JOBS_PARTS", 75000)), 40)
KEYS = sized(int(os.environ.get("BENCH_JOBS_KEYS", 480)), 8)


def _jsonl() -> Path:
    return corpus_jsonl(real_corpus(FILES), OUT / "jobs" / f"train{FILES}.jsonl")


def _tree(d: Path) -> dict[str, str]:
    """sha256 of every file a user sees (data.list with its directory made neutral)."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and not p.name.startswith(".") and ".part-" not in p.name:
            data = p.read_bytes()
            if p.name == "data.list":
                data = data.replace(str(d).encode(), b"<D>")
            out[str(p.relative_to(d))] = hashlib.sha256(data).hexdigest()
    return out


def _pack(jsonl: Path, n: int) -> dict:
    """N jobs started together, then the merge; per-job wall and peak RSS."""
    out = OUT / "jobs" / f"n{n}"
    shutil.rmtree(out, ignore_errors=True)
    workers = max(1, (os.cpu_count() or 1) // n)
    common = [sys.executable, "-m", "cli.main", "pack-shards", f"++input={jsonl}", f"++output_dir={out}",
              f"++num_utts_per_shard={PER_SHARD}", f"++num_workers={workers}"]
    runs: dict[int, tuple] = {}

    def job(j: int) -> None:
        runs[j] = run_measured([*common, f"++num_jobs={n}", f"++job_index={j}"], cwd=Path(__file__).parent.parent)

    start = time.perf_counter()
    threads = [threading.Thread(target=job, args=(j,)) for j in range(1, n + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs_wall = time.perf_counter() - start
    for j, (_, _, result) in sorted(runs.items()):
        if result.returncode != 0:
            raise SystemExit(f"pack-shards job {j} of {n} failed:\n{result.stderr[-3000:]}")
    merge_wall, merge_rss = 0.0, 0
    if n > 1:
        merge_wall, merge_rss, result = run_measured([sys.executable, "-m", "cli.main", "merge-jobs", f"++path={out}"],
                                                     cwd=Path(__file__).parent.parent)
        if result.returncode != 0:
            raise SystemExit(f"merge-jobs failed:\n{result.stderr[-3000:]}")
    return {"n": n, "workers": workers, "jobs_wall": jobs_wall, "merge_wall": merge_wall, "merge_rss": merge_rss,
            "job_walls": [runs[j][0] for j in sorted(runs)], "job_rss": [runs[j][1] for j in sorted(runs)],
            "tree": _tree(out), "out": out}


# --------------------------------------------------------------------------- simulated merge


def simulate(root: str, parts: int, keys: int, stand_in: bool = False) -> None:
    """``parts`` pack-shards part records of one run (one shard each), sealed as jobs write them
    (:func:`corpus_io.jobs.parts.seal_output`). Each shard is a real tar of ``keys`` utterances' metadata members
    (tiny payloads: ~1 MB per 480 keys), kept from an earlier call into the same ``root`` (they are deterministic),
    so a rerun only rewrites the records. ``stand_in``: each shard is a one-member tar instead (the records still
    list ``keys`` keys), for sizes whose real tars do not fit the disk; only the default check (which trusts a
    sealed shard with one stat()) merges it, ``++check=headers`` refuses it."""
    from corpus_io.jobs.parts import Job, Part, Place, fingerprint, seal_output, write_part

    out = Path(root)
    kind = f"{keys} {'stand-in' if stand_in else 'real'}\n"
    made = out / ".simulated"  # what the shards kept here are: others are written again
    if not made.is_file() or made.read_text() != kind:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():  # a previous run's records and lists; its shards are kept
        if not p.name.endswith(".tar"):
            p.unlink() if p.is_file() else shutil.rmtree(p)
    made.write_text(kind)
    place = Place(str(out), "pack-shards", True)
    fp = fingerprint(["simulated"])
    for j in range(1, parts + 1):
        name = f"shard-{j - 1:06d}.tar"
        utts = [f"spk{j:06d}-utt{k:04d}" for k in range(keys)]
        if not (out / name).is_file():
            # a real tar of metadata members (merge-jobs reads a shard's headers and .json members when it must)
            with tarfile.open(out / name, "w", format=tarfile.USTAR_FORMAT) as tar:
                for key in utts[:1] if stand_in else utts:
                    meta = json.dumps({"key": key, "duration": 10.0}).encode()
                    for suffix, payload in (("txt", b"a"), ("json", meta)):
                        info = tarfile.TarInfo(f"{key}.{suffix}")
                        info.size = len(payload)
                        tar.addfile(info, io.BytesIO(payload))
        size, sha = (out / name).stat().st_size, hashlib.sha256((out / name).read_bytes()).hexdigest()
        entry = {"path": name, "num_utts": keys, "duration": 10.0 * keys, "min_duration": 10.0, "max_duration": 10.0,
                 "bytes": size, "sha256": sha, "keys": utts}
        data = {"prefix": "shard", "groups": [{"dir": "", "entries": [entry]}],
                "summary": {"kept": keys, "seconds": 10.0 * keys, "bytes": size, "skipped": {}}}
        outputs = [seal_output({"file": name, "bytes": size, "sha256": sha}, out / name, entry)]
        write_part(place, Part("pack-shards", place.tag, parts, j, fp, [j - 1, j], parts, outputs, data))
    job = Job(1, parts)
    assert place.record(job).is_file()
    print(json.dumps({"parts": parts}), flush=True)


def _merge_at_scale() -> dict:
    root = OUT / "jobs" / "simulated"
    real = PARTS * KEYS * 1100 < shutil.disk_usage(OUT).free // 2  # real tars: ~1.1 KB per key (2 members)
    start = time.perf_counter()
    run_child("bench.bench_jobs", "--simulate", str(root), str(PARTS), str(KEYS), *(() if real else ("--stand-in",)))
    made = time.perf_counter() - start
    wall, rss, result = run_measured([sys.executable, "-m", "cli.main", "merge-jobs", f"++path={root}"],
                                     cwd=Path(__file__).parent.parent)
    if result.returncode != 0:
        raise SystemExit(f"merge-jobs of the simulated run failed:\n{result.stderr[-3000:]}")
    listed = sum(1 for _ in open(root / "data.list", encoding="utf-8"))
    index_bytes = (root / "index.jsonl").stat().st_size
    shutil.rmtree(root, ignore_errors=True)
    return {"made": made, "wall": wall, "rss": rss, "listed": listed, "index_bytes": index_bytes, "real": real}


def main() -> None:
    jsonl = _jsonl()
    with open(jsonl, "rb") as f:  # warm the page cache: every run reads from memory
        for line in f:
            Path(json.loads(line)["source"]).read_bytes()
    print(f"pack-shards of {FILES} real utterances ({PER_SHARD} per shard), N jobs started together on "
          f"{os.cpu_count()} cores, then merge-jobs")
    print(f"{'jobs':>4} {'workers/job':>11} {'jobs wall':>9} {'merge':>7} {'total':>7} {'vs 1 job':>8} "
          f"{'per-job wall (s)':<24} {'per-job peak RSS':<30} same bytes")
    results = [_pack(jsonl, n) for n in JOBS]
    base = results[0]
    for r in results:
        total = r["jobs_wall"] + r["merge_wall"]
        same = r["tree"] == base["tree"]
        print(f"{r['n']:>4} {r['workers']:>11} {r['jobs_wall']:>8.1f}s {r['merge_wall']:>6.1f}s {total:>6.1f}s "
              f"{(base['jobs_wall']) / total:>7.2f}x {' '.join(f'{w:.1f}' for w in r['job_walls']):<24} "
              f"{' '.join(mb(x) for x in r['job_rss']):<30} {'yes' if same else 'NO'}")
        if not same:
            raise SystemExit(f"{r['n']} jobs + merge-jobs did not give the one-job bytes")
    for r in results:
        shutil.rmtree(r["out"], ignore_errors=True)
    m = _merge_at_scale()
    print(f"merge-jobs of a simulated {PARTS}-part run ({PARTS} shards x {KEYS} keys = {PARTS * KEYS / 1e6:.1f}M "
          f"utterances; {'real metadata tars' if m['real'] else 'one-member stand-in tars (real ones: over the disk)'}"
          f", parts written in {m['made']:.0f} s), default ++check=stat: {m['wall']:.1f} s wall, "
          f"peak RSS {mb(m['rss'])}, "
          f"{m['listed']} list lines, index {m['index_bytes'] / 1e9:.2f} GB")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--simulate"]:
        simulate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), stand_in="--stand-in" in sys.argv[5:])
    else:
        main()
