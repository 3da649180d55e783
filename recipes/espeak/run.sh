#!/usr/bin/env bash
# corpus-io demo recipe: speech synthesized locally with espeak-ng + sox, end to end on CPU.
#   0 synthesize   English digit strings (train/dev/held-out test, and a test by 4 voices no set trains on)
#                  and mixed Chinese/English sentences
#   1 Kaldi dirs -> FunASR JSONL (corpus-io scp2jsonl)
#   2 token list (corpus-io make-tokenizer)
#   3 global CMVN (corpus-io compute-cmvn, on the raw JSONL)
#   4 shards (corpus-io pack-shards): data/{train,dev}/shards/
#   5 data lists (corpus-io make-datalist): shard lists for train/dev, raw lists for the test sets
#   6 train (torchrun --nproc_per_node=$nproc --no-python corpus-io train, shard mode; --init PATH fine-tunes
#     from that checkpoint's weights)
#   7 average checkpoints, an n-gram LM of the training text (corpus-io make-lm), decode by every method of
#     --decode_methods (greedy, CTC prefix beam, beam + LM; attention rescoring with --model conformer_ctc_att),
#     CER/WER + RTF table per method (exp dir RESULTS.md)
#   --noise true: stage 0 also synthesizes $data/noise (competing espeak speech, sentences of its own seed),
#     stages 1/4/5 pack it as shards, and stage 6 trains with it mixed in on the fly
#     (++dataset_conf.add_noise, at --noise_snr dB; the loader streams the noise shards)
#   8 real recordings (10 LibriVox + CMU utterances, recipes/tools/real_recordings.py): a model of their
#     own overfits them (trained and decoded on the same set: a check that real audio flows, not a score),
#     CER appended to RESULTS.md next to the synthetic sets
#   9 serve (--streaming true: stage 6 trains a streaming model, stage 7 also decodes it chunk by chunk): export
#     for sherpa-onnx, offline and online (corpus-io export-model [++streaming=true]), and decode test_digits with
#     sherpa-onnx itself (recipes/tools/sherpa_decode.py), words compared with stage 7's
#  10 long form: the digits test set joined 40 a recording with 0.3-1.2 s pauses, its text one line each
#     (python -m corpus_io.tables.synth join), cut by corpus-io segment with stage 7's model (--nj jobs), scored against
#     where the joins really are (recipes/tools/score_segments.py): exp dir segment_test_digits_long/score.json
#  11 clean (run it on its own: --stage 11 --stop_stage 11): the training set scored with the stage-6 model (stage 7's
#     average; corpus-io score: wrong labels found by CTC loss, greedy CER/WER, rates), the flagged keys left out of
#     a re-pack (pack-shards ++exclude_keys) into $data/train_clean/shard.list, the counts printed
# Usage: ./run.sh [--stage N] [--stop_stage N] [--nj N] [--cmd local|slurm] [--max_epoch N] ...   (run from anywhere)
# Example: ./run.sh --stage 6 --stop_stage 7 --max_epoch 5
set -euo pipefail

stage=0
stop_stage=10
nj=2                      # processes for synthesis; jobs for scp2jsonl, compute-cmvn, packing and segment
cmd=local                 # local | slurm: how the --nj data jobs run (cmd.sh: sbatch options)
nproc=2                   # training processes (torchrun --nproc_per_node)
data=data                 # relative to this recipe dir
exp=exp/conformer_ctc
num_digits_train=2400     # utterances of 3-7 digits, 8 espeak voices
num_digits_dev=160
num_digits_test=200       # held out: the CER check is on this set
num_digits_test_newvoice=100  # held-out digit strings by 4 voices (other accents) absent from training: reported
num_mixed_train=800       # Chinese / English / code-switched sentences
num_mixed_test=80
num_noise=200             # --noise true: utterances of competing speech (babble noise), packed as shards
num_utts_per_shard=200    # 16 train shards: an even share for each of the 2 readers
num_utts_per_shard_dev=40 # small dev shards: at least one per reader (nproc x num_workers)
train_config=conf/train.yaml
init=                     # fine-tuning: stage 6 starts from this corpus-io checkpoint's weights (++init_param)
max_epoch=                # empty: as in $train_config
max_steps_per_epoch=      # empty: as in $train_config (smoke: a few steps)
batch_type=token          # example | length | token
batch_size=4800           # token: padded frames + tokens per batch (about 16 utterances)
shuffle_size=1000
sort_size=200
num_workers=1             # DataLoader workers per training process
feats_on=                 # empty: as in $train_config (loader); model: fbank + SpecAugment batched in the trainer
noise=false               # true: train with noise (see --noise above); off by default
noise_snr="[5,20]"        # --noise true: [low, high] dB, each noisy utterance's SNR is drawn in it
noise_prob=0.5            # --noise true: the share of training utterances that get noise (the rest stay clean)
average_num=3             # checkpoints averaged for decoding
cer_target=10             # digits test %CER the demo must reach (checked at stage 7, 0 = no check)
real_epochs=120           # stage 8: epochs over the 10 real utterances (one batch each)
model=                    # empty: as in $train_config; conformer_ctc_att: hybrid CTC/attention (attention rescoring)
streaming=false           # true: a streaming model (causal convolution, dynamic chunk training): stage 7 also decodes
                          # chunk by chunk (--decoding_chunk_size), stage 9 exports it for sherpa-onnx and decodes with it
decoding_chunk_size=16    # --streaming true: the chunk of stage 7's chunk-by-chunk decode (encoder frames, 40 ms each)
num_decoding_left_chunks=4  # ... and the chunks before it attention sees (4: sherpa-onnx's default; -1: all)
sherpa_features=          # empty: the features of $train_config (the defaults: sherpa-onnx's fbank, high_freq -400,
                          # snip_edges false, so sherpa with default arguments computes exactly the model's
                          # features); true: sherpa's named on the command line; false: Kaldi's and WeNet's
                          # (high_freq 0, snip_edges true)
decode_methods="greedy ctc_prefix_beam ctc_beam_lm"  # + attention_rescoring with --model conformer_ctc_att
beam=10                   # prefix beam width of the beam methods
lm_order=3                # order of the training-text n-gram for ctc_beam_lm
lm_weight=0.3             # LM weight of ctc_beam_lm (replaced by tune-lm's best when tune_lm=true)
word_score=0.0            # per-token score of ctc_beam_lm (likewise)
tune_lm=true              # grid-search lm_weight x word_score on the dev set (corpus-io tune-lm) before decoding
recipe_options=(stage stop_stage nj cmd nproc data exp num_digits_train num_digits_dev num_digits_test
                num_digits_test_newvoice num_mixed_train
                num_mixed_test num_noise num_utts_per_shard num_utts_per_shard_dev train_config init max_epoch
                max_steps_per_epoch batch_type batch_size shuffle_size sort_size num_workers feats_on noise noise_snr
                noise_prob
                average_num cer_target real_epochs
                model streaming decoding_chunk_size num_decoding_left_chunks sherpa_features decode_methods beam lm_order lm_weight word_score tune_lm)

cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)
. ../tools/parse_options.sh
. ../tools/common.sh

num_mel_bins=$(train_config_value dataset_conf.fbank_conf.num_mel_bins)
case "$streaming" in
  true|false) ;;
  *) echo "$0: --streaming must be true or false, not '$streaming'" >&2; exit 2 ;;
esac
# WeNet's U2 streaming: a causal convolution, and a random chunk mask per batch (full context half the time)
streaming_args=()
[ "$streaming" = true ] && streaming_args=(++model.causal=true ++model.use_dynamic_chunk=true)
feature_args=()  # training's features, given to every compute-cmvn too (stages 3 and 8)
case "$sherpa_features" in
  true) feature_args=(++dataset_conf.fbank_conf.high_freq=-400 ++dataset_conf.fbank_conf.snip_edges=false) ;;
  false) feature_args=(++dataset_conf.fbank_conf.high_freq=0 ++dataset_conf.fbank_conf.snip_edges=true) ;;
  "") ;;
  *) echo "$0: --sherpa_features must be true, false or empty, not '$sherpa_features'" >&2; exit 2 ;;
esac
streaming_args+=("${feature_args[@]}")
case "$noise" in
  true) noise_dirs=("$data/noise") ;;
  false) noise_dirs=() ;;
  *) echo "$0: --noise must be true or false, not '$noise'" >&2; exit 2 ;;
esac

if stage_on 0; then
  log 0 "synthesizing with espeak-ng ($nj processes)"
  local_dir=$data/local
  python -m corpus_io.tables.synth digits "$local_dir/digits_train" --num "$num_digits_train" --seed 1
  python -m corpus_io.tables.synth digits "$local_dir/digits_dev" --num "$num_digits_dev" --seed 2
  python -m corpus_io.tables.synth digits "$local_dir/test_digits" --num "$num_digits_test" --seed 3
  python -m corpus_io.tables.synth digits "$local_dir/test_digits_newvoice" --num "$num_digits_test_newvoice" --seed 6 \
    --held-out-voices
  python -m corpus_io.tables.synth mixed "$local_dir/mixed_train" --num "$num_mixed_train" --seed 4
  python -m corpus_io.tables.synth mixed "$local_dir/test_mixed" --num "$num_mixed_test" --seed 5
  # train = digits + mixed; dev = digits (keys differ: spkNN-... vs mixNN-...)
  combine_data_dirs "$data/train" "$local_dir/digits_train" "$local_dir/mixed_train"
  combine_data_dirs "$data/dev" "$local_dir/digits_dev"
  combine_data_dirs "$data/test_digits" "$local_dir/test_digits"
  combine_data_dirs "$data/test_digits_newvoice" "$local_dir/test_digits_newvoice"
  combine_data_dirs "$data/test_mixed" "$local_dir/test_mixed"
  if [ "$noise" = true ]; then  # the noise: other sentences (seed 7), mixed into train utterances by stage 6
    python -m corpus_io.tables.synth mixed "$local_dir/noise" --num "$num_noise" --seed 7
    combine_data_dirs "$data/noise" "$local_dir/noise"
  fi
  for x in train dev test_digits test_digits_newvoice test_mixed "${noise_dirs[@]##*/}"; do log 0 "made $data/$x: $(wc -l < "$data/$x/wav.scp") utterances"; done
fi

if stage_on 1; then
  make_jsonl 1 "$data"/{train,dev,test_digits,test_digits_newvoice,test_mixed} "${noise_dirs[@]}"
fi

if stage_on 2; then
  corpus-io make-tokenizer "++input=$data/train/text" "++output=$data/lang/tokens.txt" \
    ++tokenizer.type=char ++tokenizer.latin_unit=word
  log 2 "made $data/lang/tokens.txt: $(wc -l < "$data/lang/tokens.txt") tokens"
fi

if stage_on 3; then
  make_cmvn 3 "$data/train" "$num_mel_bins" 0 "${feature_args[@]}"
fi

if stage_on 4; then
  make_shards 4 "$num_utts_per_shard" true "$data/train"
  make_shards 4 "$num_utts_per_shard_dev" false "$data/dev"
  [ "$noise" = false ] || make_shards 4 "$num_utts_per_shard_dev" true "${noise_dirs[@]}"
fi

if stage_on 5; then
  make_shard_lists 5 "$data"/{train,dev} "${noise_dirs[@]}"
  make_raw_lists 5 "$data"/{test_digits,test_digits_newvoice,test_mixed}
fi

if stage_on 6; then
  # The canonical multi-process run: one process per core (per GPU on a GPU box); the data lists are
  # shard lists, and ++dataset_conf.* picks shard mode, token batching and the buffer sizes.
  extra=()
  [ -n "$max_epoch" ] && extra+=("++train_conf.max_epoch=$max_epoch")
  [ -n "$max_steps_per_epoch" ] && extra+=("++train_conf.max_steps_per_epoch=$max_steps_per_epoch")
  [ -n "$feats_on" ] && extra+=("++dataset_conf.feats_on=$feats_on")
  if [ "$noise" = true ]; then
    if [ ! -s "$data/noise/shard.list" ]; then
      echo "$0: --noise true trains with $data/noise/shard.list, which does not exist: make it with" \
        "--noise true --stage 0 --stop_stage 5 (stages 0, 1, 4 and 5 synthesize and pack the noise)" >&2
      exit 2
    fi
    extra+=(++dataset_conf.add_noise=true "++dataset_conf.add_noise_conf.noise_list=$data/noise/shard.list"
            "++dataset_conf.add_noise_conf.snr_db=$noise_snr" "++dataset_conf.add_noise_conf.prob=$noise_prob")
  fi
  case "$model" in
    "") ;;
    conformer_ctc_att)  # the recipe's encoder with a Transformer decoder (conf/model/conformer_ctc_att.yaml's keys)
      extra+=(++model._target_=corpus_io.model.model.ConformerCTCAttention ++model.ctc_weight=0.3
              ++model.decoder_num_blocks=3 ++model.decoder_linear_units=512 ++model.lsm_weight=0.1) ;;
    *) echo "$0: --model must be empty (as in $train_config) or conformer_ctc_att" >&2; exit 2 ;;
  esac
  extra+=("${streaming_args[@]}")
  start=$(date +%s)
  OMP_NUM_THREADS=1 torchrun --standalone --nnodes=1 --nproc_per_node="$nproc" --no-python \
    corpus-io train --config-path "$(cd "$(dirname "$train_config")" && pwd)" --config-name "$(basename "$train_config")" \
      "++train_data_set_list=$data/train/shard.list" "++valid_data_set_list=$data/dev/shard.list" \
      "++output_dir=$exp" "++cmvn_file=$data/train/cmvn.json" "++tokenizer.token_list=$data/lang/tokens.txt" \
      ++dataset_conf.data_type=shard "++dataset_conf.batch_type=$batch_type" "++dataset_conf.batch_size=$batch_size" \
      "++dataset_conf.shuffle_conf.shuffle_size=$shuffle_size" "++dataset_conf.sort_conf.sort_size=$sort_size" \
      "++dataset_conf.num_workers=$num_workers" "${extra[@]}" "${init_args[@]}"
  echo $(($(date +%s) - start)) > "$exp/train_seconds"
  log 6 "trained $(grep -c 'epoch [0-9]* done' "$exp/train.log") epochs in $(cat "$exp/train_seconds") s: checkpoints in $exp"
fi

if stage_on 7; then
  average_model 7 "$exp" "$average_num"
  make_lm 7 "$exp" "$exp/model.pt.avg$average_num" "$data/dev/shard.list" \
    "++tokenizer.token_list=$data/lang/tokens.txt" ++tokenizer.type=char ++tokenizer.latin_unit=word
  decode_sets 7 "$exp" "$exp/model.pt.avg$average_num" "$data"/{test_digits,test_digits_newvoice,test_mixed}
  if [ "$streaming" = true ]; then  # the same checkpoint chunk by chunk, as a stream
    decode_methods=greedy decode_chunk=$decoding_chunk_size decode_left_chunks=$num_decoding_left_chunks \
      decode_sets 7 "$exp" \
      "$exp/model.pt.avg$average_num" "$data"/{test_digits,test_mixed}
  fi
  results_table "$exp" "$data/train/data.jsonl" test_digits test_digits_newvoice test_mixed | tee "$exp/RESULTS.md"
  check_cer "$exp/decode_test_digits/cer.txt" "$cer_target"
fi

if stage_on 8; then
  # Real speech: fetched once at set-up (make install); the fetch below is instant when it is cached.
  real_src=$(python "$repo/recipes/tools/real_recordings.py" fetch)
  real=$data/real
  real_exp=$(dirname "$exp")/real_overfit
  mkdir -p "$real"
  cp "$real_src"/{wav.scp,text,utt2spk} "$real/"
  make_jsonl 8 "$real"
  corpus-io make-tokenizer "++input=$real/data.jsonl" "++output=$real/tokens.txt" ++tokenizer.type=char \
    ++tokenizer.latin_unit=letter
  mapfile -t train_features < <(train_feature_args)
  corpus-io compute-cmvn "++data_list=$real/data.jsonl" "++output=$real/cmvn.json" ++dataset_conf.data_type=raw \
    "${train_features[@]}" "++dataset_conf.fbank_conf.num_mel_bins=$num_mel_bins" "${feature_args[@]}" \
    ++dataset_conf.num_workers=0
  make_shards 8 5 false "$real"
  make_shard_lists 8 "$real"
  make_raw_lists 8 "$real"
  start=$(date +%s)
  OMP_NUM_THREADS=1 torchrun --standalone --nnodes=1 --nproc_per_node=1 --no-python \
    corpus-io train --config-path "$(cd "$(dirname "$train_config")" && pwd)" --config-name "$(basename "$train_config")" \
      "++train_data_set_list=$real/shard.list" "++output_dir=$real_exp" "++cmvn_file=$real/cmvn.json" \
      "++tokenizer.token_list=$real/tokens.txt" ++tokenizer.latin_unit=letter ++dataset_conf.data_type=shard \
      ++dataset_conf.batch_type=example ++dataset_conf.batch_size=10 ++dataset_conf.spec_aug=false \
      ++dataset_conf.num_workers=1 ++dataset_conf.filter_conf.token_max_length=200 \
      "++train_conf.max_epoch=$real_epochs" ++train_conf.log_interval=10 \
      ++train_conf.keep_nbest_models=1 ++train_conf.avg_nbest_model=1 ++scheduler_conf.warmup_steps=20 \
      ${max_steps_per_epoch:+"++train_conf.max_steps_per_epoch=$max_steps_per_epoch"} "${streaming_args[@]}"
  echo $(($(date +%s) - start)) > "$real_exp/train_seconds"
  average_model 8 "$real_exp" 1
  decode_methods=greedy decode_sets 8 "$real_exp" "$real_exp/model.pt.avg1" "$real"  # the LMs are of the synthetic text
  if [ "$streaming" = true ]; then
    decode_methods=greedy decode_chunk=$decoding_chunk_size decode_left_chunks=$num_decoding_left_chunks \
      decode_sets 8 "$real_exp" "$real_exp/model.pt.avg1" "$real"
  fi
  results_table "$real_exp" "$real/data.jsonl" real > "$real_exp/RESULTS.md"
  mkdir -p "$exp"  # stage 8 alone (--stage 8 --stop_stage 8): the synthetic sets' exp dir is stage 6's
  { echo; echo "Real recordings (pocketsphinx 5.1.1 sdist: LibriVox + CMU; overfit: trained and decoded on the same"
    echo "10 utterances, so this shows real audio flows through every stage, not generalization):"; echo
    cat "$real_exp/RESULTS.md"; } | tee -a "$exp/RESULTS.md"
fi

serve_with_sherpa() {  # serve_with_sherpa EXP CHECKPOINT SET_DIR: export twice, decode SET_DIR/raw.list with sherpa-onnx
  local exp=$1 ckpt=$2 set=$3 name out
  name=$(basename "$set")
  out=$exp/serve
  corpus-io export-model "++checkpoint=$ckpt" "++output=$out/offline/model.onnx"
  corpus-io export-model "++checkpoint=$ckpt" "++output=$out/online/model.onnx" ++streaming=true
  python "$repo/recipes/tools/sherpa_decode.py" "$out/offline/model.onnx" "$out/offline/tokens.txt" \
    "$set/raw.list" "$out/decode_$name.offline" --feature-dim "$num_mel_bins" --compare "$exp/decode_$name/text"
  python "$repo/recipes/tools/sherpa_decode.py" "$out/online/model.onnx" "$out/online/tokens.txt" \
    "$set/raw.list" "$out/decode_$name.online" --feature-dim "$num_mel_bins" --online \
    --chunk-size "$decoding_chunk_size" --left-chunks "$num_decoding_left_chunks" \
    --compare "$exp/decode_$name.chunk$decoding_chunk_size/text"
  log 9 "$name: $(cat "$out/decode_$name".{offline,online}/summary.txt | tr '\n' ' ')"
}

if stage_on 9; then
  # Serving (--streaming true): the checkpoint exported for sherpa-onnx twice, offline (whole utterance) and
  # online (chunk by chunk with caches), each with tokens.txt beside it; the test set decoded by sherpa-onnx
  # itself, the audio fed online in 0.1 s pieces, its words compared with stage 7's decodes.
  if [ "$streaming" != true ]; then
    log 9 "skipped: serving exports a streaming model (--streaming true)"
  else
    serve_with_sherpa "$exp" "$exp/model.pt.avg$average_num" "$data/test_digits"
    real_exp=$(dirname "$exp")/real_overfit
    # stage 8's model of the real recordings, when it was trained streaming too
    if [ -s "$real_exp/model.pt.avg1" ] && grep -q "causal: true" "$real_exp/config.yaml"; then
      serve_with_sherpa "$real_exp" "$real_exp/model.pt.avg1" "$data/real"
    fi
  fi
fi

if stage_on 10; then
  # Long form: the test set as long recordings with one transcript each, segmented by the stage-7 model; the
  # figures: cuts inside an utterance's speech, the share of segments holding exactly the words spoken in them,
  # every word placed once or listed unaligned, the share unaligned.
  long=$data/test_digits_long
  out=$exp/segment_test_digits_long
  rm -rf "$long" "$out"
  python -m corpus_io.tables.synth join "$data/test_digits" "$long" --per-recording 40
  seg=(corpus-io segment "++input=$long" "++checkpoint=$exp/model.pt.avg$average_num" "++output_dir=$out"
       ++dataset_conf.num_workers=0)
  if as_jobs; then  # --nj jobs (recordings split by key) joined by merge-jobs: the bytes one job writes
    "${job_cmd[@]}" "JOB=1:$nj" "$out/log/segment.JOB.log" --merge "$out" -- "${seg[@]}"
  else
    "${seg[@]}"
  fi
  python "$repo/recipes/tools/score_segments.py" "$long" "$out" > "$out/score.json"
  log 10 "segmented $(wc -l < "$long/wav.scp") long recordings of test_digits: $(cat "$out/score.json")"
fi

if stage_on 11; then
  # Cleaning: every training utterance scored with the stage-6 model (stage 7's average); the ones flagged (a wrong
  # label: high CTC loss per token, greedy CER/WER, a rate far from the rest, or one that cannot be aligned) are left
  # out of a re-pack. Train on $data/train_clean/shard.list to drop them (++train_data_set_list).
  score_dir=$exp/score_train
  corpus-io score "++data_list=$data/train/shard.list" "++checkpoint=$exp/model.pt.avg$average_num" \
    "++output_dir=$score_dir" ++dataset_conf.data_type=shard
  clean=$data/train_clean
  corpus-io pack-shards "++input=$data/train/data.jsonl" "++output_dir=$clean/shards" \
    "++num_utts_per_shard=$num_utts_per_shard" ++shuffle=true "++exclude_keys=$score_dir/flagged" "++num_workers=$nj"
  make_shard_lists 11 "$clean"
  scored=$(grep -c . "$score_dir/scores.jsonl")
  flagged=$(grep -c . "$score_dir/flagged" || true)
  kept=$(python -c 'import json, sys; print(sum(json.loads(l)["num_utts"] for l in open(sys.argv[1])))' \
    "$clean/shards/index.jsonl")
  log 11 "scored $scored training utterances, flagged $flagged ($(sed -n 2p "$score_dir/summary.txt")): kept $kept" \
    "in $clean/shard.list; the flagged keys and their reasons: $score_dir/flagged"
fi
