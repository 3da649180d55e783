"""``corpus-io transcribe`` and :class:`StreamingTranscriber`: one recording through a checkpoint as a stream.

Audio arrives in pieces (``accept_waveform``); each piece's new Kaldi feature frames are computed from the
samples buffered so far (snip_edges: frame k is samples ``[k * shift, k * shift + window)`` and nothing else, so
the frames computed piece by piece equal the whole recording's; ``fbank_conf.snip_edges=false``: frame k starts
``shift // 2 - window // 2`` earlier, the first frames read the start reflected, and the frames that reach past
the end, which reflect it, are computed at ``finish``), and every chunk of ``decoding_chunk_size``
encoder frames that is complete goes through the model with the attention and convolution caches kept
(:class:`corpus_io.model.model.ChunkStream`, the step ``decode ++decoding_chunk_size`` runs too). The partial
result, the greedy CTC text so far, is returned whenever it changes; ``finish`` runs the last, shorter chunk and
gives the final text, its words with start/end seconds (the forced alignment of the whole utterance's
log-probs, :func:`corpus_io.decoding.align.align`, as ``decode ++timestamps``), the compute seconds of each chunk
and the real-time factor. ``decoding_chunk_size=0`` (``++stream=false``): the whole recording with full context.

Nothing here imports torch at import time (``corpus_io.api`` exports :class:`StreamingTranscriber`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from corpus_io.errors import ConfigError, DataError


@dataclass
class Partial:
    """A partial result: the greedy text of the audio the model has seen (``seconds``: its encoder frames)."""

    text: str
    seconds: float


@dataclass
class Result:
    """The final result of one utterance. ``words``: :class:`corpus_io.decoding.align.Span` (text, start, end
    seconds, confidence); ``chunk_latency``: compute seconds of each chunk (its new features, the model, the
    greedy search; empty with full context); ``rtf``: all compute seconds over the audio's seconds;
    ``log_probs``: the CTC log-probs (T', V) the text and times come from."""

    text: str
    words: list = field(default_factory=list)
    chunk_latency: list = field(default_factory=list)
    rtf: float = 0.0
    audio_seconds: float = 0.0
    compute_seconds: float = 0.0
    chunk_seconds: float = 0.0
    log_probs: Any = None


class StreamingTranscriber:
    """A checkpoint of ``corpus-io train`` transcribing one utterance after another, fed in pieces.

    ``accept_waveform(samples, sample_rate)``: float32 samples in [-1, 1] (numpy or torch, 1-D) at the model's
    sample rate (:attr:`sample_rate`); returns a :class:`Partial` when the text changed, else None.
    ``finish()``: the :class:`Result`; the transcriber is then ready for the next utterance.
    ``decoding_chunk_size`` > 0 needs a model trained with ``model.causal=true``; 0: full context (the model runs
    at ``finish``). ``num_decoding_left_chunks``: chunks before each that attention sees (-1: all)."""

    def __init__(self, checkpoint: str, *, decoding_chunk_size: int = 16, num_decoding_left_chunks: int = -1,
                 device: Any = "cpu", text_rule: Any = None) -> None:
        from corpus_io.audio.features import frame_offset, window_geometry
        from corpus_io.infer.decode import decode_device, load_model, output_frame_seconds
        from corpus_io.infer.foreign import foreign_kind
        from corpus_io.model.cmvn import eval_dataset_conf
        from corpus_io.model.frontend import FrontEnd

        refuse_exported(checkpoint)
        self.checkpoint = checkpoint
        self.chunk, self.left = int(decoding_chunk_size), int(num_decoding_left_chunks)
        self.foreign = bool(foreign_kind(checkpoint))
        if self.foreign and self.chunk > 0:
            refuse_foreign_stream(checkpoint)
        self.device = decode_device(str(device)) if isinstance(device, str) else device
        self.model, self.tokenizer, tcfg = load_model(checkpoint, self.device, text_rule)
        if self.foreign:  # the whole recording through the model at finish (module doc of corpus_io.infer.foreign)
            self.conf = tcfg.dataset_conf
            self.sample_rate = int(self.conf.resample_conf.resample_rate)
            self.frame_seconds = float(self.model.frame_seconds)
            self.reset()
            return
        if self.chunk > 0:
            if not hasattr(self.model, "require_streaming"):
                raise ConfigError(f"checkpoint {checkpoint} is not a corpus-io ConformerCTC, which streaming needs; "
                                  f"transcribe it with full context (++stream=false).")
            try:
                self.model.require_streaming(f"streaming (decoding_chunk_size={self.chunk})")
            except ConfigError as exc:
                raise ConfigError(f"{exc} corpus-io transcribe: ++stream=false transcribes checkpoint {checkpoint} "
                                  f"with full context.") from None
        self.conf = eval_dataset_conf(tcfg.dataset_conf)
        if self.conf.feats_type not in ("fbank", "mfcc"):
            raise ConfigError(f"checkpoint {checkpoint} was trained on dataset_conf.feats_type="
                              f"{self.conf.feats_type}; transcribe computes fbank or mfcc features from audio only.")
        self.sample_rate = int(self.conf.resample_conf.resample_rate)
        frame = self.conf.fbank_conf if self.conf.feats_type == "fbank" else self.conf.mfcc_conf
        self.window, self.shift, _ = window_geometry(self.sample_rate, frame.frame_length, frame.frame_shift)
        self.snip_edges = bool(getattr(frame, "snip_edges", True))
        self.offset = frame_offset(self.window, self.shift, self.snip_edges)  # frame k's first sample - k * shift
        # the front end frames the samples _add_features hands it (reflected here without snip_edges) as they come
        self.front_end = FrontEnd(self.conf, self.device)
        self.front_end.options.pop("snip_edges", None)
        self.frame_seconds = output_frame_seconds(self.model, self.conf)
        self.reset()

    def reset(self) -> None:
        """Forget the utterance in progress (its audio, caches and results)."""
        import torch

        from corpus_io.model.model import ChunkStream

        self._samples = torch.zeros(0)  # the samples not yet fully framed, from sample self._base on
        self._base = 0
        self._received = 0
        self._feats: list = []  # every feature frame so far, in pieces (T_i, D)
        self._frames = 0
        self._tail = torch.zeros(0, 0)  # the frames from the next chunk's first on
        self._stream = ChunkStream(self.model, self.chunk, self.left, self.device) if self.chunk > 0 else None
        self._log_probs: list = []
        self._ids: list[int] = []
        self._last = -1  # the last frame's best id (greedy: repeats merged across chunks)
        self._text = ""
        self._latency: list[float] = []
        self._pending = 0.0  # compute seconds (features) not yet counted in a chunk
        self._compute = 0.0
        self._pieces: list = []  # a foreign model's samples so far

    def accept_waveform(self, samples: Any, sample_rate: int) -> Partial | None:
        """Buffer ``samples``, compute their feature frames and run each chunk now complete; the partial result
        when its text changed, else None."""
        import torch

        from corpus_io.audio.io import non_finite

        t0 = time.perf_counter()
        if int(sample_rate) != self.sample_rate:
            raise ConfigError(f"accept_waveform got audio at {sample_rate} Hz; the model takes {self.sample_rate} Hz. "
                              f"Resample the recording first (corpus_io.audio.io.resample_wav); pieces resampled "
                              f"one by one would not join seamlessly.")
        x = torch.as_tensor(samples).detach().to("cpu", torch.float32)
        if x.dim() != 1:
            raise DataError(f"accept_waveform takes one channel of samples (a 1-D array); got shape "
                            f"{tuple(x.shape)}. Average the channels first.")
        non_finite(x.numpy(), "accept_waveform")  # NaN, infinity or beyond full scale: the audio's fault
        self._received += x.shape[0]
        if self.foreign:  # kept whole: the model runs at finish
            self._pieces.append(x)
            self._compute += time.perf_counter() - t0
            return None
        self._samples = torch.cat([self._samples, x])
        self._add_features()
        changed = False
        while self._stream is not None and self._tail.shape[0] >= self._stream.frames:
            changed |= self._run_chunk(self._tail[: self._stream.frames])
        self._compute += time.perf_counter() - t0
        return Partial(self._text, self._stream.offset * self.frame_seconds) if changed else None

    def _add_features(self, final: bool = False) -> None:
        """The feature frames the buffered samples now complete, appended; the samples no later frame needs, dropped.
        Without snip_edges the frames that reach past the samples so far wait for ``final`` (the end reflected)."""
        import torch

        from corpus_io.audio.features import num_frames, reflect

        t0 = time.perf_counter()
        total = num_frames(self._received, self.sample_rate, *self._frame_ms(), self.snip_edges)
        if not final:  # only frames inside the samples so far (snip_edges: all of them)
            total = min(total, max(0, (self._received - self.offset - self.window) // self.shift + 1))
        if total > self._frames:
            start = self._frames * self.shift + self.offset  # may be < 0 (reflected) without snip_edges
            index = torch.arange(start, (total - 1) * self.shift + self.offset + self.window)
            piece = self._samples[reflect(index, self._received) - self._base][None, :]
            batch = {"wav": piece, "wav_lengths": torch.tensor([piece.shape[1]]), "sample_rate": self.sample_rate,
                     "keys": ["stream"]}
            with torch.no_grad():
                feats = self.front_end(batch, train=False)[0][0].cpu()
            self._feats.append(feats)
            if self._stream is not None:  # full context keeps only self._feats
                self._tail = feats if self._tail.numel() == 0 else torch.cat([self._tail, feats])
            self._frames = total
            # frame `total` starts here; without snip_edges a window more is kept, which the end reflects
            drop = max(0, total * self.shift + self.offset - (0 if self.snip_edges else self.window)) - self._base
            self._samples = self._samples[drop:]
            self._base += drop
        self._pending += time.perf_counter() - t0

    def _frame_ms(self) -> tuple[float, float]:
        frame = self.conf.fbank_conf if self.conf.feats_type == "fbank" else self.conf.mfcc_conf
        return float(frame.frame_length), float(frame.frame_shift)

    def _run_chunk(self, feats: Any) -> bool:
        """One chunk through the model and the greedy search; its compute seconds (with the features since the
        last chunk) recorded. Whether the text changed."""
        import torch

        t0 = time.perf_counter()
        with torch.no_grad():
            encoded = self._stream(feats[None].to(self.device))
            log_probs = self.model.ctc_log_probs(encoded, None)[0][0].cpu()
        self._finite(log_probs, f"chunk {len(self._latency) + 1} of the audio")
        self._tail = self._tail[self._stream.shift:]
        before = len(self._ids)
        self._greedy(log_probs)
        self._log_probs.append(log_probs)
        self._latency.append(time.perf_counter() - t0 + self._pending)
        self._pending = 0.0
        if len(self._ids) == before:
            return False
        text = self.tokenizer.decode(self._ids)
        changed, self._text = text != self._text, text
        return changed

    def _finite(self, log_probs: Any, what: str) -> None:
        """A DataError when the model's log-probs (T, V) are not finite: a diverged model's text would be empty."""
        from corpus_io.model.model import nonfinite_message, nonfinite_rows

        if nonfinite_rows(log_probs[None]):
            self.reset()
            raise DataError(nonfinite_message(self.checkpoint, what, 1, 1))

    def _greedy(self, log_probs: Any) -> None:
        """CTC best path continued over ``log_probs`` (t, V): repeats merged (across chunks too), blanks dropped."""
        blank = self.tokenizer.blank_id
        for t in log_probs.argmax(dim=-1).tolist():
            if t != self._last and t != blank:
                self._ids.append(t)
            self._last = t

    def finish(self) -> Result:
        """The utterance's last chunk (at least ``RIGHT_CONTEXT + 1`` frames; with full context the whole
        utterance) through the model, then its :class:`Result`; the transcriber is reset for the next one."""
        import torch

        from corpus_io.decoding.align import align
        from corpus_io.decoding.beam import best_path_ids
        from corpus_io.decoding.scoring import word_units
        from corpus_io.infer.decode import _speech, input_frame_offset_seconds, input_frame_seconds

        t0 = time.perf_counter()
        if self.foreign:
            return self._finish_foreign(t0)
        least = self.model.RIGHT_CONTEXT + 1 if hasattr(self.model, "RIGHT_CONTEXT") else 7
        if not self.snip_edges:  # the frames that reflect the end, then the chunks they complete
            self._add_features(final=True)
            while self._stream is not None and self._tail.shape[0] >= self._stream.frames:
                self._run_chunk(self._tail[: self._stream.frames])
        feats = torch.cat(self._feats) if self._feats else torch.zeros(0, 1)
        if self._stream is not None:
            if self._tail.shape[0] >= least:
                self._run_chunk(self._tail)
            log_probs = torch.cat(self._log_probs) if self._log_probs else torch.zeros(0, self.tokenizer.vocab_size)
        elif feats.shape[0] >= least:
            with torch.no_grad():
                lengths = torch.tensor([feats.shape[0]], device=self.device)
                log_probs = self.model.ctc_log_probs(*self.model.encode(feats[None].to(self.device), lengths))[0][0]
                log_probs = log_probs.cpu()
            self._finite(log_probs, "the audio (full context)")
        else:
            log_probs = torch.zeros(0, self.tokenizer.vocab_size)
        ids = best_path_ids(log_probs[None], torch.tensor([log_probs.shape[0]]))[0]
        text = self.tokenizer.decode(ids)
        duration = self._received / self.sample_rate
        speech = _speech(feats[None], torch.tensor([feats.shape[0]]), self.conf) if feats.shape[0] else None
        timed = align(log_probs, ids, self.tokenizer.decode, word_units, frame_seconds=self.frame_seconds,
                      duration=duration, blank=self.tokenizer.blank_id, speech=speech[0] if speech else None,
                      speech_seconds=input_frame_seconds(self.conf),
                      offset_seconds=input_frame_offset_seconds(self.conf))
        compute = self._compute + time.perf_counter() - t0
        result = Result(text=text, words=list(timed.words), chunk_latency=list(self._latency),
                        rtf=compute / duration if duration > 0 else 0.0, audio_seconds=duration,
                        compute_seconds=compute, chunk_seconds=self.chunk * self.frame_seconds, log_probs=log_probs)
        self.reset()
        return result

    def _finish_foreign(self, t0: float) -> Result:
        """A model of another toolkit over the whole recording (in decode's ``chunk_seconds`` pieces past 60 s, as
        decode runs it), its greedy text and its words on its own Viterbi path (no speech onsets, no offset)."""
        import torch

        from corpus_io.decoding.align import align
        from corpus_io.decoding.beam import best_path_ids
        from corpus_io.decoding.scoring import word_units
        from corpus_io.infer.decode import CHUNK_CONTEXT_SECONDS, CHUNK_SECONDS, chunked

        samples = torch.cat(self._pieces) if self._pieces else torch.zeros(0)
        step = max(1, round(self.frame_seconds * self.sample_rate))
        piece = max(step, int(CHUNK_SECONDS * self.sample_rate) // step * step)
        context = int(CHUNK_CONTEXT_SECONDS * self.sample_rate) // step * step
        x, lengths = samples[None], torch.tensor([samples.shape[0]])
        with torch.no_grad():
            log_probs, out_lengths = self.model(x, lengths) if samples.shape[0] <= piece else \
                chunked(self.model, x, lengths, step=step, piece=piece, context=context)
        log_probs = log_probs[0, : int(out_lengths[0])].cpu()
        self._finite(log_probs, "the audio (full context)")
        ids = best_path_ids(log_probs[None], torch.tensor([log_probs.shape[0]]))[0]
        duration = self._received / self.sample_rate
        timed = align(log_probs, ids, self.tokenizer.decode, word_units, frame_seconds=self.frame_seconds,
                      duration=duration, blank=self.tokenizer.blank_id)
        compute = self._compute + time.perf_counter() - t0
        result = Result(text=self.tokenizer.decode(ids), words=list(timed.words),
                        rtf=compute / duration if duration > 0 else 0.0, audio_seconds=duration,
                        compute_seconds=compute, log_probs=log_probs)
        self.reset()
        return result


def refuse_foreign_stream(checkpoint: str) -> None:
    """A ConfigError for streaming with another toolkit's model (transcribe runs it offline only)."""
    raise ConfigError(f"transcribe's model {checkpoint} is a CTC model of another toolkit, which transcribe runs "
                      f"offline only: give ++stream=false (the whole recording through it).")


def refuse_exported(checkpoint: str) -> None:
    """A ConfigError for a file of export-model (transcribe runs the PyTorch checkpoint); a CTC model of another
    toolkit (a sherpa-onnx .onnx file) passes."""
    from corpus_io.infer.exported import is_exported
    from corpus_io.infer.foreign import foreign_kind

    if is_exported(checkpoint) and not foreign_kind(checkpoint):
        raise ConfigError(f"transcribe's model {checkpoint} is an exported file; transcribe runs the PyTorch "
                          f"checkpoint it was exported from (++model=exp/model.pt.avg5). Serve an export with "
                          f"sherpa-onnx (docs/DECODING.md), or decode a list with it: corpus-io decode "
                          f"++checkpoint={checkpoint}.")


def read_recording(path: str, sample_rate: int) -> Any:
    """The mono float32 samples (N,) of an audio file (any format soundfile reads) at ``sample_rate`` (resampled as
    the loader resamples); a missing or unreadable file is a DataError naming it."""
    import torch

    from corpus_io.audio.io import decode_bytes, read_source_bytes, resample_wav, to_mono

    wave, rate = decode_bytes(read_source_bytes(path), where=f"++input={path}")
    wav = torch.from_numpy(to_mono(wave).astype("float32", copy=False)).reshape(1, -1)
    return resample_wav(wav, rate, sample_rate)[0]


def latency_line(result: Result) -> str:
    """``latency per chunk: mean X ms, p95 Y ms, max Z ms over N chunks of C ms; RTF R`` (full context: the RTF)."""
    lat = sorted(result.chunk_latency)
    if not lat:
        return f"full context: RTF {result.rtf:.4f} ({result.compute_seconds:.3f} s compute / " \
               f"{result.audio_seconds:.2f} s audio)"
    p95 = lat[max(0, math.ceil(0.95 * len(lat)) - 1)]
    return (f"latency per chunk: mean {1000 * sum(lat) / len(lat):.1f} ms, p95 {1000 * p95:.1f} ms, max "
            f"{1000 * lat[-1]:.1f} ms over {len(lat)} chunks of {1000 * result.chunk_seconds:.0f} ms; "
            f"RTF {result.rtf:.4f}")


def transcribe(cfg: Any) -> dict:
    """``corpus-io transcribe``: ``cfg.input`` through ``cfg.model``, fed in pieces of ``cfg.piece_seconds`` with
    ``cfg.stream``; prints each changed partial, the final text, one line per word and the latency/RTF line."""
    from pathlib import Path

    from corpus_io.config import require

    require(cfg, "model", "input")
    refuse_exported(cfg.model)  # before reading anything
    from corpus_io.infer.foreign import foreign_kind

    if cfg.stream and foreign_kind(cfg.model):
        refuse_foreign_stream(cfg.model)

    if not Path(cfg.input).is_file():
        raise DataError(f"++input={cfg.input} does not exist or is not a file; give the recording to transcribe "
                        f"(any format soundfile reads: wav, flac, ogg, ...).")
    import torch

    threads = torch.get_num_threads()
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    try:
        return _transcribe(cfg)
    finally:
        torch.set_num_threads(threads)  # a Python caller's own setting, back as it was


def _transcribe(cfg: Any) -> dict:
    import torch

    transcriber = StreamingTranscriber(cfg.model, decoding_chunk_size=cfg.decoding_chunk_size if cfg.stream else 0,
                                       num_decoding_left_chunks=cfg.num_decoding_left_chunks, device=cfg.device,
                                       text_rule=cfg.text_rule)
    samples = read_recording(cfg.input, transcriber.sample_rate)
    piece = max(1, round(cfg.piece_seconds * transcriber.sample_rate)) if cfg.stream else max(1, samples.shape[0])
    partials = 0
    for start in range(0, samples.shape[0], piece):
        partial = transcriber.accept_waveform(samples[start:start + piece], transcriber.sample_rate)
        if partial is not None:
            partials += 1
            print(f"partial {partial.seconds:.2f} s: {partial.text}", flush=True)
    result = transcriber.finish()
    print(f"final: {result.text}")
    for w in result.words:
        print(f"  {w.start:.2f} {w.end:.2f} {w.text} ({w.confidence:.2f})")
    threads = torch.get_num_threads()
    print(f"{latency_line(result)}; {threads} torch thread{'s' if threads != 1 else ''} (num_threads)", flush=True)
    return {"text": result.text, "words": len(result.words), "partials": partials, "rtf": result.rtf,
            "chunks": len(result.chunk_latency), "num_threads": threads}
