"""audio.decode_bytes: the 16-bit PCM WAV fast path is bit-identical to soundfile on real files."""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from corpus_io.audio import io as audio
from corpus_io.errors import DataError
from tests.conftest import assert_user_error, run_cli


def _fast_path_takes(data: bytes) -> bool:
    """decode_bytes converts these with numpy instead of soundfile: whole 16-bit PCM WAVs."""
    layout = audio.wav_layout(data)
    return layout is not None and layout.bits == 16 and not layout.is_float


def _real_wavs(fixture_corpus: Path) -> list[Path]:
    paths = sorted((fixture_corpus / "wav").glob("*.wav"))
    assert {sf.info(p).samplerate for p in paths} >= {8000, 16000, 44100}
    return paths


def _soundfile(data: bytes, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, int]:
    with sf.SoundFile(io.BytesIO(data)) as f:
        if start:
            f.seek(start)
        wave = f.read(frames=-1 if stop is None else max(0, stop - start), dtype="float32", always_2d=False)
        return wave, f.samplerate


def _same(data: bytes, **kw) -> np.ndarray:
    ours, rate = audio.decode_bytes(data, **kw)
    ref, ref_rate = _soundfile(data, **kw)
    assert rate == ref_rate and ours.dtype == ref.dtype == np.float32 and ours.shape == ref.shape
    assert np.array_equal(ours, ref)
    return ours


def _stereo(path: Path) -> bytes:
    wave, rate = sf.read(path, dtype="int16")
    buf = io.BytesIO()
    sf.write(buf, np.stack([wave, wave[::-1]], axis=1), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _with_odd_chunks(data: bytes) -> bytes:
    """A LIST chunk of odd size (plus its pad byte) and a fact chunk between fmt and data."""
    fmt_end = 12 + 8 + int.from_bytes(data[16:20], "little")
    extra = b"LIST" + struct.pack("<I", 5) + b"INFOx" + b"\0" + b"fact" + struct.pack("<I", 4) + b"\0\0\0\0"
    body = data[12:fmt_end] + extra + data[fmt_end:]
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


def test_pcm16_wav_fast_path_matches_soundfile_on_real_8_16_44k_mono(fixture_corpus):
    for path in _real_wavs(fixture_corpus):
        data = path.read_bytes()
        assert _fast_path_takes(data), path  # the fast path is the one tested
        wave = _same(data)
        assert wave.ndim == 1 and wave.flags.writeable


def test_pcm16_wav_fast_path_matches_soundfile_on_stereo_odd_chunks_and_wavex(fixture_corpus):
    for path in _real_wavs(fixture_corpus):
        stereo = _stereo(path)
        assert _same(stereo).shape[1] == 2
        _same(_with_odd_chunks(path.read_bytes()))
        _same(_with_odd_chunks(stereo))
        wave, rate = sf.read(path, dtype="int16")
        buf = io.BytesIO()
        sf.write(buf, wave, rate, format="WAVEX", subtype="PCM_16")
        assert _fast_path_takes(buf.getvalue())
        _same(buf.getvalue())


def test_pcm16_wav_fast_path_segments_match_soundfile(fixture_corpus):
    path = _real_wavs(fixture_corpus)[0]
    for data in (path.read_bytes(), _stereo(path)):
        frames = sf.info(io.BytesIO(data)).frames
        for start, stop in ((0, 100), (17, 4001), (frames - 5, frames + 50), (frames, None), (300, 200), (5, None)):
            _same(data, start=start, stop=stop)


def test_other_formats_go_to_soundfile(fixture_corpus):
    path = _real_wavs(fixture_corpus)[0]
    wave, rate = sf.read(path, dtype="float32")
    for fmt, subtype in (("WAV", "PCM_24"), ("WAV", "FLOAT"), ("WAV", "PCM_U8"), ("FLAC", "PCM_16")):
        buf = io.BytesIO()
        sf.write(buf, wave, rate, format=fmt, subtype=subtype)
        assert not _fast_path_takes(buf.getvalue())
        _same(buf.getvalue())
    flac = next((fixture_corpus / "wav").glob("*.flac")).read_bytes()
    assert not _fast_path_takes(flac)
    _same(flac)


def test_truncated_or_broken_wav_is_not_taken_by_the_fast_path(fixture_corpus):
    data = _real_wavs(fixture_corpus)[0].read_bytes()
    assert not _fast_path_takes(data[:1000])  # the data chunk overruns: soundfile decides
    assert not _fast_path_takes(data[:30])
    with pytest.raises(DataError, match="cannot decode audio"):
        audio.decode_bytes(b"RIFF\0\0\0\0WAVEjunk" * 4, where="x")


def _written(tmp_path: Path, name: str, subtype: str, fmt: str = "WAV", channels: int = 1) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / name
    sf.write(path, rng.uniform(-0.5, 0.5, (12345, channels)).astype(np.float32), 22050, format=fmt, subtype=subtype)
    return path


def test_header_probe_matches_soundfile_on_every_fixture_file_from_the_head_only(fixture_corpus, tmp_path):
    paths = sorted((fixture_corpus / "wav").iterdir()) + [
        _written(tmp_path, "a24.wav", "PCM_24"), _written(tmp_path, "f32.wav", "FLOAT", channels=2),
        _written(tmp_path, "b.flac", "PCM_16", fmt="FLAC", channels=2)]
    odd = tmp_path / "odd.wav"
    odd.write_bytes(_with_odd_chunks(paths[0].read_bytes()))
    for path in [*paths, odd]:
        ref = sf.info(str(path))
        data = path.read_bytes()
        info = audio.header_info(data[:4096], len(data))
        assert info is not None, path
        assert (info.sample_rate, info.num_samples, info.channels) == (ref.samplerate, ref.frames, ref.channels)
        assert audio.probe(str(path)) == info


def test_header_probe_falls_back_to_soundfile_for_other_formats(tmp_path):
    ogg = _written(tmp_path, "a.ogg", "VORBIS", fmt="OGG")
    assert audio.header_info(ogg.read_bytes(), ogg.stat().st_size) is None
    info = audio.probe(str(ogg))
    assert info.sample_rate == 22050 and info.format == "ogg"


def test_is_pcm16_knows_16_bit_wav_and_flac_from_their_headers(fixture_corpus, tmp_path):
    wav = (fixture_corpus / "wav" / "spk0-utt000.wav").read_bytes()
    flac = (fixture_corpus / "wav" / "spk1-utt001.flac").read_bytes()
    assert audio.is_pcm16(wav) and audio.is_pcm16(flac)
    wave, rate = sf.read(fixture_corpus / "wav" / "spk0-utt000.wav", dtype="float32")
    for fmt, subtype in (("WAV", "FLOAT"), ("WAV", "PCM_24"), ("FLAC", "PCM_24")):
        sf.write(tmp_path / "x", wave, rate, format=fmt, subtype=subtype)
        assert not audio.is_pcm16((tmp_path / "x").read_bytes()), (fmt, subtype)
    assert not audio.is_pcm16(b"RIFF....not audio")


def test_a_fifo_or_a_device_in_wav_scp_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "stuck.wav"
    os.mkfifo(fifo)  # no writer: an open() would block forever
    for name, source, needle in (("fifo", fifo, "is a FIFO (named pipe), not a regular file"),
                                 ("zero", "/dev/zero", "/dev/zero is a device, not a regular file")):
        (tmp_path / f"{name}.scp").write_text(f"utt1 {source}\n")
        (tmp_path / "text").write_text("utt1 hello\n")
        result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{tmp_path / f'{name}.scp'},{tmp_path / 'text'}]",
                         "++data_type_list=[source,target]", f"++jsonl_file_out={tmp_path / 'o.jsonl'}",
                         "++num_workers=1", timeout=120)
        assert_user_error(result, needle)
        jsonl = tmp_path / f"{name}.jsonl"
        jsonl.write_text(json.dumps({"key": "utt1", "source": str(source), "target": "hello"}) + "\n")
        result = run_cli("corpus-io", "pack-shards", f"++input={jsonl}", f"++output_dir={tmp_path / name}",
                         "++num_workers=1", timeout=120)
        assert_user_error(result, needle)


def test_an_endless_command_source_is_cut_at_the_named_byte_bound():
    with pytest.raises(DataError, match=r"longer than 1048576 bytes \(the per-source read bound"):
        audio.read_source_bytes("pipe:cat /dev/zero", allow_pipe=True, max_bytes=1 << 20)
    assert audio.MAX_SOURCE_BYTES == 256 * 1024 * 1024


def test_ark_offset_sources_are_recognised():
    assert audio.is_ark_offset("data/feats.ark:1234")
    assert not audio.is_ark_offset("a.wav")


def test_samples_beyond_any_full_scale_are_blamed_on_the_audio_naming_the_file_and_its_header(fixture_corpus, tmp_path):
    """Real speech times 1e30 in a float WAV: finite, but Kaldi features of it overflow to NaN and the model's
    output with them, which decode blamed on the checkpoint's weights. Refused where it is decoded, naming the
    file and what its header says; int32-scale float samples (up to 2^31) are still audio."""
    speech, rate = sf.read(_real_wavs(fixture_corpus)[0], dtype="float32")
    speech /= np.abs(speech).max()
    path = tmp_path / "loud.wav"
    sf.write(path, speech * np.float32(1e30), rate, subtype="FLOAT")
    with pytest.raises(DataError) as err:
        audio.decode_bytes(path.read_bytes(), where=str(path))
    said = str(err.value)
    assert said.startswith(f"{path}: the audio holds samples of magnitude up to 1e+30, the first at sample "), said
    assert f"its header says WAV FLOAT, {rate} Hz, 1 channel, {len(speech)} samples" in said, said
    assert "the audio is at fault, not the model" in said, said
    sf.write(path, speech * np.float32(2.0 ** 31), rate, subtype="FLOAT")
    assert np.abs(audio.decode_bytes(path.read_bytes(), where=str(path))[0]).max() == 2.0 ** 31
