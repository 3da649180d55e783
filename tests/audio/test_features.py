"""Batched Kaldi features (corpus_io.audio.features) against torchaudio's per-utterance ones, on real speech.

The waveforms come from the committed espeak corpus (8, 16 and 44.1 kHz, wav and flac) through the
loader's own decode and resample stages, plus cuts of it just below, at and above one and two
frames, so the batch holds utterances of 40+ different lengths.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import soundfile as sf
import torch
from torchaudio.compliance import kaldi

from corpus_io.audio import features
from corpus_io.loader import stages
from corpus_io.loader.batching import pad
from tests.loader_data import FIXTURE, fixture_utts

# (source file, first sample, samples at the source rate) -> after resampling to 16 kHz: around 1 and 2 frames
CUTS = [("spk0-utt004.wav", 8000, n) for n in (399, 400, 401, 559, 560, 561, 719, 720)] + \
       [("spk0-utt000.wav", 4000, n) for n in (199, 200, 201, 280)] + \
       [("spk0-utt008.wav", 22050, n) for n in (1099, 1100, 1105, 1600)]


def loader_waveforms(tmp_path) -> list[dict]:
    """The fixture corpus and its cuts, decoded and resampled to 16 kHz by the loader's stages."""
    samples = [{"key": key, "audio": open(path, "rb").read(), "audio_format": path.rsplit(".", 1)[1]}
               for key, path, _ in fixture_utts()]
    for i, (name, start, n) in enumerate(CUTS):
        wave, rate = sf.read(FIXTURE / "wav" / name, dtype="int16")
        path = tmp_path / f"cut{i}.wav"
        sf.write(path, wave[start:start + n], rate, subtype="PCM_16")
        samples.append({"key": f"cut{i}-{name}-{n}", "audio": path.read_bytes(), "audio_format": "wav"})
    return list(stages.resample(stages.decode(samples), resample_rate=16000))


@pytest.fixture(scope="module")
def waveforms(tmp_path_factory) -> list[dict]:
    return loader_waveforms(tmp_path_factory.mktemp("cuts"))


def test_batched_fbank_equals_torchaudio_per_utterance_on_real_speech_of_many_lengths(waveforms):
    lengths = [s["wav"].shape[1] for s in waveforms]
    assert len(set(lengths)) >= 20 and {399, 400, 401, 559, 560, 561} <= set(lengths)
    counts: Counter = Counter()
    kept = list(stages.drop_empty(stages.waveform_frames([dict(s) for s in waveforms]), counts=counts))
    assert counts["features.shorter_than_window"] == sum(n < 400 for n in lengths) >= 2  # below one window: no frame
    batch = pad(kept)
    feats, frames = features.batch_fbank(batch["wav"], batch["wav_lengths"], 16000, num_mel_bins=80)
    assert torch.equal(frames, batch["feats_lengths"])
    assert feats.shape == (len(kept), int(frames.max()), 80)
    loader_wav = {s["key"]: s["wav"] for s in waveforms}  # float32 in [-1, 1], as the loader decoded it
    for i, sample in enumerate(kept):
        wav = loader_wav[sample["key"]]
        reference = kaldi.fbank(wav * 32768, num_mel_bins=80, dither=0.0, energy_floor=0.0, sample_frequency=16000)
        assert reference.shape[0] == int(frames[i]) == features.num_frames(wav.shape[1], 16000)
        assert (feats[i, :reference.shape[0]] - reference).abs().max() < 1e-3, sample["key"]
        assert not feats[i, reference.shape[0]:].any(), "padded frames must be 0"


def test_batch_of_sub_window_utterances_gives_no_frames():
    wav = torch.zeros(3, 399, dtype=torch.int16)
    feats, frames = features.batch_fbank(wav, torch.tensor([399, 200, 1]), 16000)
    assert frames.tolist() == [0, 0, 0] and feats.shape[:2] == (3, 0)


def test_padding_values_never_change_the_valid_frames(waveforms):
    batch = pad(list(stages.drop_empty(stages.waveform_frames([dict(s) for s in waveforms[:8]]))))
    wav, lengths = batch["wav"].float(), batch["wav_lengths"]
    clean, frames = features.batch_fbank(wav, lengths, 16000, num_mel_bins=40)
    noisy = wav.clone()
    outside = torch.arange(wav.shape[1])[None, :] >= lengths[:, None]
    noisy[outside] = torch.rand(int(outside.sum()), generator=torch.Generator().manual_seed(0)) * 2 - 1
    wider = torch.nn.functional.pad(noisy, (0, 1234), value=0.5)  # and more padding than needed
    for padded in (noisy, wider):
        feats, again = features.batch_fbank(padded, lengths, 16000, num_mel_bins=40)
        assert torch.equal(again, frames)
        assert torch.equal(feats[:, :clean.shape[1]], clean) and not feats[:, clean.shape[1]:].any()


def test_int16_and_float_waveforms_give_the_same_features(waveforms):
    sample = dict(waveforms[1])
    n = sample["wav"].shape[1]
    as_int16 = (sample["wav"] * 32768).round().clamp(-32768, 32767).to(torch.int16)
    a, _ = features.batch_fbank(as_int16, torch.tensor([n]), 16000)
    b, _ = features.batch_fbank(as_int16.float() / 32768, torch.tensor([n]), 16000)
    assert torch.equal(a, b)


def test_batched_mfcc_equals_torchaudio_per_utterance(waveforms):
    kept = list(stages.drop_empty(stages.waveform_frames([dict(s) for s in waveforms[::3]])))
    batch = pad(kept)
    feats, frames = features.batch_mfcc(batch["wav"], batch["wav_lengths"], 16000, num_mel_bins=40, num_ceps=13)
    loader_wav = {s["key"]: s["wav"] for s in waveforms}
    for i, sample in enumerate(kept):
        reference = features.mfcc(loader_wav[sample["key"]], 16000, num_mel_bins=40, num_ceps=13)
        assert reference.shape == (int(frames[i]), 13)
        assert (feats[i, :reference.shape[0]] - reference).abs().max() < 1e-3, sample["key"]


def test_dither_is_per_utterance_and_reproducible_from_its_seed(waveforms):
    kept = list(stages.drop_empty(stages.waveform_frames([dict(s) for s in waveforms[:4]])))
    batch = pad(kept)
    args = (batch["wav"], batch["wav_lengths"], 16000)
    a, _ = features.batch_fbank(*args, dither=1.0, seeds=[1, 2, 3, 4])
    b, _ = features.batch_fbank(*args, dither=1.0, seeds=[1, 2, 3, 4])
    c, _ = features.batch_fbank(*args, dither=1.0, seeds=[9, 2, 3, 4])
    clean, frames = features.batch_fbank(*args)
    assert torch.equal(a, b) and not torch.equal(a[0], c[0]) and torch.equal(a[1:], c[1:])
    assert not torch.equal(a, clean)
    alone, _ = features.batch_fbank(batch["wav"][1:2, :kept[1]["wav"].shape[1]], batch["wav_lengths"][1:2], 16000,
                                    dither=1.0, seeds=[2])
    assert torch.equal(alone[0], a[1, :alone.shape[1]])  # the same noise whatever batch the utterance is in


def test_waveform_frames_ships_16_bit_sources_as_int16_and_resampled_ones_as_float(tmp_path):
    wave, rate = sf.read(FIXTURE / "wav" / "spk0-utt004.wav", dtype="int16")
    assert rate == 16000
    raw = [{"key": "a", "audio": (FIXTURE / "wav" / "spk0-utt004.wav").read_bytes()}]
    (sample,) = stages.waveform_frames(stages.resample(stages.decode(raw), resample_rate=16000))
    assert sample["wav"].dtype == torch.int16 and np.array_equal(sample["wav"][0].numpy(), wave)
    assert sample["frames"] == 1 + (len(wave) - 400) // 160
    raw = [{"key": "b", "audio": (FIXTURE / "wav" / "spk0-utt000.wav").read_bytes()}]  # 8 kHz
    (resampled,) = stages.waveform_frames(stages.resample(stages.decode(raw), resample_rate=16000))
    assert resampled["wav"].dtype == torch.float32
    mixed = pad([sample, resampled])
    assert mixed["wav"].dtype == torch.float32 and mixed["sample_rate"] == 16000
    assert torch.equal(mixed["wav"][0, :len(wave)] * 32768, torch.from_numpy(wave).float())
    assert mixed["audio_seconds"] == pytest.approx((len(wave) + resampled["wav"].shape[1]) / 16000)
    assert pad([sample])["wav"].dtype == torch.int16
    raw = [{"key": "c", "audio": (FIXTURE / "wav" / "spk1-utt001.flac").read_bytes()}]  # 16 kHz 16-bit flac
    (flac,) = stages.waveform_frames(stages.resample(stages.decode(raw), resample_rate=16000))
    wave, _ = sf.read(FIXTURE / "wav" / "spk1-utt001.flac", dtype="int16")
    assert flac["wav"].dtype == torch.int16 and np.array_equal(flac["wav"][0].numpy(), wave)
    raw = [{"key": "d", "audio": (FIXTURE / "wav" / "spk1-utt001.flac").read_bytes()}]
    perturbed = stages.speed_perturb(stages.decode(raw), speeds=[1.1], seed=0, epoch=0)
    (fast,) = stages.waveform_frames(perturbed)
    assert fast["wav"].dtype == torch.float32


def test_the_fbank_band_settings_reach_torchaudio_the_batched_fbank_and_the_loader_stage_alike(waveforms):
    """dataset_conf.fbank_conf.low_freq/high_freq (sherpa-onnx's default band is high_freq=-400: 400 Hz below
    Nyquist) change the per-utterance fbank, batch_fbank (feats_on=model) and the loader's fbank stage (batched and
    per utterance) the same way, as torchaudio's kaldi.fbank computes them (snip_edges=true, Kaldi's framing)."""
    from corpus_io.config import DatasetConf
    from corpus_io.loader.build import Stage

    kept = [dict(s) for s in waveforms if s["wav"].shape[1] >= 8000][:5]
    assert len(kept) == 5
    conf = DatasetConf().fbank_conf
    conf.num_mel_bins, conf.low_freq, conf.high_freq, conf.snip_edges = 40, 60.0, -400.0, True
    batch = pad(list(stages.waveform_frames([dict(s) for s in kept])))
    batched, frames = features.batch_fbank(batch["wav"], batch["wav_lengths"], 16000, num_mel_bins=40,
                                           low_freq=60.0, high_freq=-400.0)
    default, _ = features.batch_fbank(batch["wav"], batch["wav_lengths"], 16000, num_mel_bins=40)
    stage = Stage("fbank", stages.fbank, conf)
    loader = {mode: {s["key"]: s["feats"] for s in stage.fn([dict(s) for s in kept], **stage.config_kwargs(),
                                                            batched=mode)} for mode in (True, False)}
    for i, sample in enumerate(batch["keys"]):
        wav = next(s["wav"] for s in kept if s["key"] == sample)
        reference = kaldi.fbank(wav * 32768, num_mel_bins=40, dither=0.0, energy_floor=0.0, sample_frequency=16000,
                                low_freq=60.0, high_freq=-400.0)
        n = reference.shape[0]
        assert n == int(frames[i])
        assert torch.equal(features.fbank(wav, 16000, num_mel_bins=40, low_freq=60.0, high_freq=-400.0), reference)
        assert (batched[i, :n] - reference).abs().max() < 1e-3, sample
        assert torch.equal(loader[False][sample], reference)
        assert (loader[True][sample] - reference).abs().max() < 1e-3, sample
        assert (default[i, :n] - reference).abs().max() > 0.5  # another band: other features


def test_an_empty_fbank_band_is_refused_naming_both_keys():
    from corpus_io.config import TrainConfig, validate
    from corpus_io.errors import ConfigError

    with pytest.raises(ConfigError, match=r"dataset_conf\.fbank_conf\.low_freq=4000\.0 and high_freq=-4000\.0 give "
                                          r"the band \[4000\.0, 4000\.0\] Hz"):
        validate(TrainConfig, {"output_dir": "exp", "dataset_conf": {"fbank_conf": {"low_freq": 4000,
                                                                                    "high_freq": -4000}}})
    validate(TrainConfig, {"output_dir": "exp", "dataset_conf": {"fbank_conf": {"low_freq": 20, "high_freq": -400}}})


def knf_fbank(wav: torch.Tensor, rate: int, num_mel_bins: int, high_freq: float) -> torch.Tensor:
    """kaldi-native-fbank (sherpa-onnx's front end) as sherpa-onnx's FeatureExtractorConfig sets it by default:
    snip_edges false, no dither; samples at int16 scale."""
    knf = pytest.importorskip("kaldi_native_fbank")
    opts = knf.FbankOptions()
    opts.frame_opts.snip_edges, opts.frame_opts.dither, opts.frame_opts.samp_freq = False, 0.0, float(rate)
    opts.mel_opts.num_bins, opts.mel_opts.high_freq, opts.energy_floor = num_mel_bins, high_freq, 0.0
    online = knf.OnlineFbank(opts)
    online.accept_waveform(float(rate), (wav.reshape(-1) * 32768).tolist())
    online.input_finished()
    rows = [online.get_frame(i) for i in range(online.num_frames_ready)]
    return torch.tensor(np.array(rows), dtype=torch.float32).reshape(len(rows), num_mel_bins)


def test_snip_edges_false_gives_the_frames_of_torchaudio_and_kaldi_native_fbank_on_real_speech(waveforms):
    """fbank_conf.snip_edges=false with high_freq=-400: sherpa-onnx's default features (kaldi-native-fbank), a frame
    centred on every 10 ms, (n + 80) // 160 of them, the samples past either end reflected."""
    for sample in [s for s in waveforms if s["wav"].shape[1] >= 8000][:3]:
        wav = sample["wav"]
        n = wav.shape[1]
        ours = features.fbank(wav, 16000, num_mel_bins=80, high_freq=-400.0, snip_edges=False)
        reference = kaldi.fbank(wav * 32768, num_mel_bins=80, dither=0.0, energy_floor=0.0, sample_frequency=16000,
                                high_freq=-400.0, snip_edges=False)
        assert ours.shape[0] == reference.shape[0] == (n + 80) // 160 == features.num_frames(n, 16000,
                                                                                            snip_edges=False)
        assert (ours - reference).abs().max() < 1e-3
        sherpa = knf_fbank(wav, 16000, 80, -400.0)
        assert sherpa.shape == ours.shape
        # its own float FFT: equal but for the near-empty bins above 4 kHz of these 8 kHz recordings
        assert (ours - sherpa).abs().mean() < 1e-4 and (ours - sherpa).abs().max() < 0.1, sample["key"]
        snipped = features.fbank(wav, 16000, num_mel_bins=80, high_freq=-400.0)
        assert snipped.shape[0] == 1 + (n - 400) // 160 < ours.shape[0]  # the default is unchanged: snip_edges


def test_the_default_features_are_sherpa_onnxs_own_in_the_loader_and_on_the_device(waveforms):
    """With dataset_conf's defaults the features a model trains and is decoded on are those sherpa-onnx computes with
    its default arguments (kaldi-native-fbank: high_freq -400, snip_edges false), through the loader's fbank stage
    (cv/decode: no dither) and the device front end; training dithers them (one 16-bit step), cv and decode not."""
    from corpus_io.config import DatasetConf
    from corpus_io.model.frontend import FrontEnd

    conf = DatasetConf(feats_on="model")
    assert (conf.fbank_conf.high_freq, conf.fbank_conf.snip_edges, conf.fbank_conf.dither) == (-400.0, False, 1.0)
    kept = [dict(s) for s in waveforms if s["wav"].shape[1] >= 8000][:3]
    loader = {s["key"]: s["feats"] for s in stages.fbank([dict(s) for s in kept], **{
        k: v for k, v in dataclasses.asdict(conf.fbank_conf).items() if k != "dither"})}
    batch = pad(list(stages.waveform_frames([dict(s) for s in kept], snip_edges=False)))
    front = FrontEnd(conf)
    served, frames = front(batch, train=False)
    trained, _ = front(batch, train=True)
    for i, key in enumerate(batch["keys"]):
        wav = next(s["wav"] for s in kept if s["key"] == key)
        sherpa = knf_fbank(wav, 16000, 80, -400.0)
        n = int(frames[i])
        assert n == sherpa.shape[0] == loader[key].shape[0]
        for ours in (loader[key], served[i, :n]):
            assert (ours - sherpa).abs().mean() < 1e-4 and (ours - sherpa).abs().max() < 0.1, key
        assert (trained[i, :n] - served[i, :n]).abs().max() > 0.1, key  # training's dither


def test_batched_snip_edges_false_equals_per_utterance_for_every_length_padding_never_counting(waveforms):
    """batch_fbank (feats_on=model) and the loader's batched fbank stage with snip_edges=false: every row reflected
    at its own length (utterances shorter than a window too, as kaldi-native-fbank does), padding never changing a
    valid frame, frame counts as num_frames counts them."""
    from corpus_io.config import DatasetConf
    from corpus_io.loader.build import Stage

    short = [{"key": f"short{n}", "wav": waveforms[0]["wav"][:, 1000:1000 + n], "sample_rate": 16000}
             for n in (79, 80, 100, 239, 240, 399)]
    kept = list(stages.drop_empty(stages.waveform_frames([dict(s) for s in waveforms + short], snip_edges=False)))
    assert len(kept) == len(waveforms) + len(short) - 1  # 79 samples: no frame
    batch = pad(kept)
    wav, lengths = batch["wav"].float(), batch["wav_lengths"]
    feats, frames = features.batch_fbank(wav, lengths, 16000, num_mel_bins=40, high_freq=-400.0, snip_edges=False)
    assert torch.equal(frames, batch["feats_lengths"])
    assert frames.tolist() == [(int(n) + 80) // 160 for n in lengths]
    noisy = wav.clone()
    outside = torch.arange(wav.shape[1])[None, :] >= lengths[:, None]
    noisy[outside] = torch.rand(int(outside.sum()), generator=torch.Generator().manual_seed(0)) * 2 - 1
    again, _ = features.batch_fbank(torch.nn.functional.pad(noisy, (0, 999), value=0.5), lengths, 16000,
                                    num_mel_bins=40, high_freq=-400.0, snip_edges=False)
    conf = DatasetConf().fbank_conf
    conf.num_mel_bins, conf.high_freq, conf.snip_edges = 40, -400.0, False
    stage = Stage("fbank", stages.fbank, conf)
    loader = {s["key"]: s["feats"] for s in stage.fn([dict(s) for s in kept], **stage.config_kwargs())}
    for i, sample in enumerate(kept):
        reference = features.fbank(sample["wav"].float() / (32768 if sample["wav"].dtype == torch.int16 else 1),
                                   16000, num_mel_bins=40, high_freq=-400.0, snip_edges=False)
        m = reference.shape[0]
        assert m == int(frames[i]) > 0
        assert (feats[i, :m] - reference).abs().max() < 1e-3, sample["key"]
        assert not feats[i, m:].any()
        assert torch.equal(again[i, :feats.shape[1]], feats[i]), sample["key"]
        assert (loader[sample["key"]] - reference).abs().max() < 1e-3, sample["key"]
        if sample["key"].startswith("short"):
            assert (reference - knf_fbank(sample["wav"], 16000, 40, -400.0)).abs().max() < 1e-3, sample["key"]


def test_a_waveform_batch_padded_to_a_bucket_edge_holds_exactly_its_frames_either_way():
    from corpus_io.loader.batching import Batch

    for snip in (True, False):
        rows = Batch([{"key": "a", "wav": torch.zeros(1, 1000), "sample_rate": 16000, "tokens": [1], "frames": 6}])
        rows.frames = 50
        width = pad(rows, snip_edges=snip)["wav"].shape[1]
        assert features.num_frames(width, 16000, snip_edges=snip) == 50
        assert features.num_frames(width + 1, 16000, snip_edges=snip) == 51


@pytest.mark.parametrize("snip_edges", [True, False])
def test_a_long_batch_is_framed_block_by_block_with_the_same_features(monkeypatch, snip_edges):
    """A batch longer than BLOCK_VALUES framed values (a 1-hour recording: 1.5 GB of windows and spectra at once; a
    loader worker's batch of long utterances, whose freed temporaries glibc keeps: issue 53) is windowed and
    transformed in blocks of frames: the same features, frame for frame, the padding rows' too, with either framing,
    with training dither, and for MFCC."""
    torch.manual_seed(0)
    wav = (torch.randn(2, 16000 * 20) * 3000).to(torch.int16)
    lengths = torch.tensor([16000 * 20, 16000 * 13 + 123])
    options = {"snip_edges": snip_edges, "dither": 1.0, "seeds": [7, 8]}
    assert features.BLOCK_VALUES == 1 << 18  # the default: 256 frames a block here, 8 blocks
    blocked, blocked_frames = features.batch_fbank(wav, lengths, 16000, **options)
    blocked_mfcc, _ = features.batch_mfcc(wav, lengths, 16000)
    monkeypatch.setattr(features, "BLOCK_VALUES", 1 << 40)  # one block
    whole, frames = features.batch_fbank(wav, lengths, 16000, **options)
    whole_mfcc, _ = features.batch_mfcc(wav, lengths, 16000)
    assert torch.equal(frames, blocked_frames) and torch.equal(whole, blocked)
    assert torch.equal(whole_mfcc, blocked_mfcc)


def test_a_padded_batch_without_snip_edges_gives_each_row_its_own_reflected_frames():
    """snip_edges=false batched: each row is reflected at its own length (one copy of the samples, only the edges
    gathered), so every row's frames equal its own per-utterance features, a row shorter than a window included."""
    torch.manual_seed(1)
    lengths = [16000 * 3 + 77, 16000 + 5, 300, 16000 * 2]
    wav = torch.zeros(len(lengths), max(lengths))
    for i, n in enumerate(lengths):
        wav[i, :n] = torch.randn(n) * 0.1
    batched, frames = features.batch_fbank(wav, torch.tensor(lengths), 16000, high_freq=-400.0, snip_edges=False)
    for i, n in enumerate(lengths):
        own = features.fbank(wav[i:i + 1, :n], 16000, high_freq=-400.0, snip_edges=False)
        assert int(frames[i]) == own.shape[0] == features.num_frames(n, 16000, snip_edges=False)
        assert (batched[i, :own.shape[0]] - own).abs().max() < 1e-3, i
        assert not batched[i, own.shape[0]:].any()
