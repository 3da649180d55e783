"""``corpus-io segment``: long recordings with one transcript each, cut into utterances.

Each recording goes through the model in ``chunk_seconds`` pieces and its whole transcript is aligned to it window by
window (:func:`corpus_io.infer.align.place_words`: the CTC Viterbi path of its tokens, bounded memory for an hour).
Its speech regions come from the audio itself (``++vad``, :mod:`corpus_io.audio.vad`), parted by pauses of at least
``phrase_pause_seconds``: cuts fall only there, never where the path's word times leave a gap (they run into pauses).
Then (:func:`cut`):

* each aligned word belongs to the region holding most of its time; one the path put in a pause is unaligned;
* an unaligned word takes its phrase (region) with it (reason ``in a phrase with an unaligned word``);
* a region no word is in, where the model hears a token, is untranscribed speech: it ends the segment and is
  skipped and counted; a region the model hears nothing in (a breath) ends nothing;
* a stretch of regions is ended by a left-out region or a pause over ``max_pause_seconds``, and cut at its longest
  pause until every piece lasts at most ``max_segment_seconds`` (a single longer region: between words);
* a segment spans its regions with ``padding_seconds`` each side, at most half the pause to the neighbouring speech
  and never past ``max_segment_seconds``;
* each segment is checked whole (:func:`unsaid_run`): a run of more than ``max_unsaid_words`` words its greedy
  path reads, its text lacks and the model is sure of (``sure_word_posterior``) fails it, and its words are
  unaligned;
* a recording with no text (``pseudo_label``): its transcription's words the model half heard in a pause are
  dropped (:func:`drop_read_in_pauses`).

Every transcript word lands in exactly one segment or in ``unaligned`` (``<recording> <word position> <word>
<reason>``); audio in no segment (silence, speech with no text) is counted as skipped in the summary.
Outputs (``output_dir``): ``wav.scp``, ``segments``, ``text``, ``utt2spk`` (a Kaldi dir that scp2jsonl and
pack-shards take), ``segments.jsonl`` (each segment's recording, start, end, text, score: the mean of its words',
and its least sure word's) and ``unaligned``.

``++num_jobs=N`` splits the recordings (in key order) into N contiguous shares, one a job (:mod:`corpus_io.jobs`):
job J writes those six files into ``output_dir/segment.part-J-of-N/`` and a part record; ``merge-jobs`` merges each
file of the parts in its one-job :data:`ORDER` into ``output_dir``, the bytes one job writes.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from corpus_io.errors import ConfigError, DataError
from corpus_io.storage.progress import Summary
from corpus_io.storage.sorting import jsonl_key, merge_sorted

SEGMENT_OUTPUTS = ("wav.scp", "segments", "text", "utt2spk", "segments.jsonl", "unaligned", "flagged")


@dataclass
class Segment:
    recording: str
    start: float
    end: float
    words: list  # [(position, Placed)]
    pseudo_label: bool = False  # its text is the checkpoint's transcription (the recording had none)

    @property
    def key(self) -> str:
        return f"{self.recording}-{int(round(self.start * 100)):07d}-{int(round(self.end * 100)):07d}"

    @property
    def text(self) -> str:
        return " ".join(p.word for _, p in self.words)


#: why a word that aligned is still left out: it is in one phrase (speech region) with an unaligned word
BESIDE = "in a phrase with an unaligned word"
#: why a word is unaligned: the path put it where the audio holds no speech (a pause)
IN_NO_SPEECH = "placed in a pause"
#: why a word is unaligned: its segment, checked whole, holds speech its text does not say
UNSAID = "in a segment with speech its text does not say"
#: why a pseudo-label word is left out: the model half heard it in a pause (not speech; it taints nothing)
READ_IN_PAUSE = "read into a pause, not sure"
#: where the model heard a word may lie this far from the speech region it belongs to (seconds: CTC emits late)
REGION_SLACK_SECONDS = 0.5
#: a region with no word is untranscribed speech when the model hears a token in it: blank's posterior below this
HEARD_BLANK_POSTERIOR = 0.5


@dataclass
class Cut:
    """One recording cut: its segments, and the speech regions no transcript word was placed in (seconds)."""

    segments: list
    untranscribed: list  # [(start, end)] of the regions skipped as speech with no text
    failed: int = 0  # segments that failed the whole-segment check


def region_of(p: Any, regions: list, slack: float = REGION_SLACK_SECONDS) -> int | None:
    """The index of the speech region word ``p`` belongs to: the one holding where the model heard it (the mean of its
    tokens' frames, weighted by their posteriors: :attr:`~corpus_io.infer.align.Placed.heard`; its span's middle
    without it), else the nearest within ``slack`` seconds (a CTC model often emits a phrase's last word in the
    pause after its sound, and its first before its sound); None: the word lies in a pause, far from any speech."""
    at = p.heard if p.heard is not None else (p.start + p.end) / 2
    best, distance = None, slack
    for k, (s, e) in enumerate(regions):
        d = max(s - at, at - e, 0.0)
        if d <= distance:
            best, distance = k, d
    return best


def taint(placed: list, where: list) -> set[int]:
    """The regions that may hold an unaligned word, so that their aligned words are left out with it: the model
    does not hear such a word where its path put it (a low score, no path, outside the token list, in a pause), so
    it may be anywhere from the region of the placed word before it in the text to that of the placed word after it
    (both included, with its own region and any between)."""
    placed_at = [where[i] if where[i] is not None and not p.reason else None for i, p in enumerate(placed)]
    read_in_pause = [p.reason == READ_IN_PAUSE for p in placed]
    before: list = []
    last = None
    for r in placed_at:
        before.append(last)
        last = r if r is not None else last
    tainted: set[int] = set()
    after = None
    for i in range(len(placed) - 1, -1, -1):
        if placed_at[i] is None and not read_in_pause[i]:
            ends = [r for r in (before[i], where[i], after) if r is not None]
            if ends:
                tainted.update(range(min(ends), max(ends) + 1))
        else:
            after = placed_at[i]
    return tainted


def cut(recording: str, placed: list, duration: float, regions: list, *, max_seconds: float, max_pause: float,
        padding: float, heard: list | None = None, check: Any = None) -> Cut:
    """The segments of one recording (module doc): ``placed``, its words; ``regions``, its speech regions (seconds,
    from :mod:`corpus_io.audio.vad`); ``heard[k]``: whether the model hears a token in region ``k`` (None: in
    every one); ``check(segment)``: whether a segment passes the whole-segment check (a failing one is bisected at
    its longest pause and each side checked again, down to one region, whose words are then left out). ``placed``
    gets the reasons of the words left out."""
    where = [region_of(p, regions) if p.start is not None else None for p in placed]
    for i, p in enumerate(placed):
        if p.start is not None and where[i] is None and not p.reason:
            p.reason = IN_NO_SPEECH
    tainted = taint(placed, where)
    words_in: list[list[int]] = [[] for _ in regions]
    for i, r in enumerate(where):
        if r is None:
            continue
        if r in tainted and not placed[i].reason:
            placed[i].reason = BESIDE
        if not placed[i].reason:
            words_in[r].append(i)
    runs_of: list[list[int]] = []  # region indices, each run a stretch segments may span
    current: list[int] = []
    untranscribed = []
    for k, (s, _) in enumerate(regions):
        if not words_in[k] and k not in tainted:
            if heard is None or heard[k]:
                untranscribed.append(regions[k])
            else:
                continue  # a breath, a click: not speech to the model, it ends nothing
        if not words_in[k] or (current and s - regions[current[-1]][1] > max_pause):
            if current:
                runs_of.append(current)
            current = []
        if words_in[k]:
            current.append(k)
    if current:
        runs_of.append(current)
    span = max(0.5 * max_seconds, max_seconds - 2 * padding)  # the speech's extent, so that with padding it fits
    segments, failed = [], 0
    def region_span(k: int) -> tuple[float, float]:
        return regions[k]

    def word_span(i: int) -> tuple[float, float]:
        return placed[i].start, placed[i].end

    todo = [group for run in runs_of for group in split_at_pauses(run, region_span, span)][::-1]
    while todo:
        group = todo.pop()
        words = [i for k in group for i in words_in[k]]
        long = regions[group[-1]][1] - regions[group[0]][0] > max_seconds  # one region: cut between words
        made = [bounded(recording, piece, placed, group, regions, duration, padding, max_seconds)
                for piece in (split_at_pauses(words, word_span, span) if long else [words])]
        if check is None or len(group) == 1:
            for seg in made:
                if check is None or check(seg):
                    segments.append(seg)
                    continue
                failed += 1
                for _, w in seg.words:
                    w.reason = UNSAID
        elif all(check(seg) for seg in made):
            segments += made
        else:  # which side of its longest pause holds the speech its text does not say: each checked alone
            j = longest_pause(group, region_span)
            todo += [group[j + 1:], group[: j + 1]]
    return Cut(segments, untranscribed, failed)


def longest_pause(items: list[int], span: Callable[[int], tuple[float, float]]) -> int:
    """The position in ``items`` (regions or words, ``span(item)``: its (start, end) in seconds) of the item after
    which the longest pause between them falls (of equal pauses, the one nearest the middle)."""
    gaps = [(span(items[j + 1])[0] - span(items[j])[1], -abs(2 * j + 2 - len(items)), j)
            for j in range(len(items) - 1)]
    return max(gaps)[2]


def split_at_pauses(run: list[int], span: Callable[[int], tuple[float, float]], max_seconds: float) -> list[list[int]]:
    """``run`` (regions or words, ``span(item)``: its (start, end) in seconds) cut at its longest pause until every
    piece lasts at most ``max_seconds`` (a single item longer than that stays whole)."""
    pieces, todo = [], [run]
    while todo:
        piece = todo.pop()
        if len(piece) == 1 or span(piece[-1])[1] - span(piece[0])[0] <= max_seconds:
            pieces.append(piece)
            continue
        j = longest_pause(piece, span)
        todo += [piece[j + 1:], piece[: j + 1]]
    return sorted(pieces)


def bounded(recording: str, piece: list[int], placed: list, group: list[int], regions: list, duration: float,
            padding: float, max_seconds: float) -> Segment:
    """The segment of words ``piece`` (of regions ``group``): its speech (the regions', or the words' when a long
    region was cut between words) with ``padding`` each side, at most half the pause to the neighbouring speech
    (another region, or the region's next word), and at most ``max_seconds`` long (the padding shrinks first)."""
    first, last = placed[piece[0]], placed[piece[-1]]
    lo, hi = regions[group[0]][0], regions[group[-1]][1]
    start, end = lo, hi  # the audio's pauses, not the path's word times (they run into the pauses)
    before = regions[group[0] - 1][1] if group[0] > 0 else None
    after = regions[group[-1] + 1][0] if group[-1] + 1 < len(regions) else None
    said = [p.start is not None and p.reason != READ_IN_PAUSE for p in placed]  # speech, aligned or not
    inner_before = [p.end for i, p in enumerate(placed[: piece[0]]) if said[i] and lo < p.end <= first.start]
    inner_after = [p.start for i, p in enumerate(placed[piece[-1] + 1:], piece[-1] + 1)
                   if said[i] and last.end <= p.start < hi]
    if inner_before:  # a long region cut between words: this piece starts after a word of it
        start, before = first.start, max(inner_before)
    if inner_after:
        end, after = last.end, min(inner_after)
    lower = 0.0 if before is None else (before + start) / 2
    upper = duration if after is None else (end + after) / 2
    pad = min(padding, max(0.0, (max_seconds - 0.01 - (end - start)) / 2))  # 0.01: the times' rounding
    s = min(start, max(lower, start - pad, 0.0))
    e = max(min(end, duration), min(upper, end + pad, duration))
    return Segment(recording, round(s, 2), round(e, 2), [(i, placed[i]) for i in piece])


def read_recordings(path: str, *, pseudo_label: bool = False) -> dict:
    """``{recording: record}`` of the input (a Kaldi dir or a JSONL), checked before anything runs: every
    transcript line has audio and every recording a non-empty transcript, and no recording is a segment.
    ``pseudo_label``: a recording with no transcript line (a Kaldi dir's) or an empty one is kept, marked
    ``pseudo_label`` (the checkpoint transcribes it)."""
    from corpus_io.tables.inputs import Skip, open_input

    inp = open_input(path)
    recs: dict = {}
    no_text: list = []
    for rec in inp.records():
        if isinstance(rec, Skip):
            if rec.reason == "missing transcript":
                no_text.append(rec.key)
                continue
            raise DataError(f"segment: {rec.where}: {rec.what}. Fix the line, or leave "
                            f"the recording out of {path}; nothing was written.")
        if rec.get("start") is not None or rec.get("end") is not None:
            raise DataError(f"segment: {rec.get('where') or path}: '{rec['key']}' is a segment of a recording (it "
                            f"has start/end); segment takes whole recordings with one transcript each (a Kaldi dir "
                            f"without a segments file). Nothing was written.")
        recs[str(rec["key"])] = rec
    if no_text and pseudo_label:
        from corpus_io.tables.kaldi import iter_table

        sources = {line.key: line.value for line in iter_table(str(Path(path) / "wav.scp"))}
        for key in no_text:
            recs[key] = {"key": key, "source": sources[key], "target": "", "pseudo_label": True}
        no_text = []
    if no_text:
        raise DataError(f"segment: {len(no_text)} recordings of {path} have no transcript line (e.g. "
                        f"'{no_text[0]}'), so none of their words could be placed. Add a line for each to the "
                        f"text (all the recording's words on one line), leave them out of wav.scp, or have the "
                        f"checkpoint transcribe them (++pseudo_label=true); nothing was written.")
    text_file = Path(path) / "text"
    if text_file.is_file():  # a Kaldi dir: a transcript line whose recording is not in wav.scp
        from corpus_io.tables.kaldi import iter_table

        orphans = [line.key for line in iter_table(str(text_file)) if line.key not in recs]
        if orphans:
            raise DataError(f"segment: {len(orphans)} transcript lines of {text_file} have no recording in "
                            f"{Path(path) / 'wav.scp'} (e.g. '{orphans[0]}'); their words would be lost. Add the "
                            f"recordings to wav.scp, or remove the lines; nothing was written.")
    if not recs:
        raise DataError(f"segment: {path} holds no recording; nothing was written.")
    empty = [k for k, r in recs.items() if not str(r.get("target") or "").strip()]
    if empty and pseudo_label:
        for key in empty:
            recs[key]["pseudo_label"] = True
        empty = []
    if empty:
        raise DataError(f"segment: {len(empty)} recordings of {path} have an empty transcript (e.g. '{empty[0]}'); "
                        f"segment cuts a recording by its text. Give each its words, leave it out, or have the "
                        f"checkpoint transcribe it (++pseudo_label=true); nothing was written.")
    return recs


def check_spoken_in_time(recs: dict, tokenizer: Any, frame_seconds: float, path: str, checkpoint: str, *,
                         allow_pipe: bool = False) -> dict:
    """Each recording's :class:`~corpus_io.infer.align.Transcript`, checked before the model runs: the token list
    spells most of it, and the audio (its header's length) has frames enough for its tokens."""
    from corpus_io.audio.io import probe
    from corpus_io.infer.align import transcript

    out = {}
    for key, rec in recs.items():
        tr = transcript(str(rec["target"]), tokenizer)
        if len(tr.outside) * 2 > len(tr.words):
            word = tr.words[next(iter(tr.outside))]
            raise DataError(f"segment: the token list of ++checkpoint={checkpoint} cannot spell {len(tr.outside)} of "
                            f"the {len(tr.words)} words of recording '{key}' ({path}; e.g. '{word}': "
                            f"{' '.join(tr.outside[next(iter(tr.outside))])} not in it). Segment with a checkpoint "
                            f"trained on this language and script; nothing was written.")
        try:
            seconds = probe(str(rec["source"]), allow_pipe=allow_pipe).duration
        except (DataError, OSError, RuntimeError) as exc:
            raise DataError(f"segment: recording '{key}' ({rec['source']}) cannot be read: {exc}. Nothing was "
                            f"written.") from None
        if tr.min_frames() * frame_seconds > seconds:
            raise DataError(f"segment: recording '{key}' lasts {seconds:.2f} s but its transcript is "
                            f"{tr.min_frames()} tokens, which need at least {tr.min_frames() * frame_seconds:.2f} s "
                            f"(one {frame_seconds * 1000:.0f} ms model frame each): the text is longer than the "
                            f"audio can hold (another recording's text, or a cut recording?). Fix the pair in "
                            f"{path}; nothing was written.")
        out[key] = tr
    return out


def refuse_overwrites(cfg: Any) -> None:
    from corpus_io.storage.files import refuse_overwriting_inputs, refuse_remote_output
    from corpus_io.tables.inputs import resolve_input

    refuse_remote_output(cfg.output_dir, "++output_dir", "segment")
    out = Path(cfg.output_dir)
    typed = resolve_input(cfg.input)
    inputs = [("++checkpoint", cfg.checkpoint), ("++input", cfg.input),
              *((f"++input's {Path(f).name}", f) for f in typed.files)]
    if Path(cfg.input).is_dir():
        inputs += [(f"++input's {name}", str(Path(cfg.input) / name))
                   for name in ("wav.scp", "text", "segments", "utt2spk", "spk2utt")]
        if out.resolve() == Path(cfg.input).resolve():
            raise ConfigError(f"++output_dir={out} is ++input, the recordings' Kaldi dir: segment would replace its "
                              f"wav.scp and text with the segments'. Give segment its own directory, e.g. "
                              f"++output_dir={out.parent / (out.name + '_segmented')}.")
    refuse_overwriting_inputs([(f"++output_dir's {name}", out / name) for name in SEGMENT_OUTPUTS], inputs)
    refuse_others_files(out, "++output_dir's ", f"Give segment its own directory, e.g. "
                                                f"++output_dir={out.parent / (out.name + '_segmented')}")


#: the name segment's outputs are recorded under (storage/files.py record_written): the files segment may replace
WRITER = "segment"


def refuse_others_files(out: Path, label: str, way_out: str) -> None:
    """Before any work: segment (and the merge of its jobs) replaces only its own outputs in ``out`` (another Kaldi
    dir's ``wav.scp`` and ``text``, a hand-edited ``segments``: refused, naming the file as ``label`` + its name)."""
    from corpus_io.storage.files import refuse_replacing_others

    refuse_replacing_others([(label + name, out / name) for name in SEGMENT_OUTPUTS], WRITER,
                            way_out=f"{way_out}; if the file is an earlier segment's output you mean to replace, "
                                    f"delete it first.")


def segment(cfg: Any) -> dict:
    """``corpus-io segment`` (module doc). With ``++num_jobs=N`` (N > 1) this is job J of N
    (:mod:`corpus_io.jobs.parts`): it segments its contiguous share of the recordings (in key order) into the six
    files of ``output_dir/segment.part-J-of-N/`` plus a part record; ``merge-jobs ++path=<output_dir>`` joins the
    parts into the bytes one job writes. Returns the run's figures (:func:`figures_line`)."""
    from corpus_io.config import require
    from corpus_io.jobs import parts as jobs

    require(cfg, "input", "checkpoint", "output_dir")
    job = jobs.job_of(cfg)
    refuse_overwrites(cfg)
    recs = read_recordings(cfg.input, pseudo_label=cfg.pseudo_label)  # before torch: a bad input costs a second
    place = jobs.Place(str(cfg.output_dir), TAG, True)
    fp, done = jobs.started(place, job, lambda: fingerprint(cfg))
    if done is not None:
        print(f"segment {job}: already complete ({done.where})", flush=True)
        return done.data["figures"]
    keys = sorted(recs)  # the units of the jobs: recordings in key order, job J a contiguous range
    lo, hi = job.span(len(keys))
    mine = {k: recs[k] for k in keys[lo:hi]}
    t_start = time.perf_counter()
    segments, unaligned, figures = run(cfg, mine, whole=len(mine) == len(recs))
    out = Path(cfg.output_dir) if job.single else place.data(job)
    write_outputs(out, segments, mine, unaligned, final=job.single, min_confidence=cfg.min_confidence)
    figures["wall"] = round(time.perf_counter() - t_start, 3)
    if not job.single:
        outputs = [jobs.output_entry(out / name, place.directory) for name in SEGMENT_OUTPUTS]
        summary = Summary(what="segments", kept=figures["segments"], seconds=figures["kept"],
                          skipped=Counter(figures["unaligned"]))
        jobs.write_part(place, jobs.Part(TAG, place.tag, job.count, job.index, fp, [lo, hi], len(keys), outputs,
                                         {"keys": list(mine), "summary": jobs.summary_data(summary),
                                          "figures": figures}))
    report("segment" if job.single else f"segment {job}", figures, out)
    return figures


#: the part records' tag (jobs.Place)
TAG = "segment"


def _first_field(line: str) -> str:
    return line.split(" ", 1)[0]




def _word_place(line: str) -> tuple[str, int]:
    recording, position = line.split(" ", 2)[:2]
    return recording, int(position)


#: the one-job order of each output file (the sort key of a line), which merge_parts keeps: a segment's files by
#: segment key, wav.scp by recording, unaligned by recording and word position
ORDER = {"wav.scp": _first_field, "segments": _first_field, "text": _first_field, "utt2spk": _first_field,
         "segments.jsonl": jsonl_key, "unaligned": _word_place, "flagged": _first_field}


def fingerprint(cfg: Any) -> str:
    """The options' and inputs' digest that the parts of one run share: the input's tables (or JSONL), the
    checkpoint's bytes, every key that changes what is written (not the device, nor the loader's workers)."""
    from corpus_io.audio.vad import detector
    from corpus_io.config import to_dict
    from corpus_io.infer.foreign import checkpoint_files
    from corpus_io.jobs import parts as jobs
    from corpus_io.tables.inputs import resolve_input

    files = list(resolve_input(cfg.input).files) or [cfg.input]
    conf = {k: v for k, v in to_dict(cfg.dataset_conf).items() if k not in ("num_workers", "prefetch")}
    options = [cfg.max_segment_seconds, cfg.max_pause_seconds, cfg.padding_seconds, cfg.min_word_score,
               cfg.phrase_pause_seconds, cfg.window_seconds, cfg.chunk_seconds, detector(cfg.vad),
               cfg.max_unsaid_words, cfg.sure_word_posterior,
               cfg.pseudo_label, cfg.min_confidence, to_dict(cfg.text_rule)]
    return jobs.fingerprint([TAG, jobs.files_digest(files), jobs.files_digest(checkpoint_files(cfg.checkpoint)),
                             options, conf])


def run(cfg: Any, recs: dict, *, whole: bool) -> tuple[list[Segment], list[tuple[str, int, str]], dict]:
    """The segments of ``recs`` (all the input's when ``whole``, else a job's share, read from a JSONL of them),
    the unaligned words ``(recording, position, "<word> <reason>")`` and the figures of :func:`figures_line`."""
    import tempfile

    from corpus_io.infer.align import columns_for, load, narrowed, passes, place_words, transcript, window_frames

    segments: list[Segment] = []
    unaligned: list[tuple[str, int, str]] = []
    reasons: Counter = Counter()
    audio = 0.0
    words = failed = 0
    untranscribed: list[float] = []
    if recs:  # a job past the recordings loads no model
        m = load(cfg.checkpoint, cfg.device, cfg.dataset_conf, cfg.text_rule)
        pseudo = {k for k, r in recs.items() if r.get("pseudo_label")}
        transcripts = check_spoken_in_time({k: r for k, r in recs.items() if k not in pseudo}, m.tokenizer,
                                           m.frame_seconds, cfg.input, cfg.checkpoint,
                                           allow_pipe=cfg.dataset_conf.allow_pipe)
        window = window_frames(cfg.window_seconds, m.frame_seconds)
        done: set = set()
        blank_id = m.tokenizer.blank_id
        vocabulary = list(range(m.tokenizer.vocab_size))  # a recording with no text: its transcription's search

        def columns(key: str, _text: str) -> list[int]:
            return vocabulary if key in pseudo else columns_for(transcripts[key], blank_id)

        with tempfile.TemporaryDirectory(prefix="segment-job-") as tmp:
            data_list = cfg.input if whole and not pseudo else job_list(recs, Path(tmp) / "recordings.jsonl")
            for p in passes(m, data_list, chunk_seconds=cfg.chunk_seconds, desc="segment", total=len(recs),
                            columns=columns):
                if p.key in pseudo:
                    transcripts[p.key] = transcript(greedy_text(p.log_probs, p.columns, blank_id, m.tokenizer),
                                                    m.tokenizer)
                tr, blank = narrowed(transcripts[p.key], p.columns, blank_id)
                duration = p.duration if p.duration is not None else p.log_probs.shape[0] * m.frame_seconds
                placed = place_words(p.log_probs, tr, frame_seconds=m.frame_seconds, duration=duration,
                                     blank=blank, speech=p.word_speech, speech_seconds=p.speech_seconds,
                                     window=window, min_word_score=cfg.min_word_score, offset_seconds=p.word_offset,
                                     free_ends=True)
                regions = speech_regions(cfg, recs[p.key], p, duration)
                if p.key in pseudo:
                    drop_read_in_pauses(placed, regions, cfg.sure_word_posterior)
                def passes_check(seg: Segment, p: Any = p) -> bool:
                    return unsaid_run(p.log_probs, p.columns, blank_id, m.tokenizer, seg, m.frame_seconds,
                                      p.word_offset, sure=cfg.sure_word_posterior) <= cfg.max_unsaid_words

                got = cut(p.key, placed, duration, regions, max_seconds=cfg.max_segment_seconds,
                          max_pause=cfg.max_pause_seconds, padding=cfg.padding_seconds,
                          heard=heard(p.log_probs, blank, regions, m.frame_seconds, p.word_offset),
                          check=passes_check)
                for seg in got.segments:
                    seg.pseudo_label = p.key in pseudo
                segments += got.segments
                failed += got.failed
                untranscribed += [e - s for s, e in got.untranscribed]
                for i, w in enumerate(placed):
                    if w.reason:
                        unaligned.append((p.key, i, f"{w.word} {w.reason}"))
                        reasons[w.reason.split(" (")[0]] += 1
                audio += duration
                done.add(p.key)
        for key in sorted(set(recs) - done - pseudo):  # a recording the loader could not read: its words unaligned
            for i, word in enumerate(transcripts[key].words):
                unaligned.append((key, i, f"{word} recording not read"))
                reasons["recording not read"] += 1
        words = sum(len(t.words) for t in transcripts.values())
    kept = round(sum(s.end - s.start for s in segments), 3)
    pseudo_labelled = sum(bool(r.get("pseudo_label")) for r in recs.values())
    from corpus_io.audio.vad import detector

    return segments, unaligned, {"recordings": len(recs), "vad": detector(cfg.vad), "pseudo_labelled": pseudo_labelled,
                                 "audio": round(audio, 3), "segments": len(segments), "kept": kept, "words": words,
                                 "in_segments": sum(len(s.words) for s in segments),
                                 "unaligned": dict(sorted(reasons.items())), "failed_segments": failed,
                                 "untranscribed": round(sum(untranscribed), 3),
                                 "untranscribed_regions": len(untranscribed)}


def drop_read_in_pauses(placed: list, regions: list, sure: float) -> None:
    """A pseudo-label's words the model heard in a pause (outside every speech region) and is less than ``sure`` of
    get the reason :data:`READ_IN_PAUSE`: a small model half hears a word into the silence before an utterance,
    which no one said (on the smoke model, every word so heard was such an insertion)."""
    for w in placed:
        if w.heard is not None and not w.reason and w.score < sure and \
                not any(s <= w.heard <= e for s, e in regions):
            w.reason = READ_IN_PAUSE


def greedy_text(log_probs: Any, columns: list | None, blank: int, tokenizer: Any) -> str:
    """The checkpoint's transcription of a recording with no text: its greedy CTC path (each frame's best token,
    repeats merged, blanks dropped), as decode's greedy method reads it."""
    return tokenizer.decode([t for t, _ in greedy_tokens(log_probs, columns, blank)])


def greedy_tokens(log_probs: Any, columns: list | None, blank: int) -> list[list]:
    """The tokens of the greedy CTC path (each frame's best, repeats merged, blanks dropped; ``columns`` maps
    ``log_probs``' columns to token ids), each as ``[token id, its peak posterior over its frames]``."""
    best = log_probs.argmax(dim=-1)
    peak = log_probs.gather(1, best[:, None])[:, 0].exp().tolist()
    best = best.tolist()
    ids = best if columns is None else [columns[c] for c in best]
    tokens: list[list] = []
    for k, t in enumerate(ids):
        if t == blank:
            continue
        if k and ids[k - 1] == t:
            tokens[-1][1] = max(tokens[-1][1], peak[k])
        else:
            tokens.append([t, peak[k]])
    return tokens


def speech_regions(cfg: Any, rec: dict, p: Any, duration: float) -> list[tuple[float, float]]:
    """Recording ``rec``'s speech regions (seconds, :mod:`corpus_io.audio.vad`) by ``++vad``: ``energy`` from the
    pass's fbank speech frames, ``silero`` from its audio, read again (commands only with ``allow_pipe``)."""
    from corpus_io.audio import vad

    pause = cfg.phrase_pause_seconds
    if vad.detector(cfg.vad) == "silero":
        from corpus_io.audio.io import decode_bytes, read_source_bytes, to_mono

        data = read_source_bytes(str(rec["source"]), allow_pipe=cfg.dataset_conf.allow_pipe)
        wave, rate = decode_bytes(data, where=str(rec["source"]))
        return vad.silero_regions(to_mono(wave), rate, pause)
    if p.speech is None:
        raise ConfigError("++vad=energy reads the pauses from the model's fbank features, and this checkpoint takes "
                          "other features: segment with ++vad=silero (pip install -e '.[vad]').")
    shift = p.frame_offset
    return [(max(0.0, s + shift), min(duration, e + shift))
            for s, e in vad.regions_from_frames(p.speech.tolist(), p.speech_seconds, pause)]


def frame_range(start: float, end: float, frame_seconds: float, offset: float, frames: int) -> range:
    """The model output frames of ``[start, end)`` seconds (frame ``t`` starts at ``t * frame_seconds + offset``)."""
    import math

    lo = max(0, int((start - offset) / frame_seconds))
    return range(lo, min(frames, max(lo + 1, math.ceil((end - offset) / frame_seconds))))


def heard(log_probs: Any, blank: int, regions: list, frame_seconds: float, offset: float) -> list[bool]:
    """Whether the model hears a token in each region: a frame where blank's posterior is below
    :data:`HEARD_BLANK_POSTERIOR` (a breath or a click is speech to an energy detector, not to the model)."""
    import math

    blank_lp = log_probs[:, blank].float()
    bound = math.log(HEARD_BLANK_POSTERIOR)
    out = []
    for s, e in regions:
        r = frame_range(s, e, frame_seconds, offset, blank_lp.shape[0])
        out.append(bool((blank_lp[r.start:r.stop] < bound).any()))
    return out


def unsaid_run(log_probs: Any, columns: list | None, blank: int, tokenizer: Any, seg: Segment,
               frame_seconds: float, offset: float, *, sure: float) -> int:
    """The segment checked whole: the longest run of words its greedy path (over the kept columns: the
    transcript's tokens and blank) reads that its text lacks, by an edit alignment of the two word sequences:
    speech inside the segment that its text does not say (a word missing from the transcript, the speech a
    transcript that ran out left to the path). Only words the model is ``sure`` of count (each token's peak
    posterior over its frames at least that; :func:`greedy_words`): a small model reads a word it half hears into
    an utterance's onset, which is no speech left out."""
    import kaldialign

    r = frame_range(seg.start, seg.end, frame_seconds, offset, log_probs.shape[0])
    words, sureness = greedy_words(log_probs[r.start:r.stop], columns, blank, tokenizer)
    run = longest = 0
    hyp = iter(sureness)
    for ref, word in kaldialign.align([p.word for _, p in seg.words], words, "<eps>"):
        heard = next(hyp) if word != "<eps>" else 0.0
        if ref != "<eps>":
            run = 0
        elif heard >= sure:
            run += 1
            longest = max(longest, run)
    return longest


def greedy_words(log_probs: Any, columns: list | None, blank: int, tokenizer: Any) -> tuple[list[str], list[float]]:
    """The words of :func:`greedy_text`, each with how sure the model is of it: the least of its tokens' peak
    posteriors (over the frames the greedy path gives the token)."""
    from corpus_io.decoding.scoring import word_units

    tokens = greedy_tokens(log_probs, columns, blank)
    words = word_units(tokenizer.decode([t for t, _ in tokens]))
    sureness = [1.0] * len(words)
    for i in range(len(tokens)):  # the word a token ends up in: the word count of the text up to it
        w = len(word_units(tokenizer.decode([t for t, _ in tokens[: i + 1]]))) - 1
        if 0 <= w < len(words):
            sureness[w] = min(sureness[w], tokens[i][1])
    return words, sureness


def job_list(recs: dict, path: Path) -> str:
    """A JSONL of a job's recordings (the input's records as read), what its loader reads."""
    with open(path, "w", encoding="utf-8") as f:
        for rec in recs.values():
            f.write(json.dumps({k: v for k, v in rec.items() if k != "where"}, ensure_ascii=False) + "\n")
    return str(path)


def write_outputs(out: Path, segments: list[Segment], recs: dict, unaligned: list[tuple[str, int, str]], *,
                  final: bool = True, min_confidence: float = 0.0) -> None:
    """The files of :data:`SEGMENT_OUTPUTS` in ``out``, each to a temp name then renamed, in the :data:`ORDER`
    that merge_parts keeps. ``final`` (not a job's part): each is recorded as segment's (:data:`WRITER`)."""
    from corpus_io.storage.files import atomic_write, ensure_dir, record_written

    ensure_dir(out, what="output_dir")
    segments = sorted(segments, key=lambda s: s.key)
    used = sorted({s.recording for s in segments})
    with atomic_write(out / "wav.scp") as f:
        f.write("".join(f"{r} {recs[r]['source']}\n" for r in used))
    with atomic_write(out / "segments") as f:
        f.write("".join(f"{s.key} {s.recording} {s.start:.2f} {s.end:.2f}\n" for s in segments))
    with atomic_write(out / "text") as f:
        f.write("".join(f"{s.key} {s.text}\n" for s in segments))
    with atomic_write(out / "utt2spk") as f:
        f.write("".join(f"{s.key} {recs[s.recording].get('speaker') or s.recording}\n" for s in segments))
    flagged = []
    with atomic_write(out / "segments.jsonl") as f:
        for s in segments:
            scores = [w.score for _, w in s.words]
            row = {"key": s.key, "recording": s.recording, "start": s.start, "end": s.end, "text": s.text,
                   "words": len(s.words), "first_word": s.words[0][0], "score": round(sum(scores) / len(scores), 4),
                   "min_word_score": round(min(scores), 4)}
            if s.pseudo_label:
                row["pseudo_label"] = True
                if row["score"] < min_confidence:
                    flagged.append(f"{s.key} pseudo-label confidence {row['score']} below min_confidence "
                                   f"{min_confidence}\n")
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with atomic_write(out / "flagged") as f:
        f.write("".join(flagged))
    with atomic_write(out / "unaligned") as f:
        f.write("".join(f"{r} {i} {rest}\n" for r, i, rest in sorted(unaligned, key=lambda u: u[:2])))
    for name in SEGMENT_OUTPUTS if final else ():
        record_written(out / name, WRITER)


def figures_line(figures: dict) -> str:
    """The closing line's figures: recordings and hours, speed, segments, skipped audio, words placed."""
    audio, wall, kept = figures["audio"], figures["wall"], figures["kept"]
    unaligned = sum(figures["unaligned"].values())
    by_reason = ", ".join(f"{r}: {n}" for r, n in sorted(figures["unaligned"].items())) or "none"
    pseudo = figures.get("pseudo_labelled", 0)
    return (f"{figures['recordings']} recordings ({audio / 3600:.3f} h"
            f"{f', {pseudo} with no text, transcribed by the checkpoint' if pseudo else ''}) in {wall:.1f} s "
            f"({audio / max(wall, 1e-9):.1f} audio s/s); {figures['segments']} segments ({kept / 3600:.3f} h, "
            f"skipped audio {max(0.0, audio - kept):.1f} s, of it untranscribed speech "
            f"{figures.get('untranscribed', 0.0):.1f} s in {figures.get('untranscribed_regions', 0)} stretches); "
            f"{figures.get('failed_segments', 0)} segments failed the whole-segment check; pauses by the "
            f"{figures.get('vad', 'energy')} detector; "
            f"{figures['words']} transcript words: "
            f"{figures['in_segments']} in segments, {unaligned} unaligned ({by_reason})")


def report(what: str, figures: dict, out: Path) -> None:
    print(f"{what}: {figures_line(figures)}")
    print(f"{what}: Kaldi dir -> {out} (wav.scp, segments, text, utt2spk), scores -> {out / 'segments.jsonl'}, "
          f"unaligned words -> {out / 'unaligned'}, pseudo-labels below min_confidence -> {out / 'flagged'}",
          flush=True)


# --------------------------------------------------------------------------- merge-jobs


def part_keys(data: dict) -> list[str]:
    """The recordings of a segment part (merge-jobs refuses a recording two parts hold)."""
    return data["keys"]


FIGURES = ("recordings", "segments", "words", "in_segments", "failed_segments", "untranscribed_regions")


def check_part(part: Any) -> None:
    """merge-jobs: a segment record's recordings (keys, as many as its span), its figures and its six files, in
    :data:`SEGMENT_OUTPUTS` order inside its part directory (:class:`corpus_io.jobs.parts.RecordProblem` on the first
    field that cannot be trusted)."""
    from corpus_io.jobs import parts as jobs

    data = part.data
    keys = jobs.of_type(data.get("keys"), "data.keys", list, "a list")
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not key or " " in key:
            raise jobs.bad(f"data.keys[{i}]", key, "not a recording key")
    if len(keys) != part.span[1] - part.span[0]:
        raise jobs.bad("data.keys", f"{len(keys)} recordings", f"but its span {part.span} holds "
                                                               f"{part.span[1] - part.span[0]}")
    figures = jobs.of_type(data.get("figures"), "data.figures", dict, "a JSON object")
    for name in FIGURES:
        jobs.whole(figures.get(name), f"data.figures.{name}")
    for name in ("audio", "kept", "wall", "untranscribed"):
        jobs.seconds(figures.get(name), f"data.figures.{name}")
    for reason, n in jobs.of_type(figures.get("unaligned"), "data.figures.unaligned", dict, "a JSON object").items():
        jobs.whole(n, f"data.figures.unaligned[{reason!r}]")
    folder = Path(part.where).name[: -len(".json")]  # the job's directory beside its record
    want = [f"{folder}/{name}" for name in SEGMENT_OUTPUTS]
    if [out.get("file") for out in part.outputs] != want:
        raise jobs.bad("outputs", [out.get("file") for out in part.outputs], f"but a segment job writes {want}")


def merge_parts(place: Any, parts: list) -> dict:
    """``merge-jobs`` of segment: each of the parts' files merged in its :data:`ORDER` (every part's is in it) into
    ``output_dir``, the bytes one job writes; the figures summed."""
    import tempfile

    from corpus_io.storage.files import atomic_write, record_written

    out = Path(place.path)
    refuse_others_files(out, "the merged ", "Run the segment jobs into a directory of their own")
    for k, name in enumerate(SEGMENT_OUTPUTS):
        with atomic_write(out / name) as f, tempfile.TemporaryDirectory(prefix=".segment-merge-", dir=out) as tmp:
            merge_sorted([Path(p.where).parent / p.outputs[k]["file"] for p in parts], ORDER[name], f, Path(tmp))
        record_written(out / name, WRITER)
    figures: dict = {"unaligned": Counter()}
    walls = []
    for p in parts:
        got = p.payload()["figures"]  # read again from its record when load_parts let it go: once a part
        walls.append(got["wall"])
        for key, value in got.items():
            if key == "vad":  # the detector's name (the parts share the fingerprint that holds it)
                figures[key] = value
                continue
            figures[key] = figures.get(key, 0) + (Counter(value) if key == "unaligned" else value)
    figures["unaligned"] = dict(sorted(figures["unaligned"].items()))
    figures["wall"] = max(walls)  # the jobs ran side by side
    report(f"segment (merged {len(parts)} jobs)", figures, out)
    return figures


__all__ = ["Segment", "cut", "merge_parts", "segment"]
