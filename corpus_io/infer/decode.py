"""``corpus-io decode``: a raw or shard list through the model and a search (``decoding.method``: greedy,
CTC prefix beam, beam + n-gram LM, attention rescoring), a Kaldi ``text`` of hypotheses, the n-best and a
CER/WER report with the real-time factor (model and search apart) and the most frequent confusions; with
``++timestamps=true`` a Kaldi ``ctm`` and ``timestamps.jsonl`` (token and word times and confidences of each best
hypothesis, :mod:`corpus_io.decoding.align`), with ``++min_confidence`` the confident utterances' ``kept_text``.

The model and tokenizer come from the checkpoint's resolved training config; feature extraction
(``feats_type``, ``feats_on``, ``fbank_conf``/``mfcc_conf``, ``resample_conf``) too, so decoding sees the same
features as training. The user's ``dataset_conf`` chooses the list format, batching and error policy;
shuffling and augmentation are always off.

Memory is flat in the list's size: each utterance's row (its n-best, reference, times) goes to disk as it is decoded,
is sorted on disk (:func:`corpus_io.storage.sorting.sort_file`), and the outputs are written in passes over the sorted
rows; the report's counts accumulate, its per-utterance lines go to a file. ``++num_jobs=N ++job_index=J``: job J
decodes its contiguous share of the list (a raw list's lines, a shard list's shards, as score) into
``output_dir/decode.part-J-of-N/`` (its rows and its undecoded references, each in key order) plus a part record;
``merge-jobs ++path=<output_dir>`` merges the parts' rows and writes the outputs one job writes (:func:`merge_parts`).
"""

from __future__ import annotations

import json
import sys
import tempfile
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
    hypotheses), ``nbest`` (key, rank, score, text), ``ref`` and ``cer.txt`` / ``wer.txt`` to output_dir. With
    ``++num_jobs=N`` (N > 1) this is job J of N (:mod:`corpus_io.jobs.parts`): it decodes its contiguous share of the
    list into ``output_dir/decode.part-J-of-N/`` (``rows.jsonl``, ``missing.jsonl``) and a part record, writing no
    final file; ``merge-jobs ++path=<output_dir>`` writes the bytes one job writes."""
    from corpus_io.infer.list_jobs import ListJob, list_job
    from corpus_io.jobs import parts as jobs
    from corpus_io.storage.progress import Summary

    job = jobs.job_of(cfg)
    refuse_overwrites(cfg)  # first: before torch is imported or anything is read
    ran = list_job(cfg, job, TAG, lambda: fingerprint(cfg),
                   lambda data_list, out, job: decode_list(cfg, data_list, out, job=job), empty_part)
    if not isinstance(ran, ListJob):  # one job, or a job its record proves done
        return ran
    got = ran.result
    result = {"utts": got["decoded"], "missing": got.pop("missing_keys"), "wall_seconds": round(got["wall_s"], 3)}
    summary = Summary(what="utterances", kept=got["decoded"], seconds=got["audio"])
    jobs.write_part(ran.place, jobs.Part(
        TAG, ran.place.tag, job.count, job.index, ran.fingerprint, list(ran.span), ran.total,
        [jobs.output_entry(ran.folder / name, ran.place.directory) for name in PART_FILES],
        {"keys": got.pop("keys"), "summary": jobs.summary_data(summary), "run": got,
         "options": output_options(cfg, got.get("method")), "result": result}))
    print(f"decode {job}: {got['decoded']} utterances -> {ran.folder / 'rows.jsonl'}; merge-jobs "
          f"++path={cfg.output_dir} writes the outputs when all {job.count} are done", flush=True)
    return result


#: the part records' tag (jobs.Place), and a job's files in its part directory: its rows (each decoded utterance's
#: n-best, reference, times; key order) and the references it did not decode (key order)
TAG = "decode"
PART_FILES = ("rows.jsonl", "missing.jsonl")


def fingerprint(cfg: Any) -> str:
    """The options' and inputs' digest the parts of one run share: the list's bytes, the checkpoint's, every key
    that changes an output (not the device, nor the loader's workers)."""
    from corpus_io.config import to_dict
    from corpus_io.infer.foreign import checkpoint_files
    from corpus_io.jobs import parts as jobs
    from corpus_io.tables.inputs import resolve_input

    files = list(resolve_input(cfg.data_list).files) or [cfg.data_list]
    conf = {k: v for k, v in to_dict(cfg.dataset_conf).items() if k not in ("num_workers", "prefetch")}
    options = [to_dict(cfg.decoding), cfg.chunk_seconds, cfg.decoding_chunk_size, cfg.num_decoding_left_chunks,
               cfg.timestamps, cfg.min_confidence, to_dict(cfg.text_rule)]
    return jobs.fingerprint([TAG, jobs.files_digest(files), jobs.files_digest(checkpoint_files(cfg.checkpoint)),
                             options, conf])


def output_options(cfg: Any, method: str | None) -> dict:
    """What the outputs are written with (:func:`write_results`), kept in a part record for merge-jobs."""
    return {"method": method, "nbest": cfg.decoding.nbest, "timestamps": bool(cfg.timestamps),
            "min_confidence": float(cfg.min_confidence), "data_list": str(cfg.data_list),
            "data_type": cfg.dataset_conf.data_type}


def empty_part(folder: Path) -> dict:
    """A job past the list's entries: empty files, no model loaded."""
    from corpus_io.storage.files import ensure_dir

    ensure_dir(folder, what="output_dir")
    for name in PART_FILES:
        (folder / name).write_bytes(b"")
    return {**run_totals(DecodeRun()), "loader": {}, "decoded": 0, "keys": [], "missing_keys": [], "method": None}


def run_totals(run: DecodeRun) -> dict:
    """A run's figures that the outputs need besides its rows (what a part record keeps of them)."""
    return {"audio": run.audio, "model_s": run.model_s, "search_s": run.search_s, "wall_s": run.wall_s,
            "skipped": run.skipped, "unread": run.unread, "unread_shards": run.unread_shards,
            "hotwords": run.hotwords, "repeats": run.repeats}


def decode_list(cfg: Any, data_list: str, out: Path, *, job: Any = None) -> dict:
    """Decode ``data_list``: the whole run's outputs in ``out``, or with ``job`` its rows and undecoded references
    (:data:`PART_FILES`) in ``out`` and what its part record keeps."""
    from corpus_io.decoding.search import NEEDS_ENCODER, Search, check_options
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.storage.files import atomic_write, ensure_dir, refuse_overwriting_inputs

    check_options(cfg.decoding)
    device = decode_device(cfg.device)
    model, tokenizer, tcfg = load_model(cfg.checkpoint, device, cfg.text_rule)
    check_repeated_keys(data_list, cfg.dataset_conf, "decode")
    refuse_overwriting_inputs([(f"++output_dir's {name}", Path(cfg.output_dir) / name) for name in DECODE_OUTPUTS],
                              checkpoint_inputs(cfg.checkpoint, tcfg))
    conf = decode_dataset_conf(cfg.dataset_conf, tcfg.dataset_conf)
    loader = build_dataloader(data_list, conf, tokenizer, train=False, rank=0, world_size=1)
    search = Search(cfg.decoding, tokenizer, model, device)
    timing = cfg.timestamps or cfg.min_confidence > 0
    batches = forward_batches(loader, model, tokenizer, conf, device, encoder=cfg.decoding.method in NEEDS_ENCODER,
                              desc=f"decode ({cfg.decoding.method})", speech=timing, chunk_seconds=cfg.chunk_seconds,
                              streaming=streaming_options(cfg, model), source=(cfg.checkpoint, cfg.data_list))
    ensure_dir(out, what="output_dir")
    counted = reference_tokens(tokenizer)
    with tempfile.TemporaryDirectory(prefix=".decode-rows-", dir=out) as tmp:
        spill = Path(tmp) / "spill.jsonl"
        with open(spill, "w", encoding="utf-8") as f:
            run = run_search(cfg.decoding, batches, tokenizer, search, where=data_list,
                             skipped=skipped_summary(loader),
                             frame_seconds=output_frame_seconds(model, conf) if timing else None,
                             rows=lambda row: f.write(json.dumps(counted(row), ensure_ascii=False) + "\n"),
                             nbest=cfg.decoding.nbest)
        rows, missing = (out, out) if job is not None else (Path(tmp), Path(tmp))
        keys: list[str] | None = [] if job is not None else None
        with atomic_write(rows / "rows.jsonl") as f:
            run.decoded = sorted_rows(spill, f, run, Path(tmp), keys)
        spill.unlink()
        with atomic_write(missing / "missing.jsonl") as f:
            missing_keys = missing_rows(rows / "rows.jsonl", list_references(data_list, conf, run.unread,
                                                                               run.unread_shards)
                                        if loader_dropped(loader) else iter(()), f, Path(tmp), counted)
        if job is not None:
            from corpus_io.model.cmvn import loader_counts

            return {**run_totals(run), "loader": dict(loader_counts(loader)), "decoded": run.decoded, "keys": keys,
                    "missing_keys": missing_keys, "method": search.description}
        result = write_results(out, rows / "rows.jsonl", missing / "missing.jsonl", run_totals(run),
                               output_options(cfg, search.description), tmp=Path(tmp))
    report(out, result, run_totals(run), output_options(cfg, search.description))
    return {k: v for k, v in result.items() if k != "summary"}


def report(out: Path, result: dict, totals: dict, options: dict) -> None:
    """decode's closing lines (the run's figures, the summary, where each output went)."""
    print(f"decode: {result['utts']} utterances ({totals['audio'] / 3600:.3f} h), {options['method']}, "
          f"RTF {result['rtf']:.4f} (model {result['rtf_model']:.4f}, search {result['rtf_search']:.4f}), "
          f"loader skips/filters: {totals['skipped']}")
    print(result["summary"].rstrip())
    print(f"decode: hypotheses -> {out / 'text'}, n-best -> {out / 'nbest'}, report -> {out / 'cer.txt'}")
    if options["timestamps"]:
        print(f"decode: word times -> {out / 'ctm'}, tokens and words -> {out / 'timestamps.jsonl'}")
    if options["min_confidence"] > 0:
        kept_list = f", as a raw list with the hypotheses as transcripts -> {out / 'kept.list'}" \
            if writes_kept_list(options) else ""
        print(f"decode: {result['kept']} of {result['utts']} utterances have confidence >= "
              f"{options['min_confidence']} -> {out / 'kept_text'}{kept_list} (every utterance's: "
              f"{out / 'confidence'})")


def writes_kept_list(options: dict) -> bool:
    """Whether ``kept.list`` is written: pseudo-labels of a local raw list."""
    return options["min_confidence"] > 0 and options["data_type"] == "raw" and "://" not in options["data_list"]


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
    decoded: int = 0  # utterances decoded (each repeat of a key once: the rows kept)


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
               command: str = "decode", rows: Callable[[dict], Any] | None = None, nbest: int = 1000) -> DecodeRun:
    """The search over the model's outputs (timed apart from the model); n-best lists by key. With
    ``frame_seconds`` (seconds per output frame) each best hypothesis is also aligned: times and confidences in
    ``run.timed``. With ``rows``, each utterance's result goes to ``rows`` as it is made (:func:`result_row`, its
    first ``nbest`` hypotheses) instead of into ``run``: nothing of it is held (a repeated key is found when the rows
    are sorted, :func:`sorted_rows`)."""
    run = DecodeRun(hotwords=search.hotwords)
    t_start = time.perf_counter()
    for fw in batches:
        t1 = time.perf_counter()
        hyps_of = search(fw.log_probs, fw.lengths, fw.encoder)
        run.search_s += time.perf_counter() - t1
        run.model_s += fw.seconds
        unbiased = {}
        if search.context is not None:  # the same search without hotwords: recall before and after
            for key, hyps in zip(fw.keys, search.unbiased(fw.log_probs, fw.lengths, fw.encoder)):
                unbiased[key] = tokenizer.decode(hyps[0].ids) if hyps else ""
        placed = _align_batch(run, fw, hyps_of, tokenizer, frame_seconds) if frame_seconds is not None else {}
        for key, ref, hyps in zip(fw.keys, fw.refs, hyps_of):
            best = [(tokenizer.decode(h.ids), h.score) for h in hyps] or [("", float("-inf"))]
            if rows is not None:
                rows(result_row(key, ref, best[:max(1, nbest)], unbiased.get(key), placed.get(key)))
                run.decoded += 1
                continue
            if key in run.nbest:  # scored once; a silent overwrite would hide an utterance from the count
                run.repeats[key] = run.repeats.get(key, 1) + 1
            run.nbest[key], run.refs[key] = best, ref
            if key in unbiased:
                run.unbiased[key] = unbiased[key]
            if key in placed:
                run.timed[key] = placed[key][0]
                if placed[key][1] is not None:
                    run.segments[key] = placed[key][1]
        run.audio += fw.audio
    run.wall_s = time.perf_counter() - t_start
    run.skipped = skipped()
    run.decoded = run.decoded if rows is not None else len(run.nbest)
    if not run.decoded:
        raise DataError(f"{command} read 0 utterances from {where} (loader skips/filters: {run.skipped}); nothing "
                        f"was scored or written. Check the list, its paths or URLs and dataset_conf.on_error.")
    if run.repeats:
        warn_repeats(run.repeats)
    return run


def warn_repeats(repeats: dict) -> None:
    first = next(iter(repeats))
    print(f"warning: {len(repeats)} keys were decoded more than once (e.g. '{first}' {repeats[first]} times); each "
          f"is scored once. Find them with verify-shards and give every utterance its own key.", file=sys.stderr,
          flush=True)


def result_row(key: str, ref: str, hyps: list, unbiased: str | None, placed: tuple | None) -> dict:
    """One decoded utterance as a row of ``rows.jsonl``: its key, reference, n-best ``[text, score]``, the best
    hypothesis of the search without hotwords, and with ``placed`` (:func:`_align_batch`) its times (``[text, start,
    end, confidence]`` of each word and token) and where a raw segment lies (``[recording, start]``)."""
    row: dict = {"key": str(key), "ref": ref, "nbest": [list(h) for h in hyps]}
    if unbiased is not None:
        row["unbiased"] = unbiased
    if placed is not None:
        timed, segment = placed
        row["timed"] = {"confidence": timed.confidence,
                        "words": [[w.text, w.start, w.end, w.confidence] for w in timed.words],
                        "tokens": [[t.text, t.start, t.end, t.confidence] for t in timed.tokens]}
        if segment is not None:
            row["segment"] = [segment[0], segment[1]]
    return row


def _align_batch(run: DecodeRun, fw: Forward, nbest: list, tokenizer: Any, frame_seconds: float) -> dict:
    """Each utterance's best hypothesis force-aligned to its frames: ``{key: (align.Timed, [recording, start] of a
    raw segment or None)}``: token and word times, confidences."""
    from corpus_io.decoding.align import align
    from corpus_io.decoding.scoring import word_units

    placed = {}
    lengths = fw.lengths.tolist()
    for i, (key, hyps) in enumerate(zip(fw.keys, nbest)):
        ids = hyps[0].ids if hyps else []
        duration = fw.durations[i] if i < len(fw.durations) else None
        speech = fw.speech[i] if fw.speech is not None and fw.own_rule else None
        timed = align(fw.log_probs[i, : int(lengths[i])], ids, tokenizer.decode, word_units,
                      frame_seconds=frame_seconds, duration=duration, blank=tokenizer.blank_id,
                      speech=speech, speech_seconds=fw.speech_seconds,
                      offset_seconds=fw.frame_offset if fw.own_rule else 0.0)
        segment = None
        if fw.segments is not None and fw.segments[i] is not None:
            segment = fw.segments[i]
            if segment[0] not in run.recordings:  # a list's field was checked when read; a file's name is not
                from corpus_io.keys import recording_id

                run.recordings.add(recording_id(str(segment[0]), f"segment '{key}' (its recording id is the "
                                                                 f"line's 'recording' field, else its audio "
                                                                 f"file's name)"))
        placed[key] = (timed, segment)
    return placed


def skipped_summary(loader: Any) -> Callable[[], str]:
    from corpus_io.model.cmvn import loader_counts

    return lambda: skipped_text(loader_counts(loader))


def skipped_text(counts: dict) -> str:
    """The loader's counts as the report says them (``reason: n, ...``, or ``none``)."""
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"


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


def reference_tokens(tokenizer: Any) -> Callable[[dict], dict]:
    """A row given its reference's tokens as the report counts them (``tokens``: how many, ``oov``: those outside
    the token list, :func:`corpus_io.decoding.scoring.oov_of`), counted where the tokenizer is: merge-jobs has none."""
    from corpus_io.decoding.scoring import oov_of, token_list_covers

    covered = token_list_covers([s for s in tokenizer.symbols if s not in tokenizer.specials])

    def counted(row: dict) -> dict:
        row["tokens"], unknown = oov_of(tokenizer.tokenize(row["ref"]), covered)
        if unknown:
            row["oov"] = unknown
        return row

    return counted


def read_rows(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def sorted_rows(spill: Path, f: Any, run: DecodeRun, tmp: Path, keys: list | None = None) -> int:
    """The rows of ``spill`` (as decoded) written to ``f`` in key order, a key decoded more than once kept once (its
    last row, as the search's last word on it) and counted in ``run.repeats`` (a warning names it); ``keys`` gets each
    key. Returns the rows written."""
    from itertools import groupby

    from corpus_io.storage.sorting import jsonl_key, sort_file

    with tempfile.TemporaryDirectory(prefix="sort-", dir=tmp) as work:
        ordered = Path(work) / "sorted.jsonl"
        with open(ordered, "w", encoding="utf-8", newline="") as g:
            sort_file(spill, jsonl_key, g, Path(work))
        n = 0
        with open(ordered, encoding="utf-8", newline="") as g:
            for key, group in groupby(g, key=jsonl_key):
                lines = list(group)
                if len(lines) > 1:  # scored once; a silent overwrite would hide an utterance from the count
                    run.repeats[key] = len(lines)
                f.write(lines[-1])
                n += 1
                if keys is not None:
                    keys.append(key)
    if run.repeats:
        warn_repeats(run.repeats)
    return n


def missing_rows(rows: Path, references: Iterable[tuple[str, str]], f: Any, tmp: Path,
                 counted: Callable[[dict], dict]) -> list[str]:
    """The ``references`` (every utterance of the list, when the loader dropped some; the first of a repeated key)
    that ``rows`` (key order) has no row of, written to ``f`` in key order as ``{"key", "ref", ...}`` rows (scored as
    all deletions, named); returns their keys. Both sides are sorted on disk: no key set is held."""
    from corpus_io.storage.sorting import jsonl_key, sort_file

    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="refs-", dir=tmp) as work:
        listed = Path(work) / "refs.jsonl"
        with open(listed, "w", encoding="utf-8", newline="") as g:
            for key, ref in references:
                g.write(json.dumps({"key": key, "ref": ref}, ensure_ascii=False) + "\n")
        ordered = Path(work) / "sorted.jsonl"
        with open(ordered, "w", encoding="utf-8", newline="") as g:
            sort_file(listed, jsonl_key, g, Path(work))
        decoded = (row["key"] for row in read_rows(rows))
        at, last = next(decoded, None), None
        for row in read_rows(ordered):
            if row["key"] == last:
                continue
            last = row["key"]
            while at is not None and at < last:
                at = next(decoded, None)
            if at != last:
                f.write(json.dumps(counted(row), ensure_ascii=False) + "\n")
                missing.append(last)
    return missing


def write_results(out: Path, rows: Path, missing: Path, totals: dict, options: dict, *, tmp: Path) -> dict:
    """The outputs from ``rows`` (each decoded utterance's, key order: :func:`result_row`) and ``missing`` (the
    references not decoded, key order), in passes over them: ``text``, ``nbest``, ``ref``, ``cer.txt``/``wer.txt``
    (the report: method, RTF, scores, confusions); with ``timestamps`` ``ctm`` and ``timestamps.jsonl``; with
    ``min_confidence`` > 0 ``confidence``, ``kept_text`` and, for a local raw list, ``kept.list``. ``totals``
    (:func:`run_totals`) and ``options`` (:func:`output_options`) are the run's. Only counts are held: the report's
    utterance lines go to a file in ``tmp``, the times are sorted on disk."""
    import heapq
    import shutil
    from contextlib import ExitStack

    from corpus_io.decoding.scoring import Scorer
    from corpus_io.storage.files import atomic_write, ensure_dir

    ensure_dir(out, what="output_dir")
    limit, floor = options["nbest"], options["min_confidence"]
    with tempfile.TemporaryDirectory(prefix=".decode-out-", dir=tmp) as work, ExitStack() as files:
        work = Path(work)
        lines = files.enter_context(open(work / "lines", "w", encoding="utf-8", newline=""))
        placed = files.enter_context(open(work / "placed.jsonl", "w", encoding="utf-8", newline=""))
        text = files.enter_context(atomic_write(out / "text", owner=WRITER))
        nbest = files.enter_context(atomic_write(out / "nbest", owner=WRITER))
        if floor > 0:
            confidence = files.enter_context(atomic_write(out / "confidence", owner=WRITER))
            kept_text = files.enter_context(atomic_write(out / "kept_text", owner=WRITER))
        scorer = Scorer(hotwords=list(totals["hotwords"]), unread=list(totals["unread"]), sink=lines.write)
        utts = timed = kept = 0
        for row in read_rows(rows):
            key, best = row["key"], row["nbest"][0][0]
            text.write(f"{key} {best}\n")
            nbest.write("".join(f"{key} {r} {sc:.4f} {t}\n" for r, (t, sc) in enumerate(row["nbest"][:limit], 1)))
            scorer.add(key, row["ref"], best, unbiased=row.get("unbiased"))
            scorer.add_oov(row["tokens"], row.get("oov", []))
            utts += 1
            if "timed" not in row:
                continue
            timed += 1
            if options["timestamps"]:
                placed.write(json.dumps([*place_of(row), key, row], ensure_ascii=False) + "\n")
            if floor > 0:
                confidence.write(f"{key} {row['timed']['confidence']:.4f}\n")
                if row["timed"]["confidence"] >= floor:
                    kept_text.write(f"{key} {best}\n")
                    kept += 1
        for row in read_rows(missing):
            scorer.add_missing(row["key"], row["ref"], why=totals["skipped"])
            scorer.add_oov(row["tokens"], row.get("oov", []))
        lines.close()
        placed.close()
        # the whole reference: an utterance not decoded has no line in text
        with atomic_write(out / "ref", owner=WRITER) as f:
            both = heapq.merge(((r["key"], r["ref"]) for r in read_rows(rows)),
                               ((r["key"], r["ref"]) for r in read_rows(missing)), key=lambda kr: kr[0])
            f.writelines(f"{k} {ref}\n" for k, ref in both)
        audio = max(totals["audio"], 1e-9)
        timing = {"rtf": totals["wall_s"] / audio, "rtf_model": totals["model_s"] / audio,
                  "rtf_search": totals["search_s"] / audio}
        head = (f"decoding: {options['method']}\n"
                f"RTF {timing['rtf']:.4f} (wall {totals['wall_s']:.2f}s / audio {totals['audio']:.2f}s; model "
                f"{timing['rtf_model']:.4f}, search {timing['rtf_search']:.4f})\n")
        for name in ("cer.txt", "wer.txt"):
            with atomic_write(out / name, owner=WRITER) as f, open(work / "lines", encoding="utf-8", newline="") as g:
                f.write(head + scorer.report())  # its counts and confusions; the utterances' lines follow
                shutil.copyfileobj(g, f)
        if options["timestamps"]:
            write_timed(out, work / "placed.jsonl", work)
        if writes_kept_list(options):
            write_kept_list(options["data_list"], out / "kept.list", rows, floor, work)
    return {"utts": utts, "missing": list(scorer.missing), "kept": kept if floor > 0 else timed,
            "cer": scorer.cer.rate, "wer": scorer.wer.rate, **timing,
            "rtf_wall": timing["rtf"], "hotword_recall": scorer.hotword_recall(),
            "summary": head + scorer.summary()}


def place_of(row: dict) -> tuple[str, float]:
    """Where a row's times are: a raw segment's recording id and start, else the utterance itself from 0."""
    seg = row.get("segment")
    return (str(seg[0]), float(seg[1])) if seg else (row["key"], 0.0)


def write_timed(out: Path, placed: Path, tmp: Path) -> None:
    """``ctm`` and ``timestamps.jsonl`` from ``placed`` (``[recording, offset, key, row]`` lines), sorted on disk by
    time in the recording. Times are seconds in the recording: a raw segment's are shifted by its start and named by
    its recording id (Kaldi's CTM), anything else's are the utterance's own."""
    from corpus_io.storage.files import atomic_write
    from corpus_io.storage.sorting import sort_file

    ordered = tmp / "placed.sorted.jsonl"
    with open(ordered, "w", encoding="utf-8", newline="") as g:
        sort_file(placed, lambda line: tuple(json.loads(line)[:3]), g, tmp)
    with atomic_write(out / "ctm", owner=WRITER) as ctm, atomic_write(out / "timestamps.jsonl", owner=WRITER) as f:
        for name, offset, key, row in read_rows(ordered):
            timed = row["timed"]
            for word, start, end, confidence in timed["words"]:
                ctm.write(ctm_line(key, name, start + offset, end - start, word, confidence))
            rec: dict = {"key": key, "text": row["nbest"][0][0], "confidence": round(timed["confidence"], 4)}
            if "segment" in row:
                rec.update(recording=name, offset=offset)
            rec["words"] = [{"word": w, "start": round(a + offset, 3), "end": round(b + offset, 3),
                             "confidence": round(c, 4)} for w, a, b, c in timed["words"]]
            rec["tokens"] = [{"token": t, "start": round(a + offset, 3), "end": round(b + offset, 3),
                              "confidence": round(c, 4)} for t, a, b, c in timed["tokens"]]
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


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


def write_kept_list(data_list: str, path: Path, rows: Path, min_confidence: float, tmp: Path) -> None:
    """Pseudo-labels: the raw list's utterances whose confidence is at least ``min_confidence``, as canonical
    records (FunASR fields, their ``start``/``end`` kept) with the best hypothesis as ``target``, in the list's
    order. The list's records and ``rows`` (key order) are joined on disk: sorted by key, then back by line."""
    import os

    from corpus_io.storage.files import atomic_write
    from corpus_io.storage.sorting import sort_file
    from corpus_io.tables.inputs import record_of_line

    base = os.path.dirname(os.path.abspath(data_list))
    listed, chosen = tmp / "listed.jsonl", tmp / "chosen.jsonl"
    with open(data_list, encoding="utf-8") as src, open(listed, "w", encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(src, 1):
            if not line.strip():
                continue
            rec = record_of_line(json.loads(line), f"{data_list}:{lineno}", base)
            if isinstance(rec, dict) and isinstance(rec.get("key"), str):
                f.write(json.dumps([rec["key"], lineno, rec], ensure_ascii=False) + "\n")
    by_key = tmp / "listed.sorted.jsonl"
    with open(by_key, "w", encoding="utf-8", newline="") as f:
        sort_file(listed, lambda line: json.loads(line)[0], f, tmp)
    confident = ((r["key"], r["nbest"][0][0]) for r in read_rows(rows)
                 if "timed" in r and r["timed"]["confidence"] >= min_confidence)
    with open(chosen, "w", encoding="utf-8", newline="") as f:
        at = next(confident, None)
        for key, lineno, rec in read_rows(by_key):
            while at is not None and at[0] < key:
                at = next(confident, None)
            if at is None or at[0] != key:
                continue
            rec = {k: v for k, v in rec.items() if k not in ("target_len", "where", "txt")}
            rec["target"] = at[1]
            f.write(json.dumps([lineno, rec], ensure_ascii=False) + "\n")
    with atomic_write(path, owner=WRITER) as f:
        by_line = tmp / "chosen.sorted.jsonl"
        with open(by_line, "w", encoding="utf-8", newline="") as g:
            sort_file(chosen, lambda line: json.loads(line)[0], g, tmp)
        for _, rec in read_rows(by_line):
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
    return outputs_of(output_options(cfg, None))


def outputs_of(options: dict) -> list[str]:
    """The names of the files a decode with these :func:`output_options` writes."""
    names = ["text", "nbest", "ref", "cer.txt", "wer.txt"]
    if options["timestamps"]:
        names += ["ctm", "timestamps.jsonl"]
    if options["min_confidence"] > 0:
        names += ["confidence", "kept_text"]
        if writes_kept_list(options):
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


# --------------------------------------------------------------------------- merge-jobs


def part_keys(data: dict) -> list[str]:
    """The utterances a decode part decoded (merge-jobs refuses a key two parts hold)."""
    return data["keys"]


#: a decode part's run figures (:func:`run_totals`, the loader's counts) and the options it keeps
RUN_FIGURES = ("audio", "model_s", "search_s", "wall_s")
OPTION_KEYS = ("method", "nbest", "timestamps", "min_confidence", "data_list", "data_type")


def check_part(part: Any) -> None:
    """merge-jobs: a decode record's keys, run figures, options and its two files in its part directory
    (:class:`corpus_io.jobs.parts.RecordProblem` on the first field that cannot be trusted)."""
    from corpus_io.jobs import parts as jobs

    data = part.data
    for i, key in enumerate(jobs.of_type(data.get("keys"), "data.keys", list, "a list")):
        if not isinstance(key, str) or not key:
            raise jobs.bad(f"data.keys[{i}]", key, "not an utterance key")
    run = jobs.of_type(data.get("run"), "data.run", dict, "a JSON object")
    for name in RUN_FIGURES:
        jobs.seconds(run.get(name), f"data.run.{name}")
    for reason, n in jobs.of_type(run.get("loader"), "data.run.loader", dict, "a JSON object").items():
        jobs.whole(n, f"data.run.loader[{reason!r}]")
    for name, kind in (("unread", list), ("unread_shards", dict), ("hotwords", list), ("repeats", dict)):
        jobs.of_type(run.get(name), f"data.run.{name}", kind, f"a JSON {'array' if kind is list else 'object'}")
    options = jobs.of_type(data.get("options"), "data.options", dict, "a JSON object")
    if sorted(options) != sorted(OPTION_KEYS):
        raise jobs.bad("data.options", sorted(options), f"but a decode job keeps {list(OPTION_KEYS)}")
    folder = Path(part.where).name[: -len(".json")]
    want = [f"{folder}/{name}" for name in PART_FILES]
    if [out.get("file") for out in part.outputs] != want:
        raise jobs.bad("outputs", [out.get("file") for out in part.outputs], f"but a decode job writes {want}")


def merge_parts(place: Any, parts: list) -> dict:
    """``merge-jobs`` of decode: the parts' rows (each in key order) merged in key order, their undecoded references
    too, and the outputs written from them as one job writes them (:func:`write_results`); the figures summed (the
    wall time: the longest job's, the jobs ran side by side)."""
    from collections import Counter

    from corpus_io.storage.sorting import jsonl_key, merge_sorted

    out = Path(place.path)
    totals: dict = {**run_totals(DecodeRun()), "loader": Counter()}
    options: dict | None = None
    for p in parts:
        data = p.payload()  # read again from its record when load_parts let it go: once a part
        got = data["run"]
        for name in ("audio", "model_s", "search_s"):
            totals[name] += got[name]
        totals["wall_s"] = max(totals["wall_s"], got["wall_s"])
        totals["loader"].update(got["loader"])
        totals["unread"] += got["unread"]
        totals["unread_shards"].update(got["unread_shards"])
        totals["repeats"].update(got["repeats"])
        if data["options"]["method"] is not None and options is None:  # a job past the list loaded no model
            options, totals["hotwords"] = data["options"], got["hotwords"]
    if options is None:
        first = parts[0].payload()["options"]
        raise DataError(f"decode read 0 utterances from {first['data_list']} in all {len(parts)} jobs; nothing was "
                        f"scored or written. Check the list, its paths or URLs and dataset_conf.on_error.")
    refuse_others_outputs(out, outputs_of(options), WRITER)
    totals["skipped"] = skipped_text(totals.pop("loader"))
    with tempfile.TemporaryDirectory(prefix=".decode-merge-", dir=out) as tmp:
        merged = {}
        for k, name in enumerate(PART_FILES):
            merged[name] = Path(tmp) / name
            with open(merged[name], "w", encoding="utf-8", newline="") as f:
                merge_sorted([Path(p.where).parent / p.outputs[k]["file"] for p in parts], jsonl_key, f, Path(tmp))
        result = write_results(out, merged["rows.jsonl"], merged["missing.jsonl"], totals, options, tmp=Path(tmp))
    report(out, result, totals, options)
    return {k: v for k, v in result.items() if k != "summary"}
