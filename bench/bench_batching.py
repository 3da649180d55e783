"""Padding: WeNet's sort buffer vs duration bucketing at the same token budget.

Lengths follow a lognormal fitted to the fixture corpus (durations from file headers,
tokens per second by FunASR's target_len rule), plus a wider one (sigma x 1.7) for corpora
with more spread. Both chains see the same block-shuffled stream (shuffle_size 1500).
Targets (issue 4): padding <= 10% with the sort buffer (sort_size 500) and <= 5% with
bucketing (the default num_buckets) at the same budget.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

from bench.common import sized
from corpus_io.config import DatasetConf
from corpus_io.loader.batching import batch, bucket_batch, mean_padding_ratio

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "corpus"
UTTERANCES = sized(20000, 2000)


def _lengths(sample: dict) -> tuple[int, int]:
    return sample["source_len"], sample["target_len"]


def fit_fixture() -> tuple[float, float, float]:
    """(mu, sigma) of log seconds and tokens per second of the fixture corpus."""
    import soundfile as sf

    from corpus_io.tables.manifest import target_len

    texts = dict(line.split(" ", 1) for line in (FIXTURE / "text").read_text(encoding="utf-8").splitlines())
    logs, seconds, tokens = [], 0.0, 0
    for line in (FIXTURE / "wav.scp").read_text().splitlines():
        key, rel = line.split(" ", 1)
        info = sf.info(str(FIXTURE.parent.parent.parent / rel))
        logs.append(math.log(info.frames / info.samplerate))
        seconds += info.frames / info.samplerate
        tokens += target_len(texts[key])
    mu = sum(logs) / len(logs)
    sigma = math.sqrt(sum((x - mu) ** 2 for x in logs) / (len(logs) - 1))
    return mu, sigma, tokens / seconds


def lognormal_corpus(n: int, *, mu: float, sigma: float, tokens_per_second: float, seed: int = 0) -> list[dict]:
    """``n`` sample dicts with ``source_len`` (10 ms frames) and ``target_len`` (tokens)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        seconds = min(30.0, max(0.2, rng.lognormvariate(mu, sigma)))
        tokens = max(1, round(seconds * tokens_per_second + rng.gauss(0, 1)))
        out.append({"key": f"u{i:06d}", "source_len": int(seconds * 100), "target_len": tokens})
    return out


def _block_sort(samples: list[dict], size: int) -> list[dict]:
    out = []
    for i in range(0, len(samples), size):
        out.extend(sorted(samples[i:i + size], key=lambda s: s["source_len"]))
    return out


def compare(corpus: list[dict], batch_size: int, *, sort_size: int = 500,
            num_buckets: int = DatasetConf().num_buckets) -> tuple[float, float]:
    """(sort-buffer padding, bucketing padding) of the same shuffled stream at one token budget."""
    stream = list(corpus)
    random.Random(1).shuffle(stream)
    sort_batches = batch(_block_sort(stream, sort_size), batch_type="token", batch_size=batch_size,
                         lengths=_lengths)
    bucket_batches = bucket_batch(stream, batch_type="token", batch_size=batch_size, num_buckets=num_buckets,
                                  lengths=_lengths)
    return mean_padding_ratio(sort_batches, _lengths), mean_padding_ratio(bucket_batches, _lengths)


def main() -> None:
    mu, sigma, tps = fit_fixture()
    print(f"fixture fit: median {math.exp(mu):.2f} s, log-sigma {sigma:.2f}, {tps:.1f} tokens/s; "
          f"{UTTERANCES} utterances")
    print(f"{'distribution':<22} {'budget':>7} {'sort_buffer':>12} {'bucketing':>10} {'ratio':>6}  target")
    for name, s in (("fixture lognormal", sigma), ("wide (sigma x 1.7)", sigma * 1.7)):
        corpus = lognormal_corpus(UTTERANCES, mu=mu, sigma=s, tokens_per_second=tps)
        for budget in (6000, 12000, 24000):
            start = time.perf_counter()
            p_sort, p_bucket = compare(corpus, budget)
            ok = "ok" if p_sort <= 0.10 and p_bucket <= 0.05 else "MISS"
            print(f"{name:<22} {budget:>7} {p_sort:>11.1%} {p_bucket:>9.1%} {p_sort / max(p_bucket, 1e-9):>5.1f}x  "
                  f"{ok} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
