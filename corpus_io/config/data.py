"""Schemas of the data-preparation family: scp2jsonl, jsonl2scp, prepare, pack-shards, make-datalist, export,
verify-shards, make-tokenizer, add-field and stats (none of them imports torch)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from corpus_io.config.checks import schema
from corpus_io.config.dataset import DatasetConf, TokenizerConf
from corpus_io.config.fields import (
    FAILURE_CHOICES,
    allow_pipe_opt,
    executor_address_opt,
    executor_opt,
    job_index_opt,
    num_jobs_opt,
    on_error_opt,
    opt,
    pipe_timeout_opt,
    storage_options_opt,
)


@schema
class Scp2JsonlConfig:
    scp_file_list: List[str] = opt(help="Kaldi tables, first one drives the order, e.g. [wav.scp, text]",
                                   factory=list)
    data_type_list: List[str] = opt(help="a field name per table", factory=lambda: ["source", "target"])
    jsonl_file_out: str = opt("???", "output JSONL (written to a temp name, then renamed)")
    segments: Optional[str] = opt(None, "Kaldi segments file: utterances are cut from wav.scp recordings")
    num_workers: int = opt(0, "header-probe processes (0: all cores)", range="[0, 1024]")
    on_error: str = on_error_opt("a key missing from a table, or unreadable audio: fail, or skip and count")
    on_empty_text: str = opt("fail", "an utterance whose transcript (or other text field) is empty: fail, or "
                                     "drop and count it", choices=FAILURE_CHOICES)
    on_duplicate: str = opt("fail", "a key repeated in a table: fail, or keep its first line and drop and count "
                                    "the others", choices=FAILURE_CHOICES)
    allow_pipe: bool = allow_pipe_opt("allow Kaldi pipe entries like 'sox a.flac -t wav - |' (run without a shell)")
    pipe_timeout: float = pipe_timeout_opt()
    storage_options: Dict[str, Any] = storage_options_opt("http(s)/s3 sources")
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()


@schema
class Jsonl2ScpConfig:
    jsonl_file_in: str = opt("???", "input JSONL (nemo/lhotse: any manifest kind pack-shards reads)")
    scp_file_list: List[str] = opt(help="output tables, one per field", factory=list)
    data_type_list: List[str] = opt(help="the field written to each table",
                                    factory=lambda: ["source", "target"])
    separator: str = opt("space", "between key and value: Kaldi's space or FunASR's tab", choices=("space", "tab"))
    output_format: str = opt("kaldi", "kaldi: tables (scp_file_list); nemo: a NeMo manifest; lhotse: a Lhotse "
                                      "CutSet (both to manifest_out; the input may be any manifest kind)",
                             choices=("kaldi", "nemo", "lhotse"))
    manifest_out: Optional[str] = opt(None, "nemo/lhotse: the manifest written, e.g. train_manifest.json or "
                                            "cuts.jsonl.gz")


@schema
class PrepareConfig:
    corpus: str = opt("???", "the on-disk layout under root", choices=("aishell", "librispeech"))
    root: str = opt("???", "aishell: the dir holding data_aishell/ (wav/{train,dev,test}/<spk>/*.wav, transcript/); "
                           "librispeech: the dir holding <subset>/<reader>/<chapter>/*.flac")
    output_dir: str = opt("data", "one Kaldi dir per split: <output_dir>/<split>/{wav.scp,text,utt2spk,spk2utt}")
    splits: List[str] = opt(help="splits to prepare (empty: all found), e.g. [train,dev,test] or "
                                 "[train-clean-100,dev-clean,test-clean]", factory=list)
    remove_spaces: bool = opt(True, "aishell: drop the transcript's word spaces (WeNet/ESPnet); false keeps them")


# pack-shards' keys that export shares (export reads any input pack-shards reads and writes its audio the same
# way): each is made by one helper below, which holds its one default (as config/fields.py's *_opt helpers do)
INPUT_ERRORS_HELP = "unreadable audio or a missing transcript: fail, or skip and count"
WAV_SCP_PIPE_HELP = "allow Kaldi pipe entries in wav.scp (run without a shell)"
COLUMNS_HELP = ("parquet input: the column of each role (audio, text, key, speaker), e.g. ++columns.text=sentence "
                "(default: found by the common names)")


def utts_per_output_opt(help: str) -> Any:
    """pack-shards' ``num_utts_per_shard``, export's ``num_utts_per_file``."""
    return opt(1000, help, range="[1, 10000000]")


def audio_format_opt(help: str) -> Any:
    return opt("keep", help, choices=("keep", "wav", "flac"))


def resample_opt() -> Any:
    return opt(None, "re-encode at this rate (null: keep the rate)", unit="Hz", range="[1000, 384000]")


def columns_opt(help: str = COLUMNS_HELP) -> Any:
    return opt(help=help, factory=dict)


def writers_opt(what: str) -> Any:
    """``num_workers`` of a command that writes in processes: ``what`` names them."""
    return opt(0, f"{what} processes (0: all cores)", range="[0, 1024]")


@schema
class PackShardsConfig:
    input: str = opt("???", "train.jsonl (FunASR), a WeNet raw data.list, a Kaldi data dir, NeMo/Lhotse manifests "
                            "or Hugging Face parquet (a file, a directory or a glob)")
    output_dir: str = opt("???", "where shards, data.list and index.jsonl go")
    num_utts_per_shard: int = utts_per_output_opt("utterances per shard")
    num_workers: int = writers_opt("packing")
    shuffle: bool = opt(False, "shuffle utterances before sharding (seeded)")
    seed: int = opt(777, "shuffle seed", range="[0, 4294967295]")
    audio_format: str = audio_format_opt("keep original bytes, or re-encode")
    resample: Optional[int] = resample_opt()
    filter_group: List[str] = opt(help="length buckets 'lo:hi' in frames, each packed into its own sub-directory",
                                  factory=list)
    shard_prefix: str = opt("shard", "shard file name prefix: <prefix>-000000.tar")
    compression: str = opt("none", "none: plain tar; gzip: WeNet-style <prefix>-000000.tar.gz (smaller only for "
                                   "uncompressed audio; slower to pack and read, and readers cannot seek past audio)",
                           choices=("none", "gzip"))
    feats: bool = opt(False, "features mode: pack a Kaldi dir's feats.scp (kaldiio) as <key>.npy, no audio")
    exclude_keys: Optional[str] = opt(None, "a file of keys to leave out, one a line, its first field (score's "
                                            "output_dir/flagged as it is, or a Kaldi table): the utterances left out "
                                            "are counted, and the file's keys the input does not hold reported")
    columns: Dict[str, str] = columns_opt()
    on_error: str = on_error_opt(INPUT_ERRORS_HELP)
    allow_pipe: bool = allow_pipe_opt(WAV_SCP_PIPE_HELP)
    pipe_timeout: float = pipe_timeout_opt()
    storage_options: Dict[str, Any] = storage_options_opt("remote sources")
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()


@schema
class MakeDatalistConfig:
    data_type: str = opt("shard", "raw: utterance list from a JSONL; shard: list of shard URLs",
                         choices=("raw", "shard"))
    input: Any = opt(help="raw: a JSONL; shard: dirs, globs, brace patterns or list files (one, or a list)",
                     factory=list)
    output: str = opt("???", "the data.list to write")
    prefix: Optional[str] = opt(None, "rewrite each shard's directory to this prefix, e.g. s3://bucket/corpus/")
    exclude_keys: Optional[str] = opt(None, "raw: a file of keys to leave out, one a line, its first field (score's "
                                            "output_dir/flagged as it is, or a Kaldi table): the utterances left out "
                                            "are counted, and the file's keys the input does not hold reported")
    columns: Dict[str, str] = columns_opt(COLUMNS_HELP + "; shard mode writes it into each parquet file's list line")
    storage_options: Dict[str, Any] = storage_options_opt("remote parquet inputs")


@schema
class ExportConfig:
    format: str = opt("hf-parquet", "hf-parquet: Hugging Face parquet (data/<split>-NNNNN-of-NNNNN.parquet, an Audio "
                             "column); lhotse-shar: a Lhotse Shar directory", choices=("hf-parquet", "lhotse-shar"))
    input: str = opt("???", "any input pack-shards reads (jsonl, Kaldi dir, NeMo, Lhotse, parquet), or packed shards "
                            "(a shard data.list, local or a URL, a shard directory, a WeNet .tar.gz list)")
    output_dir: str = opt("???", "where the files go")
    split: str = opt("train", "the split named in the output (hf-parquet: data/train-00000-of-00004.parquet; "
                                "lhotse-shar: the Shar directory <output_dir>/train)")
    num_utts_per_file: int = utts_per_output_opt("utterances per output file (hf-parquet) or shard (lhotse-shar)")
    audio_format: str = audio_format_opt("keep: the stored bytes, copied; wav/flac: re-encode")
    resample: Optional[int] = resample_opt()
    columns: Dict[str, str] = columns_opt()
    num_workers: int = writers_opt("writing")
    replace: bool = opt(False, "an output_dir whose split holds another input's export (or this input's with other "
                               "options): false refuses it; true removes that export's files first, then writes")
    on_error: str = on_error_opt(INPUT_ERRORS_HELP)
    allow_pipe: bool = allow_pipe_opt(WAV_SCP_PIPE_HELP)
    pipe_timeout: float = pipe_timeout_opt()
    storage_options: Dict[str, Any] = storage_options_opt("remote inputs")
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()


@schema
class VerifyShardsConfig:
    input: str = opt("???", "a shard data.list (its index.jsonl sidecar is used when present)")
    num_workers: int = opt(0, "checking processes (0: all cores)", range="[0, 1024]")
    decode_audio: bool = opt(True, "decode every audio member")
    storage_options: Dict[str, Any] = storage_options_opt("remote shards")
    report: Optional[str] = opt(None, "also write the report (the lines printed) to this file")
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()


@schema
class MakeTokenizerConfig:
    input: str = opt("???", "a Kaldi text file or a JSONL with target/txt")
    output: str = opt("???", "token list to write (bpe also writes <output stem>.model)")
    tokenizer: TokenizerConf = opt(factory=TokenizerConf)
    vocab_size: int = opt(500, "bpe vocabulary size", range="[1, 10000000]")
    min_count: int = opt(1, "char/word: drop tokens seen fewer times", range="[1, 1000000000]")


@schema
class AddFieldConfig:
    input: str = opt("???", "a shard data.list")
    field: str = opt("???", "the field name, e.g. fbank or speaker")
    from_scp: Optional[str] = opt(None, "import a Kaldi feats.scp (kaldiio)")
    from_jsonl: Optional[str] = opt(None, "import values by key from a JSONL")
    dataset_conf: DatasetConf = opt(factory=DatasetConf)
    num_workers: int = opt(0, "processes (0: all cores)", range="[0, 1024]")
    num_jobs: Any = num_jobs_opt()
    job_index: Any = job_index_opt()
    executor: str = executor_opt()
    executor_address: str = executor_address_opt()


@schema
class MergeJobsConfig:
    path: str = opt("???", "what one job would have written: pack-shards', segment's, score's or decode's "
                           "output_dir, scp2jsonl's jsonl_file_out, compute-cmvn's output, add-field's or "
                           "verify-shards' input list")
    what: Optional[str] = opt(None, "which parts, when P has parts of several commands (e.g. verify-shards, "
                                    "add-field-fbank)")
    check: str = opt("stat", "how the parts' outputs are checked before merging: stat (sizes, and one stat() per "
                             "shard its job sealed; others' tar headers read), headers (reads every shard's tar "
                             "headers), sha256 (also reads every output); size is stat's former name",
                     choices=("stat", "headers", "sha256", "size"))
    storage_options: Dict[str, Any] = storage_options_opt("an s3:// path (endpoint_url, key, secret), as the jobs' "
                                                          "storage_options; else the AWS environment")


@schema
class StatsConfig:
    input: str = opt("???", "a shard or raw data.list")
    output: Optional[str] = opt(None, "PNG histogram path (null: <list stem>.stats.png in the current directory, "
                                      "e.g. data.stats.png; never written beside the data)")
    data_type: str = opt("shard", "format of the list", choices=("raw", "shard"))
    bins: int = opt(30, "histogram bins", range="[1, 100000]")
    storage_options: Dict[str, Any] = storage_options_opt("a remote list and its shards")


@schema
class ExploreConfig:
    input: str = opt("???", "a shard data.list (or its directory), a raw list / FunASR jsonl, or a Kaldi dir")
    decode_dir: Optional[str] = opt(None, "output_dir of corpus-io decode: hypotheses and per-utterance errors")
    compare_dir: Optional[str] = opt(None, "a second decode output_dir, shown side by side (better/worse)")
    scores: Optional[str] = opt(None, "scores.jsonl of corpus-io score (or its output_dir): its figures as columns "
                                      "(flagged, reasons, CER/WER, loss per token and frame, rates), each sorted and "
                                      "filtered; show: flagged")
    token_list: Optional[str] = opt(None, "token list (units.txt): the dataset view lists corpus tokens it lacks")
    cache_dir: Optional[str] = opt(None, "where the catalog is cached (null: <input dir>/.explore/)")
    dump_audio_dir: Optional[str] = opt(None, "a bench-loader ++dump_audio_dir (local): a row whose key it holds "
                                              "plays, draws and shows its <key>.wav, the waveform after augmentation")
    host: str = opt("127.0.0.1", "address to listen on (another address exposes the corpus to that network)")
    port: int = opt(8000, "TCP port (0: any free port)", range="[0, 65535]")
    storage_options: Dict[str, Any] = storage_options_opt("remote shards")
