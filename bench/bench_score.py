"""`corpus-io score` throughput (issue 54): audio seconds scored per wall second, the command whole (model load
included), with the loader inline (1 process: ``dataset_conf.num_workers=0``) and with one loader worker reading
and computing features beside the model (2 processes: ``num_workers=1``); one torch thread each
(``OMP_NUM_THREADS=1``), and the peak RSS of the process tree.

The model and data are the espeak demo's, as bench_stream trains them (``BENCH_OUT/stream``, reused): its
non-streaming model (smoke: the one-epoch streaming one) scores the first utterances of its training set.
:func:`score_throughput` is the one measurement; the clean bench (segment and score) calls it too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.common import BIN, OUT, SMOKE, mb, run_measured, sized

UTTERANCES = sized(400, 12)
PROCESSES = (1, 2)


def score_throughput(checkpoint: Path, data_list: Path, out: Path, *, processes: int,
                     data_type: str = "raw") -> dict:
    """One ``corpus-io score`` run of ``data_list`` with ``checkpoint`` into ``out``, timed: ``processes`` 1 runs
    the loader in the scoring process, 2 gives it one worker process. Returns audio seconds, wall seconds, audio
    seconds per second, peak RSS (bytes), utterances and flagged."""
    argv = [str(BIN / "corpus-io"), "score", f"++data_list={data_list}", f"++checkpoint={checkpoint}",
            f"++output_dir={out}", f"++dataset_conf.data_type={data_type}",
            f"++dataset_conf.num_workers={processes - 1}", "++device=cpu"]
    wall, peak, result = run_measured(argv)
    if result.returncode != 0:
        raise SystemExit(f"corpus-io score failed: {result.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text(encoding="utf-8").splitlines()]
    audio = sum(r.get("duration") or 0.0 for r in rows)
    return {"audio_s": audio, "wall_s": wall, "audio_s_per_s": audio / wall, "rss": peak, "utterances": len(rows),
            "flagged": sum(bool(r["flagged"]) for r in rows)}


def main() -> None:
    from bench.bench_stream import train

    os.environ["OMP_NUM_THREADS"] = "1"  # the children's torch threads: one per process
    root = OUT / "stream"
    checkpoint = train(root, streaming=SMOKE)  # smoke: the one tiny model bench_stream trains
    rows = (root / "data" / "train" / "data.jsonl").read_text(encoding="utf-8").splitlines()[:UTTERANCES]
    work = OUT / "score"
    work.mkdir(parents=True, exist_ok=True)
    data_list = work / "list.jsonl"
    data_list.write_text("".join(line + "\n" for line in rows), encoding="utf-8")
    print(f"\ncorpus-io score: {len(rows)} training utterances of the espeak demo, {checkpoint.name} "
          f"(OMP_NUM_THREADS=1 per process; wall of the whole command, model load included):")
    print("| processes | audio s | wall s | audio s / s | peak RSS | flagged |")
    print("|---|---|---|---|---|---|")
    for processes in PROCESSES:
        got = score_throughput(checkpoint, data_list, work / f"out{processes}", processes=processes)
        print(f"| {processes} | {got['audio_s']:.0f} | {got['wall_s']:.1f} | {got['audio_s_per_s']:.1f} | "
              f"{mb(got['rss'])} | {got['flagged']} of {got['utterances']} |", flush=True)


if __name__ == "__main__":
    main()
