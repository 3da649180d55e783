"""Hugging Face parquet (issue 32): pack-shards from parquet vs from wav files, the loader's reader on parquet files
vs on our tar shards vs ``datasets``' own streaming dataset over the same files, and peak RSS of packing.

All on one real espeak corpus (``bench.common.real_corpus``), in one run, as ratios:

* pack-shards (1 worker, ``audio_format=keep``) from the corpus as one HF parquet file (written by ``corpus-io
  export``, row groups of 100) vs from its FunASR jsonl naming wav/flac files;
* reading, IO only (every sample's audio bytes and text, nothing decoded), 1 and 2 worker processes each reading
  a disjoint share: corpus-io's reader (``loader.read.read_shard_unit``) on the parquet files listed by
  make-datalist, the same on tar shards, and ``datasets.load_dataset("parquet", streaming=True)`` with
  ``Audio(decode=False)``, sharded the same way;
* peak RSS of the packing process tree for one parquet file of N/4 and of N utterances (target: flat, a row group
  at a time).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import sys
import time

from bench.common import OUT, corpus_jsonl, mb, real_corpus, run_child, sized

N = sized(8000, 48)  # utterances
ROUNDS = sized(2, 1)
PER_FILE = sized(1000, 16)
WORKERS = sized((1, 2), (1,))
PER_SHARD = sized(200, 8)  # pack-shards' shards: the N/4 file makes more than the 4 shards in flight per worker


def _prepare() -> dict:
    """The corpus as a jsonl, as parquet files (several, and one whole file of N/4 and of N) and as tar shards."""
    from corpus_io.config import ExportConfig, MakeDatalistConfig, PackShardsConfig
    from corpus_io.shards.datalist import make_datalist
    from corpus_io.shards.export import export
    from corpus_io.shards.pack import pack_shards

    here = OUT / "parquet"
    jsonl = corpus_jsonl(real_corpus(N), here / f"train{N}.jsonl")
    quarter = here / f"train{N // 4}.jsonl"
    if not quarter.exists():
        lines = jsonl.read_text(encoding="utf-8").splitlines(keepends=True)[:N // 4]
        quarter.write_text("".join(lines), encoding="utf-8")
    paths = {"jsonl": jsonl, "files": here / "files", "whole": here / "whole", "quarter": here / "quarter",
             "shards": here / "shards", "list": here / "parquet.list"}
    for key, src, per in (("files", jsonl, PER_FILE), ("whole", jsonl, N), ("quarter", quarter, N)):
        if not (paths[key] / "data").is_dir():
            export(ExportConfig(format="hf-parquet", input=str(src), output_dir=str(paths[key]), num_utts_per_file=per))
    if not (paths["shards"] / "data.list").exists():
        pack_shards(PackShardsConfig(input=str(jsonl), output_dir=str(paths["shards"]), num_utts_per_shard=PER_FILE))
    if not paths["list"].exists():
        make_datalist(MakeDatalistConfig(data_type="shard", input=[str(paths["files"] / "data")],
                                         output=str(paths["list"])))
    return paths


# --------------------------------------------------------------------------- children


def pack_child(input_: str, out_dir: str, per_shard: int) -> None:
    """One pack-shards run (1 worker) in this process; prints its seconds."""
    from corpus_io.config import PackShardsConfig
    from corpus_io.shards.pack import pack_shards

    start = time.perf_counter()
    pack_shards(PackShardsConfig(input=input_, output_dir=out_dir, num_utts_per_shard=per_shard, num_workers=1))
    print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


def _read_ours(share: tuple[str, int, int]) -> tuple[int, int]:
    from collections import Counter

    from corpus_io.loader.read import ReadOptions, read_shard_unit
    from corpus_io.shards.index import read_datalist

    data_list, worker, workers = share
    n = size = 0
    for url in read_datalist(data_list)[worker::workers]:
        for sample in read_shard_unit(url, ReadOptions(storage_options={}), Counter()):
            n += 1
            size += len(sample["audio"]) + len(sample["txt"])
    return n, size


def _read_datasets(share: tuple[str, int, int]) -> tuple[int, int]:
    import datasets

    files, worker, workers = share
    ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
    ds = ds.cast_column("audio", datasets.Audio(decode=False)).shard(num_shards=workers, index=worker)
    n = size = 0
    for row in ds:
        n += 1
        size += len(row["audio"]["bytes"]) + len(row["text"])
    return n, size


def read_child(mode: str, source: str, workers: int) -> None:
    """Read everything with ``workers`` processes (spawned fresh); prints utterances, bytes and seconds."""
    read = _read_datasets if mode == "datasets" else _read_ours
    if mode == "datasets":  # imports are not reading
        import datasets  # noqa: F401
    else:
        import pyarrow.parquet  # noqa: F401  (a loader worker imports it once per run)

        import corpus_io.loader.read  # noqa: F401
    start = time.perf_counter()
    shares = [(source, w, workers) for w in range(workers)]
    if workers == 1:
        parts = [read(shares[0])]
    else:
        with mp.get_context("fork").Pool(workers) as pool:  # forked before anything is read
            parts = pool.map(read, shares)
    seconds = time.perf_counter() - start
    print(json.dumps({"utts": sum(p[0] for p in parts), "bytes": sum(p[1] for p in parts), "seconds": seconds}),
          flush=True)


# --------------------------------------------------------------------------- main


def main() -> None:
    paths = _prepare()
    out = OUT / "parquet" / "run"
    best: dict[str, float] = {}
    rss: dict[str, int] = {}
    for _ in range(ROUNDS):
        for name, src in (("wav", paths["jsonl"]), ("whole", paths["whole"] / "data"),
                          ("quarter", paths["quarter"] / "data")):
            shutil.rmtree(out, ignore_errors=True)
            res, peak = run_child("bench.bench_parquet", "--pack", str(src), str(out), str(PER_SHARD))
            best[f"pack-{name}"] = min(best.get(f"pack-{name}", float("inf")), res["seconds"])
            rss[name] = max(rss.get(name, 0), peak)
        parquet_files = sorted(str(p) for p in (paths["files"] / "data").glob("*.parquet"))
        for workers in WORKERS:
            for name, mode, source in (("parquet", "ours", str(paths["list"])),
                                       ("tar", "ours", str(paths["shards"] / "data.list")),
                                       ("datasets", "datasets", json.dumps(parquet_files))):
                res, _ = run_child("bench.bench_parquet", "--read", mode, source, str(workers))
                assert res["utts"] == N, res
                key = f"read-{name}-{workers}"
                best[key] = min(best.get(key, float("inf")), res["seconds"])
    shutil.rmtree(out, ignore_errors=True)
    print(f"parquet on {N} real utterances ({PER_FILE} per parquet file / tar shard read, {PER_SHARD} per shard "
          f"packed), best of {ROUNDS}:")
    wav, pq = best["pack-wav"], best["pack-whole"]
    print(f"  pack-shards, 1 worker: from wav files {wav:.2f} s, from parquet {pq:.2f} s -> parquet "
          f"{wav / pq:.2f}x the speed of wav files")
    for workers in WORKERS:
        p, t, d = (best[f"read-{k}-{workers}"] for k in ("parquet", "tar", "datasets"))
        print(f"  read (IO only) {workers} worker(s): parquet {N / p:.0f} utt/s, tar shards {N / t:.0f} utt/s, "
              f"datasets streaming {N / d:.0f} utt/s -> parquet / tar = {t / p:.2f}, parquet / datasets = "
              f"{d / p:.2f}")
    q = (paths["quarter"] / "data").glob("*.parquet")
    w = (paths["whole"] / "data").glob("*.parquet")
    qs, ws = sum(p.stat().st_size for p in q), sum(p.stat().st_size for p in w)
    print(f"  peak RSS of pack-shards: one parquet file of {mb(qs)} -> {mb(rss['quarter'])}, of {mb(ws)} -> "
          f"{mb(rss['whole'])}: {rss['whole'] / rss['quarter']:.2f}x for {ws / qs:.1f}x the file (target: flat)")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--pack":
        pack_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) == 5 and sys.argv[1] == "--read":
        source = sys.argv[3]
        read_child(sys.argv[2], json.loads(source) if source.startswith("[") else source, int(sys.argv[4]))
    else:
        main()
