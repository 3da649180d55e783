"""Schemas of the training family: train (with train_conf, optim_conf, scheduler_conf), decode, transcribe,
compute-cmvn, average, export-model and bench-loader."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from corpus_io.config.checks import schema
from corpus_io.config.dataset import DatasetConf, FilterConf, TokenizerConf
from corpus_io.config.fields import executor_address_opt, executor_opt, job_index_opt, num_jobs_opt, opt
from corpus_io.errors import ConfigError


@schema
class TrainConf:
    max_epoch: int = opt(10, "epochs to train", range="[1, 1000000]")
    log_interval: int = opt(10, "steps between log lines", unit="steps", range="[1, 1000000000]")
    resume: bool = opt(True, "continue from output_dir/model.pt with the exact data position")
    overwrite_output_dir: bool = opt(False, "a run that starts afresh (resume=false, or no model.pt) into an "
                                            "output_dir holding another run's checkpoints deletes them first "
                                            "(model.pt*, cv_metrics.json, key lists); false: it is refused, so "
                                            "two runs' epochs are never averaged together")
    validate_interval: int = opt(0, "steps between validations (0: at each epoch end; -1: with each mid-epoch "
                                    "checkpoint, as FunASR)", unit="steps", range="[-1, 1000000000]")
    save_checkpoint_interval: int = opt(0, "steps between mid-epoch checkpoints (0: epoch ends only)",
                                        unit="steps", range="[0, 1000000000]")
    keep_nbest_models: int = opt(5, "keep this many epoch checkpoints, best by the cv metric", range="[0, 100000]")
    avg_nbest_model: int = opt(5, "average this many best epoch checkpoints into model.pt.avg{N}", range="[0, 100000]")
    avg_keep_nbest_models_type: str = opt("loss", "cv metric that ranks checkpoints", choices=("loss", "acc"))
    accum_grad: int = opt(1, "micro-batches per optimizer step", range="[1, 10000]")
    grad_clip: float = opt(5.0, "max gradient norm (<= 0: off)", range="(-inf, inf)")
    max_nonfinite_steps: int = opt(20, "optimizer steps in a row with a non-finite loss or gradient norm (each is "
                                       "skipped and counted) before training stops with an error",
                                   unit="steps", range="[1, 1000000]")
    use_fp16: bool = opt(False, "float16 autocast with a grad scaler (GPU)")
    use_bf16: bool = opt(False, "bfloat16 autocast (CPU or GPU)")
    max_steps_per_epoch: int = opt(0, "step mode: an epoch ends after this many steps (0: one pass)",
                                   unit="steps", range="[0, 1000000000000]")
    seed: int = opt(1234, "seed of model init and dropout", range="[0, 4294967295]")
    num_threads: int = opt(1, "torch intra-op threads of each rank: set by train, not inherited (OMP_NUM_THREADS, "
                              "the machine's cores), because another count sums in another order and trains other "
                              "weights; raise it for one-process CPU training", range="[1, 1024]")
    deterministic: bool = opt(True, "deterministic kernels where torch has them (torch.use_deterministic_algorithms, "
                                    "warning where it has none), so one command trains the same weights each run")
    device: str = opt("auto", "auto: cuda when available, else cpu", choices=("auto", "cpu", "cuda"))
    timeout_s: int = opt(600, "collective timeout", unit="seconds", range="[1, 604800]")
    dump_trained_keys: bool = opt(False, "debug: write output_dir/trained_keys.rank{R}.txt ('epoch key' per trained "
                                         "utterance, cut back to the checkpoint on resume) and unused_keys.rank{R}.txt")
    ignore_init_mismatch: bool = opt(False, "init_param: the tensors whose shape differs from the checkpoint's (the "
                                            "output layer of a new token list), or that it lacks, start from their "
                                            "fresh init, named in the log; false: an error before training")
    debug_fail_at_step: int = opt(0, "debug: rank 0 raises at this global step on the first torchrun attempt "
                                     "(tests --max-restarts); 0: off", unit="steps",
                                  range="[0, 1000000000000]")


def resolve_intervals(tc: Any) -> None:
    """Check the step intervals of ``train_conf`` and give FunASR's ``validate_interval=-1`` its meaning.

    ``log_interval`` >= 1. ``save_checkpoint_interval``: 0 (epoch ends only) or >= 1 steps.
    ``validate_interval``: 0 (epoch ends), >= 1 steps, or -1: with every mid-epoch checkpoint, as FunASR's
    trainer sets it (``validate_interval = save_checkpoint_interval``). FunASR's code runs
    ``step % -1 == 0`` at every step for ``save_checkpoint_interval=-1``, which nobody means by -1, so that
    one is an error asking for 1 or 0.
    """
    if tc.log_interval < 1:
        raise ConfigError(f"train_conf.log_interval={tc.log_interval}: it is the number of steps between log "
                          f"lines and must be at least 1, e.g. ++train_conf.log_interval=10.")
    if tc.save_checkpoint_interval == -1:
        raise ConfigError("train_conf.save_checkpoint_interval=-1 is ambiguous: FunASR's trainer then saves at "
                          "every step (step % -1 == 0). Set ++train_conf.save_checkpoint_interval=0 for checkpoints "
                          "at epoch ends only, or a number of steps (1: every step).")
    if tc.save_checkpoint_interval < 0:
        raise ConfigError(f"train_conf.save_checkpoint_interval={tc.save_checkpoint_interval} must be 0 (epoch ends "
                          f"only) or a number of steps >= 1.")
    if tc.validate_interval == -1:
        tc.validate_interval = tc.save_checkpoint_interval
    elif tc.validate_interval < 0:
        raise ConfigError(f"train_conf.validate_interval={tc.validate_interval} must be 0 (epoch ends), a number of "
                          f"steps >= 1, or -1 (with every mid-epoch checkpoint, as in FunASR).")


@schema
class OptimConf:
    optim: str = opt("adamw", "optimizer", choices=("adam", "adamw", "sgd"))
    lr: float = opt(0.001, "peak learning rate", range="(0, 10]")
    weight_decay: float = opt(1e-6, "weight decay", range="[0, 10]")


@schema
class SchedulerConf:
    scheduler: str = opt("warmuplr", "warmuplr: linear warmup then inverse sqrt; constant",
                         choices=("warmuplr", "constant"))
    warmup_steps: int = opt(500, "warmup length", unit="steps", range="[0, 1000000000]")



@schema
class BenchLoaderConfig:
    data_list: str = opt("", "the data.list to read (required unless dataset_conf.sources is set)")
    dataset_conf: DatasetConf = opt(factory=DatasetConf)
    tokenizer: TokenizerConf = opt(factory=TokenizerConf)
    epochs: int = opt(1, "epochs to iterate", range="[1, 1000000]")
    max_batches: int = opt(0, "stop each epoch after this many batches (0: all)", range="[0, 1000000000000]")
    dump_keys: Optional[str] = opt(None, "write DIR/keys.rank{R}.epoch{E}.txt in consumption order")
    dump_audio_dir: Optional[str] = opt(None, "write each utterance's final waveform (after reverb/noise/volume, "
                                              "before features) as DIR/<key>.wav (32-bit float)")
    save_state_after: int = opt(0, "save the loader state after this many batches and exit", unit="batches",
                                range="[0, 1000000000000]")
    state_file: Optional[str] = opt(None, "where to save, or resume from, the loader state")
    train: bool = opt(True, "train mode (shuffle, augment) or cv mode")


@schema
class TrainConfig:
    train_data_set_list: str = opt("", "training data.list (required unless dataset_conf.sources is set)")
    valid_data_set_list: Optional[str] = opt(None, "cv data.list (split across ranks)")
    output_dir: str = opt("???", "checkpoints, logs and tensorboard/")
    cmvn_file: Optional[str] = opt(None, "global CMVN stats: compute-cmvn JSON, WeNet JSON, Kaldi cmvn.ark or "
                                         "FunASR am.mvn")
    dataset_conf: DatasetConf = opt(factory=DatasetConf)
    tokenizer: TokenizerConf = opt(factory=TokenizerConf)
    model: Dict[str, Any] = opt(help="the model, built with Hydra _target_", factory=dict, group="model")
    init_param: Optional[str] = opt(None, "start from this corpus-io checkpoint's model weights (model.pt, "
                                          "model.pt.ep{E}, model.pt.avg{N}, an s3:// or http(s):// URL) with a fresh "
                                          "optimizer, scheduler and data position; its model config (and tokenizer "
                                          "when none is given) unless model.* is set on the command line. A "
                                          "train_conf.resume of output_dir/model.pt wins")
    init_param_excludes: List[str] = opt(factory=list, help="parameter name prefixes not taken from init_param "
                                                            "(left at their fresh init), e.g. '[ctc.]'")
    train_conf: TrainConf = opt(factory=TrainConf)
    optim_conf: OptimConf = opt(factory=OptimConf)
    scheduler_conf: SchedulerConf = opt(factory=SchedulerConf)


DECODING_METHODS = ("greedy", "ctc_prefix_beam", "ctc_beam_lm", "attention_rescoring")


@schema
class DecodingConf:
    method: str = opt("greedy", "greedy: best path; ctc_prefix_beam: CTC prefix beam search (n-best, hotwords); "
                                "ctc_beam_lm: the beam search with an n-gram LM fused (corpus-io make-lm); "
                                "attention_rescoring: prefix beam n-best rescored by the attention decoder "
                                "(a conformer_ctc_att model)", choices=DECODING_METHODS)
    beam: int = opt(10, "prefixes kept per frame (1: the greedy best path)", range="[1, 1000]")
    token_beam: int = opt(0, "tokens tried per frame and prefix (0: beam)", range="[0, 100000]")
    nbest: int = opt(10, "hypotheses per utterance written to output_dir/nbest (at most beam)", range="[1, 1000]")
    lm: Optional[str] = opt(None, "ARPA n-gram for ctc_beam_lm (corpus-io make-lm)")
    lm_unit: str = opt("auto", "units of decoding.lm: token (the model's tokens, make-lm ++unit=token), word "
                               "(whitespace words, make-lm ++unit=word, scored as each word completes; for models "
                               "whose tokens spell words: bpe, or char with latin_unit=letter), auto (word when "
                               "such a model's tokens are not the LM's words)", choices=("auto", "token", "word"))
    lm_weight: float = opt(0.5, "weight of the LM log-probability (ctc_beam_lm)", range="[0, 100]")
    word_score: float = opt(0.0, "score added per emitted LM unit (insertion bonus; ctc_beam_lm)",
                            range="[-100, 100]")
    unk_score: float = opt(0.0, "score (natural log, not weighted) added per emitted LM unit outside the LM's "
                                "vocabulary, on top of its <unk> probability (negative: a penalty; ctc_beam_lm, "
                                "tuned by tune-lm ++unk_scores)", range="[-100, 100]")
    lexicon: bool = opt(False, "limit the words to the LM's vocabulary (ctc_beam_lm): a prefix that cannot "
                               "complete an LM word is pruned (a trie of the LM's words in the model's tokens)")
    hotwords: Optional[str] = opt(None, "file of hotwords, one per line (any beam method)")
    hotword_weight: float = opt(1.5, "bonus per matched hotword token (taken back when a partial match fails)",
                                range="[0, 100]")
    ctc_weight: float = opt(0.5, "attention_rescoring: weight of the CTC score against the decoder's",
                            range="[0, 1]")


#: the bound of decode's filters: above any utterance (10^9 frames: 116 days) or transcript
NO_LIMIT = 1_000_000_000


def keep_every_utterance() -> FilterConf:
    """decode's and tune-lm's ``filter_conf``: none of training's filters (``max_length`` 102 s, ``min_length``,
    token counts and ratios), so every utterance of the list is scored; a bound the user sets on the command line
    (``++dataset_conf.filter_conf.max_length=...``) applies, and what it drops is scored as all deletions."""
    return FilterConf(max_length=NO_LIMIT, min_length=0, token_max_length=NO_LIMIT, token_min_length=0,
                      min_output_input_ratio=0.0, max_output_input_ratio=float(NO_LIMIT))


@schema
class TextRuleConf:
    """How a transcript becomes the tokens of another toolkit's CTC model (docs/DECODING.md "Models of other
    toolkits"); corpus-io's own checkpoints spell text by their tokenizer config and ignore it."""

    case: str = opt("auto", "auto: the vocabulary's case (all its letters lowercase: text lowercased; uppercase: "
                            "uppercased; a tokenizer with do_lower_case: lowercased; mixed: kept); lower, upper, or "
                            "keep (as written)", choices=("auto", "lower", "upper", "keep"))
    punctuation: str = opt("auto", "a punctuation or symbol character in a word: auto: left out where the "
                                   "vocabulary lacks it, kept where it has it (the apostrophe); drop: always left "
                                   "out; keep: never (a word holding one the vocabulary lacks is outside it: "
                                   "reported unaligned)", choices=("auto", "drop", "keep"))


#: the help of every command's text_rule
TEXT_RULE_HELP = "a model of another toolkit: how transcripts become its tokens (case, punctuation)"


@schema
class DecodeConfig:
    data_list: str = opt("???", "data.list to decode")
    checkpoint: str = opt("???", "model.pt, model.pt.ep{E} or model.pt.avg{N}, or a file of export-model (.onnx: "
                                 "onnxruntime; .ts: TorchScript)")
    output_dir: str = opt("???", "writes text (hypotheses) and cer.txt / wer.txt")
    # bigger batches (no backward pass) and no filter that would leave an utterance undecoded
    dataset_conf: DatasetConf = opt(factory=lambda: DatasetConf(batch_size=32, filter_conf=keep_every_utterance()))
    device: str = opt("auto", "auto, cpu or cuda", choices=("auto", "cpu", "cuda"))
    chunk_seconds: float = opt(60.0, "an utterance longer than this goes through the model in pieces of this length "
                                     "(2 s of context each side; the outputs joined keep every frame's time), so a "
                                     "long recording decodes in bounded memory; 0: always whole", unit="seconds",
                               range="[0, inf)")
    decoding: DecodingConf = opt(factory=DecodingConf)
    text_rule: TextRuleConf = opt(factory=TextRuleConf, help=TEXT_RULE_HELP)
    decoding_chunk_size: int = opt(0, "> 0: run the model chunk by chunk, as a stream, with chunks of this many "
                                      "encoder frames (40 ms each for ConformerCTC; WeNet's name) and attention "
                                      "and convolution caches kept between them (a model trained with "
                                      "model.causal=true); 0 or < 0: full context", unit="frames",
                                   range="[-1, 100000]")
    num_decoding_left_chunks: int = opt(-1, "chunk by chunk: chunks before each that attention sees (-1: all "
                                            "of them; the cache, and memory, grow with the utterance)",
                                        range="[-1, 100000]")
    timestamps: bool = opt(False, "also write output_dir/ctm (Kaldi CTM: '<utt> 1 <start> <dur> <word> <conf>', "
                                  "seconds, 2 decimals) and timestamps.jsonl (each best hypothesis's tokens and "
                                  "words with start/end seconds and confidence), from the CTC forced alignment of "
                                  "the hypothesis (frame = feature shift x model subsampling, 40 ms for "
                                  "ConformerCTC); a raw segment (start/end) is timed in its recording and named by "
                                  "the recording id, as Kaldi's CTM")
    min_confidence: float = opt(0.0, "pseudo-labelling: write output_dir/kept_text (Kaldi text) and, for a local "
                                      "raw list, kept.list (its lines, hypotheses as transcripts) with only the "
                                      "utterances whose confidence is at least this (the mean of its words'; a "
                                      "word's: the least of its tokens' mean aligned-frame posteriors; see "
                                      "corpus_io/decoding/align.py), and output_dir/confidence for every "
                                      "utterance; 0: off", range="[0, 1]")
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()


@schema
class TranscribeConfig:
    model: str = opt("???", "model.pt, model.pt.ep{E} or model.pt.avg{N} of corpus-io train (a PyTorch checkpoint; "
                            "an exported .onnx/.ts file is served by sherpa-onnx or decoded by decode), or a CTC "
                            "model of another toolkit (docs/DECODING.md; with stream=false)")
    input: str = opt("???", "the recording to transcribe: any file soundfile reads (wav, flac, ogg, ...), "
                            "resampled to the model's rate, channels averaged")
    stream: bool = opt(True, "true: feed the audio in pieces and run the model chunk by chunk with caches (a model "
                             "trained with model.causal=true), printing each changed partial result; false: the "
                             "whole recording through the model with full context, the final result only")
    decoding_chunk_size: int = opt(16, "stream=true: encoder frames per chunk (40 ms each for ConformerCTC; 16: "
                                       "640 ms)", unit="frames", range="[1, 100000]")
    num_decoding_left_chunks: int = opt(-1, "stream=true: chunks before each that attention sees (-1: all of them; "
                                            "the cache, and memory, grow with the recording)", range="[-1, 100000]")
    piece_seconds: float = opt(0.1, "stream=true: the audio is fed in pieces of this length, as a microphone "
                                    "would deliver it", unit="seconds", range="(0, 3600]")
    device: str = opt("cpu", "cpu, cuda or auto", choices=("auto", "cpu", "cuda"))
    text_rule: TextRuleConf = opt(factory=TextRuleConf, help=TEXT_RULE_HELP)
    num_threads: int = opt(1, "torch intra-op threads while transcribing: 1 keeps each chunk's latency steady on a "
                              "busy machine (a chunk is too small to gain from more); 0: torch's default (one per "
                              "core)", range="[0, 1024]")


@schema
class MakeLmConfig:
    input: str = opt("???", "text to estimate from: a JSONL (target/txt), a Kaldi text (key transcript) or "
                            "plain text (one sentence a line)")
    output: str = opt("???", "the ARPA file to write")
    order: int = opt(3, "n-gram order", range="[1, 5]")
    unit: str = opt("token", "token: the tokenizer's tokens (CJK characters, words or letters, BPE pieces; "
                             "lexicon-free decoding); word: whitespace words (ctc_beam_lm scores them as the "
                             "BPE pieces or letters of a model spell them: decoding.lm_unit)",
                    choices=("token", "word"))
    input_format: str = opt("auto", "auto (jsonl by name or first line, else Kaldi text when every line has a "
                                    "key and text), jsonl, kaldi or plain", choices=("auto", "jsonl", "kaldi", "plain"))
    tokenizer: TokenizerConf = opt(factory=TokenizerConf)


@schema
class TuneLmConfig:
    data_list: str = opt("???", "the dev list to tune on")
    checkpoint: str = opt("???", "model.pt, model.pt.ep{E} or model.pt.avg{N}")
    output_dir: str = opt("???", "writes tune.txt (every grid point's CER/WER) and best.txt")
    lm: str = opt("???", "ARPA n-gram (corpus-io make-lm)")
    lm_weights: List[float] = opt(factory=lambda: [0.1, 0.3, 0.5, 0.8, 1.2], help="LM weights to try",
                                  range="[0, 100]", min_items=1)
    word_scores: List[float] = opt(factory=lambda: [-1.0, 0.0, 1.0, 2.0], help="word scores to try",
                                   range="[-100, 100]", min_items=1)
    unk_scores: Optional[List[float]] = opt(None, "unknown-unit scores to try (decoding.unk_score); null: "
                                                  "[-2, 0, 2], or [0] with decoding.lexicon=true (no unit is "
                                                  "unknown)", range="[-100, 100]", min_items=1)
    dataset_conf: DatasetConf = opt(factory=lambda: DatasetConf(batch_size=32, filter_conf=keep_every_utterance()))
    device: str = opt("auto", "auto, cpu or cuda", choices=("auto", "cpu", "cuda"))
    decoding: DecodingConf = opt(factory=lambda: DecodingConf(method="ctc_beam_lm"))


@schema
class ComputeCmvnConfig:
    data_list: str = opt("???", "training data.list")
    output: str = opt("???", "CMVN stats file to write")
    output_format: str = opt("json", "json (WeNet-style sums, mean, istd) or kaldi (compute-cmvn-stats' binary "
                                      "2 x (dim+1) matrix, a cmvn.ark)", choices=("json", "kaldi"))
    dataset_conf: DatasetConf = opt(factory=lambda: DatasetConf(batch_size=32))
    max_utts: int = opt(0, "use at most this many utterances (0: all; one job only)", range="[0, 1000000000000]")
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()


@schema
class ExportModelConfig:
    checkpoint: str = opt("???", "model.pt, model.pt.ep{E} or model.pt.avg{N} of a ConformerCTC (CTC-only) model")
    output: str = opt("???", "the file to write (model.onnx, model.ts); it holds the token list, sample rate, "
                             "feature config and subsampling")
    format: str = opt("onnx", "onnx (run by onnxruntime: the [onnx] extra) or torchscript",
                      choices=("onnx", "torchscript"))
    frontend: bool = opt(False, "include the Kaldi fbank/mfcc front end: waveforms (float32 in [-1, 1] at the "
                                "model's sample rate) in, log-probs out; false: features in")
    streaming: bool = opt(False, "export the chunk model of a streaming checkpoint (model.causal=true) with "
                                 "sherpa-onnx's online WeNet CTC interface (one chunk of features, the offset, "
                                 "attention and convolution caches in; log-probs and caches out); ONNX only")


@schema
class AverageConfig:
    output_dir: str = opt("???", "the training output_dir")
    num: int = opt(5, "checkpoints to average", range="[1, 100000]")
    metric: str = opt("loss", "rank epoch checkpoints by this cv metric", choices=("loss", "acc"))

