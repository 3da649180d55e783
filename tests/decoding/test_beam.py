"""CTC prefix beam search on fixed random log-probabilities: exact on small cases, greedy at beam 1,
never below greedy, sorted distinct n-best lists, padding frames ignored."""

from __future__ import annotations

import itertools

import pytest
import torch

from corpus_io.decoding.beam import best_path_ids, ctc_prefix_beam_search, ctc_scores


def random_log_probs(seed: int, B: int, T: int, V: int, sharpness: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(B, T, V, generator=g) * sharpness, dim=-1)


def collapse(path: tuple[int, ...]) -> tuple[int, ...]:
    out, prev = [], -1
    for x in path:
        if x != prev and x != 0:
            out.append(x)
        prev = x
    return tuple(out)


def test_an_unpruned_beam_gives_every_prefix_with_its_exact_ctc_probability():
    lp = random_log_probs(1, 3, 5, 3, 2.0)
    lengths = torch.tensor([5, 4, 2])
    found = ctc_prefix_beam_search(lp, lengths, beam=500)
    for b, n in enumerate(lengths.tolist()):
        # brute force: the sum over every frame path that collapses to the prefix
        exact: dict[tuple, float] = {}
        for path in itertools.product(range(3), repeat=n):
            p = float(sum(lp[b, t, x] for t, x in enumerate(path)).exp())
            exact[collapse(path)] = exact.get(collapse(path), 0.0) + p
        got = {tuple(h.ids): h.score for h in found[b]}
        assert set(got) == set(exact)
        for prefix, p in exact.items():
            assert got[prefix] == pytest.approx(torch.tensor(p).log().item(), abs=1e-4)


@pytest.mark.parametrize("sharpness", [1.0, 3.0, 6.0])
def test_beam_one_is_greedy_and_wider_beams_never_score_below_greedy(sharpness):
    lp = random_log_probs(7, 16, 40, 9, sharpness)
    lengths = torch.randint(3, 41, (16,), generator=torch.Generator().manual_seed(3))
    greedy = best_path_ids(lp, lengths)
    assert [h[0].ids for h in ctc_prefix_beam_search(lp, lengths, beam=1)] == greedy
    greedy_scores = ctc_scores(lp, lengths, list(range(16)), greedy).tolist()
    for beam in (2, 4, 10):
        nbest = ctc_prefix_beam_search(lp, lengths, beam=beam)
        for b, hyps in enumerate(nbest):
            assert 1 <= len(hyps) <= beam
            assert hyps[0].score >= greedy_scores[b] - 1e-4
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
            assert len({tuple(h.ids) for h in hyps}) == len(hyps)
            exact = ctc_scores(lp, lengths, [b] * len(hyps), [h.ids for h in hyps]).tolist()
            assert [h.score for h in hyps] == pytest.approx(exact, abs=1e-4)


def test_padding_frames_do_not_change_an_utterances_result():
    short = random_log_probs(5, 1, 18, 6, 3.0)
    alone = ctc_prefix_beam_search(short, torch.tensor([18]), beam=6)[0]
    padded = torch.cat([short, torch.zeros(1, 12, 6)], dim=1)  # zero log-probs: would win if read
    batch = torch.cat([padded, random_log_probs(6, 1, 30, 6, 3.0)])  # beside a longer utterance
    together = ctc_prefix_beam_search(batch, torch.tensor([18, 30]), beam=6)[0]
    assert [(h.ids, round(h.score, 4)) for h in together] == [(h.ids, round(h.score, 4)) for h in alone]
