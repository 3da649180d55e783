"""Manifests in: the five kinds of input every reading command accepts, detected by content.

``pack-shards``, ``make-datalist``, ``make-tokenizer``, ``stats``, the raw loader and (through the loader)
``compute-cmvn`` read their ``++input`` here, as canonical records (FunASR names, see
:func:`corpus_io.tables.manifest.canonical`: ``key``, ``source``, ``target``, optional ``start``/``end`` in seconds,
``speaker`` and any extra fields):

* a **FunASR jsonl** (``key``, ``source``, ``target``, ...) and a **WeNet raw list** (``key``, ``wav``, ``txt``);
* a **Kaldi data dir** (``wav.scp`` + ``text``, optional ``segments``, ``utt2spk``; or ``feats.scp``);
* a **NeMo manifest** (``audio_filepath``, ``duration``, ``text``, optional ``offset``, ``speaker``, ``lang``; the
  aliases NeMo's parser takes, ``audio_filename`` and ``normalized_text``, too): see :func:`nemo_key`
  for the key of a line without ``key``; with ``offset`` the utterance is the segment
  ``[offset, offset + duration]``, without it the whole file (``duration`` is kept as metadata, NeMo rounds
  it). A relative ``audio_filepath`` is taken from the manifest's directory when the file is there (NeMo's
  rule), else from the current directory. In a tarred NeMo dataset (lines with ``shard_id``) it is the member
  of ``audio_<shard_id>.tar`` beside the manifest (NeMo's layout), read as the source ``<tar>//<member>``;
* a **Lhotse Shar** (a directory of ``cuts.NNNNNN.jsonl.gz`` + ``recording.NNNNNN.tar``, or one cuts file): one
  utterance per cut, read as a CutSet's, its audio the member of the tar beside it (:mod:`corpus_io.tables.shar`);
* a **Lhotse manifest**, jsonl or jsonl.gz: a **CutSet** (one utterance per ``MonoCut``: its span of the
  recording, the texts of its supervisions joined in time order) or a **RecordingSet + SupervisionSet**
  (one utterance per supervision; give either file or their directory: the other file is found by
  swapping ``recordings``/``supervisions`` in the name, as Lhotse recipes name them);
* **Hugging Face parquet** (a ``.parquet`` file, a directory or glob of them, local or a URL): rows with an audio
  struct and a text column (:mod:`corpus_io.tables.parquet`; ``columns`` maps the roles), whose records carry the
  audio bytes in ``source_bytes``.

A multi-channel file is mixed down to mono as everywhere in corpus-io, so a MultiCut of all its channels is
read. Refused with a clear message (no silent guess): a cut or supervision outside its recording (checked as a
Kaldi segment is), a supervision of another recording in a cut, a cut of some channels of a multi-channel file,
overlapping supervisions in one cut (two transcripts for one stretch of audio), MixedCut/PaddingCut,
features-only cuts, recordings with transforms, in-memory sources.

Memory: one pass over the driver file records 24 bytes per utterance (offsets, line numbers, key hashes); a
RecordingSet is indexed by 16 bytes per recording. A ``.gz`` manifest is decompressed once into a temporary
file (streamed, deleted when the input is closed or the process exits) so it can be read by offsets.
"""

from __future__ import annotations

import glob
import gzip
import os
import tempfile
import weakref
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from corpus_io.errors import ConfigError, DataError
from corpus_io.keys import first_repeated_key, speaker_id
from corpus_io.storage.files import MAX_INFLATED_BYTES, UTF8_BOM, bounded_lines, copy_inflated, parse_json_object
from corpus_io.tables import kaldi
from corpus_io.tables.cuts import _SAME_TIME, Skip, _join_texts, _lhotse_span, _number, _utterance
from corpus_io.tables.manifest import canonical

KINDS = ("funasr", "wenet", "nemo", "lhotse-cuts", "lhotse-recordings+supervisions", "lhotse-shar", "kaldi",
         "hf-parquet")
CUT_TYPES = ("MonoCut", "MultiCut", "MixedCut", "PaddingCut")


class Skipped:
    """The ``skip`` of :func:`iter_records` for a command that drops and counts such lines: ``count(reason)`` (e.g.
    ``Summary.skip``) for each, and the first kept, so that an input left with no utterance is reported as what
    happened to its lines (:meth:`nothing_left`), not as an empty file."""

    def __init__(self, count: Callable[[str], None] | None = None):
        self.count = count
        self.first: Skip | None = None
        self.n = 0

    def __call__(self, skip: Skip) -> None:
        self.first = self.first or skip
        self.n += 1
        if self.count is not None:
            self.count(skip.reason)

    def nothing_left(self, path: str, consequence: str, option: str) -> DataError:
        """The error of input ``path`` (the command's ``option``) that gave no utterance: ``consequence`` is what the
        command cannot do."""
        if self.first is None:
            return DataError(f"{path} has no utterances; {consequence}. Check {option} (an earlier step may have "
                             f"written an empty file).")
        first = f"{self.first.where}: {self.first.what}"
        if self.n == 1:
            return DataError(f"{path}: its only utterance was skipped, so {consequence}: {first}. Fix the line (or "
                             f"remove it).")
        return DataError(f"{path}: all {self.n} of its utterances were skipped, so {consequence}; the first: {first}. "
                         f"Fix those lines (or remove them).")


# --------------------------------------------------------------------------- one line -> one record


def kind_of_line(obj: dict) -> str:
    """Which kind of manifest line ``obj`` is (one of :data:`KINDS`, or ``lhotse-recording`` /
    ``lhotse-supervision`` for the halves of a pair)."""
    if "audio_filepath" in obj or "audio_filename" in obj:  # NeMo reads either name
        return "nemo"
    if obj.get("type") in CUT_TYPES or ("recording" in obj and "supervisions" in obj):
        return "lhotse-cuts"
    if "sources" in obj and "sampling_rate" in obj:
        return "lhotse-recording"
    if "recording_id" in obj and "duration" in obj:
        return "lhotse-supervision"
    return "wenet" if "wav" in obj else "funasr"


def nemo_key(audio_filepath: str, offset: float | None = None) -> str:
    """The key of a NeMo line without ``key``: the file name without its extension (NeMo's tarred datasets
    and Lhotse's ``Recording.from_file`` name audio the same way, so it is unique in their corpora), with
    whitespace replaced by ``_``, plus ``-<offset in ms, 7 digits>`` when ``offset`` is given and not 0
    (``a/b/103-1240-0000.flac`` -> ``103-1240-0000``; offset 12.5 -> ``103-1240-0000-0012500``)."""
    stem = os.path.splitext(os.path.basename(audio_filepath.rstrip("/")))[0]
    stem = "_".join(stem.split())
    if offset:
        return f"{stem}-{int(round(float(offset) * 1000)):07d}"
    return stem


def _nemo_record(obj: dict, where: str, base: str) -> dict | Skip:
    path = obj.get("audio_filepath", obj.get("audio_filename"))
    if not isinstance(path, str) or not path:
        raise DataError(f"{where}: audio_filepath is {path!r}; a NeMo manifest line needs the audio file's path.")
    offset = _number(obj, "offset", where, path)
    key = str(obj["key"]) if obj.get("key") not in (None, "") else nemo_key(path, offset)
    duration = _number(obj, "duration", where, key)
    source = path
    if base and not os.path.isabs(path) and "://" not in path:
        beside = os.path.join(base, path)
        if os.path.exists(beside):  # NeMo's rule: relative to the manifest when the file is there
            source = beside
    if "shard_id" in obj and not os.path.exists(source):  # tarred NeMo: a member of audio_<shard_id>.tar
        tar = os.path.join(base, f"audio_{obj['shard_id']}.tar")
        if not os.path.isfile(tar):
            raise DataError(f"{where}: key '{key}': '{path}' is a member of a tarred NeMo dataset (shard_id "
                            f"{obj['shard_id']}), and {tar} is not there. Keep the manifest beside its "
                            f"audio_<shard_id>.tar files (NeMo's convert_to_tarred_audio_dataset layout).")
        source = f"{tar}//{path}"
    rec: dict[str, Any] = {k: v for k, v in obj.items()
                           if k not in ("audio_filepath", "audio_filename", "text", "normalized_text", "offset",
                                        "shard_id")}
    rec["key"], rec["source"] = key, source
    if offset is not None and (offset or duration is not None):
        rec["start"] = offset
        rec["end"] = offset + duration if duration is not None else -1.0
    text = obj.get("text", obj.get("normalized_text"))  # NeMo's order
    if text is None:
        field = next((f"'{name}' is null" for name in ("text", "normalized_text") if name in obj),
                     "no 'text' field")
        return Skip("missing transcript", where, key, f"{field}: NeMo reads it from 'text' or 'normalized_text'")
    rec["target"] = text if isinstance(text, str) else str(text)
    return canonical(rec, where)


def _lhotse_source(recording: dict, channel: Any, where: str, key: str) -> str:
    """The audio of one channel of a Lhotse recording, or a DataError saying why corpus-io cannot take it."""
    rid = recording.get("id", "?")
    if recording.get("transforms"):
        raise DataError(f"{where}: key '{key}': recording '{rid}' has transforms "
                        f"({[t.get('name') for t in recording['transforms']]}); corpus-io reads the stored audio "
                        f"as it is. Drop the transforms (speed/volume perturbation is the loader's "
                        f"dataset_conf.speed_perturb) or save the transformed audio first.")
    sources = recording.get("sources") or []
    channels = recording.get("channel_ids") or [c for s in sources for c in s.get("channels", [0])]
    if isinstance(channel, list):
        channel = channel[0] if len(channel) == 1 else sorted(channel)
    if len(sources) == 1 and (len(channels) == 1 or channel == sorted(channels)):
        source = sources[0]  # mono, or every channel of one file: mixed down like any multi-channel file
    else:
        chosen = [s for s in sources if s.get("channels") == [channel]]
        if len(chosen) != 1:
            how = ("its channels are in separate files; mix them into one file first" if len(sources) > 1 else
                   "corpus-io reads a file's channels mixed down to mono. Split the channels into files first "
                   "(one source per channel)")
            raise DataError(f"{where}: key '{key}': the cut takes channel(s) {channel} of the {len(channels)}-channel "
                            f"recording '{rid}'; {how}, or in Lhotse save the audio you mean (e.g. "
                            f"cut.to_mono(mono_downmix=True).save_audio(...)) and write that CutSet.")
        source = chosen[0]
    kind, value = source.get("type"), source.get("source")
    if kind in ("file", "url") and isinstance(value, str):
        return value
    if kind == "command" and isinstance(value, str):
        return value.rstrip() + " |"  # run only with ++allow_pipe=true, like a Kaldi pipe
    raise DataError(f"{where}: key '{key}': recording '{rid}' has a '{kind}' source; corpus-io reads file, url "
                    f"and command sources. Save the audio to files first (e.g. cuts.save_audios in Lhotse).")


def _lhotse_cut_record(obj: dict, where: str, base: str = "") -> dict | Skip:
    key = str(obj.get("id", ""))
    kind = obj.get("type", "MonoCut")
    if kind not in ("MonoCut", "MultiCut"):
        raise DataError(f"{where}: cut '{key}' is a {kind}: it is made of several tracks or padding. Save the mixed "
                        f"audio first (cuts.save_audios in Lhotse) and write the CutSet of those files.")
    recording = obj.get("recording")
    if not isinstance(recording, dict):
        raise DataError(f"{where}: cut '{key}' has no recording (a features-only cut?); corpus-io needs the audio.")
    start, duration = _lhotse_span(obj, recording, where, key, "cut")
    source = _lhotse_source(recording, obj.get("channel", 0), where, key)
    sups = obj.get("supervisions") or []
    other = next((s for s in sups if s.get("recording_id", recording.get("id")) != recording.get("id")), None)
    if other is not None:
        raise DataError(f"{where}: cut '{key}' is of recording '{recording.get('id')}', but its supervision "
                        f"'{other.get('id')}' is of recording '{other.get('recording_id')}': its text belongs to other "
                        f"audio. Fix the cut in Lhotse (e.g. rebuild it with CutSet.from_manifests) and save the "
                        f"CutSet again.")
    if not sups:
        return Skip("no supervision", where, key, "'supervisions' is empty: the transcript is a supervision's 'text'")
    text, speaker, language = _join_texts(sups, where, key)
    whole = start < _SAME_TIME and abs(duration - float(recording.get("duration", -1))) < _SAME_TIME
    return _utterance(key, source, start, duration, whole, text, speaker, language, where)


def record_of_line(obj: dict, where: str = "", base: str = "") -> dict | Skip:
    """The canonical record of one line of a line-local manifest (FunASR, WeNet, NeMo, a Lhotse cut);
    ``base`` is the manifest's directory (NeMo's relative paths). A half of a Lhotse pair is refused here:
    it needs the other file (:func:`open_input` reads the pair)."""
    kind = kind_of_line(obj)
    if kind == "nemo":
        return _nemo_record(obj, where, base)
    if kind == "lhotse-cuts":
        return _lhotse_cut_record(obj, where)
    if kind in ("lhotse-recording", "lhotse-supervision"):
        raise DataError(f"{where}: this is a line of a Lhotse {kind.split('-')[1].title()}Set, which needs its "
                        f"other half. Give pack-shards or make-datalist the supervisions (or recordings) file or "
                        f"their directory, or convert it once: corpus-io make-datalist ++data_type=raw "
                        f"++input=<it> ++output=data.list.")
    if "key" not in obj or not ({"source", "wav"} & set(obj)):
        raise DataError(f"{where}: a line needs 'key' and 'source' (FunASR) or 'wav' (WeNet), 'audio_filepath' "
                        f"(NeMo), or must be a Lhotse cut; it has {sorted(obj)}.")
    return canonical(obj, where)


# --------------------------------------------------------------------------- one input -> a stream of records


class Input:
    """One input: a driver file read line by line, and a parser from a line to a record (or a :class:`Skip`).

    ``scan()`` makes the first pass (offsets, line numbers, duplicate keys; 24 bytes per utterance);
    ``records(shuffle, seed)`` streams the records, in file order or a seeded permutation of the offsets.
    Every record carries ``where`` (``file:line``).
    """

    def __init__(self, driver: str, key_of: Callable[[bytes, int], str | None],
                 record_of: Callable[[bytes, int], dict | Skip | None], describe: str, kind: str,
                 name: str | None = None, files: list[str] | None = None, may_skip: bool = True):
        self.driver = driver  # the file read (a temporary copy of a .gz)
        self.name = name or driver  # the file named in messages
        self.files = files or [self.name]  # every file the records are read from (a job's fingerprint)
        self.may_skip = may_skip  # record_of can yield a Skip (so a job's shard numbering needs a counting pass)
        self.key_of = key_of  # cheap, for the first pass; None for a blank line
        self.record_of = record_of  # a record, a Skip, or None for a blank line
        self.describe = describe
        self.kind = kind
        self.offsets = array("q")
        self.linenos = array("q")

    def scan(self, *, offsets: bool = True, check_keys: bool = True) -> int:
        """First pass: offsets, line numbers, duplicate keys; returns the count. 24 bytes per utterance
        (``offsets=False``: 8, only the duplicate check, for streaming in file order).

        ``check_keys=False`` (a job of N over a jsonl, whose lines are its records): offsets of the non-blank
        lines only, no parsing: a job reads the whole input, and parsing it is most of that cost; a key held
        twice is refused by merge-jobs, which sees every key."""
        hashes = array("q")
        offset = 0
        self.offsets, self.linenos = array("q"), array("q")
        with open(self.driver, "rb") as f:
            for lineno, raw in bounded_lines(f, self.name):
                if not check_keys:
                    if raw.strip() and (lineno > 1 or raw.removeprefix(UTF8_BOM).strip()):
                        self.offsets.append(offset)
                        self.linenos.append(lineno)
                    offset += len(raw)
                    continue
                key = self.key_of(raw, lineno)
                if key is not None:
                    if offsets:
                        self.offsets.append(offset)
                        self.linenos.append(lineno)
                    hashes.append(kaldi.key_hash(key))
                offset += len(raw)
        if repeat := first_repeated_key(hashes, self.keys):
            key, first, second = repeat
            hint = (" NeMo lines without 'key' are named by the audio file name (and offset): add a 'key' "
                    "field to tell them apart." if self.kind == "nemo" else "")
            raise DataError(f"duplicate key '{key}' in {self.name}: at {first} and {second}. Keys must be "
                            f"unique; remove or rename one.{hint}")
        return len(hashes) if check_keys else len(self.offsets)

    def keys(self) -> Iterator[tuple[str, str]]:
        """``(key, file:line)`` of every utterance, in file order."""
        with open(self.driver, "rb") as f:
            for lineno, raw in bounded_lines(f, self.name):
                key = self.key_of(raw, lineno)
                if key is not None:
                    yield key, f"{self.name}:{lineno}"

    def records(self, shuffle: bool = False, seed: int = 0, start: int = 0) -> Iterator[dict | Skip]:
        """The records in (shuffled) order, from the ``start``-th line that holds one (a job's first shard;
        ``start`` > 0 needs :meth:`scan` first)."""
        if start >= len(self.offsets) > 0:
            return
        with open(self.driver, "rb") as f:
            if not shuffle:
                before = 0
                if start:
                    f.seek(self.offsets[start])
                    before = int(self.linenos[start]) - 1
                for lineno, raw in bounded_lines(f, self.name):
                    rec = self.record_of(raw, lineno + before)
                    if rec is not None:
                        yield rec
                return
            if not self.offsets:
                self.scan()
            # Seeded permutation of line offsets (8 bytes/utt), not of records.
            order = np.random.default_rng(seed).permutation(len(self.offsets))
            for i in order[start:]:
                f.seek(self.offsets[i])
                rec = self.record_of(f.readline(), int(self.linenos[i]))
                if rec is not None:
                    yield rec


def _plain(path: str, owner: Any = None) -> str:
    """``path``, or for a ``.gz`` a temporary decompressed copy (streamed; deleted with ``owner`` or at exit)."""
    if not path.endswith(".gz"):
        return path
    fd, tmp = tempfile.mkstemp(prefix="corpus-io-", suffix="-" + os.path.basename(path)[:-3])
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as src:
            copy_inflated(src, out, path)  # bounded: a gzip inflating to a GiB of blank lines is refused early
    except (OSError, EOFError) as exc:
        os.unlink(tmp)
        raise DataError(f"cannot decompress {path}: {exc}. Check the file (a partial download?).") from None
    except DataError:
        os.unlink(tmp)
        raise
    if owner is not None:
        weakref.finalize(owner, _unlink, tmp)
    return tmp


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _json_of(raw: bytes, where: str) -> dict | None:
    if raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]
    if not raw.strip():
        return None
    return parse_json_object(raw, where, "Each line of a jsonl manifest must be one JSON object.")


def _first_object(path: str) -> dict | None:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for lineno, raw in bounded_lines(f, path, max_total=MAX_INFLATED_BYTES if path.endswith(".gz") else None):
                obj = _json_of(raw, f"{path}:{lineno}") if raw.lstrip(UTF8_BOM).lstrip().startswith(b"{") else None
                if obj is not None:
                    return obj
                if raw.strip():
                    return None
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}. Check ++input.") from None
    return None


def _line_input(path: str, kind: str) -> Input:
    driver_holder: list[str] = []
    base = os.path.dirname(os.path.abspath(path))

    def record(raw: bytes, lineno: int) -> dict | Skip | None:
        obj = _json_of(raw, f"{path}:{lineno}")
        if obj is None:
            return None
        rec = record_of_line(obj, f"{path}:{lineno}", base)
        if isinstance(rec, dict):
            rec["where"] = f"{path}:{lineno}"
        return rec

    def key_of(raw: bytes, lineno: int) -> str | None:
        rec = record(raw, lineno)
        return None if rec is None else rec.key if isinstance(rec, Skip) else rec["key"]

    inp = Input(path, key_of, record, f"{kind} manifest {path}", kind, name=path,
                may_skip=kind not in ("funasr", "wenet"))
    driver_holder.append(_plain(path, inp))
    inp.driver = driver_holder[0]
    return inp


class _JsonById:
    """Random access to the JSON lines of a file by their ``id`` (a RecordingSet): 16 bytes per line."""

    def __init__(self, path: str, name: str):
        self.path, self.name = path, name
        hashes, offsets = array("q"), array("q")
        offset = 0
        with open(path, "rb") as f:
            for lineno, raw in bounded_lines(f, name):
                obj = _json_of(raw, f"{name}:{lineno}")
                if obj is not None:
                    if "id" not in obj:
                        raise DataError(f"{name}:{lineno}: a Lhotse recording needs an 'id'; it has {sorted(obj)}.")
                    hashes.append(kaldi.key_hash(str(obj["id"])))
                    offsets.append(offset)
                offset += len(raw)
        h = np.frombuffer(hashes, dtype=np.int64)
        order = np.argsort(h, kind="stable")
        self._hashes = h[order]
        self._offsets = np.frombuffer(offsets, dtype=np.int64)[order]
        self._file = open(path, "rb")
        weakref.finalize(self, self._file.close)

    def get(self, rid: str) -> dict | None:
        h = kaldi.key_hash(rid)
        i = int(np.searchsorted(self._hashes, h))
        while i < len(self._hashes) and self._hashes[i] == h:
            self._file.seek(int(self._offsets[i]))
            obj = _json_of(self._file.readline(), self.name)
            if obj is not None and str(obj.get("id")) == rid:
                return obj
            i += 1
        return None


def _pair_files(path: str, listed: tuple[str, ...] | None = None) -> tuple[str, str]:
    """``(recordings, supervisions)`` of a Lhotse pair given one of the two files or their directory (``listed``:
    the directory's entries when the caller has listed it)."""
    p = Path(path)
    if p.is_dir():
        found = {}
        entries = [Path(e) for e in listed] if listed is not None else list(p.iterdir())
        for half in ("recordings", "supervisions"):
            matches = sorted(str(m) for m in entries if half in m.name and m.name.endswith((".jsonl", ".jsonl.gz")))
            if len(matches) != 1:
                raise DataError(f"{path} holds {len(matches)} Lhotse {half} files ({matches or 'none'}); give the "
                                f"supervisions file itself as ++input.")
            found[half] = matches[0]
        return found["recordings"], found["supervisions"]
    mine, other = ("recordings", "supervisions") if "recordings" in p.name else ("supervisions", "recordings")
    partner = p.with_name(p.name.replace(mine, other))
    if mine not in p.name or not partner.is_file():
        raise DataError(f"{path} is one half of a Lhotse RecordingSet + SupervisionSet, and its other half was not "
                        f"found (looked for {partner.name if mine in p.name else 'a name with recordings/supervisions'}"
                        f"). Name them *recordings*.jsonl[.gz] and *supervisions*.jsonl[.gz] in one directory, or "
                        f"give a CutSet (CutSet.from_manifests(...).to_file('cuts.jsonl.gz')).")
    return (str(p), str(partner)) if mine == "recordings" else (str(partner), str(p))


def _lhotse_pair_input(path: str, listed: tuple[str, ...] | None = None) -> Input:
    rec_path, sup_path = _pair_files(path, listed)
    recordings: list[_JsonById] = []

    def record(raw: bytes, lineno: int) -> dict | Skip | None:
        where = f"{sup_path}:{lineno}"
        sup = _json_of(raw, where)
        if sup is None:
            return None
        key = str(sup.get("id", ""))
        if not key or "recording_id" not in sup:
            raise DataError(f"{where}: a Lhotse supervision needs 'id', 'recording_id', 'start' and 'duration'; "
                            f"it has {sorted(sup)}.")
        recording = recordings[0].get(str(sup["recording_id"]))
        if recording is None:
            return Skip("recording missing from the RecordingSet", where, key,
                        f"its recording_id '{sup['recording_id']}' is not in {rec_path}")
        start, duration = _lhotse_span(sup, recording, where, key, "supervision")
        source = _lhotse_source(recording, sup.get("channel", 0), where, key)
        whole = start < _SAME_TIME and abs(duration - float(recording.get("duration", -1))) < _SAME_TIME
        text = sup.get("text")
        if text is None:
            return Skip("missing transcript", where, key,
                        "the supervision's 'text' is null" if "text" in sup else "the supervision has no 'text'")
        rec = _utterance(key, source, start, duration, whole, str(text), sup.get("speaker"), sup.get("language"),
                         where)
        rec["where"] = where
        return rec

    def key_of(raw: bytes, lineno: int) -> str | None:
        sup = _json_of(raw, f"{sup_path}:{lineno}")
        return None if sup is None else str(sup.get("id", ""))

    inp = Input(sup_path, key_of, record, f"Lhotse RecordingSet {rec_path} + SupervisionSet {sup_path}",
                "lhotse-recordings+supervisions", name=sup_path, files=[rec_path, sup_path])
    inp.driver = _plain(sup_path, inp)
    recordings.append(_JsonById(_plain(rec_path, inp), rec_path))
    return inp


def _kaldi_input(data_dir: Path, *, feats: bool) -> Input:
    def table(name: str) -> kaldi.KeyedTable | None:
        p = data_dir / name
        return kaldi.KeyedTable(p) if p.is_file() else None

    text = table("text")
    if text is None:
        raise DataError(f"{data_dir} has no 'text' file; a Kaldi data dir needs wav.scp (or feats.scp) and text.")
    utt2spk = table("utt2spk")
    segments = data_dir / "segments"
    if feats:
        driver = data_dir / "feats.scp"
        recordings = None
    elif segments.is_file():
        driver, recordings = segments, table("wav.scp")
    else:
        driver, recordings = data_dir / "wav.scp", None
    if not driver.is_file():
        raise DataError(f"{data_dir} has no {driver.name}. For audio a Kaldi dir needs wav.scp + text; "
                        f"for pack-shards ++feats=true it needs feats.scp + text.")
    if segments.is_file() and not feats and recordings is None:
        raise DataError(f"{data_dir} has 'segments' but no wav.scp for its recordings.")
    path = str(driver)

    def key_of(raw: bytes, lineno: int) -> str | None:
        parsed = kaldi.parse_line(raw, path, lineno)
        return None if parsed is None else parsed[0]

    def record_of(raw: bytes, lineno: int) -> dict | Skip | None:
        parsed = kaldi.parse_line(raw, path, lineno)
        if parsed is None:
            return None
        key, value = parsed
        where = f"{path}:{lineno}"
        rec: dict[str, Any] = {"key": key}
        if recordings is not None:
            seg = kaldi.parse_segment(key, value, where)
            source = recordings.get(seg.recording)
            if source is None:
                return Skip("recording missing from wav.scp", where, key,
                            f"its recording '{seg.recording}' has no line in {data_dir / 'wav.scp'}")
            # the recording id names a segment's recording (a CTM's first field), not its audio file's name
            rec["source"], rec["start"], rec["end"], rec["recording"] = source, seg.start, seg.end, seg.recording
        else:
            rec["source"] = value
        target = text.get(key)
        if target is None:
            return Skip("missing transcript", where, key, f"no line in {data_dir / 'text'}")
        rec["target"] = target
        speaker, at = utt2spk.get_where(key) if utt2spk is not None else (None, "")
        if speaker is not None:
            rec["speaker"] = speaker_id(speaker, f"{at}: key '{key}'")
        rec["where"] = where
        return rec

    files = [path] + [str(data_dir / n) for n in ("wav.scp", "text", "utt2spk")
                      if (data_dir / n).is_file() and str(data_dir / n) != path]
    return Input(path, key_of, record_of, f"Kaldi dir {data_dir}", "kaldi", files=files)


def _shar_input(path: str, cuts: list[str]) -> Input:
    """A local Lhotse Shar: its cuts, paired with their tar members (:class:`corpus_io.tables.shar.SharDriver`)."""
    from corpus_io.tables import shar

    driver = shar.SharDriver(cuts)

    def record(raw: bytes, lineno: int) -> dict | Skip | None:
        obj = _json_of(raw, f"{driver.path}:{lineno}")
        return None if obj is None else driver.record(obj, lineno)

    def key_of(raw: bytes, lineno: int) -> str | None:
        obj = _json_of(raw, f"{driver.path}:{lineno}")
        return None if obj is None else driver.key(obj)

    inp = Input(driver.path, key_of, record, f"Lhotse Shar {path}", "lhotse-shar", name=path, files=driver.files)
    weakref.finalize(inp, _unlink, driver.path)
    return inp


@dataclass(frozen=True)
class TypedInput:
    """An input whose kind is decided, once (:func:`resolve_input`, at the first reader), and passed down so that
    nothing below asks again. ``kind``: one of :data:`KINDS`. ``files``: what deciding it found, so that nothing
    lists it again: the ``.parquet`` files of a local directory, the cuts files of a Shar, the Lhotse manifests of
    a directory, the tables of a Kaldi dir, the file itself for a manifest file; empty for a parquet glob or URL
    (its reader resolves it). ``split``: the Hugging Face split of its parquet files (None: another kind, several
    splits or not known before reading)."""

    path: str
    kind: str
    files: tuple[str, ...] = ()
    split: str | None = None


Walk = list[tuple[str, list[str], list[str]]]


def walk_once(path: str) -> Walk | None:
    """The whole ``os.walk`` of a local directory (its one walk in a command: pass it to whatever else looks at
    the directory), or None for anything else, or a directory that cannot be listed (the check that lists it
    again then says why)."""
    from corpus_io.storage.urls import is_remote

    if is_remote(path) or not os.path.isdir(path):
        return None
    return list(os.walk(path)) or None


def resolve_input(path: str | os.PathLike | TypedInput, tree: Walk | None = None) -> TypedInput:
    """The :class:`TypedInput` of ``path``: its kind by its content (a directory walked once; ``tree``: its
    :func:`walk_once` when the caller has it); a DataError says what is accepted. Given a TypedInput, that one
    (decided already)."""
    from corpus_io.tables import parquet, shar

    if isinstance(path, TypedInput):
        return path
    path = str(path)
    tree = walk_once(path) if tree is None else tree
    names = sorted(tree[0][1] + tree[0][2]) if tree is not None else None
    if parquet.is_parquet(path, tree):
        found = tuple(parquet.parquet_in(tree)) if tree is not None else ()
        base = parquet.split_entry(path)[0]
        splits = {parquet.split_of(f) for f in found or ([] if glob.has_magic(base) else [base])}
        return TypedInput(path, parquet.KIND, found, splits.pop() if len(splits) == 1 else None)
    cuts = shar.shar_input_shards(path, names)  # a Shar directory or cuts file (a remote one: a ConfigError)
    if cuts is not None:
        return TypedInput(path, "lhotse-shar", tuple(cuts))
    p = Path(path)
    if names is not None or p.is_dir():
        names = names if names is not None else sorted(os.listdir(path))
        tables = tuple(str(p / name) for name in _KALDI_TABLES if name in names and (p / name).is_file())
        if any(os.path.basename(t) in ("wav.scp", "feats.scp", "text", "segments") for t in tables):
            return TypedInput(path, "kaldi", tables)
        if any("supervisions" in name for name in names):
            return TypedInput(path, "lhotse-recordings+supervisions", tuple(str(p / name) for name in names))
        raise DataError(f"{path} is a directory but neither a Kaldi data dir (wav.scp + text) nor a directory of "
                        f"Lhotse *recordings* + *supervisions* manifests.")
    if not p.is_file():
        raise DataError(f"input {path} does not exist. Pass a FunASR jsonl (scp2jsonl), a WeNet raw data.list, a "
                        f"Kaldi data dir, a NeMo manifest, a Lhotse manifest (.jsonl / .jsonl.gz) or Hugging Face "
                        f".parquet files.")
    obj = _first_object(str(p))
    if obj is None:  # empty, or not JSON: read as a jsonl, whose reader names the empty file or the bad line
        return TypedInput(path, "funasr", (path,))
    kind = kind_of_line(obj)
    kind = "lhotse-recordings+supervisions" if kind in ("lhotse-recording", "lhotse-supervision") else kind
    return TypedInput(path, kind, (path,))


_KALDI_TABLES = ("wav.scp", "feats.scp", "text", "segments", "utt2spk")


def detect(path: str) -> str:
    """The kind of input ``path`` is (one of :data:`KINDS`): :func:`resolve_input`'s kind."""
    return resolve_input(path).kind


def open_input(path: str | os.PathLike | TypedInput, *, feats: bool = False, columns: dict | None = None,
               storage_options: dict | None = None, inline: bool = True) -> Input:
    """The :class:`Input` of any kind (a file or a Kaldi/Lhotse directory, parquet files), detected by content
    unless ``path`` is a :class:`TypedInput` (then read as the kind it says); ``columns`` and ``storage_options``:
    a parquet input's column roles and remote options; ``inline=False``: its records name each row's audio
    (``source``, :func:`corpus_io.tables.parquet.read_audio`) instead of holding it, so that whoever writes the
    audio (pack-shards' workers) reads it."""
    typed = resolve_input(path)
    if feats and typed.kind != "kaldi":
        raise ConfigError(f"pack-shards ++feats=true needs a Kaldi data dir with feats.scp + text; {typed.path} is "
                          f"a {typed.kind} input.")
    if typed.kind == "hf-parquet":
        from corpus_io.tables.parquet import ParquetInput

        return ParquetInput(typed.path, columns, storage_options, skip=Skip,  # type: ignore[return-value]  # Input's
                            inline=inline, listed=typed.files or None)
    return open_manifest(typed, feats=feats)


def open_manifest(typed: TypedInput, *, feats: bool = False) -> Input:
    """The :class:`Input` of a decided input that names its audio: a Kaldi dir, Lhotse manifests (a pair, a Shar),
    a manifest of lines; every kind but Hugging Face parquet, which holds its audio in its rows
    (:func:`open_input` opens that). The raw loader, which reads only such inputs, opens them here."""
    path, kind = typed.path, typed.kind
    if kind == "hf-parquet":
        raise ValueError(f"{path}: parquet holds its audio in its rows; open it with open_input")
    if kind == "kaldi":
        return _kaldi_input(Path(path), feats=feats)
    if kind == "lhotse-recordings+supervisions":
        return _lhotse_pair_input(path, typed.files if os.path.isdir(path) else None)
    if kind == "lhotse-shar":
        return _shar_input(path, list(typed.files))
    return _line_input(path, kind)


def iter_records(path: str | os.PathLike | TypedInput, *, skip: Callable[[Skip], None] | None = None,
                 check_duplicates: bool = True, columns: dict | None = None) -> Iterator[dict]:
    """Stream the canonical records of any input, in file order. ``check_duplicates``: a first pass refuses a
    repeated key before any record is yielded (8 bytes per utterance). A line that yields no record goes to
    ``skip`` (count it), or without one is a DataError naming it. A parquet input's records carry their audio
    bytes (``source_bytes``)."""
    inp = open_input(path, columns=columns)
    if check_duplicates:
        inp.scan(offsets=False)
    for rec in inp.records():
        if isinstance(rec, Skip):
            if skip is None:
                raise DataError(f"{rec.where}: {rec.what} ({inp.describe}). Fix the input.")
            skip(rec)
            continue
        yield rec


def raise_if_duplicate_keys(paths: list[str], hashes: Any) -> None:
    """A DataError naming both places of a key repeated across the inputs ``paths`` (read in order), given the
    :func:`kaldi.key_hash` of every key; the inputs are re-read only when two hashes match."""
    if repeat := first_repeated_key(hashes, lambda: (pair for path in paths for pair in open_input(path).keys())):
        key, first, second = repeat
        raise DataError(f"duplicate key '{key}': at {first} and {second}. Keys must be unique across the inputs; "
                        f"remove or rename one (e.g. a corpus prefix).")
