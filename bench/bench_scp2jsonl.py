"""scp2jsonl: header probe vs a FunASR-style decode-and-resample baseline, and peak RSS at 1M lines.

Targets (issue 2): header probe >= 20x faster than the decode baseline on >= 20k real files;
peak RSS on a 1M-line wav.scp < 300 MB.
"""

from __future__ import annotations

import json
import os
import time

from bench.common import BIN, OUT, drop_cache, mb, real_corpus, run_measured, sized
from corpus_io.storage.progress import parallel_imap, resolve_num_workers

BIG = sized(1_000_000, 2000)  # lines of the big wav.scp (peak RSS)
STARTUPS = sized(5, 1)  # --help runs per command (the best counts)
# FunASR installs `scp2jsonl`; ours is `corpus-io scp2jsonl` (same arguments), so both can live in one venv
SCP2JSONL = [str(BIN / "corpus-io"), "scp2jsonl"]


def _decode_len(line: str) -> int:
    """What FunASR's scp2jsonl does per file: decode it all, resample to 16 kHz, count 10 ms frames."""
    import soundfile as sf
    import torch
    import torchaudio.functional as AF

    torch.set_num_threads(1)  # one thread per process, as the probe uses: a fair baseline
    _key, path = line.split(" ", 1)
    wave, rate = sf.read(path, dtype="float32")
    tensor = torch.from_numpy(wave)
    if rate != 16000:
        tensor = AF.resample(tensor, rate, 16000)
    return tensor.shape[0] // 160


def decode_baseline(wav_scp, workers: int) -> tuple[float, int]:
    lines = open(wav_scp).read().splitlines()
    start = time.perf_counter()
    total = sum(parallel_imap(_decode_len, lines, num_workers=workers, chunksize=64))
    return time.perf_counter() - start, total


def main() -> None:
    workers = resolve_num_workers(0)
    corpus = real_corpus(20000)
    wav_scp, text = corpus / "wav.scp", corpus / "text"
    files = [line.split(" ", 1)[1] for line in wav_scp.read_text().splitlines()]
    out = OUT / "scp2jsonl.jsonl"
    argv = [*SCP2JSONL, f"++scp_file_list=[{wav_scp},{text}]", "++data_type_list=[source,target]",
            f"++jsonl_file_out={out}", f"++num_workers={workers}"]

    results = {}
    for cache in sized(("cold", "warm"), ("cold",)):  # smoke: the warm run is the cold one's code
        if cache == "cold":
            drop_cache(files)
        probe_s, probe_rss, res = run_measured(argv)
        assert res.returncode == 0, res.stderr
        if cache == "cold":
            drop_cache(files)
        base_s, base_frames = decode_baseline(wav_scp, workers)
        probe_frames = sum(json.loads(line)["source_len"] for line in open(out))
        results[cache] = (probe_s, base_s, probe_rss)
        print(f"[{cache} cache] {len(files)} files, {workers} processes: header probe {probe_s:.1f} s "
              f"({len(files) / probe_s:.0f} files/s, peak RSS {mb(probe_rss)}); decode+resample baseline "
              f"{base_s:.1f} s ({len(files) / base_s:.0f} files/s); speed ratio {base_s / probe_s:.1f}x "
              f"(target >= 20x); total frames probe {probe_frames} vs decode {base_frames}")

    # BIG lines made by repeating real paths under new keys.
    big = OUT / f"wav{BIG}"
    big.mkdir(parents=True, exist_ok=True)
    if not (big / "wav.scp").exists():
        with open(big / "wav.scp.tmp", "w") as fw, open(big / "text", "w") as ft:
            for i in range(BIG):
                path = files[i % len(files)]
                fw.write(f"u{i:08d} {path}\n")
                ft.write(f"u{i:08d} one two three\n")
        os.rename(big / "wav.scp.tmp", big / "wav.scp")
    argv_big = [*SCP2JSONL, f"++scp_file_list=[{big}/wav.scp,{big}/text]",
                "++data_type_list=[source,target]", f"++jsonl_file_out={big}/out.jsonl", f"++num_workers={workers}"]
    wall, rss, res = run_measured(argv_big)
    assert res.returncode == 0, res.stderr
    print(f"[{BIG:,} lines] wav.scp + text, {workers} processes: {wall:.0f} s ({BIG / wall:.0f} lines/s), "
          f"peak RSS of the process tree {mb(rss)} (target < 300 MB)")
    os.unlink(big / "out.jsonl")
    # Startup: --help without torch.
    for cmd in (["corpus-io", "--help"], ["corpus-io", "scp2jsonl", "--help"]):
        best = min(run_measured([str(BIN / cmd[0]), *cmd[1:]])[0] for _ in range(STARTUPS))
        print(f"[startup] {' '.join(cmd)}: best of {STARTUPS} = {best:.3f} s (target < 0.5 s)")


if __name__ == "__main__":
    main()
