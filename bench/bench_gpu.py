"""Batches shaped for the GPU, side by side in one run (``make bench BENCH=gpu``; docs/BENCHMARKS.md).

Corpus: ``BENCH_GPU_N`` (default 8000) real espeak utterances, 16 kHz wav, packed 1000 per shard
(``bench.bench_loader.prepare``; the index holds every duration, so the loader's bucket edges come from it).

Printed, for the loader's defaults (duration buckets, each batch padded to its bucket's edge) against the sort
buffer of before (``bucketing=false``: each batch padded to its longest utterance), at GPU batch sizes
(``batch_type=length``, ``BENCH_GPU_FRAMES`` frames, default 24,000 = 240 s):

* the device front end's audio-s/s (``batch_fbank`` on batches of 32 padded rows);
* the bench model's step time (forward + backward + optimizer; ``model=conformer_small``, or
  ``conformer_tiny`` in smoke mode) in fp32, bf16 and fp16, for the loader's real batches of each batcher
  and for one fixed shape (the first batch repeated); cuDNN plans every new shape, so the gap between the
  real batches and the fixed shape is what shapes cost;
* data_wait (the share of a step spent waiting for the loader) with loader-side features and with
  ``feats_on=model`` at ``BENCH_GPU_WORKERS`` workers (default 8);
* the padding share and the number of distinct padded lengths of an epoch.

Without CUDA it runs the same code on the CPU in smoke mode sizes, says that no GPU was seen, and leaves fp16
out (autocast fp16 is a GPU path). One command; about 3-4 minutes on an H100.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.common import OUT, SMOKE, real_corpus

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Sizes:
    utterances: int
    frames: int  # a length batch's frames (10 ms)
    workers: int
    steps: int  # timed steps per (batcher, precision)


def run_sizes(cuda: bool) -> Sizes:
    """The sizes of a run: the full ones (or BENCH_GPU_*) on a GPU; the smoke sizes in smoke mode and without CUDA,
    where the figures measure nothing about a GPU and the full sizes would only cost minutes."""
    small = SMOKE or not cuda

    def pick(name: str, full: int, smoke: int) -> int:
        return smoke if small else int(os.environ.get(name, full))

    return Sizes(pick("BENCH_GPU_N", 8000, 48), pick("BENCH_GPU_FRAMES", 24000, 3000),
                 pick("BENCH_GPU_WORKERS", 8, 2), pick("BENCH_GPU_STEPS", 40, 3))


def _conf(bucketing: bool, feats_on: str, sizes: Sizes):
    from corpus_io.config import DatasetConf

    conf = DatasetConf(data_type="shard", batch_type="length", batch_size=sizes.frames, max_batch_size=10**5,
                       num_workers=sizes.workers, bucketing=bucketing, feats_on=feats_on)
    conf.filter_conf.token_min_length = 0
    return conf


def _tokenizer(out):
    from corpus_io.config import TokenizerConf
    from corpus_io.tokenizer import build_tokenizer

    path = out / "tokens.txt"
    if not path.exists():
        path.write_text("".join(f"{s} {i}\n" for i, s in enumerate(["<blank>", "<unk>", *"abcdefghijklmnopqrstuvwxyz'",
                                                                     "<space>", "<sos/eos>"])))
    return build_tokenizer(TokenizerConf(type="char", token_list=str(path)))


def _batches(data_list: str, tok, bucketing: bool, feats_on: str, sizes: Sizes) -> tuple[list, Counter, float]:
    """One epoch's batches (kept, for the model runs), its padded lengths and padding share."""
    from corpus_io.loader.batching import batch_shape
    from corpus_io.loader.dataset import build_dataloader

    loader = build_dataloader(data_list, _conf(bucketing, feats_on, sizes), tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    kept, widths, real, padded = [], Counter(), 0, 0
    for batch in loader:
        width, rows_real, rows_padded = batch_shape(batch)
        widths[width] += 1
        real += rows_real
        padded += rows_padded
        kept.append({k: (v.clone() if hasattr(v, "clone") else v) for k, v in batch.items()})
    return kept, widths, 1.0 - real / max(padded, 1)


def _model(device, input_dim: int, vocab: int):
    import torch
    from omegaconf import OmegaConf

    from corpus_io.model.model import build_model

    name = "conformer_tiny" if SMOKE or device.type != "cuda" else "conformer_small"
    conf = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml"))
    torch.manual_seed(0)
    return build_model(conf, input_dim, vocab).to(device), name


def _step_times(batches: list, device, amp, front_end, steps: int) -> float:
    """Median seconds per training step over the batches (the first two are warm-up)."""
    import statistics

    import torch

    from corpus_io.train.steps import StepContext, micro_step, optim_step  # noqa: F401

    model, _ = _model(device, 80, 31)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
    sc = StepContext(model, device, 1, amp, scaler, front_end)
    times = []
    for batch in batches[:steps + 2]:
        t = time.perf_counter()
        micro_step(sc, batch, sync=True)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:] if len(times) > 3 else times)


def _data_wait(data_list: str, tok, feats_on: str, device, sizes: Sizes) -> float:
    """Share of wall time the training loop waits for the loader (bf16 steps where there is a GPU)."""
    import torch

    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.model.frontend import build_front_end
    from corpus_io.train.steps import StepContext, micro_step

    conf = _conf(True, feats_on, sizes)
    loader = build_dataloader(data_list, conf, tok, train=True, rank=0, world_size=1)
    model, _ = _model(device, 80, 31)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sc = StepContext(model, device, 1, torch.bfloat16 if device.type == "cuda" else None, None,
                     build_front_end(conf, device))
    loader.set_epoch(0)
    wait = 0.0
    start = tick = time.perf_counter()
    for batch in loader:
        wait += time.perf_counter() - tick
        micro_step(sc, batch, sync=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        tick = time.perf_counter()
    return wait / (time.perf_counter() - start)


def _front_end_rate(batches: list, device) -> float:
    import torch

    from corpus_io.audio import features

    waves = [(b["wav"], b["wav_lengths"]) for b in batches if "wav" in b][:20]
    if not waves:
        return 0.0
    seconds = 0.0
    for wav, lengths in waves[:2]:  # warm-up
        features.batch_fbank(wav.to(device).float(), lengths.to(device), 16000, num_mel_bins=80)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for wav, lengths in waves:
        features.batch_fbank(wav.to(device).float(), lengths.to(device), 16000, num_mel_bins=80)
        seconds += float(lengths.sum()) / 16000
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seconds / (time.perf_counter() - t)


def main() -> None:
    import torch

    from bench.bench_loader import prepare
    from corpus_io.model.frontend import build_front_end

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is fp32
        print(f"device: {torch.cuda.get_device_name()}", flush=True)
    else:
        print("no GPU was seen (torch.cuda.is_available() is False): the same code paths on the CPU, smoke-sized "
              "figures that measure nothing about a GPU; fp16 left out", flush=True)
    sizes = run_sizes(cuda)
    here = OUT / f"gpu16k_{sizes.utterances}"
    here.mkdir(parents=True, exist_ok=True)
    corpus = real_corpus(sizes.utterances, sample_rates=(16000, 16000), formats=("wav", "wav"))
    shards, _ = prepare(corpus, here)
    tok = _tokenizer(here)
    data_list = str(shards)
    print(f"{sizes.utterances} utterances, length batches of {sizes.frames} frames, {sizes.workers} workers",
          flush=True)

    runs = {}
    for name, bucketing in (("buckets (default)", True), ("sort buffer", False)):
        runs[name] = _batches(data_list, tok, bucketing, "model", sizes)
        _, widths, padding = runs[name]
        print(f"  {name:<18} {sum(widths.values()):5d} batches, {len(widths):4d} padded lengths, "
              f"padding {100 * padding:5.1f}%", flush=True)

    rate = _front_end_rate(runs["buckets (default)"][0], device)
    print(f"device front end (batch_fbank on {device.type}): {rate:,.0f} audio-s/s", flush=True)

    precisions = [("fp32", None), ("bf16", torch.bfloat16)] + ([("fp16", torch.float16)] if cuda else [])
    conf = _conf(True, "model", sizes)
    front_end = build_front_end(conf, device)
    table = {}
    for label, amp in precisions:
        for name, (batches, _, _) in runs.items():
            table[(label, name)] = _step_times(batches, device, amp, front_end, sizes.steps)
        fixed = [runs["buckets (default)"][0][0]] * (sizes.steps + 2)
        table[(label, "one fixed shape")] = _step_times(fixed, device, amp, front_end, sizes.steps)
    model_name = _model(device, 80, 31)[1]
    print(f"\nstep time (s), {model_name}, forward + backward + optimizer, median of {sizes.steps}:")
    columns = ["buckets (default)", "sort buffer", "one fixed shape"]
    print("  " + " " * 6 + "".join(f"{c:>20}" for c in columns))
    for label, _ in precisions:
        print(f"  {label:<6}" + "".join(f"{table[(label, c)]:>20.4f}" for c in columns), flush=True)

    waits = {feats_on: _data_wait(data_list, tok, feats_on, device, sizes) for feats_on in ("loader", "model")}
    print(f"\ndata_wait, {sizes.workers} workers, buckets: loader-side fbank {100 * waits['loader']:.1f}%, "
          f"feats_on=model {100 * waits['model']:.1f}%")

    print("\nSummary (ratios measured above)")
    for label, _ in precisions[1:]:
        print(f"  {label} / fp32, the loader's default batches: "
              f"{table[(label, 'buckets (default)')] / table[('fp32', 'buckets (default)')]:.2f} "
              f"(target <= 1 on a GPU)")
    for label, _ in precisions:
        print(f"  {label}: sort-buffer batches / default batches = "
              f"{table[(label, 'sort buffer')] / table[(label, 'buckets (default)')]:.2f}")
    print(f"  padded lengths: default {len(runs['buckets (default)'][1])} vs sort buffer "
          f"{len(runs['sort buffer'][1])}; padding {100 * runs['buckets (default)'][2]:.1f}% vs "
          f"{100 * runs['sort buffer'][2]:.1f}% (target <= 5%)")
    print(f"  data_wait with the GPU defaults (feats_on=model): {100 * waits['model']:.1f}% (target <= 1% on a GPU)")
    if not cuda:
        print("  no GPU: every figure above is the CPU's, not a measurement of the targets")


if __name__ == "__main__":
    main()
