#!/usr/bin/env bash
# LibriSpeech (OpenSLR 12, 960 h English) with corpus-io: the espeak demo's pipeline at real size.
#   0 prepare      corpus-io prepare ++corpus=librispeech: <subset>/<reader>/<chapter>/*.flac and
#                  <reader>-<chapter>.trans.txt -> data/<subset with _>/{wav.scp,text,utt2spk,spk2utt};
#                  data/train = the --train_sets subsets, data/dev = the --dev_sets subsets
#   1 JSONL (scp2jsonl)   2 BPE model + token list (make-tokenizer)   3 global CMVN (compute-cmvn)
#   4 shards (pack-shards, 1000 utterances each)   5 data lists (make-datalist; --shard_prefix for S3)
#   6 train (torchrun, $nproc processes per node on $nnodes nodes; shard mode, token batching; --init PATH
#     fine-tunes from that checkpoint's weights)
#   7 word 3-gram LM of the training text (make-lm; tune-lm on dev) + average + decode of the --test_sets by
#     $decode_methods (greedy CTC, CTC prefix beam + the word LM over BPE pieces) + CER/WER table
# Usage: ./run.sh --librispeech_root /data/LibriSpeech [--stage N] [--stop_stage N] [--nproc 8] [--nj 16] ...
# Several nodes: stages 0-5 once (shared storage or S3), then stage 6 on each node with --nnodes M
# --node_rank R --master_addr HOST.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)

. ../tools/asr_defaults.sh
librispeech_root=         # the dir holding train-clean-100/, dev-clean/, ... (required for stage 0)
train_sets="train-clean-100 train-clean-360 train-other-500"
dev_sets="dev-clean dev-other"
test_sets="test-clean test-other"
vocab_size=5000           # BPE units
recipe_options+=(librispeech_root train_sets dev_sets test_sets vocab_size)
. ../tools/parse_options.sh
. ../tools/common.sh

read -r -a train_subsets <<< "$train_sets"
read -r -a dev_subsets <<< "$dev_sets"
read -r -a test_subsets <<< "$test_sets"
test_names=("${test_subsets[@]//-/_}")   # data dirs use _ (train-clean-100 -> train_clean_100)
train_dirs=("${train_subsets[@]//-/_}")
dev_dirs=("${dev_subsets[@]//-/_}")
tokenizer_overrides=("++tokenizer.token_list=$data/lang/tokens.txt" "++tokenizer.bpe_model=$data/lang/tokens.model")
lm_overrides=(++unit=word)

prepare_data() {
  [ -n "$librispeech_root" ] || { echo "$0: set --librispeech_root (the dir holding train-clean-100/, ...)" >&2; exit 2; }
  local subsets
  subsets=$(IFS=,; echo "${train_subsets[*]},${dev_subsets[*]},${test_subsets[*]}")
  corpus-io prepare ++corpus=librispeech "++root=$librispeech_root" "++output_dir=$data" "++splits=[$subsets]"
  combine_data_dirs "$data/train" "${train_dirs[@]/#/$data/}"
  combine_data_dirs "$data/dev" "${dev_dirs[@]/#/$data/}"
}

make_token_list() {
  corpus-io make-tokenizer "++input=$data/train/text" "++output=$data/lang/tokens.txt" ++tokenizer.type=bpe \
    "++vocab_size=$vocab_size"
}

. ../tools/asr_pipeline.sh
