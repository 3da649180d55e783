"""Manifests out: ``jsonl2scp ++output_format=nemo|lhotse`` writes a NeMo manifest or a Lhotse CutSet.

The input is any of :mod:`corpus_io.tables.inputs` (so this also converts a Kaldi dir or a Lhotse pair to NeMo, or a
NeMo manifest to a CutSet). Written, one line per utterance, streamed:

* **NeMo** (``manifest_out``, e.g. ``train_manifest.json``): ``audio_filepath``, ``duration`` (seconds),
  ``text``, ``offset`` (segments only; NeMo cuts ``[offset, offset + duration]``), plus ``key`` when the key
  differs from what :func:`corpus_io.tables.inputs.nemo_key` would derive, and ``speaker``/``lang`` when known (the
  fields NeMo's manifest parser reads: ``nemo.collections.common.parts.preprocessing.manifest``).
* **Lhotse** (``manifest_out`` ending ``.jsonl`` or ``.jsonl.gz``): a CutSet of ``MonoCut`` (``MultiCut`` of
  every channel for a multi-channel file, which corpus-io mixes down), each with its recording (probed from
  the audio header: sampling rate, samples, channels) and one supervision holding the transcript.
  ``lhotse.CutSet.from_file`` loads it.

Local audio paths are written absolute (:func:`from_anywhere`): the manifest reads the same from any directory.

Segments of one recording arrive together, so one header probe serves them all.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from typing import IO, Any, Callable

from corpus_io.audio import io as audio
from corpus_io.errors import ConfigError, DataError
from corpus_io.storage.files import atomic_write, refuse_overwriting_inputs, refuse_remote_output
from corpus_io.storage.progress import Summary
from corpus_io.storage.urls import is_command
from corpus_io.tables import inputs

FORMATS = ("kaldi", "nemo", "lhotse")


class _Probe:
    """The header of the last recording probed (the segments of one recording come together)."""

    def __init__(self) -> None:
        self.source: str | None = None
        self.info: audio.AudioInfo | None = None

    def __call__(self, rec: dict, where: str) -> audio.AudioInfo:
        source = str(rec["source"])
        if is_command(source):
            raise DataError(f"{where}: key '{rec['key']}': the source '{source}' is a command; NeMo and Lhotse "
                            f"manifests name audio files. Convert the audio to files first.")
        if source != self.source:
            self.source, self.info = source, audio.probe(source)
        assert self.info is not None
        return self.info


def from_anywhere(source: str) -> str:
    """``source`` as a path that names the same file from any directory: a relative local path (read, as everywhere
    in corpus-io, from the current directory) made absolute, a tar member's tar too; URLs and commands unchanged.
    NeMo resolves a relative ``audio_filepath`` from the current directory if the file is there, else from the
    manifest's directory; Lhotse resolves a relative source from the current directory only: an absolute path is
    the one that every reader, run from anywhere, opens as the file read here."""
    if "://" in source or is_command(source):
        return source
    member = audio.split_tar_member(source)
    if member is not None:
        return os.path.abspath(member[0]) + "//" + member[1]
    return os.path.abspath(source)


def _span(rec: dict, info: audio.AudioInfo) -> tuple[float, float, bool]:
    """``(start, duration, is a segment)`` in seconds."""
    start = rec.get("start")
    if start is None:
        return 0.0, info.duration, False
    end = rec.get("end")
    stop = info.duration if end is None or float(end) < 0 else min(float(end), info.duration)
    return float(start), max(0.0, stop - float(start)), True


def _nemo_shard(source: str) -> tuple[str, int] | None:
    """``(member, shard_id)`` of a member of a tarred NeMo dataset's ``audio_<shard_id>.tar``, else None."""
    member = audio.split_tar_member(source)
    match = re.fullmatch(r"audio_(\d+)\.tar", os.path.basename(member[0])) if member else None
    return (member[1], int(match.group(1))) if member and match else None


def nemo_line(rec: dict, probe: Callable[[dict, str], audio.AudioInfo], where: str) -> dict:
    start, duration, segment = _span(rec, probe(rec, where))
    line: dict[str, Any] = {"audio_filepath": from_anywhere(str(rec["source"])), "duration": round(duration, 6),
                            "text": str(rec.get("target", ""))}
    tarred = _nemo_shard(line["audio_filepath"])
    if tarred is not None:  # back to NeMo's tarred layout: the member name and its shard
        line["audio_filepath"], line["shard_id"] = tarred
    if segment:
        line["offset"] = start
    if rec["key"] != inputs.nemo_key(line["audio_filepath"], start if segment else None):
        line["key"] = rec["key"]
    if rec.get("speaker") is not None:
        line["speaker"] = rec["speaker"]
    language = rec.get("language", rec.get("lang"))
    if language is not None:
        line["lang"] = language  # NeMo's manifest parser reads speaker and lang
    return line


def lhotse_cut(rec: dict, probe: Callable[[dict, str], audio.AudioInfo], where: str) -> dict:
    source = str(rec["source"])
    if audio.split_tar_member(source):
        raise DataError(f"{where}: key '{rec['key']}': the audio is a member of a tar ({source}), which a Lhotse "
                        f"recording cannot name. Pack shards instead (pack-shards), or extract the tar first.")
    info = probe(rec, where)
    start, duration, segment = _span(rec, info)
    recording_id = inputs.nemo_key(source) if segment else rec["key"]
    source = from_anywhere(source)
    channels = list(range(info.channels))
    recording = {"id": recording_id,
                 "sources": [{"type": "url" if "://" in source else "file", "channels": channels, "source": source}],
                 "sampling_rate": info.sample_rate, "num_samples": info.num_samples, "duration": info.duration,
                 "channel_ids": channels}
    channel: Any = 0 if info.channels == 1 else channels
    supervision: dict[str, Any] = {"id": rec["key"], "recording_id": recording_id, "start": 0.0,
                                   "duration": round(duration, 6), "channel": channel,
                                   "text": str(rec.get("target", ""))}
    if rec.get("speaker") is not None:
        supervision["speaker"] = rec["speaker"]
    if rec.get("language", rec.get("lang")) is not None:
        supervision["language"] = rec.get("language", rec.get("lang"))
    return {"id": rec["key"], "start": start, "duration": round(duration, 6), "channel": channel,
            "supervisions": [supervision], "recording": recording,
            "type": "MonoCut" if info.channels == 1 else "MultiCut"}


def _open_text(f: IO, path: str) -> IO:
    return gzip.open(f, "wt", encoding="utf-8") if path.endswith(".gz") else f


def export(cfg: Any) -> Summary:
    """Write ``cfg.jsonl_file_in`` (any input kind) as a NeMo manifest or a Lhotse CutSet to ``cfg.manifest_out``."""
    out_path = cfg.manifest_out
    if not out_path:
        example = "cuts.jsonl.gz" if cfg.output_format == "lhotse" else "train_manifest.json"
        raise ConfigError(f"++output_format={cfg.output_format} writes one manifest: give ++manifest_out={example}.")
    refuse_remote_output(out_path, "++manifest_out", f"jsonl2scp ++output_format={cfg.output_format}")
    refuse_overwriting_inputs([("++manifest_out", out_path)], [("++jsonl_file_in", cfg.jsonl_file_in)])
    if cfg.output_format == "lhotse" and not out_path.endswith((".jsonl", ".jsonl.gz")):
        raise ConfigError(f"++manifest_out={out_path}: a Lhotse CutSet is written as .jsonl or .jsonl.gz (Lhotse "
                          f"reads the format from the name), e.g. ++manifest_out=cuts.jsonl.gz.")
    line_of = nemo_line if cfg.output_format == "nemo" else lhotse_cut
    probe = _Probe()
    summary = Summary(what="utterances")
    skipped = inputs.Skipped(summary.skip)
    with atomic_write(out_path, "wb") as raw:
        f = _open_text(raw, out_path) if out_path.endswith(".gz") else None
        for rec in inputs.iter_records(cfg.jsonl_file_in, skip=skipped):
            where = rec.pop("where", cfg.jsonl_file_in)
            line = line_of(rec, probe, where)
            text = json.dumps(line, ensure_ascii=False) + "\n"
            if f is not None:
                f.write(text)
            else:
                raw.write(text.encode("utf-8"))
            summary.kept += 1
            summary.seconds += line["duration"]
        if f is not None:
            f.close()  # the gzip trailer, before the file is renamed into place
        if not summary.kept:
            raise skipped.nothing_left(cfg.jsonl_file_in, "there is nothing to write", "++jsonl_file_in")
    summary.print(f"jsonl2scp -> {cfg.output_format} {out_path}")
    return summary


def jsonl2scp(cfg: Any) -> Any:
    """``jsonl2scp``: Kaldi tables (``output_format=kaldi``, :func:`corpus_io.tables.manifest.jsonl2scp`), or a NeMo
    manifest / Lhotse CutSet (:func:`export`)."""
    if cfg.output_format == "kaldi":
        from corpus_io.tables.manifest import jsonl2scp as to_tables

        return to_tables(cfg)
    return export(cfg)
