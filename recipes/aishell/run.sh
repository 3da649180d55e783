#!/usr/bin/env bash
# AISHELL-1 (OpenSLR 33, 178 h Mandarin) with corpus-io: the espeak demo's pipeline at real size.
#   0 prepare      corpus-io prepare ++corpus=aishell: data_aishell/wav/{train,dev,test}/<spk>/*.wav and
#                  transcript/aishell_transcript_v0.8.txt -> data/{train,dev,test}/{wav.scp,text,utt2spk,spk2utt}
#                  (download data_aishell.tgz from openslr.org/33, extract it and its wav/*.tar.gz first)
#   1 JSONL (scp2jsonl)   2 char token list (make-tokenizer)   3 global CMVN (compute-cmvn)
#   4 shards (pack-shards, 1000 utterances each)   5 data lists (make-datalist; --shard_prefix for S3)
#   6 train (torchrun, $nproc processes per node on $nnodes nodes; shard mode, token batching; --init PATH
#     fine-tunes from that checkpoint's weights)
#   7 character 3-gram LM of the training text (make-lm; tune-lm on dev) + average + decode of test by
#     $decode_methods (greedy CTC, CTC prefix beam + LM) + CER table
# Usage: ./run.sh --aishell_root /data/aishell [--stage N] [--stop_stage N] [--nproc 8] [--nj 16] ...
# Several nodes: stages 0-5 once (shared storage or S3), then stage 6 on each node with --nnodes M
# --node_rank R --master_addr HOST.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)

. ../tools/asr_defaults.sh
aishell_root=             # the dir holding data_aishell/ (required for stage 0)
recipe_options+=(aishell_root)
. ../tools/parse_options.sh
. ../tools/common.sh

test_names=(test)
tokenizer_overrides=("++tokenizer.token_list=$data/lang/tokens.txt")
lm_overrides=(++unit=token "++tokenizer.token_list=$data/lang/tokens.txt" ++tokenizer.type=char)

prepare_data() {
  [ -n "$aishell_root" ] || { echo "$0: set --aishell_root (the dir holding data_aishell/)" >&2; exit 2; }
  corpus-io prepare ++corpus=aishell "++root=$aishell_root" "++output_dir=$data" "++splits=[train,dev,test]"
}

make_token_list() {
  corpus-io make-tokenizer "++input=$data/train/text" "++output=$data/lang/tokens.txt" ++tokenizer.type=char
}

. ../tools/asr_pipeline.sh
