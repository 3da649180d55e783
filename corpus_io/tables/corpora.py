"""Preparation of real corpus layouts into Kaldi data dirs (``corpus-io prepare``).

Supported layouts, as distributed:

* **AISHELL-1** (OpenSLR 33): ``<root>/data_aishell/wav/{train,dev,test}/<spk>/<utt>.wav`` and
  ``<root>/data_aishell/transcript/aishell_transcript_v0.8.txt`` (``<utt> <words separated by spaces>``,
  one file for all splits). ``root`` may also be ``data_aishell`` itself. The speaker is the
  directory name (``S0002``). The transcript's word-segmentation spaces are removed by default,
  as WeNet's and ESPnet's AISHELL recipes do before training (``remove_spaces=false`` keeps the text
  exactly as in the file, as Kaldi's s5 recipe does for its word LM).
* **LibriSpeech** (OpenSLR 12): ``<root>/<subset>/<reader>/<chapter>/<reader>-<chapter>-<n>.flac``
  and ``<reader>-<chapter>.trans.txt`` per chapter. ``root`` may also be the dir holding
  ``LibriSpeech/``. As in Kaldi/ESPnet/WeNet, the speaker is ``<reader>-<chapter>`` and the output
  dir of subset ``train-clean-100`` is ``train_clean_100``. Transcripts are kept as they are
  (upper case); wav.scp points at the flac files (read natively, no ``flac -d |`` pipe).

Each split becomes ``<output_dir>/<split>/{wav.scp,text,utt2spk,spk2utt}``, sorted by key (C
locale), written atomically. Audio files are walked speaker by speaker, so memory does not grow
with the corpus (the AISHELL transcript is indexed by file offsets, 16 bytes a line). A malformed
transcript line is a :class:`DataError` naming ``file:line``; an audio file without a transcript
is counted, reported with a few example keys, and left out.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from corpus_io.errors import ConfigError, DataError
from corpus_io.keys import speaker_id
from corpus_io.storage.files import atomic_write, refuse_remote_output
from corpus_io.storage.progress import progress
from corpus_io.tables import kaldi

AISHELL_TRANSCRIPT = "transcript/aishell_transcript_v0.8.txt"
AISHELL_SPLITS = ("train", "dev", "test")
LIBRISPEECH_SUBSETS = ("train-clean-100", "train-clean-360", "train-other-500", "dev-clean", "dev-other",
                       "test-clean", "test-other")
TABLES = ("wav.scp", "text", "utt2spk", "spk2utt")
EXAMPLES = 5


@dataclass
class SplitReport:
    """What one split produced, and what it left out."""

    split: str
    data_dir: Path
    utterances: int = 0
    speakers: int = 0
    no_transcript: int = 0
    no_transcript_examples: list[str] = field(default_factory=list)
    transcript_without_audio: int = 0

    def line(self) -> str:
        text = (f"[prepare {self.split}] {self.utterances} utterances, {self.speakers} speakers -> "
                f"{self.data_dir}/{{{','.join(TABLES)}}}; audio without transcript: {self.no_transcript}")
        if self.no_transcript_examples:
            text += f" (e.g. {', '.join(self.no_transcript_examples)})"
        if self.transcript_without_audio:
            text += f"; transcript lines without audio: {self.transcript_without_audio}"
        return text


class _KaldiDirWriter:
    """Writes the four tables of one split, one speaker group at a time.

    Groups arrive in sorted speaker order with their utterances sorted. When the keys carry the
    speaker as a prefix (both real corpora) the output is sorted as written; otherwise the tables
    are sorted once at the end.
    """

    def __init__(self, data_dir: Path, report: SplitReport, source: Path):
        self.data_dir = data_dir
        self.source = source
        self.report = report
        self.last_key: str | None = None
        self.sorted = True
        self._stack = contextlib.ExitStack()
        self._files = {name: self._stack.enter_context(atomic_write(data_dir / name)) for name in TABLES}

    def __enter__(self) -> _KaldiDirWriter:
        return self

    def __exit__(self, *exc) -> bool:
        if exc[0] is None and self.report.utterances == 0:
            # an empty split is an error: the temp files go, and an earlier good dir stays as it was
            error = _empty_split_error(self.report, self.source)
            self._stack.__exit__(type(error), error, None)
            raise error
        ok = self._stack.__exit__(*exc)
        if exc[0] is None and not self.sorted:
            for name in TABLES:
                _sort_table(self.data_dir / name)
        return ok

    def speaker(self, spk: str, utts: list[tuple[str, str, str]]) -> None:
        """``utts``: ``(key, audio path, text)`` sorted by key."""
        if not utts:
            return
        speaker_id(spk, str(Path(utts[0][1]).parent))  # a field of utt2spk and spk2utt, as a key is
        f = self._files
        for key, path, text in utts:
            if self.last_key is not None and key <= self.last_key:
                self.sorted = False
            self.last_key = key
            f["wav.scp"].write(f"{key} {path}\n")
            f["text"].write(f"{key} {text}\n")
            f["utt2spk"].write(f"{key} {spk}\n")
        f["spk2utt"].write(f"{spk} {' '.join(key for key, _, _ in utts)}\n")
        self.report.utterances += len(utts)
        self.report.speakers += 1


def _sort_table(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    with atomic_write(path) as f:
        f.writelines(sorted(lines, key=lambda line: line.split(" ", 1)[0].encode("utf-8")))


def _subdirs(path: Path) -> list[Path]:
    return sorted((p for p in path.iterdir() if p.is_dir()), key=lambda p: p.name.encode("utf-8"))


def _files_with_suffix(path: Path, suffix: str) -> list[Path]:
    return sorted((p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(suffix)),
                  key=lambda p: p.name.encode("utf-8"))


def _missing(report: SplitReport, key: str) -> None:
    report.no_transcript += 1
    if len(report.no_transcript_examples) < EXAMPLES:
        report.no_transcript_examples.append(key)


def _choose_splits(requested: list[str] | tuple[str, ...], found: list[str], corpus: str, where: Path) -> list[str]:
    if not requested:
        if not found:
            raise DataError(f"no {corpus} split found under {where}. Check ++root (see corpus-io prepare --help "
                            f"for the expected layout).")
        return found
    unknown = [s for s in requested if s not in found]
    if unknown:
        raise DataError(f"{corpus} split(s) {', '.join(unknown)} not found under {where}; found: "
                        f"{', '.join(found) or 'none'}. Fix ++splits or ++root.")
    return list(requested)


# --------------------------------------------------------------------------- AISHELL-1


def aishell_base(root: str | os.PathLike) -> Path:
    """``root/data_aishell`` or ``root`` itself, whichever holds ``wav/`` and ``transcript/``."""
    root = Path(root)
    for base in (root / "data_aishell", root):
        if (base / "wav").is_dir() and (base / AISHELL_TRANSCRIPT).is_file():
            return base
    for base in (root / "data_aishell", root):
        wav = base / "wav"
        if wav.is_dir() and any(p.name.endswith(".tar.gz") for p in wav.iterdir()):
            raise DataError(f"{wav} holds per-speaker archives (*.tar.gz) that are not extracted. Extract them "
                            f"first: cd {wav} && for f in *.tar.gz; do tar xzf \"$f\"; done")
    raise DataError(f"{root} is not an AISHELL-1 tree: expected data_aishell/wav/{{train,dev,test}}/<spk>/*.wav "
                    f"and data_aishell/{AISHELL_TRANSCRIPT} under it (or directly under ++root).")


def prepare_aishell(root: str | os.PathLike, output_dir: str | os.PathLike, splits: list[str] | tuple = (),
                    *, remove_spaces: bool = True) -> list[SplitReport]:
    """AISHELL-1 -> ``output_dir/<split>/`` Kaldi dirs; see the module docstring."""
    base = aishell_base(root)
    found = [s for s in AISHELL_SPLITS if (base / "wav" / s).is_dir()]
    found += [p.name for p in _subdirs(base / "wav") if p.name not in found]
    chosen = _choose_splits(splits, found, "AISHELL-1", base / "wav")
    transcript = kaldi.KeyedTable(base / AISHELL_TRANSCRIPT)  # file:line errors for malformed lines
    reports = []
    try:
        for split in chosen:
            report = SplitReport(split, Path(output_dir) / split)
            with _KaldiDirWriter(report.data_dir, report, base / "wav" / split) as out:
                for spk_dir in progress(_subdirs(base / "wav" / split), desc=f"aishell {split}", unit="spk"):
                    utts = []
                    for wav in _files_with_suffix(spk_dir, ".wav"):
                        key = wav.name[: -len(".wav")]
                        text = transcript.get(key)
                        if text is None:
                            _missing(report, key)
                            continue
                        text = "".join(text.split()) if remove_spaces else text
                        utts.append((key, str(wav.resolve()), text))
                    out.speaker(spk_dir.name, utts)
            reports.append(report)
        if set(chosen) >= set(AISHELL_SPLITS):
            reports[-1].transcript_without_audio = transcript.num_unused()
    finally:
        transcript.close()
    return reports


# --------------------------------------------------------------------------- LibriSpeech


def librispeech_base(root: str | os.PathLike) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"LibriSpeech root {root} is not a directory. Pass ++root=<dir holding train-clean-100/, "
                        f"dev-clean/, ...>.")
    nested = root / "LibriSpeech"
    return nested if nested.is_dir() else root


def _read_chapter_transcript(path: Path, prefix: str) -> dict[str, tuple[str, str]]:
    """``{key: (text, file:line)}`` of one chapter's ``.trans.txt`` (about a hundred lines)."""
    texts: dict[str, tuple[str, str]] = {}
    for line in kaldi.iter_table(path):  # empty text / bad UTF-8 -> DataError with file:line
        if not line.key.startswith(prefix):
            raise DataError(f"{line.where}: utterance '{line.key}' does not belong to this chapter (keys in "
                            f"{path.name} must start with '{prefix}'). Fix or remove the line.")
        if line.key in texts:
            raise DataError(f"duplicate key '{line.key}' in {path}: at {texts[line.key][1]} and {line.where}. "
                            f"Remove one of the lines.")
        texts[line.key] = (line.value, line.where)
    return texts


def _iter_librispeech_chapters(subset_dir: Path) -> Iterator[tuple[str, Path]]:
    for reader in _subdirs(subset_dir):
        for chapter in _subdirs(reader):
            yield f"{reader.name}-{chapter.name}", chapter


def prepare_librispeech(root: str | os.PathLike, output_dir: str | os.PathLike,
                        splits: list[str] | tuple = ()) -> list[SplitReport]:
    """LibriSpeech subsets -> ``output_dir/<subset with _>/`` Kaldi dirs; see the module docstring."""
    base = librispeech_base(root)
    present = [p.name for p in _subdirs(base)]
    found = [s for s in LIBRISPEECH_SUBSETS if s in present] + \
            [s for s in present if s not in LIBRISPEECH_SUBSETS and any((base / s).glob("*/*/*.trans.txt"))]
    chosen = _choose_splits(splits, found, "LibriSpeech", base)
    reports = []
    for subset in chosen:
        report = SplitReport(subset.replace("-", "_"), Path(output_dir) / subset.replace("-", "_"))
        with _KaldiDirWriter(report.data_dir, report, base / subset) as out:
            chapters = progress(_iter_librispeech_chapters(base / subset), desc=f"librispeech {subset}",
                                unit="chapter")
            for spk, chapter_dir in chapters:
                trans = chapter_dir / f"{spk}.trans.txt"
                texts = _read_chapter_transcript(trans, spk + "-") if trans.is_file() else {}
                utts = []
                for flac in _files_with_suffix(chapter_dir, ".flac"):
                    key = flac.name[: -len(".flac")]
                    entry = texts.pop(key, None)
                    if entry is None:
                        _missing(report, key)
                        continue
                    utts.append((key, str(flac.resolve()), entry[0]))
                report.transcript_without_audio += len(texts)
                out.speaker(spk, utts)
        reports.append(report)
    return reports


# --------------------------------------------------------------------------- entry point


def _empty_split_error(report: SplitReport, where: Path) -> DataError:
    why = (f"all {report.no_transcript} audio files lack a transcript" if report.no_transcript
           else "no audio file was found")
    return DataError(f"split '{report.split}' under {where} is empty: {why}. Check ++root and the layout "
                     f"(corpus-io prepare --help). Nothing was written for it.")


def prepare(cfg) -> list[SplitReport]:
    """``corpus-io prepare``: dispatch on ``cfg.corpus``; print one line per split."""
    if cfg.root in ("???", "", None):
        raise ConfigError("config key 'root' is required: the directory holding the corpus. Set ++root=...")
    refuse_remote_output(cfg.output_dir, "++output_dir", "prepare")
    if cfg.corpus == "aishell":
        reports = prepare_aishell(cfg.root, cfg.output_dir, list(cfg.splits), remove_spaces=cfg.remove_spaces)
    else:
        reports = prepare_librispeech(cfg.root, cfg.output_dir, list(cfg.splits))
    for report in reports:
        print(report.line(), file=sys.stderr, flush=True)
    return reports
