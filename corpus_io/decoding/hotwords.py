"""Hotword biasing (contextual biasing) for the CTC prefix beam search: a context graph over token ids.

The hotwords, tokenized as the model's tokenizer splits them, form a prefix trie with failure links
(Aho-Corasick), as WeNet's and icefall's context graphs do. A hypothesis carries its trie state; each
matched token earns ``weight``; a token that breaks a partial match falls back along the failure
links and gives back the bonus of the part that no longer matches. A completed hotword is credited once
more with its whole bonus, so a later fall-back leaves exactly the completed word's bonus. The graph is
compiled into two dense (states x vocabulary) tables, so the batched beam search steps every candidate
with one gather.
"""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path
from typing import Any

import torch

from corpus_io.errors import ConfigError, excerpt

MAX_TABLE = 50_000_000  # states x vocabulary entries


def read_hotwords(path: str) -> list[str]:
    """One hotword (or phrase) per line; blank lines and ``#`` comments skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read decoding.hotwords={path}: {exc}. Give a UTF-8 file with one hotword "
                          f"per line.") from None
    words = [w.strip() for w in lines if w.strip() and not w.lstrip().startswith("#")]
    if not words:
        raise ConfigError(f"decoding.hotwords={path} holds no hotword (one per line).")
    return words


class ContextGraph:
    """A fusion of :func:`corpus_io.decoding.beam.ctc_prefix_beam_search`: ``bonus``, ``advance`` and
    ``sequence_bonus`` over (states x vocabulary) tables."""

    def __init__(self, sequences: list[list[int]], vocab_size: int, weight: float, device: Any = "cpu") -> None:
        children: list[dict[int, int]] = [{}]
        depth = [0]
        end = [False]
        for seq in sequences:
            node = 0
            for tok in seq:
                if tok not in children[node]:
                    children.append({})
                    depth.append(depth[node] + 1)
                    end.append(False)
                    children[node][tok] = len(children) - 1
                node = children[node][tok]
            end[node] = True
        n = len(children)
        if n * vocab_size > MAX_TABLE:
            raise ConfigError(f"the hotword list has {n} trie states x {vocab_size} tokens, more than the "
                              f"{MAX_TABLE} table entries allowed; use fewer or shorter hotwords.")
        fail = [0] * n
        goto = torch.zeros((n, vocab_size), dtype=torch.long)
        order = []
        queue = deque([0])
        while queue:  # breadth first: a node's failure target is finished before the node
            s = queue.popleft()
            order.append(s)
            if s:
                goto[s] = goto[fail[s]]
            for tok, child in children[s].items():
                fail[child] = int(goto[fail[s], tok]) if s else 0
                goto[s, tok] = child
                queue.append(child)
        node_score = torch.tensor(depth, dtype=torch.float32) * weight
        credit = torch.where(torch.tensor(end), node_score, 0.0)
        self.num_states = n
        self.next = goto.to(device)
        self.bonus_table = (node_score[goto] - node_score[:, None] + credit[goto]).to(device)
        self.node_score = node_score.to(device)

    def initial_state(self, batch: int, beam: int) -> torch.Tensor:
        return torch.zeros((batch, beam), dtype=torch.long, device=self.next.device)

    def bonus(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The bonus of appending ``tokens`` (B, K, C) to prefixes in ``state`` (B, K)."""
        return self.bonus_table[state[:, :, None].expand_as(tokens), tokens]

    def advance(self, state: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """The state after ``token`` (B, K; -1: nothing appended)."""
        return torch.where(token >= 0, self.next[state, token.clamp(min=0)], state)

    def final_penalty(self, state: torch.Tensor) -> torch.Tensor:
        """At the end of the utterance a partial match gives back its bonus."""
        return -self.node_score[state]

    def sequence_bonus(self, seqs: list[list[int]]) -> list[float]:
        """The whole bonus of each token sequence (partial matches at its end given back)."""
        out = []
        for seq in seqs:
            state = torch.zeros((), dtype=torch.long, device=self.next.device)
            total = torch.zeros((), device=self.next.device)
            for tok in seq:
                state, bonus = self.next[state, tok], total + self.bonus_table[state, tok]
                total = bonus
            out.append(float(total + self.final_penalty(state)))
        return out


def build_context(path: str, tokenizer: Any, weight: float, device: Any = "cpu") -> tuple[ContextGraph, list[str]]:
    """The context graph of the hotword file (tokenized by ``tokenizer``) and the hotwords kept.

    A hotword with a token outside the token list is left out with a warning (the model cannot output it).
    """
    words = read_hotwords(path)
    sequences, kept, dropped = [], [], []
    for word in words:
        tokens = tokenizer.tokenize(word)
        ids = [tokenizer.token_id(t) for t in tokens]
        if not ids or any(i is None for i in ids):
            dropped.append(word)
            continue
        sequences.append(ids)
        kept.append(word)
    if dropped:
        print(f"warning: {len(dropped)} hotwords of {path} have tokens outside the token list and are left out "
              f"(e.g. {', '.join(excerpt(w) for w in dropped[:5])}).", file=sys.stderr, flush=True)
    if not sequences:
        raise ConfigError(f"no hotword of {path} can be spelled with the model's token list.")
    return ContextGraph(sequences, tokenizer.vocab_size, weight, device), kept
