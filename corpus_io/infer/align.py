"""``corpus-io align``: known transcripts force-aligned with a trained CTC checkpoint, words with times and scores.

Each utterance goes through the model as decode runs it (:func:`corpus_io.infer.decode.forward_batches`: a long one in
``chunk_seconds`` pieces), and its *reference* tokens, not a search's hypothesis, are aligned to the CTC
log-probabilities by the Viterbi path (:mod:`corpus_io.decoding.align`: ``torchaudio.functional.forced_align`` when
the utterance fits one window; longer ones window by window, :func:`~corpus_io.decoding.align.windowed_token_frames`,
in bounded memory). Only the log-probs of the transcript's tokens and blank are kept, piece by piece
(:func:`columns_for`, :func:`narrowed`): an hour of a 5,000-token model's whole vocabulary would be 1.8 GB. Word
bounds move from the tokens' frames to the words' sound, then by where input frame 0 starts (-7.5 ms for frames
centred on every shift, ``snip_edges=false``, the default), as decode's word times do.

A word is *unaligned*, reported with its reason and never placed, when

* its tokens are not in the checkpoint's token list (``tokens outside the token list``), a special token written
  in the transcript (``<blank>``, ``<unk>``, ``<sos/eos>``) included;
* the path ran out of frames before it (``no path``: more tokens than the audio's frames, or text after the end of
  the speech that the windows never reached);
* its score, the least of its tokens' mean aligned-frame posteriors, is below ``min_word_score`` (``score below
  min_word_score``: not spoken, or not what the model hears).

:func:`transcript` and :func:`place_words` are what ``corpus-io segment`` (:mod:`corpus_io.infer.segment`) shares.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from corpus_io.errors import ConfigError, DataError

OUTSIDE = "tokens outside the token list"
NO_PATH = "no path"
LOW_SCORE = "score below min_word_score"


@dataclass
class Transcript:
    """A transcript's words and the token ids they are spelled with: ``members[w]``, the indices in ``ids`` of word
    ``w``'s tokens (empty for a word the token list cannot spell: ``outside[w]`` names its tokens); a separator
    token between words (a letters tokenizer's ``▁``) belongs to no word."""

    words: list[str]
    ids: list[int] = field(default_factory=list)
    members: list[list[int]] = field(default_factory=list)
    outside: dict = field(default_factory=dict)

    @property
    def word_starts(self) -> list[int]:
        return [m[0] for m in self.members if m]

    def min_frames(self) -> int:
        """The fewest CTC frames that can hold the tokens: one each, and a blank between two equal ones."""
        return len(self.ids) + sum(a == b for a, b in zip(self.ids, self.ids[1:]))


def transcript(text: str, tokenizer: Any) -> Transcript:
    """``text``'s words (as scoring counts them: :func:`corpus_io.decoding.scoring.word_units` of the normalized
    text) each tokenized alone, so that every token belongs to one word."""
    from corpus_io.decoding.scoring import word_units

    words = word_units(tokenizer.normalize(text))
    out = Transcript(words)
    pair = tokenizer.tokenize("a b")
    sep = tokenizer.ids.get(pair[1]) if len(pair) == 3 else None
    for i, word in enumerate(words):
        tokens = tokenizer.tokenize(word)
        ids = [tokenizer.token_id(t) for t in tokens]
        missing = [t for t, k in zip(tokens, ids) if k is None]
        if missing or not tokens:
            out.outside[i] = missing or [word]
            out.members.append([])
            continue
        if sep is not None and out.ids:
            out.ids.append(sep)
        out.members.append(list(range(len(out.ids), len(out.ids) + len(tokens))))
        out.ids.extend(ids)
    return out


def columns_for(tr: Transcript, blank: int) -> list[int]:
    """The token ids whose log-probs aligning ``tr`` reads: its tokens' and blank's (sorted; the rest of the
    vocabulary is never on its path, and :func:`corpus_io.infer.decode.forward_batches` need not keep it)."""
    return sorted(set(tr.ids) | {blank})


def narrowed(tr: Transcript, columns: list[int] | None, blank: int) -> tuple[Transcript, int]:
    """``tr`` and ``blank`` with their token ids as column indices of log-probs that kept only ``columns`` (the
    token id of each column; None: every column, ids unchanged)."""
    from dataclasses import replace

    if columns is None:
        return tr, blank
    at: dict = {}
    for i, token in enumerate(columns):
        at.setdefault(token, i)
    return replace(tr, ids=[at[t] for t in tr.ids]), at[blank]


@dataclass
class Placed:
    """A transcript word: its start and end (seconds from the audio's start; None when it has no path) and score;
    ``reason``: why it is unaligned (empty: aligned); ``heard``: where the model heard it (seconds, :func:`heard_frame`;
    None: no path)."""

    word: str
    start: float | None
    end: float | None
    score: float
    reason: str = ""
    heard: float | None = None


def place_words(log_probs: Any, tr: Transcript, *, frame_seconds: float, duration: float | None, blank: int,
                speech: Any = None, speech_seconds: float = 0.01, window: int, min_word_score: float,
                offset_seconds: float = 0.0, free_ends: bool = False) -> list[Placed]:
    """Every word of ``tr`` placed on the Viterbi path of its tokens through ``log_probs`` (T, V), or unaligned
    with its reason (module doc). ``offset_seconds``: where input frame 0 starts, added to every time as decode's
    word times (:func:`corpus_io.decoding.align.shifted`; :attr:`Pass.frame_offset`, -7.5 ms without snip_edges).
    ``free_ends``: the text may start after the audio does and end before it (segment: a transcript that runs out is
    not stretched over speech it does not say; :func:`corpus_io.decoding.align.ctc_viterbi`'s ``free_audio``)."""
    from corpus_io.decoding.align import Span, ctc_viterbi, shifted, sound_bounds, token_frames, windowed_token_frames

    lp = log_probs.detach().float().cpu()
    frames: list[list[int] | None] | None = None
    if lp.shape[0] <= window and tr.min_frames() <= lp.shape[0]:
        try:
            frames = ctc_viterbi(lp, tr.ids, blank, free_audio=(True, True)) if free_ends else \
                list(token_frames(lp, tr.ids, blank))
        except (ValueError, RuntimeError):  # no single path: the windows' free end reports what does not fit
            frames = None
    if frames is None:
        frames = windowed_token_frames(lp, tr.ids, tr.word_starts, blank, window=window, free_audio=free_ends)
    limit = duration if duration is not None else lp.shape[0] * frame_seconds
    placed: list[Placed] = []
    spans: list[Span] = []  # the words with a path, in order, for their sound bounds
    owners: list[int] = []
    for w, word in enumerate(tr.words):
        members = tr.members[w]
        if not members:
            placed.append(Placed(word, None, None, 0.0, f"{OUTSIDE} ({' '.join(tr.outside[w])})"))
            continue
        fr = [frames[k] for k in members]
        if any(f is None for f in fr):
            placed.append(Placed(word, None, None, 0.0, NO_PATH))
            continue
        posteriors = [lp[f, tr.ids[k]].exp().tolist() for k, f in zip(members, fr)]  # each token's, its frames'
        score = min(sum(q) / len(q) for q in posteriors)
        start, end = min(fr[0][0] * frame_seconds, limit), min((fr[-1][-1] + 1) * frame_seconds, limit)
        heard = min(limit, (heard_frame(fr, posteriors) + 0.5) * frame_seconds + offset_seconds)
        placed.append(Placed(word, round(start, 3), round(end, 3), float(min(1.0, max(0.0, score))),
                             heard=round(max(0.0, heard), 3)))
        spans.append(Span(word, start, end, score))
        owners.append(w)
    if speech is not None and spans:
        spans = sound_bounds(spans, speech, speech_seconds)
    if offset_seconds and spans:
        spans = shifted(spans, offset_seconds, limit)
    for w, span in zip(owners, spans):
        placed[w].start, placed[w].end = round(span.start, 3), round(span.end, 3)
    for p in placed:
        if not p.reason and p.score < min_word_score:
            p.reason = LOW_SCORE
    return placed


def heard_frame(frames: list[list[int]], posteriors: list[list[float]]) -> float:
    """The frame where a word's tokens were heard: the mean of their frames on the path (``frames[k]``: token k's),
    each weighted by its token's posterior there (``posteriors[k]``, frame by frame). A token the model cannot hear
    (a cut-off first word) is put by the path wherever it costs least, often deep in the pause beside the word; the
    tokens it does hear say where the word is. Plain mean when the model hears none of them."""
    spikes = [(f, q) for fr, qs in zip(frames, posteriors) for f, q in zip(fr, qs)]
    weight = sum(w for _, w in spikes)
    if weight < 1e-3:
        return sum(f for f, _ in spikes) / len(spikes)
    return sum(f * w for f, w in spikes) / weight


@dataclass
class Pass:
    """One utterance (or recording) through the model: its key, transcript as read, CTC log-probabilities (T, V),
    audio seconds, speech frames, for a raw segment ``[recording id, start]``, and where its input frame 0 starts."""

    key: str
    text: str
    log_probs: Any
    duration: float | None
    speech: Any
    speech_seconds: float
    segment: Any = None
    frame_offset: float = 0.0  # seconds where input frame 0 starts (decode.input_frame_offset_seconds)
    columns: list | None = None  # the token id of each column of log_probs (None: the whole vocabulary)
    own_rule: bool = True  # corpus-io's word-time rule; False: another toolkit's model (its Viterbi path alone)

    @property
    def word_speech(self) -> Any:
        """The speech frames word starts move to (corpus-io's own models only)."""
        return self.speech if self.own_rule else None

    @property
    def word_offset(self) -> float:
        """Where input frame 0 starts, for word times (0 for another toolkit's model: its frames start at 0)."""
        return self.frame_offset if self.own_rule else 0.0


@dataclass
class Model:
    """A checkpoint loaded for alignment: the model, tokenizer, eval dataset_conf, device and frame seconds."""

    model: Any
    tokenizer: Any
    conf: Any
    device: Any
    frame_seconds: float


def load(checkpoint: str, device_name: str, dataset_conf: Any, text_rule: Any = None) -> Model:
    from corpus_io.infer.decode import decode_dataset_conf, decode_device, load_model, output_frame_seconds
    from corpus_io.infer.exported import is_exported
    from corpus_io.infer.foreign import foreign_kind

    if is_exported(checkpoint) and not foreign_kind(checkpoint):
        raise ConfigError(f"++checkpoint={checkpoint} is an exported file; align and segment need the PyTorch "
                          f"checkpoint of corpus-io train (model.pt, model.pt.ep{{E}} or model.pt.avg{{N}}).")
    device = decode_device(device_name)
    model, tokenizer, tcfg = load_model(checkpoint, device, text_rule)
    conf = decode_dataset_conf(dataset_conf, tcfg.dataset_conf)
    conf.batch_size = 1
    return Model(model, tokenizer, conf, device, output_frame_seconds(model, conf))


def passes(m: Model, data_list: str, *, chunk_seconds: float, desc: str, loader_out: list | None = None,
           total: int | None = None, columns: Any = None) -> Iterator[Pass]:
    """Every utterance of ``data_list`` through the model (with progress: ``total`` batches, when known), one
    :class:`Pass` each. ``loader_out``: the loader is appended to it (its counts, afterwards). ``columns(key,
    text)``: the token ids each utterance's log-probs keep (:func:`columns_for`; :attr:`Pass.columns`)."""
    from corpus_io.infer.decode import forward_batches
    from corpus_io.loader.dataset import build_dataloader

    loader = build_dataloader(data_list, m.conf, m.tokenizer, train=False, rank=0, world_size=1)
    if loader_out is not None:
        loader_out.append(loader)
    for fw in forward_batches(loader, m.model, m.tokenizer, m.conf, m.device, desc=desc, speech=True,
                              chunk_seconds=chunk_seconds, total=total, columns=columns):
        lengths = fw.lengths.tolist()
        for i, key in enumerate(fw.keys):
            yield Pass(str(key), fw.refs[i], fw.log_probs[i, : int(lengths[i])],
                       fw.durations[i] if i < len(fw.durations) else None,
                       fw.speech[i] if fw.speech is not None else None, fw.speech_seconds,
                       fw.segments[i] if fw.segments is not None else None, fw.frame_offset,
                       fw.columns[i] if fw.columns is not None else None, fw.own_rule)


def window_frames(window_seconds: float, frame_seconds: float) -> int:
    return max(8, int(round(window_seconds / frame_seconds)))


ALIGN_OUTPUTS = ("ctm", "alignment.jsonl", "unaligned")
#: the name align's outputs are recorded under (storage/files.py record_written): the files align may replace
WRITER = "align"


def align(cfg: Any) -> dict:
    """``corpus-io align``: write ``ctm``, ``alignment.jsonl`` and ``unaligned`` to ``cfg.output_dir``."""
    from collections import Counter

    from corpus_io.config import require
    from corpus_io.infer.decode import (
        check_repeated_keys,
        ctm_line,
        list_references,
        loader_dropped,
        refuse_overwrites,
    )
    from corpus_io.storage.files import atomic_write, ensure_dir

    require(cfg, "data_list", "checkpoint", "output_dir")
    refuse_overwrites(cfg, ALIGN_OUTPUTS, "align")
    m = load(cfg.checkpoint, cfg.device, cfg.dataset_conf, cfg.text_rule)
    check_repeated_keys(cfg.data_list, cfg.dataset_conf, "align")
    window = window_frames(cfg.window_seconds, m.frame_seconds)
    out = ensure_dir(cfg.output_dir, what="output_dir")
    reasons: Counter = Counter()
    words = aligned = utts = 0
    audio = 0.0
    seen: set = set()
    first_outside = ""
    loaders: list = []
    t_start = time.perf_counter()
    with atomic_write(out / "ctm", owner=WRITER) as ctm, atomic_write(out / "alignment.jsonl", owner=WRITER) as rows, \
            atomic_write(out / "unaligned", owner=WRITER) as missing:
        pending: dict = {}  # key -> its transcript, tokenized once for its columns and its alignment

        def columns(key: str, text: str) -> list[int]:
            pending[key] = transcript(text, m.tokenizer)
            return columns_for(pending[key], m.tokenizer.blank_id)

        for p in passes(m, cfg.data_list, chunk_seconds=cfg.chunk_seconds, desc="align", loader_out=loaders,
                        columns=columns):
            tr = pending.pop(p.key)  # asked for its columns when its batch went through the model
            ids, blank = narrowed(tr, p.columns, m.tokenizer.blank_id)
            placed = place_words(p.log_probs, ids, frame_seconds=m.frame_seconds, duration=p.duration,
                                 blank=blank, speech=p.word_speech, speech_seconds=p.speech_seconds,
                                 window=window, min_word_score=cfg.min_word_score, offset_seconds=p.word_offset)
            name, offset = (str(p.segment[0]), float(p.segment[1])) if p.segment else (p.key, 0.0)
            rec: dict = {"key": p.key, "text": p.text}
            if p.segment:
                rec.update(recording=name, offset=offset)
            good = [w for w in placed if not w.reason]
            rec["score"] = round(sum(w.score for w in good) / len(good), 4) if good else 0.0
            rec["words"] = []
            for i, w in enumerate(placed):
                row: dict = {"word": w.word, "start": None, "end": None, "score": round(w.score, 4)}
                if not w.reason:
                    row.update(start=round(w.start + offset, 3), end=round(w.end + offset, 3))
                    ctm.write(ctm_line(p.key, name, w.start + offset, w.end - w.start, w.word, w.score))
                else:
                    row["reason"] = w.reason
                    missing.write(f"{p.key} {i} {w.word} {w.reason}\n")
                    reasons[w.reason.split(" (")[0]] += 1
                    first_outside = first_outside or (w.word if w.reason.startswith(OUTSIDE) else "")
                rec["words"].append(row)
            rows.write(json.dumps(rec, ensure_ascii=False) + "\n")
            seen.add(p.key)
            utts += 1
            words += len(placed)
            aligned += len(good)
            audio += p.duration or 0.0
        unread: list = []
        lost = 0
        if loaders and loader_dropped(loaders[0]):  # what the loader could not read is reported, word by word
            shards: dict = {}
            for key, text in list_references(cfg.data_list, m.conf, unread, shards):
                if key in seen:
                    continue
                seen.add(key)
                lost += 1
                for i, word in enumerate(transcript(text, m.tokenizer).words):
                    missing.write(f"{key} {i} {word} utterance not read\n")
                    reasons["utterance not read"] += 1
                    words += 1
            lost += sum(n or 0 for n in shards.values())  # a shard's utterances whose keys not even its index has
        if utts == 0:
            raise DataError(f"align read 0 utterances from {cfg.data_list}; nothing was written. Check the list, "
                            f"its paths and dataset_conf.data_type (raw: a JSONL or Kaldi dir; shard: a data.list).")
        if aligned == 0 and reasons.get(OUTSIDE, 0) >= words - reasons.get("utterance not read", 0):
            raise DataError(f"align: the token list of ++checkpoint={cfg.checkpoint} spells none of the words of "
                            f"{cfg.data_list} (e.g. '{first_outside}'); nothing was written. Align with a "
                            f"checkpoint trained on this language and script (its tokenizer.token_list).")
    wall = time.perf_counter() - t_start
    by_reason = ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items())) or "none"
    print(f"align: {utts} utterances ({audio / 3600:.3f} h) in {wall:.1f} s ({audio / max(wall, 1e-9):.1f} audio s/s); "
          f"{words} words, {aligned} aligned, {words - aligned} unaligned ({by_reason})"
          + (f"; {lost} utterances not read ({'; '.join(unread[:2]) or 'loader filters'})" if lost else ""))
    print(f"align: word times -> {out / 'ctm'}, words and scores -> {out / 'alignment.jsonl'}, "
          f"unaligned words -> {out / 'unaligned'}")
    return {"utts": utts, "words": words, "aligned": aligned, "unaligned": dict(reasons), "audio": audio,
            "wall": wall}


__all__ = ["Placed", "Transcript", "align", "columns_for", "narrowed", "place_words", "transcript"]
