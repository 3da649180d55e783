"""Reverberation, noise and volume on the fly (``dataset_conf.add_reverb/add_noise/volume_perturb``): what
they cost the loader, and the device path (``feats_on=model``) against the loader path.

Corpus: ``BENCH_AUGMENT_N`` (default 2000) real espeak utterances, 16 kHz wav, packed as the loader bench
does (``bench.bench_loader.prepare``). Noise: the same corpus's shards as babble (a shard data.list, so the
pool streams shards); impulse responses: 8 rooms simulated with pyroomacoustics (recipes/tools/make_rirs.py).

* Loader rate, train mode, fbank 80 in the workers, 1 and 2 DataLoader workers: no augmentation vs each one
  alone (prob 1) vs all three; ratios of audio-seconds per second against no augmentation, side by side in
  interleaved rounds (best counts).
* Device path vs loader path, all three augmentations: ``feats_on=model`` (the loader draws; the consuming
  process applies reverb/noise/volume and fbank batched through ``corpus_io.model.frontend``, here on the
  CPU) vs everything in the workers.
* Noise memory: the peak RSS of a noise-only run whose noise list is 1 shard vs the whole corpus's shards
  (the pool holds ``buffer_seconds`` whatever the list's size, read sequentially from a window of it).

Smoke (``--smoke``): 16 utterances (2 shards), 1 room, no DataLoader worker, the modes none/all/all-on-model
and the two memory runs all in one child process (one torch import): every code path, seconds in all.
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench.common import OUT, SMOKE, mb, real_corpus, run_child, sized

N = sized(int(os.environ.get("BENCH_AUGMENT_N", 2000)), 16)  # smoke: 2 shards of 8 copies of 8 utterances
ROUNDS = sized(int(os.environ.get("BENCH_AUGMENT_ROUNDS", 2)), 1)
WORKERS = sized((1, 2), (0,))
MODES = sized(("none", "reverb", "noise", "volume", "all", "all-on-model"), ("none", "all", "all-on-model"))


def loader_child(spec: dict) -> dict:
    import torch

    from corpus_io.config import DatasetConf
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.model.frontend import build_front_end, model_inputs

    torch.set_num_threads(1)
    mode = spec["mode"]
    conf = DatasetConf(data_type="shard", num_workers=spec["workers"], batch_size=16, prefetch=16,
                       feats_on="model" if mode == "all-on-model" else "loader")
    conf.filter_conf.max_length, conf.filter_conf.min_length = 10**9, 0
    conf.add_reverb = mode in ("reverb", "all", "all-on-model")
    conf.add_noise = mode in ("noise", "all", "all-on-model")
    conf.volume_perturb = mode in ("volume", "all", "all-on-model")
    conf.add_reverb_conf.rir_list, conf.add_reverb_conf.prob = spec["rirs"], 1.0
    conf.add_noise_conf.noise_list = spec["noise"]
    conf.add_noise_conf.buffer_seconds = 60.0
    front_end = build_front_end(conf, "cpu")
    start = time.perf_counter()
    loader = build_dataloader(spec["list"], conf, None, train=True, rank=0, world_size=1)
    seconds = 0.0
    for batch in loader:
        feats, lengths = model_inputs(front_end, batch, torch.device("cpu"), train=True)
        seconds += float(lengths.sum()) * 0.01
    return {"seconds": seconds, "wall": time.perf_counter() - start}


def measure(specs: list[dict]) -> list[tuple[dict, int]]:
    """``(loader_child's result, peak RSS)`` of each spec: each in its own process (independent rates and
    peaks); in smoke mode all in one (torch is imported once: the figures measure nothing there anyway)."""
    if SMOKE:
        outs, peak = run_child("bench.bench_augment", json.dumps(specs))
        return [(out, peak) for out in outs]
    results = []
    for spec in specs:
        (out,), peak = run_child("bench.bench_augment", json.dumps([spec]))
        results.append((out, peak))
    return results


def main() -> None:
    from bench.bench_loader import prepare

    here = OUT / "augment"
    here.mkdir(parents=True, exist_ok=True)
    corpus = real_corpus(N, base_utts=sized(400, 8), sample_rates=(16000, 16000), formats=("wav", "wav"))
    shards, _ = prepare(corpus, here)
    rirs = here / "rirs" / "wav.scp"
    if not rirs.exists():
        import importlib.util

        path = os.path.join(os.path.dirname(__file__), "..", "recipes", "tools", "make_rirs.py")
        spec = importlib.util.spec_from_file_location("make_rirs", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.make_rirs(here / "rirs", num=sized(8, 1), seed=0)
    one_shard = here / "noise1.list"
    one_shard.write_text(shards.read_text().split()[0] + "\n")
    base = {"list": str(shards), "rirs": str(rirs), "noise": str(shards)}
    runs = [(mode, workers) for _ in range(ROUNDS) for workers in WORKERS for mode in MODES]
    memory = [("1 shard", one_shard), (f"{len(shards.read_text().split())} shards", shards)]
    results = measure([{**base, "mode": mode, "workers": workers} for mode, workers in runs]
                      + [{**base, "noise": str(noise), "mode": "noise", "workers": WORKERS[0]} for _, noise in memory])
    best: dict[tuple, float] = {}
    for (mode, workers), (out, _) in zip(runs, results):
        best[(mode, workers)] = max(best.get((mode, workers), 0.0), out["seconds"] / out["wall"])
    print(f"{N} utterances, fbank 80 in the loader, train mode; audio-seconds per second (best of {ROUNDS}):")
    for workers in WORKERS:
        none = best[("none", workers)]
        row = ", ".join(f"{m} {best[(m, workers)]:.0f} ({best[(m, workers)] / none:.2f}x)" for m in MODES)
        print(f"  {workers} worker(s): {row}")
        print(f"    device path (feats_on=model, applied on the CPU here) vs loader path, all three: "
              f"{best[('all-on-model', workers)] / best[('all', workers)]:.2f}x")
    peaks = {name: peak for (name, _), (_, peak) in zip(memory, results[len(runs):])}
    print("noise pool memory (peak RSS of a noise-only run, 60 s pool): "
          + ", ".join(f"noise list of {k}: {mb(v)}" for k, v in peaks.items()))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps([loader_child(spec) for spec in json.loads(sys.argv[1])]))
    else:
        main()
