#!/usr/bin/env python3
"""Decode a raw list's wavs with sherpa-onnx (offline or online) from an export-model file, as a deployer
would, and compare with corpus-io decode's hypotheses of the same set.

    sherpa_decode.py MODEL TOKENS RAW_LIST OUT_DIR --feature-dim 40 [--online --chunk-size 16 --left-chunks 4]
                     [--compare DECODE_DIR/text]

Writes OUT_DIR/text (Kaldi text: key hypothesis) and OUT_DIR/summary.txt: %WER against the list's transcripts,
the share of utterances whose words equal --compare's, and the real-time factor (one thread). Exit 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("tokens")
    parser.add_argument("raw_list")
    parser.add_argument("out_dir")
    parser.add_argument("--feature-dim", type=int, required=True)
    parser.add_argument("--online", action="store_true")
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument("--left-chunks", type=int, default=4)
    parser.add_argument("--compare", help="a Kaldi text of corpus-io decode to compare words with")
    args = parser.parse_args()

    from corpus_io.decoding.scoring import edit_counts, normalize, word_units
    from corpus_io.infer import sherpa
    from corpus_io.storage.files import atomic_write

    rows = [json.loads(line) for line in Path(args.raw_list).read_text(encoding="utf-8").splitlines() if line.strip()]
    rec = sherpa.recognizer(args.model, args.tokens, online=args.online, feature_dim=args.feature_dim,
                            chunk_size=args.chunk_size, num_left_chunks=args.left_chunks)
    run = sherpa.decode_wavs(rec, [(r["key"], r["wav"]) for r in rows], online=args.online)
    errors = words = 0
    for r in rows:
        counts = edit_counts(word_units(normalize(r["txt"])), word_units(normalize(run.texts[r["key"]])))
        errors, words = errors + counts.errors, words + counts.ref
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "text") as f:
        f.write("".join(f"{k} {t}\n" for k, t in run.texts.items()))
    mode = f"online (chunk {args.chunk_size}, {args.left_chunks} left chunks)" if args.online else "offline"
    lines = [f"sherpa-onnx {mode}: {len(rows)} utterances, %WER {100.0 * errors / max(words, 1):.2f} "
             f"[ {errors} / {words} ], RTF {run.rtf:.4f} (1 thread)"]
    if args.compare:
        ours = dict(line.split(" ", 1) if " " in line else (line, "")
                    for line in Path(args.compare).read_text(encoding="utf-8").splitlines() if line.strip())
        same, total, differ = sherpa.agreement(ours, run.texts)
        lines.append(f"same words as corpus-io decode ({args.compare}): {same} of {total} "
                     f"({100.0 * same / max(total, 1):.1f} %)"
                     + (f"; differ: {' '.join(differ[:10])}" if differ else ""))
    with atomic_write(out / "summary.txt") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
