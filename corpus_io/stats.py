"""``corpus-io stats``: what is in a data list, from metadata only.

Shard lists: per utterance ``duration`` (``.json`` member, or ``source_len``/``num_frames`` / 100),
transcript length and ``speaker``, read from the ``.meta.jsonl.gz`` companion when it exists, else
from the main tar with audio payloads skipped (:func:`corpus_io.shards.kinds.iter_shard_metadata`).
Raw lists: ``duration``/``source_len`` of the line, else the audio header (never decoded).

Output: a table on stdout (totals, duration / text-length histograms, speakers, per-shard balance)
and a PNG of the duration histogram (matplotlib, Agg backend). No torch import.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from corpus_io.errors import ConfigError, DataError
from corpus_io.storage.files import refuse_overwriting_inputs, refuse_remote_output

SPEAKER_FIELDS = ("speaker", "spk", "speaker_id")


@dataclass
class CorpusStats:
    list_path: str
    data_type: str
    durations: list[float] = field(default_factory=list)  # seconds, per utterance
    text_lengths: list[int] = field(default_factory=list)  # characters, spaces excluded
    speakers: Counter = field(default_factory=Counter)  # utterances per speaker
    speaker_seconds: Counter = field(default_factory=Counter)
    units: list[tuple[str, int, float]] = field(default_factory=list)  # (shard, utts, seconds)
    no_duration: int = 0
    index_totals: tuple[int, float] | None = None  # (utts, seconds) from index.jsonl

    @property
    def num_utts(self) -> int:
        return len(self.durations)

    @property
    def seconds(self) -> float:
        return sum(self.durations)


def meta_duration(meta: dict) -> float | None:
    """Seconds of an utterance from its metadata: ``duration``, else ``source_len``/``num_frames`` / 100."""
    for name, scale in (("duration", 1.0), ("source_len", 0.01), ("num_frames", 0.01)):
        value = meta.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) * scale
    return None


def meta_speaker(meta: dict) -> str | None:
    """The speaker named by the first of :data:`SPEAKER_FIELDS` a metadata dict has."""
    for name in SPEAKER_FIELDS:
        if meta.get(name) not in (None, ""):
            return str(meta[name])
    return None


def _text_length(text: str) -> int:
    return sum(1 for ch in text if not ch.isspace())


def _add(stats: CorpusStats, duration: float | None, text: str, speaker: str | None) -> float:
    if duration is None:
        stats.no_duration += 1
        duration = 0.0
    stats.durations.append(duration)
    stats.text_lengths.append(_text_length(text))
    if speaker is not None:
        stats.speakers[speaker] += 1
        stats.speaker_seconds[speaker] += duration
    return duration


def _iter_raw(path: str) -> Iterator[tuple[float | None, str, str | None]]:
    from corpus_io.audio import io as audio
    from corpus_io.loader.rawlist import RawList
    from corpus_io.tables import inputs

    typed = inputs.resolve_input(path)  # what the input is, decided once
    if os.path.isdir(path) or path.endswith(".gz") or typed.kind in ("lhotse-recordings+supervisions", "hf-parquet"):
        records: Iterator[dict] = inputs.iter_records(typed, skip=lambda _: None)  # read in one stream
    else:
        # no .idx offset cache beside the list: stats writes nothing beside the data (8 bytes an utterance in
        # memory, less than the durations it keeps)
        lst = RawList(typed, cache=False)
        records = (lst.record(i) for i in range(len(lst)))
    for rec in records:
        dur = meta_duration(rec)
        if dur is None:
            try:  # header only (a parquet row's bytes are in the record)
                info = audio.probe_bytes(rec["source_bytes"]) if "source_bytes" in rec else \
                    audio.probe(str(rec["source"]))
                dur = info.num_samples / info.sample_rate if info.sample_rate else None
            except DataError:
                dur = None
            if dur is not None and rec.get("start") is not None:
                end = float(rec["end"]) if rec.get("end") is not None and float(rec["end"]) >= 0 else dur
                dur = max(0.0, end - float(rec["start"]))
        yield dur, str(rec.get("target", "")), meta_speaker(rec)


def collect(list_path: str, data_type: str = "shard", *, storage_options: dict | None = None) -> CorpusStats:
    """Per-utterance durations, text lengths, speakers and per-shard totals of a data list."""
    from corpus_io.storage.progress import progress

    stats = CorpusStats(str(list_path), data_type)
    if data_type == "raw":
        for dur, text, spk in progress(_iter_raw(str(list_path)), desc="stats", unit="utt"):
            _add(stats, dur, text, spk)
        return stats
    from corpus_io.shards.index import load_index, read_datalist
    from corpus_io.shards.kinds import iter_shard_metadata

    urls = read_datalist(list_path, storage_options=storage_options)
    index = load_index(list_path, storage_options=storage_options)
    if index is not None and all(u in index for u in urls):
        stats.index_totals = (sum(int(index[u].get("num_utts", 0)) for u in urls),
                              sum(float(index[u].get("duration", 0.0)) for u in urls))
    for url in progress(urls, total=len(urls), desc="stats", unit="shard"):
        n, secs = 0, 0.0
        for sample in iter_shard_metadata(url, storage_options=storage_options):
            meta = sample.get("meta") or {}
            secs += _add(stats, meta_duration(meta), sample.get("txt", ""), meta_speaker(meta))
            n += 1
        stats.units.append((url, n, secs))
    return stats


# --------------------------------------------------------------------------- table


def _histogram(values: list[float], bins: int) -> tuple[list[float], list[int]]:
    """``(edges, counts)`` over [min, max] with ``bins`` equal bins (numpy-free, exact edges)."""
    if not values:
        return [0.0, 0.0], [0]
    lo, hi = min(values), max(values)
    if hi <= lo:
        return [lo, hi], [len(values)]
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return [lo + i * width for i in range(bins + 1)], counts


def _bar_rows(edges: list[float], counts: list[int], fmt: str, width: int = 40) -> list[str]:
    top = max(counts) or 1
    rows = []
    for i, c in enumerate(counts):
        bar = "#" * int(round(c / top * width))
        rows.append(f"  {fmt.format(edges[i])} - {fmt.format(edges[i + 1])}  {c:>8}  {bar}")
    return rows


def _quantiles(values: list[float]) -> str:
    s = sorted(values)
    if not s:
        return "n/a"

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]

    return f"min {s[0]:.2f}  p10 {q(0.1):.2f}  median {q(0.5):.2f}  p90 {q(0.9):.2f}  max {s[-1]:.2f}"


def render(stats: CorpusStats, *, bins: int = 30) -> str:
    """The human-readable table printed by ``corpus-io stats``."""
    hours = stats.seconds / 3600
    lines = [f"corpus stats: {stats.list_path} ({stats.data_type})", "",
             f"{'utterances':<22}{stats.num_utts:>14}",
             f"{'hours':<22}{hours:>14.3f}",
             f"{'seconds':<22}{stats.seconds:>14.3f}"]
    if stats.units:
        lines.append(f"{'shards':<22}{len(stats.units):>14}")
    lines.append(f"{'speakers':<22}{len(stats.speakers):>14}")
    if stats.no_duration:
        lines.append(f"{'no duration':<22}{stats.no_duration:>14}   (counted as 0 s)")
    if stats.index_totals is not None:
        n, secs = stats.index_totals
        agree = n == stats.num_utts and abs(secs - stats.seconds) <= 0.001 * max(1, stats.num_utts)
        lines.append(f"{'index.jsonl':<22}{n:>14} utts, {secs / 3600:.3f} h "
                     f"({'agrees' if agree else 'DIFFERS from the shards: re-run make-datalist'})")
    lines += ["", f"duration (s): {_quantiles(stats.durations)}"]
    lines += _bar_rows(*_histogram(stats.durations, min(bins, 15)), "{:7.2f}")
    lengths = [float(x) for x in stats.text_lengths]
    lines += ["", f"text length (chars): {_quantiles(lengths)}"]
    lines += _bar_rows(*_histogram(lengths, min(bins, 10)), "{:7.1f}")
    if stats.speakers:
        per_spk = list(stats.speakers.values())
        lines += ["", f"speakers: {len(stats.speakers)}; utterances per speaker: min {min(per_spk)}, "
                      f"max {max(per_spk)}, mean {sum(per_spk) / len(per_spk):.1f}",
                  f"  {'speaker':<24}{'utts':>8}{'hours':>10}"]
        for spk, n in stats.speakers.most_common(10):
            lines.append(f"  {spk[:24]:<24}{n:>8}{stats.speaker_seconds[spk] / 3600:>10.4f}")
        if len(stats.speakers) > 10:
            lines.append(f"  ... {len(stats.speakers) - 10} more")
        lines += ["  utterances-per-speaker histogram:"]
        lines += _bar_rows(*_histogram([float(x) for x in per_spk], min(bins, 10)), "{:7.1f}")
    if stats.units:
        utts = [u[1] for u in stats.units]
        hrs = [u[2] / 3600 for u in stats.units]
        lines += ["", "per-shard balance:",
                  f"  {'':<10}{'min':>12}{'max':>12}{'mean':>12}",
                  f"  {'utts':<10}{min(utts):>12}{max(utts):>12}{sum(utts) / len(utts):>12.1f}",
                  f"  {'hours':<10}{min(hrs):>12.4f}{max(hrs):>12.4f}{sum(hrs) / len(hrs):>12.4f}"]
        small = [u for u in stats.units if u[1] < 0.5 * (sum(utts) / len(utts))]
        if small:
            lines.append(f"  {len(small)} shard(s) under half the mean (e.g. {os.path.basename(small[0][0])}: "
                         f"{small[0][1]} utts)")
    return "\n".join(lines)


def plot(stats: CorpusStats, path: str | os.PathLike, *, bins: int = 30) -> Path:
    """PNG of the duration histogram (matplotlib, Agg), written atomically."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from corpus_io.storage.files import atomic_write

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.hist(stats.durations or [0.0], bins=max(1, bins), color="#4878a8", edgecolor="white")
    ax.set_xlabel("duration (s)")
    ax.set_ylabel("utterances")
    ax.set_title(f"{os.path.basename(stats.list_path)}: {stats.num_utts} utts, {stats.seconds / 3600:.2f} h")
    fig.tight_layout()
    out = Path(path)
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return out


def default_output(list_path: str) -> Path:
    """The PNG without ``++output``: ``<list stem>.stats.png`` in the current directory, never beside the data
    (a data directory may be read-only, shared or remote, and a command's outputs go where the user runs it)."""
    from urllib.parse import urlsplit

    from corpus_io.storage.urls import is_remote

    name = Path(urlsplit(list_path).path if is_remote(list_path) else os.path.abspath(list_path)).stem
    return Path.cwd() / f"{name or 'stats'}.stats.png"


def run_stats(cfg: Any) -> CorpusStats:
    """``corpus-io stats`` for a validated :class:`corpus_io.config.StatsConfig`."""
    from corpus_io.storage.urls import is_remote

    if cfg.bins <= 0:
        raise ConfigError(f"bins must be positive, got {cfg.bins}.")
    refuse_remote_output(cfg.output, "++output", "stats")
    output = cfg.output or default_output(cfg.input)
    refuse_overwriting_inputs([("++output" if cfg.output else "the default ++output", output)],
                              [("++input", cfg.input)])
    if not is_remote(cfg.input) and not os.path.isfile(cfg.input) and not (cfg.data_type == "raw" and
                                                                            os.path.isdir(cfg.input)):
        raise ConfigError(f"input {cfg.input} does not exist. Pass a shard data.list (or ++data_type=raw with a "
                          f"raw JSONL list, a Kaldi dir, or a NeMo or Lhotse manifest).")
    stats = collect(cfg.input, cfg.data_type, storage_options=dict(cfg.storage_options or {}))
    print(render(stats, bins=cfg.bins), flush=True)
    if cfg.output is None and importlib.util.find_spec("matplotlib") is None:
        # the core install has no matplotlib: the table is the result, the PNG is a bonus
        from corpus_io.extras import install_line

        print(f"\nduration histogram: not drawn (matplotlib is not installed: {install_line('plots')}, "
              "or pass ++output=FILE.png to require it)", flush=True)
    else:
        out = plot(stats, output, bins=cfg.bins)
        print(f"\nduration histogram: {out}", flush=True)
    if not math.isfinite(stats.seconds):
        raise DataError(f"{cfg.input}: a duration is not a finite number; check the metadata.")
    return stats
