# How run.sh runs its data-preparation jobs, as a Kaldi recipe's cmd.sh: --cmd local (the --nj jobs as
# background processes here) or --cmd slurm (an sbatch array of --nj tasks plus a dependent merge job).
# Put your cluster's sbatch options here: partition, account, time, memory, CPUs per task.
# shellcheck shell=bash disable=SC2034
slurm_opts=(--time=4:00:00)   # e.g. (--partition=cpu --account=speech --time=4:00:00 --mem-per-cpu=4G --cpus-per-task=4)
