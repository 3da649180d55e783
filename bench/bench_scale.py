"""Scale by simulation: a 10,000-hour corpus (15M utterances in 7,500 shards) at 8, 64 and 512 ranks x 4 workers.

The shard list and its index are the real format with realistic per-shard durations (2,000 utterances
per shard, log-normal durations, 10,000 h in all); every listed shard is a tiny real tar (4 real espeak
utterances under keys of its own: a file locally, an object on the local SeaweedFS S3 server), so the read
path is real while the index carries the scale. Reported, side by side per world size:

* planning an epoch, per rank: reading the list + index and computing this rank's workers' shards
  (time, and Python peak memory, also at a tenth of the utterances: flat in utterances);
* ``state_dict`` size per rank (4 workers, each with ~1,000 samples pending in its shuffle/sort buffers)
  and per checkpoint (every rank's);
* restoring such a checkpoint and producing the first batch, on the same and on another world size
  (an elastic re-split);
* the first batch from cold over S3 (a fresh process, 7,500 shards listed).

Targets: planning < 1 s per rank at 512 ranks, state < 64 KB per rank, first batch < 5 s on S3.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
import tracemalloc
from pathlib import Path

from bench.common import OUT, mb, seaweed_server, sized

SHARDS = sized(7500, 40)
UTTS_PER_SHARD = 2000
WORKERS = sized(4, 2)  # DataLoader workers per rank
WORLDS = sized((8, 64, 512), (2, 4, 8))
HOURS = 10_000
PENDING = 1000  # samples pending per worker: half a 1500 shuffle block and half a 500 sort block


def tiny_utterances(root: Path) -> list[tuple[str, bytes, bytes]]:
    """4 short real espeak utterances (8 kHz wav, their first 0.5 s): (key, transcript, wav bytes)."""
    import soundfile as sf

    from corpus_io.tables import synth

    kaldi = root / "tiny"
    if not (kaldi / "wav.scp").exists():
        synth.make_digits(kaldi, 4, seed=3, sample_rate=8000)
    texts = dict(line.split(" ", 1) for line in (kaldi / "text").read_text(encoding="utf-8").splitlines())
    out = []
    for line in (kaldi / "wav.scp").read_text().splitlines():
        key, path = line.split(" ", 1)
        wave, rate = sf.read(path, dtype="int16")
        wav = io.BytesIO()
        sf.write(wav, wave[:rate // 2], rate, format="WAV", subtype="PCM_16")
        out.append((key, texts[key].encode(), wav.getvalue()))
    return out


def tiny_tar(utterances: list[tuple[str, bytes, bytes]], shard: int) -> bytes:
    """Shard number ``shard``: the tiny utterances under keys of its own (the loader refuses a list whose shards
    repeat a key, so the shards cannot be copies of one tar)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, text, wav in utterances:
            for ext, data in (("txt", text), ("wav", wav)):
                info = tarfile.TarInfo(f"s{shard:06d}-{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_list(list_path: Path, urls: list[str], utts_per_shard: int) -> None:
    """data.list + index.jsonl: ``utts_per_shard`` utterances per shard, log-normal durations, HOURS in all."""
    import numpy as np

    from corpus_io.shards.index import write_list_and_index

    rng = np.random.default_rng(0)
    durations = np.array([rng.lognormal(0.8, 0.5, size=utts_per_shard).sum() for _ in urls])
    durations *= HOURS * 3600 / durations.sum()
    write_list_and_index(list_path, ({"path": u, "num_utts": utts_per_shard, "duration": round(float(d), 2)}
                                     for u, d in zip(urls, durations)))


def local_corpus(root: Path, utterances: list) -> tuple[Path, Path]:
    """The 15M-utterance list and a 1.5M one over the same 7,500 local shards (written afresh: 40 KB each)."""
    shards = root / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    urls = [str(shards / f"shard-{i:06d}.tar") for i in range(SHARDS)]
    for i, url in enumerate(urls):
        Path(url).write_bytes(tiny_tar(utterances, i))
    big, small = root / "big" / "data.list", root / "small" / "data.list"
    for path, n in ((big, UTTS_PER_SHARD), (small, UTTS_PER_SHARD // 10)):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_list(path, urls, n)
    return big, small


def plan_one_rank(data_list: Path, world: int) -> tuple[float, float, int]:
    """(seconds to read list + index, seconds to plan one worker's shards, Python peak bytes) for the last rank."""
    from corpus_io.loader.partition import Slot, SlotState, _split_ranks
    from corpus_io.loader.read import Source, pieces_of_pass

    _split_ranks.cache_clear()
    tracemalloc.start()
    t0 = time.perf_counter()
    source = Source.open(str(data_list), "shard")
    t1 = time.perf_counter()
    # each worker process plans its own shards, in parallel: one worker's time is the rank's
    pieces_of_pass(0, source, Slot(world - 1, world, WORKERS - 1, WORKERS), SlotState(), seed=0, pass_=0,
                   shuffle=True)
    t2 = time.perf_counter()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return t1 - t0, t2 - t1, peak


def simulated_states(data_list: Path, world: int) -> list[dict]:
    """Every rank's loader state mid-epoch: each worker half-way through its shards, PENDING samples buffered."""
    import random

    from corpus_io.config import DatasetConf
    from corpus_io.loader.partition import Slot, SlotState
    from corpus_io.loader.read import Source, pieces_of_pass

    seed = DatasetConf().seed
    source = Source.open(str(data_list), "shard")
    rng = random.Random(0)
    states = []
    for rank in range(world):
        workers = {}
        for w in range(WORKERS):
            units = len(pieces_of_pass(0, source, Slot(rank, world, w, WORKERS), SlotState(), seed=seed, pass_=0,
                                       shuffle=True))
            k = max(1, units // 2)
            st = SlotState(epoch=0, cursor={0: (k, 1200)}, taken={0: 2000 * k + 1200}, seconds=4800.0 * k)
            for pos in rng.sample(range(1200), PENDING // 2):
                st.pending[(0, k - 1, 800 + pos)] = float(int(rng.lognormvariate(5.4, 0.5))) * 0.01  # frames
            for pos in rng.sample(range(1200), PENDING // 2):
                st.pending[(0, k, pos)] = float(int(rng.lognormvariate(5.4, 0.5))) * 0.01
            workers[str(w)] = st.to_dict()
        states.append({"version": 1, "epoch": 0, "seed": seed, "rank": rank, "world_size": world,
                       "num_workers": WORKERS, "batches": 1000, "data_lists": [str(data_list)], "workers": workers,
                       "counts": {}})
    return states


def restore_and_first_batch(data_list: Path, states: list[dict], world: int) -> tuple[float, float, str]:
    """(seconds to load every rank's state, seconds to the first batch after it) on rank 0 of ``world``."""
    from corpus_io.config import DatasetConf
    from corpus_io.loader.dataset import build_dataloader

    conf = DatasetConf(num_workers=WORKERS)
    # buffers of one batch: the first batch then measures the restore and the read path, not the filling of a
    # 1,500-sample shuffle buffer from 4-utterance tiny shards (a real 2,000-utterance shard fills it alone)
    conf.shuffle_conf.shuffle_size = conf.sort_conf.sort_size = conf.batch_size
    loader = build_dataloader(str(data_list), conf, None, train=True, rank=0, world_size=world)
    t0 = time.perf_counter()
    plan = loader.load_rank_states(json.loads(json.dumps(states)))
    t1 = time.perf_counter()
    next(iter(loader))
    return t1 - t0, time.perf_counter() - t1, "re-split" if plan is not None else "same"


COLD = """
import sys, time
t0 = time.perf_counter()
from corpus_io.config import DatasetConf
from corpus_io.loader.dataset import build_dataloader
conf = DatasetConf(num_workers=int(sys.argv[4]),
                   storage_options={"anon": True, "client_kwargs": {"endpoint_url": sys.argv[2]}})
if sys.argv[3] != "default":  # buffers of one batch: what the first batch costs besides filling them
    conf.shuffle_conf.shuffle_size = conf.sort_conf.sort_size = conf.batch_size
t1 = time.perf_counter()
batch = next(iter(build_dataloader(sys.argv[1], conf, None, train=True, rank=0, world_size=1)))
print(f"{t1 - t0:.3f} {time.perf_counter() - t1:.3f} {len(batch['keys'])}")
"""


def s3_cold_first_batch(root: Path, utterances: list) -> tuple[float, dict]:
    """Upload seconds and, per buffer setting, (process wall, import seconds, first batch seconds) over 7,500
    shards on SeaweedFS, each in a fresh process."""
    with seaweed_server(root / "seaweed") as (endpoint, fs):
        urls = [f"s3://scale/shard-{i:06d}.tar" for i in range(SHARDS)]
        t0 = time.perf_counter()
        for start in range(0, SHARDS, 500):
            fs.pipe({u[len("s3://"):]: tiny_tar(utterances, i) for i, u in enumerate(urls[start:start + 500], start)})
        upload = time.perf_counter() - t0
        data_list = root / "s3" / "data.list"
        data_list.parent.mkdir(parents=True, exist_ok=True)
        write_list(data_list, urls, UTTS_PER_SHARD)
        runs = {}
        for buffers in sized(("default", "one batch"), ("one batch",)):  # a fresh process each
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", COLD, str(data_list), endpoint, buffers, str(WORKERS)],
                                 capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
            wall = time.perf_counter() - t0
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-3000:])
            imports, first, _ = out.stdout.split()
            runs[buffers] = (wall, float(imports), float(first))
        return upload, runs


def main() -> None:
    root = OUT / "scale"
    utterances = tiny_utterances(root)
    t0 = time.perf_counter()
    big, small = local_corpus(root, utterances)
    print(f"corpus: {SHARDS} shards x {UTTS_PER_SHARD} utterances = {SHARDS * UTTS_PER_SHARD / 1e6:.0f}M "
          f"utterances, {HOURS} h in the index; each shard a {len(tiny_tar(utterances, 0)) / 1024:.0f} KB real tar "
          f"(made in {time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"\n{'ranks':>6} | {'read list+index':>15} | {'plan 1 worker':>13} | {'peak (15M utts)':>15} | "
          f"{'peak (1.5M utts)':>16} | {'state/rank':>10} | {'checkpoint':>10}")
    rows, plan_most, state_max = {}, 0.0, 0
    for world in WORLDS:
        read_s, plan_s, peak = plan_one_rank(big, world)
        _, _, peak_small = plan_one_rank(small, world)
        states = simulated_states(big, world)
        per_rank = max(len(json.dumps(s)) for s in states)
        total = sum(len(json.dumps(s)) for s in states)
        rows[world] = states
        state_max = max(state_max, per_rank)
        plan_most = read_s + plan_s if world == WORLDS[-1] else plan_most
        print(f"{world:>6} | {read_s:>13.2f} s | {plan_s:>11.2f} s | {mb(peak):>15} | {mb(peak_small):>16} | "
              f"{per_rank / 1024:>7.0f} KB | {total / 2**20:>7.1f} MB", flush=True)
    print(f"\n{'checkpoint':>10} -> {'resumed on':>10} | {'load states':>11} | {'first batch':>11} | how")
    few, some, most = WORLDS
    for old, new in ((few, few), (few, some), (some, most), (most, few)):
        load_s, first_s, how = restore_and_first_batch(big, rows[old], new)
        print(f"{old:>10} -> {new:>10} | {load_s:>9.2f} s | {first_s:>9.2f} s | {how}", flush=True)
    upload, runs = s3_cold_first_batch(root, utterances)
    print(f"\nS3 (SeaweedFS on 127.0.0.1, {SHARDS} shards uploaded in {upload:.0f} s), 1 rank x {WORKERS} workers, "
          f"a fresh process each:")
    for buffers, (wall, imports, first_s) in runs.items():
        print(f"  shuffle/sort buffers {buffers:>9}: first batch {first_s:.2f} s after the imports ({imports:.2f} s), "
              f"process wall {wall:.2f} s")
    first = runs["one batch"][2]
    for what, value, target in ((f"planning per rank at {most} ranks (s)", plan_most, 1.0),
                                 ("state per rank (KB)", state_max / 1024, 64.0),
                                 ("first batch from cold on S3, buffers of one batch (s)", first, 5.0)):
        print(f"target {what}: {value:.2f} < {target:g}: {'met' if value < target else 'MISSED'}")


if __name__ == "__main__":
    main()
