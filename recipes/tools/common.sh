# Shared helpers for recipes/*/run.sh (sourced after parse_options.sh, from the recipe directory).
# shellcheck shell=bash

# The repo's venv first on PATH, so `corpus-io`, `python` and `torchrun` are the project's.
if [ -x "$repo/.venv/bin/corpus-io" ]; then export PATH="$repo/.venv/bin:$PATH"; fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

# Jobs, as Kaldi's $cmd: --cmd local runs the --nj jobs of a data command as background processes,
# --cmd slurm as an sbatch array plus a dependent merge (the recipe's cmd.sh holds the sbatch options).
slurm_opts=()
if [ -f cmd.sh ]; then . ./cmd.sh; fi
case "${cmd:-local}" in
  local) job_cmd=("$repo/recipes/tools/run_jobs.sh" local) ;;
  slurm) job_cmd=("$repo/recipes/tools/run_jobs.sh" slurm "${slurm_opts[@]}") ;;
  *) echo "$0: --cmd ${cmd}: use local or slurm" >&2; exit 2 ;;
esac

log() {  # log STAGE MESSAGE...
  echo "$(date '+%F %T') [stage $1] ${*:2}" >&2
}

# --init PATH (fine-tuning): the training stage starts from that checkpoint's weights (model.pt, .ep{E}, .avg{N},
# s3:// or http(s)://) with a fresh optimizer and data position; its model config and, without a token list,
# its tokenizer. A rerun into the same --exp resumes instead (train_conf.resume wins, as in FunASR and WeNet).
init_args=()
if [ -n "${init:-}" ]; then init_args=("++init_param=$init"); fi

stage_on() {  # stage_on N: true when stage N is in [stage, stop_stage]
  [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]
}

train_config_value() {  # train_config_value dotted.key: a value of $train_config
  python -c 'import sys; from omegaconf import OmegaConf; print(OmegaConf.select(OmegaConf.load(sys.argv[1]), sys.argv[2]))' \
    "$train_config" "$1"
}

combine_data_dirs() {  # combine_data_dirs DEST SRC...: Kaldi tables concatenated and sorted by key
  local dest=$1 name src
  shift
  mkdir -p "$dest"
  for name in wav.scp text utt2spk; do
    for src in "$@"; do cat "$src/$name"; done | LC_ALL=C sort -k1,1 > "$dest/$name.tmp"
    mv "$dest/$name.tmp" "$dest/$name"
  done
}

audio_hours() {  # audio_hours DATA.jsonl: hours of audio (source_len is in 10 ms frames)
  python "$repo/recipes/tools/results.py" hours "$1"
}

results_table() {  # results_table EXP TRAIN_JSONL TEST_SET...: the markdown CER table
  python "$repo/recipes/tools/results.py" table "$@"
}

check_cer() {  # check_cer CER_TXT TARGET: fail when %CER > TARGET (TARGET 0: no check)
  python "$repo/recipes/tools/results.py" check "$1" "$2"
}

# ---- pipeline stages shared by the recipes; each logs what it made. Uses $nj and $cmd.
# The data stages (scp2jsonl, compute-cmvn, pack-shards) run as --nj jobs joined by merge-jobs, with a log per
# job in DIR/log/NAME.J.log (--nj > 1 or --cmd slurm: the bytes one job writes), else as one job with $nj processes.

as_jobs() {  # true when the data stages run as --nj jobs
  [ "$nj" -gt 1 ] || [ "${cmd:-local}" = slurm ]
}

job_workers() {  # processes of one job: 1 locally (the jobs share the host), 0 on slurm (the task's CPUs)
  if [ "${cmd:-local}" = slurm ]; then echo 0; else echo 1; fi
}

make_jsonl() {  # make_jsonl STAGE DIR...: DIR/{wav.scp,text} -> DIR/data.jsonl (scp2jsonl)
  local st=$1 dir
  shift
  for dir in "$@"; do
    local scp=(corpus-io scp2jsonl "++scp_file_list=[$dir/wav.scp,$dir/text]" "++data_type_list=[source,target]"
               "++jsonl_file_out=$dir/data.jsonl")
    if as_jobs; then
      "${job_cmd[@]}" "JOB=1:$nj" "$dir/log/scp2jsonl.JOB.log" --merge "$dir/data.jsonl" -- \
        "${scp[@]}" "++num_workers=$(job_workers)"
    else
      "${scp[@]}" "++num_workers=$nj"
    fi
    log "$st" "made $dir/data.jsonl: $(wc -l < "$dir/data.jsonl") utterances, $(audio_hours "$dir/data.jsonl") h"
  done
}

train_feature_args() {  # train_feature_args: ++dataset_conf.fbank_conf.KEY=VALUE, one a line, for each key that
  # $train_config's fbank_conf names (dither aside: training's only), so CMVN is of the features the model trains on
  python -c 'import sys; from omegaconf import OmegaConf
conf = OmegaConf.select(OmegaConf.load(sys.argv[1]), "dataset_conf.fbank_conf") or {}
for key, value in conf.items():
    if key != "dither":
        print(f"++dataset_conf.fbank_conf.{key}={str(value).lower() if isinstance(value, bool) else value}")' \
    "$train_config"
}

make_cmvn() {  # make_cmvn STAGE DIR NUM_MEL_BINS [MAX_UTTS [OVERRIDE...]]: DIR/data.jsonl -> DIR/cmvn.json
  # (compute-cmvn on the features of $train_config's fbank_conf, then the OVERRIDEs: those training adds).
  # MAX_UTTS > 0 (the first utterances only) is one job: a slice of the list is not what jobs split
  local st=$1 dir=$2 bins=$3 max_utts=${4:-0} features
  shift $(($# < 4 ? $# : 4))
  mapfile -t features < <(train_feature_args)
  local cmvn=(corpus-io compute-cmvn "++data_list=$dir/data.jsonl" "++output=$dir/cmvn.json"
              ++dataset_conf.data_type=raw "${features[@]}" "++dataset_conf.fbank_conf.num_mel_bins=$bins" "$@"
              "++max_utts=$max_utts")
  if as_jobs && [ "$max_utts" -eq 0 ]; then
    # in-process reading (dataset_conf.num_workers=0): each job is a process of its own
    "${job_cmd[@]}" "JOB=1:$nj" "$dir/log/cmvn.JOB.log" --merge "$dir/cmvn.json" -- \
      "${cmvn[@]}" ++dataset_conf.num_workers=0
  else
    "${cmvn[@]}" "++dataset_conf.num_workers=$nj"
  fi
  log "$st" "made $dir/cmvn.json ($bins-dim fbank)"
}

make_shards() {  # make_shards STAGE UTTS_PER_SHARD SHUFFLE DIR...: DIR/data.jsonl -> DIR/shards/ (pack-shards)
  local st=$1 per_shard=$2 shuffle=$3 dir
  shift 3
  for dir in "$@"; do
    local pack=(corpus-io pack-shards "++input=$dir/data.jsonl" "++output_dir=$dir/shards"
                "++num_utts_per_shard=$per_shard" "++shuffle=$shuffle")
    if as_jobs; then
      "${job_cmd[@]}" "JOB=1:$nj" "$dir/log/pack.JOB.log" --merge "$dir/shards" -- \
        "${pack[@]}" "++num_workers=$(job_workers)"
    else
      "${pack[@]}" "++num_workers=$nj"
    fi
    log "$st" "made $dir/shards: $(find "$dir/shards" -name '*.tar' | wc -l) shards"
  done
}

make_shard_lists() {  # make_shard_lists STAGE DIR...: DIR/shard.list; shard_prefix=s3://b/c rewrites to c/<DIR name>/
  local st=$1 dir prefix
  shift
  for dir in "$@"; do
    prefix=()
    if [ -n "${shard_prefix:-}" ]; then prefix=("++prefix=${shard_prefix%/}/$(basename "$dir")/"); fi
    corpus-io make-datalist ++data_type=shard "++input=[$dir/shards]" "++output=$dir/shard.list" "${prefix[@]}"
    log "$st" "made $dir/shard.list: $(wc -l < "$dir/shard.list") shards"
  done
}

make_raw_lists() {  # make_raw_lists STAGE DIR...: DIR/raw.list (one utterance a line, for decoding)
  local st=$1 dir
  shift
  for dir in "$@"; do
    corpus-io make-datalist ++data_type=raw "++input=[$dir/data.jsonl]" "++output=$dir/raw.list"
    log "$st" "made $dir/raw.list: $(wc -l < "$dir/raw.list") utterances"
  done
}

average_model() {  # average_model STAGE EXP NUM: EXP/model.pt.avgNUM, the mean of EXP's last NUM checkpoints
  corpus-io average "++output_dir=$2" "++num=$3"
  log "$1" "made $2/model.pt.avg$3"
}

make_lm() {  # make_lm STAGE EXP CHECKPOINT DEV_SHARD_LIST MAKE_LM_OVERRIDE...: $lm, an order-$lm_order ARPA of the
  # training text for ctc_beam_lm (the overrides choose its unit: the model's tokens, or words), and with
  # $tune_lm=true the $lm_weight and $word_score that tune-lm finds best for CHECKPOINT on the dev shards.
  # Nothing when $decode_methods has no ctc_beam_lm.
  local st=$1 exp=$2 checkpoint=$3 dev=$4
  shift 4
  [[ " ${decode_methods:-greedy} " == *" ctc_beam_lm "* ]] || return 0
  lm=$exp/lm_${lm_order}gram.arpa
  corpus-io make-lm "++input=$data/train/data.jsonl" "++output=$lm" "++order=$lm_order" "$@"
  log "$st" "made $lm (order $lm_order: $*)"
  if $tune_lm; then
    corpus-io tune-lm "++data_list=$dev" ++dataset_conf.data_type=shard \
      "++checkpoint=$checkpoint" "++lm=$lm" "++output_dir=$exp/tune_lm" "++decoding.beam=$beam" \
      "++lm_weights=[0.1,0.2,0.3,0.5]" "++word_scores=[0.0,0.5,1.0,2.0]" "++dataset_conf.num_workers=$nj"
    read -r lm_weight word_score < <(sed -n 's/.*lm_weight=\([^ ]*\) ++decoding.word_score=\([^ ]*\).*/\1 \2/p' \
      "$exp/tune_lm/best.txt")
    log "$st" "tune-lm on dev: lm_weight=$lm_weight word_score=$word_score ($exp/tune_lm/tune.txt)"
  fi
}

decode_sets() {  # decode_sets STAGE EXP CHECKPOINT DIR...: EXP/decode_<DIR name>/ for each DIR/raw.list
  # One decode per method of $decode_methods (default greedy): greedy writes EXP/decode_<name>/, the others
  # EXP/decode_<name>.<method>/; ctc_beam_lm uses $lm (an ARPA from make-lm) with $lm_weight and $word_score,
  # all beams $beam (default 10). Each also writes word times and confidences: ctm and timestamps.jsonl.
  # With $decode_chunk (> 0) the model runs chunk by chunk (a streaming model), into
  # EXP/decode_<name>.chunk<N>[.<method>]/, seeing $decode_left_chunks chunks back (default -1: all).
  local st=$1 exp=$2 checkpoint=$3 dir name method out lm_opts chunk_opts=() suffix=
  shift 3
  if [ "${decode_chunk:-0}" -gt 0 ]; then
    chunk_opts=("++decoding_chunk_size=$decode_chunk" "++num_decoding_left_chunks=${decode_left_chunks:--1}")
    suffix=.chunk$decode_chunk
  fi
  for dir in "$@"; do
    name=$(basename "$dir")
    for method in ${decode_methods:-greedy}; do
      out=$exp/decode_$name$suffix
      [ "$method" = greedy ] || out=$exp/decode_$name$suffix.$method
      lm_opts=()  # only ctc_beam_lm takes the LM (decode refuses one that the method would ignore)
      if [ "$method" = ctc_beam_lm ]; then
        lm_opts=(${lm:+"++decoding.lm=$lm"} ${lm_weight:+"++decoding.lm_weight=$lm_weight"}
                 ${word_score:+"++decoding.word_score=$word_score"})
      fi
      corpus-io decode "++data_list=$dir/raw.list" "++checkpoint=$checkpoint" "++output_dir=$out" \
        ++dataset_conf.data_type=raw ++dataset_conf.batch_type=example ++dataset_conf.batch_size=16 \
        "++dataset_conf.num_workers=$nj" "++decoding.method=$method" "++decoding.beam=${beam:-10}" "${lm_opts[@]}" \
        "${chunk_opts[@]}" ++timestamps=true
      log "$st" "decoded $name ($method${suffix:+, chunk $decode_chunk}): $(grep -m1 "^%CER" "$out/cer.txt") $(grep -m1 "^RTF" "$out/cer.txt")"
    done
  done
}
