"""Edit-distance scoring: CER (every non-space character), WER (Latin words, each CJK character a word).

For Chinese the WER units are characters (so WER == CER on CJK), for English they are words, and
for mixed text CJK characters and Latin words are scored together (the usual "MER"). Reference and
hypothesis are both normalised first (:func:`normalize`: NFKC, case folded, punctuation removed, no
spaces between CJK characters), as WeNet's and icefall's scoring scripts do; the report says so.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

# CJK ideographs, kana, hangul and CJK punctuation are scored one character at a time.
_CJK = re.compile(r"[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")


NORMALIZATION = "NFKC, case folded, punctuation removed (an apostrophe inside a word joins it), CJK spacing removed"


def normalize(text: str) -> str:
    """The text as scored: NFKC, case folded, punctuation (Unicode category P*) removed, spaces between
    CJK characters removed, whitespace collapsed. Applied to reference and hypothesis alike."""
    out: list[str] = []
    text = unicodedata.normalize("NFKC", text).casefold()
    for i, c in enumerate(text):
        if unicodedata.category(c).startswith("P"):
            inner = c in "'\u2019" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
            out.append("" if inner else " ")
        else:
            out.append(c)
    words = "".join(out).split()
    joined: list[str] = []
    for word in words:  # no space between two CJK characters
        if joined and _CJK.match(joined[-1][-1]) and _CJK.match(word[0]):
            joined[-1] += word
        else:
            joined.append(word)
    return " ".join(joined)


def token_list_covers(symbols: list[str]) -> Callable[[str], bool]:
    """Whether a reference token can be output with the token list ``symbols``: listed, or equal to a listed
    token once both are normalised (``Hello,`` is covered by ``hello``: scoring drops case and punctuation)."""
    listed = set(symbols)
    normalised = {normalize(s) for s in symbols}
    return lambda token: token in listed or normalize(token) in normalised


def char_units(text: str) -> list[str]:
    """Every character except whitespace."""
    return [c for c in unicodedata.normalize("NFKC", text) if not c.isspace()]


def word_units(text: str) -> list[str]:
    """Whitespace words, with each CJK character as its own word."""
    units: list[str] = []
    for word in unicodedata.normalize("NFKC", text).split():
        buf = ""
        for c in word:
            if _CJK.match(c):
                if buf:
                    units.append(buf)
                    buf = ""
                units.append(c)
            else:
                buf += c
        if buf:
            units.append(buf)
    return units


@dataclass
class EditCounts:
    ref: int = 0
    sub: int = 0
    ins: int = 0
    dele: int = 0

    @property
    def errors(self) -> int:
        return self.sub + self.ins + self.dele

    @property
    def rate(self) -> float:
        return self.errors / self.ref if self.ref else (0.0 if not self.errors else float("inf"))

    def add(self, other: EditCounts) -> None:
        self.ref += other.ref
        self.sub += other.sub
        self.ins += other.ins
        self.dele += other.dele


def _kaldi_align() -> Callable[[list[int], list[int]], dict]:
    """kaldialign's C++ ``edit_distance`` on int ids. Its Python wrapper sorts the symbol set on every
    call, half the time on short pairs, so the compiled function is called directly when present."""
    try:
        from _kaldialign import edit_distance as align

        return lambda ref, hyp: align(ref, hyp, False)
    except ImportError:  # a kaldialign without the compiled module name: the public function
        import kaldialign

        return kaldialign.edit_distance


_ALIGN: Callable[[list[int], list[int]], dict] | None = None


def edit_counts(ref: list[str], hyp: list[str]) -> EditCounts:
    """Substitutions, insertions and deletions of ``hyp`` against ``ref``, exactly as Kaldi's compute-wer.

    kaldialign implements Kaldi's ``LevenshteinEditDistance`` (C++): unit costs, and on equal cost it
    takes a substitution only when strictly cheaper, else a deletion when strictly cheaper than an
    insertion, else an insertion; so the split (not only the total) matches compute-wer.
    """
    global _ALIGN
    if ref == hyp:  # the diagonal costs 0, strictly below any other path: nothing to align
        return EditCounts(ref=len(ref))
    if _ALIGN is None:
        _ALIGN = _kaldi_align()
    ids: dict[str, int] = {}
    id_of = ids.setdefault  # symbols -> small ints, as the C++ function takes (local: called per unit)
    d = _ALIGN([id_of(u, len(ids)) for u in ref], [id_of(u, len(ids)) for u in hyp])
    return EditCounts(len(ref), d["sub"], d["ins"], d["del"])


def confusion_pairs(ref: list[str], hyp: list[str]) -> list[tuple[str, str]]:
    """The (reference, hypothesis) unit pairs that differ in the alignment; ``*`` marks nothing."""
    import kaldialign

    return [(r, h) for r, h in kaldialign.align(ref, hyp, "*") if r != h]


def count_phrase(text: str, phrase: str) -> int:
    """Occurrences of ``phrase`` in ``text`` (both normalised): whole words for Latin, substrings in CJK runs."""
    text, phrase = normalize(text), normalize(phrase)
    if not phrase:
        return 0
    if all(_CJK.match(c) or c.isspace() for c in phrase):
        return text.replace(" ", "").count(phrase.replace(" ", ""))
    return f" {text} ".count(f" {phrase} ")


def oov_of(tokens: list[str], known: Callable[[str], bool]) -> tuple[int, list[str]]:
    """``(counted, unknown)``: how many of a reference's ``tokens`` count (not removed by scoring: punctuation) and
    those of them that are not ``known`` (:func:`token_list_covers`), in order."""
    tokens = [t for t in tokens if normalize(t)]
    return len(tokens), [t for t in tokens if not known(t)]


@dataclass
class Scorer:
    """Accumulates CER and WER over utterances and keeps per-utterance lines for the report (``lines``, or with
    ``sink`` each line handed to it instead: counts in memory, not lines)."""

    cer: EditCounts = field(default_factory=EditCounts)
    wer: EditCounts = field(default_factory=EditCounts)
    lines: list[str] = field(default_factory=list)
    utts: int = 0
    utts_wrong: int = 0
    missing: list[str] = field(default_factory=list)  # reference utterances not decoded (scored as all deletions)
    unread: list[str] = field(default_factory=list)  # places of the reference that could not be read
    ref_tokens: int = 0
    oov_tokens: int = 0
    oov_examples: list[str] = field(default_factory=list)
    hotwords: list[str] = field(default_factory=list)
    confusions: Counter = field(default_factory=Counter)
    hotword_counts: list[int] = field(default_factory=lambda: [0, 0, 0])  # in refs, in hyps, in unbiased hyps
    sink: Callable[[str], object] | None = None  # takes each utterance's report line (a file's write) instead of lines

    def count_oov(self, tokens: list[str], known: Callable[[str], bool]) -> None:
        """Count the reference's ``tokens`` and those that are not ``known`` (see :func:`token_list_covers`);
        tokens that scoring removes (punctuation) are not counted."""
        self.add_oov(*oov_of(tokens, known))

    def add_oov(self, counted: int, unknown: list[str]) -> None:
        """Count ``counted`` reference tokens, ``unknown`` of them outside the token list (:func:`oov_of`)."""
        self.ref_tokens += counted
        for t in unknown:
            self.oov_tokens += 1
            if t not in self.oov_examples and len(self.oov_examples) < 10:
                self.oov_examples.append(t)

    def add(self, key: str, ref: str, hyp: str, unbiased: str | None = None, note: str = "") -> tuple[EditCounts,
                                                                                                        EditCounts]:
        """Score ``hyp`` against ``ref``, both :func:`normalize`d first; ``note`` ends the utterance's first report
        line."""
        ref, hyp = normalize(ref), normalize(hyp)
        c = edit_counts(char_units(ref), char_units(hyp))
        w = edit_counts(word_units(ref), word_units(hyp))
        if w.errors:
            self.confusions.update(confusion_pairs(word_units(ref), word_units(hyp)))
        if self.hotwords:
            for word in self.hotwords:
                n = count_phrase(ref, word)
                if n:
                    self.hotword_counts[0] += n
                    self.hotword_counts[1] += min(n, count_phrase(hyp, word))
                    if unbiased is not None:
                        self.hotword_counts[2] += min(n, count_phrase(normalize(unbiased), word))
        self.cer.add(c)
        self.wer.add(w)
        self.utts += 1
        self.utts_wrong += bool(w.errors or c.errors)
        line = (f"{key} cer {c.errors}/{c.ref} (S={c.sub} I={c.ins} D={c.dele}) "
                f"wer {w.errors}/{w.ref} (S={w.sub} I={w.ins} D={w.dele}){note}\n"
                f"  ref: {ref}\n  hyp: {hyp}\n")
        if self.sink is not None:
            self.sink(line)
        else:
            self.lines.append(line)
        return c, w

    def add_missing(self, key: str, ref: str, why: str = "") -> None:
        """An utterance of the reference with no hypothesis (the loader dropped it: ``why``): scored as all
        deletions, named in the summary and marked in its report line."""
        self.add(key, ref, "", note=f" NOT DECODED (loader drops: {why or 'unknown'})")
        self.missing.append(key)

    def utterance_count(self) -> str:
        """How many utterances were scored of how many the reference holds, and the ones not decoded, named."""
        line = f"utterances scored: {self.utts} of {self.utts} in the reference"
        if self.missing:
            shown = ", ".join(self.missing[:20]) + (f", ... ({len(self.missing) - 20} more)"
                                                   if len(self.missing) > 20 else "")
            line += (f" ({self.utts - len(self.missing)} decoded; {len(self.missing)} not decoded, scored as all "
                     f"deletions: {shown})")
        if self.unread:
            line += (f"; the references of {len(self.unread)} part(s) of the list could not be read and are not "
                     f"counted: {self.unread[0]}")
        return line

    def summary(self) -> str:
        c, w = self.cer, self.wer
        lines = [
            f"%CER {100 * c.rate:.2f} [ {c.errors} / {c.ref}, {c.ins} ins, {c.dele} del, {c.sub} sub ]",
            f"%WER {100 * w.rate:.2f} [ {w.errors} / {w.ref}, {w.ins} ins, {w.dele} del, {w.sub} sub ]",
            f"%SER {100 * self.utts_wrong / max(self.utts, 1):.2f} [ {self.utts_wrong} / {self.utts} utterances ]",
            self.utterance_count(),
            "(CER: every non-space character; WER: Latin words, each CJK character counted as a word)",
            f"(text normalised before scoring: {NORMALIZATION})",
        ]
        if self.ref_tokens:
            lines.append(f"reference tokens outside the token list: {self.oov_tokens} / {self.ref_tokens} "
                         f"({100 * self.oov_tokens / self.ref_tokens:.2f}%)"
                         + (f", e.g. {' '.join(self.oov_examples)} (no model with this token list can "
                            f"output them; they count as errors)" if self.oov_tokens else ""))
        recall = self.hotword_recall()
        if recall is not None:
            lines.append(f"hotword recall {100 * recall[0]:.2f}% [ {self.hotword_counts[1]} / {self.hotword_counts[0]} "
                         f"occurrences of {len(self.hotwords)} hotwords ]; without hotwords {100 * recall[1]:.2f}%")
        return "\n".join(lines) + "\n"

    def hotword_recall(self) -> tuple[float, float] | None:
        """(recall with hotwords, recall of the same search without them) of the listed words, or None."""
        total, hit, before = self.hotword_counts
        if not self.hotwords or not total:
            return None
        return hit / total, before / total

    def confusion_table(self, top: int = 20) -> str:
        if not self.confusions:
            return ""
        rows = [f"  {n:6d}  {r} -> {h}" for (r, h), n in self.confusions.most_common(top)]
        return (f"most frequent confusions (WER units; * = nothing: a deletion or insertion), top {top}:\n"
                + "\n".join(rows) + "\n")

    def report(self) -> str:
        return self.summary() + "\n" + self.confusion_table() + "\n" + "".join(self.lines)
