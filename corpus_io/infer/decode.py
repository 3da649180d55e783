"""``corpus-io decode``: a raw or shard list through the model and a search (``decoding.method``: greedy,
CTC prefix beam, beam + n-gram LM, attention rescoring), a Kaldi ``text`` of hypotheses, the n-best and a
CER/WER report with the real-time factor (model and search apart) and the most frequent confusions; with
``++timestamps=true`` a Kaldi ``ctm`` and ``timestamps.jsonl`` (token and word times and confidences of each best
hypothesis, :mod:`corpus_io.decoding.align`), with ``++min_confidence`` the confident utterances' ``kept_text``.

The model and tokenizer come from the checkpoint's resolved training config; feature extraction
(``feats_type``, ``feats_on``, ``fbank_conf``/``mfcc_conf``, ``resample_conf``) too, so decoding sees the same
features as training. The user's ``dataset_conf`` chooses the list format, batching and error policy;
shuffling and augmentation are always off.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from corpus_io.errors import ConfigError, DataError


def training_config(state: dict, where: str) -> Any:
    """The checkpoint's resolved ``TrainConfig``."""
    from omegaconf import OmegaConf

    from corpus_io.config import TrainConfig, saved_features, validate

    text = state.get("config")
    if not text:
        raise ConfigError(f"checkpoint {where} holds no training config; decode needs a checkpoint written by "
                          f"corpus-io train (model.pt, model.pt.ep{{E}} or model.pt.avg{{N}}).")
    return validate(TrainConfig, saved_features(OmegaConf.to_container(OmegaConf.create(text), resolve=True)))


def decode_dataset_conf(user: Any, trained: Any) -> Any:
    """The dataset_conf decode, align, segment and score read with: the user's, with the features the checkpoint was
    trained on (:func:`refuse_other_features`); the user's ``feats_on`` (where they are computed) is honoured."""
    from corpus_io.model.cmvn import eval_dataset_conf

    refuse_other_features(user, trained)
    conf = eval_dataset_conf(user)
    conf.feats_type = trained.feats_type
    if user.feats_on == "auto":  # the same features either way: the user's choice of where stands
        conf.feats_on = trained.feats_on if trained.feats_on != "auto" else "loader"  # train settles auto
    conf.fbank_conf = trained.fbank_conf
    conf.mfcc_conf = trained.mfcc_conf
    conf.resample_conf = trained.resample_conf
    conf.fbank_conf.dither = conf.mfcc_conf.dither = 0.0
    return conf


def refuse_other_features(user: Any, trained: Any) -> None:
    """A ConfigError naming the first feature key the user set (not its default) to another value than the
    checkpoint was trained with: a model fed other features (another rate, mel bins, framing) hears nothing it
    knows, and the checkpoint's own would otherwise win in silence."""
    from corpus_io.config import DatasetConf

    default = DatasetConf()
    for name, given, made, unset in _feature_values(user, trained, default, ""):
        if given != unset and given != made:
            raise ConfigError(f"++dataset_conf.{name}={given}: the checkpoint was trained with {name}={made}, and "
                              f"decode, align, segment and score feed a model the features it was trained on (the "
                              f"checkpoint's dataset_conf). Drop the override (audio at any rate is resampled to "
                              f"the model's resample_conf.resample_rate), or train a model with these features.")


def _feature_values(user: Any, trained: Any, default: Any, prefix: str) -> Iterator[tuple[str, Any, Any, Any]]:
    """``(dotted key, user's value, trained value, default value)`` of every feature setting but dither."""
    import dataclasses

    from corpus_io.config.dataset import FEATURE_KEYS, NOT_FEATURES

    names = FEATURE_KEYS if not prefix else [f.name for f in dataclasses.fields(default)]
    for name in names:
        if name in NOT_FEATURES:
            continue
        given, made, unset = (getattr(c, name, None) for c in (user, trained, default))
        if dataclasses.is_dataclass(unset):
            yield from _feature_values(given, made, unset, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", given, made, unset


def load_model(checkpoint: str, device: Any, text_rule: Any = None) -> tuple[Any, Any, Any]:
    """``(model in eval mode, tokenizer, training config)`` from a checkpoint, or from a file of export-model
    (``.onnx``: run by onnxruntime; ``.ts``: TorchScript), or another toolkit's CTC model
    (:mod:`corpus_io.infer.foreign`: a Hugging Face directory, a sherpa-onnx file, ``torchaudio:MMS_FA``), whose
    tokenizer follows ``text_rule`` (the command's ``text_rule`` config)."""
    from corpus_io.infer.exported import is_exported, load_exported
    from corpus_io.infer.foreign import foreign_kind, load_foreign

    if foreign_kind(checkpoint):
        return load_foreign(checkpoint, device, text_rule)
    if is_exported(checkpoint):
        return load_exported(checkpoint, device)
    from corpus_io.model.checkpoint import check_token_list, load_checkpoint
    from corpus_io.model.model import build_model, feature_dim
    from corpus_io.tokenizer import build_tokenizer

    state = load_checkpoint(checkpoint)
    tcfg = training_config(state, checkpoint)
    tokenizer = build_tokenizer(tcfg.tokenizer)
    check_token_list(state, tokenizer, checkpoint)
    # CMVN stats are buffers inside the checkpoint; the original cmvn_file is not needed.
    model = build_model(dict(tcfg.model), feature_dim(tcfg.dataset_conf), tokenizer.vocab_size, None)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise ConfigError(f"checkpoint {checkpoint} does not fit the model of its own config "
                          f"({str(exc).splitlines()[0]}). Was the token list changed after training?") from None
    return model.to(device).eval(), tokenizer, tcfg


def checkpoint_inputs(checkpoint: str, tcfg: Any) -> list[tuple[str, str | None]]:
    """``(name, path)`` of the files a checkpoint's config names and a door reads with it (the token list, BPE
    model, CMVN stats): outputs must not be these (a door writing beside a model dir)."""
    return [(f"tokenizer.token_list of checkpoint {checkpoint}", tcfg.tokenizer.token_list),
            (f"tokenizer.bpe_model of checkpoint {checkpoint}", tcfg.tokenizer.bpe_model),
            (f"cmvn_file of checkpoint {checkpoint}", tcfg.cmvn_file)]


def decode(cfg: Any) -> dict:
    """Decode ``cfg.data_list`` with ``cfg.checkpoint`` by ``cfg.decoding.method``; write ``text`` (best
    hypotheses), ``nbest`` (key, rank, score, text), ``ref`` and ``cer.txt`` / ``wer.txt`` to output_dir."""
    refuse_overwrites(cfg)  # first: before torch is imported or anything is read
    from corpus_io.config import require
    from corpus_io.decoding.search import NEEDS_ENCODER, Search, check_options
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.storage.files import refuse_overwriting_inputs

    require(cfg, "data_list", "checkpoint", "output_dir")
    check_options(cfg.decoding)
    device = decode_device(cfg.device)
    model, tokenizer, tcfg = load_model(cfg.checkpoint, device, cfg.text_rule)
    check_repeated_keys(cfg.data_list, cfg.dataset_conf, "decode")
    refuse_overwriting_inputs([(f"++output_dir's {name}", Path(cfg.output_dir) / name) for name in DECODE_OUTPUTS],
                              checkpoint_inputs(cfg.checkpoint, tcfg))
    conf = decode_dataset_conf(cfg.dataset_conf, tcfg.dataset_conf)
    loader = build_dataloader(cfg.data_list, conf, tokenizer, train=False, rank=0, world_size=1)
    search = Search(cfg.decoding, tokenizer, model, device)
    timing = cfg.timestamps or cfg.min_confidence > 0
    batches = forward_batches(loader, model, tokenizer, conf, device, encoder=cfg.decoding.method in NEEDS_ENCODER,
                              desc=f"decode ({cfg.decoding.method})", speech=timing, chunk_seconds=cfg.chunk_seconds,
                              streaming=streaming_options(cfg, model), source=(cfg.checkpoint, cfg.data_list))
    run = run_search(cfg.decoding, batches, tokenizer, search, where=cfg.data_list, skipped=skipped_summary(loader),
                     frame_seconds=output_frame_seconds(model, conf) if timing else None)
    undecoded(run, cfg.data_list, conf, loader_dropped(loader))
    out = Path(cfg.output_dir)
    result = write_results(out, run, tokenizer, search.description, nbest=cfg.decoding.nbest,
                           timestamps=cfg.timestamps, min_confidence=cfg.min_confidence)
    print(f"decode: {result['utts']} utterances ({run.audio / 3600:.3f} h), {search.description}, "
          f"RTF {result['rtf']:.4f} (model {result['rtf_model']:.4f}, search {result['rtf_search']:.4f}), "
          f"loader skips/filters: {run.skipped}")
    print(result["summary"].rstrip())
    print(f"decode: hypotheses -> {out / 'text'}, n-best -> {out / 'nbest'}, report -> {out / 'cer.txt'}")
    if cfg.timestamps:
        print(f"decode: word times -> {out / 'ctm'}, tokens and words -> {out / 'timestamps.jsonl'}")
    if cfg.min_confidence > 0:
        kept_list = ""
        if conf.data_type == "raw" and "://" not in str(cfg.data_list):
            kept_list = f", as a raw list with the hypotheses as transcripts -> {out / 'kept.list'}"
            write_kept_list(cfg.data_list, out / "kept.list", run, cfg.min_confidence)
        print(f"decode: {result['kept']} of {result['utts']} utterances have confidence >= {cfg.min_confidence} "
              f"-> {out / 'kept_text'}{kept_list} (every utterance's: {out / 'confidence'})")
    return {k: v for k, v in result.items() if k != "summary"}


def input_frame_seconds(conf: Any) -> float:
    """Seconds between the model's input frames: the fbank/mfcc frame shift, a sample for ``feats_type=raw``,
    10 ms for precomputed (Kaldi) features."""
    if conf.feats_type == "raw":
        return 1.0 / conf.resample_conf.resample_rate
    if conf.feats_type == "precomputed":
        return 0.01
    frame = conf.mfcc_conf if conf.feats_type == "mfcc" else conf.fbank_conf
    return frame.frame_shift / 1000.0


def input_frame_offset_seconds(conf: Any) -> float:
    """Where input frame 0 starts, in seconds (frame k starts k frame shifts later): 0 with Kaldi's framing
    (snip_edges), half a shift minus half a window without it (-7.5 ms for 25/10 ms: frames centred on every shift,
    sherpa-onnx's framing, the default since issue 52)."""
    if conf.feats_type != "fbank" or conf.fbank_conf.snip_edges:
        return 0.0
    return (conf.fbank_conf.frame_shift / 2 - conf.fbank_conf.frame_length / 2) / 1000.0


def subsampling_of(model: Any) -> int:
    """Input frames per output frame: measured on the model's own length rule (``embed.output_lengths``,
    ConformerCTC's ``((T - 1) // 2 - 1) // 2``: 4), else 4."""
    import torch

    rule = getattr(getattr(model, "embed", None), "output_lengths", None)
    if rule is None:
        return 4
    n = 100_000
    return max(1, round(n / max(1, int(rule(torch.tensor([n]))[0]))))


def output_frame_seconds(model: Any, conf: Any) -> float:
    """Seconds per CTC output frame: the input frame shift times the model's subsampling (4 x 10 ms = 40 ms); another
    toolkit's model says its own (``frame_seconds``: 20 ms for wav2vec2)."""
    if getattr(model, "frame_seconds", None):
        return float(model.frame_seconds)
    return input_frame_seconds(conf) * subsampling_of(model)


def decode_device(name: str) -> Any:
    import torch

    use_cuda = torch.cuda.is_available() if name == "auto" else name == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is visible; use ++device=auto or cpu.")
    return torch.device("cuda" if use_cuda else "cpu")


@dataclass
class DecodeRun:
    """What one pass over a list gives: n-best lists and references by key, audio seconds and times."""

    nbest: dict = field(default_factory=dict)
    refs: dict = field(default_factory=dict)
    timed: dict = field(default_factory=dict)  # key -> align.Timed of the best hypothesis (timestamps, confidence)
    segments: dict = field(default_factory=dict)  # key -> [recording id, start seconds] of a raw segment
    repeats: dict = field(default_factory=dict)
    audio: float = 0.0
    model_s: float = 0.0
    search_s: float = 0.0
    wall_s: float = 0.0
    skipped: str = "none"
    recordings: set = field(default_factory=set)  # the recording ids of raw segments, checked to be one token
    missing: dict = field(default_factory=dict)  # key -> reference of an utterance of the list not decoded
    unread: list = field(default_factory=list)  # why the references of a shard or list entry could not be read
    # shard not read -> how many of its utterances no key names (list_references; None: unknown)
    unread_shards: dict = field(default_factory=dict)
    hotwords: list = field(default_factory=list)
    unbiased: dict = field(default_factory=dict)  # key -> best hypothesis of the search without hotwords


@dataclass
class Forward:
    """One batch through the model: its keys, transcripts (or target ids), audio seconds, the CTC
    log-probabilities, the encoder output (attention rescoring), the seconds the model took, each utterance's
    audio seconds and, for raw segments, where each lies in its recording (``[recording id, start]`` or None)."""

    keys: list
    refs: list
    audio: float
    log_probs: Any
    lengths: Any
    encoder: Any
    seconds: float
    durations: list = field(default_factory=list)
    segments: list | None = None
    speech: list | None = None  # per utterance, which input frames hold speech (fbank energy), for word onsets
    speech_seconds: float = 0.01  # seconds between those frames (the frame shift)
    targets: list = field(default_factory=list)  # each utterance's label as the loader tokenized it (token ids)
    frame_offset: float = 0.0  # seconds where input frame 0 starts (input_frame_offset_seconds)
    # with forward_batches(columns=...): per utterance, the token id of each column of its log_probs
    columns: list | None = None
    # corpus-io's word-time rule (starts moved to the speech onsets, input frame 0's offset); False: another toolkit's
    # model, whose word times follow its Viterbi path alone (speech frames are still given, for segment's pauses)
    own_rule: bool = True


#: an utterance longer than this (seconds) goes through the model in pieces of this length (``++chunk_seconds``): the
#: self-attention's memory grows with the square of the length (a 600 s utterance would ask gigabytes per layer)
CHUNK_SECONDS = 60.0
#: seconds of audio each side of a piece that the model also sees, whose outputs are dropped (the piece's context)
CHUNK_CONTEXT_SECONDS = 2.0


def forward_batches(loader: Any, model: Any, tokenizer: Any, conf: Any, device: Any, *,
                    encoder: bool = False, desc: str = "decode", speech: bool = False,
                    chunk_seconds: float = CHUNK_SECONDS, streaming: tuple[int, int] = (0, -1),
                    source: tuple[str, str] = ("in use", "the list"), total: int | None = None,
                    columns: Callable[[str, str], list[int]] | None = None) -> Iterator[Forward]:
    """The model over every batch of ``loader`` (with progress), timed. ``speech``: also each utterance's speech
    frames (word times move their starts back over them). A batch holding an utterance longer than
    ``chunk_seconds`` (0: none) goes through the model in pieces (:func:`chunked`). ``streaming``
    ``(decoding_chunk_size, num_decoding_left_chunks)`` with a chunk > 0: each utterance chunk by chunk with
    caches (:func:`chunk_by_chunk`). A batch whose log-probs are not finite (a diverged model) is a DataError
    naming ``source`` (the model, the list) and the utterances, not empty hypotheses. ``total``: the batches the
    progress bar counts to, when the caller knows it. ``columns(key, transcript)``: the token ids an utterance's
    log-probs keep (a forced alignment needs its transcript's and blank's, not the whole vocabulary: an hour of a
    5,000-token model's is 1.8 GB), kept piece by piece; :attr:`Forward.columns` says which."""
    import torch

    from corpus_io.model.frontend import FrontEnd, build_front_end, model_inputs, sync_device
    from corpus_io.model.model import nonfinite_message, nonfinite_rows
    from corpus_io.storage.progress import progress

    # an exported model with the front end inside takes the waveforms themselves
    waveform_model = getattr(model, "inputs", "") == "waveform"
    front_end = model.front_end if waveform_model else build_front_end(conf, device)
    # another toolkit's model: word times follow its Viterbi path alone (no speech onsets, no input frame offset)
    foreign = bool(getattr(model, "frame_seconds", None))
    # the fbank that speech frames come from: the model's inputs, or for a model fed waveforms the same Kaldi fbank
    energy_front_end = FrontEnd(conf) if speech and waveform_model and conf.feats_type == "fbank" else None
    # input units (feature frames, or samples for a model fed waveforms) per output frame, per piece, per context
    unit = 1.0 / conf.resample_conf.resample_rate if waveform_model else input_frame_seconds(conf)
    step = max(1, round(output_frame_seconds(model, conf) / unit))
    piece = max(step, int(chunk_seconds / unit) // step * step) if chunk_seconds > 0 else 0
    context = int(CHUNK_CONTEXT_SECONDS / unit) // step * step
    utts = 0
    with torch.no_grad():
        bar = progress(loader, total=total, desc=desc, unit="batch")
        for batch in bar:
            t0 = time.perf_counter()
            target, tlen = batch["target"].tolist(), batch["target_lengths"].tolist()
            targets = [target[i][: int(tlen[i])] for i in range(len(batch["keys"]))]
            refs = [_reference(batch, i, tokenizer, ids) for i, ids in enumerate(targets)]
            kept = None if columns is None else \
                column_ids([columns(str(k), r) for k, r in zip(batch["keys"], refs)], device)
            feats, feats_lengths = model_inputs(front_end, batch, device, train=False)
            whole = not piece or int(feats_lengths.max()) <= piece
            enc, narrowed = None, False
            if streaming[0] > 0:
                enc = chunk_by_chunk(model, feats, feats_lengths, *streaming)
                log_probs, lengths = model.ctc_log_probs(*enc)
            elif encoder:
                enc = model.encode(feats, feats_lengths) if whole else \
                    chunked(model.encode, feats, feats_lengths, step=step, piece=piece, context=context)
                log_probs, lengths = model.ctc_log_probs(*enc)
            elif whole:
                log_probs, lengths = model(feats, feats_lengths)
            else:
                log_probs, lengths = chunked(model, feats, feats_lengths, step=step, piece=piece, context=context,
                                             columns=kept)
                narrowed = True
            if kept is not None and not narrowed:
                log_probs = torch.gather(log_probs, 2, kept[:, None, :].expand(-1, log_probs.shape[1], -1))
            sync_device(device)
            bad = nonfinite_rows(log_probs, lengths)
            if bad:
                raise_if_inputs_at_fault(feats, feats_lengths, bad, batch["keys"], source)
                keys = [str(batch["keys"][i]) for i in bad]
                raise DataError(nonfinite_message(source[0], f"{source[1]} (utterances {', '.join(keys[:3])}"
                                                  f"{' ...' if len(keys) > 3 else ''})", len(bad), len(batch["keys"]))
                                + " Nothing was written.")
            utts += len(refs)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(utts=utts)
            seconds = time.perf_counter() - t0
            frames = None
            if speech:
                energy_feats = energy_front_end(batch, train=False) if energy_front_end else (feats, feats_lengths)
                frames = _speech(*energy_feats, conf)
            yield Forward(list(batch["keys"]), refs, float(batch.get("audio_seconds", 0.0)), log_probs, lengths,
                          enc, seconds, _durations(batch, conf), batch.get("segments"), frames,
                          input_frame_seconds(conf), targets, input_frame_offset_seconds(conf),
                          None if kept is None else kept.tolist(), own_rule=not foreign)


def repeated_keys_of(data_list: str, conf: Any) -> dict[str, list[str]]:
    """``{key: [place, place, ...]}`` for every key the list holds more than once: a raw list's ``file:line`` of
    each entry (a Kaldi dir's own lines), a shard list's shards (as the loader finds them: :func:`shard_repeats`;
    remote shards without keys in their index are left to the readers, which count the repeats they meet)."""
    if conf.data_type == "raw":
        from corpus_io.loader.rawlist import RawList

        entries = RawList(data_list)
        return {key: [entries.where(i) for i in at] for key, at in entries.repeated_entries().items()}
    from corpus_io.loader.read import shard_repeats
    from corpus_io.shards.index import load_index, read_datalist

    options = conf.storage_options or None
    urls = read_datalist(data_list, storage_options=options)
    repeats, _, _ = shard_repeats(data_list, urls, load_index(data_list, storage_options=options) or {}, options)
    return {key: [f"shard {shard}" for shard in shards] for key, shards in repeats.items()}


def check_repeated_keys(data_list: str, conf: Any, command: str) -> dict[str, list[str]]:
    """Before the list is read: a key it holds twice (two utterances, or two labels of one) is a
    DataError naming it and where both are; with ``dataset_conf.on_error=skip`` the loader keeps the first of each,
    and the repeats are returned (for ``command`` to report them) after a warning naming the first."""
    repeats = repeated_keys_of(data_list, conf)
    if not repeats:
        return {}
    key, places = next(iter(repeats.items()))
    where = (f"key '{key}' is at {places[0]} and {places[1]}" + (f" (and {len(places) - 2} more)" if len(places) > 2
                                                                 else "")
             + (f"; {len(repeats) - 1} more keys repeat" if len(repeats) > 1 else ""))
    if conf.on_error != "skip":
        raise DataError(f"{command}: {where} in ++data_list={data_list}. {command} names each output by its "
                        f"utterance's key, and would keep the first and leave the other out. Give each utterance its "
                        f"own key, or drop the repeated line or shard (verify-shards lists a shard list's repeats); "
                        f"or set ++dataset_conf.on_error=skip to keep the first of each and have the others reported. "
                        f"Nothing was written.")
    print(f"warning: {where} in {data_list}; {command} keeps the first of each repeated key and leaves the "
          f"others out (++dataset_conf.on_error=skip).", file=sys.stderr, flush=True)
    return repeats


def streaming_options(cfg: Any, model: Any) -> tuple[int, int]:
    """``(decoding_chunk_size, num_decoding_left_chunks)`` of a decode config, checked against the model: chunk by
    chunk needs a causal PyTorch model (an exported file is run whole)."""
    chunk, left = int(cfg.decoding_chunk_size), int(cfg.num_decoding_left_chunks)
    if chunk <= 0:
        return 0, -1
    what = f"++decoding_chunk_size={chunk}"
    if not hasattr(model, "encode_streaming"):
        raise ConfigError(f"{what}: checkpoint {cfg.checkpoint} is not a corpus-io ConformerCTC checkpoint (an "
                          f"exported file or another model), which decode runs whole. Decode the PyTorch "
                          f"checkpoint chunk by chunk, or serve the streaming export with sherpa-onnx "
                          f"(docs/DECODING.md \"Serving with sherpa-onnx (online, streaming)\").")
    model.require_streaming(what)
    return chunk, left


def chunk_by_chunk(model: Any, feats: Any, lengths: Any, chunk: int, left: int) -> tuple[Any, Any]:
    """``model.encode_streaming`` on each row of a padded batch (one utterance at a time, as a stream), padded
    back into a batch: (B, T', D) and (B,)."""
    import torch

    rows = [model.encode_streaming(feats[i:i + 1, :int(n)], chunk, left)[0][0] for i, n in enumerate(lengths.tolist())]
    out_lengths = torch.tensor([r.shape[0] for r in rows], dtype=lengths.dtype, device=lengths.device)
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), out_lengths


def column_ids(rows: list[list[int]], device: Any) -> Any:
    """``(B, K)`` long tensor of each row's columns to keep, a shorter row padded with its own last id (a repeated
    column, which no one asks for: every value stays a log-probability)."""
    import torch

    width = max(len(r) for r in rows)
    return torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def chunked(fn: Callable, x: Any, lengths: Any, *, step: int, piece: int, context: int,
            columns: Any = None) -> tuple[Any, Any]:
    """``fn(x, lengths) -> (out (B, T', ...), out_lengths)`` run on pieces of each row: ``piece`` input units (a
    multiple of ``step``, the input units per output frame) and ``context`` units each side, whose outputs are
    dropped. The pieces' outputs joined are as many frames as the whole row's, each at the same time (a piece
    starts on an output frame's first input unit); at most ``len(x)`` pieces go through ``fn`` at once, so memory
    is bounded by the batch size times the piece, not by the longest utterance, and the joined output is held about
    once. ``columns`` ``(B, K)``: each row's output keeps only these columns of its last dimension, piece by piece."""
    import torch

    pieces = []  # (row, first input unit fed, last fed, output frames to skip, output frames kept or -1: the rest)
    for row, n in enumerate(lengths.tolist()):
        for start in range(0, int(n), piece):
            end = min(int(n), start + piece)
            first, last = max(0, start - context), min(int(n), end + context)
            pieces.append((row, first, last, (start - first) // step, (end - start) // step if end < n else -1))
    outs: list[list] = [[] for _ in range(x.shape[0])]
    for g in range(0, len(pieces), max(1, x.shape[0])):
        group = pieces[g:g + max(1, x.shape[0])]
        xs = x.new_zeros((len(group), max(last - first for _, first, last, _, _ in group), *x.shape[2:]))
        for j, (row, first, last, _, _) in enumerate(group):
            xs[j, :last - first] = x[row, first:last]
        out, out_lengths = fn(xs, torch.tensor([last - first for _, first, last, _, _ in group],
                                               dtype=lengths.dtype, device=lengths.device))
        for j, (row, _, _, skip, keep) in enumerate(group):
            end = int(out_lengths[j]) if keep < 0 else min(int(out_lengths[j]), skip + keep)
            outs[row].append(out[j, skip:end] if columns is None else out[j, skip:end][:, columns[row]])
    # one padded tensor, filled piece by piece, each piece let go once copied: the output held about once, not three
    # times (pieces, each row joined, then padded; 1.8 GB each for an hour of 5,000-token log-probs)
    frames = [sum(int(part.shape[0]) for part in parts) for parts in outs]
    like = next(part for parts in outs for part in parts)
    joined = like.new_empty((len(outs), max(frames), *like.shape[1:]))  # empty: its pages are touched as filled
    del like
    for row, parts in enumerate(outs):
        at = 0
        while parts:
            part = parts.pop(0)
            joined[row, at:at + part.shape[0]] = part
            at += int(part.shape[0])
            del part
        joined[row, at:] = 0  # the padding
    return joined, torch.tensor(frames, dtype=lengths.dtype, device=lengths.device)


def _speech(feats: Any, feats_lengths: Any, conf: Any) -> list | None:
    """Each row's speech frames (align.speech_frames) from log-mel fbank features: a frame's energy is the sum of
    its mel bands' (in dB). None for other features: words keep the CTC path's starts."""
    import math

    import torch

    from corpus_io.decoding.align import speech_frames

    if conf.feats_type != "fbank" or feats.dim() != 3 or feats.shape[-1] != conf.fbank_conf.num_mel_bins:
        return None
    energy_db = torch.logsumexp(feats.detach().float(), dim=-1) * (10.0 / math.log(10.0))
    return [speech_frames(energy_db[i, : int(n)]) for i, n in enumerate(feats_lengths.tolist())]


def raise_if_inputs_at_fault(feats: Any, feats_lengths: Any, bad: list[int], keys: list, source: tuple) -> None:
    """A DataError blaming the audio, not the model, when the rows whose log-probs are not finite had non-finite
    inputs (features, or waveforms for a model fed them): no weights give a finite output of those."""
    from corpus_io.model.model import nonfinite_inputs

    unfit = [str(keys[i]) for i in nonfinite_inputs(feats, feats_lengths, bad)]
    if unfit:
        raise DataError(f"the model inputs of {len(unfit)} utterances of {source[1]} are not finite (NaN or infinity): "
                        f"{', '.join(unfit[:3])}{' ...' if len(unfit) > 3 else ''}. Their audio (or feature matrix) is "
                        f"at fault, not the model {source[0]} (samples far beyond full scale overflow the "
                        f"features): fix those recordings or leave them out of the list (pack-shards and make-datalist "
                        f"take their keys as exclude_keys); nothing was written.")


def _durations(batch: dict, conf: Any) -> list[float]:
    """Each row's audio seconds: its samples, or its feature frames' extent (the last window's end; without
    snip_edges, a frame per shift of audio)."""
    if "wav_lengths" in batch:
        return [int(n) / float(batch["sample_rate"]) for n in batch["wav_lengths"].tolist()]
    shift = input_frame_seconds(conf)
    window = 0.0
    if conf.feats_type in ("fbank", "mfcc"):
        frame = conf.mfcc_conf if conf.feats_type == "mfcc" else conf.fbank_conf
        if getattr(frame, "snip_edges", True):
            window = (frame.frame_length - frame.frame_shift) / 1000.0
    return [int(n) * shift + window for n in batch["feats_lengths"].tolist()]


def run_search(dconf: Any, batches: Iterable[Forward], tokenizer: Any, search: Any, *, where: str,
               skipped: Callable[[], str] = lambda: "none", frame_seconds: float | None = None,
               command: str = "decode") -> DecodeRun:
    """The search over the model's outputs (timed apart from the model); n-best lists by key. With
    ``frame_seconds`` (seconds per output frame) each best hypothesis is also aligned: times and confidences in
    ``run.timed``."""
    run = DecodeRun(hotwords=search.hotwords)
    t_start = time.perf_counter()
    for fw in batches:
        t1 = time.perf_counter()
        nbest = search(fw.log_probs, fw.lengths, fw.encoder)
        run.search_s += time.perf_counter() - t1
        run.model_s += fw.seconds
        if search.context is not None:  # the same search without hotwords: recall before and after
            for key, hyps in zip(fw.keys, search.unbiased(fw.log_probs, fw.lengths, fw.encoder)):
                run.unbiased[key] = tokenizer.decode(hyps[0].ids) if hyps else ""
        for key, ref, hyps in zip(fw.keys, fw.refs, nbest):
            if key in run.nbest:  # scored once; a silent overwrite would hide an utterance from the count
                run.repeats[key] = run.repeats.get(key, 1) + 1
            run.nbest[key] = [(tokenizer.decode(h.ids), h.score) for h in hyps] or [("", float("-inf"))]
            run.refs[key] = ref
        if frame_seconds is not None:
            _align_batch(run, fw, nbest, tokenizer, frame_seconds)
        run.audio += fw.audio
    run.wall_s = time.perf_counter() - t_start
    run.skipped = skipped()
    if not run.nbest:
        raise DataError(f"{command} read 0 utterances from {where} (loader skips/filters: {run.skipped}); nothing "
                        f"was scored or written. Check the list, its paths or URLs and dataset_conf.on_error.")
    if run.repeats:
        first = next(iter(run.repeats))
        print(f"warning: {len(run.repeats)} keys were decoded more than once (e.g. '{first}' "
              f"{run.repeats[first]} times); each is scored once. Find them with verify-shards and give every "
              f"utterance its own key.", file=sys.stderr, flush=True)
    return run


def _align_batch(run: DecodeRun, fw: Forward, nbest: list, tokenizer: Any, frame_seconds: float) -> None:
    """Each utterance's best hypothesis force-aligned to its frames: token and word times, confidences."""
    from corpus_io.decoding.align import align
    from corpus_io.decoding.scoring import word_units

    lengths = fw.lengths.tolist()
    for i, (key, hyps) in enumerate(zip(fw.keys, nbest)):
        ids = hyps[0].ids if hyps else []
        duration = fw.durations[i] if i < len(fw.durations) else None
        speech = fw.speech[i] if fw.speech is not None and fw.own_rule else None
        run.timed[key] = align(fw.log_probs[i, : int(lengths[i])], ids, tokenizer.decode, word_units,
                               frame_seconds=frame_seconds, duration=duration, blank=tokenizer.blank_id,
                               speech=speech, speech_seconds=fw.speech_seconds,
                               offset_seconds=fw.frame_offset if fw.own_rule else 0.0)
        if fw.segments is not None and fw.segments[i] is not None:
            run.segments[key] = fw.segments[i]
            if fw.segments[i][0] not in run.recordings:  # a list's field was checked when read; a file's name is not
                from corpus_io.keys import recording_id

                run.recordings.add(recording_id(str(fw.segments[i][0]), f"segment '{key}' (its recording id is the "
                                                                        f"line's 'recording' field, else its audio "
                                                                        f"file's name)"))


def skipped_summary(loader: Any) -> Callable[[], str]:
    from corpus_io.model.cmvn import loader_counts

    return lambda: ", ".join(f"{k}: {v}" for k, v in sorted(loader_counts(loader).items())) or "none"


#: loader counts, besides how it batched (``batch.*``: split_counts), that drop no utterance of the list (retries,
#: a repeated key's other copies, notes)
NOT_DROPS = frozenset({"duplicate key", "epoch_hours.empty_pass", "resume.reread", "shard retries",
                       "tokenize.unknown_tokens", "uneven_ranks.carried"})


def loader_dropped(loader: Any) -> dict:
    """The loader's counts of utterances it did not deliver (filters, unreadable audio or shards, ...)."""
    from corpus_io.loader.batching import split_counts
    from corpus_io.model.cmvn import loader_counts

    dropped, _ = split_counts(loader_counts(loader))
    return {k: v for k, v in dropped.items() if k not in NOT_DROPS}


def undecoded(run: DecodeRun, data_list: str, conf: Any, dropped: dict) -> None:
    """When the loader dropped utterances (``dropped``: its counts), the list's references are read again (keys and
    transcripts, no audio): each one without a hypothesis goes into ``run.missing``, scored as all deletions and
    named; why a shard's or an entry's references could not be read goes into ``run.unread``."""
    if not dropped:
        return
    for key, ref in list_references(data_list, conf, run.unread, run.unread_shards):
        if key not in run.nbest and key not in run.missing:
            run.missing[key] = ref


def list_references(data_list: str, conf: Any, unread: list,
                    unread_shards: dict | None = None) -> Iterator[tuple[str, str]]:
    """``(key, transcript)`` of every utterance of a raw or shard list, without audio (a shard's from its meta
    companion or its text members); a place that cannot be read is described in ``unread`` and passed over. A
    shard that cannot be read still counts: its keys come from the list's index (transcript ``""``), and
    ``unread_shards[shard]`` is how many of its utterances have no key to name (0 when the index lists its keys;
    its entry's ``num_utts`` less those read; None: not even the index says)."""
    if conf.data_type == "raw":
        from corpus_io.loader.rawlist import RawList

        entries = RawList(data_list)
        for i in range(len(entries)):
            try:
                rec = entries.record(i)
            except DataError as exc:
                unread.append(str(exc))
                continue
            yield str(rec["key"]), str(rec.get("target") or "")
        return
    from corpus_io.shards.index import read_datalist, shard_identity
    from corpus_io.shards.kinds import iter_shard_metadata

    options = conf.storage_options or None
    index: dict | None = None
    for url in read_datalist(data_list, storage_options=options):
        got = 0
        try:
            for sample in iter_shard_metadata(url, storage_options=options):
                text = sample.get("txt") or ""
                got += 1
                yield str(sample["key"]), text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        except DataError as exc:
            unread.append(f"shard {url}: {exc}")
        else:
            continue
        if index is None:
            index = _index_by_shard(data_list, options)
        entry = index.get(shard_identity(url), {})
        n = entry.get("num_utts")
        if isinstance(entry.get("keys"), list):
            yield from ((str(k), "") for k in entry["keys"])  # the callers pass over keys already met
            n = got = 0
        if unread_shards is not None:
            unread_shards[url] = max(0, n - got) if isinstance(n, int) else None


def _index_by_shard(data_list: str, options: dict | None) -> dict:
    """The entries of ``data_list``'s index (with their keys) by :func:`shard_identity`; empty without an index."""
    from corpus_io.shards.index import load_index, shard_identity

    try:
        entries = load_index(data_list, keys=True, storage_options=options) or {}
    except (DataError, OSError, ValueError):
        return {}  # an index that cannot be read: the shards' counts stay unknown
    return {shard_identity(path): entry for path, entry in entries.items()}


def score(run: DecodeRun, tokenizer: Any) -> Any:
    from corpus_io.decoding.scoring import Scorer, token_list_covers

    scorer = Scorer(hotwords=run.hotwords, unread=list(run.unread))
    covered = token_list_covers([s for s in tokenizer.symbols if s not in tokenizer.specials])
    for key in sorted(run.nbest):
        scorer.add(key, run.refs[key], run.nbest[key][0][0], unbiased=run.unbiased.get(key))
        scorer.count_oov(tokenizer.tokenize(run.refs[key]), covered)
    for key in sorted(run.missing):
        scorer.add_missing(key, run.missing[key], why=run.skipped)
        scorer.count_oov(tokenizer.tokenize(run.missing[key]), covered)
    return scorer


def write_results(out: Path, run: DecodeRun, tokenizer: Any, method: str, nbest: int = 1000, *,
                  timestamps: bool = False, min_confidence: float = 0.0) -> dict:
    """``text``, ``nbest``, ``ref``, ``cer.txt``/``wer.txt`` (the report: method, RTF, scores, confusions); with
    ``timestamps`` ``ctm`` and ``timestamps.jsonl``; with ``min_confidence`` > 0 ``confidence`` and ``kept_text``."""
    from corpus_io.storage.files import atomic_write, ensure_dir

    ensure_dir(out, what="output_dir")
    keys = sorted(run.nbest)
    with atomic_write(out / "text", owner=WRITER) as f:
        f.write("".join(f"{k} {run.nbest[k][0][0]}\n" for k in keys))
    with atomic_write(out / "nbest", owner=WRITER) as f:
        f.write("".join(f"{k} {r} {sc:.4f} {text}\n" for k in keys
                        for r, (text, sc) in enumerate(run.nbest[k][:nbest], 1)))
    # the whole reference: an utterance not decoded has no line in text
    with atomic_write(out / "ref", owner=WRITER) as f:
        refs = {**run.refs, **run.missing}
        f.write("".join(f"{k} {refs[k]}\n" for k in sorted(refs)))
    scorer = score(run, tokenizer)
    audio = max(run.audio, 1e-9)
    timing = {"rtf": run.wall_s / audio, "rtf_model": run.model_s / audio, "rtf_search": run.search_s / audio}
    head = (f"decoding: {method}\n"
            f"RTF {timing['rtf']:.4f} (wall {run.wall_s:.2f}s / audio {run.audio:.2f}s; model "
            f"{timing['rtf_model']:.4f}, search {timing['rtf_search']:.4f})\n")
    report = head + scorer.report()
    for name in ("cer.txt", "wer.txt"):
        with atomic_write(out / name, owner=WRITER) as f:
            f.write(report)
    kept = write_timed(out, run, timestamps=timestamps, min_confidence=min_confidence)
    return {"utts": len(keys), "missing": sorted(run.missing), "kept": kept, "cer": scorer.cer.rate,
            "wer": scorer.wer.rate, **timing,
            "rtf_wall": timing["rtf"], "hotword_recall": scorer.hotword_recall(),
            "summary": head + scorer.summary()}


def write_timed(out: Path, run: DecodeRun, *, timestamps: bool, min_confidence: float) -> int:
    """``ctm`` and ``timestamps.jsonl`` (``timestamps``); ``confidence`` and ``kept_text`` (``min_confidence`` >
    0). Times are seconds in the recording: a raw segment's are shifted by its start and named by its recording
    id (Kaldi's CTM), anything else's are the utterance's own. Returns the number of utterances kept."""
    import json

    from corpus_io.storage.files import atomic_write

    def placed(key: str) -> tuple[str, float]:
        seg = run.segments.get(key)
        return (str(seg[0]), float(seg[1])) if seg else (key, 0.0)

    keys = sorted(run.timed, key=lambda k: (placed(k), k))
    if timestamps:
        with atomic_write(out / "ctm", owner=WRITER) as f:
            for key in keys:
                name, offset = placed(key)
                for w in run.timed[key].words:
                    f.write(ctm_line(key, name, w.start + offset, w.end - w.start, w.text, w.confidence))
        with atomic_write(out / "timestamps.jsonl", owner=WRITER) as f:
            for key in keys:
                name, offset = placed(key)
                timed = run.timed[key]
                rec: dict = {"key": key, "text": run.nbest[key][0][0], "confidence": round(timed.confidence, 4)}
                if key in run.segments:
                    rec.update(recording=name, offset=offset)
                rec["words"] = [{"word": w.text, "start": round(w.start + offset, 3), "end": round(w.end + offset, 3),
                                 "confidence": round(w.confidence, 4)} for w in timed.words]
                rec["tokens"] = [{"token": t.text, "start": round(t.start + offset, 3),
                                  "end": round(t.end + offset, 3), "confidence": round(t.confidence, 4)}
                                 for t in timed.tokens]
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    if min_confidence <= 0:
        return len(run.timed)
    ordered = sorted(run.timed)
    with atomic_write(out / "confidence", owner=WRITER) as f:
        f.write("".join(f"{k} {run.timed[k].confidence:.4f}\n" for k in ordered))
    kept = [k for k in ordered if run.timed[k].confidence >= min_confidence]
    with atomic_write(out / "kept_text", owner=WRITER) as f:
        f.write("".join(f"{k} {run.nbest[k][0][0]}\n" for k in kept))
    return len(kept)


def ctm_line(key: str, recording: str, start: float, duration: float, word: str, confidence: float) -> str:
    """One Kaldi CTM line, always six fields (``<recording> 1 <start> <dur> <word> <conf>``); a recording id or
    word that would split it is a DataError naming the utterance (it cannot come from a list that was read)."""
    from corpus_io.keys import is_one_token

    line = f"{recording} 1 {start:.2f} {duration:.2f} {word} {confidence:.2f}"
    if not (is_one_token(recording) and is_one_token(word)):
        raise DataError(f"utterance '{key}': its CTM line {line!r} would not be six fields (recording id "
                        f"{recording!r}, word {word!r}); a recording id and a word are one token each. Rename the "
                        f"recording (the list line's 'recording' field).")
    return line + "\n"


def write_kept_list(data_list: str, path: Path, run: DecodeRun, min_confidence: float) -> None:
    """Pseudo-labels: the raw list's utterances whose confidence is at least ``min_confidence``, as canonical
    records (FunASR fields, their ``start``/``end`` kept) with the best hypothesis as ``target``; streamed."""
    import json
    import os

    from corpus_io.storage.files import atomic_write
    from corpus_io.tables.inputs import record_of_line

    base = os.path.dirname(os.path.abspath(data_list))
    with open(data_list, encoding="utf-8") as src, atomic_write(path, owner=WRITER) as f:
        for lineno, line in enumerate(src, 1):
            if not line.strip():
                continue
            rec = record_of_line(json.loads(line), f"{data_list}:{lineno}", base)
            timed = run.timed.get(rec.get("key")) if isinstance(rec, dict) else None
            if timed is None or timed.confidence < min_confidence:
                continue
            rec = {k: v for k, v in rec.items() if k not in ("target_len", "where", "txt")}
            rec["target"] = run.nbest[rec["key"]][0][0]
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def _reference(batch: dict, i: int, tokenizer: Any, ids: list[int]) -> str:
    """The transcript as read (raw line or shard member), not rebuilt from token ids: a token missing from
    the token list would come back as ``<unk>`` and be scored as five characters. The detokenized target
    only for a batch without text (a custom loader)."""
    texts = batch.get("txt")
    if texts is not None and isinstance(texts[i], str):
        return texts[i]
    return tokenizer.decode(ids)


#: the name decode's outputs are recorded under (storage/files.py record_written): the files decode may replace
WRITER = "decode"
KALDI_TABLES = ("text", "wav.scp", "segments", "utt2spk", "spk2utt", "feats.scp", "utt2dur", "reco2dur")
DECODE_OUTPUTS = ("text", "nbest", "ref", "cer.txt", "wer.txt", "ctm", "timestamps.jsonl", "confidence", "kept_text",
                  "kept.list")


def decode_outputs(cfg: Any) -> list[str]:
    """The names of the files this decode writes into ``output_dir`` (by its options)."""
    names = ["text", "nbest", "ref", "cer.txt", "wer.txt"]
    if cfg.timestamps:
        names += ["ctm", "timestamps.jsonl"]
    if cfg.min_confidence > 0:
        names += ["confidence", "kept_text"]
        if cfg.dataset_conf.data_type == "raw" and "://" not in str(cfg.data_list):
            names.append("kept.list")
    return names


def refuse_overwrites(cfg: Any, outputs: tuple[str, ...] = DECODE_OUTPUTS, command: str = "decode") -> None:
    """Before loading anything: refuse an ``output_dir`` that is a URL, a Kaldi data dir (its ``text`` would
    become hypotheses), where an output file is one of the inputs (the list, its index, the checkpoint, or a
    Kaldi table beside the list: the data dir the list was made from), or where a file under an output's name
    exists that decode has no record of writing (a data dir's transcripts beside its JSONL, an edited file):
    decode replaces only its own outputs (``refuse_replacing_others``)."""
    import os

    from corpus_io.config import require
    from corpus_io.model.cmvn import loader_inputs
    from corpus_io.storage.files import refuse_overwriting_inputs, refuse_remote_output

    require(cfg, "data_list", "checkpoint", "output_dir")
    refuse_remote_output(cfg.output_dir, "++output_dir", command)
    out = Path(cfg.output_dir)
    kaldi = [name for name in KALDI_TABLES[1:] if (out / name).is_file()]
    if kaldi and (out / "text").exists():
        raise ConfigError(f"++output_dir={out} is a Kaldi data dir (it holds {', '.join(kaldi)}); {command} writes "
                          f"its outputs into ++output_dir (decode would replace its transcripts, {out / 'text'}). "
                          f"Give {command} its own directory, e.g. ++output_dir=exp/{command}_test.")
    inputs = [*loader_inputs(cfg.data_list, cfg.dataset_conf), ("++checkpoint", cfg.checkpoint)]
    data_dir = os.path.dirname(os.path.abspath(cfg.data_list)) if "://" not in str(cfg.data_list) else ""
    if data_dir and any(os.path.isfile(os.path.join(data_dir, name)) for name in ("wav.scp", "segments", "feats.scp")):
        inputs += [(f"the Kaldi table {name} beside ++data_list", os.path.join(data_dir, name))
                   for name in KALDI_TABLES]
    refuse_overwriting_inputs([(f"++output_dir's {name}", out / name) for name in outputs], inputs)
    refuse_others_outputs(out, decode_outputs(cfg) if command == "decode" else outputs, command)


def refuse_others_outputs(out: Path, names: Iterable[str], command: str) -> None:
    """Before any work: ``command`` (decode, align, score; its name is the writer its outputs are recorded under,
    ``atomic_write(owner=command)``) replaces in ``out`` only the files it wrote, unchanged since (an edited ctm, a
    hand-made flagged list, a data dir's text: refused, naming the file)."""
    from corpus_io.storage.files import refuse_replacing_others

    refuse_replacing_others([(f"++output_dir's {name}", out / name) for name in names], command,
                            way_out=f"Give {command} its own directory (e.g. ++output_dir=exp/{command}_test); if the "
                                    f"file is an earlier {command}'s output you mean to replace (one written before "
                                    f"{command} kept these records), delete it first.")
