"""The model interface and a compact Conformer-CTC.

Any model built by ``corpus-io train`` is instantiated with Hydra from the ``model`` config group::

    model = hydra.utils.instantiate(model_conf, input_dim=D, vocab_size=V, cmvn_file=PATH_OR_None)

and must implement::

    forward(feats: (B, T, D) float32, feats_lengths: (B,) long) -> (log_probs: (B, T', V), out_lengths: (B,))

``log_probs`` are CTC log-softmax outputs over the vocabulary (blank id 0). Put your own class on
the Python path and select it with ``++model._target_=my_pkg.MyModel``; extra keys of ``model`` are
passed to its constructor. ``cmvn_file`` may be ignored by models that normalise themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from corpus_io.model.conformer import (
    causal_convolutions,
    choose_chunk,
    chunk_attention_mask,
    layer_forward,
    layer_forward_chunk,
)


class GlobalCMVN(nn.Module):
    """``(x - mean) * istd`` with stats from ``compute-cmvn`` (stored as buffers, so they travel in checkpoints)."""

    def __init__(self, dim: int, cmvn_file: str | None = None) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("istd", torch.ones(dim))
        if cmvn_file:
            from corpus_io.model.cmvn import load_cmvn

            mean, istd = load_cmvn(cmvn_file, dim)
            self.mean.copy_(torch.tensor(mean))
            self.istd.copy_(torch.tensor(istd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) * self.istd


class Conv2dSubsampling4(nn.Module):
    """Two 3x3 stride-2 convolutions: T frames -> ((T - 1) // 2 - 1) // 2 frames (x4 subsampling)."""

    def __init__(self, input_dim: int, output_dim: int, channels: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, channels, 3, 2), nn.ReLU(),
                                  nn.Conv2d(channels, channels, 3, 2), nn.ReLU())
        freq = ((input_dim - 1) // 2 - 1) // 2
        self.out = nn.Linear(channels * freq, output_dim)

    @staticmethod
    def output_lengths(lengths: torch.Tensor) -> torch.Tensor:
        return ((lengths - 1) // 2 - 1) // 2

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(x.unsqueeze(1))  # (B, C, T', F')
        b, c, t, f = x.shape
        x = self.out(x.transpose(1, 2).reshape(b, t, c * f))
        return x, self.output_lengths(lengths).clamp(min=0, max=t)


class ConformerCTC(nn.Module):
    """CMVN -> conv2d subsampling (x4) -> Conformer layers (torchaudio's) -> linear CTC head (log-softmax).

    Sizes: ``output_size`` (attention dim), ``attention_heads``, ``linear_units`` (feed-forward),
    ``num_blocks``, ``cnn_module_kernel`` (odd), ``subsampling_channels``, ``dropout_rate``,
    ``use_group_norm`` (GroupNorm instead of BatchNorm in the convolution module), ``pos_enc_layer_type``
    (WeNet's name): ``no_pos`` (torchaudio's Conformer has no positional encoding; its convolutions give
    local order, enough for CTC) or ``abs_pos`` (``x * sqrt(d) + sinusoids`` after subsampling, as WeNet's
    ``abs_pos``: an attention decoder needs it to tell two identical words apart, "eight eight").
    ``input_dim`` and ``vocab_size`` are filled in by the trainer from the features and tokenizer.

    Streaming (WeNet's U2 names; :mod:`corpus_io.model.conformer`): ``causal`` makes the depthwise convolution
    see only the past; ``use_dynamic_chunk`` trains each batch with a random chunk mask (full context about
    half the time), ``use_dynamic_left_chunk`` with a random number of left chunks too; ``static_chunk_size``
    > 0 always trains with that chunk (encoder frames, 40 ms each). A causal model decodes full context
    (:meth:`encode`) and chunk by chunk with caches (:meth:`encode_streaming`), one checkpoint both ways.
    """

    POS_ENC_LAYER_TYPES = ("no_pos", "abs_pos")
    #: input frames per encoder frame, and input frames an encoder frame sees past its first (3x3 stride 2, twice)
    SUBSAMPLING, RIGHT_CONTEXT = 4, 6

    def __init__(self, input_dim: int, vocab_size: int, cmvn_file: str | None = None, *,
                 output_size: int = 144, attention_heads: int = 4, linear_units: int = 576, num_blocks: int = 4,
                 cnn_module_kernel: int = 15, subsampling_channels: int = 64, dropout_rate: float = 0.1,
                 use_group_norm: bool = False, pos_enc_layer_type: str = "no_pos", causal: bool = False,
                 use_dynamic_chunk: bool = False, use_dynamic_left_chunk: bool = False,
                 static_chunk_size: int = 0) -> None:
        super().__init__()
        if pos_enc_layer_type not in self.POS_ENC_LAYER_TYPES:
            raise ValueError(f"pos_enc_layer_type={pos_enc_layer_type!r} must be one of {self.POS_ENC_LAYER_TYPES}")
        if static_chunk_size < 0:
            raise ValueError(f"static_chunk_size={static_chunk_size} must be >= 0 (0: no static chunk)")
        if (use_dynamic_chunk or static_chunk_size) and use_group_norm:
            raise ValueError("use_group_norm normalises over the whole utterance, which a chunk cannot see; "
                             "train a streaming model with use_group_norm=false (BatchNorm)")
        self.pos_enc_layer_type = pos_enc_layer_type
        if input_dim < 7:
            raise ValueError(f"input_dim={input_dim} is too small for conv2d subsampling (need >= 7)")
        self.input_dim = input_dim
        self.vocab_size = vocab_size
        self.causal = bool(causal)
        self.use_dynamic_chunk = bool(use_dynamic_chunk)
        self.use_dynamic_left_chunk = bool(use_dynamic_left_chunk)
        self.static_chunk_size = int(static_chunk_size)
        self.cmvn = GlobalCMVN(input_dim, cmvn_file)
        self.embed = Conv2dSubsampling4(input_dim, output_size, subsampling_channels)
        self.dropout = nn.Dropout(dropout_rate)
        from torchaudio.models import Conformer

        self.encoder = Conformer(input_dim=output_size, num_heads=attention_heads, ffn_dim=linear_units,
                                 num_layers=num_blocks, depthwise_conv_kernel_size=cnn_module_kernel,
                                 dropout=dropout_rate, use_group_norm=use_group_norm)
        if self.causal:
            causal_convolutions(self.encoder.conformer_layers)
        self.ctc = nn.Linear(output_size, vocab_size)

    def forward(self, feats: torch.Tensor, feats_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ctc_log_probs(*self.encode(feats, feats_lengths))

    def encode(self, feats: torch.Tensor, feats_lengths: torch.Tensor, decoding_chunk_size: int = 0,
               num_decoding_left_chunks: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder output (B, T', D) and its lengths (frames after subsampling). Frames past a row's length
        (padding) never change a real frame's output. In training, the chunk mask the streaming options draw;
        outside it, ``decoding_chunk_size`` > 0 masks attention to chunks of that many frames and
        ``num_decoding_left_chunks`` before each (-1: all), which :meth:`encode_streaming` computes chunk by
        chunk."""
        x, lengths = self._embed(feats, feats_lengths, 0)
        # every length >= 1: a row fully masked gives NaN attention
        key_pad = torch.arange(x.shape[1], device=x.device)[None, :] >= lengths.clamp(min=1)[:, None]
        chunk, left = choose_chunk(x.shape[1], use_dynamic_chunk=self.use_dynamic_chunk,
                                   use_dynamic_left_chunk=self.use_dynamic_left_chunk,
                                   static_chunk_size=self.static_chunk_size, training=self.training,
                                   decoding_chunk_size=decoding_chunk_size,
                                   num_decoding_left_chunks=num_decoding_left_chunks)
        mask = chunk_attention_mask(x.shape[1], chunk, left, x.device) if chunk > 0 else None
        for layer in self.encoder.conformer_layers:
            x = layer_forward(layer, x, key_pad, mask, causal=self.causal)
        return x, lengths

    def _embed(self, feats: torch.Tensor, feats_lengths: torch.Tensor,
               offset: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """CMVN, padding zeroed, subsampling, positions from ``offset`` (encoder frames before the first), dropout.
        Plain tensor ops with sizes taken from the tensors (the export traces this)."""
        x = self.cmvn(feats)
        frames = torch.arange(x.shape[1], device=x.device)[None, :]
        x = x.masked_fill((frames >= feats_lengths.to(x.device)[:, None])[..., None], 0.0)  # padding stays 0
        x = self.embed.conv(x.unsqueeze(1))  # (B, C, T', F')
        b, c, t, f = x.shape
        x = self.embed.out(x.transpose(1, 2).reshape(b, t, c * f))
        lengths = self.embed.output_lengths(feats_lengths)
        lengths = torch.minimum(lengths.clamp(min=0), torch.full_like(lengths, 1) * t)
        if self.pos_enc_layer_type == "abs_pos":
            x = x * math.sqrt(x.shape[-1]) + _sinusoids(x.shape[1], x.shape[-1], x.device, offset).to(x.dtype)
        return self.dropout(x), lengths

    def ctc_log_probs(self, encoded: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.log_softmax(self.ctc(encoded).float(), dim=-1), lengths

    # ------------------------------------------------------------------ chunk by chunk

    @classmethod
    def chunk_window(cls, chunk_size: int) -> tuple[int, int]:
        """``(frames, shift)``: input frames one chunk of ``chunk_size`` encoder frames reads, and the input frames
        between chunks (16 -> 67 and 64)."""
        return (chunk_size - 1) * cls.SUBSAMPLING + cls.RIGHT_CONTEXT + 1, chunk_size * cls.SUBSAMPLING

    def initial_caches(self, device: Any = None, cache_frames: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero caches that start a stream: attention (layers, heads, cache_frames, 2 * D / heads) and
        convolution (layers, 1, D, kernel - 1)."""
        layer = self.encoder.conformer_layers[0]
        heads, dim = layer.self_attn.num_heads, layer.self_attn.embed_dim
        kernel = layer.conv_module.sequential[2].kernel_size[0]
        n = len(self.encoder.conformer_layers)
        return (torch.zeros(n, heads, cache_frames, 2 * dim // heads, device=device),
                torch.zeros(n, 1, dim, kernel - 1, device=device))

    def forward_chunk(self, feats: torch.Tensor, offset: Any, att_cache: torch.Tensor, cnn_cache: torch.Tensor,
                      att_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One chunk of input frames (1, frames, D) after ``offset`` encoder frames whose keys/values ``att_cache``
        (layers, H, S, 2 D/H) and convolution inputs ``cnn_cache`` (layers, 1, D, kernel - 1) hold; ``att_mask``
        (1, 1, S + t) hides cache frames not yet filled (a fixed-size cache). Returns the encoder output (1, t, D),
        the attention cache grown by the chunk (layers, H, S + t, 2 D/H) and the next convolution cache.
        Needs a causal model (the convolution must not look ahead past the chunk)."""
        x, _ = self._embed(feats, torch.full((1,), feats.shape[1], dtype=torch.long, device=feats.device), offset)
        atts, cnns = [], []
        for i, layer in enumerate(self.encoder.conformer_layers):
            x, att, cnn = layer_forward_chunk(layer, x, att_cache[i], cnn_cache[i], att_mask)
            atts.append(att)
            cnns.append(cnn)
        return x, torch.stack(atts), torch.stack(cnns)

    def encode_streaming(self, feats: torch.Tensor, chunk_size: int,
                         num_left_chunks: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """One utterance (1, T, D) chunk by chunk, keeping the caches (WeNet's ``forward_chunk_by_chunk``):
        equal to ``encode(feats, lengths, chunk_size, num_left_chunks)`` in eval mode, with memory bounded by
        the left chunks kept. Returns (1, T', D) and its length (1,)."""
        self.require_streaming(f"decoding_chunk_size={chunk_size}")
        stream = ChunkStream(self, chunk_size, num_left_chunks, feats.device)
        outs = [stream(feats[:, start:start + stream.frames])
                for start in range(0, max(0, feats.shape[1] - self.RIGHT_CONTEXT), stream.shift)]
        x = torch.cat(outs, dim=1) if outs else feats.new_zeros(1, 0, self.ctc.in_features)
        return x, torch.tensor([x.shape[1]], dtype=torch.long, device=feats.device)

    def require_streaming(self, what: str) -> None:
        """Refuse chunk-by-chunk use of a model whose convolution looks ahead (its chunks would not equal the
        chunk-masked forward)."""
        if not self.causal:
            from corpus_io.errors import ConfigError

            raise ConfigError(f"{what} runs the model chunk by chunk, which needs a model trained with corpus-io "
                              f"train ++model.causal=true (a causal convolution, and ++model.use_dynamic_chunk=true "
                              f"to learn chunks): this checkpoint's convolution sees the future. Decode it with full "
                              f"context (corpus-io decode ++decoding_chunk_size=0), or train a streaming model "
                              f"(docs/TRAINING.md \"Streaming\").")


class ChunkStream:
    """One utterance through a causal :class:`ConformerCTC` chunk by chunk (the one step :meth:`~ConformerCTC.
    encode_streaming` and ``corpus-io transcribe`` share): ``stream(feats)`` runs the next chunk's input frames
    (1, frames, D) (:attr:`frames` of them, every :attr:`shift` input frames; the last may be shorter, at least
    ``RIGHT_CONTEXT + 1``), keeping the attention and convolution caches and the offset, the attention cache cut
    to ``chunk_size * num_left_chunks`` frames when ``num_left_chunks`` >= 0. Returns its encoder frames (1, t, D)."""

    def __init__(self, model: ConformerCTC, chunk_size: int, num_left_chunks: int = -1, device: Any = None) -> None:
        self.model = model
        self.frames, self.shift = model.chunk_window(chunk_size)
        self.att, self.cnn = model.initial_caches(device)
        self.keep = chunk_size * num_left_chunks if num_left_chunks >= 0 else None
        self.offset = 0

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        y, self.att, self.cnn = self.model.forward_chunk(feats, self.offset, self.att, self.cnn)
        if self.keep is not None:
            self.att = self.att[:, :, max(0, self.att.shape[2] - self.keep):]
        self.offset += y.shape[1]
        return y


def feature_dim(dataset_conf: Any) -> int:
    """The feature dimension the loader produces for ``dataset_conf``."""
    from corpus_io.errors import ConfigError

    if dataset_conf.feats_type == "fbank":
        return int(dataset_conf.fbank_conf.num_mel_bins)
    if dataset_conf.feats_type == "mfcc":
        return int(dataset_conf.mfcc_conf.num_ceps)
    raise ConfigError(f"dataset_conf.feats_type={dataset_conf.feats_type} has no fixed feature dimension for "
                      f"training; train with ++dataset_conf.feats_type=fbank or mfcc.")


def build_model(model_conf: dict, input_dim: int, vocab_size: int, cmvn_file: str | None = None) -> nn.Module:
    """Instantiate ``model_conf`` (a dict with ``_target_``) with the data-dependent sizes filled in."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from corpus_io.errors import ConfigError

    if not model_conf or "_target_" not in model_conf:
        raise ConfigError("config key 'model' needs a '_target_' (e.g. corpus_io.model.model.ConformerCTC). "
                          "Pick a preset with corpus-io train model=conformer_tiny or set ++model._target_=pkg.Class "
                          "(decode and tune-lm read the model block saved in the checkpoint).")
    conf = {k: v for k, v in model_conf.items() if k not in ("input_dim", "vocab_size", "cmvn_file")}
    conf["_target_"] = current_target(conf["_target_"])
    check_model_types(conf)
    try:
        model = instantiate(conf, input_dim=input_dim, vocab_size=vocab_size, cmvn_file=cmvn_file,
                            _convert_="all")
    except InstantiationException as exc:
        msg = " ".join(str(exc).split())[:400]
        raise ConfigError(f"could not build the model from 'model' ({model_conf.get('_target_')}): {msg}. "
                          f"Check the keys of the model config against the class's constructor.") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model._target_={model_conf['_target_']} did not return a torch.nn.Module")
    return model


_PLAIN_TYPES = {bool: "a boolean: true or false", int: "an integer", float: "a number", str: "a string"}


def check_model_types(conf: dict) -> None:
    """Refuse a ``model`` key whose value is not of the type its constructor annotates (``causal=no`` is a string,
    and a non-empty string would build a causal model): booleans are booleans, integers integers, numbers numbers.
    The annotations are read from the ``_target_`` class's ``__init__`` and those of its bases (``**kwargs``
    passed up, as ConformerCTCAttention does); a key without a plain annotation is left to the constructor."""
    import typing

    from hydra.utils import get_class

    from corpus_io.errors import ConfigError

    try:
        cls = get_class(str(conf["_target_"]))
    except Exception:  # noqa: BLE001 - not importable, or a function: instantiate names the problem
        return
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        try:
            hints.update(typing.get_type_hints(klass.__init__))
        except Exception:  # noqa: BLE001 - unresolvable annotations: that class's keys are not checked
            continue
    for key, value in conf.items():
        allowed = _plain_types(hints.get(key)) if key != "_target_" else None
        if not allowed or any(_is_a(value, t) for t in allowed):
            continue
        what = " or ".join(_PLAIN_TYPES[t] if t is not type(None) else "null" for t in allowed)
        example = {bool: "true", int: "4", float: "0.1", str: "abs_pos"}.get(allowed[0], "null")
        raise ConfigError(f"model.{key}={value!r} ({type(value).__name__}): {cls.__name__}'s {key} takes {what}, "
                          f"so the model would not be the one asked for. Set it as such on the command line "
                          f"(e.g. ++model.{key}={example}) or in the model config.")


def _plain_types(hint: Any) -> tuple | None:
    """The plain types a hint allows (``bool``, ``str | None``), or None where it names others."""
    import types
    import typing

    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if not args or any(a not in _PLAIN_TYPES and a is not type(None) for a in args):
        return None
    return tuple(args)


def _is_a(value: Any, t: type) -> bool:
    if t is type(None):
        return value is None
    if isinstance(value, bool) or t is bool:
        return isinstance(value, bool) and t is bool
    return isinstance(value, (int, float)) if t is float else isinstance(value, t)


def model_conf_changes(before: dict, after: dict) -> list[tuple[str, Any, Any]]:
    """The ``model.*`` keys whose values differ between two model blocks, as ``(key, before, after)``: each block
    completed by its ``_target_`` constructor's defaults, so a key set to its default is no change."""
    one, two = _effective(before), _effective(after)
    return [(k, one.get(k, "(unset)"), two.get(k, "(unset)")) for k in sorted(set(one) | set(two))
            if one.get(k, "(unset)") != two.get(k, "(unset)")]


def _effective(conf: dict) -> dict[str, Any]:
    import inspect

    from hydra.utils import get_class

    conf = {k: v for k, v in (conf or {}).items() if k not in ("input_dim", "vocab_size", "cmvn_file")}
    if "_target_" in conf:
        conf["_target_"] = current_target(conf["_target_"])
    defaults: dict[str, Any] = {}
    try:
        for klass in reversed(get_class(str(conf.get("_target_"))).__mro__):
            init = klass.__dict__.get("__init__")
            for name, p in (inspect.signature(init).parameters.items() if init is not None else ()):
                if p.default is not inspect.Parameter.empty and name != "cmvn_file":
                    defaults[name] = p.default
    except Exception:  # noqa: BLE001 - no such class here: the blocks are compared as written
        pass
    return _flat({**defaults, **conf}, "model")


def _flat(d: Mapping, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}.{k}"))
        else:
            out[f"{prefix}.{k}"] = v
    return out


def current_target(target: str) -> str:
    """A model class's path as it is now: checkpoints saved before issue 53 name ``corpus_io.train.model.X``."""
    module, _, name = str(target).rpartition(".")
    return f"corpus_io.model.model.{name}" if module == "corpus_io.train.model" else str(target)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def nonfinite_rows(log_probs: torch.Tensor, lengths: torch.Tensor | None = None) -> list[int]:
    """The rows of a (B, T, V) batch of log-probs (``lengths``: each row's valid frames; None: all) holding a NaN
    or an infinity: a model whose forward gives them has diverged (finite but huge weights), and every hypothesis
    it gives is empty or noise."""
    lp = log_probs.detach()
    # frames in blocks of about 2^22 values: a (B, T) mask, not (B, T, V) ones (3 GB of them for an hour of
    # 5,000-token log-probs)
    bad = torch.zeros(lp.shape[:2], dtype=torch.bool, device=lp.device)
    block = max(1, (1 << 22) // max(1, lp.shape[0] * lp.shape[2]))
    for t in range(0, lp.shape[1], block):
        bad[:, t:t + block] = ~torch.isfinite(lp[:, t:t + block]).all(dim=-1)
    if lengths is not None:
        frames = torch.arange(lp.shape[1], device=lp.device)
        bad = bad & (frames[None, :] < lengths.to(lp.device)[:, None])
    return torch.nonzero(bad.any(dim=1)).flatten().tolist()


def nonfinite_inputs(inputs: torch.Tensor, lengths: torch.Tensor, rows: list[int]) -> list[int]:
    """Of ``rows`` (:func:`nonfinite_rows` of the output), those whose model inputs, features (B, T, D) or
    waveforms (B, N) within ``lengths``, hold a NaN or an infinity: their output is not finite because of their
    audio (or feature matrix), whatever the weights."""
    x = inputs.detach()
    x = x if x.dim() == 3 else x[..., None]
    picked = torch.tensor(rows, dtype=torch.long, device=x.device)
    return [rows[i] for i in nonfinite_rows(x[picked], lengths.to(x.device)[picked])]


def nonfinite_message(model: str, what: str, rows: int, total: int) -> str:
    """The one paragraph of a model whose forward is not finite (:func:`nonfinite_rows`) on ``what``."""
    return (f"the model {model} gives non-finite log-probabilities (NaN or infinity) on {what} ({rows} of {total} "
            f"{'utterance' if total == 1 else 'utterances'}): its weights have diverged (finite but huge values, "
            f"e.g. a training run that blew up), so every hypothesis would be empty or noise. Use a checkpoint from "
            f"before the divergence (an earlier model.pt.ep{{E}} of the run, or an average of good epochs), or "
            f"retrain with a lower learning rate (optim_conf.lr) or gradient clipping (train_conf.grad_clip).")


class ConformerCTCAttention(ConformerCTC):
    """Hybrid CTC/attention (WeNet's U2 without streaming): the Conformer-CTC encoder and head, plus a
    Transformer decoder over the encoder output trained with label-smoothed cross-entropy on
    ``<sos> y <eos>`` (``<sos/eos>`` is the token list's last id). Training loss
    ``ctc_weight * ctc + (1 - ctc_weight) * attention`` (:func:`corpus_io.train.steps.forward_loss`).

    ``forward(feats, lengths)`` is the CTC interface of every model (greedy and beam decoding, CTC-only
    tools); with ``target`` and ``target_lengths`` it also returns the attention loss. ``encode``,
    ``ctc_log_probs`` and ``attention_scores`` serve attention rescoring
    (:mod:`corpus_io.decoding.rescoring`). Decoder sizes: ``decoder_num_blocks``, ``decoder_linear_units``
    (heads and width as the encoder's); ``lsm_weight`` label smoothing; ``pos_enc_layer_type`` defaults to
    ``abs_pos`` here: without positions the decoder's cross-attention cannot count repeated words.
    """

    needs_target = True

    def __init__(self, input_dim: int, vocab_size: int, cmvn_file: str | None = None, *, ctc_weight: float = 0.3,
                 decoder_num_blocks: int = 3, decoder_linear_units: int = 1024, lsm_weight: float = 0.1,
                 pos_enc_layer_type: str = "abs_pos", **encoder: Any) -> None:
        super().__init__(input_dim, vocab_size, cmvn_file, pos_enc_layer_type=pos_enc_layer_type, **encoder)
        if not 0.0 <= ctc_weight <= 1.0:
            raise ValueError(f"ctc_weight={ctc_weight} must be in [0, 1]")
        d = self.ctc.in_features
        heads = int(encoder.get("attention_heads", 4))
        dropout = float(encoder.get("dropout_rate", 0.1))
        self.ctc_weight = float(ctc_weight)
        self.lsm_weight = float(lsm_weight)
        self.sos_eos = vocab_size - 1
        self.embed_tokens = nn.Embedding(vocab_size, d)
        layer = nn.TransformerDecoderLayer(d, heads, decoder_linear_units, dropout, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, decoder_num_blocks, norm=nn.LayerNorm(d))
        self.output = nn.Linear(d, vocab_size)

    def forward(self, feats: torch.Tensor, feats_lengths: torch.Tensor, target: torch.Tensor | None = None,
                target_lengths: torch.Tensor | None = None) -> tuple:
        encoded, lengths = self.encode(feats, feats_lengths)
        log_probs, lengths = self.ctc_log_probs(encoded, lengths)
        if target is None:
            return log_probs, lengths
        logits, gold = self._teacher_forced(encoded, lengths, target, target_lengths)
        att = nn.functional.cross_entropy(logits.float().transpose(1, 2), gold, ignore_index=-1,
                                          label_smoothing=self.lsm_weight, reduction="sum")
        return log_probs, lengths, att / max(int(feats.shape[0]), 1)

    def _teacher_forced(self, encoded: torch.Tensor, lengths: torch.Tensor, target: torch.Tensor,
                        target_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder logits for ``<sos> y`` and the gold ``y <eos>`` (-1 where padded)."""
        B, U = target.shape
        dev = encoded.device
        pos = torch.arange(U + 1, device=dev)[None, :]
        ys = target.clamp(min=0)
        ys_in = torch.cat([torch.full((B, 1), self.sos_eos, device=dev, dtype=torch.long), ys], dim=1)
        ys_in = ys_in.masked_fill(pos > target_lengths[:, None], self.sos_eos)
        gold = torch.cat([ys, torch.full((B, 1), -1, device=dev, dtype=torch.long)], dim=1)
        gold = gold.scatter(1, target_lengths[:, None].long(), self.sos_eos)
        gold = gold.masked_fill(pos > target_lengths[:, None], -1)
        d = encoded.shape[-1]
        x = self.embed_tokens(ys_in) * math.sqrt(d) + _sinusoids(U + 1, d, dev)
        causal = torch.triu(torch.ones(U + 1, U + 1, dtype=torch.bool, device=dev), diagonal=1)
        memory_pad = torch.arange(encoded.shape[1], device=dev)[None, :] >= lengths.clamp(min=1)[:, None]
        out = self.decoder(self.dropout(x), encoded, tgt_mask=causal,
                           tgt_key_padding_mask=pos > target_lengths[:, None], memory_key_padding_mask=memory_pad)
        return self.output(out), gold

    def attention_scores(self, encoded: torch.Tensor, lengths: torch.Tensor, utt: list[int],
                         seqs: list[list[int]]) -> torch.Tensor:
        """The decoder's log-probability of each token sequence (``<eos>`` included) given utterance ``utt[i]``."""
        dev = encoded.device
        index = torch.tensor(utt, dtype=torch.long, device=dev)
        n = torch.tensor([len(s) for s in seqs], dtype=torch.long, device=dev)
        target = torch.full((len(seqs), max(1, int(n.max()))), -1, dtype=torch.long, device=dev)
        for i, s in enumerate(seqs):
            if s:
                target[i, :len(s)] = torch.tensor(s, dtype=torch.long, device=dev)
        logits, gold = self._teacher_forced(encoded.index_select(0, index), lengths.index_select(0, index), target, n)
        logp = torch.log_softmax(logits.float(), dim=-1).gather(2, gold.clamp(min=0)[..., None])[..., 0]
        return logp.masked_fill(gold < 0, 0.0).sum(dim=1).cpu()


def _sinusoids(length: Any, dim: int, device: Any, offset: Any = 0) -> torch.Tensor:
    """(length, dim) sinusoids of positions offset..offset+length-1, sin and cos interleaved (no slice assignment:
    the export traces this)."""
    pos = (torch.arange(length, device=device) + offset).float()[:, None]
    inv = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    return torch.stack([torch.sin(pos * inv), torch.cos(pos * inv)], dim=-1).reshape(-1, 2 * inv.shape[0])[:, :dim]
