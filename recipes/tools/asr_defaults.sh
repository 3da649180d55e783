# Option defaults shared by the real-corpus recipes (aishell, librispeech): real-size settings for
# $nproc GPUs per node. Sourced by run.sh before parse_options.sh; run.sh adds its own options.
# shellcheck shell=bash
stage=0
stop_stage=7
nj=16                     # jobs for scp2jsonl, compute-cmvn (all utterances) and packing (--cmd local: processes here)
cmd=local                 # local | slurm: how the --nj data jobs run (cmd.sh: sbatch options)
nproc=8                   # training processes per node (one per GPU)
nnodes=1                  # several nodes: run.sh on each with --node_rank R --master_addr HOST
node_rank=0
master_addr=localhost
master_port=29500
data=data
exp=exp/conformer_ctc
num_utts_per_shard=1000
shard_prefix=             # e.g. s3://bucket/corpus: shard lists point at <prefix>/<set>/ (upload data/<set>/shards/ there)
train_config=conf/train.yaml
init=                     # fine-tuning: stage 6 starts from this corpus-io checkpoint's weights (++init_param)
max_epoch=                # empty: as in $train_config
max_steps_per_epoch=      # empty: as in $train_config
batch_type=token          # example | length | token
batch_size=24000          # token: padded frames + tokens per batch and process
shuffle_size=1500
sort_size=500
num_workers=16            # DataLoader workers per training process
average_num=10
cmvn_max_utts=20000       # 0: all
decode_methods="greedy ctc_beam_lm"  # + ctc_prefix_beam; attention_rescoring with a conformer_ctc_att train_config
beam=10                   # prefix beam width of the beam methods
lm_order=3                # order of the training-text n-gram for ctc_beam_lm
lm_weight=0.3             # LM weight of ctc_beam_lm (replaced by tune-lm's best when tune_lm=true)
word_score=0.0            # score per LM unit of ctc_beam_lm (likewise)
tune_lm=true              # grid-search lm_weight x word_score on the dev shards (corpus-io tune-lm) before decoding
recipe_options=(stage stop_stage nj cmd nproc nnodes node_rank master_addr master_port data exp num_utts_per_shard
                shard_prefix train_config init max_epoch max_steps_per_epoch batch_type batch_size shuffle_size sort_size
                num_workers average_num cmvn_max_utts decode_methods beam lm_order lm_weight word_score tune_lm)
