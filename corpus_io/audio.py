"""Audio: header probing, decoding (soundfile) and resampling.

Lengths: ``num_samples`` are samples at the file's own rate; ``source_len`` is
FunASR's count of 10 ms frames at 16 kHz, ``floor(num_samples * 16000 / sr / 160)``.
Probing reads only the header for local files and URLs (fsspec range reads);
it never decodes the whole file.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from corpus_io import kaldi, urls
from corpus_io.errors import DataError

AUDIO_EXTENSIONS = ("wav", "flac", "ogg", "opus", "mp3", "sph", "aiff", "aif", "m4a")


@dataclass(frozen=True)
class AudioInfo:
    sample_rate: int  # Hz
    num_samples: int  # per channel, at sample_rate
    channels: int
    format: str  # lowercase container name: wav, flac, ...

    @property
    def duration(self) -> float:
        """Seconds."""
        return self.num_samples / self.sample_rate


def frames_10ms(num_samples: int, sample_rate: int) -> int:
    """FunASR's ``source_len``: floor(num_samples * 16000 / sample_rate / 160), exact in integers."""
    return (num_samples * 100) // sample_rate


def segment_samples(start: float, end: float, sample_rate: int, total: int) -> tuple[int, int]:
    """Sample range ``[first, last)`` of a segment in seconds (``end < 0``: to the end)."""
    first = int(round(start * sample_rate))
    last = total if end < 0 else min(total, int(round(end * sample_rate)))
    return first, last


def extension_of(source: str) -> str:
    """Lowercase extension of a path or URL (no dot), '' when it has none."""
    tail = source.split("?", 1)[0].rsplit("/", 1)[-1]
    return tail.rsplit(".", 1)[-1].lower() if "." in tail else ""


def _info_from_fileobj(f: Any, where: str) -> AudioInfo:
    import soundfile as sf

    try:
        info = sf.info(f)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise DataError(f"{where}: not a readable audio file ({exc}).") from None
    return AudioInfo(int(info.samplerate), int(info.frames), int(info.channels), info.format.lower())


def probe(source: str, *, allow_pipe: bool = False, storage_options: dict | None = None) -> AudioInfo:
    """Sample rate and length of ``source`` from its header (a path, URL, ark offset or pipe)."""
    if kaldi.is_ark_offset(source):
        rate, samples = _load_ark_wav(source)
        return AudioInfo(rate, samples.shape[0], 1 if samples.ndim == 1 else samples.shape[1], "wav")
    if urls.is_command(source):
        data = urls.read_url(source, allow_pipe=allow_pipe)
        wave, rate = decode_bytes(data, where=source)  # stdout headers often lack the length
        return AudioInfo(rate, wave.shape[0], 1 if wave.ndim == 1 else wave.shape[1], "wav")
    if urls.is_remote(source):
        with urls.open_url(source, storage_options=storage_options, block_size=64 * 1024) as f:
            return _info_from_fileobj(f, source)
    path = urls.local_path(source)
    try:
        return _info_from_fileobj(path, source)
    except DataError:
        import os

        if not os.path.exists(path):
            raise DataError(f"{source} does not exist. Check the path in your wav.scp.") from None
        raise


def _load_ark_wav(source: str) -> tuple[int, np.ndarray]:
    import kaldiio

    try:
        loaded = kaldiio.load_mat(source)
    except Exception as exc:
        raise DataError(f"cannot read '{source}' from its ark: {exc}.") from None
    if isinstance(loaded, tuple):
        rate, samples = loaded
        return int(rate), np.asarray(samples)
    raise DataError(f"'{source}' is a feature matrix, not audio. Use feats.scp for features.")


def read_source_bytes(source: str, *, allow_pipe: bool = False, storage_options: dict | None = None) -> bytes:
    """The stored bytes of an audio source, unchanged (used by ``audio_format=keep``)."""
    if kaldi.is_ark_offset(source):
        rate, samples = _load_ark_wav(source)
        return encode(samples.astype(np.float32) / 32768.0 if samples.dtype == np.int16 else samples, rate, "wav")
    return urls.read_url(source, allow_pipe=allow_pipe, storage_options=storage_options)


_PCM_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"  # KSDATAFORMAT_SUBTYPE_PCM


def _pcm16_layout(data: bytes | memoryview) -> tuple[int, int, int, int] | None:
    """``(sample_rate, channels, data_offset, num_frames)`` of a little-endian 16-bit PCM WAV, or None.

    None for anything else (RIFX, RF64, float, 8/24/32-bit, a data chunk that overruns the bytes or
    has no fmt before it): those go to soundfile. Chunks other than ``fmt `` and ``data`` (LIST,
    fact, odd-sized ones with their pad byte) are skipped.
    """
    n = len(data)
    if n < 44 or data[0:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, fmt = 12, None
    while pos + 8 <= n:
        cid = bytes(data[pos:pos + 4])
        size = int.from_bytes(data[pos + 4:pos + 8], "little")
        body = pos + 8
        if cid == b"fmt ":
            if size < 16 or body + size > n:
                return None
            tag, channels, rate = (int.from_bytes(data[body:body + 2], "little"),
                                   int.from_bytes(data[body + 2:body + 4], "little"),
                                   int.from_bytes(data[body + 4:body + 8], "little"))
            align, bits = int.from_bytes(data[body + 12:body + 14], "little"), int.from_bytes(
                data[body + 14:body + 16], "little")
            if tag == 0xFFFE:  # WAVE_FORMAT_EXTENSIBLE: PCM subformat with 16 valid bits only
                if size < 40 or int.from_bytes(data[body + 18:body + 20], "little") != 16 or \
                        int.from_bytes(data[body + 24:body + 26], "little") != 1 or \
                        bytes(data[body + 26:body + 40]) != _PCM_GUID_TAIL:
                    return None
            elif tag != 1:
                return None
            if bits != 16 or channels < 1 or rate < 1 or align != 2 * channels:
                return None
            fmt = (rate, channels)
        elif cid == b"data":
            if fmt is None or body + size > n:
                return None
            return fmt[0], fmt[1], body, size // (2 * fmt[1])
        pos = body + size + (size & 1)
    return None


def decode_bytes(data: bytes, *, where: str = "<bytes>", start: int = 0, stop: int | None = None,
                 dtype: str = "float32") -> tuple[np.ndarray, int]:
    """Decode audio bytes (any soundfile format) into ``(samples[, channels]), sample_rate``.

    ``start``/``stop`` select a sample range (for segments) without decoding the rest
    where the format allows seeking. 16-bit PCM WAV (what WeNet shards hold) is parsed here
    and converted with numpy (int16 / 32768, bit-identical to soundfile's float32); every
    other format, and any WAV this parser does not take, is decoded by soundfile.
    """
    if dtype == "float32":
        layout = _pcm16_layout(data)
        if layout is not None:
            rate, channels, offset, frames = layout
            if start <= frames:
                last = frames if stop is None else max(start, min(frames, stop))
                pcm = np.frombuffer(data, dtype="<i2", count=(last - start) * channels,
                                    offset=offset + 2 * start * channels)
                wave = pcm.astype(np.float32)
                wave *= np.float32(1.0 / 32768.0)
                return (wave if channels == 1 else wave.reshape(-1, channels)), rate
    import soundfile as sf

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if start:
                f.seek(start)
            frames = -1 if stop is None else max(0, stop - start)
            wave = f.read(frames=frames, dtype=dtype, always_2d=False)
            return wave, int(f.samplerate)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: cannot decode audio ({exc}).") from None


def to_mono(wave: np.ndarray) -> np.ndarray:
    return wave if wave.ndim == 1 else wave.mean(axis=1)


def encode(wave: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Encode a waveform as wav (16-bit PCM) or flac bytes."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, wave, sample_rate, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


def resample(wave: np.ndarray, orig_rate: int, new_rate: int) -> np.ndarray:
    """Resample with torchaudio's sinc interpolation (imports torch)."""
    if orig_rate == new_rate:
        return wave
    import torch
    import torchaudio.functional as AF

    tensor = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))
    if tensor.ndim == 2:
        tensor = tensor.T
    out = AF.resample(tensor, orig_rate, new_rate)
    return (out.T if out.ndim == 2 else out).numpy()
