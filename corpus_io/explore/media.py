"""Audio for the explorer: a catalog row's bytes (by byte range, straight from its tar member), its
waveform peaks and its log-mel spectrogram as a PNG.

Only what the catalog names is ever opened: a row's shard URL (a Shar's recording tar) and member offset/size, a
parquet row's locator (its row group's audio column is read), or its source path.
Nothing from the request reaches a path. A shard that changed since the catalog was built (another size or
mtime) or cannot be opened gives :class:`MediaError` with a sentence for the row, not a server crash.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from typing import Any

import numpy as np

from corpus_io.errors import DataError

CONTENT_TYPES = {"wav": "audio/wav", "flac": "audio/flac", "ogg": "audio/ogg", "opus": "audio/ogg",
                 "mp3": "audio/mpeg", "m4a": "audio/mp4", "aiff": "audio/aiff", "aif": "audio/aiff"}


class MediaError(DataError):
    """The audio of a row cannot be served (missing or changed shard, unreadable source)."""


class Audio:
    """The stored audio bytes of one row: ``size`` and ``read(start, length)``; with ``dump_dir``, the row's
    dumped waveform ``<dump_dir>/<key>.wav`` (bench-loader ``++dump_audio_dir``) when there is one
    (``dumped``)."""

    def __init__(self, catalog: Any, row: dict, *, dump_dir: str | None = None):
        from corpus_io.audio import io as audio_io
        from corpus_io.explore.catalog import local_stamp
        from corpus_io.storage.urls import is_remote
        from corpus_io.tables.parquet import is_locator, read_audio

        self.catalog, self.row = catalog, row
        self.format = row.get("audio_format") or "wav"
        self._data: bytes | None = None
        self.dumped = False
        if dump_dir and self._dumped(dump_dir):
            return
        if row.get("error"):
            raise MediaError(row["error"])
        if catalog.kind == "shard":
            shard = catalog.shards[row["shard_id"]]
            row_of = row.get("source") if is_locator(row.get("source") or "") else None  # a parquet row
            if row.get("audio_offset") is None and row_of is None:
                raise MediaError(f"shard {shard.url}: utterance '{row['key']}' has no audio member (features "
                                 f"shards hold .npy, not audio).")
            if not is_remote(shard.url) and local_stamp(shard.url) != shard.stamp:
                what = "is missing" if "missing" in local_stamp(shard.url) else "changed since the catalog was built"
                raise MediaError(f"shard {shard.url} {what}; restart corpus-io explore to rebuild the catalog "
                                 f"(only the changed shards are rescanned).")
            if row_of is not None:  # compressed pages: the row group's audio column is read
                try:
                    self._data = read_audio(row_of, catalog.storage_options)
                except DataError as exc:
                    raise MediaError(f"{shard.url}: utterance '{row['key']}': {exc}") from None
                self.url, self.offset, self.gz, self.size = row_of, 0, False, len(self._data)
                self.format = audio_io.sniff_audio_format(self._data) or self.format
                return
            # a Shar's audio is in the recording tar beside its cuts (source); a tar shard's in the shard
            self.url, self.offset, self.size, self.gz = row.get("source") or shard.url, int(row["audio_offset"]), \
                int(row["audio_size"]), shard.gz
        else:
            if not row.get("source"):
                raise MediaError(f"utterance '{row['key']}' names no audio source.")
            self.url, self.offset, self.gz = row["source"], 0, False
            if row.get("seg_start") is not None or row.get("seg_end") is not None:
                self._data = self._segment()
                self.format = "wav"
                self.size = len(self._data)
            else:
                from corpus_io.audio.io import read_source_bytes

                try:  # raw sources are whole files of one utterance: small enough to read once
                    self._data = read_source_bytes(self.url, storage_options=catalog.storage_options)
                except DataError as exc:
                    raise MediaError(str(exc)) from None
                self.size = len(self._data)

    def _dumped(self, dump_dir: str) -> bool:
        """Read the row's dumped ``<key>.wav`` if ``dump_dir`` holds one (the name from the catalog's key, never
        from the request)."""
        import os

        from corpus_io.audio.io import dump_name

        path = os.path.join(dump_dir, dump_name(str(self.row.get("key", ""))))
        try:
            if not os.path.isfile(path):  # none for this key (and never a FIFO or a device)
                return False
            with open(path, "rb") as f:
                self._data = f.read()
        except (OSError, ValueError):  # unreadable (ValueError: a key holding NUL)
            return False
        self.url, self.offset, self.gz, self.format, self.size, self.dumped = path, 0, False, "wav", len(self._data), \
            True
        return True

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES.get(self.format, "application/octet-stream")

    def _segment(self) -> bytes:
        from corpus_io.audio.io import decode_bytes, encode, read_source_bytes, segment_samples, to_mono

        try:
            data = read_source_bytes(self.url, storage_options=self.catalog.storage_options)
            wave, rate = decode_bytes(data, where=self.url)
        except DataError as exc:
            raise MediaError(str(exc)) from None
        end = self.row.get("seg_end")
        first, last = segment_samples(self.row.get("seg_start") or 0.0, -1.0 if end is None else end, rate,
                                      len(wave))
        return encode(to_mono(wave)[first:last], rate, "wav")

    def read(self, start: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes from ``start`` within the audio (clipped to its size)."""
        length = self.size - start if length is None else min(length, self.size - start)
        if length <= 0:
            return b""
        if self._data is not None:
            return self._data[start:start + length]
        from corpus_io.explore.catalog import open_shard

        try:
            with open_shard(self.url, self.catalog.storage_options) as f:
                stream = gzip.GzipFile(fileobj=f) if self.gz else f
                stream.seek(self.offset + start)
                data = stream.read(length)
        except (OSError, EOFError) as exc:
            raise MediaError(f"shard {self.url}: cannot read member '{self.row.get('member')}' ({exc}); re-copy "
                             f"the shard, or restart explore to rebuild the catalog.") from None
        except DataError as exc:
            raise MediaError(str(exc)) from None
        if len(data) < length:
            raise MediaError(f"shard {self.url} ends inside member '{self.row.get('member')}' (truncated since the "
                             f"catalog was built); re-copy the shard and restart explore.")
        return data

    def samples(self) -> tuple[np.ndarray, int]:
        from corpus_io.audio.io import decode_bytes, to_mono

        wave, rate = decode_bytes(self.read(), where=f"{self.url} {self.row.get('member') or ''}".strip())
        return to_mono(wave).astype(np.float32), rate


def peaks(wave: np.ndarray, width: int) -> list[list[float]]:
    """``[min, max]`` per column of a ``width``-column waveform plot."""
    if len(wave) == 0:
        return []
    width = max(1, min(width, len(wave)))
    edges = np.linspace(0, len(wave), width + 1).astype(np.int64)
    lo = np.minimum.reduceat(wave, edges[:-1])
    hi = np.maximum.reduceat(wave, edges[:-1])
    return [[round(float(a), 4), round(float(b), 4)] for a, b in zip(lo, hi)]


def _mel_filters(rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    def mel(f):
        return 1127.0 * np.log1p(np.asarray(f, dtype=np.float64) / 700.0)

    pts = 700.0 * np.expm1(np.linspace(mel(20.0), mel(rate / 2), n_mels + 2) / 1127.0)
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    fb = np.zeros((n_mels, len(freqs)))
    for m in range(n_mels):
        left, center, right = pts[m], pts[m + 1], pts[m + 2]
        fb[m] = np.clip(np.minimum((freqs - left) / (center - left), (right - freqs) / (right - center)), 0, None)
    return fb


def log_mel(wave: np.ndarray, rate: int, n_mels: int = 80) -> np.ndarray:
    """``(n_mels, frames)`` log-mel energies: 25 ms Hann windows every 10 ms."""
    win, hop = int(0.025 * rate), int(0.010 * rate)
    n_fft = 1 << (win - 1).bit_length()
    if len(wave) < win:
        wave = np.pad(wave, (0, win - len(wave)))
    frames = 1 + (len(wave) - win) // hop
    idx = np.arange(win)[None, :] + hop * np.arange(frames)[:, None]
    spec = np.abs(np.fft.rfft(wave[idx] * np.hanning(win), n=n_fft)) ** 2
    return np.log(_mel_filters(rate, n_fft, n_mels) @ spec.T + 1e-10)


# a perceptual dark-blue -> yellow ramp (viridis-like anchors)
_RAMP = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)


def png(image: np.ndarray) -> bytes:
    """An RGB PNG of a 2-D array scaled to [0, 1] (row 0 at the top), with no imaging library."""
    h, w = image.shape
    pos = np.clip(image, 0, 1) * (len(_RAMP) - 1)
    i = np.minimum(pos.astype(np.int64), len(_RAMP) - 2)
    frac = (pos - i)[..., None]
    rgb = (_RAMP[i] * (1 - frac) + _RAMP[i + 1] * frac).astype(np.uint8)
    raw = b"".join(b"\x00" + rgb[r].tobytes() for r in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def spectrogram_png(wave: np.ndarray, rate: int, n_mels: int = 80) -> bytes:
    """The log-mel spectrogram of ``wave`` as a PNG: low frequencies at the bottom, 80 dB of range."""
    spec = log_mel(wave, rate, n_mels)
    top = spec.max()
    scaled = (spec - (top - np.log(1e8))) / np.log(1e8)  # the top 80 dB
    scaled = np.repeat(scaled[::-1], 2, axis=0)  # 2 px per mel bin
    return png(scaled)
