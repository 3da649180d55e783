# Shared helpers for recipes/*/run.sh (sourced after parse_options.sh, from the recipe directory).
# shellcheck shell=bash

# The repo's venv first on PATH, so `corpus-io`, `python` and `torchrun` are the project's.
if [ -x "$repo/.venv/bin/corpus-io" ]; then export PATH="$repo/.venv/bin:$PATH"; fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

log() {  # log STAGE MESSAGE...
  echo "$(date '+%F %T') [stage $1] ${*:2}" >&2
}

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
