"""Augmentation on a padded batch (corpus_io.audio.augment) equals the loader's per-utterance stages, draw for draw,
and never touches padding."""

from __future__ import annotations

import random

import torch

from corpus_io.audio import augment, features
from corpus_io.loader import stages
from corpus_io.loader.batching import pad
from tests.audio.test_features import loader_waveforms

CONFS = {"spec_aug": {"num_t_mask": 2, "num_f_mask": 2, "max_t": 30, "max_f": 8},
         "spec_sub": {"max_t": 20, "num_t_sub": 3}, "spec_trim": {"max_t": 40}}


def test_batched_augmentation_equals_the_loader_stages_and_leaves_padding_zero(tmp_path):
    kept = list(stages.drop_empty(stages.waveform_frames(loader_waveforms(tmp_path))))
    batch = pad(kept)
    feats, frames = features.batch_fbank(batch["wav"], batch["wav_lengths"], 16000, num_mel_bins=40)
    plans = [augment.plan(random.Random(f"7:{s['key']}"), int(n), 40, **CONFS) for s, n in zip(kept, frames)]
    assert any(p.trimmed is not None for p in plans) and any(p.trimmed is None for p in plans)
    out, lengths = augment.apply(feats, frames, plans)
    for i, sample in enumerate(kept):
        rng = random.Random(f"7:{sample['key']}")
        one = [{"feats": feats[i, :int(frames[i])].clone()}]
        one = stages.spec_aug(one, rng=rng, **CONFS["spec_aug"])
        one = stages.spec_sub(one, rng=rng, **CONFS["spec_sub"])
        (expected,) = stages.spec_trim(one, rng=rng, **CONFS["spec_trim"])
        n = int(lengths[i])
        assert expected["feats"].shape[0] == n
        assert torch.equal(out[i, :n], expected["feats"]), sample["key"]
        assert not out[i, n:].any(), "padding must stay 0"


def test_short_utterances_keep_their_frames_and_masks_stay_inside_them():
    feats = torch.ones(3, 50, 10)
    frames = torch.tensor([50, 3, 1])
    feats[1, 3:] = 0
    feats[2, 1:] = 0
    for seed in range(50):
        plans = [augment.plan(random.Random(seed * 10 + i), int(n), 10, **CONFS) for i, n in enumerate(frames)]
        out, lengths = augment.apply(feats, frames, plans)
        assert ((lengths <= frames) & (lengths > frames / 2)).all()  # spec_trim never cuts half or more
        assert not out[1, 3:].any() and not out[2, 1:].any()


def test_spec_trim_narrows_the_padded_batch_to_its_longest_kept_row_as_the_loader_pads():
    feats = torch.ones(2, 40, 5)
    plans = [augment.Plan(40, trimmed=30), augment.Plan(25, trimmed=20)]
    out, lengths = augment.apply(feats, torch.tensor([40, 25]), plans)
    assert lengths.tolist() == [30, 20] and out.shape == (2, 30, 5)
    assert out[1, 20:].abs().sum() == 0 and out[0].sum() == 30 * 5
