"""Training-style loading from a precomputed fbank field vs fbank computed from audio, side by side.

Data: the first ``N_UTTS`` (3000) utterances of ``bench.common.real_corpus(20000)`` (real espeak
speech, half 16 kHz wav, half 44.1 kHz flac, so the on-the-fly chain decodes, resamples and computes
fbank), packed into shards of 500 (``audio_format=keep``), then ``corpus-io add-field ++field=fbank``.

Both runs use the real loader (``build_dataloader``, train mode: list shuffle, shuffle buffer, sort
buffer, batch of 32, pad, char tokenizer) with ``num_workers=2`` on this machine's 2 cores; only
``feats_type`` differs: ``fbank`` (decode -> resample -> fbank) vs ``precomputed`` with
``fields=[fbank, txt]`` (the fbank companion + the meta companion; the main tar is not opened).
Figure: audio-seconds delivered per wall second, and the ratio. Target (issue 7): >= 3x.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.common import OUT, drop_cache, real_corpus, sized

N_UTTS = sized(3000, 48)
PER_SHARD = sized(500, 16)
NUM_WORKERS = 2
BATCH_SIZE = sized(32, 8)


def _prepare() -> Path:
    os.environ.setdefault("CORPUS_IO_NO_PROGRESS", "1")
    from corpus_io.config import AddFieldConfig, PackShardsConfig
    from corpus_io.shards.add_field import add_field
    from corpus_io.shards.pack import pack_shards

    corpus = real_corpus(20000)
    root = OUT / f"fields{N_UTTS}"
    root.mkdir(parents=True, exist_ok=True)
    jsonl = root / "train.jsonl"
    if not jsonl.exists():
        texts = dict(line.split(" ", 1) for line in (corpus / "text").read_text().splitlines())
        with open(jsonl, "w") as f:
            for line in (corpus / "wav.scp").read_text().splitlines()[:N_UTTS]:
                key, path = line.split(" ", 1)
                f.write(json.dumps({"key": key, "source": path, "target": texts[key]}) + "\n")
    shards = root / "shards"
    t0 = time.perf_counter()
    pack_shards(PackShardsConfig(input=str(jsonl), output_dir=str(shards), num_utts_per_shard=PER_SHARD))
    t1 = time.perf_counter()
    add_field(AddFieldConfig(input=str(shards / "data.list"), field="fbank"))
    t2 = time.perf_counter()
    print(f"prepare: pack-shards {t1 - t0:.1f} s, add-field fbank {t2 - t1:.1f} s (both resume when cached)")
    return shards / "data.list"


def _tokenizer(root: Path, jsonl: Path):
    from corpus_io.config import TokenizerConf
    from corpus_io.tokenizer import build_tokenizer, char_split, write_token_list

    split = char_split("word")
    tokens = sorted({t for line in jsonl.read_text().splitlines() for t in split(json.loads(line)["target"])})
    write_token_list(root / "tokens.txt", tokens)
    return build_tokenizer(TokenizerConf(type="char", token_list=str(root / "tokens.txt")))


def _load(data_list: Path, tokenizer, **conf_kw) -> tuple[float, float, int]:
    """(wall seconds, audio seconds, batches) of one training epoch."""
    from corpus_io.config import DatasetConf
    from corpus_io.loader.dataset import build_dataloader

    conf = DatasetConf(num_workers=NUM_WORKERS, batch_size=BATCH_SIZE, **conf_kw)
    drop_cache(p for p in data_list.parent.iterdir() if p.is_file())
    loader = build_dataloader(str(data_list), conf, tokenizer, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    start = time.perf_counter()
    audio = 0.0
    batches = 0
    for batch in loader:
        audio += batch["audio_seconds"]
        batches += 1
    return time.perf_counter() - start, audio, batches


def main() -> None:
    data_list = _prepare()
    tok = _tokenizer(data_list.parent.parent, data_list.parent.parent / "train.jsonl")
    rows = []
    for name, kw in (("on-the-fly fbank (decode+resample+fbank)", {"feats_type": "fbank"}),
                     ("precomputed fbank field", {"feats_type": "precomputed", "fields": ["fbank", "txt"]})):
        wall, audio, batches = _load(data_list, tok, **kw)
        rows.append((name, wall, audio, batches))
        print(f"{name:<44} {batches:>4} batches  {audio / 3600:6.3f} h  {wall:7.2f} s  "
              f"{audio / wall:9.1f} audio-s/s", flush=True)
    (_, w0, a0, _), (_, w1, a1, _) = rows
    ratio = (a1 / w1) / (a0 / w0)
    print(f"\n{N_UTTS} utterances, num_workers={NUM_WORKERS}, batch_size={BATCH_SIZE}, train mode (shuffle + sort "
          f"+ pad): precomputed field is {ratio:.2f}x faster than on-the-fly fbank (target >= 3x: "
          f"{'met' if ratio >= 3 else 'NOT met'})")


if __name__ == "__main__":
    main()
