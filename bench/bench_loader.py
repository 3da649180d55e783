"""Loader throughput: corpus-io shard mode vs raw mode vs a plain WebDataset pipeline, side by side.

Corpus: bench/out/corpus20000_16k (20k real espeak utterances, 16 kHz 16-bit wav as WeNet's packer
stores them, each a distinct file; ``bench.common.real_corpus(sample_rates=(16000, 16000))``).
Shards: pack-shards with audio_format=keep (the same bytes raw mode reads), 1000 utterances per
shard. Raw mode reads the original files through a JSONL list. WebDataset reads the same shards as
corpus-io shard mode: ``wds.WebDataset(urls).shuffle(1500).decode(soundfile handler).map(...)
.batched(16)`` through a torch DataLoader with the same num_workers and one torch thread per worker.

* IO only: read + decode (+ resample to 16 kHz where needed), batch of 16, padded.
* End to end: decode + fbank 80 + shuffle + sort + batch + pad (WebDataset: shuffle, no sort).
* fbank-only limit: the same fbank function (corpus_io.audio.features.fbank) on 16 kHz
  waveforms already in memory, in the same number of processes (forked, so no copy is timed).
* Every DataLoader (corpus-io shard and raw, WebDataset) prefetches ``BENCH_LOADER_PREFETCH`` (16)
  batches per worker (see PREFETCH below).
* Cold cache: posix_fadvise(DONTNEED) on every file read, before the run. Warm: read once before.
* Rates: all the audio a run read over its wall time from the first ``iter(loader)`` (the DataLoader workers'
  start included) to the last batch; the loader's build and its forkserver's start (the preload of torch,
  once per rank, begun by build_dataloader) are printed apart as ``start`` (issue 53: counted inside the rate,
  they made a 2-worker end-to-end run read 0.71 of the limit instead of 1.12). The fbank-only limit times
  only the fbank calls.
* Extra lines: WebDataset with corpus-io's 16-bit WAV decoder instead of soundfile (the pipeline
  difference alone), and the mixed corpus (half 44.1 kHz flac: resampling at load time) vs the
  same corpus packed with ``pack-shards ++resample=16000`` (BENCH_LOADER_MIXED=0 skips them).
* Raw list of 10M lines: peak RSS of a process that opens it (index build, then cached index); and the
  training loader over 10k and 10M lines with 1 and 4 workers: process-tree peak PSS and RSS.
* Profile: the end-to-end chain of shard and raw mode at each worker count once more with
  CORPUS_IO_LOADER_PROFILE=1 (corpus_io.loader.profile): where the time goes, as shares of wall time,
  per worker (read, tar parse, decode, resample, features, filters, buffers, batch/pad/collate,
  hand-over) and in the main process (hand-over: waiting for the next batch; unpacking; consumer).
* BENCH_LOADER_ONLY=e2e (comma separated among io, e2e, profile, mixed, rss) runs only those sections.
* BENCH_LOADER_FILES: the corpus's size (20000; a smaller one builds and runs faster).

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

from bench.common import BIN, OUT, drop_cache, mb, real_corpus, run_child, sized
from corpus_io.shards.index import index_path_for, load_index, write_index

FILES = sized(int(os.environ.get("BENCH_LOADER_FILES", 20000)), 48)  # utterances of the corpus (fewer: faster)
HERE = OUT / ("loader16k" if FILES == 20000 else f"loader16k_{FILES}")  # shards of that corpus
MIXED = OUT / "loader"
PER_SHARD = sized(1000, 8)
N_IO = sized(int(os.environ.get("BENCH_LOADER_N_IO", 20000)), 48)  # utterances per IO-only run (all of the corpus)
N_E2E = sized(int(os.environ.get("BENCH_LOADER_N_E2E", 10000)), 32)  # utterances per end-to-end run
N_MIXED = sized(int(os.environ.get("BENCH_LOADER_N_MIXED", 4000)), 32)  # utterances per mixed-corpus run
# smoke mode runs each loader once (each variant is a process that imports torch): the code paths, not the grid
CACHES = sized(("cold", "warm"), ("cold",))
WORKERS = sized((1, 2), (2,))  # DataLoader workers of the IO-only and end-to-end runs
# the profiled chains (smoke: end to end only, which profiles every step IO-only does and the features too)
PROFILE_CHAINS = sized((("IO only", False), ("end to end", True)), (("end to end", True),))
E2E_MODES = sized(("corpus-io", "webdataset", "raw"), ("corpus-io",))  # the baselines' chains: IO-only's + fbank
RAW_LINES = sized((10_000, 10_000_000), (2000,))  # raw lists whose memory per worker is compared
RAW_WORKERS = sized((1, 4), (2,))  # smoke: one run (the per-worker growth is a full run's figure)
RAW_BATCHES = sized(60, 4)
# shuffle and sort sizes of the raw-list loader runs; with bucketing (the default) the sort size is unused and a
# worker's buckets hold up to 2 x 30 x 16 = 960 utterances (docs/BENCHMARKS.md, issue 53)
RAW_BUFFERS = sized((200, 50), (16, 8))
# batches prefetched per DataLoader worker, the same for every loader: DataLoader hands batches over in
# worker order, and block buffers (sort 500: 31 batches at once) and buckets (7 at once) emit in bursts; with
# a prefetch below the burst the other worker idles (bucketing, 2 workers: 0.50 of the limit at 4, 0.61-0.65 at 16)
PREFETCH = int(os.environ.get("BENCH_LOADER_PREFETCH", 16))
WITH_MIXED = os.environ.get("BENCH_LOADER_MIXED", "1") != "0"
# sections to run (comma separated: io, e2e, profile, mixed, rss); all by default. The summary prints what ran.
ONLY = set(filter(None, os.environ.get("BENCH_LOADER_ONLY", "io,e2e,profile,mixed,rss").split(",")))


def prepare(corpus: Path, here: Path, name: str = "shards", pack_args: tuple = ()) -> tuple[Path, Path]:
    shards = here / name
    if not (shards / "data.list").exists():
        t = time.perf_counter()
        r = subprocess.run([str(BIN / "corpus-io"), "pack-shards", f"++input={corpus}", f"++output_dir={shards}",
                            f"++num_utts_per_shard={PER_SHARD}", "++audio_format=keep", *pack_args],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        print(f"packed {corpus.name} into {shards} in {time.perf_counter() - t:.0f} s", flush=True)
    raw = here / "raw.list"
    if not raw.exists():
        texts = dict(line.split(" ", 1) for line in (corpus / "text").read_text().splitlines())
        with open(raw, "w") as f:
            for line in (corpus / "wav.scp").read_text().splitlines():
                key, path = line.split(" ", 1)
                f.write(json.dumps({"key": key, "wav": path, "txt": texts[key]}) + "\n")
    return shards / "data.list", raw


def subset_list(data_list: Path, raw: Path, n: int) -> tuple[Path, Path]:
    urls = data_list.read_text().split()
    here = raw.parent
    sub = here / f"{data_list.parent.name}{n}.list"
    sub.write_text("".join(u + "\n" for u in urls[:max(1, n // PER_SHARD)]))
    # entries keyed by path as the list writes it (the file stores 'file'), with their keys: an index without them
    # makes every loader start scan the shards' tar headers for repeated keys (~1 s here), which users' lists
    # (pack-shards, make-datalist) never do
    index = load_index(data_list, keys=True)
    if index:
        write_index(index_path_for(sub), [index[u] for u in urls[:max(1, n // PER_SHARD)] if u in index])
    rsub = here / f"raw{n}.list"
    with open(raw) as f, open(rsub, "w") as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(line)
    return sub, rsub


def count(n: int) -> str:
    """10_000_000 -> '10M', 10_000 -> '10k', 200 -> '200': list sizes in file names and printed lines."""
    for unit, size in (("M", 10**6), ("k", 10**3)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _head_corpus(corpus: Path, out: Path, n: int) -> Path:
    """A Kaldi dir of the first ``n`` utterances of ``corpus`` (the same files, listed)."""
    if not (out / "wav.scp").exists():
        out.mkdir(parents=True, exist_ok=True)
        for name in ("text", "wav.scp"):
            lines = (corpus / name).read_text().splitlines()[:n]
            (out / name).write_text("".join(x + "\n" for x in lines))
    return out


# --------------------------------------------------------------------------- children (one per variant)


def _files_of(mode: str, path: str) -> list[str]:
    if mode == "raw":
        return [path] + [json.loads(x)["wav"] for x in open(path)]
    return [path] + open(path).read().split()


def child(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    mode, nw, feats = spec["mode"], spec["workers"], spec["feats"]
    if mode == "fbank_only":
        return fbank_limit(spec)
    if spec.get("profile"):
        from corpus_io.loader import profile

        os.environ[profile.ENV] = "1"  # before the DataLoader starts its workers
    start = time.perf_counter()
    if mode == "webdataset":
        batches = webdataset_batches(spec["list"], nw, feats, spec.get("decoder", "soundfile"))
    else:
        from corpus_io.config import DatasetConf
        from corpus_io.loader.dataset import build_dataloader
        from corpus_io.loader.workers import forkserver_ready

        conf = DatasetConf(data_type=mode, num_workers=nw, feats_type="fbank" if feats else "raw", batch_size=16,
                           prefetch=spec.get("prefetch", PREFETCH), bucketing=spec.get("bucketing", False))
        conf.filter_conf.max_length = 10**9
        conf.filter_conf.min_length = 0
        loader = build_dataloader(spec["list"], conf, None, train=True, rank=0, world_size=1)
        forkserver_ready(conf.worker_start_method if nw > 0 else "fork")
        batches = iter(loader)
    # the loader's build and its forkserver's start (the preload of torch, once per rank), apart from the rate
    started = time.perf_counter()
    utts = 0
    seconds = padded = real = 0.0
    for batch in batches:
        n = batch["feats_lengths"]
        utts += len(n)
        seconds += float(n.sum()) * (0.01 if batch["feats"].shape[-1] > 1 else 1 / 16000)
        padded += float(n.max()) * len(n)
        real += float(n.sum())
    wall = time.perf_counter() - started
    out = {"utts": utts, "seconds": seconds, "wall": wall, "start": started - start,
           "padding": (padded - real) / padded if padded else 0}
    if spec.get("profile"):
        out["profile"] = loader.profile()
    return out


def _one_thread(_worker: int) -> None:
    import torch

    torch.set_num_threads(1)


def _soundfile_audio(data: bytes):
    """The WebDataset decode handler for .wav/.flac: soundfile, as a plain pipeline would."""
    import io

    import soundfile as sf
    import torch

    wave, rate = sf.read(io.BytesIO(data), dtype="float32")
    return torch.from_numpy(wave if wave.ndim == 1 else wave.mean(axis=1)).unsqueeze(0), rate


def _fast_audio(data: bytes):
    """The same handler on corpus-io's decoder (16-bit PCM WAV fast path, soundfile otherwise)."""
    import torch

    from corpus_io.audio import io as audio

    wave, rate = audio.decode_bytes(data)
    return torch.from_numpy(audio.to_mono(wave)).unsqueeze(0), rate


def _features(sample: dict, feats: bool) -> dict:
    from corpus_io.audio.features import fbank as fbank_features
    from corpus_io.audio.io import resample_wav

    wav, rate = sample["wav"] if "wav" in sample else sample["flac"]
    wav = resample_wav(wav, rate, 16000)
    x = fbank_features(wav, 16000, num_mel_bins=80) if feats else wav.reshape(-1, 1)
    return {"key": sample["__key__"], "feats": x}


def _collate(samples: list) -> dict:
    from corpus_io.loader.batching import pad

    return pad(samples, frame_shift=0.01 if samples and samples[0]["feats"].shape[1] > 1 else 1 / 16000)


def webdataset_batches(list_path: str, nw: int, feats: bool, decoder: str = "soundfile"):
    """A plain WebDataset pipeline: shard shuffle, split by worker, shuffle 1500, decode (handler),
    resample (+ fbank) in a map, batch 16, through a torch DataLoader with ``nw`` one-thread workers."""
    import functools

    import webdataset as wds
    from torch.utils.data import DataLoader

    urls = open(list_path).read().split()
    handler = _fast_audio if decoder == "fast" else _soundfile_audio
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
          .shuffle(1500)
          .decode(wds.handle_extension("wav flac", handler))
          .map(functools.partial(_features, feats=feats))
          .batched(16, collation_fn=_collate, partial=True))
    kwargs = {"prefetch_factor": PREFETCH, "worker_init_fn": _one_thread} if nw else {}
    return DataLoader(ds, batch_size=None, num_workers=nw, **kwargs)


_WAVES: list = []


def _fbank_share(share: tuple[int, int]) -> tuple[int, float]:
    import torch

    from corpus_io.audio.features import fbank as fbank_features

    torch.set_num_threads(1)
    frames = 0
    t = time.perf_counter()
    for w in _WAVES[share[0]::share[1]]:
        frames += fbank_features(w, 16000, num_mel_bins=80).shape[0]
    return len(_WAVES[share[0]::share[1]]), time.perf_counter() - t, frames


def fbank_limit(spec: dict) -> dict:
    """fbank 80 on in-memory 16 kHz waveforms, in ``workers`` forked processes (the compute ceiling).

    The waveforms are decoded (and resampled) before the clock starts and inherited by the fork, so
    only the fbank calls are timed: wall = from the map call until every process is done. Audio seconds
    are counted as the loaders count them (fbank frames * 10 ms), not from the sample counts: those are
    ~1% more (a 25 ms window in 10 ms steps leaves ~15-25 ms per utterance out of the frames)."""
    import multiprocessing as mp

    import torch

    from corpus_io.audio import io as audio
    from corpus_io.audio.io import resample_wav
    from corpus_io.shards.reader import read_shard

    for url in open(spec["list"]).read().split():
        for sample in read_shard(url):
            w, rate = audio.decode_bytes(sample["audio"])
            wav = resample_wav(torch.from_numpy(audio.to_mono(w)).unsqueeze(0), rate, 16000)
            _WAVES.append(wav)
    procs = max(1, spec["workers"])
    ctx = mp.get_context("fork")
    with ctx.Pool(procs) as pool:
        pool.map(_one_thread, range(procs))  # started and idle before the clock
        start = time.perf_counter()
        done = pool.map(_fbank_share, [(i, procs) for i in range(procs)], chunksize=1)
        wall = time.perf_counter() - start
    n = sum(d[0] for d in done)
    seconds = sum(d[2] for d in done) * 0.01  # frames * frame shift, as child() counts a loader's batches
    return {"utts": n, "seconds": seconds, "wall": wall, "padding": 0.0}


def raw_workers_child(path: str, workers: int, batches: int) -> dict:
    """The training loader over a raw list with ``workers`` DataLoader workers, for ``batches`` batches."""
    from corpus_io.config import DatasetConf
    from corpus_io.loader.dataset import build_dataloader

    conf = DatasetConf(data_type="raw", num_workers=workers, batch_size=16, prefetch=2)
    conf.shuffle_conf.shuffle_size, conf.sort_conf.sort_size = RAW_BUFFERS
    t = time.perf_counter()
    loader = build_dataloader(path, conf, None, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    n = 0
    for n, _ in enumerate(loader, 1):
        if n >= batches:
            break
    return {"batches": n, "wall": time.perf_counter() - t}


def _real_raw_list(path: Path, lines: int) -> None:
    """A raw list of ``lines`` entries over the 24 real fixture recordings (unique keys)."""
    repo = Path(__file__).resolve().parent.parent
    fixture = repo / "tests" / "fixtures" / "corpus"
    wavs = [str(repo / line.split(" ", 1)[1]) for line in (fixture / "wav.scp").read_text().splitlines() if line]
    if path.exists():
        return
    with open(str(path) + ".tmp", "w") as f:
        for s in range(0, lines, 200_000):
            f.write("".join(json.dumps({"key": f"utt{i:08d}", "wav": wavs[i % len(wavs)], "txt": "one two three"})
                            + "\n" for i in range(s, min(lines, s + 200_000))))
    os.replace(str(path) + ".tmp", path)


def raw_rss_child(path: str) -> dict:
    import psutil

    from corpus_io.loader.rawlist import RawList, permuted_lines

    t = time.perf_counter()
    lst = RawList(path)
    lines = permuted_lines(len(lst), 0, 1000, seed=1, epoch=0, shuffle=True)
    for i in lines:
        lst.record(int(i))
    return {"lines": len(lst), "rss": psutil.Process().memory_info().rss, "wall": time.perf_counter() - t}


# --------------------------------------------------------------------------- parent


def print_profile(prof: dict) -> None:
    """Shares of wall time: the workers' (their seconds summed, over their summed wall) and the main process's."""
    from corpus_io.loader.profile import merge, shares

    workers = shares(merge(list(prof["workers"].values())))
    main = shares(prof["main"])
    print("    workers: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in workers.items() if v >= 0.005), flush=True)
    print("    main:    " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in main.items() if v >= 0.005), flush=True)



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
    out, peak = run_child("bench.bench_loader", json.dumps(run))
    out["peak_rss"] = peak
    return out


def rate_of(res: dict) -> float:
    """Audio seconds per second: all the audio read, over the run from its first batch request (the loader's
    build and forkserver start apart, ``res['start']``)."""
    return res["seconds"] / res["wall"]


def fmt(name: str, res: dict) -> str:
    return (f"  {name:<40} {res['utts']:>6} utts read {res['wall']:6.1f} s {res['utts'] / res['wall']:7.0f} utt/s "
            f"{rate_of(res):7.0f} audio-s/s  start {res.get('start', 0.0):4.1f} s  "
            f"pad {100 * res['padding']:4.1f}%  peak RSS {mb(res['peak_rss'])}")


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    if ONLY & {"io", "e2e", "profile"}:  # the rss section alone needs no synthesized corpus
        corpus = real_corpus(FILES, sample_rates=(16000, 16000), formats=("wav", "wav"))
        data_list, raw = prepare(corpus, HERE)
        shards_io, raw_io = subset_list(data_list, raw, N_IO)
        shards_e2e, raw_e2e = subset_list(data_list, raw, N_E2E)
        print(f"16 kHz wav corpus ({corpus}), shards of {PER_SHARD}, audio_format=keep", flush=True)

    def spec(mode: str, lst: Path, nw: int, feats: bool, **kw) -> dict:
        files = _files_of("raw" if mode == "raw" else "shard", str(lst))
        return {"mode": "shard" if mode == "corpus-io" else mode, "list": str(lst), "workers": nw,
                "feats": feats, "files": files, **kw}

    def run(key, name: str, s: dict, cold: bool = False) -> None:
        results[key] = measure(s, cold=cold)
        print(fmt(name, results[key]), flush=True)

    if "io" in ONLY:
        print(f"IO only (read + decode, batch 16, padded), {N_IO} utterances per run", flush=True)
    for cache in CACHES if "io" in ONLY else ():
        for nw in WORKERS:
            for mode, lst in (("corpus-io", shards_io), ("webdataset", shards_io), ("raw", raw_io)):
                run(("io", cache, nw, mode), f"{mode} {cache} workers={nw}", spec(mode, lst, nw, False),
                    cold=cache == "cold")
            run(("io", cache, nw, "wds-fast"), f"webdataset+fast wav {cache} workers={nw}",
                spec("webdataset", shards_io, nw, False, decoder="fast"), cold=cache == "cold")
    if "e2e" in ONLY:
        print(f"End to end (decode + fbank 80 + shuffle + sort + batch + pad), warm, {N_E2E} utterances per run",
              flush=True)
    for nw in WORKERS if "e2e" in ONLY else ():
        run(("limit", nw), f"fbank-only limit processes={nw}", spec("fbank_only", shards_e2e, nw, True))
        for mode in E2E_MODES:
            lst = raw_e2e if mode == "raw" else shards_e2e
            run(("e2e", nw, mode), f"{mode} workers={nw}", spec(mode, lst, nw, True))
        run(("e2e", nw, "bucket"), f"corpus-io bucketing workers={nw}",
            spec("corpus-io", shards_e2e, nw, True, bucketing=True))

    if "profile" in ONLY:
        print(f"Profile (CORPUS_IO_LOADER_PROFILE=1; warm, {N_E2E} utterances per run): shares of wall time per "
              f"worker (summed over workers) and in the main process", flush=True)
    for chain, feats in PROFILE_CHAINS if "profile" in ONLY else ():
        for mode in ("corpus-io", "raw"):
            for nw in WORKERS:
                key = ("profile", chain, mode, nw)
                run(key, f"{chain} {mode} profiled workers={nw}",
                    spec(mode, raw_e2e if mode == "raw" else shards_e2e, nw, feats, profile=True))
                print_profile(results[key]["profile"])

    if WITH_MIXED and "mixed" in ONLY:
        mixed = _head_corpus(real_corpus(FILES), MIXED / f"corpus{N_MIXED}", N_MIXED)
        m_io, _ = prepare(mixed, MIXED, f"shards{N_MIXED}_keep")
        r_io, _ = prepare(mixed, MIXED, f"shards{N_MIXED}_resampled16k", ("++resample=16000",))
        print(f"Mixed corpus (half 44.1 kHz flac), IO only, warm, workers=1, {N_MIXED} utterances per run",
              flush=True)
        run(("mixed", "load"), "shard, resample at load time", spec("corpus-io", m_io, 1, False))
        run(("mixed", "pack"), "shard, packed ++resample=16000", spec("corpus-io", r_io, 1, False))
        run(("mixed", "wds"), "webdataset, resample at load time", spec("webdataset", m_io, 1, False))

    big_lines = RAW_LINES[-1]
    big = MIXED / f"raw{count(big_lines)}.list"  # shared with earlier runs (1 GB)
    big.parent.mkdir(parents=True, exist_ok=True)
    if not big.exists() and "rss" in ONLY:
        line = '{"key": "utt%08d", "wav": "/data/corpus/wav/utt%08d.wav", "txt": "one two three four five"}\n'
        with open(str(big) + ".tmp", "w") as f:
            for s in range(0, big_lines, 200_000):
                f.write("".join(line % (i, i) for i in range(s, min(big_lines, s + 200_000))))
        os.replace(str(big) + ".tmp", big)
    rss = {}
    for phase in ("build index", "cached index") if "rss" in ONLY else ():
        if phase == "build index":
            Path(str(big) + ".idx").unlink(missing_ok=True)
        out, peak = run_child("bench.bench_loader", "--raw-rss", str(big))
        rss[phase] = (peak, out["wall"])

    # raw-list memory per DataLoader worker: 10M lines vs 10k lines, 1 and 4 workers (process tree: RSS sums
    # shared pages once per process, PSS counts them once)
    workers_mem = {}
    for lines in RAW_LINES if "rss" in ONLY else ():
        lst = MIXED / f"raw{count(lines)}_real.list"
        _real_raw_list(lst, lines)
        for nw in RAW_WORKERS:
            peaks: dict = {}
            _, peak = run_child("bench.bench_loader", "--raw-workers", str(lst), str(nw), str(RAW_BATCHES),
                                peaks=peaks)
            workers_mem[(lines, nw)] = (peak, peaks["pss"])

    def rate(key) -> float:
        return rate_of(results[key])

    print("\nSummary (ratios of audio-seconds/s measured above)")
    for cache in CACHES if "io" in ONLY else ():
        for nw in WORKERS:
            s, w, r, f = (rate(("io", cache, nw, m)) for m in ("corpus-io", "webdataset", "raw", "wds-fast"))
            print(f"  IO only {cache} workers={nw}: shard / WebDataset+fast wav = {s / f:.2f} (target >= 1.5), "
                  f"shard / raw = {s / r:.2f}" + (" (target >= 1.5)" if cache == "cold" else "")
                  + f"; shard / WebDataset = {s / w:.2f}")
    for nw in WORKERS if "e2e" in ONLY else ():
        s, lim, b = (rate(k) for k in (("e2e", nw, "corpus-io"), ("limit", nw), ("e2e", nw, "bucket")))
        versus = "".join(f", shard / {mode} = {s / rate(('e2e', nw, mode)):.2f}" for mode in E2E_MODES[1:])
        print(f"  end to end workers={nw}: shard / fbank-only limit = {s / lim:.2f} (target >= 0.90), "
              f"bucketing / limit = {b / lim:.2f} (target >= 0.85){versus}")
    for nw in WORKERS if "e2e" in ONLY else ():
        print(f"  padding workers={nw}: sort buffer {100 * results[('e2e', nw, 'corpus-io')]['padding']:.1f}% "
              f"(target <= 10%), bucketing {100 * results[('e2e', nw, 'bucket')]['padding']:.1f}% (target <= 5%)")
    if WITH_MIXED and "mixed" in ONLY:
        print(f"  mixed corpus IO warm workers=1: packed at 16 kHz / resampled at load = "
              f"{rate(('mixed', 'pack')) / rate(('mixed', 'load')):.2f}, shard / WebDataset = "
              f"{rate(('mixed', 'load')) / rate(('mixed', 'wds')):.2f}")
    for phase, (peak, wall) in rss.items():
        print(f"  raw list of {count(big_lines)} lines, {phase}: peak RSS {mb(peak)} in {wall:.1f} s (target < 1 GB)")
    most = (RAW_LINES[-1], RAW_WORKERS[-1])
    for (lines, nw), (peak, pss) in workers_mem.items():
        print(f"  raw list of {count(lines)} lines, loader with {nw} workers ({RAW_BATCHES} batches): process tree "
              f"peak PSS {mb(pss)}, peak RSS {mb(peak)}" + (" (target PSS < 1 GB)" if (lines, nw) == most else ""))
    if workers_mem and len(RAW_LINES) > 1:  # smoke mode has one list
        few, many = RAW_WORKERS[0], RAW_WORKERS[-1]
        grow = [(workers_mem[(n, many)][1] - workers_mem[(n, few)][1]) / (many - few) for n in RAW_LINES]
        print(f"  PSS per added worker: {count(RAW_LINES[-1])} lines {mb(grow[1])} vs {count(RAW_LINES[0])} lines "
              f"{mb(grow[0])} "
              f"(ratio {grow[1] / max(grow[0], 1):.2f}, target ~1: memory does not grow with the list per worker)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--raw-rss":
        print(json.dumps(raw_rss_child(sys.argv[2])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--raw-workers":
        print(json.dumps(raw_workers_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    elif len(sys.argv) > 1:
        print(json.dumps(child(json.loads(sys.argv[1]))))
    else:
        main()
