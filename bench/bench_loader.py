"""Loader throughput: corpus-io shard mode vs raw mode vs a plain WebDataset pipeline, side by side.

Corpus: bench/out/corpus20000 (20k real espeak utterances, half 16 kHz wav, half 44.1 kHz flac,
each a distinct file). Shards: pack-shards with audio_format=keep (the same bytes raw mode reads),
1000 utterances per shard. Raw mode reads the original files through a JSONL list. WebDataset
reads the same shards as corpus-io shard mode.

* IO only: read + decode + resample to 16 kHz (half the files are 44.1 kHz flac), batch of 16.
* End to end: decode + fbank 80 + shuffle + sort + batch + pad.
* fbank-only limit: fbank 80 on waveforms already in memory, in the same number of processes.
* Cold cache: posix_fadvise(DONTNEED) on every file read, before the run. Warm: read once before.
* Raw list of 10M lines: peak RSS of a process that opens it (index build, then cached index).

Each variant runs in its own process (peak RSS covers its DataLoader workers). Figures are
printed side by side from this one run, as ratios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import BIN, OUT, drop_cache, mb, real_corpus, run_measured

HERE = OUT / "loader"
# The corpus is 20k utterances; each run reads a prefix of it so that the 26 runs fit in minutes on
# 2 shared cores (half the files are 44.1 kHz flac: decode + resample dominate at 1-2 cores).
N_IO = int(os.environ.get("BENCH_LOADER_N_IO", 4000))  # utterances per IO-only run
N_E2E = int(os.environ.get("BENCH_LOADER_N_E2E", 2000))  # utterances per end-to-end run


def prepare() -> tuple[Path, Path]:
    corpus = real_corpus(20000)
    shards = HERE / "shards"
    if not (shards / "data.list").exists():
        t = time.perf_counter()
        r = subprocess.run([str(BIN / "corpus-io"), "pack-shards", f"++input={corpus}", f"++output_dir={shards}",
                            "++num_utts_per_shard=1000", "++audio_format=keep"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        print(f"packed 20000 utterances in {time.perf_counter() - t:.0f} s", flush=True)
    raw = HERE / "raw.list"
    if not raw.exists():
        texts = dict(line.split(" ", 1) for line in (corpus / "text").read_text().splitlines())
        with open(raw, "w") as f:
            for line in (corpus / "wav.scp").read_text().splitlines():
                key, path = line.split(" ", 1)
                f.write(json.dumps({"key": key, "wav": path, "txt": texts[key]}) + "\n")
    return shards / "data.list", raw


def subset_list(data_list: Path, raw: Path, n: int) -> tuple[Path, Path]:
    urls = data_list.read_text().split()
    sub = HERE / f"shards{n}.list"
    sub.write_text("".join(u + "\n" for u in urls[:max(1, n // 1000)]))
    idx = data_list.with_name("index.jsonl")
    if idx.exists():
        keep = set(urls[:max(1, n // 1000)])
        sub.with_name(f"shards{n}.index.jsonl").write_text(
            "".join(x + "\n" for x in idx.read_text().splitlines() if json.loads(x)["path"] in keep))
    rsub = HERE / f"raw{n}.list"
    with open(raw) as f, open(rsub, "w") as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(line)
    return sub, rsub


# --------------------------------------------------------------------------- children (one per variant)


def _files_of(mode: str, path: str) -> list[str]:
    if mode == "raw":
        return [path] + [json.loads(x)["wav"] for x in open(path)]
    return [path] + open(path).read().split()


def child(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    mode, nw, feats = spec["mode"], spec["workers"], spec["feats"]
    utts = 0
    seconds = padded = real = 0.0
    start = time.perf_counter()
    if mode == "fbank_only":
        return fbank_limit(spec)
    if mode == "webdataset":
        batches = webdataset_batches(spec["list"], nw, feats)
    else:
        from corpus_io.config import DatasetConf
        from corpus_io.dataset import build_dataloader

        conf = DatasetConf(data_type=mode, num_workers=nw, feats_type="fbank" if feats else "raw", batch_size=16,
                           prefetch=4, bucketing=spec.get("bucketing", False))
        conf.filter_conf.max_length = 10**9
        conf.filter_conf.min_length = 0
        loader = build_dataloader(spec["list"], conf, None, train=True, rank=0, world_size=1)
        batches = iter(loader)
    for batch in batches:
        n = batch["feats_lengths"]
        utts += len(n)
        seconds += float(n.sum()) * (0.01 if batch["feats"].shape[-1] > 1 else 1 / 16000)
        padded += float(n.max()) * len(n)
        real += float(n.sum())
    wall = time.perf_counter() - start
    return {"utts": utts, "seconds": seconds, "wall": wall, "padding": (padded - real) / padded if padded else 0}


def _decode(sample: dict, feats: bool) -> dict:
    import io

    import soundfile as sf
    import torch

    ext = "wav" if "wav" in sample else "flac"
    wave, rate = sf.read(io.BytesIO(sample[ext]), dtype="float32")
    wav = torch.from_numpy(wave).unsqueeze(0)
    if rate != 16000:
        import torchaudio.functional as AF

        wav = AF.resample(wav, rate, 16000)
    if feats:
        from torchaudio.compliance import kaldi

        x = kaldi.fbank(wav * 32768, num_mel_bins=80, frame_length=25, frame_shift=10, dither=0.0,
                        energy_floor=0.0, sample_frequency=16000)
    else:
        x = wav.reshape(-1, 1)
    return {"key": sample["__key__"], "feats": x}


def _collate(samples: list) -> dict:
    from corpus_io.batching import pad

    return pad(samples, frame_shift=0.01 if samples and samples[0]["feats"].shape[1] > 1 else 1 / 16000)


def webdataset_batches(list_path: str, nw: int, feats: bool):
    """A plain WebDataset pipeline: shard shuffle, split by worker, decode (+ fbank), shuffle 1500, batch 16."""
    import functools

    import webdataset as wds

    urls = open(list_path).read().split()
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
          .shuffle(1500)
          .map(functools.partial(_decode, feats=feats))
          .batched(16, collation_fn=_collate, partial=True))
    kwargs = {"prefetch_factor": 4} if nw else {}
    return wds.WebLoader(ds, batch_size=None, num_workers=nw, **kwargs)


def _fbank_share(waves: list) -> int:
    import torch
    from torchaudio.compliance import kaldi

    torch.set_num_threads(1)
    for w in waves:
        kaldi.fbank(w * 32768, num_mel_bins=80, frame_length=25, frame_shift=10, dither=0.0, energy_floor=0.0,
                    sample_frequency=16000)
    return len(waves)


def fbank_limit(spec: dict) -> dict:
    """fbank 80 on in-memory 16 kHz waveforms, in ``workers`` processes (the compute ceiling)."""
    import io
    import multiprocessing as mp
    import tarfile

    import soundfile as sf
    import torch

    waves, seconds = [], 0.0
    for url in open(spec["list"]).read().split():
        with tarfile.open(url) as tar:
            for m in tar:
                if m.name.endswith((".wav", ".flac")):
                    w, rate = sf.read(io.BytesIO(tar.extractfile(m).read()), dtype="float32")
                    wav = torch.from_numpy(w).unsqueeze(0)
                    if rate != 16000:
                        import torchaudio.functional as AF

                        wav = AF.resample(wav, rate, 16000)
                    waves.append(wav)
                    seconds += len(w) / rate
    procs = max(1, spec["workers"])
    shares = [waves[i::procs] for i in range(procs)]
    ctx = mp.get_context("fork")
    start = time.perf_counter()
    with ctx.Pool(procs) as pool:
        n = sum(pool.map(_fbank_share, shares))
    wall = time.perf_counter() - start
    return {"utts": n, "seconds": seconds, "wall": wall, "padding": 0.0}


def raw_rss_child(path: str) -> dict:
    import psutil

    from corpus_io.rawlist import RawList, slot_lines

    t = time.perf_counter()
    lst = RawList(path)
    lines = slot_lines(len(lst), slot_index=0, slot_count=2, seed=1, epoch=0, shuffle=True)
    for i in lines[:1000]:
        lst.record(int(i))
    return {"lines": len(lst), "rss": psutil.Process().memory_info().rss, "wall": time.perf_counter() - t}


# --------------------------------------------------------------------------- parent


def measure(spec: dict, *, cold: bool) -> dict:
    files = spec.get("files") or []
    if cold:
        drop_cache(files)
    else:
        for p in files:  # warm: read every file once
            with open(p, "rb") as f:
                while f.read(1 << 20):
                    pass
    run = {k: v for k, v in spec.items() if k != "files"}
    wall, peak, r = run_measured([sys.executable, "-m", "bench.bench_loader", json.dumps(run)],
                                 cwd=Path(__file__).resolve().parent.parent)
    if r.returncode != 0:
        raise SystemExit(f"{spec}: {r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["peak_rss"] = peak
    return out


def fmt(name: str, res: dict) -> str:
    return (f"  {name:<34} {res['utts']:>6} utts {res['wall']:7.1f} s {res['utts'] / res['wall']:8.0f} utt/s "
            f"{res['seconds'] / res['wall']:9.0f} audio-s/s  pad {100 * res['padding']:4.1f}%  "
            f"peak RSS {mb(res['peak_rss'])}")


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    data_list, raw = prepare()
    shards_io, raw_io = subset_list(data_list, raw, N_IO)
    shards_e2e, raw_e2e = subset_list(data_list, raw, N_E2E)
    results: dict = {}

    def spec(mode: str, lst: Path, nw: int, feats: bool, **kw) -> dict:
        files = _files_of("raw" if mode == "raw" else "shard", str(lst))
        return {"mode": "shard" if mode == "corpus-io" else mode, "list": str(lst), "workers": nw,
                "feats": feats, "files": files, **kw}

    print(f"IO only (read + decode + resample, batch 16), {N_IO} of the 20000 utterances", flush=True)
    for cache in ("cold", "warm"):
        for nw in (1, 2):
            for mode, lst in (("corpus-io", shards_io), ("webdataset", shards_io), ("raw", raw_io)):
                res = measure(spec(mode, lst, nw, False), cold=cache == "cold")
                results[("io", cache, nw, mode)] = res
                print(fmt(f"{mode} {cache} workers={nw}", res), flush=True)
    print(f"End to end (decode + fbank 80 + shuffle + sort + batch + pad), warm, {N_E2E} utterances", flush=True)
    for nw in (1, 2):
        res = measure(spec("fbank_only", shards_e2e, nw, True), cold=False)
        results[("limit", nw)] = res
        print(fmt(f"fbank-only limit processes={nw}", res), flush=True)
        for mode, lst in (("corpus-io", shards_e2e), ("webdataset", shards_e2e), ("raw", raw_e2e)):
            res = measure(spec(mode, lst, nw, True), cold=False)
            results[("e2e", nw, mode)] = res
            print(fmt(f"{mode} workers={nw}", res), flush=True)
    res = measure(spec("corpus-io", shards_e2e, 2, True, bucketing=True), cold=False)
    results[("e2e", 2, "bucket")] = res
    print(fmt("corpus-io bucketing workers=2", res), flush=True)

    big = HERE / "raw10M.list"
    if not big.exists():
        line = '{"key": "utt%08d", "wav": "/data/corpus/wav/utt%08d.wav", "txt": "one two three four five"}\n'
        with open(str(big) + ".tmp", "w") as f:
            for s in range(0, 10_000_000, 200_000):
                f.write("".join(line % (i, i) for i in range(s, s + 200_000)))
        os.replace(str(big) + ".tmp", big)
    rss = {}
    for phase in ("build index", "cached index"):
        if phase == "build index":
            Path(str(big) + ".idx").unlink(missing_ok=True)
        wall, peak, r = run_measured([sys.executable, "-m", "bench.bench_loader", "--raw-rss", str(big)],
                                     cwd=Path(__file__).resolve().parent.parent)
        rss[phase] = (peak, json.loads(r.stdout.strip().splitlines()[-1])["wall"])

    def rate(key) -> float:
        r = results[key]
        return r["seconds"] / r["wall"]

    print("\nSummary (ratios of audio-seconds/s measured above)")
    for cache in ("cold", "warm"):
        for nw in (1, 2):
            s, w, r = (rate(("io", cache, nw, m)) for m in ("corpus-io", "webdataset", "raw"))
            print(f"  IO only {cache} workers={nw}: shard / WebDataset = {s / w:.2f} (target >= 1.5), "
                  f"shard / raw = {s / r:.2f} (target >= 2)")
    for nw in (1, 2):
        s, lim, w, r = (rate(k) for k in (("e2e", nw, "corpus-io"), ("limit", nw), ("e2e", nw, "webdataset"),
                                          ("e2e", nw, "raw")))
        print(f"  end to end workers={nw}: shard / fbank-only limit = {s / lim:.2f} (target >= 0.90), "
              f"shard / WebDataset = {s / w:.2f}, shard / raw = {s / r:.2f}")
    print(f"  padding: sort buffer {100 * results[('e2e', 2, 'corpus-io')]['padding']:.1f}% (target <= 10%), "
          f"bucketing {100 * results[('e2e', 2, 'bucket')]['padding']:.1f}% (target <= 5%)")
    for phase, (peak, wall) in rss.items():
        print(f"  raw list of 10M lines, {phase}: peak RSS {mb(peak)} in {wall:.1f} s (target < 1 GB)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--raw-rss":
        print(json.dumps(raw_rss_child(sys.argv[2])))
    elif len(sys.argv) > 1:
        print(json.dumps(child(json.loads(sys.argv[1]))))
    else:
        main()
