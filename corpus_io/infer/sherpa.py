"""Decode with sherpa-onnx as a deployer does: the files of ``export-model`` loaded by sherpa-onnx's own
recognizers (``OfflineRecognizer.from_wenet_ctc``, ``OnlineRecognizer.from_wenet_ctc``) with their default
arguments but ``feature_dim``, the audio fed as 16-bit-scale floats in [-1, 1] (online: in pieces, then
the tail of zeros sherpa's own examples feed so its last chunk is complete).

Used by the espeak recipe's serving stage, ``make bench BENCH=stream`` and the tests (the ``[deploy]`` extra:
``pip install 'corpus-io[deploy]'``). Times: seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

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


def recognizer(model: str, tokens: str, *, online: bool, feature_dim: int, chunk_size: int = 16,
               num_left_chunks: int = 4, num_threads: int = 1) -> Any:
    """sherpa-onnx's WeNet CTC recognizer for an exported file (online: its chunk and left chunks)."""
    import sherpa_onnx

    if online:
        return sherpa_onnx.OnlineRecognizer.from_wenet_ctc(tokens=tokens, model=model, chunk_size=chunk_size,
                                                           num_left_chunks=num_left_chunks, num_threads=num_threads,
                                                           feature_dim=feature_dim)
    return sherpa_onnx.OfflineRecognizer.from_wenet_ctc(model=model, tokens=tokens, num_threads=num_threads,
                                                        feature_dim=feature_dim)


def decode_wavs(rec: Any, wavs: Iterable[tuple[str, str]], *, online: bool, piece_seconds: float = 0.1) -> SherpaRun:
    """``(key, wav path)`` pairs through ``rec``: each file read with soundfile (float32 in [-1, 1], its own
    rate), online fed in ``piece_seconds`` pieces, decoding whenever a chunk is ready."""
    import numpy as np
    import soundfile as sf

    run = SherpaRun()
    for key, path in wavs:
        samples, rate = sf.read(path, dtype="float32", always_2d=True)
        samples = samples[:, 0]
        run.audio_seconds += len(samples) / rate
        stream = rec.create_stream()
        if not online:
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
