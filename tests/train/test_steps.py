"""The step functions (corpus_io.train.steps) on a deterministic model (no dropout, GroupNorm, equal lengths)."""

from __future__ import annotations

import soundfile as sf
import torch
import torchaudio

from corpus_io.model.model import ConformerCTC
from corpus_io.train.steps import StepContext, ctc_loss, forward_loss, greedy_ids, micro_step, optim_step
from tests.loader_data import fixture_utts


def real_batch(n: int = 4, frames: int = 120) -> dict:
    """``n`` fixture utterances as 80-dim fbank cropped to ``frames``, digits-free char targets."""
    feats, targets = [], []
    for index, (_key, path, _) in enumerate([u for u in fixture_utts() if u[1].endswith(".wav")][:n]):
        wav, rate = sf.read(path, dtype="float32")
        wav = torch.from_numpy(wav).unsqueeze(0) * 32768
        if rate != 16000:
            wav = torchaudio.functional.resample(wav, rate, 16000)
        fb = torchaudio.compliance.kaldi.fbank(wav, num_mel_bins=80, dither=0.0)
        feats.append(fb[:frames])
        targets.append([(7 * index + i) % 9 + 1 for i in range(5)])  # fixed: hash() is salted per process
    return {"keys": [f"u{i}" for i in range(n)], "feats": torch.stack(feats),
            "feats_lengths": torch.full((n,), frames, dtype=torch.long),
            "target": torch.tensor(targets), "target_lengths": torch.full((n,), 5, dtype=torch.long),
            "audio_seconds": n * frames / 100, "padding_ratio": 0.0}


def split(batch: dict, lo: int, hi: int) -> dict:
    return {k: (v[lo:hi] if isinstance(v, (torch.Tensor, list)) else v) for k, v in batch.items()}


def tiny_model() -> ConformerCTC:
    torch.manual_seed(0)
    return ConformerCTC(80, 10, output_size=32, attention_heads=2, linear_units=64, num_blocks=2,
                        subsampling_channels=8, dropout_rate=0.0, use_group_norm=True)


def test_accum_grad_2_gives_the_gradients_of_a_batch_twice_the_size():
    batch = real_batch(4)
    big, small = tiny_model(), tiny_model()
    small.load_state_dict(big.state_dict())
    micro_step(StepContext(big, accum_grad=1), batch, sync=True)
    sc = StepContext(small, accum_grad=2)
    micro_step(sc, split(batch, 0, 2), sync=False)
    micro_step(sc, split(batch, 2, 4), sync=True)
    for (name, a), b in zip(big.named_parameters(), small.parameters()):
        # float32 sums in another order: a wrong accumulation is off by 2x, not by 1e-5
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-5), name
    # and the optimizer step that follows lands on the same weights
    opt_a, opt_b = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (big, small))
    optim_step(StepContext(big), opt_a, None, 5.0)
    optim_step(sc, opt_b, None, 5.0)
    for a, b in zip(big.parameters(), small.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
        assert b.grad is None


def test_bf16_autocast_runs_on_cpu_and_loss_is_finite():
    sc = StepContext(tiny_model(), amp_dtype=torch.bfloat16)
    out = micro_step(sc, real_batch(2), sync=True, want_acc=True)
    assert torch.isfinite(torch.tensor(out["loss"])) and out["tokens"] == 10


def test_greedy_path_merges_repeats_and_drops_blanks():
    lp = torch.log(torch.tensor([[[0.1, 0.9, 0.0], [0.1, 0.9, 0.0], [0.9, 0.1, 0.0], [0.1, 0.9, 0.0],
                                  [0.0, 0.1, 0.9]]]) + 1e-9)
    assert greedy_ids(lp, torch.tensor([5])) == [[1, 1, 2]]
    assert greedy_ids(lp, torch.tensor([2])) == [[1]]


def test_ctc_loss_is_the_mean_over_utterances():
    model = tiny_model().eval()
    batch = real_batch(2)
    lp, lens = model(batch["feats"], batch["feats_lengths"])
    both = ctc_loss(lp, lens, batch["target"], batch["target_lengths"])
    each = [ctc_loss(lp[i:i + 1], lens[i:i + 1], batch["target"][i:i + 1], batch["target_lengths"][i:i + 1])
            for i in range(2)]
    assert torch.allclose(both, (each[0] + each[1]) / 2)


def test_validation_and_training_share_one_forward_and_loss():
    batch = real_batch(2)
    sc = StepContext(tiny_model())
    trained = micro_step(sc, batch, sync=True, want_acc=True)
    with torch.no_grad():
        validated = forward_loss(sc, batch, train=False)
    assert float(validated.loss) == trained["loss"]
    assert validated.token_errors() == (trained["errors"], trained["tokens"])
