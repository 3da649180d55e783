"""The loader reading a Lhotse Shar directly vs our tar shards of the same audio, side by side (issue 32).

Corpus: ``bench.common.real_corpus(4000)`` (real espeak speech, half 16 kHz wav, half 44.1 kHz flac). The same
records are written once as a Lhotse Shar (``corpus_io.tables.shar.write_shar``: the audio bytes copied, 1000 cuts
per shard) and packed once as tar shards (``pack-shards ++audio_format=keep``, 1000 per shard), so both hold the
same bytes; the Shar is listed with ``make-datalist ++data_type=shard`` (index from its cuts).

IO only: the real loader (train mode, shuffle, no features: read + decode + resample to 16 kHz + batch of 16 +
pad) with 1 and 2 DataLoader workers, warm cache. Figure: utterances per wall second of each, and Shar / tar.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.common import OUT, real_corpus, sized

N_UTTS = sized(4000, 48)
PER_SHARD = sized(1000, 16)
WORKERS = sized((1, 2), (2,))


def _prepare() -> tuple[Path, Path]:
    from corpus_io.config import PackShardsConfig
    from corpus_io.shards.datalist import make_shard_list
    from corpus_io.shards.pack import pack_shards
    from corpus_io.tables.inputs import iter_records
    from corpus_io.tables.shar import write_shar

    os.environ.setdefault("CORPUS_IO_NO_PROGRESS", "1")
    corpus = real_corpus(N_UTTS)
    here = OUT / f"shar{N_UTTS}"
    tars, shar_dir, shar_list = here / "tars", here / "shar", here / "shar.list"
    if not (tars / "data.list").exists():
        pack_shards(PackShardsConfig(input=str(corpus), output_dir=str(tars), num_utts_per_shard=PER_SHARD,
                                     audio_format="keep"))
    if not shar_list.exists():
        write_shar(iter_records(str(corpus)), str(shar_dir), shard_size=PER_SHARD)
        make_shard_list([str(shar_dir)], str(shar_list))
    return tars / "data.list", shar_list


def _rate(data_list: Path, workers: int) -> float:
    """Utterances per wall second of one IO-only epoch (loader start-up included)."""
    from corpus_io.config import DatasetConf
    from corpus_io.loader.dataset import build_dataloader

    conf = DatasetConf(num_workers=workers, feats_type="raw", batch_size=16, prefetch=4)
    conf.filter_conf.max_length = 10**9
    conf.filter_conf.min_length = 0
    start = time.perf_counter()
    loader = build_dataloader(str(data_list), conf, None, train=True, rank=0, world_size=1)
    utts = sum(len(batch["keys"]) for batch in loader)
    if utts != N_UTTS:
        raise SystemExit(f"{data_list}: an epoch gave {utts} utterances, not {N_UTTS}")
    return utts / (time.perf_counter() - start)


def main() -> None:
    tars, shar = _prepare()
    _rate(tars, 1)  # warm the page cache for both
    _rate(shar, 1)
    print(f"loader IO only, {N_UTTS} utterances, warm cache (utterances per second):")
    for workers in WORKERS:
        tar_rate, shar_rate = _rate(tars, workers), _rate(shar, workers)
        print(f"  {workers} worker(s): tar shards {tar_rate:8.0f}   Lhotse Shar {shar_rate:8.0f}   "
              f"Shar / tar {shar_rate / tar_rate:.2f}", flush=True)


if __name__ == "__main__":
    main()
