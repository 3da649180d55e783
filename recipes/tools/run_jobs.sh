#!/usr/bin/env bash
# Run a corpus-io data command as N jobs and join their parts, the way Kaldi's run.pl / slurm.pl run
# `$cmd JOB=1:$nj log.JOB.log prog ...`. A recipe's cmd.sh picks the engine (--cmd local|slurm).
#
#   run_jobs.sh local JOB=1:N LOG [--merge PATH] -- corpus-io COMMAND ARGS...
#   run_jobs.sh slurm [SBATCH_OPTION...] JOB=1:N LOG [--merge PATH] -- corpus-io COMMAND ARGS...
#
# Job J runs `COMMAND ARGS... ++num_jobs=N ++job_index=J`, its output in LOG with JOB replaced by J
# (e.g. data/train/log/pack.JOB.log -> pack.2.log). With --merge PATH, `corpus-io merge-jobs ++path=PATH`
# joins the parts once every job succeeded (its log: JOB replaced by "merge").
#   local: the N jobs run at once as background processes; the first one that fails stops the others,
#          and the script exits 1 naming that job's log (and printing its tail).
#   slurm: one `sbatch --array=1-N` and a merge job with `--dependency=afterok` (SBATCH_OPTIONs go to
#          both: --partition, --time, --mem, --cpus-per-task, ...); waits for them, then exits 1 naming
#          the log of a task that failed or was cancelled. Rerun the same line to resubmit: jobs whose
#          part is complete skip their work (corpus-io's part records), so only the lost work is redone.
# Nothing from the command line is evaluated: arguments are passed as they are (slurm: quoted with
# printf %q into the job script).
set -euo pipefail

die() { echo "run_jobs.sh: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: run_jobs.sh local|slurm [SBATCH_OPTION...] JOB=1:N LOG [--merge PATH] -- COMMAND..."
mode=$1
shift
case "$mode" in local | slurm) ;; *) die "unknown engine '$mode': use local or slurm (--cmd local|slurm)" ;; esac
sbatch_opts=()
while [ $# -gt 0 ] && [[ $1 != JOB=* ]]; do
  [ "$mode" = slurm ] || die "option '$1' before JOB=1:N: only the slurm engine takes (sbatch) options"
  sbatch_opts+=("$1")
  shift
done
[ $# -ge 1 ] || die "missing JOB=1:N"
range=${1#JOB=}
shift
[[ $range =~ ^1:([0-9]+)$ ]] || die "JOB=$range: give JOB=1:N (jobs count from 1, as in Kaldi's JOB=1:\$nj)"
nj=${BASH_REMATCH[1]}
[ "$nj" -ge 1 ] || die "JOB=1:$nj: N must be at least 1"
[ $# -ge 1 ] || die "missing the log path (e.g. log/pack.JOB.log)"
log_template=$1
shift
[[ $log_template == *JOB* ]] || die "log path '$log_template' has no JOB (one log per job: log/name.JOB.log)"
merge=
if [ "${1:-}" = --merge ]; then
  [ $# -ge 2 ] || die "--merge needs a path"
  merge=$2
  shift 2
fi
[ "${1:-}" = -- ] && shift
[ $# -ge 1 ] || die "missing the command to run"
command=("$@")
log_of() { echo "${log_template//JOB/$1}"; }
mkdir -p "$(dirname "$(log_of 1)")"

tail_of() {  # tail_of LOG: its last lines, indented
  if [ -f "$1" ]; then tail -n 15 "$1" | sed 's/^/    /' >&2; fi
}

run_local() {
  local j pid failed=
  declare -A job_of=()
  for ((j = 1; j <= nj; j++)); do
    "${command[@]}" "++num_jobs=$nj" "++job_index=$j" > "$(log_of "$j")" 2>&1 &
    job_of[$!]=$j
  done
  while [ "${#job_of[@]}" -gt 0 ]; do
    set +e
    wait -n -p pid "${!job_of[@]}"
    rc=$?
    set -e
    j=${job_of[$pid]}
    unset "job_of[$pid]"
    if [ "$rc" -ne 0 ]; then
      failed=$j
      break
    fi
  done
  if [ -n "$failed" ]; then
    for pid in "${!job_of[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${!job_of[@]}"; do wait "$pid" 2>/dev/null || true; done
    echo "run_jobs.sh: job $failed of $nj failed (exit $rc): see $(log_of "$failed")" >&2
    tail_of "$(log_of "$failed")"
    exit 1
  fi
  if [ -n "$merge" ]; then
    if ! corpus-io merge-jobs "++path=$merge" > "$(log_of merge)" 2>&1; then
      echo "run_jobs.sh: merging the $nj parts of $merge failed: see $(log_of merge)" >&2
      tail_of "$(log_of merge)"
      exit 1
    fi
  fi
}

run_slurm() {
  local dir name script merge_script array_id merge_id j rc_file missing=
  dir=$(cd "$(dirname "$(log_of 1)")" && pwd)
  name=$(basename "$log_template" .log)
  name=${name//.JOB/}
  script="$dir/q/$name.sh"
  mkdir -p "$dir/q"
  rm -f "$dir/q/$name".*.rc
  {
    echo '#!/usr/bin/env bash'
    printf 'cd %q\n' "$PWD"
    printf '%q ' "${command[@]}" "++num_jobs=$nj"
    echo '"++job_index=$SLURM_ARRAY_TASK_ID"'
    printf 'rc=$?; echo $rc > %q.$SLURM_ARRAY_TASK_ID.rc; exit $rc\n' "$dir/q/$name"
  } > "$script"
  array_id=$(sbatch --parsable --job-name="$name" --array="1-$nj" --output="$(log_of %a)" \
    "${sbatch_opts[@]}" "$script")
  array_id=${array_id%%;*}
  echo "run_jobs.sh: submitted $name as Slurm job ${array_id} (array 1-$nj)" >&2
  ids=$array_id
  if [ -n "$merge" ]; then
    merge_script="$dir/q/$name.merge.sh"
    {
      echo '#!/usr/bin/env bash'
      printf 'cd %q\n' "$PWD"
      printf 'corpus-io merge-jobs %q\n' "++path=$merge"
      printf 'rc=$?; echo $rc > %q.merge.rc; exit $rc\n' "$dir/q/$name"
    } > "$merge_script"
    merge_id=$(sbatch --parsable --job-name="$name.merge" --dependency="afterok:$array_id" \
      --kill-on-invalid-dep=yes --output="$(log_of merge)" "${sbatch_opts[@]}" "$merge_script")
    merge_id=${merge_id%%;*}
    echo "run_jobs.sh: submitted the merge as Slurm job ${merge_id} (after job $array_id)" >&2
    ids="$ids,$merge_id"
  fi
  while [ -n "$(squeue -h -j "$ids" -o %i 2>/dev/null)" ]; do sleep "${RUN_JOBS_POLL:-2}"; done
  for ((j = 1; j <= nj; j++)); do
    rc_file="$dir/q/$name.$j.rc"
    if [ ! -f "$rc_file" ]; then
      echo "run_jobs.sh: job $j of $nj (Slurm $array_id, task $j) did not finish: cancelled, killed or" \
           "never started; see $(log_of "$j"). Rerun the same command to resubmit." >&2
      missing=1
    elif [ "$(cat "$rc_file")" != 0 ]; then
      echo "run_jobs.sh: job $j of $nj (Slurm $array_id, task $j) failed (exit $(cat "$rc_file")):" \
           "see $(log_of "$j")" >&2
      tail_of "$(log_of "$j")"
      missing=1
    fi
  done
  [ -z "$missing" ] || exit 1
  if [ -n "$merge" ] && [ "$(cat "$dir/q/$name.merge.rc" 2>/dev/null)" != 0 ]; then
    echo "run_jobs.sh: merging the $nj parts of $merge failed: see $(log_of merge)" >&2
    tail_of "$(log_of merge)"
    exit 1
  fi
}

"run_$mode"
