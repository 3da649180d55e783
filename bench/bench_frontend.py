"""Features on the model's device (``dataset_conf.feats_on=model``) vs in the loader, side by side.

Corpus: ``BENCH_FRONTEND_N`` (default 4000) real espeak utterances, 16 kHz 16-bit wav as WeNet's packer
stores them (``bench.common.real_corpus``), packed like the loader bench does (1000 per shard,
audio_format=keep; ``bench.bench_loader.prepare``) under bench/out/frontend16k.

* Loader feed rate, cold cache (posix_fadvise DONTNEED on every shard before each run), 1 and 2
  DataLoader workers, train mode (shuffle 1500, sort 500, batch 16, pad), one torch thread per worker:
  ``feats_on=model`` (waveforms shipped, int16) vs loader-side fbank 80 vs IO only (``feats_type=raw``,
  the same read + decode + batch without features). Ratios are of utterances per second (the same
  utterances in every run); audio-s/s is printed from the sample counts.
* Front end on CPU: ``corpus_io.audio.features.batch_fbank`` on padded batches of 16 (cut from the
  length-sorted utterances, as the sort buffer does) vs torchaudio's per-utterance Kaldi fbank
  (``corpus_io.audio.features.fbank``) on the same waveforms, both with ``torch.set_num_threads(T)`` for
  T = 1 and 2, best of 5 alternated passes. Rates in audio-seconds per second.
* With a CUDA device: batch_fbank throughput on batches of 32 real-speech rows of 10-20 s. Without
  one (the development machine) it says so; the code path is the same device-agnostic one.

Each run is its own process (smoke mode: the loader runs share the bench's process; the front-end ones keep
theirs, so the child path runs). BENCH_FRONTEND_N sets the utterances per loader run, BENCH_FRONTEND_ROUNDS
the interleaved rounds (best of them counts), BENCH_FRONTEND_N_COMPUTE the CPU front-end utterances.
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench.common import OUT, SMOKE, drop_cache, mb, real_corpus, run_child, sized

N = sized(int(os.environ.get("BENCH_FRONTEND_N", 4000)), 48)
N_COMPUTE = sized(int(os.environ.get("BENCH_FRONTEND_N_COMPUTE", 400)), 16)  # utterances of the CPU front-end run
# loader runs per (workers, mode), interleaved round by round; the best counts (the machine is shared)
ROUNDS = sized(int(os.environ.get("BENCH_FRONTEND_ROUNDS", 2)), 1)
PASSES = sized(5, 1)  # CPU front-end passes per method, alternated; the best counts
WORKERS = sized((1, 2), (2,))  # DataLoader workers of the loader runs
THREADS = sized((1, 2), (2,))  # torch threads of the CPU front-end runs
PREFETCH = 16  # as bench_loader: batches per worker, above the sort buffer's bursts


def loader_child(spec: dict) -> dict:
    import torch

    from corpus_io.config import DatasetConf
    from corpus_io.loader.dataset import build_dataloader

    torch.set_num_threads(1)
    start = time.perf_counter()
    feats_type = "raw" if spec["mode"] == "io" else "fbank"
    conf = DatasetConf(data_type="shard", num_workers=spec["workers"], feats_type=feats_type, batch_size=16,
                       prefetch=PREFETCH, feats_on="model" if spec["mode"] == "model" else "loader")
    conf.filter_conf.max_length = 10**9
    conf.filter_conf.min_length = 0
    loader = build_dataloader(spec["list"], conf, None, train=True, rank=0, world_size=1)
    utts = 0
    seconds = nbytes = 0.0
    for batch in loader:
        utts += len(batch["keys"])
        if "wav" in batch:
            seconds += float(batch["wav_lengths"].sum()) / batch["sample_rate"]
            nbytes += batch["wav"].numel() * batch["wav"].element_size()
        else:
            rows = batch["feats_lengths"]
            seconds += float(rows.sum()) * (0.01 if batch["feats"].shape[-1] > 1 else 1 / 16000)
            nbytes += batch["feats"].numel() * batch["feats"].element_size()
    return {"utts": utts, "seconds": seconds, "wall": time.perf_counter() - start, "bytes": nbytes}


def compute_child(spec: dict) -> dict:
    """batch_fbank on padded batches of 16 vs torchaudio per utterance, on the same waveforms, T threads."""
    import torch

    from corpus_io.audio import features
    from corpus_io.audio import io as audio
    from corpus_io.shards.reader import read_shard

    torch.set_num_threads(spec["threads"])
    waves = []
    for url in open(spec["list"]).read().split():
        for sample in read_shard(url):
            w, rate = audio.decode_bytes(sample["audio"])
            waves.append(torch.from_numpy(audio.to_mono(w)).unsqueeze(0))
            if len(waves) >= spec["n"]:
                break
        if len(waves) >= spec["n"]:
            break
    waves.sort(key=lambda w: w.shape[1])
    batches = []
    for i in range(0, len(waves), 16):
        rows = waves[i:i + 16]
        lengths = torch.tensor([w.shape[1] for w in rows])
        batches.append((torch.nn.utils.rnn.pad_sequence([(w[0] * 32768).to(torch.int16) for w in rows],
                                                        batch_first=True), lengths))
    seconds = sum(w.shape[1] for w in waves) / 16000

    def per_utterance() -> None:
        for w in waves:
            features.fbank(w, 16000, num_mel_bins=80)

    def batched() -> None:
        for wav, lengths in batches:
            features.batch_fbank(wav, lengths, 16000, num_mel_bins=80)

    best = {"per_utterance": float("inf"), "batched": float("inf")}
    batched()  # constants built, allocator warm
    for _ in range(PASSES):  # alternated, so a burst of load on the shared machine hits both alike
        for name, fn in (("per_utterance", per_utterance), ("batched", batched)):
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return {"seconds": seconds, "utts": len(waves), **best}


def gpu_child(spec: dict) -> dict:
    """batch_fbank on CUDA: real utterances joined into 10-20 s rows, batches of 32, 20 timed batches."""
    import torch

    from corpus_io.audio import features
    from corpus_io.audio import io as audio
    from corpus_io.shards.reader import read_shard

    if not torch.cuda.is_available():
        return {}
    device = torch.device("cuda")
    pieces = []
    for sample in read_shard(open(spec["list"]).read().split()[0]):
        w, _ = audio.decode_bytes(sample["audio"])
        pieces.append(torch.from_numpy((audio.to_mono(w) * 32768).astype("int16")))
    rows, lengths, i = [], [], 0
    for r in range(32):
        target = 16000 * (10 + (r * 10) // 31)  # 10 .. 20 s
        row = []
        while sum(p.numel() for p in row) < target:
            row.append(pieces[i % len(pieces)])
            i += 1
        rows.append(torch.cat(row)[:target])
        lengths.append(target)
    wav = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True).to(device)
    lens = torch.tensor(lengths, device=device)
    for _ in range(3):
        features.batch_fbank(wav, lens, 16000, num_mel_bins=80)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        features.batch_fbank(wav, lens, 16000, num_mel_bins=80)
    torch.cuda.synchronize()
    return {"device": torch.cuda.get_device_name(), "batch": len(rows), "seconds": 20 * sum(lengths) / 16000,
            "wall": time.perf_counter() - start}


def _run(spec: dict) -> dict:
    if SMOKE and spec["kind"] == "loader":  # three torch imports saved; the figures measure nothing here
        return dict(loader_child(spec), peak_rss=0)
    out, peak = run_child("bench.bench_frontend", json.dumps(spec))
    out["peak_rss"] = peak
    return out


def main() -> None:
    from bench.bench_loader import prepare

    here = OUT / f"frontend16k_{N}"
    here.mkdir(parents=True, exist_ok=True)
    corpus = real_corpus(N, sample_rates=(16000, 16000), formats=("wav", "wav"))
    shards, _ = prepare(corpus, here)
    files = [str(shards)] + shards.read_text().split()
    print(f"16 kHz wav shards ({shards}), {N} utterances per loader run, cold cache, train mode, batch 16",
          flush=True)
    results: dict = {}
    for round_ in range(ROUNDS):
        for nw in WORKERS:
            for mode in ("model", "loader", "io"):
                drop_cache(files)
                res = _run({"kind": "loader", "mode": mode, "workers": nw, "list": str(shards)})
                best = results.get((nw, mode))
                if best is None or res["utts"] / res["wall"] > best["utts"] / best["wall"]:
                    results[(nw, mode)] = res
        print(f"  round {round_ + 1} of {ROUNDS} done", flush=True)
    for nw in WORKERS:
        for mode, name in (("model", "feats_on=model (waveforms)"), ("loader", "loader-side fbank 80"),
                           ("io", "IO only (feats_type=raw)")):
            res = results[(nw, mode)]
            shipped = res["bytes"] / max(res["seconds"], 1e-9) / 1e3
            print(f"  workers={nw} {name:<28} {res['utts'] / res['wall']:7.0f} utt/s "
                  f"{res['seconds'] / res['wall']:7.0f} audio-s/s  {shipped:6.1f} kB per audio-s shipped  "
                  f"peak RSS {mb(res['peak_rss'])}", flush=True)
    print(f"CPU front end, {N_COMPUTE} utterances sorted by length, batches of 16, best of {PASSES}", flush=True)
    gpu = _run({"kind": "gpu", "list": str(shards)})
    if gpu.get("device"):
        print(f"GPU front end ({gpu['device']}), batches of {gpu['batch']} utterances of 10-20 s: "
              f"{gpu['seconds'] / gpu['wall']:.0f} audio-s/s (target >= 100,000 on one H100)", flush=True)
    compute = {}
    for threads in THREADS:
        res = compute[threads] = _run({"kind": "compute", "threads": threads, "list": str(shards), "n": N_COMPUTE})
        for name in ("per_utterance", "batched"):
            print(f"  threads={threads} {name:<14} {res['seconds'] / res[name]:8.0f} audio-s/s", flush=True)

    print("\nSummary (ratios measured above)")
    for nw in WORKERS:
        rate = {m: results[(nw, m)]["utts"] / results[(nw, m)]["wall"] for m in ("model", "loader", "io")}
        print(f"  loader feed, cold, workers={nw}: feats_on=model / loader-side fbank = "
              f"{rate['model'] / rate['loader']:.2f} (target >= 3), feats_on=model / IO only = "
              f"{rate['model'] / rate['io']:.2f} (target >= 0.9)")
    for threads in THREADS:
        res = compute[threads]
        print(f"  CPU front end, threads={threads}: batched / torchaudio per utterance = "
              f"{res['per_utterance'] / res['batched']:.2f} (target >= 1, not slower)")
    if not gpu.get("device"):
        print("  GPU front end: not measured (no CUDA device); conformer_small data-wait: not measured")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        spec = json.loads(sys.argv[1])
        child = {"loader": loader_child, "compute": compute_child, "gpu": gpu_child}[spec["kind"]]
        print(json.dumps(child(spec)))
    else:
        main()
