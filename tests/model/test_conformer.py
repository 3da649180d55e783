"""Conformer layers with masks and caches (corpus_io/model/conformer.py) through ConformerCTC: full context equals
torchaudio's own Conformer; chunk by chunk with caches equals the chunk-masked full forward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from corpus_io.model.conformer import MAX_DYNAMIC_CHUNK, choose_chunk, chunk_attention_mask  # noqa: E402
from corpus_io.model.model import ConformerCTC  # noqa: E402


def streaming_model(pos: str = "no_pos", **kw) -> ConformerCTC:
    torch.manual_seed(0)
    model = ConformerCTC(40, 30, output_size=64, attention_heads=2, linear_units=128, num_blocks=2,
                         subsampling_channels=16, causal=True, use_dynamic_chunk=True, pos_enc_layer_type=pos, **kw)
    for layer in model.encoder.conformer_layers:  # BatchNorm statistics as a trained model has them
        norm = layer.conv_module.sequential[3]
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize("pos", ["no_pos", "abs_pos"])
@pytest.mark.parametrize("chunk,left", [(16, -1), (16, 4), (8, 2), (1, 3)])
def test_chunk_by_chunk_with_caches_equals_the_chunk_masked_full_forward(pos, chunk, left):
    model = streaming_model(pos)
    for frames in (300, 67, 70, 7):  # several chunks with a partial last one; exactly one chunk; the least
        feats = torch.randn(1, frames, 40) * 3
        with torch.no_grad():
            full = model.ctc_log_probs(*model.encode(feats, torch.tensor([frames]), chunk, left))[0]
            streamed = model.ctc_log_probs(*model.encode_streaming(feats, chunk, left))[0]
        assert streamed.shape == full.shape
        assert float((streamed - full).abs().max()) < 1e-4


def test_a_chunk_sees_no_later_chunk_and_full_context_does():
    model = streaming_model()
    feats = torch.randn(1, 300, 40)
    later = feats.clone()
    later[:, 200:] += 5.0  # changes only what comes after encoder frame ~49
    n = torch.tensor([300])
    with torch.no_grad():
        a = model.encode(feats, n, 16)[0]
        b = model.encode(later, n, 16)[0]
        full_a, full_b = model.encode(feats, n)[0], model.encode(later, n)[0]
    assert torch.equal(a[:, :48], b[:, :48])  # chunks 0-2 (frames 0-47) end before input frame 192
    assert not torch.allclose(full_a[:, :16], full_b[:, :16])


def test_padding_never_changes_a_real_frame_under_a_chunk_mask():
    model = streaming_model()
    short, long = torch.randn(1, 150, 40), torch.randn(1, 400, 40)
    batch = torch.zeros(2, 400, 40)
    batch[0, :150], batch[1] = short[0], long[0]
    with torch.no_grad():
        out, lengths = model.encode(batch, torch.tensor([150, 400]), 8, 2)
        alone = model.encode(short, torch.tensor([150]), 8, 2)[0]
    assert int(lengths[0]) == alone.shape[1]
    assert float((out[0, :alone.shape[1]] - alone[0]).abs().max()) < 1e-5
    assert torch.isfinite(out).all()


def test_full_context_equals_torchaudios_conformer_so_existing_checkpoints_decode_as_before():
    torch.manual_seed(1)
    model = ConformerCTC(40, 30, output_size=64, attention_heads=2, linear_units=128, num_blocks=2).eval()
    feats, n = torch.randn(2, 300, 40), torch.tensor([300, 300])
    with torch.no_grad():
        ours = model.encode(feats, n)[0]
        x, lengths = model.embed(model.cmvn(feats), n)
        reference = model.encoder(x, lengths)[0]
    assert float((ours - reference).abs().max()) < 1e-5
    assert "encoder.conformer_layers.0.self_attn.in_proj_weight" in model.state_dict()


def test_a_model_whose_convolution_sees_the_future_refuses_chunk_by_chunk_decoding():
    from corpus_io.errors import ConfigError

    model = ConformerCTC(40, 30, output_size=64, attention_heads=2, linear_units=128, num_blocks=1).eval()
    with pytest.raises(ConfigError, match=r"\+\+model.causal=true"):
        model.encode_streaming(torch.randn(1, 100, 40), 16)


def test_dynamic_chunks_are_full_context_about_half_the_time_else_1_to_25_frames():
    torch.manual_seed(3)
    draws = [choose_chunk(200, use_dynamic_chunk=True, use_dynamic_left_chunk=False, static_chunk_size=0,
                          training=True) for _ in range(2000)]
    full = sum(1 for chunk, _ in draws if chunk == 0)
    assert 0.4 < full / len(draws) < 0.6
    assert {chunk for chunk, _ in draws if chunk} == set(range(1, MAX_DYNAMIC_CHUNK + 1))
    assert all(left == -1 for _, left in draws)
    lefts = {left for chunk, left in (choose_chunk(200, use_dynamic_chunk=True, use_dynamic_left_chunk=True,
                                                   static_chunk_size=0, training=True) for _ in range(500)) if chunk}
    assert 0 in lefts and max(lefts) > 5
    # a static chunk always; outside training the decoding chunk (0: full context)
    assert choose_chunk(200, use_dynamic_chunk=False, use_dynamic_left_chunk=False, static_chunk_size=8,
                        training=True) == (8, -1)
    assert choose_chunk(200, use_dynamic_chunk=True, use_dynamic_left_chunk=True, static_chunk_size=0,
                        training=False, decoding_chunk_size=16, num_decoding_left_chunks=4) == (16, 4)
    assert choose_chunk(200, use_dynamic_chunk=True, use_dynamic_left_chunk=True, static_chunk_size=0,
                        training=False) == (0, -1)


def test_chunk_attention_mask_sees_its_chunk_and_the_left_chunks_only():
    mask = chunk_attention_mask(6, 2, 1)
    assert mask.tolist() == [[True, True, False, False, False, False],
                             [True, True, False, False, False, False],
                             [True, True, True, True, False, False],
                             [True, True, True, True, False, False],
                             [False, False, True, True, True, True],
                             [False, False, True, True, True, True]]
    assert chunk_attention_mask(6, 2, -1)[5].all()
