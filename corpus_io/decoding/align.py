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

A CTC model spikes on a word's most distinctive part, often its vowel: the 0.3 s /s/ of "six" lies before its spike,
and a word's last sound often after its last token. So with ``speech`` (which input frames hold speech:
:func:`speech_frames` of the features' energy) each word's span moves from its tokens' frames to its sound:

* its start moves back over the speech frames just before it, down to the end of the word before it and at most
  :data:`ONSET_BACK_SECONDS`; a start in a pause (a path that begins in the silence before the sound, at frame 0)
  moves forward to the sound, not past the word's end;
* its end moves forward over the speech frames just after it, up to the next word's first token and at most
  :data:`END_FORWARD_SECONDS`, and back off any silence it ends in (a last token emitted after the sound stopped);
* speech frames run across silences shorter than :data:`PAUSE_SECONDS` (a stop's closure); a word whose tokens lie
  wholly in silence less than that after sound is that sound's.

After a pause a word starts where its sound does and ends where it stops; within fluent speech a word ends where
the next word's first token starts. Tokens keep the CTC path's frames.

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

#: how far back a word's start may move over speech frames (seconds)
ONSET_BACK_SECONDS = 0.5
#: how far forward a word's end may move over speech frames (seconds)
END_FORWARD_SECONDS = 0.5
#: a frame is speech when its energy is within SPEECH_TOP_DB of the utterance's loudest frame and SPEECH_FLOOR_DB
#: above its quietest tenth (the background), in dB
SPEECH_TOP_DB = 50.0
SPEECH_FLOOR_DB = 10.0
#: a silence within a word (a stop's closure) is shorter than this; a pause before a word is longer (seconds)
PAUSE_SECONDS = 0.15


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


def speech_frames(energy_db: torch.Tensor) -> torch.Tensor:
    """Which frames of one utterance hold speech (bool, same length), from each frame's energy (dB): within
    :data:`SPEECH_TOP_DB` of the loudest and :data:`SPEECH_FLOOR_DB` above the quietest tenth."""
    e = energy_db.detach().float().cpu()
    if e.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    threshold = torch.maximum(e.max() - SPEECH_TOP_DB, torch.quantile(e, 0.1) + SPEECH_FLOOR_DB)
    return e > threshold


def align(log_probs: torch.Tensor, ids: list[int], decode: Callable[[list[int]], str],
          words_of: Callable[[str], list[str]], *, frame_seconds: float, duration: float | None = None,
          blank: int = 0, speech: torch.Tensor | None = None, speech_seconds: float = 0.01) -> Timed:
    """The tokens and words of hypothesis ``ids`` with times (seconds from the utterance's start) and
    confidences. ``log_probs``: (T, V) CTC log-softmax of the utterance's valid frames; ``decode``: token ids ->
    text (the tokenizer's, so words are the hypothesis text's); ``words_of``: text -> its words (decode passes
    scoring's ``word_units``); ``frame_seconds``: seconds per output frame;
    ``duration``: the audio's seconds (times are clipped to it); ``speech``: which input frames (``speech_seconds``
    apart, the feature frame shift) hold speech, to move word starts back to their sound (None: the CTC path's)."""
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
    if speech is not None:
        words = _sound_spans(words, speech, speech_seconds, limit)
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


def _closures_filled(flags: list[bool], step: float) -> list[bool]:
    """``flags`` with the silences between speech frames shorter than :data:`PAUSE_SECONDS` (a stop's closure, the
    /k/ of "six") counted as speech."""
    closed = list(flags)
    gap = max(1, int(round(PAUSE_SECONDS / step)))
    last = None  # the last speech frame seen
    for i, f in enumerate(flags):
        if f:
            if last is not None and 1 < i - last <= gap:
                closed[last + 1:i] = [True] * (i - last - 1)
            last = i
    return closed


def _without_edge_tails(flags: list[bool], step: float) -> list[bool]:
    """``flags`` without a run of speech shorter than :data:`PAUSE_SECONDS` that touches the audio's start or end
    (within 20 ms) apart from the rest by a silence of at least 50 ms: the cut-off tail of a neighbouring
    utterance in a segment cut from a longer recording, not a word of this one."""
    flags = list(flags)
    n, short, edge, join = len(flags), int(round(PAUSE_SECONDS / step)), int(round(0.02 / step)), 0.05 / step
    runs: list[list[int]] = []  # [first, end) of each run of speech, silences shorter than 50 ms inside it
    for i, f in enumerate(flags):
        if f:
            if runs and i - runs[-1][1] < join:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
    if len(runs) > 1:
        for a, b in (runs[0], runs[-1]):
            if b - a < short and (a <= edge or n - b <= edge):
                flags[a:b] = [False] * (b - a)
    return flags


def _sound_spans(words: list[Span], speech: torch.Tensor, step: float, limit: float) -> list[Span]:
    """Each word's span moved from its tokens' CTC frames to its sound (``speech``: one flag per ``step`` seconds;
    ``limit``: the audio's end), word by word.

    Start: back over the speech frames before its first token (across closures), no earlier than the previous
    word's end nor :data:`ONSET_BACK_SECONDS` before; a start in a pause (a path that begins before the sound, at
    frame 0) moves forward to where the sound begins, not past the word's end. End: forward over the speech frames
    after its last token (across closures), up to the next word's first token and at most
    :data:`END_FORWARD_SECONDS`, then back to the last speech frame (off a closure's or a pause's silence: a last
    token the model emits after the sound stopped), never back to its start. A word with no speech under its tokens
    and sound less than :data:`PAUSE_SECONDS` before them (emitted just after its sound) is that sound. No word
    starts before the utterance's first sound nor ends after its last (a cut-off tail at an edge is no sound:
    :func:`_without_edge_tails`), nor starts before the previous word's end."""
    flags = _without_edge_tails(speech.tolist(), step)
    n = len(flags)
    if not any(flags):
        return words
    closed = _closures_filled(flags, step)
    gap = max(1, int(round(PAUSE_SECONDS / step)))
    sound_from = flags.index(True) * step  # the utterance's sound: no word starts before it nor ends after it
    sound_to = (n - flags[::-1].index(True)) * step

    def frame(t: float) -> int:
        return min(max(int(round(t / step)), 0), n)

    out: list[Span] = []
    prev_end = 0.0
    for i, w in enumerate(words):
        f = frame(w.start)
        earliest = max(prev_end, w.start - ONSET_BACK_SECONDS)
        if not any(flags[f:max(frame(w.end), f + 1)]):  # no sound under its tokens: emitted just after its sound?
            h = f
            while h > 0 and not flags[h - 1] and f - h < gap and (h - 1) * step >= earliest - 1e-9:
                h -= 1
            if h > 0 and flags[h - 1] and (h - 1) * step >= earliest - 1e-9:
                f = h
        while f > 0 and closed[f - 1] and (f - 1) * step >= earliest - 1e-9:
            f -= 1
        g = f
        while g < n and not flags[g] and (g + 1) * step < w.end - 1e-9:  # start on sound, not in a gap or a pause
            g += 1
        start = g * step if g < n and flags[g] else min(w.start, f * step)
        start = min(max(start, sound_from, prev_end), sound_to)
        bound = min(limit, max(w.end, start) + END_FORWARD_SECONDS)
        if i + 1 < len(words):
            bound = min(bound, max(w.end, start, words[i + 1].start))
        e = max(frame(w.end), frame(start))
        while e < n and closed[e] and (e + 1) * step <= bound + 1e-9:
            e += 1
        first = frame(start)
        while e > first + 1 and not flags[e - 1]:
            e -= 1
        end = e * step if e > first and flags[e - 1] else w.end
        end = min(max(min(end, sound_to), start), limit)
        out.append(Span(w.text, round(start, 3), round(end, 3), w.confidence))
        prev_end = end
    return out


def _unit(x: float) -> float:
    return float(min(1.0, max(0.0, x)))


__all__ = ["Span", "Timed", "align", "speech_frames", "token_frames"]
