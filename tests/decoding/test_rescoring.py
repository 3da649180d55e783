"""The hybrid CTC/attention model's decoder scores and attention rescoring of an n-best list."""

from __future__ import annotations

import pytest
import torch

from corpus_io.decoding.beam import Hyp, ctc_prefix_beam_search
from corpus_io.decoding.rescoring import attention_rescoring
from corpus_io.model.model import ConformerCTCAttention


def tiny_model() -> ConformerCTCAttention:
    torch.manual_seed(0)
    return ConformerCTCAttention(80, 12, output_size=32, attention_heads=2, linear_units=64, num_blocks=1,
                                 subsampling_channels=8, decoder_num_blocks=1, decoder_linear_units=64,
                                 lsm_weight=0.0).eval()


def test_decoder_scores_are_the_teacher_forced_loss_and_independent_of_the_other_sequences():
    model = tiny_model()
    feats, lengths = torch.randn(3, 60, 80), torch.tensor([60, 44, 30])
    target = torch.tensor([[3, 4, 5, -1], [6, 7, -1, -1], [8, 9, 10, 2]])
    tlen = torch.tensor([3, 2, 4])
    with torch.no_grad():
        log_probs, out_lengths, att = model(feats, lengths, target, tlen)
        encoded = model.encode(feats, lengths)
        scores = model.attention_scores(*encoded, [0, 1, 2], [[3, 4, 5], [6, 7], [8, 9, 10, 2]])
        alone = model.attention_scores(*encoded, [1], [[6, 7]])  # without the other two sequences
    assert float(att) * 3 == pytest.approx(-float(scores.sum()), rel=1e-5)  # the loss is a sum per batch / B
    assert float(alone[0]) == pytest.approx(float(scores[1]), abs=1e-4)
    assert torch.equal(model(feats, lengths)[0], log_probs)  # the CTC interface is unchanged


def test_attention_rescoring_reranks_by_the_weighted_sum_and_keeps_the_hotword_bonus():
    model = tiny_model()
    feats, lengths = torch.randn(2, 60, 80), torch.tensor([60, 50])
    with torch.no_grad():
        encoded = model.encode(feats, lengths)
        log_probs, out_lengths = model.ctc_log_probs(*encoded)
    nbest = ctc_prefix_beam_search(log_probs, out_lengths, beam=4)
    nbest[0][0] = Hyp(nbest[0][0].ids, nbest[0][0].score + 2.0, nbest[0][0].ctc_score)  # a hotword bonus
    for weight in (0.0, 0.5, 1.0):
        out = attention_rescoring(model, encoded, nbest, weight)
        for b, hyps in enumerate(out):
            att = model.attention_scores(*encoded, [b] * len(hyps), [h.ids for h in hyps]).tolist()
            bonus = [2.0 if (b == 0 and h.ids == nbest[0][0].ids) else 0.0 for h in hyps]
            expected = [weight * h.ctc_score + (1 - weight) * a + x for h, a, x in zip(hyps, att, bonus)]
            assert [h.score for h in hyps] == pytest.approx(expected, abs=1e-4)
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
            assert sorted(map(tuple, (h.ids for h in hyps))) == sorted(map(tuple, (h.ids for h in nbest[b])))
