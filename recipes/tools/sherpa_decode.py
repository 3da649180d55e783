#!/usr/bin/env python3
"""Decode a list's utterances with sherpa-onnx (offline or online) from an export-model file, as a deployer
would, and compare with corpus-io decode's hypotheses of the same set.

    sherpa_decode.py MODEL TOKENS LIST OUT_DIR --feature-dim 40 [--online --chunk-size 16 --left-chunks 4]
                     [--compare DECODE_DIR/text]

LIST: any input corpus-io reads (a raw list or JSONL with FunASR source/target or WeNet wav/txt fields, a Kaldi
data dir with wav.scp and text). Writes OUT_DIR/text (Kaldi text: key hypothesis) and OUT_DIR/summary.txt: %WER
against the list's transcripts, the share of utterances whose words equal --compare's, and the real-time factor
(one thread). Before anything is decoded or written: the arguments are checked against the export's metadata
(feature dimension, streaming or not, chunk sizes), --compare is read, and an output that is one of the inputs
(the list, --compare, the model, the token list) or a file this tool did not write (a decode dir's text) is
refused. A user error is one paragraph on stderr and exit 2; success exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: the name this tool's outputs are recorded under (corpus_io.storage.files.record_written)
WRITER = "sherpa_decode.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("tokens")
    parser.add_argument("raw_list", metavar="list")
    parser.add_argument("out_dir")
    parser.add_argument("--feature-dim", type=int, required=True)
    parser.add_argument("--online", action="store_true")
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument("--left-chunks", type=int, default=4)
    parser.add_argument("--compare", help="a Kaldi text of corpus-io decode to compare words with")
    args = parser.parse_args()

    from cli._app import run_with_errors

    run_with_errors(lambda: decode(args))
    return 0


def read_compare(path: str) -> dict[str, str]:
    """``key -> text`` of a Kaldi text (corpus-io decode's ``text``), read whole before anything is written."""
    from corpus_io.errors import DataError
    from corpus_io.storage.files import iter_raw_lines

    if not Path(path).is_file():
        raise DataError(f"--compare {path} does not exist or is not a file; give the text corpus-io decode wrote "
                        f"for the same list (e.g. exp/decode_test/text), or leave --compare out.")
    texts = {}
    for lineno, raw in iter_raw_lines(path, what="--compare file"):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise DataError(f"--compare {path}:{lineno}: invalid UTF-8 (byte {exc.start}); give corpus-io "
                            f"decode's text (key hypothesis lines).") from None
        if line:
            key, _, text = line.partition(" ")
            texts[key] = text.strip()
    return texts


def decode(args: argparse.Namespace) -> None:
    from corpus_io.decoding.scoring import edit_counts, normalize, word_units
    from corpus_io.infer import sherpa
    from corpus_io.storage.files import (
        atomic_write,
        ensure_dir,
        refuse_non_directory,
        refuse_overwriting_inputs,
        refuse_replacing_others,
    )
    from corpus_io.tables.inputs import resolve_input

    out = Path(args.out_dir)
    outputs = [("OUT_DIR/text", out / "text"), ("OUT_DIR/summary.txt", out / "summary.txt")]
    listed = resolve_input(args.raw_list) if Path(args.raw_list).exists() else None
    inputs = [("MODEL", args.model), ("TOKENS", args.tokens), ("LIST", args.raw_list), ("--compare", args.compare),
              *(("LIST", f) for f in (listed.files if listed is not None else ()))]
    refuse_overwriting_inputs(outputs, inputs)
    refuse_non_directory(out, what="OUT_DIR")
    refuse_replacing_others(outputs, WRITER, way_out="Give OUT_DIR a directory of its own (e.g. "
                                                     "exp/serve/decode_test.offline).")
    compare = read_compare(args.compare) if args.compare else None  # read before anything is written
    rows = sherpa.utterances(args.raw_list)
    rec = sherpa.recognizer(args.model, args.tokens, online=args.online, feature_dim=args.feature_dim,
                            chunk_size=args.chunk_size, num_left_chunks=args.left_chunks)
    run = sherpa.decode_wavs(rec, rows, online=args.online)
    errors = words = 0
    for r in rows:
        counts = edit_counts(word_units(normalize(r.text)), word_units(normalize(run.texts[r.key])))
        errors, words = errors + counts.errors, words + counts.ref
    mode = f"online (chunk {args.chunk_size}, {args.left_chunks} left chunks)" if args.online else "offline"
    lines = [f"sherpa-onnx {mode}: {len(rows)} utterances, %WER {100.0 * errors / max(words, 1):.2f} "
             f"[ {errors} / {words} ], RTF {run.rtf:.4f} (1 thread)"]
    if compare is not None:
        same, total, differ = sherpa.agreement(compare, run.texts)
        lines.append(f"same words as corpus-io decode ({args.compare}): {same} of {total} "
                     f"({100.0 * same / max(total, 1):.1f} %)"
                     + (f"; differ: {' '.join(differ[:10])}" if differ else ""))
    ensure_dir(out, what="OUT_DIR")
    with atomic_write(out / "text", owner=WRITER) as f:
        f.write("".join(f"{k} {t}\n" for k, t in run.texts.items()))
    with atomic_write(out / "summary.txt", owner=WRITER) as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
