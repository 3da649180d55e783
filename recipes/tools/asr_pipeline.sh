# Stages 0-7 of the real-corpus recipes (aishell, librispeech), sourced at the end of their run.sh.
# The recipe defines:
#   prepare_data          stage 0: Kaldi dirs $data/train, $data/dev and $data/<name> for each of test_names
#   make_token_list       stage 2: $data/lang/tokens.txt (and tokens.model for BPE)
#   test_names            array of test dir names under $data
#   tokenizer_overrides   array of ++tokenizer.* overrides for train
#   lm_overrides          array of make-lm overrides for the ctc_beam_lm n-gram (its unit and tokenizer)
# shellcheck shell=bash
tests=()
for x in "${test_names[@]}"; do tests+=("$data/$x"); done

if stage_on 0; then
  prepare_data
  log 0 "made $data/train ($(wc -l < "$data/train/wav.scp") utterances), $data/dev ($(wc -l < "$data/dev/wav.scp")), ${tests[*]}"
fi

if stage_on 1; then
  make_jsonl 1 "$data/train" "$data/dev" "${tests[@]}"
fi

if stage_on 2; then
  make_token_list
  log 2 "made $data/lang/tokens.txt: $(wc -l < "$data/lang/tokens.txt") tokens"
fi

if stage_on 3; then
  make_cmvn 3 "$data/train" "$(train_config_value dataset_conf.fbank_conf.num_mel_bins)" "$cmvn_max_utts"
fi

if stage_on 4; then
  make_shards 4 "$num_utts_per_shard" true "$data/train"
  make_shards 4 "$num_utts_per_shard" false "$data/dev"
fi

if stage_on 5; then
  make_shard_lists 5 "$data"/{train,dev}
  make_raw_lists 5 "${tests[@]}"
fi

if stage_on 6; then
  # Every node runs this with its --node_rank; each process reads its share of the shard list.
  extra=()
  [ -n "$max_epoch" ] && extra+=("++train_conf.max_epoch=$max_epoch")
  [ -n "$max_steps_per_epoch" ] && extra+=("++train_conf.max_steps_per_epoch=$max_steps_per_epoch")
  start=$(date +%s)
  torchrun --nnodes="$nnodes" --node_rank="$node_rank" --nproc_per_node="$nproc" \
      --master_addr="$master_addr" --master_port="$master_port" --no-python \
    corpus-io train --config-path "$(cd "$(dirname "$train_config")" && pwd)" --config-name "$(basename "$train_config")" \
      "++train_data_set_list=$data/train/shard.list" "++valid_data_set_list=$data/dev/shard.list" \
      "++output_dir=$exp" "++cmvn_file=$data/train/cmvn.json" "${tokenizer_overrides[@]}" \
      ++dataset_conf.data_type=shard "++dataset_conf.batch_type=$batch_type" "++dataset_conf.batch_size=$batch_size" \
      "++dataset_conf.shuffle_conf.shuffle_size=$shuffle_size" "++dataset_conf.sort_conf.sort_size=$sort_size" \
      "++dataset_conf.num_workers=$num_workers" "${extra[@]}" "${init_args[@]}"
  echo $(($(date +%s) - start)) > "$exp/train_seconds"
  log 6 "trained in $(cat "$exp/train_seconds") s: checkpoints in $exp"
fi

if stage_on 7 && [ "$node_rank" = 0 ]; then
  average_model 7 "$exp" "$average_num"
  make_lm 7 "$exp" "$exp/model.pt.avg$average_num" "$data/dev/shard.list" "${lm_overrides[@]}"
  decode_sets 7 "$exp" "$exp/model.pt.avg$average_num" "${tests[@]}"
  results_table "$exp" "$data/train/data.jsonl" "${test_names[@]}" | tee "$exp/RESULTS.md"
fi
