"""``corpus-io score``: find wrong labels with a model. Every utterance of a list goes through the model once
(decode's loader and :func:`~corpus_io.infer.decode.forward_batches`); each gets its figures:

* ``duration`` (seconds), ``chars`` and ``tokens`` of its label, ``chars_per_second``, ``tokens_per_second``;
* ``cer``/``wer`` (and their error counts) of the greedy hypothesis against the label
  (:mod:`corpus_io.decoding.scoring`, as decode scores);
* ``loss_per_frame``/``loss_per_token``: the label's CTC loss (``-log P(label | audio)``, every alignment summed:
  :func:`corpus_io.decoding.beam.ctc_scores`) per output frame and per label token;
* ``alignable``: whether CTC can place the label in the frames at all (a token per frame, a blank between two
  equal tokens: ``tokens + repeats <= frames``); ``unknown``: label tokens outside the checkpoint's token list.

An utterance is flagged by absolute rules (a label that cannot be aligned, is empty, or holds unknown tokens; audio
that could not be read) and by thresholds: each ``++max_*``/``++min_*`` key, or when it is null, one taken from the
data itself: the median plus (minus) ``++deviations`` robust deviations (1.4826 x the median absolute deviation,
or 1.2533 x the mean absolute deviation when that is 0; the losses' of their logarithms), so a few percent of wrong
labels do not move it.

Outputs in ``++output_dir``: ``scores.jsonl`` (a row per utterance of the input, in key order: ``key``, the
figures, ``flagged``, ``reasons``, the label and the hypothesis), ``flagged`` (``<key> <reason>; <reason>`` a line:
``++exclude_keys`` of pack-shards and make-datalist takes it as it is) and ``summary.txt`` (counts, thresholds).

Memory is flat in the list's length: nothing of an utterance is held for the run. The search streams
(:func:`~corpus_io.infer.decode.run_search` with ``rows``): each utterance's row is made as its batch is searched
(its label's measures held for that batch only) and written, unsorted, to a file in ``output_dir``, which is sorted on
disk by key (:func:`~corpus_io.infer.decode.sorted_rows`: at most 100,000 lines in memory; a key read twice kept
once, its last row, and named); the utterances the loader could not read are joined on disk too. The thresholds come
from each figure's bounded :class:`Sketch`, a second pass flags, and the check that the checkpoint can spell the
labels keeps counts (:class:`Spelling`). ``++num_jobs=N``: each job writes its rows and sketches, and ``merge-jobs``
flags them all (:func:`score`, :func:`merge_parts`).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from corpus_io.errors import ConfigError, DataError
from corpus_io.infer.list_jobs import ListJob, list_job
from corpus_io.storage.progress import Summary

OUTPUTS = ("scores.jsonl", "flagged", "summary.txt")
#: the name score's outputs are recorded under (storage/files.py record_written): the files score may replace
WRITER = "score"

#: the figures with thresholds: (figure, side) -> the key that sets it; "max": flagged above, "min": below
LIMITS = (("cer", "max"), ("wer", "max"), ("loss_per_token", "max"), ("loss_per_frame", "max"),
          ("chars_per_second", "min"), ("chars_per_second", "max"), ("tokens_per_second", "min"),
          ("tokens_per_second", "max"))

#: the figures whose data thresholds are held between ``++<figure>_floor`` and ``++<figure>_ceiling``
BOUNDED = ("cer", "wer", "loss_per_token", "loss_per_frame")

#: the share of the robust deviation's estimate: 1 / the normal's 0.75 quantile (MAD), sqrt(pi / 2) (mean AD)
MAD_SCALE, MEAN_AD_SCALE = 1.4826, 1.2533


def score(cfg: Any) -> dict:
    """Score ``cfg.data_list`` with ``cfg.checkpoint``; write scores.jsonl, flagged and summary.txt. With
    ``++num_jobs=N`` (N > 1) this is job J of N (:mod:`corpus_io.jobs.parts`): it scores its contiguous share of
    the list's entries (a raw list's lines, a shard list's shards) into ``output_dir/score.part-J-of-N/rows.jsonl``
    (its rows, in key order, not flagged) and a part record holding each figure's :class:`Sketch`;
    ``merge-jobs ++path=<output_dir>`` takes the thresholds from the merged sketches and flags in one pass over the
    parts' rows: the bytes one job writes."""
    from corpus_io.jobs import parts as jobs

    job = jobs.job_of(cfg)
    refuse_outputs(cfg)  # first: before torch is imported or anything is read
    ran = list_job(cfg, job, TAG, lambda: fingerprint(cfg), lambda data_list, out, job: score_list(
        cfg, data_list, out, job=job), empty_job)
    if not isinstance(ran, ListJob):
        return ran
    place, folder, result, fp, (lo, hi), total = ran.place, ran.folder, ran.result, ran.fingerprint, ran.span, ran.total
    out = Path(cfg.output_dir)
    result["wall_seconds"] = round(result["wall_seconds"], 3)
    outputs = [jobs.output_entry(folder / "rows.jsonl", place.directory)]
    summary = Summary(what="utterances", kept=result["readable"], seconds=result["audio_seconds"])
    jobs.write_part(place, jobs.Part(TAG, place.tag, job.count, job.index, fp, [lo, hi], total, outputs,
                                     {"keys": result.pop("keys"), "summary": jobs.summary_data(summary),
                                      "sketches": result.pop("sketches"), "run": result.pop("run"),
                                      "options": {k: getattr(cfg, k) for k in MERGE_OPTIONS}, "result": result}))
    print(f"score {job}: {result['rows']} utterances ({result['readable']} scored) -> {folder / 'rows.jsonl'}; "
          f"merge-jobs ++path={out} flags them when all {job.count} are done", flush=True)
    return result


#: the part records' tag (jobs.Place)
TAG = "score"
#: the keys merge-jobs needs to flag and summarize (kept in each part record)
MERGE_OPTIONS = ("data_list", "checkpoint", "deviations", "min_errors",
                 *(f"{side}_{figure}" for figure, side in LIMITS),
                 *(f"{figure}_{end}" for figure in BOUNDED for end in ("floor", "ceiling")),
                 "max_median_cer", "max_cer_spread")


def fingerprint(cfg: Any) -> str:
    """The options' and inputs' digest the parts of one run share: the list's bytes, the checkpoint's, every key
    that changes a row or a threshold (not the device, nor the loader's workers)."""
    from corpus_io.config import to_dict
    from corpus_io.infer.foreign import checkpoint_files
    from corpus_io.jobs import parts as jobs
    from corpus_io.tables.inputs import resolve_input

    files = list(resolve_input(cfg.data_list).files) or [cfg.data_list]
    conf = {k: v for k, v in to_dict(cfg.dataset_conf).items() if k not in ("num_workers", "prefetch")}
    options = [cfg.chunk_seconds, cfg.max_unknown_share, *(getattr(cfg, k) for k in MERGE_OPTIONS[2:]),
               to_dict(cfg.text_rule)]
    return jobs.fingerprint([TAG, jobs.files_digest(files), jobs.files_digest(checkpoint_files(cfg.checkpoint)),
                             options, conf])


def empty_job(folder: Path) -> dict:
    """A job past the list's entries: an empty rows file, no model loaded."""
    from corpus_io.storage.files import ensure_dir

    ensure_dir(folder, what="output_dir")
    (folder / "rows.jsonl").write_bytes(b"")
    return {"rows": 0, "readable": 0, "audio_seconds": 0.0, "wall_seconds": 0.0, "keys": [],
            "sketches": {f: Sketch().to_json() for f in FIGURE_NAMES},
            "run": {"audio": 0.0, "repeats": {}, "unread": [], "unread_shards": {}, "skipped": "none",
                    "repeated": {}}}


#: the figures with thresholds, each once
FIGURE_NAMES = tuple(dict.fromkeys(f for f, _ in LIMITS))


def score_list(cfg: Any, data_list: str, out: Path, *, job: Any = None) -> dict:
    """Score ``data_list``: the whole run's outputs in ``out``, or with ``job`` a job's rows (not flagged) into
    ``out/rows.jsonl`` and what its part record keeps. Nothing of an utterance is held for the run: its row is made
    as its batch is searched (:func:`run_search` with ``rows``) and goes to a file, which is sorted on disk by key
    (a repeated key kept once, its last row: :func:`~corpus_io.infer.decode.sorted_rows`); the utterances the loader
    could not read are joined on disk too (:func:`~corpus_io.infer.decode.missing_rows`)."""
    from corpus_io.infer.decode import (
        check_repeated_keys,
        decode_dataset_conf,
        decode_device,
        forward_batches,
        list_references,
        load_model,
        loader_dropped,
        missing_rows,
        run_search,
        skipped_summary,
        sorted_rows,
    )
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.storage.files import atomic_write
    from corpus_io.storage.sorting import jsonl_key, merge_sorted

    require_utterances(data_list, cfg.dataset_conf)
    device = decode_device(cfg.device)
    model, tokenizer, tcfg = load_model(cfg.checkpoint, device, cfg.text_rule)
    repeats = check_repeated_keys(data_list, cfg.dataset_conf, "score")
    conf = decode_dataset_conf(cfg.dataset_conf, tcfg.dataset_conf)
    loader = build_dataloader(data_list, conf, tokenizer, train=False, rank=0, world_size=1)
    measured: dict[str, dict] = {}  # the batch being searched: label_losses clears it as it measures the next
    spelling = Spelling()
    batches = forward_batches(loader, model, tokenizer, conf, device, desc="score", chunk_seconds=cfg.chunk_seconds)
    with made_dir(out), tempfile.TemporaryDirectory(prefix=".score-rows-", dir=out) as work:
        tmp = Path(work)
        with open(tmp / "spill.jsonl", "w", encoding="utf-8") as f:
            run = run_search(None, label_losses(batches, tokenizer, measured, spelling, cfg), tokenizer, Greedy(),
                             where=data_list, skipped=skipped_summary(loader), command="score", nbest=1,
                             rows=lambda row: f.write(json.dumps(scored_row(row, measured[row["key"]]),
                                                                 ensure_ascii=False) + "\n"))
        spell_check(spelling, cfg)
        with open(tmp / "read.jsonl", "w", encoding="utf-8") as f:
            run.decoded = sorted_rows(tmp / "spill.jsonl", f, run, tmp)
        (tmp / "spill.jsonl").unlink()
        with open(tmp / "unread.jsonl", "w", encoding="utf-8") as f:
            missing_rows(tmp / "read.jsonl", list_references(data_list, conf, run.unread, run.unread_shards)
                         if loader_dropped(loader) else iter(()), f, tmp,
                         lambda ref: unread_row(ref["key"], ref["ref"], run.skipped))
        with open(tmp / "rows.jsonl", "w", encoding="utf-8", newline="") as f:
            merge_sorted([tmp / "read.jsonl", tmp / "unread.jsonl"], jsonl_key, f, tmp)
        rows = tmp / "rows.jsonl"
        if job is not None:
            keys: list[str] = []
            with atomic_write(out / "rows.jsonl") as f:
                sketches = write_rows(f, (keys.append(r["key"]) or r for r in read_rows(rows)))
            return {"rows": len(keys), "readable": run.decoded, "audio_seconds": run.audio, "wall_seconds": run.wall_s,
                    "keys": keys, "sketches": {f: sk.to_json() for f, sk in sketches.items()},
                    "run": {"audio": run.audio, "repeats": run.repeats, "unread": run.unread,
                            "unread_shards": run.unread_shards, "skipped": run.skipped, "repeated": repeats}}
        # the thresholds need only each figure's bounded sketch; flagging is a second pass over the file
        return finish(out, read_rows(rows), sketches_of(read_rows(rows)), run, cfg, repeats)


@contextmanager
def made_dir(out: Path) -> Iterator[Path]:
    """``out`` made (when missing) for a run's files; when the run fails, a directory made here is removed again
    if it is empty (bad input writes nothing, not even the directory)."""
    from corpus_io.storage.files import ensure_dir

    existed = out.is_dir()
    ensure_dir(out, what="output_dir")
    try:
        yield out
    except BaseException:
        if not existed:
            with suppress(OSError):
                out.rmdir()
        raise


def finish(out: Path, rows: Iterable[dict], sketches: dict, run: Any, cfg: Any, repeats: dict | None) -> dict:
    """Thresholds from ``sketches``, then ``rows`` (key order) flagged and written; the summary printed."""
    limits = limits_of(sketches, cfg)
    warning = judgement_of(sketches["cer"], cfg)
    summary, counts = write_scores(out, rows, limits, run, cfg, warning, repeats)
    print(summary.rstrip())
    if warning:
        print(warning, file=sys.stderr, flush=True)
    print(f"score: a row per utterance -> {out / 'scores.jsonl'}, flagged keys -> {out / 'flagged'} (to leave "
          f"them out: pack-shards or make-datalist ++exclude_keys={out / 'flagged'})")
    return {"utts": counts["total"], "flagged": counts["flagged"], "unreadable": counts["total"] - counts["readable"],
            "thresholds": limits, "audio_seconds": run.audio, "wall_seconds": run.wall_s}


def write_rows(f: Any, rows: Iterable[dict]) -> dict:
    """``rows`` (not flagged yet) a JSON line each into the open file ``f``; returns each thresholded figure's
    :class:`Sketch` of the rows that count (readable, alignable)."""
    def written(rows: Iterable[dict]) -> Iterator[dict]:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            yield row

    return sketches_of(written(rows))


def sketches_of(rows: Iterable[dict], names: Iterable[str] = FIGURE_NAMES) -> dict:
    """Each figure of ``names``' :class:`Sketch` of the ``rows`` that count (readable, alignable)."""
    sketches = {figure: Sketch() for figure in names}
    for row in rows:
        counted(row, sketches)
    return sketches


def counted(row: dict, sketches: dict) -> None:
    """Add ``row``'s figures to ``sketches`` when it counts for the thresholds (readable, alignable)."""
    if row.get("readable") and row["alignable"]:
        for figure, sketch in sketches.items():
            if row[figure] is not None:
                sketch.add(row[figure])


def read_rows(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def loss_ceilings(cfg: Any) -> dict:
    """The losses above which a label its hypothesis equals is still flagged: their ceilings."""
    return {f: getattr(cfg, f"{f}_ceiling") for f in ("loss_per_token", "loss_per_frame")}


def check_bounds(cfg: Any) -> None:
    """A floor above its ceiling is a ConfigError: no threshold could be between them."""
    for figure in BOUNDED:
        floor, ceiling = getattr(cfg, f"{figure}_floor"), getattr(cfg, f"{figure}_ceiling")
        if floor > ceiling:
            raise ConfigError(f"++{figure}_floor={floor:g} is above ++{figure}_ceiling={ceiling:g}: a {figure} "
                              f"threshold taken from the data is held between the two. Lower the floor or raise "
                              f"the ceiling. Nothing was written.")


def refuse_outputs(cfg: Any) -> None:
    """Before loading anything: an ``output_dir`` that is a URL, that holds the list (its inputs), or whose outputs
    would replace an input (the list, its index, the checkpoint) is a ConfigError."""
    import os

    from corpus_io.config import require
    from corpus_io.infer.decode import refuse_others_outputs
    from corpus_io.model.cmvn import loader_inputs
    from corpus_io.storage.files import refuse_overwriting_inputs, refuse_remote_output
    from corpus_io.storage.urls import is_remote

    require(cfg, "data_list", "checkpoint", "output_dir")
    check_bounds(cfg)
    refuse_remote_output(cfg.output_dir, "++output_dir", "score")
    out = Path(cfg.output_dir)
    inputs = [*loader_inputs(cfg.data_list, cfg.dataset_conf), ("++checkpoint", cfg.checkpoint)]
    if not is_remote(str(cfg.data_list)):
        listed = os.path.abspath(cfg.data_list)
        holder = listed if os.path.isdir(listed) else os.path.dirname(listed)
        if os.path.realpath(out) == os.path.realpath(holder):
            raise ConfigError(f"++output_dir={out} holds the input ++data_list={cfg.data_list}: score's "
                              f"scores.jsonl, flagged and summary.txt would sit among the data they judge (and a "
                              f"Kaldi dir's tables or a list's shards would be mixed with them). Give score its "
                              f"own directory, e.g. ++output_dir=exp/score_train.")
    refuse_overwriting_inputs([(f"++output_dir's {name}", out / name) for name in OUTPUTS], inputs)
    refuse_others_outputs(out, OUTPUTS, WRITER)


class Greedy:
    """The best path of each utterance's CTC outputs (decode's greedy method, without its options): the search
    :func:`corpus_io.infer.decode.run_search` runs for score."""

    context = None
    hotwords: list = []

    def __call__(self, log_probs: Any, lengths: Any, encoder: Any = None) -> list:
        from corpus_io.decoding.beam import Hyp, best_path_ids

        return [[Hyp(ids, 0.0, 0.0)] for ids in best_path_ids(log_probs, lengths)]


def require_utterances(data_list: str, dataset_conf: Any) -> None:
    """A list with no utterance (a raw list without a line, a shard list without a shard) is a DataError before the
    model is loaded."""
    if dataset_conf.data_type == "raw":
        from corpus_io.loader.rawlist import RawList

        if len(RawList(data_list)):
            return
        what = "no utterance"
    else:
        from corpus_io.shards.index import read_datalist

        if read_datalist(data_list, storage_options=dataset_conf.storage_options or None):
            return
        what = "no shard"
    raise DataError(f"score: ++data_list={data_list} holds {what}: there is nothing to score, and nothing was "
                    f"written. Give the list of the utterances to score (a shard data.list, or a raw list with "
                    f"++dataset_conf.data_type=raw).")


def label_losses(batches: Iterable[Any], tokenizer: Any, measured: dict, spelling: Spelling,
                 cfg: Any) -> Iterator[Any]:
    """Pass the model's batches on, measuring each utterance's label on the way: its CTC loss, frames, tokens,
    whether it can be aligned and its unknown tokens (into ``measured`` by key: the batch passed on, cleared as the
    next is measured, so it never holds more than a batch) and ``spelling``'s counts (:func:`spell_check`d once
    :data:`SPELL_CHECK_AFTER` utterances are in)."""
    from corpus_io.decoding.beam import ctc_scores

    checked = False
    for fw in batches:
        log_probs = fw.log_probs.float() if hasattr(fw.log_probs, "float") else fw.log_probs
        scores = ctc_scores(log_probs, fw.lengths, list(range(len(fw.keys))), fw.targets).tolist()
        frames = fw.lengths.tolist()
        measured.clear()
        for i, key in enumerate(fw.keys):
            ids = fw.targets[i]
            m = measured[str(key)] = {
                "duration": fw.durations[i] if i < len(fw.durations) else None, "frames": int(frames[i]),
                "tokens": len(ids), "needed_frames": len(ids) + sum(a == b for a, b in zip(ids, ids[1:])),
                "loss": -float(scores[i]), "unknown": unknown_tokens(tokenizer, fw.refs[i], ids)}
            spelling.add(str(key), m["unknown"])
        if not checked and spelling.read >= SPELL_CHECK_AFTER:
            spell_check(spelling, cfg)
            checked = True
        yield fw


def unknown_tokens(tokenizer: Any, text: str, ids: list) -> list:
    """The label's tokens outside the token list (they became ``<unk>``), as text where the tokenizer can say."""
    count = sum(1 for i in ids if i == tokenizer.unk_id)
    if not count:
        return []
    if hasattr(tokenizer, "token_id") and hasattr(tokenizer, "tokenize"):
        named = [t for t in tokenizer.tokenize(text) if tokenizer.token_id(t) is None]
        if named:
            return named
    return ["<unk>"] * count


#: utterances seen before a checkpoint that cannot spell most labels stops the run (the first batches)
SPELL_CHECK_AFTER = 64


@dataclass
class Spelling:
    """What :func:`spell_check` needs of the utterances measured so far, counted rather than kept: how many were
    read, how many hold tokens the token list lacks, the first of those (key, its tokens) and the distinct tokens
    (as many as the labels' alphabet, not the list)."""

    read: int = 0
    bad: int = 0
    first: tuple | None = None
    tokens: set = field(default_factory=set)

    def add(self, key: str, unknown: list) -> None:
        self.read += 1
        if unknown:
            self.bad += 1
            self.first = self.first or (key, unknown)
            self.tokens.update(unknown)


def spell_check(spelling: Spelling, cfg: Any) -> None:
    """A ConfigError when more than ``cfg.max_unknown_share`` of the utterances hold tokens the checkpoint's token
    list lacks: its tokens cannot spell these labels (another language or token list), and nothing it says about
    them means anything. Checked on the first ``SPELL_CHECK_AFTER`` utterances and at the end."""
    if not spelling.read or spelling.bad <= cfg.max_unknown_share * spelling.read:
        return
    examples = sorted(spelling.tokens)
    key, tokens = spelling.first
    raise ConfigError(f"checkpoint {cfg.checkpoint}'s token list cannot spell the labels of {cfg.data_list}: "
                      f"{spelling.bad} of the {spelling.read} utterances read so far hold tokens it lacks (e.g. "
                      f"'{key}': {', '.join(repr(t) for t in tokens[:5])}; in all {len(examples)} distinct, "
                      f"{', '.join(repr(t) for t in examples[:10])}). Score with a checkpoint trained on this "
                      f"language and tokenization (tokenizer.type, latin_unit), or raise ++max_unknown_share="
                      f"{cfg.max_unknown_share} to flag such utterances instead. Nothing was written.")


def unread_row(key: str, text: str, skipped: str) -> dict:
    """The row of an utterance of the list the loader did not give (``skipped``: its counts)."""
    return {"key": key, "text": text, "readable": False, "error": f"not read (loader: {skipped})"}


def scored_row(result: dict, m: dict) -> dict:
    """An utterance's figures from its search result (:func:`~corpus_io.infer.decode.result_row`: key, reference,
    best hypothesis) and its label's measures ``m`` (:func:`label_losses`)."""
    from corpus_io.decoding.scoring import char_units, edit_counts, normalize, word_units

    key, ref, hyp = result["key"], result["ref"], result["nbest"][0][0]
    said, heard = normalize(ref), normalize(hyp)  # as decode's Scorer scores, without keeping its lines
    c, w = edit_counts(char_units(said), char_units(heard)), edit_counts(word_units(said), word_units(heard))
    duration = m["duration"] or 0.0
    chars = len(char_units(said))
    return {
        "key": key, "readable": True, "duration": round(duration, 3), "frames": m["frames"],
        "chars": chars, "tokens": m["tokens"],
        "chars_per_second": _ratio(chars, duration), "tokens_per_second": _ratio(m["tokens"], duration),
        "cer": _ratio(c.errors, c.ref, 4, empty=float(c.errors > 0)), "char_errors": c.errors,
        "wer": _ratio(w.errors, w.ref, 4, empty=float(w.errors > 0)), "word_errors": w.errors,
        "loss_per_frame": _ratio(m["loss"], m["frames"], 4), "loss_per_token": _ratio(m["loss"], m["tokens"], 4),
        "alignable": m["needed_frames"] <= m["frames"], "needed_frames": m["needed_frames"],
        "unknown": m["unknown"], "text": ref, "hyp": hyp}


def _ratio(num: float, den: float, digits: int = 3, *, empty: float | None = None) -> float | None:
    """``num / den`` rounded; None where it is not a number (no denominator, an infinite loss), ``empty`` when
    the denominator is 0 and ``empty`` is given."""
    if not den:
        return empty
    value = num / den
    return round(value, digits) if math.isfinite(value) else None


#: a figure's values kept exactly up to this many (its thresholds then are those of all its values); past it, a
#: histogram of fixed log-spaced bins (relative width 0.5 %): memory flat in the list's size, and the same counts
#: whether one job saw the values or N jobs did and merged
EXACT_VALUES = 200_000
#: the histogram's bins: BINS_PER_DECADE a decade from 10^LOWEST_DECADE; smaller values count as 0
BINS_PER_DECADE, LOWEST_DECADE = 460, -6


class Sketch:
    """A bounded, mergeable summary of one figure's values: every value while they are few, else a histogram
    (:data:`EXACT_VALUES`). ``robust_limit`` reads it."""

    def __init__(self, values: list | None = None, bins: dict | None = None, zeros: int = 0) -> None:
        self.values = list(values or []) if bins is None else None
        self.bins: dict[int, int] | None = None if bins is None else {int(b): int(n) for b, n in bins.items()}
        self.zeros = zeros

    def __len__(self) -> int:
        if self.bins is None:
            return len(self.values)
        return self.zeros + sum(self.bins.values())

    def add(self, value: float) -> None:
        if self.bins is None:
            self.values.append(value)
            if len(self.values) > EXACT_VALUES:
                self._to_bins()
        else:
            self._count(value)

    def _count(self, value: float) -> None:
        if value <= 10.0 ** LOWEST_DECADE:
            self.zeros += 1
        else:
            b = math.floor((math.log10(value) - LOWEST_DECADE) * BINS_PER_DECADE)
            self.bins[b] = self.bins.get(b, 0) + 1

    def _to_bins(self) -> None:
        values, self.values, self.bins = self.values, None, {}
        for v in values:
            self._count(v)

    def merge(self, other: Sketch) -> None:
        """Add ``other``'s values (the same as had they been added here, in any order)."""
        if self.bins is None and other.bins is None and len(self) + len(other) <= EXACT_VALUES:
            self.values.extend(other.values)
            return
        if self.bins is None:
            self._to_bins()
        if other.bins is None:
            for v in other.values:
                self._count(v)
        else:
            self.zeros += other.zeros
            for b, n in other.bins.items():
                self.bins[b] = self.bins.get(b, 0) + n

    def weighted(self) -> tuple:
        """``(values, counts)``: the values, or each bin's middle (geometric) and count."""
        if self.bins is None:
            return self.values, None
        items = sorted(self.bins.items())
        middles = [10.0 ** (LOWEST_DECADE + (b + 0.5) / BINS_PER_DECADE) for b, _ in items]
        return [0.0, *middles], [self.zeros, *(n for _, n in items)]

    def to_json(self) -> dict:
        if self.bins is None:
            return {"values": self.values}
        return {"zeros": self.zeros, "bins": {str(b): n for b, n in sorted(self.bins.items())}}

    @classmethod
    def from_json(cls, data: dict) -> Sketch:
        if "bins" in data:
            return cls(bins=data["bins"], zeros=data.get("zeros", 0))
        return cls(values=data["values"])


def robust_limit(values: Any, k: float, side: str, *, log: bool = False) -> float | None:
    """The median plus (``side`` max) or minus (min) ``k`` robust deviations of ``values`` (a list, or a
    :class:`Sketch`); None without values. ``log``: of the values' logarithms (a loss spreads over orders of
    magnitude: a right label's is 0.02 or 0.4), the limit turned back into a value."""
    import numpy as np

    values, counts = values.weighted() if isinstance(values, Sketch) else (values, None)
    if not len(values):
        return None
    x = np.asarray(values, dtype=np.float64)
    if log:
        x = np.log(np.maximum(x, LOG_FLOOR))
    median, spread = median_and_spread(x, counts)
    limit = median + k * spread if side == "max" else median - k * spread
    return round(float(np.exp(limit)) if log else max(0.0, limit), 4)


def median_and_spread(x: Any, counts: Any = None) -> tuple[float, float]:
    """The median of ``x`` (each value ``counts`` times, when given) and its robust deviation: 1.4826 x the median
    absolute deviation, or 1.2533 x the mean absolute deviation when that is 0."""
    import numpy as np

    if counts is None:
        median = float(np.median(x))
        spread = MAD_SCALE * float(np.median(np.abs(x - median)))
        return median, spread or MEAN_AD_SCALE * float(np.mean(np.abs(x - median)))
    w = np.asarray(counts, dtype=np.float64)
    median = _weighted_median(x, w)
    deviations = np.abs(x - median)
    spread = MAD_SCALE * _weighted_median(deviations, w)
    return median, spread or MEAN_AD_SCALE * float(np.sum(w * deviations) / np.sum(w))


def _weighted_median(x: Any, w: Any) -> float:
    """np.median of ``x`` with each value repeated ``w`` times (the two middle ones' mean for an even count)."""
    import numpy as np

    order = np.argsort(x, kind="stable")
    x, cw = x[order], np.cumsum(w[order])
    n = int(cw[-1])
    lo, hi = (n - 1) // 2, n // 2
    return float((x[np.searchsorted(cw, lo + 1)] + x[np.searchsorted(cw, hi + 1)]) / 2)


#: the least value a figure thresholded on its logarithm counts as (a loss of 0)
LOG_FLOOR = 1e-6
#: the figures whose thresholds come from their logarithms
LOG_FIGURES = frozenset({"loss_per_token", "loss_per_frame"})


def thresholds(rows: Iterable[dict], cfg: Any) -> dict:
    """Each figure's threshold from ``rows`` (:func:`limits_of` their sketches)."""
    return limits_of(sketches_of(rows), cfg)


def limits_of(sketches: dict, cfg: Any) -> dict:
    """Each figure's threshold: the config key's value, or from the scored utterances' :class:`Sketch` of it
    (:func:`robust_limit`), held between the figure's floor and ceiling (:data:`BOUNDED`): many wrong labels raise
    the data's threshold, a model that fits its data lowers it to nothing. ``{"max_cer": (value, "data" | "given"
    | "floor" | "ceiling"), ...}``"""
    limits = {}
    for figure, side in LIMITS:
        name = f"{side}_{figure}"
        given = getattr(cfg, name)
        if given is not None:
            limits[name] = (float(given), "given")
            continue
        limit = robust_limit(sketches[figure], cfg.deviations, side, log=figure in LOG_FIGURES)
        limits[name] = bounded(figure, limit, cfg)
    return limits


def bounded(figure: str, value: float | None, cfg: Any) -> tuple:
    """``(threshold, source)``: a data threshold of a :data:`BOUNDED` figure raised to its floor or cut to its
    ceiling (the source says which); others as they are."""
    if figure not in BOUNDED:
        return value, "data"
    floor, ceiling = getattr(cfg, f"{figure}_floor"), getattr(cfg, f"{figure}_ceiling")
    if value is None:
        return None, "data"
    if value > ceiling:
        return float(ceiling), "ceiling"
    if value < floor:
        return float(floor), "floor"
    return value, "data"


def judgement(rows: Iterable[dict], cfg: Any) -> str | None:
    """:func:`judgement_of` the CERs of ``rows`` (those that count for the thresholds)."""
    return judgement_of(sketches_of(rows, ("cer",))["cer"], cfg)


def judgement_of(cers: Sketch, cfg: Any) -> str | None:
    """A warning when the model cannot judge these labels: their median CER above ``++max_median_cer``, or the
    CERs spread wider than ``++max_cer_spread`` (their median absolute deviation x 1.4826); None when it can."""
    import numpy as np

    values, counts = cers.weighted()
    if not len(values):
        return None
    x = np.asarray(values, dtype=np.float64)
    w = np.ones(len(x)) if counts is None else np.asarray(counts, dtype=np.float64)
    median = _weighted_median(x, w)
    spread = MAD_SCALE * _weighted_median(np.abs(x - median), w)
    if median > cfg.max_median_cer:
        figure = f"the labels' median CER is {median:.3f} (above ++max_median_cer={cfg.max_median_cer:g})"
    elif spread > cfg.max_cer_spread:
        figure = (f"the labels' CERs spread {spread:.3f} robust deviations around their median {median:.3f} (above "
                  f"++max_cer_spread={cfg.max_cer_spread:g})")
    else:
        return None
    return (f"warning: the model cannot judge these labels: {figure}. Either most labels are wrong (a text file "
            f"shifted by a line against its audio gives this: look at a few rows of scores.jsonl, text against "
            f"hyp), or the model cannot transcribe this audio: score with a stronger model, trained on audio like "
            f"this. Its flags here rest on the absolute ceilings (++cer_ceiling={cfg.cer_ceiling:g}, "
            f"++loss_per_token_ceiling={cfg.loss_per_token_ceiling:g}, ...), not on what is usual in this data.")


def flag(rows: list[dict], limits: dict, min_errors: int, repeats: dict | None = None,
         extreme: dict | None = None) -> None:
    """Set each row's ``flagged`` and ``reasons``: absolute rules first, then the thresholds. ``repeats`` (key:
    its places): a key the list holds more than once is flagged, its other labels were not scored. ``extreme``
    (figure: value): a label its hypothesis equals (CER 0) is flagged by a loss only above this."""
    for row in rows:
        flag_row(row, limits, min_errors, repeats, extreme)


def flag_row(row: dict, limits: dict, min_errors: int, repeats: dict | None = None,
             extreme: dict | None = None) -> None:
    """:func:`flag` of one row."""
    extreme = extreme or {}
    reasons = []
    if repeats and row["key"] in repeats:
        places = repeats[row["key"]]
        reasons.append(f"repeated key: scored at {places[0]}, not at {', '.join(places[1:])}")
    if not row["readable"]:
        reasons.append(f"unreadable: {row['error']}")
    else:
        if not row["tokens"]:
            reasons.append("empty label")
        if not row["alignable"]:
            reasons.append(f"unalignable: {row['tokens']} tokens need {row['needed_frames']} frames, the audio "
                           f"has {row['frames']}")
        if row["unknown"]:
            reasons.append(f"tokens outside the token list: {' '.join(row['unknown'][:5])}")
        for figure, side in LIMITS:
            value, (limit, _) = row[figure], limits[f"{side}_{figure}"]
            if value is None or limit is None:
                continue
            if figure in ("cer", "wer") and row["word_errors"] < min_errors:
                continue
            if figure in extreme and row["cer"] == 0 and side == "max":
                limit = max(limit, extreme[figure])  # the model says the label: its loss alone is weak evidence
            if (value > limit) if side == "max" else (value < limit):
                reasons.append(f"{figure} {value:g} {'>' if side == 'max' else '<'} {limit:g}")
    row["flagged"] = bool(reasons)
    row["reasons"] = reasons


#: the order of a scores.jsonl row's fields
ROW_FIELDS = ("key", "flagged", "reasons", "duration", "chars", "tokens", "frames", "chars_per_second",
              "tokens_per_second", "cer", "wer", "char_errors", "word_errors", "loss_per_frame", "loss_per_token",
              "alignable", "needed_frames", "unknown", "readable", "error", "text", "hyp")


def write_scores(out: Path, rows: Iterable[dict], limits: dict, run: Any, cfg: Any, warning: str | None = None,
                 repeats: dict | None = None) -> tuple[str, dict]:
    """``scores.jsonl``, ``flagged`` and ``summary.txt`` from ``rows`` (key order, not flagged yet: each is flagged
    here, one at a time); returns the summary and the counts (``total``, ``readable``, ``flagged``)."""
    from corpus_io.storage.files import atomic_write, ensure_dir

    ensure_dir(out, what="output_dir")
    counts: dict[str, int] = {}
    seen = readable = flagged = 0
    with atomic_write(out / "scores.jsonl", owner=WRITER) as f, atomic_write(out / "flagged", owner=WRITER) as g:
        for row in rows:
            flag_row(row, limits, cfg.min_errors, repeats, loss_ceilings(cfg))
            f.write(json.dumps({k: row[k] for k in ROW_FIELDS if k in row}, ensure_ascii=False) + "\n")
            seen += 1
            readable += bool(row["readable"])
            if row["flagged"]:
                flagged += 1
                g.write(f"{row['key']} {'; '.join(row['reasons'])}\n")
                for reason in row["reasons"]:
                    name = reason.split(":")[0].split(" ")[0] if not reason.startswith("empty") else "empty label"
                    counts[name] = counts.get(name, 0) + 1
    total, shards = tally(seen, run)
    lines = [f"score: {total} utterances of {cfg.data_list} ({run.audio / 3600:.3f} h) with {cfg.checkpoint}: "
             f"{readable} scored, {total - readable} unreadable{shards}; {flagged} flagged "
             f"({100 * flagged / max(1, total):.1f} %)",
             "flagged by: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing"),
             f"thresholds (data: median +- {cfg.deviations:g} robust deviations, the losses' of their logarithms, "
             f"held between floor and ceiling; given: a key):"]
    for name, (value, source) in limits.items():
        lines.append(f"  {name} {'-' if value is None else f'{value:g}'} ({source})")
    if run.repeats:
        first = next(iter(run.repeats))
        lines.append(f"warning: {len(run.repeats)} keys were read more than once (e.g. '{first}'); each has one row")
    for why in run.unread:
        lines.append(f"unread: {why}")
    if warning:
        lines.append(warning)
    summary = "\n".join(lines) + "\n"
    with atomic_write(out / "summary.txt", owner=WRITER) as f:
        f.write(summary)
    if total - readable:
        unnamed = total - seen
        print(f"warning: {total - readable} utterances could not be read (loader: {run.skipped}){shards}; each is in "
              f"scores.jsonl and flagged as unreadable"
              + (f", but for {unnamed} in shards whose keys not even the list's index names" if unnamed else "")
              + ".", file=sys.stderr, flush=True)
    return summary, {"total": total, "readable": readable, "flagged": flagged}


def tally(rows: int, run: Any) -> tuple[int, str]:
    """``(utterances, the shards not read)``: every utterance the list names, its ``rows`` and those of a shard
    that could not be read whose keys no one knows (its index's count); the shards as `` (shards not read: ...)``."""
    unnamed = [n for n in run.unread_shards.values() if n]
    unknown = any(n is None for n in run.unread_shards.values())
    shards = ""
    if run.unread_shards:
        shards = (f" (shards not read: {', '.join(run.unread_shards)}"
                  + ("; how many utterances some hold, no index says" if unknown else "") + ")")
    return rows + sum(unnamed), shards


# --------------------------------------------------------------------------- merge-jobs


def part_keys(data: dict) -> list[str]:
    """The utterances of a score part (merge-jobs refuses a key two parts hold)."""
    return data["keys"]


def check_part(part: Any) -> None:
    """merge-jobs: a score record's keys, sketches, options and its rows file (:class:`RecordProblem` on the first
    field that cannot be trusted)."""
    from corpus_io.jobs import parts as jobs

    data = part.data
    for i, key in enumerate(jobs.of_type(data.get("keys"), "data.keys", list, "a list")):
        if not isinstance(key, str) or not key:
            raise jobs.bad(f"data.keys[{i}]", key, "not an utterance key")
    sketches = jobs.of_type(data.get("sketches"), "data.sketches", dict, "a JSON object")
    if sorted(sketches) != sorted(FIGURE_NAMES):
        raise jobs.bad("data.sketches", sorted(sketches), f"but a score job sketches {list(FIGURE_NAMES)}")
    for name, sketch in sketches.items():
        jobs.of_type(sketch, f"data.sketches.{name}", dict, "a JSON object")
        if not isinstance(sketch.get("values", sketch.get("bins")), (list, dict)):
            raise jobs.bad(f"data.sketches.{name}", sketch, "neither values nor bins")
    options = jobs.of_type(data.get("options"), "data.options", dict, "a JSON object")
    if sorted(options) != sorted(MERGE_OPTIONS):
        raise jobs.bad("data.options", sorted(options), f"but a score job keeps {list(MERGE_OPTIONS)}")
    jobs.of_type(data.get("run"), "data.run", dict, "a JSON object")
    want = [f"{Path(part.where).name[: -len('.json')]}/rows.jsonl"]
    if [out.get("file") for out in part.outputs] != want:
        raise jobs.bad("outputs", [out.get("file") for out in part.outputs], f"but a score job writes {want}")


def merge_parts(place: Any, parts: list) -> dict:
    """``merge-jobs`` of score: the thresholds from the parts' sketches merged, then their rows (each part's in key
    order) merged in key order, flagged and written as one job writes them."""
    from types import SimpleNamespace

    from corpus_io.infer.decode import refuse_others_outputs
    from corpus_io.storage.sorting import jsonl_key, merge_sorted

    out = Path(place.path)
    refuse_others_outputs(out, OUTPUTS, WRITER)
    sketches = {f: Sketch() for f in FIGURE_NAMES}
    run = SimpleNamespace(audio=0.0, repeats={}, unread=[], unread_shards={}, skipped=[], wall_s=0.0)
    repeats: dict = {}
    options: dict = {}
    for p in parts:
        data = p.payload()  # read again from its record when load_parts let it go: once a part
        for f in FIGURE_NAMES:
            sketches[f].merge(Sketch.from_json(data["sketches"][f]))
        got = data["run"]
        run.audio += got["audio"]
        run.wall_s = max(run.wall_s, data["result"]["wall_seconds"])  # the jobs ran side by side
        run.repeats.update(got["repeats"])
        run.unread += got["unread"]
        run.unread_shards.update(got["unread_shards"])
        if got["skipped"] != "none":
            run.skipped.append(got["skipped"])
        repeats.update(got["repeated"])
        options = data["options"]
    run.skipped = "; ".join(run.skipped) or "none"
    cfg = SimpleNamespace(**options)
    with tempfile.TemporaryDirectory(prefix=".score-merge-", dir=out) as tmp:
        merged = Path(tmp) / "rows.jsonl"
        with open(merged, "w", encoding="utf-8", newline="") as f:
            merge_sorted([Path(p.where).parent / p.outputs[0]["file"] for p in parts], jsonl_key, f, Path(tmp))
        return finish(out, read_rows(merged), sketches, run, cfg, repeats)


__all__ = ["score", "robust_limit", "thresholds", "flag", "Sketch", "LIMITS", "OUTPUTS"]
