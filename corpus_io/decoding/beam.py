"""CTC prefix beam search, batched: every utterance's beam advances one frame per step as tensors on
the log-probs' device (no Python loop over utterances, prefixes or tokens).

The search is the usual one (Hannun et al. 2014; WeNet's ``ctc_prefix_beam_search``): each prefix
keeps two log-probabilities, of its alignments ending in blank (``pb``) and in its last token
(``pnb``). Per frame, a prefix *stays* (a blank, or its last token repeated) or is *extended* by one
of the frame's ``token_beam`` most likely tokens (a repeat of the last token extends only from
``pb``). An extension equal to another beam entry's prefix is merged into that entry's stay. The
``beam`` best by ``logaddexp(pb, pnb)`` (plus a hotword bonus, see :mod:`corpus_io.decoding.hotwords`)
survive. Prefix identity is two 31-bit polynomial hashes (a false merge needs both to collide);
prefixes are rebuilt at the end from per-frame back-pointers, so a step costs O(B·beam·token_beam).

The pruned sums are approximations, so the final n-best (with the greedy best path added as a candidate)
is ranked by each prefix's exact CTC log-probability (the forward algorithm over all its alignments,
:func:`ctc_scores`): the top entry then never scores below the greedy hypothesis. ``beam=1`` is the
greedy best path itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

NEG_INF = float("-inf")
_MOD = 2_147_483_629  # a prime below 2**31: h * base + token stays inside int64
_BASES = (1_000_003, 998_244_353)


@dataclass
class Hyp:
    """One n-best entry: token ids and its score (the CTC log-probability of the prefix summed over the
    alignments the beam kept; with hotwords, plus the context bonus)."""

    ids: list[int]
    score: float
    ctc_score: float


def ctc_prefix_beam_search(log_probs: torch.Tensor, lengths: torch.Tensor, *, beam: int = 10,
                           token_beam: int | None = None, context: Any = None, lm: Any = None,
                           blank: int = 0) -> list[list[Hyp]]:
    """The ``beam`` best prefixes per utterance, best first.

    ``log_probs`` (B, T, V) CTC log-softmax; ``lengths`` (B,) valid frames. ``token_beam``: tokens
    tried per frame (default ``beam``). ``context`` (a :class:`corpus_io.decoding.hotwords.ContextGraph`,
    hotword biasing) and ``lm`` (a :class:`corpus_io.decoding.lm.LmFusion`, shallow fusion of an n-gram)
    are *fusions*: per-prefix states whose bonus for each appended token is added to the ranking
    (``bonus(state, tokens)``, ``advance(state, token)``, ``sequence_bonus(seqs)``).
    """
    fusions = [f for f in (context, lm) if f is not None]
    B, T, V = log_probs.shape
    dev = log_probs.device
    K = max(1, int(beam))
    greedy = best_path_ids(log_probs, lengths)
    if K == 1 and not fusions:
        scores = ctc_scores(log_probs, lengths, list(range(B)), greedy).tolist()
        return [[Hyp(ids, sc, sc)] for ids, sc in zip(greedy, scores)]
    C = max(1, min(int(token_beam or K), V - 1))
    lp = log_probs.float()
    lengths = lengths.to(dev)
    ninf = torch.full((B, K), NEG_INF, device=dev)
    pb = ninf.clone()
    pb[:, 0] = 0.0  # the empty prefix
    pnb = ninf.clone()
    last = torch.full((B, K), -1, dtype=torch.long, device=dev)
    hashes = [torch.zeros((B, K), dtype=torch.long, device=dev) for _ in _BASES]
    _poison(hashes, pb, pnb)
    states = [f.initial_state(B, K) for f in fusions]
    extra = torch.zeros((B, K), device=dev)  # the fusions' summed bonus of each prefix
    parents, tokens = [], []  # per frame: (B, K) beam index at t-1, token appended (-1: none)
    ar_k = torch.arange(K, device=dev)
    for t in range(T):
        frame = lp[:, t]  # (B, V)
        top_lp, top_tok = frame[:, 1:].topk(C, dim=-1)  # (B, C), blank excluded
        top_tok = top_tok + 1
        total = torch.logaddexp(pb, pnb)
        # stay: blank, or the last token repeated (collapsed)
        stay_pb = total + frame[:, blank:blank + 1]
        rep = frame.gather(1, last.clamp(min=0))
        stay_pnb = torch.where(last >= 0, pnb + rep, ninf)
        # extend by each of the C tokens: (B, K, C)
        same = top_tok[:, None, :] == last[:, :, None]
        ext = torch.where(same, pb[:, :, None], total[:, :, None]) + top_lp[:, None, :]
        ext_hash = [(h[:, :, None] * base + top_tok[:, None, :] + 1) % _MOD for h, base in zip(hashes, _BASES)]
        # an extension equal to a beam entry's prefix goes into that entry's stay (pnb)
        match = torch.ones((B, K, C, K), dtype=torch.bool, device=dev)
        for eh, h in zip(ext_hash, hashes):
            match &= eh[:, :, :, None] == h[:, None, None, :]
        match &= top_tok[:, None, :, None] == last[:, None, None, :]
        # distinct prefixes: at most one extension matches an entry, so the max is the sum
        merged = torch.where(match, ext[..., None], NEG_INF).flatten(1, 2).amax(dim=1)  # (B, K)
        stay_pnb = torch.logaddexp(stay_pnb, merged)
        ext = ext.masked_fill(match.any(dim=-1), NEG_INF)
        # the fusions' bonus of each extension
        ext_extra = extra[:, :, None].expand(B, K, C)
        for f, st in zip(fusions, states):
            ext_extra = ext_extra + f.bonus(st, top_tok[:, None, :].expand(B, K, C))
        cand_pb = torch.cat([stay_pb, torch.full((B, K * C), NEG_INF, device=dev)], dim=1)
        cand_pnb = torch.cat([stay_pnb, ext.reshape(B, K * C)], dim=1)
        cand_ctx = torch.cat([extra, ext_extra.reshape(B, K * C)], dim=1)
        rank = torch.logaddexp(cand_pb, cand_pnb)
        rank = rank + torch.where(torch.isfinite(rank), cand_ctx, 0.0)
        _, pick = rank.topk(K, dim=1)  # (B, K) candidate index
        is_ext = pick >= K
        parent = torch.where(is_ext, (pick - K) // C, pick)
        tok = torch.where(is_ext, top_tok.gather(1, ((pick - K) % C).clamp(min=0)), -1)
        new_pb, new_pnb = cand_pb.gather(1, pick), cand_pnb.gather(1, pick)
        new_last = torch.where(is_ext, tok, last.gather(1, parent))
        new_hashes = [torch.where(is_ext, eh.reshape(B, K * C).gather(1, (pick - K).clamp(min=0)), h.gather(1, parent))
                      for eh, h in zip(ext_hash, hashes)]
        new_states = [f.advance(st.gather(1, parent), tok) for f, st in zip(fusions, states)]
        new_extra = cand_ctx.gather(1, pick)
        live = (t < lengths)[:, None]  # frames past an utterance's end change nothing
        pb, pnb = torch.where(live, new_pb, pb), torch.where(live, new_pnb, pnb)
        last = torch.where(live, new_last, last)
        hashes = [torch.where(live, nh, h) for nh, h in zip(new_hashes, hashes)]
        states = [torch.where(live, ns, st) for ns, st in zip(new_states, states)]
        extra = torch.where(live, new_extra, extra)
        parents.append(torch.where(live, parent, ar_k))
        tokens.append(torch.where(live, tok, -1))
        _poison(hashes, pb, pnb)
    final = torch.logaddexp(pb, pnb)
    return _exact_nbest(log_probs, lengths, _backtrack(parents, tokens, final), greedy, K, fusions)


def best_path_ids(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Greedy CTC: the argmax per frame, repeats merged, blanks (id 0) dropped."""
    best = log_probs.argmax(dim=-1).cpu()
    out = []
    for row, n in zip(best.tolist(), lengths.cpu().tolist()):
        ids, prev = [], -1
        for t in row[: int(n)]:
            if t != prev and t != 0:
                ids.append(t)
            prev = t
        out.append(ids)
    return out


def ctc_scores(log_probs: torch.Tensor, lengths: torch.Tensor, utt: list[int], seqs: list[list[int]]) -> torch.Tensor:
    """Exact CTC log-probability of each token sequence ``seqs[i]`` given utterance ``utt[i]``'s frames:
    the forward algorithm over every alignment (``-ctc_loss``), -inf where none fits the frames.

    Each sequence is scored over its own columns only (blank + its distinct tokens), so the cost does
    not grow with the vocabulary.
    """
    import torch.nn.functional as F

    dev = log_probs.device
    if not seqs:
        return torch.zeros(0)
    width = max(len(set(s)) for s in seqs) + 1
    cols = torch.zeros((len(seqs), width), dtype=torch.long)
    targets = torch.zeros((len(seqs), max(1, max(len(s) for s in seqs))), dtype=torch.long)
    for i, s in enumerate(seqs):
        distinct = list(dict.fromkeys(s))
        cols[i, 1:len(distinct) + 1] = torch.tensor(distinct, dtype=torch.long)
        col_of = {tok: j + 1 for j, tok in enumerate(distinct)}
        if s:
            targets[i, :len(s)] = torch.tensor([col_of[t] for t in s])
    index = torch.tensor(utt, dtype=torch.long, device=dev)
    frames = torch.arange(log_probs.shape[1], device=dev)
    reduced = log_probs[index[:, None, None], frames[None, :, None], cols.to(dev)[:, None, :]].float()  # (N, T, W)
    # padding columns (token 0 again) must not add paths: only the sequence's own columns count
    used = torch.tensor([len(set(s)) + 1 for s in seqs], device=dev)
    reduced = reduced.masked_fill(torch.arange(width, device=dev)[None, None, :] >= used[:, None, None], NEG_INF)
    loss = F.ctc_loss(reduced.transpose(0, 1), targets.to(dev), lengths.to(dev).index_select(0, index),
                      torch.tensor([len(s) for s in seqs], device=dev), blank=0, reduction="none",
                      zero_infinity=False)
    return (-loss).cpu()


def _exact_nbest(log_probs: torch.Tensor, lengths: torch.Tensor, found: list[list[list[int]]],
                 greedy: list[list[int]], K: int, fusions: list) -> list[list[Hyp]]:
    """Each utterance's beam prefixes plus its greedy path, ranked by exact CTC log-probability (+ the
    fusions' bonus of the whole sequence: hotwords, LM with its end of sentence), best ``K`` kept."""
    utt, seqs = [], []
    for b, prefixes in enumerate(found):
        for ids in dict.fromkeys(tuple(p) for p in prefixes + [greedy[b]]):
            utt.append(b)
            seqs.append(list(ids))
    ctc = ctc_scores(log_probs, lengths, utt, seqs).tolist()
    bonus = [0.0] * len(seqs)
    for f in fusions:
        bonus = [x + y for x, y in zip(bonus, f.sequence_bonus(seqs))]
    out: list[list[Hyp]] = [[] for _ in found]
    for b, ids, c, x in zip(utt, seqs, ctc, bonus):
        if c != NEG_INF:
            out[b].append(Hyp(ids, c + x, c))
    for hyps in out:
        hyps.sort(key=lambda h: -h.score)
        del hyps[K:]
    return out


def _poison(hashes: list[torch.Tensor], pb: torch.Tensor, pnb: torch.Tensor) -> None:
    """Dead entries (both scores -inf) get hashes no live prefix can have (negative), so they never merge."""
    dead = torch.isneginf(pb) & torch.isneginf(pnb)
    k = torch.arange(pb.shape[1], device=pb.device).expand_as(pb)
    for h in hashes:
        h.copy_(torch.where(dead, -1 - k, h))


def _backtrack(parents: list[torch.Tensor], tokens: list[torch.Tensor], final: torch.Tensor) -> list[list[list[int]]]:
    """The live beam entries' token sequences, followed back through the per-frame pointers."""
    B, K = final.shape
    if not parents:
        return [[[]] for _ in range(B)]
    par = torch.stack(parents).cpu()  # (T, B, K)
    tok = torch.stack(tokens).cpu()
    idx = torch.arange(K).expand(B, K).clone()  # (B, K): which entry, followed backwards
    seqs = []
    for t in range(par.shape[0] - 1, -1, -1):
        seqs.append(tok[t].gather(1, idx))
        idx = par[t].gather(1, idx)
    steps = torch.stack(seqs[::-1], dim=-1).tolist()  # (B, K, T)
    live = torch.isfinite(final).cpu().tolist()
    return [[[x for x in steps[b][k] if x >= 0] for k in range(K) if live[b][k]] for b in range(B)]
