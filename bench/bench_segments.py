"""pack-shards on Kaldi segments: many short segments of one long recording vs the same audio as files.

Target (issue 11): packing ``NUM`` one-second segments cut from one ``HOURS``-hour recording costs
about what packing the same ``NUM`` seconds as ``NUM`` separate one-second files costs (ratio <= 2x):
each recording is read once per shard, not once per segment. Both runs re-encode (a segment is
always decoded and encoded), one worker, in one process side by side; the recording is real espeak
speech (the fixture's ``long.wav``, 8.2 s at 16 kHz) repeated to the length, cached in bench/out/.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from bench.common import OUT, sized

HOURS = sized(1.0, 0.02)
NUM = sized(300, 30)  # one-second segments, spread over the whole recording
ROUNDS = sized(2, 1)  # the fastest counts
FIXTURE_LONG = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "corpus" / "segments_dir" / "wav" / \
    "long.wav"


def _dirs() -> tuple[Path, Path]:
    root = OUT / "segments"
    seg_dir, file_dir = root / "segments", root / "files"
    if (seg_dir / "segments").exists() and (file_dir / "wav.scp").exists():
        return seg_dir, file_dir
    shutil.rmtree(root, ignore_errors=True)
    for d in (seg_dir, file_dir / "wav"):
        d.mkdir(parents=True)
    speech, rate = sf.read(str(FIXTURE_LONG), dtype="int16")
    total = int(HOURS * 3600 * rate)
    recording = np.resize(speech, total)  # real speech, repeated
    sf.write(str(seg_dir / "long.wav"), recording, rate, subtype="PCM_16")
    starts = np.linspace(0, HOURS * 3600 - 1.0, NUM)
    keys = [f"long-{i:04d}" for i in range(NUM)]
    (seg_dir / "wav.scp").write_text(f"long {seg_dir / 'long.wav'}\n")
    (seg_dir / "segments").write_text("".join(f"{k} long {s:.3f} {s + 1.0:.3f}\n" for k, s in zip(keys, starts)))
    (seg_dir / "text").write_text("".join(f"{k} hello world\n" for k in keys))
    for k, s in zip(keys, starts):
        first = int(round(s * rate))
        sf.write(str(file_dir / "wav" / f"{k}.wav"), recording[first:first + rate], rate, subtype="PCM_16")
    (file_dir / "wav.scp").write_text("".join(f"{k} {file_dir / 'wav' / f'{k}.wav'}\n" for k in keys))
    (file_dir / "text").write_text("".join(f"{k} hello world\n" for k in keys))
    return seg_dir, file_dir


def _pack(kaldi_dir: Path) -> float:
    from corpus_io.config import PackShardsConfig
    from corpus_io.shards.pack import pack_shards

    out = OUT / "segments" / f"out-{kaldi_dir.name}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    pack_shards(PackShardsConfig(input=str(kaldi_dir), output_dir=str(out), num_workers=1, audio_format="wav",
                                 num_utts_per_shard=1000))
    seconds = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def main() -> None:
    seg_dir, file_dir = _dirs()
    files = min(_pack(file_dir) for _ in range(ROUNDS))
    segs = min(_pack(seg_dir) for _ in range(ROUNDS))
    print(f"[bench_segments] {NUM} x 1 s: as segments of one {HOURS:g} h recording {segs:.2f} s, as {NUM} files "
          f"{files:.2f} s -> segments/files = {segs / files:.2f}x (target <= 2x)", flush=True)


if __name__ == "__main__":
    main()
