"""Token and word times, and confidences, of a chosen CTC hypothesis.

The hypothesis is force-aligned to its utterance's log-probabilities (the Viterbi CTC path of exactly its
tokens: ``torchaudio.functional.forced_align``), so whichever search chose it (greedy, prefix beam, LM,
rescoring) the times come from one rule. A token spans the output frames its label holds in that path
(repeats of the label included, blanks excluded); output frame ``t`` starts at ``t * frame_seconds``
(``frame_seconds`` = the feature frame shift times the model's subsampling, 4 x 10 ms = 40 ms for
ConformerCTC) and a token ends where its last frame ends, clipped to the audio.

Words are the hypothesis text's words as scoring counts them (``words_of``: decode passes
:func:`corpus_io.train.scoring.word_units`: whitespace words, each CJK character a word); a word spans from its
first token's start to its last token's end.
A token that spells several words (a jieba word of two characters) shares its frames among them evenly.

Confidence, in [0, 1] (the aligned-frame posterior):

* a token's: the mean posterior ``exp(log_prob)`` of its label over the frames it is aligned to;
* a word's: the smallest confidence of its tokens (a word is as sure as its least sure token);
* an utterance's: the mean of its words' confidences; an utterance with no word: the mean posterior of blank over
  its frames (how sure the model is that nothing was said).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class Span:
    """A token or word: its text, start and end (seconds, from the start of the utterance) and confidence."""

    text: str
    start: float
    end: float
    confidence: float


@dataclass
class Timed:
    """One hypothesis aligned: its tokens, its words, and the utterance's confidence."""

    tokens: list[Span] = field(default_factory=list)
    words: list[Span] = field(default_factory=list)
    confidence: float = 0.0


def token_frames(log_probs: torch.Tensor, ids: list[int], blank: int = 0) -> list[list[int]]:
    """Each token's output frames on the Viterbi CTC path of ``ids`` through ``log_probs`` (T, V) (the valid
    frames only). Raises ValueError when the tokens cannot fit the frames (a hypothesis a search found always
    does)."""
    import torchaudio.functional as F

    if not ids:
        return []
    lp = log_probs.detach().float().cpu()[None]
    labels, _ = F.forced_align(lp, torch.tensor([ids], dtype=torch.int32), blank=blank)
    frames: list[list[int]] = []
    prev = blank
    for t, label in enumerate(labels[0].tolist()):
        if label != blank:
            if label != prev:  # a new token (a repeated token has a blank between its copies)
                frames.append([])
            frames[-1].append(t)
        prev = label
    if len(frames) != len(ids):
        raise ValueError(f"forced alignment gave {len(frames)} tokens for {len(ids)}")
    return frames


def align(log_probs: torch.Tensor, ids: list[int], decode: Callable[[list[int]], str],
          words_of: Callable[[str], list[str]], *, frame_seconds: float, duration: float | None = None,
          blank: int = 0) -> Timed:
    """The tokens and words of hypothesis ``ids`` with times (seconds from the utterance's start) and
    confidences. ``log_probs``: (T, V) CTC log-softmax of the utterance's valid frames; ``decode``: token ids ->
    text (the tokenizer's, so words are the hypothesis text's); ``words_of``: text -> its words (decode passes
    scoring's ``word_units``); ``frame_seconds``: seconds per output frame;
    ``duration``: the audio's seconds (times are clipped to it)."""
    lp = log_probs.detach().float().cpu()
    limit = duration if duration is not None else lp.shape[0] * frame_seconds
    if not ids:
        blank_post = lp[:, blank].exp().mean().item() if lp.shape[0] else 1.0
        return Timed(confidence=_unit(blank_post))
    frames = token_frames(lp, ids, blank)
    tokens = []
    for tok, fr in zip(ids, frames):
        post = lp[fr, tok].exp().mean().item()
        start = min(fr[0] * frame_seconds, limit)
        end = min((fr[-1] + 1) * frame_seconds, limit)
        tokens.append(Span(decode([tok]), round(start, 3), round(end, 3), _unit(post)))
    words = _words(ids, tokens, decode, words_of)
    conf = sum(w.confidence for w in words) / len(words) if words else _unit(
        sum(t.confidence for t in tokens) / len(tokens))
    return Timed(tokens, words, _unit(conf))


def _words(ids: list[int], tokens: list[Span], decode: Callable[[list[int]], str],
           words_of: Callable[[str], list[str]]) -> list[Span]:
    """The hypothesis text's words, each spanning its tokens: a token belongs to the words it adds to the text
    decoded so far (a token that only adds a space, a word piece's ``▁`` alone, belongs to none)."""
    members: list[list[int]] = []  # word index -> its token indices
    count, chars = 0, 0
    for i in range(len(ids)):
        text = decode(ids[: i + 1])
        words = words_of(text)
        n_chars = sum(len(w) for w in words)
        if len(words) > count:  # new words: this token starts them (or spells them whole)
            for _ in range(len(words) - count):
                members.append([i])
        elif n_chars > chars and members:  # more of the current word
            members[-1].append(i)
        count, chars = len(words), n_chars
    final = words_of(decode(ids))
    out: list[Span] = []
    shared: dict[int, list[int]] = {}  # token index -> the words it starts alone (a token spelling several words)
    for w, toks in enumerate(members):
        if len(toks) == 1:
            shared.setdefault(toks[0], []).append(w)
    for w, toks in enumerate(members[: len(final)]):
        first, last = tokens[toks[0]], tokens[toks[-1]]
        start, end = first.start, last.end
        group = shared.get(toks[0], [])
        if len(group) > 1:  # one token, several words: its frames shared evenly, in order
            k, n = group.index(w), len(group)
            step = (first.end - first.start) / n
            start, end = first.start + k * step, first.start + (k + 1) * step
        conf = min(tokens[t].confidence for t in toks)
        out.append(Span(final[w], round(start, 3), round(end, 3), conf))
    return out


def _unit(x: float) -> float:
    return float(min(1.0, max(0.0, x)))


__all__ = ["Span", "Timed", "align", "token_frames"]
