"""Every ``corpus-io`` subcommand, in one table: its name, config schema, the one function it runs, and help.

A subcommand takes Hydra overrides for its schema, composed over ``conf/<name with _>.yaml``, and calls
``run(cfg)``. ``run`` is a ``"module:function"`` string, imported only when the command runs, so
``corpus-io --help`` and the data-preparation commands never import torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from corpus_io import config


@dataclass(frozen=True)
class Command:
    name: str
    schema: type
    run: str  # "module:function" called with the composed config
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("prepare", config.PrepareConfig, "corpus_io.tables.corpora:prepare",
            "Prepare a corpus from its distributed layout (AISHELL-1, LibriSpeech) into sorted Kaldi dirs "
            "<output_dir>/<split>/{wav.scp,text,utt2spk,spk2utt}. Audio without a transcript is counted and "
            "left out."),
    Command("scp2jsonl", config.Scp2JsonlConfig, "corpus_io.tables.manifest:scp2jsonl",
            "Join Kaldi tables (wav.scp, text, ...) into a FunASR JSONL. Audio lengths come from file headers."),
    Command("jsonl2scp", config.Jsonl2ScpConfig, "corpus_io.tables.exports:jsonl2scp",
            "Split a JSONL back into Kaldi tables, one per field."),
    Command("pack-shards", config.PackShardsConfig, "corpus_io.shards.pack:pack_shards",
            "Pack a jsonl, a WeNet raw list or a Kaldi dir into WeNet/WebDataset tar shards with data.list "
            "and index.jsonl. Parallel, resumable, deterministic."),
    Command("make-datalist", config.MakeDatalistConfig, "corpus_io.shards.datalist:make_datalist",
            "Write a WeNet data.list: raw (utterance lines from a jsonl) or shard (tar URLs from dirs, globs, "
            "brace patterns or lists, merged, with an optional prefix rewrite and the index sidecar)."),
    Command("export", config.ExportConfig, "corpus_io.shards.export:export",
            "Write any input as Hugging Face parquet (++format=hf-parquet: an Audio column datasets reads) or a "
            "Lhotse Shar directory (++format=lhotse-shar); audio bytes copied, not re-encoded. Parallel, "
            "resumable, deterministic; ++num_jobs and merge-jobs as pack-shards."),
    Command("add-field", config.AddFieldConfig, "corpus_io.shards.add_field:add_field",
            "Add a field to packed shards without rewriting them: shard-NNNNNN.<field>.tar (fbank/mfcc "
            "computed with the loader's dataset_conf, or ++from_scp=feats.scp) or .<field>.jsonl.gz "
            "(++from_jsonl), plus a meta companion, recorded in index.jsonl. Parallel, resumable."),
    Command("verify-shards", config.VerifyShardsConfig, "corpus_io.shards.verify:verify_shards",
            "Check every shard of a data.list: sha256 and size against index.jsonl, member grouping, counts, "
            "audio decoding and UTF-8 transcripts. Exits non-zero naming the shard and member."),
    Command("merge-jobs", config.MergeJobsConfig, "corpus_io.jobs.parts:merge_jobs",
            "Join the parts that ++num_jobs=N ++job_index=1..N runs of pack-shards, scp2jsonl, compute-cmvn, "
            "add-field, verify-shards, export, segment, score or decode wrote into exactly what one job writes "
            "(data.list + index.jsonl, the jsonl, the CMVN file, the report, the hypotheses). Refuses, changing "
            "nothing, a missing, stale or duplicated part."),
    Command("stats", config.StatsConfig, "corpus_io.stats:run_stats",
            "Corpus statistics of a shard or raw data.list: hours, utterances, duration/text-length/speaker "
            "histograms, per-shard balance (a table on stdout) and a PNG duration histogram. Reads metadata "
            "only."),
    Command("explore", config.ExploreConfig, "corpus_io.explore.server:explore",
            "A corpus and results explorer in the browser: a sortable, filterable table of millions of "
            "utterances (a cached DuckDB/Parquet catalog), audio played straight from tar members (local or "
            "s3://), waveform, spectrogram, dataset view, decode errors marked. Prints its URL."),
    Command("make-tokenizer", config.MakeTokenizerConfig, "corpus_io.tokenizer:make_tokenizer",
            "Build a token list (char/word) or train a sentencepiece model (bpe) from Kaldi text or JSONL."),
    Command("bench-loader", config.BenchLoaderConfig, "corpus_io.loader.bench:bench_loader",
            "Iterate the training loader exactly as train builds it: utterances/s, audio-seconds/s, padding, "
            "drop counts; dump keys per rank and epoch; save or resume the loader state."),
    Command("compute-cmvn", config.ComputeCmvnConfig, "corpus_io.model.cmvn:compute_cmvn",
            "Global CMVN (mean, istd) over the feature frames of a training list, as JSON for train's "
            "cmvn_file."),
    Command("train", config.TrainConfig, "corpus_io.train.trainer:train",
            "Train a CTC model (Conformer by default) from a shard or raw list; one process or under torchrun: "
            "torchrun --nproc_per_node=N --no-python corpus-io train ++train_data_set_list=... "
            "++output_dir=..."),
    Command("average", config.AverageConfig, "corpus_io.model.checkpoint:average",
            "Average the best epoch checkpoints of a training output_dir (by cv loss or acc) into "
            "model.pt.avg{num}."),
    Command("decode", config.DecodeConfig, "corpus_io.infer.decode:decode",
            "Decode a raw or shard list with a checkpoint (++decoding.method=greedy, ctc_prefix_beam, ctc_beam_lm "
            "or attention_rescoring; hotwords); writes a Kaldi text, the n-best and a CER/WER report with RTF."),
    Command("align", config.AlignConfig, "corpus_io.infer.align:align",
            "Force-align known transcripts with a checkpoint (CTC Viterbi over the reference tokens, long recordings "
            "in windows): a CTM and alignment.jsonl with each word's start, end and score; words that cannot be "
            "aligned (not spoken, no path, tokens outside the token list) listed in unaligned, never placed."),
    Command("segment", config.SegmentConfig, "corpus_io.infer.segment:segment",
            "Cut long recordings with one transcript each into utterances: aligned with a checkpoint, cut in pauses "
            "(never through a word), at most ++max_segment_seconds; writes a Kaldi dir (wav.scp, segments, text), "
            "segments.jsonl with scores, and the transcript words placed in no segment (unaligned)."),
    Command("score", config.ScoreConfig, "corpus_io.infer.score:score",
            "Find wrong labels with a checkpoint: every utterance's duration, characters and tokens per second, the "
            "greedy hypothesis' CER/WER against its label, the label's CTC loss per frame and per token, whether it "
            "can be aligned; writes scores.jsonl and flagged (thresholds from the data, median + k robust "
            "deviations, or given). Leave the flagged keys out with pack-shards/make-datalist ++exclude_keys."),
    Command("transcribe", config.TranscribeConfig, "corpus_io.infer.transcribe:transcribe",
            "Transcribe one recording with a checkpoint as a stream: fed in pieces (++piece_seconds), chunk by chunk "
            "with caches (++stream=true, a model trained with model.causal=true), printing partial results, the "
            "final text, word times, latency per chunk and RTF; ++stream=false: full context."),
    Command("export-model", config.ExportModelConfig, "corpus_io.infer.export:export_model",
            "Export a CTC checkpoint as one ONNX (++format=onnx, run by onnxruntime) or TorchScript file: CMVN inside, "
            "and with ++frontend=true the fbank front end (waveform in, log-probs out); dynamic batch and time; the "
            "token list, sample rate and feature config travel in the file. decode ++checkpoint=model.onnx runs it."),
    Command("make-lm", config.MakeLmConfig, "corpus_io.decoding.lm:make_lm",
            "Estimate an interpolated modified Kneser-Ney n-gram (order 1-5) over the tokenizer's tokens or "
            "words from JSONL, Kaldi text or plain text, and write it as ARPA (for ctc_beam_lm)."),
    Command("tune-lm", config.TuneLmConfig, "corpus_io.infer.tune_lm:tune_lm",
            "Grid-search decoding.lm_weight and decoding.word_score of ctc_beam_lm on a dev list (the model runs "
            "once); prints and writes the best."),
)

SCHEMAS: dict[str, type] = {c.name: c.schema for c in COMMANDS}


def leave_process_group() -> None:
    """After a command that ran under torchrun (``train``, ``bench-loader``): destroy the process group if it is
    still up, then exit without the interpreter's teardown, where the C++ threads of gloo and of the TCPStore can
    abort a rank ("terminate called without an active exception", exit -6; pytorch#190489, #179291) and turn a
    finished run into a failed one. Without torchrun, or before torch was imported, it does nothing."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    from corpus_io.train.distributed import exit_now

    exit_now(0)  # multiprocessing's clean-up first: no leaked-semaphore warnings from the resource tracker
