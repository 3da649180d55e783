"""Audio: header probing, decoding (soundfile) and resampling.

Lengths: ``num_samples`` are samples at the file's own rate; ``source_len`` is
FunASR's count of 10 ms frames at 16 kHz: the length after resampling to 16 kHz,
``ceil(num_samples * 16000 / sr)``, then ``// 160``.
Probing reads only the header for local files and URLs (fsspec range reads);
it never decodes the whole file.
"""

from __future__ import annotations

import functools
import io
import math
import os
import re
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from corpus_io.errors import DataError
from corpus_io.storage import urls

HEAD_BYTES = 64 * 1024  # enough for any WAV/FLAC header with the usual LIST/metadata chunks
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
    """FunASR's ``source_len`` (10 ms frames), exact in integers.

    FunASR resamples to 16 kHz first, which yields ``ceil(num_samples * 16000 / sample_rate)`` samples,
    then counts ``// 160``; flooring ``num_samples * 100 / sample_rate`` directly is one frame short
    for some lengths at 22.05/32/44.1/48 kHz.
    """
    samples_16k = -(-num_samples * 16000 // sample_rate)
    return samples_16k // 160


MAX_OVERSHOOT = 0.5  # seconds a segment may end past its recording, clipped (Kaldi extract-segments' max-overshoot)


def segment_samples(start: float, end: float, sample_rate: int, total: int) -> tuple[int, int]:
    """Sample range ``[first, last)`` of a segment in seconds (``end < 0``: to the end).

    A segment must have finite times, ``0 <= start < end``, and lie inside the recording: an end up to
    :data:`MAX_OVERSHOOT` past it is clipped, as Kaldi's extract-segments does; anything else is a DataError
    (the caller adds the file, line and key)."""
    length = total / sample_rate if sample_rate else 0.0
    first = int(round(start * sample_rate)) if math.isfinite(start) else -1
    last = total if end < 0 else min(total, int(round(end * sample_rate))) if math.isfinite(end) else -1
    if first < 0 or last <= first or (end >= 0 and (end <= start or end > length + MAX_OVERSHOOT)):
        raise DataError(f"segment [{start:g}, {end:g}] s lies outside its recording ({length:.3f} s): it needs "
                        f"0 <= start < end <= the recording's end + {MAX_OVERSHOOT:g} s (Kaldi's extract-segments "
                        f"allows the same overshoot), or end = -1 for the end of the recording.")
    return first, last


def extension_of(source: str) -> str:
    """Lowercase extension of a path or URL (no dot), '' when it has none."""
    tail = source.split("?", 1)[0].rsplit("/", 1)[-1]
    return tail.rsplit(".", 1)[-1].lower() if "." in tail else ""


TAR_MEMBER_SEP = ".tar//"  # ``<path>.tar//<member>``: a member of a local uncompressed tar (a NeMo tarred dataset)


def is_ark_offset(value: str) -> bool:
    """``foo.ark:1234`` (a kaldiio byte offset into an ark)."""
    return bool(re.search(r"\.ark:\d+$", value))


def split_tar_member(source: str) -> tuple[str, str] | None:
    """``(tar path, member name)`` of a ``<path>.tar//<member>`` source, else None (a plain file wins)."""
    if TAR_MEMBER_SEP not in source or urls.is_remote(source) or urls.is_command(source):
        return None
    tar, member = source.rsplit(TAR_MEMBER_SEP, 1)
    return (urls.local_path(tar) + ".tar", member) if member and not os.path.isfile(source) else None


@functools.lru_cache(maxsize=4)
def _tar_members(path: str, size: int, mtime_ns: int) -> dict[str, tuple[int, int]]:
    """member name -> (data offset, size) of an uncompressed tar, from its headers only (the segments of one
    tar arrive together, so a few tars are kept)."""
    import tarfile

    try:
        with tarfile.open(path, "r:") as tar:
            return {m.name: (m.offset_data, m.size) for m in tar if m.isfile()}
    except (OSError, tarfile.TarError) as exc:
        raise DataError(f"cannot read the tar {path}: {exc}. A <tar>//<member> source needs an uncompressed "
                        f"local tar.") from None


def _read_tar_member(source: str, tar: str, member: str, max_bytes: int) -> bytes:
    try:
        st = os.stat(tar)
    except OSError as exc:
        raise DataError(f"{source}: the tar {tar} cannot be read ({exc.strerror}). Check the path.") from None
    found = _tar_members(tar, st.st_size, st.st_mtime_ns).get(member)
    if found is None:
        raise DataError(f"{source}: {tar} has no member '{member}'. Check the manifest's audio_filepath and "
                        f"shard_id against the tars.")
    offset, size = found
    if size > max_bytes:
        raise DataError(f"{source} is longer than {max_bytes} bytes (the per-source read bound).")
    with open(tar, "rb") as f:
        f.seek(offset)
        return f.read(size)


_OPENING = re.compile(r"^Error opening <[^>]*>: ")


def soundfile_why(exc: BaseException) -> str:
    """What libsndfile said about ``exc``, without the in-memory stream's ``<_io.BytesIO object at 0x…>`` it
    names (the caller names the file, line or member)."""
    why = getattr(exc, "error_string", None)
    return str(why) if why else _OPENING.sub("", str(exc))


#: the loudest sample any audio holds: 32-bit integer samples written as floats (float audio stays within 1.0);
#: Kaldi features of samples near 1e14 overflow float32 to NaN, which a model's output would blame on its weights
MAX_SAMPLE = 2.0 ** 31


def non_finite(wave: np.ndarray, where: str, header: str = "") -> None:
    """A DataError when ``wave`` (float samples) holds NaN or infinity, or a sample beyond :data:`MAX_SAMPLE`: such
    samples play as clicks or make every feature and loss NaN, so they are refused where they are decoded, naming
    ``where`` (file, row or member) and what its ``header`` says it holds."""
    if wave.dtype.kind != "f":
        return
    claim = f" (its header says {header})" if header else ""
    if not np.isfinite(wave).all():
        bad = ~np.isfinite(wave.reshape(-1))
        raise DataError(f"{where}: the audio holds {int(bad.sum())} non-finite samples (NaN or infinity), the first "
                        f"at sample {int(np.argmax(bad))}{claim}; such audio cannot be right.")
    peak = float(np.abs(wave).max()) if wave.size else 0.0
    if peak > MAX_SAMPLE:
        first = int(np.argmax(np.abs(wave.reshape(-1)) > MAX_SAMPLE))
        raise DataError(f"{where}: the audio holds samples of magnitude up to {peak:.3g}, the first at sample "
                        f"{first}{claim}, beyond any sample format's full scale (1.0 for float, 2^31 for 32-bit "
                        f"integers): the audio is at fault, not the model (its features would overflow to NaN). "
                        f"Re-export the recording with samples in range, or leave it out.")


def _header_claim(f: Any) -> str:
    """What a soundfile-opened file's header says it holds, for the message of audio that cannot be right."""
    rate = int(f.samplerate)
    return (f"{f.format} {f.subtype}, {rate} Hz, {f.channels} channel{'s' if f.channels != 1 else ''}, "
            f"{int(f.frames)} samples ({int(f.frames) / max(rate, 1):.2f} s)")


def _info_from_fileobj(f: Any, where: str) -> AudioInfo:
    import soundfile as sf

    try:
        info = sf.info(f)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise DataError(f"{where}: not a readable audio file ({soundfile_why(exc)}).") from None
    return AudioInfo(int(info.samplerate), int(info.frames), int(info.channels), info.format.lower())


def probe(source: str, *, allow_pipe: bool = False, storage_options: dict | None = None) -> AudioInfo:
    """Sample rate and length of ``source`` from its header (a path, URL, ark offset, tar member or pipe)."""
    if is_ark_offset(source):
        rate, samples = _load_ark_wav(source)
        return AudioInfo(rate, samples.shape[0], 1 if samples.ndim == 1 else samples.shape[1], "wav")
    if urls.is_command(source):
        data = read_source_bytes(source, allow_pipe=allow_pipe, storage_options=storage_options)
        wave, rate = decode_bytes(data, where=source)  # stdout headers often lack the length
        return AudioInfo(rate, wave.shape[0], 1 if wave.ndim == 1 else wave.shape[1], "wav")
    member = split_tar_member(source)
    if member is not None:
        return probe_bytes(_read_tar_member(source, *member, MAX_SOURCE_BYTES), source)
    if urls.is_remote(source):
        with urls.open_url(source, storage_options=storage_options, block_size=HEAD_BYTES, seekable=True) as f:
            size = getattr(f, "size", None)
            info = header_info(f.read(HEAD_BYTES), size) if size else None
            if info is not None:
                return info
            f.seek(0)
            return _info_from_fileobj(f, source)
    path = urls.local_path(source)
    urls.check_regular_file(path)
    try:
        with open(path, "rb") as f:
            info = header_info(f.read(HEAD_BYTES), os.fstat(f.fileno()).st_size)
    except FileNotFoundError:
        raise DataError(f"{source} does not exist. Check the path in the list or table that names it.") from None
    except OSError as exc:
        raise DataError(f"cannot read {source}: {exc.strerror}.") from None
    # WAV and FLAC headers are parsed here (~10 us); anything else, or anything odd, goes to soundfile.
    return info if info is not None else _info_from_fileobj(path, source)


def probe_bytes(data: bytes, where: str = "<bytes>") -> AudioInfo:
    """Sample rate and length of audio held in memory (a tar member, a parquet cell), from its header; nothing is
    decoded (WAV and FLAC headers are parsed here, anything else by soundfile)."""
    return header_info(data[:HEAD_BYTES], len(data)) or _info_from_fileobj(io.BytesIO(data), where)


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


# bytes: the largest audio source read whole; the shard reader's default limit for one member
# (dataset_conf.max_member_bytes), so nothing is packed that a loader would refuse.
MAX_SOURCE_BYTES = 256 * 1024 * 1024


def read_source_bytes(source: str, *, allow_pipe: bool = False, storage_options: dict | None = None,
                      max_bytes: int = MAX_SOURCE_BYTES) -> bytes:
    """The stored bytes of an audio source, unchanged (used by ``audio_format=keep``); at most
    ``max_bytes`` bytes are read: a longer source (an endless pipe, a huge file) is a DataError."""
    if is_ark_offset(source):
        rate, samples = _load_ark_wav(source)
        return encode(samples.astype(np.float32) / 32768.0 if samples.dtype == np.int16 else samples, rate, "wav")
    member = split_tar_member(source)
    if member is not None:
        return _read_tar_member(source, *member, max_bytes)
    local = not urls.is_remote(source) and not urls.is_command(source)
    # A local file unbuffered, read by its size: read(max_bytes + 1) allocates max_bytes (a fresh 256 MiB
    # mapping, then mremap and munmap) for every file, which cost pack-shards more CPU than its tar writes.
    f = urls.open_url(source, allow_pipe=allow_pipe, storage_options=storage_options,
                      block_size=0 if local else 1 << 20)
    data = b""
    try:
        if local:
            size = min(os.fstat(f.fileno()).st_size, max_bytes)
            data = f.read(size + 1)
            if len(data) > size:  # it grew since fstat (or is over the bound): read on to the bound
                data += f.read(max_bytes + 1 - len(data))
        else:
            data = f.read(max_bytes + 1)
    finally:
        try:
            f.close()
        except DataError:  # a command killed by our early close (SIGPIPE) when the source was too long
            if len(data) <= max_bytes:
                raise
    if len(data) > max_bytes:
        raise DataError(f"{source} is longer than {max_bytes} bytes (the per-source read bound, equal to the "
                        f"shard reader's max_member_bytes); only that much was read. Split or shorten the "
                        f"recording (e.g. with a segments file), or check that the entry names an audio file.")
    return data


_RIFF_HEAD = struct.Struct("<4sI4s")  # "RIFF", size, "WAVE"
_CHUNK_HEAD = struct.Struct("<4sI")  # chunk id, size in bytes
_FMT = struct.Struct("<HHIIHH")  # format tag, channels, rate (Hz), bytes per second, block align, bits per sample
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"  # KSDATAFORMAT_SUBTYPE_* tail


class WavLayout(NamedTuple):
    """Where the samples of a little-endian WAV are: rate (Hz), channels, bits, offset (bytes), frames (a tuple:
    parsed once per utterance by the loader, where a frozen dataclass costs more than the parse)."""

    sample_rate: int
    channels: int
    bits: int
    is_float: bool
    data_offset: int
    num_frames: int


def wav_layout(data: bytes | memoryview, total_size: int | None = None) -> WavLayout | None:
    """Parse a RIFF/WAVE header of integer PCM or float samples, or return None.

    ``data`` is the whole file, or only its head when ``total_size`` (the file size in bytes) is
    given: then a data chunk longer than the file is cut to the file. Without ``total_size`` a data
    chunk that overruns ``data`` gives None (a truncated file: soundfile decides). None also for
    RIFX/RF64, compressed formats, and a streamed length (0 or 0xFFFFFFFF). Chunks other than
    ``fmt `` and ``data`` (LIST, fact, odd-sized ones with their pad byte) are skipped.
    """
    n = len(data)
    if n < 44:
        return None
    riff, _, wave = _RIFF_HEAD.unpack_from(data, 0)
    if riff != b"RIFF" or wave != b"WAVE":
        return None
    pos, fmt = 12, None
    while pos + 8 <= n:
        cid, size = _CHUNK_HEAD.unpack_from(data, pos)
        body = pos + 8
        if cid == b"fmt ":
            if size < 16 or body + 16 > n:
                return None
            tag, channels, rate, _, align, bits = _FMT.unpack_from(data, body)
            if tag == 0xFFFE:  # WAVE_FORMAT_EXTENSIBLE: the sub-format GUID says PCM (1) or float (3)
                if size < 40 or body + 40 > n or bytes(data[body + 26:body + 40]) != _GUID_TAIL:
                    return None
                tag = int.from_bytes(data[body + 24:body + 26], "little")
            if tag not in (1, 3) or channels < 1 or rate < 1 or bits % 8 or align != bits // 8 * channels:
                return None
            fmt = (rate, channels, bits, tag == 3)
        elif cid == b"data":
            if fmt is None or size in (0, 0xFFFFFFFF):
                return None
            limit = n if total_size is None else total_size
            if body + size > limit:
                if total_size is None:
                    return None
                size = max(0, limit - body)
            rate, channels, bits, is_float = fmt
            return WavLayout(rate, channels, bits, is_float, body, size // (bits // 8 * channels))
        pos = body + size + (size & 1)
    return None


def flac_streaminfo(data: bytes) -> tuple[int, int, int] | None:
    """``(sample_rate Hz, channels, num_samples)`` from a FLAC STREAMINFO block, or None.

    STREAMINFO is always the first metadata block: from byte 18, 20 bits of rate, 3 of
    channels - 1, 5 of bits - 1 and 36 of total samples (0: unknown, so None).
    """
    if data[:4] != b"fLaC" or len(data) < 42 or data[4] & 0x7F != 0:
        return None
    packed = int.from_bytes(data[18:26], "big")
    rate, channels, total = packed >> 44, ((packed >> 41) & 0x7) + 1, packed & ((1 << 36) - 1)
    return (rate, channels, total) if rate and total else None


def is_pcm16(data: bytes | memoryview) -> bool:
    """Is this a 16-bit integer PCM WAV or a 16-bit FLAC (from its header)? Decoded to float32, such
    samples are exactly k / 32768 (STREAMINFO: 5 bits of bits-per-sample - 1 at bit 36 of bytes 18..25)."""
    wav = wav_layout(data[:HEAD_BYTES], len(data))
    if wav is not None:
        return wav.bits == 16 and not wav.is_float
    if bytes(data[:4]) == b"fLaC" and len(data) >= 42 and data[4] & 0x7F == 0:
        return ((int.from_bytes(data[18:26], "big") >> 36) & 0x1F) + 1 == 16
    return False


def sniff_audio_format(data: bytes) -> str | None:
    """Container of audio bytes from their magic number: wav, flac, ogg, mp3 or None."""
    if data[:4] in (b"RIFF", b"RIFX") and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "opus" if b"OpusHead" in data[:64] else "ogg"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and (data[1] & 0xE0) == 0xE0):
        return "mp3"
    return None


def header_info(head: bytes, total_size: int) -> AudioInfo | None:
    """AudioInfo of a WAV or FLAC from its first bytes and the file size; None: ask soundfile."""
    wav = wav_layout(head, total_size)
    if wav is not None:
        return AudioInfo(wav.sample_rate, wav.num_frames, wav.channels, "wav")
    flac = flac_streaminfo(head)
    if flac is not None:
        return AudioInfo(flac[0], flac[2], flac[1], "flac")
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
        layout = wav_layout(data)
        if layout is not None and layout.bits == 16 and not layout.is_float:
            rate, channels, offset, frames = (layout.sample_rate, layout.channels, layout.data_offset,
                                              layout.num_frames)
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
            rate = int(f.samplerate)
            claim = _header_claim(f)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: cannot decode audio ({soundfile_why(exc)}).") from None
    non_finite(wave, where, claim)
    return wave, rate


def to_mono(wave: np.ndarray) -> np.ndarray:
    return wave if wave.ndim == 1 else wave.mean(axis=1)


def encode(wave: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Encode a waveform as wav (16-bit PCM) or flac bytes."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, wave, sample_rate, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


def dump_name(key: str) -> str:
    """The file name of an utterance's dumped waveform (bench-loader ``++dump_audio_dir``, served by explore):
    ``<key>.wav`` with ``/`` and ``\\`` as ``_``; an empty key, ``.`` or ``..`` gets a leading ``_``."""
    name = key.replace("/", "_").replace("\\", "_")
    return f"_{name}.wav" if name in ("", ".", "..") else f"{name}.wav"


def encode_float_wav(wave: np.ndarray, sample_rate: int) -> bytes:
    """Mono 32-bit float WAV bytes, the same bytes for the same samples (libsndfile's float files carry a
    PEAK chunk with the time of writing)."""
    data = np.ascontiguousarray(wave, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, sample_rate, sample_rate * 4, 4, 32)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt "
            + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)


_RESAMPLERS: dict[tuple, Any] = {}


def resample_wav(wav: Any, orig_rate: int, new_rate: int) -> Any:
    """``torchaudio.functional.resample(wav, orig_rate, new_rate)`` of a torch tensor with its default
    arguments, the sinc kernel built once per (orig, new) rate pair in this process
    (torchaudio.transforms.Resample keeps it) instead of on every call; the output is the same."""
    if orig_rate == new_rate:
        return wav
    key = (int(orig_rate), int(new_rate), wav.dtype)
    fn = _RESAMPLERS.get(key)
    if fn is None:
        import torchaudio.transforms as T

        fn = _RESAMPLERS[key] = T.Resample(key[0], key[1], dtype=wav.dtype)  # the kernel in the wave's dtype
    return fn(wav)


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
