"""Conformer layers run with explicit masks and caches: full context, chunk-masked and chunk by chunk.

The one home of the encoder layer's arithmetic. :class:`corpus_io.model.model.ConformerCTC` holds torchaudio's
``ConformerLayer`` modules (their weights, their state-dict names) and runs them through these functions, as
does the exported graph (:mod:`corpus_io.infer.export`), so training, decoding and export compute the same thing.

Streaming follows WeNet's U2 (names and meaning): frames are grouped into chunks of ``chunk_size`` encoder frames
(40 ms each for ConformerCTC); a frame attends to its own chunk and ``num_left_chunks`` chunks before it (-1:
all of them), never to a later chunk. With a causal depthwise convolution (``causal=True``: the kernel sees
only the past), the chunk-masked full forward equals a forward that feeds one chunk at a time and keeps, per
layer, the attention keys/values and the convolution's last ``kernel - 1`` inputs (the caches) between chunks.

Shapes: ``x`` (B, T, D) batch first; ``key_pad`` (B, T) bool, True on padding; ``attn_mask`` (B or 1, T, S)
bool, True where a query may attend; attention cache (heads, S, 2 * D / heads): keys and values concatenated on
the last axis (WeNet's and sherpa-onnx's layout); convolution cache (1, D, kernel - 1).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: WeNet's bound on a randomly drawn chunk in dynamic chunk training (chunks of 1..25 encoder frames)
MAX_DYNAMIC_CHUNK = 25


def chunk_attention_mask(size: int, chunk_size: int, num_left_chunks: int = -1,
                         device: Any = None) -> torch.Tensor:
    """(size, size) bool: frame i may attend frame j when j's chunk is i's or one of the ``num_left_chunks``
    before it (-1: every earlier chunk). ``chunk_size`` in encoder frames, > 0."""
    chunk = torch.arange(size, device=device) // chunk_size
    mask = chunk[None, :] <= chunk[:, None]
    if num_left_chunks >= 0:
        mask &= chunk[None, :] >= chunk[:, None] - num_left_chunks
    return mask


def choose_chunk(num_frames: int, *, use_dynamic_chunk: bool, use_dynamic_left_chunk: bool,
                 static_chunk_size: int, training: bool, decoding_chunk_size: int = 0,
                 num_decoding_left_chunks: int = -1) -> tuple[int, int]:
    """``(chunk_size, num_left_chunks)`` for one batch of ``num_frames`` encoder frames, as WeNet's
    ``add_optional_chunk_mask``; chunk_size 0 is full context.

    Training with ``use_dynamic_chunk``: a chunk drawn from torch's generator per batch, full context when the
    draw exceeds half the batch (about half the batches), else 1..25 frames; with ``use_dynamic_left_chunk`` a
    random number of left chunks too. ``static_chunk_size`` > 0: always that chunk. Outside training:
    ``decoding_chunk_size`` (0 or < 0: full context) with ``num_decoding_left_chunks``."""
    if not training:
        if decoding_chunk_size > 0:
            return decoding_chunk_size, num_decoding_left_chunks
        return 0, -1
    if use_dynamic_chunk:
        draw = int(torch.randint(1, max(2, num_frames), (1,)))
        if draw > num_frames // 2:
            return 0, -1
        chunk = draw % MAX_DYNAMIC_CHUNK + 1
        left = -1
        if use_dynamic_left_chunk:
            left = int(torch.randint(0, max(1, (num_frames - 1) // chunk) + 1, (1,)))
        return chunk, left
    if static_chunk_size > 0:
        return static_chunk_size, num_decoding_left_chunks
    return 0, -1


def causal_convolutions(layers: nn.ModuleList) -> None:
    """Make each layer's depthwise convolution causal: no padding of its own (the past is padded, or cached,
    by :func:`convolution`)."""
    for layer in layers:
        layer.conv_module.sequential[2].padding = (0,)


def layer_forward(layer: nn.Module, x: torch.Tensor, key_pad: torch.Tensor, attn_mask: torch.Tensor | None = None,
                  *, causal: bool = False) -> torch.Tensor:
    """torchaudio's ``ConformerLayer.forward`` on (B, T, D) with padding zeroed before the depthwise convolution
    (a padded batch gives what the unpadded one gives) and an optional chunk mask."""
    mask = ~key_pad[:, None, :]  # (B, 1, T)
    if attn_mask is not None:
        # a padded frame past its row's last chunk would see nothing (NaN): it sees itself
        mask = (mask & attn_mask) | torch.eye(x.shape[1], dtype=torch.bool, device=x.device)
    return _layer(layer, x, key_pad, mask, None, None, causal)[0]


def layer_forward_chunk(layer: nn.Module, x: torch.Tensor, att_cache: torch.Tensor, cnn_cache: torch.Tensor,
                        att_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk (1, t, D) through a causal layer after the frames its caches hold: ``att_cache`` (H, S, 2 D/H)
    and ``cnn_cache`` (1, D, kernel - 1) (S may be 0; zeros start a stream). ``att_mask`` (1, 1, S + t) masks
    cached frames a fixed-size cache has not filled yet. Returns the output and both caches grown by the chunk:
    (H, S + t, 2 D/H) and (1, D, kernel - 1)."""
    pad = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
    return _layer(layer, x, pad, att_mask, att_cache, cnn_cache, True)


def _layer(layer: nn.Module, x: torch.Tensor, key_pad: torch.Tensor, mask: torch.Tensor | None,
           att_cache: torch.Tensor | None, cnn_cache: torch.Tensor | None,
           causal: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    x = layer.ffn1(x) * 0.5 + x
    new_cnn = None
    if layer.convolution_first:
        y, new_cnn = convolution(layer.conv_module, x, key_pad, cnn_cache, causal)
        x = x + y
    y, new_att = self_attention(layer.self_attn, layer.self_attn_layer_norm(x), mask, att_cache)
    x = layer.self_attn_dropout(y) + x
    if not layer.convolution_first:
        y, new_cnn = convolution(layer.conv_module, x, key_pad, cnn_cache, causal)
        x = x + y
    x = layer.ffn2(x) * 0.5 + x
    return layer.final_layer_norm(x), new_att, new_cnn


def self_attention(mha: nn.MultiheadAttention, x: torch.Tensor, mask: torch.Tensor | None,
                   cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.MultiheadAttention(x, x, x)`` batch first, as ``F.multi_head_attention_forward`` computes it (one
    projection, scaled dot-product attention, dropout on the weights in training), keys/values after ``cache``'s;
    ``mask`` (B or 1, T or 1, S + T) bool. Every reshape takes its sizes from the tensors (tracing keeps them
    dynamic). Returns the output and the keys/values (H, S + T, 2 d) of row 0, the next chunk's cache."""
    heads, dim = mha.num_heads, mha.embed_dim
    q, k, v = nn.functional.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (t.unflatten(-1, (heads, dim // heads)).transpose(1, 2) for t in (q, k, v))  # (B, H, T, d)
    if cache is not None:
        past_k, past_v = cache.chunk(2, dim=-1)
        k = torch.cat([past_k[None].expand(k.shape[0], -1, -1, -1), k], dim=2)
        v = torch.cat([past_v[None].expand(v.shape[0], -1, -1, -1), v], dim=2)
    bias = None
    if mask is not None:
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))[:, None]
    y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                                   dropout_p=mha.dropout if mha.training else 0.0)
    y = nn.functional.linear(y.transpose(1, 2).flatten(2), mha.out_proj.weight, mha.out_proj.bias)
    return y, torch.cat([k[0], v[0]], dim=-1)


def convolution(module: nn.Module, x: torch.Tensor, key_pad: torch.Tensor, cache: torch.Tensor | None,
                causal: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torchaudio's ``_ConvolutionModule`` on (B, T, D), padding zeroed before the depthwise convolution. Causal:
    the past is ``cache`` (1, D, kernel - 1), or zeros; returns the output and the next cache (the last
    kernel - 1 inputs of the depthwise convolution; None when not causal)."""
    seq = module.sequential
    y = seq[1](seq[0](module.layer_norm(x).transpose(1, 2)))  # (B, D, T) after the GLU
    y = y.masked_fill(key_pad[:, None, :], 0.0)
    new_cache = None
    if causal:
        context = seq[2].kernel_size[0] - 1
        past = cache.expand(y.shape[0], -1, -1) if cache is not None else \
            y.new_zeros(y.shape[0], y.shape[1], context)
        y = torch.cat([past, y], dim=2)
        new_cache = y[:1, :, y.shape[2] - context:]
    for i in range(2, len(seq)):
        y = seq[i](y)
    return y.transpose(1, 2), new_cache
