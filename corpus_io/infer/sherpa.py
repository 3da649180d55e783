"""Decode with sherpa-onnx as a deployer does: the files of ``export-model`` loaded by sherpa-onnx's own
recognizers (``OfflineRecognizer.from_wenet_ctc``, ``OnlineRecognizer.from_wenet_ctc``) with their default
arguments but ``feature_dim``, the audio fed as 16-bit-scale floats in [-1, 1] (online: in pieces, then
the tail of zeros sherpa's own examples feed so its last chunk is complete).

Used by the espeak recipe's serving stage, ``make bench BENCH=stream`` and the tests (the ``[deploy]`` extra:
``pip install -e '.[deploy]'`` in a checkout). Times: seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple

from corpus_io.errors import ConfigError, DataError

if TYPE_CHECKING:
    import numpy as np

#: zeros fed after the utterance so sherpa's online recognizer completes its last chunk (a chunk of 16 frames
#: reads 67 feature frames; the last one may lack 66), as sherpa-onnx's own online examples feed them
#: (``np.zeros(int(0.66 * sample_rate))``, python-api-examples/online-decode-files.py)
TAIL_SECONDS = 0.66


@dataclass
class SherpaRun:
    """Hypotheses by key; online also the compute seconds of each chunk (its ``decode_stream`` call and the
    feature extraction of the pieces fed since the chunk before: what corpus-io's transcriber counts per chunk)."""

    texts: dict[str, str] = field(default_factory=dict)
    audio_seconds: float = 0.0
    compute_seconds: float = 0.0
    chunk_seconds: list[float] = field(default_factory=list)

    @property
    def rtf(self) -> float:
        return self.compute_seconds / self.audio_seconds if self.audio_seconds else 0.0


def check_serving(model: str, tokens: str, *, online: bool, feature_dim: int, chunk_size: int = 16,
                  num_left_chunks: int = 4) -> dict[str, str]:
    """The export's metadata, once the arguments sherpa-onnx would be given are checked against it: sherpa-onnx
    takes them unchecked and ends the process on a bad one (a signal for ``chunk_size=0``, a C++ exception for a
    streaming file given to the offline recognizer), so each is a ConfigError naming the argument and what to
    give: the files exist, the model is an export of corpus-io without the front end (sherpa computes the
    features), streaming (online) or full context (offline) as asked, ``feature_dim`` its feature dimension, the
    token list as long as its vocabulary, and online a chunk and left chunks of at least 1 (sherpa keeps a fixed
    cache of chunk x left chunks frames)."""
    from corpus_io.infer.exported import META_PREFIX, read_metadata

    for what, path in (("model", model), ("token list", tokens)):
        if not Path(path).is_file():
            raise ConfigError(f"the {what} {path} does not exist or is not a file; give the files corpus-io "
                              f"export-model wrote (model.onnx and tokens.txt beside it).")
    if not str(model).lower().endswith(".onnx"):
        raise ConfigError(f"the model {model} is not an ONNX file (.onnx); sherpa-onnx runs the ONNX file of "
                          f"corpus-io export-model.")
    _, meta = read_metadata(str(model), "onnx")
    inputs = meta[META_PREFIX + "inputs"]
    if inputs == "waveform":
        raise ConfigError(f"the model {model} was exported with ++frontend=true (waveforms in), but sherpa-onnx "
                          f"computes the features itself and feeds them to the model; export it without the front "
                          f"end (corpus-io export-model ++frontend=false, or ++streaming=true for online).")
    if online and inputs != "chunk":
        raise ConfigError(f"the model {model} is a full-context export, which sherpa-onnx's online recognizer "
                          f"cannot run (it feeds one chunk and its caches per call). Export the streaming model "
                          f"(corpus-io export-model ++streaming=true, from a model.causal=true checkpoint), or "
                          f"decode this file offline (without --online).")
    if not online and inputs == "chunk":
        raise ConfigError(f"the model {model} is a streaming export (++streaming=true: one chunk and its caches per "
                          f"call), which sherpa-onnx's offline recognizer cannot run. Decode it online (--online), "
                          f"or export the full-context model (export-model without ++streaming) for offline.")
    dim = meta.get("feature_dim")
    if dim is not None and int(dim) != int(feature_dim):
        raise ConfigError(f"feature dimension {feature_dim} was given, but the model {model} takes {dim} features "
                          f"a frame (its metadata's feature_dim, the training fbank's num_mel_bins); give "
                          f"{dim} (--feature-dim {dim}).")
    vocab = meta.get("vocab_size")
    lines = sum(1 for line in Path(tokens).read_text(encoding="utf-8", errors="replace").splitlines() if line)
    if vocab is not None and lines != int(vocab):
        raise ConfigError(f"the token list {tokens} has {lines} lines, but the model {model} has {vocab} outputs "
                          f"(its vocab_size); give the tokens.txt export-model wrote beside this model.")
    if online:
        for name, value in (("chunk size", chunk_size), ("number of left chunks", num_left_chunks)):
            if int(value) < 1:
                raise ConfigError(f"the {name} is {value}; sherpa-onnx's online WeNet CTC model needs at least 1 "
                                  f"(it keeps a fixed attention cache of chunk size x left chunks encoder frames, "
                                  f"so -1 for 'all' has no meaning there). Give a positive number: 16 and 4 are "
                                  f"sherpa-onnx's defaults.")
    return meta


def recognizer(model: str, tokens: str, *, online: bool, feature_dim: int, chunk_size: int = 16,
               num_left_chunks: int = 4, num_threads: int = 1) -> Any:
    """sherpa-onnx's WeNet CTC recognizer for an exported file (online: its chunk and left chunks), the arguments
    checked first (:func:`check_serving`)."""
    check_serving(model, tokens, online=online, feature_dim=feature_dim, chunk_size=chunk_size,
                  num_left_chunks=num_left_chunks)
    import sherpa_onnx

    if online:
        return sherpa_onnx.OnlineRecognizer.from_wenet_ctc(tokens=tokens, model=model, chunk_size=chunk_size,
                                                           num_left_chunks=num_left_chunks, num_threads=num_threads,
                                                           feature_dim=feature_dim)
    return sherpa_onnx.OfflineRecognizer.from_wenet_ctc(model=model, tokens=tokens, num_threads=num_threads,
                                                        feature_dim=feature_dim)


class Utterance(NamedTuple):
    """One utterance of a list: its key, audio source, transcript and segment times (None: the whole file)."""

    key: str
    source: str
    text: str = ""
    start: float | None = None
    end: float | None = None


def utterances(path: str) -> list[Utterance]:
    """The utterances of any input corpus-io reads (a FunASR ``source``/``target`` or WeNet ``wav``/``txt`` JSONL,
    a Kaldi data dir with wav.scp and text, ...), in file order; a bad line is a DataError naming it."""
    from corpus_io.tables.inputs import iter_records

    if not Path(path).exists():
        raise DataError(f"the list {path} does not exist; give a raw list (a JSONL of key and source/wav lines) "
                        f"or a Kaldi data dir.")
    rows = [Utterance(str(r["key"]), str(r["source"]), str(r.get("target") or ""), r.get("start"), r.get("end"))
            for r in iter_records(path)]
    if not rows:
        raise DataError(f"the list {path} holds no utterance; give the list of the set to decode.")
    return rows


def read_samples(utt: Utterance | tuple[str, str]) -> tuple[np.ndarray, int]:
    """An utterance's samples (float32 in [-1, 1], one channel: channels averaged) and rate, read as the loader
    reads them; audio that cannot be decoded or holds NaN or infinity is a DataError naming it (never decoded as
    an empty hypothesis)."""
    from corpus_io.audio.io import decode_bytes, read_source_bytes, segment_samples, to_mono

    utt = utt if isinstance(utt, Utterance) else Utterance(*utt)
    where = f"utterance '{utt.key}' ({utt.source})"
    wave, rate = decode_bytes(read_source_bytes(utt.source), where=where)
    samples = to_mono(wave).astype("float32", copy=False)
    if utt.start is not None or utt.end is not None:
        try:
            first, last = segment_samples(float(utt.start or 0.0), float(-1 if utt.end is None else utt.end), rate,
                                          len(samples))
        except DataError as exc:
            raise DataError(f"{where}: {exc}") from None
        samples = samples[first:last]
    return samples, rate


def decode_wavs(rec: Any, wavs: Iterable[Utterance | tuple[str, str]], *, online: bool,
                piece_seconds: float = 0.1) -> SherpaRun:
    """Utterances (or ``(key, wav path)`` pairs) through ``rec``: each read by :func:`read_samples` (float32 in
    [-1, 1], its own rate), online fed in ``piece_seconds`` pieces, decoding whenever a chunk is ready."""
    import numpy as np

    run = SherpaRun()
    for utt in wavs:
        key = utt[0]
        samples, rate = read_samples(utt)
        run.audio_seconds += len(samples) / rate
        stream = rec.create_stream()
        if not online:
            # sherpa-onnx 2.0.1 dithers offline features from a per-process generator: each decode draws other
            # noise, so a word the model is unsure of may change with the file's place (DECODING.md)
            t0 = time.perf_counter()
            stream.accept_waveform(rate, samples)
            rec.decode_stream(stream)
            run.compute_seconds += time.perf_counter() - t0
            run.texts[key] = stream.result.text.strip()
            continue
        piece = max(1, int(piece_seconds * rate))
        tail = np.zeros(int(TAIL_SECONDS * rate), dtype=np.float32)
        pieces = [samples[i:i + piece] for i in range(0, len(samples), piece)] + [tail]
        pending = 0.0  # feature seconds since the last chunk
        for i, chunk in enumerate(pieces):
            t0 = time.perf_counter()
            stream.accept_waveform(rate, chunk)
            if i == len(pieces) - 1:
                stream.input_finished()
            pending += time.perf_counter() - t0
            while rec.is_ready(stream):
                t1 = time.perf_counter()
                rec.decode_stream(stream)
                run.chunk_seconds.append(pending + time.perf_counter() - t1)
                run.compute_seconds += run.chunk_seconds[-1]
                pending = 0.0
        run.compute_seconds += pending
        run.texts[key] = rec.get_result(stream).strip()
    return run


def agreement(ours: dict[str, str], theirs: dict[str, str]) -> tuple[int, int, list[str]]:
    """``(same, total, keys that differ)``: utterances whose words are identical (whitespace-normalised)."""
    differ = [k for k in ours if " ".join(ours[k].split()) != " ".join(theirs.get(k, "").split())]
    return len(ours) - len(differ), len(ours), differ
