"""``corpus-io tune-lm``: grid search of ``decoding.lm_weight`` x ``decoding.word_score`` x ``decoding.unk_score``
for ``ctc_beam_lm`` on a dev list. The model runs once (its outputs are kept); each grid point is a search and a
score. Writes ``tune.txt`` (every point's CER/WER) and ``best.txt`` (the overrides to decode with).

``unk_scores`` left null tries [-2, 0, 2] (a penalty, none, a bonus for units outside the LM's vocabulary), or
only 0 with ``decoding.lexicon=true`` (no unit is unknown); given with the lexicon, a non-zero one is refused."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

DEFAULT_UNK_SCORES = (-2.0, 0.0, 2.0)


def tune_lm(cfg: Any) -> dict:
    from corpus_io.config import require
    from corpus_io.decoding.search import Search, check_options
    from corpus_io.infer.decode import (
        decode_dataset_conf,
        decode_device,
        forward_batches,
        load_model,
        run_search,
        score,
        skipped_summary,
    )
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.model.cmvn import loader_inputs
    from corpus_io.storage.files import atomic_write, ensure_dir, refuse_overwriting_inputs, refuse_remote_output

    require(cfg, "data_list", "checkpoint", "output_dir", "lm")
    # before the model is loaded or the dev list read: the grid search takes minutes, its outputs are local
    refuse_remote_output(cfg.output_dir, "++output_dir", "tune-lm")
    out = Path(cfg.output_dir)
    refuse_overwriting_inputs([(f"++output_dir's {name}", out / name) for name in ("tune.txt", "best.txt")],
                              [*loader_inputs(cfg.data_list, cfg.dataset_conf), ("++checkpoint", cfg.checkpoint),
                               ("++lm", cfg.lm)])
    base = copy.deepcopy(cfg.decoding)
    base.method, base.lm = "ctc_beam_lm", cfg.lm
    check_options(base)
    unk_scores = unk_grid(cfg.unk_scores, base)
    device = decode_device(cfg.device)
    model, tokenizer, tcfg = load_model(cfg.checkpoint, device)
    conf = decode_dataset_conf(cfg.dataset_conf, tcfg.dataset_conf)
    loader = build_dataloader(cfg.data_list, conf, tokenizer, train=False, rank=0, world_size=1)
    batches = list(forward_batches(loader, model, tokenizer, conf, device, desc="tune-lm (model)",
                                   source=(cfg.checkpoint, cfg.data_list)))
    rows = []
    for lm_weight in cfg.lm_weights:
        for word_score in cfg.word_scores:
            for unk_score in unk_scores:
                point = copy.deepcopy(base)
                point.lm_weight, point.word_score, point.unk_score = float(lm_weight), float(word_score), unk_score
                run = run_search(point, batches, tokenizer, Search(point, tokenizer, model, device),
                                 where=cfg.data_list, skipped=skipped_summary(loader))
                scorer = score(run, tokenizer)
                # ties: the smaller |unk_score| (0 first), then the grid's order
                rows.append((scorer.cer.rate, scorer.wer.rate, abs(unk_score), len(rows),
                             float(lm_weight), float(word_score), unk_score))
                print(f"tune-lm: lm_weight={lm_weight} word_score={word_score} unk_score={unk_score} CER "
                      f"{100 * scorer.cer.rate:.2f} WER {100 * scorer.wer.rate:.2f}", file=sys.stderr, flush=True)
    best = min(rows)
    cer, wer, lm_weight, word_score, unk_score = best[0], best[1], *best[4:]
    ensure_dir(out, what="output_dir")
    with atomic_write(out / "tune.txt") as f:
        f.write("lm_weight word_score unk_score %CER %WER\n")
        f.write("".join(f"{w} {s} {u} {100 * c:.2f} {100 * e:.2f}\n"
                        for c, e, _, _, w, s, u in sorted(rows, key=lambda r: r[4:])))
    line = f"++decoding.method=ctc_beam_lm ++decoding.lm={cfg.lm} ++decoding.lm_weight={lm_weight} " \
           f"++decoding.word_score={word_score} " + \
           ("++decoding.lexicon=true" if base.lexicon else f"++decoding.unk_score={unk_score}")
    with atomic_write(out / "best.txt") as f:
        f.write(line + "\n")
    print(f"tune-lm: best CER {100 * cer:.2f} (WER {100 * wer:.2f}) with {line}")
    return {"cer": cer, "wer": wer, "lm_weight": lm_weight, "word_score": word_score, "unk_score": unk_score,
            "points": len(rows)}


def unk_grid(given: Any, decoding: Any) -> list[float]:
    """The unk_score values to try: ``++unk_scores`` or its default; with the lexicon only 0 (no unit is unknown),
    so a given non-zero value is refused rather than ignored."""
    from corpus_io.errors import ConfigError

    if given is None:
        return [0.0] if decoding.lexicon else list(DEFAULT_UNK_SCORES)
    values = list(dict.fromkeys(float(u) for u in given))
    if decoding.lexicon and values != [0.0]:
        raise ConfigError(f"tune-lm ++unk_scores={values} is given with decoding.lexicon=true, which limits the "
                          f"words to the LM's vocabulary: no word is unknown, so unk_score would be ignored. Leave "
                          f"++unk_scores out (or [0]) to tune with the lexicon, or set ++decoding.lexicon=false.")
    return values
