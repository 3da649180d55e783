"""Tiny real corpora for the loader tests: shards (WeNet/corpus-io tar layout) and raw lists,
built from the committed fixture corpus (24 real utterances, 8/16/44.1 kHz, wav and flac)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import soundfile as sf

from corpus_io.config import DatasetConf, TokenizerConf

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "corpus"


def fixture_utts(copies: int = 1) -> list[tuple[str, str, str]]:
    """``(key, audio path, text)``; ``copies`` > 1 repeats the corpus under new keys ``c{i}-<key>``."""
    wavs = dict(line.split(" ", 1) for line in (FIXTURE / "wav.scp").read_text().splitlines() if line.strip())
    texts = dict(line.split(" ", 1) for line in (FIXTURE / "text").read_text(encoding="utf-8").splitlines()
                 if line.strip())
    base = [(k, str(REPO / wavs[k]), texts[k]) for k in sorted(wavs)]
    if copies == 1:
        return base
    return [(f"c{c}-{k}", p, t) for c in range(copies) for k, p, t in base]


def make_shards(out: Path, *, copies: int = 1, per_shard: int = 4, index: bool = True,
                utts: list | None = None, sizes: list[int] | None = None) -> tuple[Path, list[str]]:
    """Shards ``out/shard-NNNNNN.tar`` (+ data.list, index.jsonl); returns (data.list, keys).

    ``sizes``: utterances per shard, one number per shard (uneven shards), instead of ``per_shard``.
    """
    out.mkdir(parents=True, exist_ok=True)
    utts = utts if utts is not None else fixture_utts(copies)
    if sizes is None:
        sizes = [per_shard] * ((len(utts) + per_shard - 1) // per_shard)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    lines, entries = [], []
    for i, (s, size) in enumerate(zip(starts, sizes)):
        path = out / f"shard-{i:06d}.tar"
        dur = 0.0
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, audio, text in utts[s:s + size]:
                ext = Path(audio).suffix[1:]
                dur += sf.info(audio).duration
                for suffix, data in (("txt", text.encode()), (ext, Path(audio).read_bytes()),
                                     ("json", json.dumps({"key": key}).encode())):
                    info = tarfile.TarInfo(f"{key}.{suffix}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        lines.append(str(path))
        entries.append({"path": str(path), "num_utts": len(utts[s:s + size]), "duration": round(dur, 3)})
    (out / "data.list").write_text("".join(x + "\n" for x in lines))
    if index:
        (out / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    return out / "data.list", [k for k, _, _ in utts[:sum(sizes)]]


def make_raw(out: Path, *, copies: int = 1, wenet: bool = True) -> tuple[Path, list[str]]:
    """A raw JSONL list (WeNet key/wav/txt or FunASR key/source/target); returns (list, keys)."""
    out.mkdir(parents=True, exist_ok=True)
    utts = fixture_utts(copies)
    path = out / "raw.list"
    with open(path, "w", encoding="utf-8") as f:
        for key, audio, text in utts:
            rec = {"key": key, "wav": audio, "txt": text} if wenet else {"key": key, "source": audio, "target": text}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path, [k for k, _, _ in utts]


def token_list(out: Path) -> TokenizerConf:
    """A char token list covering the fixture texts."""
    from corpus_io.tokenizer import char_split

    split = char_split("word")
    tokens = sorted({t for _, _, text in fixture_utts() for t in split(text)})
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokens.txt"
    symbols = ["<blank>", "<unk>", *tokens, "<sos/eos>"]
    path.write_text("".join(f"{s} {i}\n" for i, s in enumerate(symbols)), encoding="utf-8")
    return TokenizerConf(type="char", token_list=str(path))


def small_conf(**overrides) -> DatasetConf:
    """A fast DatasetConf: small buffers, batch of 4, 2 workers, no augmentation; the sort buffer of 4 instead of the
    default buckets (tests/loader/test_shapes.py and the resume contract's bucketing configs take the defaults)."""
    conf = DatasetConf()
    conf.shuffle_conf.shuffle_size = 8
    conf.bucketing = False
    conf.sort_conf.sort_size = 4
    conf.batch_size = 4
    conf.num_workers = 2
    conf.prefetch = 2
    conf.filter_conf.token_min_length = 0
    for key, value in overrides.items():
        setattr(conf, key, value)
    return conf


def epoch_keys(loader, epoch: int | None = None) -> list[str]:
    """Every key a loader yields, in order; ``epoch``: set it first (None: the loader's own, e.g. a resumed one's)."""
    if epoch is not None:
        loader.set_epoch(epoch)
    return [k for batch in loader for k in batch["keys"]]


def read_then_checkpoint(loader, epoch: int, batches: int) -> tuple[list[str], dict]:
    """Read the first ``batches`` batches of ``epoch`` and stop there: (their keys, the loader's state after them,
    through the JSON round trip a checkpoint file makes)."""
    loader.set_epoch(epoch)
    keys: list[str] = []
    read = 0
    for batch in loader:
        keys += batch["keys"]
        read += 1
        if read == batches:
            return keys, json.loads(json.dumps(loader.state_dict()))
    raise AssertionError(f"epoch {epoch} ended after {read} batches, before the checkpoint after batch {batches}")


def interrupted_epoch(make_loader, epoch: int, batches: int) -> tuple[list[str], list[str], Any]:
    """``epoch`` read by a loader from ``make_loader()`` up to a checkpoint after ``batches`` batches, and the rest by
    a fresh one that loads it: (the keys before, the keys after, the resumed loader, for its counts)."""
    first, state = read_then_checkpoint(make_loader(), epoch, batches)
    resumed = make_loader()
    resumed.load_state_dict(state)
    return first, epoch_keys(resumed), resumed


def env_no_threads() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def make_shar(out: Path, *, utts: list | None = None, windows: int = 16, shard_size: int = 8,
              fmt: str = "flac") -> tuple[Path, dict[str, str]]:
    """A Lhotse Shar written by Lhotse itself (``CutSet.to_shar``, audio ``fmt``: flac, wav or original) from the
    fixture recordings: one cut per recording, then ``windows`` cuts that are windows of them (id ``w<i>-<key>``,
    0.2 s in, 1 s long, the recording's text); returns (the Shar directory, key -> text)."""
    from lhotse import CutSet, Recording, SupervisionSegment

    utts = utts if utts is not None else fixture_utts()
    cuts, texts = [], {}
    for key, path, text in utts:
        rec = Recording.from_file(path, recording_id=key)
        cut = rec.to_cut()
        cut.supervisions = [SupervisionSegment(id=key, recording_id=key, start=0.0, duration=rec.duration, text=text,
                                               speaker=key.split("-")[0], language="zh" if "spk0" in key else "en")]
        cut.custom = {"corpus": "fixture"}
        cuts.append(cut)
        texts[key] = text
    for i in range(windows):
        base = cuts[i % len(cuts)]
        window = base.truncate(offset=0.2, duration=1.0)
        window.id = f"w{i}-{base.id}"
        cuts.append(window)
        texts[window.id] = texts[base.id]
    out.mkdir(parents=True, exist_ok=True)
    CutSet.from_cuts(cuts).to_shar(str(out), fields={"recording": fmt}, shard_size=shard_size)
    return out, texts


def make_hf_parquet(out: Path, *, num_utts: int = 40, num_files: int = 2, row_group: int = 8,
                    split: str = "train", columns: dict | None = None) -> tuple[Path, dict[str, tuple[bytes, str]]]:
    """The fixture utterances (repeated under new keys up to ``num_utts``) written by Hugging Face ``datasets`` as
    its Hub layout ``out/data/<split>-0000i-of-0000n.parquet``: ``id``, ``audio`` (``Audio``: the files' bytes and
    names), ``text``, ``speaker_id``; ``columns`` renames them (e.g. ``{"text": "sentence"}``). Returns (the data
    dir, ``{key: (audio bytes, text)}``)."""
    import datasets

    utts = fixture_utts(-(-num_utts // 24))[:num_utts]
    rows = {"id": [k for k, _, _ in utts],
            "audio": [{"bytes": Path(p).read_bytes(), "path": Path(p).name} for _, p, _ in utts],
            "text": [t for _, _, t in utts], "speaker_id": [k.split("-utt")[0].split("-")[-1] for k, _, _ in utts]}
    # cast, not encoded: datasets encodes Audio values with torchcodec, and these are stored bytes already
    ds = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio())
    if columns:
        ds = ds.rename_columns(columns)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    for i in range(num_files):
        ds.shard(num_files, i, contiguous=True).to_parquet(
            str(data / f"{split}-{i:05d}-of-{num_files:05d}.parquet"), batch_size=row_group)
    return data, {k: (Path(p).read_bytes(), t) for k, p, t in utts}


def raw_with_a_repeated_key(out: Path) -> tuple[Path, str]:
    """A raw JSONL list of 4 fixture utterances whose first key is repeated on line 5 with another label (a second
    utterance, or a relabelling appended): ``(list, the repeated key)``."""
    out.mkdir(parents=True, exist_ok=True)
    utts = fixture_utts()[:4]
    lines = [{"key": k, "source": a, "target": t} for k, a, t in utts]
    lines.append({"key": utts[0][0], "source": utts[1][1], "target": utts[1][2]})
    path = out / "repeat.jsonl"
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    return path, utts[0][0]
