"""Schema of ``corpus-io score``: every utterance of a list scored with a model, to find wrong labels."""

from __future__ import annotations

from typing import Any, Optional

from corpus_io.config.checks import schema
from corpus_io.config.dataset import DatasetConf
from corpus_io.config.fields import executor_address_opt, executor_opt, job_index_opt, num_jobs_opt, opt
from corpus_io.config.training import TEXT_RULE_HELP, TextRuleConf, keep_every_utterance


def _limit(figure: str, side: str) -> str:
    where = "above" if side == "max" else "below"
    return (f"flag an utterance whose {figure} is {where} this; null: from the data (its median "
            f"{'+' if side == 'max' else '-'} ++deviations robust deviations)")


def _floor(figure: str) -> str:
    return (f"a {figure} threshold taken from the data is never below this (a model that fits its data makes the "
            f"data's threshold flag near-perfect utterances)")


def _ceiling(figure: str) -> str:
    return (f"a {figure} threshold taken from the data is never above this (many wrong labels raise the data's "
            f"threshold): a {figure} above it is flagged whatever the data's median")


@schema
class ScoreConfig:
    data_list: str = opt("???", "the list to score: a shard data.list, or with dataset_conf.data_type=raw a raw list "
                                "or any input decode reads (FunASR/WeNet JSONL, Kaldi dir, ...)")
    checkpoint: str = opt("???", "model.pt, model.pt.ep{E} or model.pt.avg{N} (or an export-model file) trained on "
                                 "the same language and token list as the labels")
    text_rule: TextRuleConf = opt(factory=TextRuleConf, help=TEXT_RULE_HELP)
    output_dir: str = opt("???", "writes scores.jsonl (a row per utterance: its figures, flagged, reasons), flagged "
                                 "(a key a line, then its reasons: pack-shards and make-datalist ++exclude_keys "
                                 "take it as it is) and summary.txt (counts and the thresholds used); not the "
                                 "directory of the list")
    # decode's: no filter leaves an utterance out; unreadable audio is skipped, then listed and flagged as unreadable
    dataset_conf: DatasetConf = opt(factory=lambda: DatasetConf(batch_size=32, filter_conf=keep_every_utterance(),
                                                                on_error="skip"))
    device: str = opt("auto", "auto, cpu or cuda", choices=("auto", "cpu", "cuda"))
    chunk_seconds: float = opt(60.0, "an utterance longer than this goes through the model in pieces of this length "
                                     "(as decode's chunk_seconds); 0: always whole", unit="seconds", range="[0, inf)")
    deviations: float = opt(5.0, "k of the thresholds taken from the data: a figure more than k robust deviations "
                                 "from its median is out of line (robust deviation: 1.4826 x the median absolute "
                                 "deviation, or 1.2533 x the mean absolute deviation when that is 0; for the "
                                 "losses, of their logarithms)",
                            range="(0, 1000]")
    min_errors: int = opt(2, "a CER or WER above its threshold flags an utterance only when the hypothesis has at "
                             "least this many word errors (one misheard word in a short utterance is the model's "
                             "error, not the label's)", range="[0, 1000000]")
    max_cer: Optional[float] = opt(None, _limit("greedy-hypothesis CER against its label", "max"),
                                   range="[0, inf)")
    max_wer: Optional[float] = opt(None, _limit("greedy-hypothesis WER against its label", "max"),
                                   range="[0, inf)")
    max_loss_per_token: Optional[float] = opt(None, _limit("CTC loss of its label per label token (nats)", "max"),
                                              range="[0, inf)")
    max_loss_per_frame: Optional[float] = opt(None, _limit("CTC loss of its label per output frame (nats)", "max"),
                                              range="[0, inf)")
    min_chars_per_second: Optional[float] = opt(None, _limit("label characters per second of audio", "min"),
                                                range="[0, inf)")
    max_chars_per_second: Optional[float] = opt(None, _limit("label characters per second of audio", "max"),
                                                range="[0, inf)")
    min_tokens_per_second: Optional[float] = opt(None, _limit("label tokens per second of audio", "min"),
                                                 range="[0, inf)")
    max_tokens_per_second: Optional[float] = opt(None, _limit("label tokens per second of audio", "max"),
                                                 range="[0, inf)")
    # absolute bounds around the data's thresholds: they hold when many labels are wrong or the model fits its data
    cer_floor: float = opt(0.1, _floor("CER"), range="[0, inf)")
    cer_ceiling: float = opt(0.4, _ceiling("CER"), range="[0, inf)")
    wer_floor: float = opt(0.2, _floor("WER"), range="[0, inf)")
    wer_ceiling: float = opt(0.6, _ceiling("WER"), range="[0, inf)")
    loss_per_token_floor: float = opt(1.0, _floor("loss per token"), unit="nats", range="[0, inf)")
    loss_per_token_ceiling: float = opt(2.5, _ceiling("loss per token") + "; a label its hypothesis equals (CER 0) "
                                         "is flagged by its loss only above this", unit="nats", range="[0, inf)")
    loss_per_frame_floor: float = opt(0.2, _floor("loss per frame"), unit="nats", range="[0, inf)")
    loss_per_frame_ceiling: float = opt(0.4, _ceiling("loss per frame") + "; a label its hypothesis equals (CER 0) "
                                        "is flagged by its loss only above this", unit="nats", range="[0, inf)")
    max_median_cer: float = opt(0.3, "the model cannot judge the labels when their median CER is above this (most "
                                     "labels wrong, e.g. a text file shifted by a line, or a model too weak for this "
                                     "audio): a warning in the summary and on stderr", range="[0, inf)")
    max_cer_spread: float = opt(0.25, "the model cannot judge the labels when their CERs' robust deviation is above "
                                      "this (a warning, as max_median_cer's)", range="[0, inf)")
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()
    max_unknown_share: float = opt(0.5, "when more than this share of the utterances hold label tokens outside the "
                                        "checkpoint's token list, the checkpoint cannot spell the labels: an error, "
                                        "nothing written (below it, such an utterance is flagged)", range="[0, 1]")
