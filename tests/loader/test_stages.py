"""Loader stages on the fixture corpus: decode, filters, resample, speed perturb, features, augmentation."""

from __future__ import annotations

import io
import math
import random
from collections import Counter

import numpy as np
import pytest
import soundfile as sf
import torch

from corpus_io.audio import io as audio
from corpus_io.errors import DataError
from corpus_io.loader import stages
from corpus_io.loader.batching import batch_order


def _read(fixture_corpus, limit: int | None = None) -> list[dict]:
    texts = dict(line.split(" ", 1) for line in (fixture_corpus / "text").read_text(encoding="utf-8").splitlines())
    out = []
    for line in (fixture_corpus / "wav.scp").read_text().splitlines()[:limit]:
        key, path = line.split(" ", 1)
        out.append({"key": key, "audio": open(path, "rb").read(), "audio_format": path.rsplit(".", 1)[1],
                    "txt": texts[key], "__url__": str(fixture_corpus / "wav.scp")})
    return out


def test_decode_gives_mono_float_tensor_at_file_rate(fixture_corpus):
    for sample in stages.decode(_read(fixture_corpus)):
        info = sf.info(sample["__url__"].replace("wav.scp", "") + f"wav/{sample['key']}.{sample['audio_format']}")
        assert "audio" not in sample and sample["wav"].dtype == torch.float32
        assert tuple(sample["wav"].shape) == (1, info.frames) and sample["sample_rate"] == info.samplerate


def test_decode_cuts_raw_segments_by_seconds(fixture_corpus):
    data = (fixture_corpus / "segments_dir" / "wav" / "long.wav").read_bytes()
    rate = sf.info(io.BytesIO(data)).samplerate
    out = list(stages.decode([{"key": "s", "audio": data, "start": 3.205, "end": 5.178},
                              {"key": "t", "audio": data, "start": 6.332, "end": -1}]))
    assert out[0]["wav"].shape[1] == round(5.178 * rate) - round(3.205 * rate)
    assert out[1]["wav"].shape[1] == sf.info(io.BytesIO(data)).frames - round(6.332 * rate)


def test_decode_averages_stereo_to_mono():
    stereo = np.stack([np.full(800, 0.5), np.full(800, -0.25)], axis=1).astype(np.float32)
    (sample,) = stages.decode([{"key": "st", "audio": audio.encode(stereo, 8000, "wav")}])
    assert sample["wav"].shape == (1, 800) and abs(float(sample["wav"].mean()) - 0.125) < 1e-3


def test_corrupt_member_names_key_and_url_or_is_counted_when_skipping():
    bad = [{"key": "k1", "audio": b"RIFFnonsense", "audio_format": "wav", "__url__": "shard-000003.tar"}]
    with pytest.raises(DataError, match="k1.*shard-000003.tar.*on_error=skip"):
        list(stages.decode([dict(bad[0])]))
    counts: Counter = Counter()
    assert list(stages.decode(bad, on_error="skip", counts=counts)) == []
    assert counts == {"decode.error": 1}


@pytest.mark.parametrize("segment", [False, True])
def test_a_float_wav_holding_nan_or_inf_is_a_decode_error_naming_key_and_url_not_clicks(segment):
    wave = np.full(1600, 0.1, dtype=np.float32)
    wave[900], wave[1000] = np.nan, -np.inf
    buf = io.BytesIO()
    sf.write(buf, wave, 16000, format="WAV", subtype="FLOAT")
    bad = {"key": "k9", "audio": buf.getvalue(), "audio_format": "wav", "__url__": "shard-000007.tar"}
    if segment:  # a raw list's segment: the samples it cuts are checked
        bad.update(start=0.05, end=0.09)
    with pytest.raises(DataError) as err:
        list(stages.decode([dict(bad)]))
    assert str(err.value).startswith("utterance 'k9' of shard-000007.tar: wav member: the audio holds 2 non-finite "
                                     f"samples (NaN or infinity), the first at sample {100 if segment else 900}")
    counts: Counter = Counter()
    assert list(stages.decode([dict(bad)], on_error="skip", counts=counts)) == []
    assert counts == {"decode.error": 1}
    bad.update(start=0.0, end=0.05)  # a segment before the bad samples decodes
    assert list(stages.decode([dict(bad)]))[0]["wav"].shape == (1, 800)


def test_length_and_token_filters_count_drops_by_reason():
    def s(frames: int, tokens: int) -> dict:
        return {"key": f"{frames}-{tokens}", "feats": torch.zeros(frames, 2), "tokens": [3] * tokens}

    counts: Counter = Counter()
    kept = list(stages.filter_length([s(5, 1), s(20000, 1), s(100, 1)], min_length=10, max_length=10240,
                                     counts=counts))
    kept += list(stages.filter_tokens([s(100, 0), s(100, 300), s(100000, 1), s(20, 30), s(100, 5)],
                                      token_min_length=1, token_max_length=200, min_output_input_ratio=0.0005,
                                      max_output_input_ratio=1.0, counts=counts))
    assert [x["key"] for x in kept] == ["100-1", "100-5"]
    assert counts == {"filter.too_short": 1, "filter.too_long": 1, "filter.too_few_tokens": 1,
                      "filter.too_many_tokens": 1, "filter.ratio_too_low": 1, "filter.ratio_too_high": 1}


def test_length_filter_uses_seconds_of_the_waveform():
    wav = {"key": "w", "wav": torch.zeros(1, 8000 * 2), "sample_rate": 8000}  # 200 frames
    assert list(stages.filter_length([wav], max_length=199)) == []
    assert len(list(stages.filter_length([dict(wav)], max_length=200))) == 1


def test_resample_changes_length_exactly(fixture_corpus):
    decoded = list(stages.decode(_read(fixture_corpus, 3)))  # 8 kHz, 16 kHz, 44.1 kHz
    before = {s["key"]: (s["wav"].shape[1], s["sample_rate"]) for s in decoded}
    for sample in stages.resample(decoded, resample_rate=16000):
        n, rate = before[sample["key"]]
        assert sample["sample_rate"] == 16000 and sample["wav"].shape[1] == math.ceil(n * 16000 / rate)


def test_resample_with_cached_kernel_equals_torchaudio_resample(fixture_corpus):
    import torchaudio.functional as AF

    for sample in stages.decode(_read(fixture_corpus, 3)):  # 8 kHz, 16 kHz, 44.1 kHz
        wav, rate = sample["wav"], sample["sample_rate"]
        for new in (16000, 14400, 17600):  # the target rate and speed perturbation's rates
            first, again = stages.resample_wav(wav, rate, new), stages.resample_wav(wav, rate, new)
            assert torch.equal(first, AF.resample(wav, rate, new)) and torch.equal(again, first)


def test_speed_perturb_is_seeded_and_changes_length_by_speed(fixture_corpus):
    def run(seed: int) -> list[int]:
        decoded = stages.resample(stages.decode(_read(fixture_corpus, 6)), resample_rate=16000)
        return [s["wav"].shape[1] for s in stages.speed_perturb(decoded, speeds=[0.9, 1.0, 1.1], seed=seed,
                                                                 epoch=0)]

    plain = [s["wav"].shape[1] for s in stages.resample(stages.decode(_read(fixture_corpus, 6)), resample_rate=16000)]
    first = run(3)
    assert first == run(3)
    for n, m in zip(plain, first):
        assert any(abs(m - n / speed) <= 2 for speed in (0.9, 1.0, 1.1))
    assert first != plain


def test_fbank_frames_follow_wenet_formula(fixture_corpus):
    decoded = list(stages.resample(stages.decode(_read(fixture_corpus, 4)), resample_rate=16000))
    lengths = [s["wav"].shape[1] for s in decoded]
    feats = [s["feats"] for s in stages.fbank(decoded, num_mel_bins=80)]
    for n, f in zip(lengths, feats):
        assert f.shape == (1 + (n - 400) // 160, 80) and f.dtype == torch.float32 and torch.isfinite(f).all()


def test_mfcc_and_raw_features_shapes(fixture_corpus):
    decoded = list(stages.resample(stages.decode(_read(fixture_corpus, 2)), resample_rate=16000))
    n = decoded[0]["wav"].shape[1]
    (m,) = list(stages.mfcc([dict(decoded[0])], num_mel_bins=40, num_ceps=13))
    assert m["feats"].shape == (1 + (n - 400) // 160, 13) and "wav" not in m
    (r,) = list(stages.raw_features([dict(decoded[0])]))
    assert r["feats"].shape == (n, 1)


def test_dither_is_drawn_per_utterance_by_seed_epoch_and_key_as_the_device_front_end_draws_it(fixture_corpus):
    """The training loader's dither (fbank and mfcc stages, batched or not) is one draw per utterance by (seed, epoch,
    key): reproducible, another epoch or seed another draw, the features batch_fbank gives with that seed (what
    feats_on=model computes), and none without a seed (cv, decode)."""
    from corpus_io.audio import features

    decoded = list(stages.decode(_read(fixture_corpus, 3)))

    def feats(stage=stages.fbank, **kwargs) -> dict:
        return {s["key"]: s["feats"] for s in stage([dict(s) for s in decoded], num_mel_bins=40, dither=1.0,
                                                    **kwargs)}

    plain = feats()
    once, again = feats(seed=5, epoch=0), feats(seed=5, epoch=0, batched=False)
    other_epoch, other_seed = feats(seed=5, epoch=1), feats(seed=6, epoch=0)
    for sample in decoded:
        key = sample["key"]
        wav = sample["wav"].reshape(1, -1)
        device, _ = features.batch_fbank(wav, torch.tensor([wav.shape[1]]), sample["sample_rate"], num_mel_bins=40,
                                         dither=1.0, seeds=[features.dither_seed(5, 0, key)])
        assert (once[key] - device[0]).abs().max() < 1e-4 and (again[key] - once[key]).abs().max() < 1e-4, key
        assert (once[key] - plain[key]).abs().max() > 0.1, key  # dithered
        assert (once[key] - other_epoch[key]).abs().max() > 0.1 and (once[key] - other_seed[key]).abs().max() > 0.1
    mfcc, one_by_one = feats(stages.mfcc, seed=5, epoch=0), feats(stages.mfcc, seed=5, epoch=0, batched=False)
    assert all((mfcc[k] - v).abs().max() < 1e-3 for k, v in one_by_one.items())
    assert all((mfcc[k] - v).abs().max() > 0.1 for k, v in feats(stages.mfcc).items())


def test_precomputed_features_never_decode_audio():
    array = np.arange(30, dtype=np.float32).reshape(10, 3)
    buf = io.BytesIO()
    np.save(buf, array)
    sample = {"key": "p", "audio": b"not audio at all", "fbank": buf.getvalue(), "txt": "x"}
    (out,) = list(stages.precomputed_features([sample], fields=["fbank", "txt"]))
    assert torch.equal(out["feats"], torch.from_numpy(array)) and "audio" not in out and "fbank" not in out
    counts: Counter = Counter()
    assert list(stages.precomputed_features([{"key": "q", "npy": b"junk"}], on_error="skip", counts=counts)) == []
    assert counts == {"features.error": 1}


def test_spec_augmentations_are_seeded_and_follow_wenet(fixture_corpus):
    base = torch.ones(200, 80)

    def aug(seed: int) -> torch.Tensor:
        return next(stages.spec_aug([{"feats": base}], num_t_mask=2, num_f_mask=2, max_t=50, max_f=10,
                                    rng=random.Random(seed)))["feats"]

    assert torch.equal(aug(1), aug(1)) and (aug(1) == 0).any() and base.min() == 1
    feats = torch.arange(200.0).unsqueeze(1).repeat(1, 4)
    sub = next(stages.spec_sub([{"feats": feats}], max_t=30, num_t_sub=3, rng=random.Random(2)))["feats"]
    assert sub.shape == feats.shape and (sub <= feats).all()
    trimmed = next(stages.spec_trim([{"feats": feats}], max_t=20, rng=random.Random(3)))["feats"]
    assert 180 <= trimmed.shape[0] < 200 and torch.equal(trimmed, feats[:trimmed.shape[0]])


def test_shuffle_and_sort_buffers_are_deterministic_blocks():
    samples = [{"key": str(i), "feats": torch.zeros(i % 7 + 1, 1)} for i in range(10)]
    a = [s["key"] for s in stages.shuffle(samples, shuffle_size=4, rng=random.Random(9))]
    assert a == [s["key"] for s in stages.shuffle(samples, shuffle_size=4, rng=random.Random(9))]
    assert sorted(a[:4]) == ["0", "1", "2", "3"] and sorted(a) == sorted(s["key"] for s in samples)
    lengths = [s["feats"].shape[0] for s in stages.sort(samples, sort_size=5)]
    assert lengths[:5] == sorted(lengths[:5]) and lengths[5:] == sorted(lengths[5:])


def _sorted_batches(samples, seed: int) -> list[list[str]]:
    blocks = stages.sort(stages.shuffle(samples, shuffle_size=1500, rng=random.Random(seed)), sort_size=500,
                         mark_blocks=True)
    batches = stages.shuffle_batches(stages.batch(blocks, batch_size=4), batch_order=batch_order(seed, 0, 0, 0))
    return [[s["key"] for s in b] for b in batches]


def test_the_batches_of_a_sort_block_leave_in_a_seeded_random_order_not_longest_last():
    # 30 utterances, one sort block (WeNet's default size): sorted, the 4 longest were always the last batch
    samples = [{"key": f"{i:02d}", "feats": torch.zeros(10 + i, 1)} for i in range(30)]
    runs = {seed: _sorted_batches([dict(s) for s in samples], seed) for seed in range(12)}
    assert runs[3] == _sorted_batches([dict(s) for s in samples], 3)  # seeded: the same order again
    for batches in runs.values():
        assert sorted(k for b in batches for k in b) == [s["key"] for s in samples]
        assert all(b == sorted(b) and int(b[-1]) - int(b[0]) == len(b) - 1 for b in batches)  # still length-sorted
    last = [batches[-1] for batches in runs.values()]
    assert sum("29" in b for b in last) <= 4, last  # the longest utterance's batch is last only by chance


def test_samples_carried_from_the_last_epoch_fill_the_first_batches_topped_up_with_the_shortest():
    carried = [{"key": f"c{i}", "feats": torch.zeros(300 + i, 1), "__carried__": True} for i in range(5)]
    own = [{"key": f"o{i:02d}", "feats": torch.zeros(10 + i, 1)} for i in range(20)]
    for seed in range(4):
        batches = _sorted_batches([dict(s) for s in carried + own], seed)
        assert batches[0] == ["c0", "c1", "c2", "c3"] and batches[1] == ["c4", "o00", "o01", "o02"]
        assert all(k.startswith("o") for b in batches[2:] for k in b)


def test_chain_on_fixture_yields_contract_batches(fixture_corpus, tmp_path):
    from corpus_io.config import MakeTokenizerConfig, TokenizerConf
    from corpus_io.tokenizer import build_tokenizer, make_tokenizer

    make_tokenizer(MakeTokenizerConfig(input=str(fixture_corpus / "text"), output=str(tmp_path / "units.txt")))
    tokenizer = build_tokenizer(TokenizerConf(token_list=str(tmp_path / "units.txt")))
    counts: Counter = Counter()
    s = stages.decode(_read(fixture_corpus), counts=counts)
    s = stages.filter_length(s, min_length=150, max_length=10240, counts=counts)
    s = stages.resample(s, resample_rate=16000)
    s = stages.fbank(s, num_mel_bins=80, counts=counts)
    s = stages.tokenize(s, tokenizer=tokenizer)
    s = stages.filter_tokens(s, counts=counts)
    s = stages.sort(stages.shuffle(s, shuffle_size=8, rng=random.Random(0)), sort_size=8)
    batches = list(stages.pad(stages.batch(s, batch_type="token", batch_size=2000, counts=counts)))
    assert counts["filter.too_short"] == 4  # the four utterances under 1.5 s
    assert sum(len(b["keys"]) for b in batches) == 20
    for b in batches:
        assert b["feats"].shape[0] == len(b["keys"]) and b["feats"].shape[2] == 80
        worst = int((b["feats_lengths"] + b["target_lengths"]).max())
        assert worst * len(b["keys"]) <= 2000 or len(b["keys"]) == 1
        assert 0 <= b["padding_ratio"] < 1 and b["audio_seconds"] > 0


def test_tokenize_counts_tokens_missing_from_the_token_list(tmp_path):
    from corpus_io.config import TokenizerConf
    from corpus_io.tokenizer import build_tokenizer

    (tmp_path / "units.txt").write_text("<blank> 0\n<unk> 1\n你 2\n好 3\n<sos/eos> 4\n", encoding="utf-8")
    tokenizer = build_tokenizer(TokenizerConf(token_list=str(tmp_path / "units.txt")))
    counts: Counter = Counter()
    out = list(stages.tokenize([{"key": "a", "txt": "你好"}, {"key": "b", "txt": "你坏 hello"}],
                               tokenizer=tokenizer, counts=counts))
    assert out[0]["tokens"] == [2, 3] and out[1]["tokens"] == [2, 1, 1]
    assert counts["tokenize.unknown_tokens"] == 2


def test_tokenize_counts_special_tokens_written_in_a_transcript_as_unknown(tmp_path):
    from tests.test_tokenizer import tiny_tokenizer

    tokenizer = tiny_tokenizer(tmp_path)
    counts: Counter = Counter()
    out = list(stages.tokenize([{"key": "a", "txt": "你 <blank> 好 <sos/eos>"}], tokenizer=tokenizer, counts=counts))
    assert out[0]["tokens"] == [2, tokenizer.unk_id, 3, tokenizer.unk_id]
    assert counts["tokenize.unknown_tokens"] == 2


def test_audio_shorter_than_one_analysis_window_is_dropped_and_counted_not_a_traceback(fixture_corpus):
    data = (fixture_corpus / "segments_dir" / "wav" / "long.wav").read_bytes()
    rate = sf.info(io.BytesIO(data)).samplerate
    window = int(rate * 25 * 1e-3)
    # real speech cut to 1 and window-1 samples (a 2-frame min_length lets such segments through), and one window
    cuts = [(3.0, 3.0 + n / rate) for n in (1, window - 1, window)]
    samples = [{"key": f"s{i}", "audio": data, "audio_format": "wav", "start": s, "end": e}
               for i, (s, e) in enumerate(cuts)]
    for stage in (stages.fbank, stages.mfcc):
        counts: Counter = Counter()
        decoded = list(stages.decode([dict(s) for s in samples], counts=counts))
        kept = list(stage(decoded, counts=counts))
        assert [s["key"] for s in kept] == ["s2"] and kept[0]["feats"].shape[0] == 1
        assert counts["features.shorter_than_window"] == len(decoded) - 1


def _real_recordings() -> list[dict]:
    """The fetched real recordings (recipes/tools/real_recordings.py), read as the loader reads a raw list."""
    from tests.loader.test_dataset import _real_utts

    return [{"key": key, "audio": open(path, "rb").read(), "audio_format": path.rsplit(".", 1)[1], "txt": text}
            for key, path, text in _real_utts()]


@pytest.mark.parametrize("corpus, int16, kinds", [("espeak", False, ("fbank", "mfcc")), ("espeak", True, ("fbank",)),
                                                   ("real recordings", True, ("fbank",))])
def test_fbank_and_mfcc_stages_compute_in_batches_what_per_utterance_features_give(fixture_corpus, corpus, int16,
                                                                                   kinds, monkeypatch):
    """The loader's features come from the batched functions (a window sorted by length, batches of 16), equal to
    torchaudio's per-utterance ones within 1e-3, in the input order, for float and int16 (16-bit PCM) waveforms.
    Each utterance keeps a copy of its rows (a view would keep its whole batch alive in the buffers, issue 53)."""
    from corpus_io.audio import features

    calls = []
    for name in ("batch_fbank", "batch_mfcc"):
        def counted(wav, *args, _real=getattr(features, name), **kwargs):
            calls.append(wav.shape[0])
            return _real(wav, *args, **kwargs)
        monkeypatch.setattr(features, name, counted)

    read = _read(fixture_corpus) if corpus == "espeak" else _real_recordings()
    decoded = list(stages.resample(stages.decode(read, int16=int16), resample_rate=16000))
    assert any(s["wav"].dtype == torch.int16 for s in decoded) == int16
    options = {"fbank": (features.fbank, {"num_mel_bins": 80}),
               "mfcc": (features.mfcc, {"num_mel_bins": 40, "num_ceps": 13})}
    for name in kinds:
        per_utterance, kwargs = options[name]
        calls.clear()
        out = list(getattr(stages, name)([dict(s) for s in decoded], **kwargs))
        assert [s["key"] for s in out] == [s["key"] for s in decoded]
        for sample, source in zip(out, decoded):
            reference = per_utterance(stages.as_float(source["wav"]), 16000, **kwargs)
            assert sample["feats"].shape == reference.shape and "wav" not in sample
            assert (sample["feats"] - reference).abs().max() < 1e-3, (name, sample["key"])
        assert sum(calls) == len(out) and len(calls) <= -(-len(out) // stages.FEATURE_BATCH)  # batches, not one by
        assert len({s["feats"].untyped_storage().data_ptr() for s in out}) == len(out)  # one; a copy each
