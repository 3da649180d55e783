"""feats_on=model end to end: real shards -> the loader ships waveforms (DataLoader workers) -> the device
front end (CPU here: the same code runs on CUDA) gives the loader-side features, counts, CMVN and budgets."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import soundfile as sf
import torch

from corpus_io.config import ComputeCmvnConfig
from corpus_io.errors import ConfigError
from corpus_io.loader.dataset import build_dataloader
from corpus_io.model.cmvn import compute_cmvn
from corpus_io.model.frontend import FrontEnd, build_front_end, model_inputs
from tests.audio.test_features import CUTS
from tests.loader_data import FIXTURE, fixture_utts, make_shards, small_conf

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cut_shards(tmp_path_factory):
    """The 24 fixture utterances (8/16/44.1 kHz) and 16 cuts around one and two frames, in 5 shards."""
    root = tmp_path_factory.mktemp("frontend")
    utts = list(fixture_utts())
    for i, (name, start, n) in enumerate(CUTS):
        wave, rate = sf.read(FIXTURE / "wav" / name, dtype="int16")
        path = root / f"cut{i}.wav"
        sf.write(path, wave[start:start + n], rate, subtype="PCM_16")
        utts.append((f"cut{i}-{n}", str(path), "一"))
    data_list, keys = make_shards(root / "shards", utts=utts, per_shard=8)
    return str(data_list), keys


def features_by_key(data_list: str, conf, *, train: bool = False, epoch: int = 0) -> tuple[dict, dict, list]:
    loader = build_dataloader(data_list, conf, None, train=train, rank=0, world_size=1)
    loader.set_epoch(epoch)
    front_end = build_front_end(conf, CPU)
    if front_end is not None:
        front_end.set_epoch(epoch)
    out, batches = {}, []
    for batch in loader:
        feats, lengths = model_inputs(front_end, batch, CPU, train=train)
        batches.append(batch)
        for key, f, n in zip(batch["keys"], feats, lengths):
            out[key] = f[:int(n)]
            assert not f[int(n):].any(), "padded frames must be 0"
    return out, loader.counts(), batches


def test_model_side_features_equal_the_loader_side_ones_with_the_same_frames_and_drops(cut_shards):
    data_list, keys = cut_shards
    conf = dict(shuffle=False, num_workers=2, batch_size=6)
    on_loader, loader_counts, _ = features_by_key(data_list, small_conf(**conf))
    on_model, model_counts, batches = features_by_key(data_list, small_conf(feats_on="model", **conf))
    # the default filter (min_length 10 frames) drops the shortest cuts in both modes
    assert model_counts == loader_counts and loader_counts["filter.too_short"] > 0
    assert sorted(on_model) == sorted(on_loader) and len(on_model) >= 24
    for key, feats in on_loader.items():
        assert on_model[key].shape == feats.shape, key
        assert (on_model[key] - feats).abs().max() < 1e-3, key
    assert all("wav" in b and "feats" not in b and b["sample_rate"] == 16000 for b in batches)
    for b in batches:  # the loader's frame counts are the front end's
        assert [on_model[k].shape[0] for k in b["keys"]] == b["feats_lengths"].tolist()


def test_sub_window_cuts_are_counted_as_empty_in_both_modes(cut_shards):
    """Kaldi's framing (snip_edges=true): a cut shorter than one window has no frame (the default, snip_edges=false,
    frames every 10 ms centred)."""
    data_list, _ = cut_shards
    conf = dict(shuffle=False, num_workers=0)
    for mode in ("loader", "model"):
        c = small_conf(feats_on=mode, **conf)
        c.filter_conf.min_length, c.fbank_conf.snip_edges = 0, True
        feats, counts, _ = features_by_key(data_list, c)
        assert counts["features.shorter_than_window"] == 3, counts  # 399 at 16 kHz, 199 at 8 kHz, 1099 at 44.1 kHz
        assert min(f.shape[0] for f in feats.values()) == 1


def test_budgets_and_length_filters_count_the_front_end_frames(cut_shards):
    data_list, _ = cut_shards
    conf = small_conf(feats_on="model", shuffle=False, num_workers=0, batch_type="length", batch_size=700)
    conf.filter_conf.min_length = 150
    conf.filter_conf.max_length = 250
    conf.fbank_conf.snip_edges = True  # Kaldi's framing: the sub-window cuts have no frame (counted below)
    feats, counts, batches = features_by_key(data_list, conf)
    unfiltered = small_conf(feats_on="model", shuffle=False, num_workers=0)
    unfiltered.filter_conf.min_length, unfiltered.fbank_conf.snip_edges = 0, True
    everything, no_frames, _ = features_by_key(data_list, unfiltered)
    frames = Counter("short" if f.shape[0] < 150 else "long" if f.shape[0] > 250 else "kept"
                     for f in everything.values())
    frames["short"] += no_frames["features.shorter_than_window"]
    assert counts["filter.too_short"] == frames["short"] and counts["filter.too_long"] == frames["long"] > 0
    assert len(feats) == frames["kept"] > 0 and all(150 <= f.shape[0] <= 250 for f in feats.values())
    for b in batches:
        assert int(b["feats_lengths"].max()) * len(b["keys"]) <= 700 or len(b["keys"]) == 1


def test_compute_cmvn_gives_the_same_statistics_in_both_modes(cut_shards, tmp_path):
    data_list, _ = cut_shards
    stats = {}
    for mode in ("loader", "model"):
        cfg = ComputeCmvnConfig(data_list=data_list, output=str(tmp_path / f"{mode}.json"),
                                dataset_conf=small_conf(feats_on=mode, num_workers=1))
        compute_cmvn(cfg)
        stats[mode] = json.loads((tmp_path / f"{mode}.json").read_text())
    assert stats["model"]["frame_num"] == stats["loader"]["frame_num"] > 0
    for key in ("mean", "istd"):
        assert torch.allclose(torch.tensor(stats["model"][key]), torch.tensor(stats["loader"][key]), rtol=1e-5,
                              atol=1e-5), key


def test_device_augmentation_is_per_utterance_and_reproducible_from_the_seed(cut_shards):
    data_list, _ = cut_shards
    conf = small_conf(feats_on="model", num_workers=0, spec_aug=True, spec_sub=True, spec_trim=True)
    conf.fbank_conf.dither = 1.0
    first, _, batches = features_by_key(data_list, conf, train=True, epoch=1)
    again, _, _ = features_by_key(data_list, conf, train=True, epoch=1)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    # the same utterance in another batch (alone) is augmented the same way: the draws depend on (seed, epoch, key)
    front_end = FrontEnd(conf, CPU)
    front_end.set_epoch(1)
    batch = batches[1]
    alone = {k: (v[:1] if isinstance(v, torch.Tensor) and v.dim() else v) for k, v in batch.items()}
    alone["keys"] = batch["keys"][:1]
    alone["wav"] = batch["wav"][:1, :int(batch["wav_lengths"][0])]
    feats, lengths = front_end(alone, train=True)
    assert torch.equal(feats[0, :int(lengths[0])], first[batch["keys"][0]])
    front_end.set_epoch(2)
    feats, lengths = front_end(alone, train=True)
    assert not torch.equal(feats[0, :int(lengths[0])], first[batch["keys"][0]])  # a new epoch, new draws
    clean, _, _ = features_by_key(data_list, conf, train=False)
    assert sum(not torch.equal(first[k][:clean[k].shape[0]], clean[k][:first[k].shape[0]]) for k in first) > 20


def test_model_mode_needs_fbank_or_mfcc(cut_shards):
    with pytest.raises(ConfigError, match="feats_on=model.*feats_type=raw"):
        build_dataloader(cut_shards[0], small_conf(feats_on="model", feats_type="raw"), None, train=False)


@pytest.fixture(scope="module")
def noise_and_rir(tmp_path_factory):
    """White noise (16-bit, 0.5 s: it loops) and a decaying impulse response with a 5 ms delay, as lists."""
    import numpy as np

    root = tmp_path_factory.mktemp("waveaug")
    rng = np.random.default_rng(1)
    sf.write(root / "noise.wav", (rng.standard_normal(8000) * 0.05).astype("float32"), 16000, subtype="PCM_16")
    rir = np.zeros(2000, dtype="float32")
    rir[80] = 1.0
    rir[81:] = rng.standard_normal(1919) * np.exp(-np.arange(1919) / 300) * 0.3
    sf.write(root / "rir.wav", rir, 16000, subtype="FLOAT")
    (root / "noise.scp").write_text(f"n {root / 'noise.wav'}\n")
    (root / "rir.scp").write_text(f"r {root / 'rir.wav'}\n")
    return str(root / "noise.scp"), str(root / "rir.scp")


def test_reverb_noise_and_volume_on_the_device_equal_the_loader_path_on_the_same_draws(cut_shards, noise_and_rir):
    data_list, _ = cut_shards
    confs = []
    for feats_on in ("loader", "model"):
        conf = small_conf(feats_on=feats_on, shuffle=False, num_workers=0, batch_size=6, add_noise=True,
                          add_reverb=True, volume_perturb=True)
        conf.add_noise_conf.noise_list, conf.add_reverb_conf.rir_list = noise_and_rir
        conf.add_noise_conf.snr_db = [0.0, 10.0]
        confs.append(conf)
    clean, _, _ = features_by_key(data_list, small_conf(shuffle=False, num_workers=0, batch_size=6), train=True)
    on_loader, _, _ = features_by_key(data_list, confs[0], train=True, epoch=3)
    on_model, _, batches = features_by_key(data_list, confs[1], train=True, epoch=3)
    assert all(b.get("augment") for b in batches)  # the loader drew, the front end applied
    assert sorted(on_model) == sorted(on_loader) == sorted(clean)
    for key, feats in on_loader.items():
        assert on_model[key].shape == feats.shape, key
        assert (on_model[key] - feats).abs().max() < 2e-3, key
        assert (feats - clean[key]).abs().max() > 0.5, key  # augmented: not the clean features
