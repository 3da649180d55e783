"""corpus_io.jobs: N and J (Kaldi's JOB=1:$nj, and `auto` from Slurm/SGE/PBS/LSF arrays), slices, run_job."""

from __future__ import annotations

import pytest

from corpus_io.errors import ConfigError
from corpus_io.jobs import JOB_COMMANDS, Job, resolve_job


@pytest.mark.parametrize("env, job", [
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, Job(3, 4)),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6"}, Job(1, 7)),
    ({"SGE_TASK_ID": "2", "SGE_TASK_FIRST": "1", "SGE_TASK_LAST": "5", "SGE_TASK_STEPSIZE": "1"}, Job(2, 5)),
    ({"LSB_JOBINDEX": "4", "LSB_JOBINDEX_END": "4"}, Job(4, 4)),
])
def test_auto_reads_the_array_task_and_size_of_slurm_sge_and_lsf(env, job):
    assert resolve_job("auto", "auto", env) == job


def test_auto_reads_pbs_array_index_with_the_count_given():
    assert resolve_job(3, "auto", {"PBS_ARRAY_INDEX": "2"}) == Job(2, 3)
    with pytest.raises(ConfigError, match="not the array's size"):
        resolve_job("auto", "auto", {"PBS_ARRAY_INDEX": "2"})


@pytest.mark.parametrize("env", [{}, {"SGE_TASK_ID": "undefined"}, {"LSB_JOBINDEX": "0"}])
def test_auto_outside_an_array_is_an_error_not_one_job(env):
    with pytest.raises(ConfigError, match="not an array job"):
        resolve_job("auto", "auto", env)


def test_a_given_num_jobs_that_disagrees_with_the_array_is_an_error():
    with pytest.raises(ConfigError, match="array has 4 tasks"):
        resolve_job(3, "auto", {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4"})


@pytest.mark.parametrize("index", [0, 5, -1])
def test_job_index_outside_1_to_n_names_the_convention(index):
    with pytest.raises(ConfigError, match=r"counts from 1 to num_jobs, as Kaldi's JOB=1:\$nj"):
        resolve_job(4, index, {})


def test_spans_cover_every_unit_once_in_order_also_with_more_jobs_than_units():
    for total in (0, 1, 6, 24):
        for n in (1, 2, 3, 7):
            spans = [Job(j, n).span(total) for j in range(1, n + 1)]
            assert [i for lo, hi in spans for i in range(lo, hi)] == list(range(total))


def test_every_job_command_runs_the_function_its_cli_row_runs():
    from cli.commands import COMMANDS

    runs = {c.name: c.run for c in COMMANDS}
    assert {name: run for name, (_, run, _) in JOB_COMMANDS.items()} == {name: runs[name] for name in JOB_COMMANDS}
    assert runs["merge-jobs"] == "corpus_io.jobs:merge_jobs"
