"""Streaming (issue 45): one streaming checkpoint's WER at full context and chunk 16/8/4 next to a non-streaming
model trained the same way, and per-chunk latency and RTF on one CPU thread: corpus-io's cached decode
(``corpus-io transcribe``'s StreamingTranscriber: features, model, greedy search) against sherpa-onnx's online
recognizer on the streaming export, both fed 0.1 s pieces.

The models are the espeak demo's (``recipes/espeak/run.sh``, stages 0-6, with and without ``--streaming true``;
both on the defaults' features, sherpa-onnx's), each the average of its 3 best epochs that training writes
(``model.pt.avg3``; the bench decodes it itself, so stage 7's decodes of every test set are not run), trained once into
BENCH_OUT/stream (about 15 minutes on 2 cores) and reused. Smoke mode: a tiny corpus, one epoch, one model standing
for both, test_digits and chunk 16 only, every data command one process (``--nj 1``: no job split and merge).
WER on test_digits (the demo's held-out test set) and test_mixed; latency on test_digits (sizes below).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import BIN, OUT, SMOKE, sized

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "espeak" / "run.sh"
CHUNKS = sized((16, 8, 4), (16,))
LEFT_CHUNKS = 4  # sherpa-onnx's default (OnlineRecognizer.from_wenet_ctc)
LATENCY_UTTERANCES = sized(40, 4)
SETS = sized(("test_digits", "test_mixed"), ("test_digits",))
SMOKE_OPTS = ["--num_digits_train", "48", "--num_digits_dev", "4", "--num_digits_test", "4",
              "--num_digits_test_newvoice", "2", "--num_mixed_train", "4", "--num_mixed_test", "2",
              "--num_utts_per_shard", "16", "--max_epoch", "1", "--average_num", "1", "--nproc", "1",
              "--cer_target", "0", "--nj", "1"]


def _env() -> dict:
    return dict(os.environ, CORPUS_IO_NO_PROGRESS="1", PATH=f"{BIN}:{os.environ.get('PATH', '')}")


def train(root: Path, streaming: bool) -> Path:
    """The demo recipe's stages 0-6 into ``root`` (the data is made once and shared): the average of the 3 best epochs
    training writes (smoke: the one-epoch model.pt). Returns the checkpoint the bench decodes."""
    exp = root / ("exp_streaming" if streaming else "exp_full")
    model = exp / "model.pt" if SMOKE else exp / "model.pt.avg3"
    if model.exists():
        return model
    stage = "6" if (root / "data" / "test_mixed" / "raw.list").exists() else "0"
    cmd = [str(RECIPE), "--stage", stage, "--stop_stage", "6", "--data", str(root / "data"), "--exp", str(exp),
           "--streaming", str(streaming).lower(), *(SMOKE_OPTS if SMOKE else [])]
    print(f"training the {'streaming' if streaming else 'non-streaming'} demo model: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, env=_env(), stdout=subprocess.DEVNULL)
    return model


def wer(checkpoint: Path, data: Path, out: Path, chunk: int = 0) -> str:
    """``%WER`` of ``corpus-io decode`` (greedy) on ``data``'s raw list; ``chunk`` > 0: chunk by chunk."""
    args = [f"++decoding_chunk_size={chunk}", f"++num_decoding_left_chunks={LEFT_CHUNKS}"] if chunk else []
    subprocess.run([str(BIN / "corpus-io"), "decode", f"++data_list={data / 'raw.list'}", f"++checkpoint={checkpoint}",
                    f"++output_dir={out}", "++dataset_conf.data_type=raw", "++dataset_conf.num_workers=0", *args],
                   check=True, env=dict(_env(), OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL)
    return re.search(r"^%WER ([0-9.]+)", (out / "cer.txt").read_text(encoding="utf-8"), re.M).group(1)


def latency(checkpoint: Path, rows: list[dict], chunk: int, tmp: Path) -> tuple[dict, dict]:
    """Per-chunk seconds and RTF of corpus-io's transcriber and of sherpa-onnx's online recognizer, one thread,
    audio fed in 0.1 s pieces (sherpa with its default arguments but feature_dim), and how many utterances the two
    give the same words."""
    import soundfile as sf
    import torch

    from corpus_io.infer import sherpa
    from corpus_io.infer.transcribe import StreamingTranscriber

    torch.set_num_threads(1)
    ours = StreamingTranscriber(str(checkpoint), decoding_chunk_size=chunk, num_decoding_left_chunks=LEFT_CHUNKS)
    steps, compute, audio, texts = [], 0.0, 0.0, {}
    for row in rows:
        samples, rate = sf.read(row["wav"], dtype="float32")
        piece = int(0.1 * rate)
        for i in range(0, len(samples), piece):
            ours.accept_waveform(samples[i:i + piece], rate)
        result = ours.finish()
        texts[row["key"]] = result.text
        steps += result.chunk_latency
        compute, audio = compute + result.compute_seconds, audio + result.audio_seconds
    model = tmp / f"online{chunk}" / "model.onnx"
    subprocess.run([str(BIN / "corpus-io"), "export-model", f"++checkpoint={checkpoint}", f"++output={model}",
                    "++streaming=true"], check=True, env=_env(), stdout=subprocess.DEVNULL)
    rec = sherpa.recognizer(str(model), str(model.parent / "tokens.txt"), online=True,
                            feature_dim=ours.model.input_dim, chunk_size=chunk, num_left_chunks=LEFT_CHUNKS)
    run = sherpa.decode_wavs(rec, [(r["key"], r["wav"]) for r in rows], online=True)
    chunk_ms = chunk * 40
    theirs_chunks = run.chunk_seconds
    same, total, _ = sherpa.agreement(texts, run.texts)
    return ({"ms": 1000 * statistics.median(steps) if steps else 0.0, "rtf": compute / audio, "chunk_ms": chunk_ms,
             "same": f"{same}/{total}"},
            {"ms": 1000 * statistics.median(theirs_chunks) if theirs_chunks else 0.0, "rtf": run.rtf,
             "chunk_ms": chunk_ms})


def main() -> None:
    root = OUT / "stream"
    streaming = train(root, True)
    # smoke: the one tiny model stands for both (the run proves the bench runs, its figures measure nothing)
    full = streaming if SMOKE else train(root, False)
    data = root / "data"
    print(f"\nWER (%), greedy CTC, {LEFT_CHUNKS} left chunks when chunked; one streaming checkpoint "
          f"({streaming}) next to a non-streaming one trained the same way ({full}):")
    print("| set | non-streaming, full | streaming, full | " + " | ".join(f"chunk {c}" for c in CHUNKS) + " |")
    print("|---|---|---|" + "---|" * len(CHUNKS))
    for name in SETS:
        streaming_wer = wer(streaming, data / name, root / "dec" / f"streaming_{name}")
        full_wer = streaming_wer if full == streaming else wer(full, data / name, root / "dec" / f"full_{name}")
        chunked = [wer(streaming, data / name, root / "dec" / f"chunk{c}_{name}", c) for c in CHUNKS]
        row = [full_wer, streaming_wer, *chunked]
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)
    rows = [json.loads(line) for line in (data / "test_digits" / "raw.list").read_text().splitlines()]
    rows = rows[:LATENCY_UTTERANCES]
    print(f"\nlatency per chunk (median compute ms; lower is better) and RTF, 1 CPU thread, {len(rows)} test_digits "
          f"utterances fed in 0.1 s pieces:")
    print("| chunk | corpus-io transcribe ms | sherpa-onnx online ms | corpus-io RTF | sherpa-onnx RTF | same words |")
    print("|---|---|---|---|---|---|")
    for chunk in CHUNKS:
        ours, theirs = latency(streaming, rows, chunk, root / "export")
        print(f"| {chunk} ({ours['chunk_ms']} ms) | {ours['ms']:.1f} | {theirs['ms']:.1f} | {ours['rtf']:.4f} | "
              f"{theirs['rtf']:.4f} | {ours['same']} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
