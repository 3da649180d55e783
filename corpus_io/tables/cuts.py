"""A Lhotse cut (or supervision) as a canonical record: its span checked inside its recording, its supervisions'
texts joined, and :class:`Skip`, the record an input line that yields none gives. Shared by
:mod:`corpus_io.tables.inputs` (CutSets, RecordingSet + SupervisionSet, NeMo) and :mod:`corpus_io.tables.shar`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corpus_io.audio import io as audio
from corpus_io.errors import DataError
from corpus_io.tables.manifest import canonical

_SAME_TIME = 1e-3  # seconds: supervisions closer than this do not overlap; a cut this close to its recording is whole


@dataclass(frozen=True)
class Skip:
    """An input line that yields no record: why (the skip reason counted in the summary), where, which key, and
    what the line holds that made it so (``detail``: the field, for messages)."""

    reason: str
    where: str
    key: str
    detail: str = ""

    @property
    def what(self) -> str:
        """``key 'K': <reason> (<detail>)``: what happened to the line, for a message after its ``where``."""
        return f"key '{self.key}': {self.reason}" + (f" ({self.detail})" if self.detail else "")


def _number(obj: dict, name: str, where: str, key: str) -> float | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise DataError(f"{where}: key '{key}': {name} is {value!r}, not a number of seconds. Fix the line.")
    return float(value)


def _lhotse_span(obj: dict, recording: dict, where: str, key: str, what: str) -> tuple[float, float]:
    """``(start, duration)`` s of a cut (or a supervision of a RecordingSet), checked as a Kaldi segment is: finite,
    ``0 <= start < start + duration``, inside the recording (up to ``audio.MAX_OVERSHOOT`` past its end, clipped
    when read), whose ``sampling_rate`` and ``num_samples`` a Lhotse recording holds."""
    start = _number(obj, "start", where, key) or 0.0
    duration = _number(obj, "duration", where, key)
    if duration is None:
        raise DataError(f"{where}: {what} '{key}' has no duration. A Lhotse {what} needs start and duration.")
    rate, total = recording.get("sampling_rate"), recording.get("num_samples")
    if not (isinstance(rate, int) and rate > 0 and isinstance(total, int) and total >= 0):
        rate, total = 1000, 1 << 62  # a recording of unknown length: only 0 <= start < end is checked
    try:
        audio.segment_samples(start, start + duration, rate, total)
    except DataError as exc:
        raise DataError(f"{where}: {what} '{key}' (start {start:g} s, duration {duration:g} s) of recording "
                        f"'{recording.get('id', '?')}': {exc} Fix the {what} in Lhotse (or drop it) and save the "
                        f"manifest again.") from None
    return start, duration


def _join_texts(supervisions: list[dict], where: str, key: str) -> tuple[str, str | None, str | None]:
    """``(text, speaker, language)`` of a cut's supervisions, joined in time order; overlap is refused."""
    sups = sorted(supervisions, key=lambda s: (float(s.get("start", 0.0)), str(s.get("id", ""))))
    for before, after in zip(sups, sups[1:]):
        if float(after.get("start", 0.0)) < float(before["start"]) + float(before.get("duration", 0.0)) - _SAME_TIME:
            raise DataError(f"{where}: key '{key}': supervisions '{before.get('id')}' and '{after.get('id')}' overlap; "
                            f"one utterance holds one transcript. Split the cut per supervision in Lhotse "
                            f"(cuts.trim_to_supervisions(keep_overlapping=False)) and save that CutSet.")
    text = " ".join(str(s.get("text") or "").strip() for s in sups).strip()
    speakers = {s.get("speaker") for s in sups}
    languages = {s.get("language") for s in sups}
    return (text, speakers.pop() if len(speakers) == 1 else None, languages.pop() if len(languages) == 1 else None)


def _utterance(key: str, source: str, start: float, duration: float, whole: bool, text: str,
               speaker: str | None, language: str | None, where: str) -> dict:
    rec: dict[str, Any] = {"key": key, "source": source, "target": text, "duration": round(duration, 6)}
    if not whole:
        rec["start"], rec["end"] = start, start + duration
    if speaker is not None:
        rec["speaker"] = speaker
    if language is not None:
        rec["language"] = language
    return canonical(rec, where)
