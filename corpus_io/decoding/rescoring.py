"""Attention rescoring (WeNet's ``attention_rescoring``): the CTC prefix beam search's n-best, each
hypothesis scored by the attention decoder (teacher-forced, ``<sos>`` ids ``<eos>``), and the best by
``ctc_weight * ctc + (1 - ctc_weight) * decoder`` (plus the hotword bonus when hotwords are set)."""

from __future__ import annotations

from typing import Any

from corpus_io.decoding.beam import Hyp


def attention_rescoring(model: Any, encoder: tuple, nbest: list[list[Hyp]], ctc_weight: float) -> list[list[Hyp]]:
    """Re-rank every utterance's n-best; ``model.attention_scores(encoder_out, encoder_lengths, utt, seqs)``
    gives the decoder's log-probability of each sequence."""
    utt = [b for b, hyps in enumerate(nbest) for _ in hyps]
    seqs = [h.ids for hyps in nbest for h in hyps]
    if not seqs:
        return nbest
    import torch

    with torch.no_grad():
        att = model.attention_scores(encoder[0], encoder[1], utt, seqs).tolist()
    out: list[list[Hyp]] = [[] for _ in nbest]
    for b, h, a in zip(utt, (h for hyps in nbest for h in hyps), att):
        bonus = h.score - h.ctc_score  # hotwords
        out[b].append(Hyp(h.ids, ctc_weight * h.ctc_score + (1 - ctc_weight) * a + bonus, h.ctc_score))
    for hyps in out:
        hyps.sort(key=lambda x: -x.score)
    return out
