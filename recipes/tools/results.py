"""Recipe result helpers: audio hours of a JSONL, the CER table of an exp dir, the CER check.

    python recipes/tools/results.py hours DATA.jsonl
    python recipes/tools/results.py table EXP TRAIN.jsonl TEST_SET...
    python recipes/tools/results.py check CER_TXT TARGET
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def audio_seconds(jsonl: str) -> float:
    frames = 0
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                frames += int(json.loads(line).get("source_len", 0))
    return frames / 100.0


def read_rate(cer_txt: Path, what: str) -> float | None:
    if not cer_txt.is_file():
        return None
    m = re.search(rf"^%{what} ([0-9.]+|inf)", cer_txt.read_text(encoding="utf-8"), re.M)
    return float(m.group(1)) if m else None


def train_figures(exp: Path) -> tuple[str, str, str]:
    """(training wall time, epochs, audio-seconds trained per wall second) from train.log and the stage timer."""
    timer = exp / "train_seconds"
    seconds = float(timer.read_text()) if timer.is_file() else 0.0
    audio_h, epochs = 0.0, 0
    log = exp / "train.log"
    if log.is_file():
        for m in re.finditer(r"epoch \d+ done.*? ([0-9.]+) h audio in", log.read_text(encoding="utf-8")):
            audio_h += float(m.group(1))
            epochs += 1
    rate = f"{audio_h * 3600 / seconds:.0f}" if seconds and audio_h else "?"
    return f"{seconds / 60:.1f} min" if seconds else "?", str(epochs or "?"), rate


def read_rtf(cer_txt: Path) -> tuple[float, float, float] | None:
    """(RTF, model RTF, search RTF) from a decode report."""
    if not cer_txt.is_file():
        return None
    m = re.search(r"^RTF ([0-9.]+) .*model ([0-9.]+), search ([0-9.]+)\)", cer_txt.read_text(encoding="utf-8"), re.M)
    return (float(m.group(1)), float(m.group(2)), float(m.group(3))) if m else None


def table(exp: str, train_jsonl: str, *sets: str) -> str:
    """The CER table: one row per test set (greedy, EXP/decode_<set>), then one row per other decoding
    method found (EXP/decode_<set>.<method>), with the RTF of the model and of the search."""
    expdir = Path(exp)
    train_audio = audio_seconds(train_jsonl) if Path(train_jsonl).is_file() else 0.0
    minutes, epochs, rate = train_figures(expdir)
    lines = [f"training: {train_audio / 3600:.2f} h of audio, {epochs} epochs, {minutes}, {rate} audio-seconds/s",
             "", "| test set | %CER | %WER | training time | audio-seconds/s |", "|---|---|---|---|---|"]
    fmt = lambda v: "?" if v is None else f"{v:.2f}"  # noqa: E731
    for name in sets:
        cer_txt = expdir / f"decode_{name}" / "cer.txt"
        cer, wer = read_rate(cer_txt, "CER"), read_rate(cer_txt, "WER")
        lines.append(f"| {name} | {fmt(cer)} | {fmt(wer)} | {minutes} | {rate} |")
    rows = []
    for name in sets:
        order = ["greedy", "ctc_prefix_beam", "ctc_beam_lm", "attention_rescoring"]
        others = sorted(expdir.glob(f"decode_{name}.*"),
                        key=lambda p: (order.index(p.suffix[1:]) if p.suffix[1:] in order else len(order), p.name))
        for out in [expdir / f"decode_{name}", *others]:
            method = out.name.split(".", 1)[1] if "." in out.name else "greedy"
            cer_txt = out / "cer.txt"
            rtf = read_rtf(cer_txt) or (None, None, None)
            rtfs = " | ".join("?" if v is None else f"{v:.4f}" for v in rtf)
            rows.append(f"| {name} | {method} | {fmt(read_rate(cer_txt, 'CER'))} | {fmt(read_rate(cer_txt, 'WER'))} "
                        f"| {rtfs} |")
    lines += ["", "| test set | decoding | %CER | %WER | RTF | RTF model | RTF search |",
              "|---|---|---|---|---|---|---|", *rows]
    return "\n".join(lines) + "\n"


def check(cer_txt: str, target: str) -> int:
    limit = float(target)
    if limit <= 0:
        return 0
    cer = read_rate(Path(cer_txt), "CER")
    if cer is None:
        print(f"no %CER line in {cer_txt}", file=sys.stderr)
        return 1
    if cer > limit:
        print(f"FAILED: %CER {cer:.2f} in {cer_txt} is above the target {limit:g}", file=sys.stderr)
        return 1
    print(f"OK: %CER {cer:.2f} <= {limit:g} ({cer_txt})", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    what, *args = argv
    if what == "hours":
        print(f"{audio_seconds(args[0]) / 3600:.3f}")
    elif what == "table":
        print(table(*args), end="")
    elif what == "check":
        return check(*args)
    else:
        raise SystemExit(__doc__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
