"""Token and word times, and confidences, of a chosen CTC hypothesis.

The hypothesis is force-aligned to its utterance's log-probabilities (the Viterbi CTC path of exactly its
tokens: ``torchaudio.functional.forced_align``), so whichever search chose it (greedy, prefix beam, LM,
rescoring) the times come from one rule. A token spans the output frames its label holds in that path
(repeats of the label included, blanks excluded); output frame ``t`` starts at ``t * frame_seconds``
(``frame_seconds`` = the feature frame shift times the model's subsampling, 4 x 10 ms = 40 ms for
ConformerCTC) and a token ends where its last frame ends, clipped to the audio.

Words are the hypothesis text's words as scoring counts them (``words_of``: decode passes
:func:`corpus_io.decoding.scoring.word_units`: whitespace words, each CJK character a word); a word spans from its
first token's start to its last token's end.
A token that spells several words (a jieba word of two characters) shares its frames among them evenly.

*Word bounds.* A CTC model spikes on a word's most distinctive part, often its vowel (the 0.3 s /s/ of "six" lies
before its spike), and its last token ends before the word's sound does. So with ``speech`` (which input frames hold
speech: :func:`speech_frames` of the features' energy) a word's bounds move from its tokens' frames to its sound:

* between two words, a pause (a silence of at least :data:`PAUSE_SECONDS`; a shorter one is a stop's closure) ends
  the first word where the pause starts and starts the second where it ends; with no pause, the two meet in the
  middle of the frames between their tokens (fluent speech has no gap between words);
* the first word starts at the utterance's sound onset (or the end of the last pause before its first token), the
  last ends where the sound ends (or the first pause after its last token starts): not at frame 0, nor at the
  last spike's end;
* a start moves back at most :data:`ONSET_BACK_SECONDS`, an end forward at most :data:`END_FORWARD_SECONDS`; each
  word starts at or after the one before ends, and ends after it starts (a word whose tokens lie before the sound
  keeps their length from the onset).

Tokens keep the CTC path's frames.

Confidence, in [0, 1] (the aligned-frame posterior):

* a token's: the mean posterior ``exp(log_prob)`` of its label over the frames it is aligned to;
* a word's: the smallest confidence of its tokens (a word is as sure as its least sure token);
* an utterance's: the mean of its words' confidences; an utterance with no word: the mean posterior of blank over
  its frames (how sure the model is that nothing was said).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

#: how far back a word's start may move over speech frames (seconds)
ONSET_BACK_SECONDS = 0.5
#: a frame is speech when its energy is within SPEECH_TOP_DB of the utterance's loudest frame and SPEECH_FLOOR_DB
#: above its quietest tenth (the background), in dB
SPEECH_TOP_DB = 50.0
SPEECH_FLOOR_DB = 10.0
#: a silence within a word (a stop's closure) is shorter than this; a pause between words is longer (seconds)
PAUSE_SECONDS = 0.15
#: how far forward a word's end may move over the frames after its last token (seconds)
END_FORWARD_SECONDS = 0.5
#: a sound shorter than this at the audio's start or end, parted from the rest by a pause, is not the utterance's: the
#: cut-off tail of a neighbouring one (seconds)
EDGE_SECONDS = 0.15
#: ... parted from it by a silence of at least this, and touching the audio's edge within it (seconds)
EDGE_GAP_SECONDS = 0.05


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


#: a frame of free audio (said by no text token) scores as blank, or as its best token less this (nats) when that
#: is more: CTC segmentation's skip cost. A CTC model hears speech in spikes among blank frames, so a text that ran
#: out would otherwise jump to later spikes of its last words (blank over the untranscribed speech between costs only
#: its spikes); a spike the text says still scores this much more on the text's path than as free audio
FREE_END_PENALTY = 2.0


def ctc_viterbi(log_probs: Any, ids: list[int], blank: int = 0, *, free_end: bool = False,
                free_audio: tuple[bool, bool] = (False, False),
                penalty: float = FREE_END_PENALTY) -> list[list[int]] | None:
    """Each token's output frames on the Viterbi CTC path of ``ids`` through ``log_probs`` (T, V), as
    :func:`token_frames`, computed here (numpy, one frame at a time: ``T x (2 len(ids) + 3)`` bytes of back pointers).
    ``free_end``: the path may end before the last token (the text goes on past these frames): the tokens it
    consumed are returned, fewer than ``ids``. ``free_audio`` (before, after): audio before the text starts (after it
    ends) may be said by no token: such a frame scores as blank, or its best token's log-prob less ``penalty`` when
    that is more (CTC segmentation's way: text that starts late or ends early is not stretched over speech it does
    not say). None
    when no path fits (more tokens, with the blanks between repeats, than frames)."""
    import numpy as np

    lp = log_probs.detach().float().cpu().numpy() if hasattr(log_probs, "detach") else np.asarray(log_probs)
    n, frames = len(ids), lp.shape[0]
    if n == 0 or frames == 0:
        return [] if n == 0 else None
    # states: 0 the free audio before the text, 1 .. 2n+1 the CTC states (blank, token, blank, ...), 2n+2 after it
    states = 2 * n + 3
    labels = np.full(states, blank, dtype=np.int64)
    labels[2:-1:2] = ids
    arr = np.asarray(ids)
    skip = np.zeros(states, dtype=bool)  # token state s may come from s - 2 (the token before, no blank between)
    skip[4:-1:2] = arr[1:] != arr[:-1]
    skip[2] = True  # the first token may follow the free audio before the text directly
    neg = np.float32(-1e30)
    emit = lp[:, labels]
    free = np.maximum(lp[:, blank], lp.max(axis=1) - np.float32(penalty))  # silence as blank, a spike less penalty
    emit[:, 0], emit[:, -1] = free, free
    back = np.zeros((frames, states), dtype=np.int8)
    dp = np.full(states, neg, dtype=np.float32)
    dp[1:3] = emit[0, 1:3]
    if free_audio[0]:
        dp[0] = emit[0, 0]
    one = np.empty(states, dtype=np.float32)
    two = np.empty(states, dtype=np.float32)
    for t in range(1, frames):
        one[0], one[1:] = neg, dp[:-1]
        two[:2], two[2:] = neg, dp[:-2]
        two[~skip] = neg
        two[-1] = dp[-3] if free_audio[1] else neg  # after the text: from its last token or its last blank
        if not free_audio[1]:
            one[-1] = neg
        step = np.where(one > dp, 1, 0).astype(np.int8)
        best = np.maximum(dp, one)
        better = two > best
        step[better] = 2
        dp = np.maximum(best, two) + emit[t]
        back[t] = step
    last = states - 2  # the CTC states' last: the blank after the text
    ends = np.arange(1, last + 1) if free_end else np.array([last, last - 1])
    if free_audio[1]:
        ends = np.append(ends, states - 1)
    end = int(ends[np.argmax(dp[ends])])
    if dp[end] < neg / 2:
        return None
    path = np.empty(frames, dtype=np.int64)
    state = end
    for t in range(frames - 1, -1, -1):
        path[t] = state
        state -= int(back[t, state])
    consumed = n if end == states - 1 else end // 2
    out: list[list[int]] = [[] for _ in range(consumed)]
    for t, state in enumerate(path.tolist()):
        if state % 2 == 0 and 0 < state < states - 1:
            out[state // 2 - 1].append(t)
    return out


def windowed_token_frames(log_probs: Any, ids: list[int], word_starts: list[int], blank: int = 0, *,
                          window: int, progress: Callable[[int], None] | None = None,
                          free_audio: bool = False) -> list[list[int] | None]:
    """Each token's output frames on a CTC Viterbi path of ``ids`` through ``log_probs`` (T, V) computed window by
    window, in bounded memory however long the recording: :func:`ctc_viterbi` over ``window`` frames and the text
    that follows (free end), the whole words (``word_starts``: the token index each word starts at, ascending)
    that end within the window's first two thirds committed, the next window starting at the frame after them
    with the next word. A window that commits nothing moves on by two thirds (audio with no text). Tokens left
    when the frames run out (text not spoken, or no path) are None. ``progress``: called with the frames done.
    ``free_audio``: each window's audio before its text and after it may be said by no token (:func:`ctc_viterbi`).
    """
    n, frames = len(ids), int(log_probs.shape[0])
    out: list[list[int] | None] = [None] * n
    commit = max(1, (2 * window) // 3)
    t0 = j0 = 0
    starts = sorted(set(word_starts) | {n})
    while j0 < n and t0 < frames:
        t1 = min(frames, t0 + window)
        last = t1 == frames
        j1 = min(n, j0 + (t1 - t0))  # no more tokens than frames fit
        path = ctc_viterbi(log_probs[t0:t1], ids[j0:j1], blank, free_end=True, free_audio=(free_audio, free_audio))
        done = len(path) if path else 0
        if last:
            for k in range(done):
                out[j0 + k] = [t0 + f for f in path[k]]
            break
        # whole words only, ending before the commit line (a word cut by the window's end waits for the next)
        cut = j0
        for s in starts:
            if s <= j0:
                continue
            if s - j0 > done or path[s - j0 - 1][-1] >= commit:
                break
            cut = s
        first = next(s for s in starts if s > j0)
        if cut == j0 and first - j0 <= done and path[first - j0 - 1][-1] < t1 - t0 - 1:
            cut = first  # the first word ends after the commit line, but whole within the window
        if cut == j0:
            t0 += commit
        else:
            for k in range(cut - j0):
                out[j0 + k] = [t0 + f for f in path[k]]
            t0 += path[cut - j0 - 1][-1] + 1
            j0 = cut
        if progress is not None:
            progress(t0)
    return out


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
          blank: int = 0, speech: torch.Tensor | None = None, speech_seconds: float = 0.01,
          offset_seconds: float = 0.0) -> Timed:
    """The tokens and words of hypothesis ``ids`` with times (seconds from the utterance's start) and
    confidences. ``log_probs``: (T, V) CTC log-softmax of the utterance's valid frames; ``decode``: token ids ->
    text (the tokenizer's, so words are the hypothesis text's); ``words_of``: text -> its words (decode passes
    scoring's ``word_units``); ``frame_seconds``: seconds per output frame;
    ``duration``: the audio's seconds (times are clipped to it); ``speech``: which input frames (``speech_seconds``
    apart, the feature frame shift) hold speech, to move word starts back to their sound (None: the CTC path's);
    ``offset_seconds``: where input frame 0 starts (:func:`corpus_io.infer.decode.input_frame_offset_seconds`:
    -7.5 ms for 25/10 ms frames without snip_edges, whose frames are centred on every shift), added to every time."""
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
        words = sound_bounds(words, speech, speech_seconds)
    if offset_seconds:
        tokens, words = shifted(tokens, offset_seconds, limit), shifted(words, offset_seconds, limit)
    conf = sum(w.confidence for w in words) / len(words) if words else _unit(
        sum(t.confidence for t in tokens) / len(tokens))
    return Timed(tokens, words, _unit(conf))


def shifted(spans: list[Span], seconds: float, limit: float) -> list[Span]:
    """``spans`` moved by ``seconds`` (frame times to audio times), kept inside ``[0, limit]``."""
    def at(x: float) -> float:
        return round(min(max(0.0, x + seconds), limit), 3)

    return [replace(s, start=at(s.start), end=at(s.end)) for s in spans]


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


def sound_bounds(words: list[Span], speech: torch.Tensor, step: float) -> list[Span]:
    """Each word's start and end moved from its tokens' CTC frames to its sound, by the speech frames (``step``
    seconds apart) between it and its neighbours (module doc: *Word bounds*)."""
    flags = speech.tolist()
    n = len(flags)
    if not words or not any(flags):
        return words
    pause = max(1, int(round(PAUSE_SECONDS / step)))
    back = int(round(ONSET_BACK_SECONDS / step))
    forward = int(round(END_FORWARD_SECONDS / step))
    on, off = _sound(flags, step)
    # tokens before the sound's onset (or after its end) are moved to it, keeping their length and order
    ctc = [[min(n, int(round(w.start / step))), min(n, int(round(w.end / step)))] for w in words]
    for i, span in enumerate(ctc):
        floor = on if i == 0 else ctc[i - 1][1]
        if span[0] < floor:
            span[0], span[1] = floor, floor + max(1, span[1] - span[0])
    for i in range(len(ctc) - 1, -1, -1):
        ceiling = off if i == len(ctc) - 1 else ctc[i + 1][0]
        if ctc[i][1] > ceiling:
            ctc[i][0], ctc[i][1] = max(0, ceiling - max(1, ctc[i][1] - ctc[i][0])), ceiling
    starts = [s for s, _ in ctc]
    ends = [e for _, e in ctc]
    # before the first word: the sound's onset, or the end of the last pause before its first token
    quiet = _pauses(flags, 0, ctc[0][0], pause)
    starts[0] = max(on, quiet[-1][1] if quiet else 0, ctc[0][0] - back)
    for i in range(1, len(words)):  # between two words: a pause splits them, else the middle of the gap
        a, b = ctc[i - 1][1], ctc[i][0]
        if b <= a:  # adjacent tokens (or one token spelling both words): the CTC bound
            continue
        quiet = _pauses(flags, a, b, pause)
        first, last = (quiet[0][0], quiet[-1][1]) if quiet else ((a + b) // 2, (a + b) // 2)
        ends[i - 1] = min(first, a + forward)
        starts[i] = max(last, b - back)
    # after the last word: the sound's end, or the start of the first pause after its last token
    quiet = _pauses(flags, ctc[-1][1], n, pause)
    ends[-1] = min(off, quiet[0][0] if quiet else n, ctc[-1][1] + forward)
    out: list[Span] = []
    prev = 0
    for w, (s, e), start, end in zip(words, ctc, starts, ends):
        start = max(start, prev)
        if end <= start:  # tokens outside the sound (before it starts): the word keeps its CTC length from there
            end = start + max(1, e - s)
        end = min(end, n)
        start = min(start, end)
        out.append(Span(w.text, round(start * step, 3), round(end * step, 3), w.confidence))
        prev = end
    return out


def _sound(flags: list, step: float) -> tuple[int, int]:
    """The utterance's sound, ``(first frame, end)``: from its first speech frame to its last, without a sound
    shorter than :data:`EDGE_SECONDS` that touches the audio's start or end (within :data:`EDGE_GAP_SECONDS`) and
    is parted from the rest by a silence of :data:`EDGE_GAP_SECONDS` or more (the cut-off tail of a neighbouring
    utterance)."""
    edge, gap = int(round(EDGE_SECONDS / step)), max(1, int(round(EDGE_GAP_SECONDS / step)))
    speech = [i for i, f in enumerate(flags) if f]
    on, off = speech[0], speech[-1] + 1
    quiet = _pauses(flags, on, off, gap)
    if quiet and on < gap and quiet[0][0] - on < edge:
        on = quiet[0][1]
    quiet = _pauses(flags, on, off, gap)
    if quiet and len(flags) - off < gap and off - quiet[-1][1] < edge:
        off = quiet[-1][0]
    return on, off


def _pauses(flags: list, a: int, b: int, pause: int) -> list[tuple[int, int]]:
    """The runs of at least ``pause`` silent frames within frames ``[a, b)``, as ``(first, end)``."""
    runs, i = [], a
    while i < b:
        if flags[i]:
            i += 1
            continue
        j = i
        while j < b and not flags[j]:
            j += 1
        if j - i >= pause:
            runs.append((i, j))
        i = j
    return runs


def _unit(x: float) -> float:
    return float(min(1.0, max(0.0, x)))


__all__ = ["Span", "Timed", "align", "ctc_viterbi", "sound_bounds", "speech_frames", "token_frames",
           "windowed_token_frames"]
