"""Schemas of the long-form family: align (known transcripts force-aligned with a checkpoint) and segment (long
recordings with one transcript each cut into utterances). See docs/LONGFORM.md."""

from __future__ import annotations

from typing import Any

from corpus_io.config.checks import schema
from corpus_io.config.dataset import DatasetConf
from corpus_io.config.fields import executor_address_opt, executor_opt, job_index_opt, num_jobs_opt, opt
from corpus_io.config.training import TEXT_RULE_HELP, TextRuleConf, keep_every_utterance

#: shared help of the keys both commands take
_CHECKPOINT = ("model.pt, model.pt.ep{E} or model.pt.avg{N} of corpus-io train (a CTC checkpoint; its token list "
               "must spell the transcripts)")
_WINDOW = ("the CTC Viterbi alignment runs over windows of this many seconds of model output (the text a window "
           "can hold at most), committing the words that end in its first two thirds and starting the next window "
           "after them: memory stays bounded however long the recording (a recording shorter than this: one "
           "trellis)")
_MIN_WORD_SCORE = ("a word whose score (the least of its tokens' mean aligned-frame posteriors, in [0, 1]) is below "
                   "this is not placed: it is reported as unaligned (not spoken, or not what the model hears)")


def _dataset_conf() -> DatasetConf:
    """One recording at a time through the model, every utterance kept (no filter)."""
    return DatasetConf(data_type="raw", batch_size=1, filter_conf=keep_every_utterance())


@schema
class AlignConfig:
    data_list: str = opt("???", "the utterances with their known transcripts: a JSONL (FunASR/WeNet), a Kaldi dir "
                                "(wav.scp + text) or any input decode reads (dataset_conf.data_type=shard: a shard "
                                "data.list)")
    checkpoint: str = opt("???", _CHECKPOINT)
    text_rule: TextRuleConf = opt(factory=TextRuleConf, help=TEXT_RULE_HELP)
    output_dir: str = opt("???", "writes ctm (Kaldi CTM of the aligned words: '<utt> 1 <start> <dur> <word> "
                                 "<score>'), alignment.jsonl (each utterance's words with start/end seconds and "
                                 "score; an unaligned word with start/end null and its reason) and unaligned "
                                 "('<utt> <word position> <word> <reason>')")
    dataset_conf: DatasetConf = opt(factory=_dataset_conf)
    device: str = opt("auto", "auto, cpu or cuda", choices=("auto", "cpu", "cuda"))
    chunk_seconds: float = opt(60.0, "a recording longer than this goes through the model in pieces of this length "
                                     "(2 s of context each side), so a long recording runs in bounded memory; 0: "
                                     "always whole", unit="seconds", range="[0, inf)")
    window_seconds: float = opt(60.0, _WINDOW, unit="seconds", range="[4, 3600]")
    min_word_score: float = opt(0.05, _MIN_WORD_SCORE, range="[0, 1]")


@schema
class SegmentConfig:
    input: str = opt("???", "long recordings with one transcript each (all the recording's words on one line): a "
                            "Kaldi dir (wav.scp + text) or a JSONL (FunASR source/target, WeNet wav/txt)")
    checkpoint: str = opt("???", _CHECKPOINT)
    text_rule: TextRuleConf = opt(factory=TextRuleConf, help=TEXT_RULE_HELP)
    output_dir: str = opt("???", "writes a Kaldi dir of the segments (wav.scp, segments, text, utt2spk: what "
                                 "scp2jsonl and pack-shards take), segments.jsonl (each segment's recording, "
                                 "start, end, text and score) and unaligned ('<recording> <word position> <word> "
                                 "<reason>': the transcript words placed in no segment)")
    vad: str = opt("auto", "where the audio pauses, the only places segment cuts: energy (the core: the fbank "
                           "frames' energy, for clean recordings), silero (silero-vad's shipped model, robust to "
                           "room tone and breaths: pip install -e '.[vad]'), or auto: silero when it is installed, "
                           "else energy (the summary names the one used)", choices=("auto", "energy", "silero"))
    max_segment_seconds: float = opt(20.0, "a segment is at most this long (its padding shrinks first): a longer "
                                           "stretch of speech is cut at its longest pause (a single pause-free "
                                           "stretch longer than this, between words)",
                                     unit="seconds", range="[1, 3600]")
    max_pause_seconds: float = opt(3.0, "a pause longer than this always ends a segment (the silence is left out)",
                                   unit="seconds", range="(0, inf)")
    padding_seconds: float = opt(0.2, "a segment starts this long before its speech and ends this long after it, "
                                      "at most half the pause to the neighbouring speech",
                                 unit="seconds", range="[0, 5]")
    min_word_score: float = opt(0.05, _MIN_WORD_SCORE + "; a segment never holds the audio of an unaligned word",
                                range="[0, 1]")
    phrase_pause_seconds: float = opt(0.3, "the shortest pause ++vad reports: speech between two such pauses is a "
                                           "phrase, and an unaligned word takes its phrase with it (its words are "
                                           "listed in unaligned), so that every cut falls in a pause",
                                      unit="seconds", range="(0, inf)")
    max_unsaid_words: int = opt(0, "each segment is checked whole: its greedy path may read at most this many "
                                   "words in a row that its text lacks (speech the transcript does not say); a "
                                   "segment with more is not written and its words are listed in unaligned",
                                range="[0, 1000]")
    sure_word_posterior: float = opt(0.85, "how sure the model must be of a word no text gives it for it to count "
                                           "as speech (each token's peak posterior): the whole-segment check counts "
                                           "only such words, and a pseudo-label drops a less sure word heard in a "
                                           "pause. A small model half hears words into an utterance's onset "
                                           "(0.45-0.76 measured); a spoken word missing from a transcript is heard "
                                           "at 0.93-0.99", range="[0, 1]")
    pseudo_label: bool = opt(False, "a recording with no transcript line (or an empty one) is cut at the pauses "
                                    "and transcribed by the checkpoint (greedy), each segment with its confidence; "
                                    "off: such a recording is refused")
    min_confidence: float = opt(0.5, "a pseudo-labelled segment whose confidence (its words' mean aligned-frame "
                                     "posterior) is below this is listed in flagged ('<key> <reason>', what "
                                     "pack-shards ++exclude_keys takes)", range="[0, 1]")
    window_seconds: float = opt(60.0, _WINDOW, unit="seconds", range="[4, 3600]")
    chunk_seconds: float = opt(60.0, "a recording goes through the model in pieces of this length (2 s of context "
                                     "each side): memory stays bounded for an hour-long recording", unit="seconds",
                               range="(0, inf)")
    dataset_conf: DatasetConf = opt(factory=_dataset_conf)
    device: str = opt("auto", "auto, cpu or cuda", choices=("auto", "cpu", "cuda"))
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()
