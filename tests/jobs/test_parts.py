"""corpus_io.jobs.parts: N and J (Kaldi's JOB=1:$nj, and `auto` from Slurm/SGE/PBS/LSF arrays), slices, run_job."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from corpus_io.errors import ConfigError
from corpus_io.jobs.parts import JOB_COMMANDS, Job, resolve_job


@pytest.mark.parametrize("env, job", [
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, Job(3, 4)),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6"}, Job(1, 7)),
    # sbatch --array=1-9:2 (tasks 1 3 5 7 9): task 7 is the 4th of 5, with or without _COUNT
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "9",
      "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "5"}, Job(4, 5)),
    ({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "9",
      "SLURM_ARRAY_TASK_STEP": "2"}, Job(5, 5)),
    ({"SLURM_ARRAY_TASK_ID": "6", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "7",
      "SLURM_ARRAY_TASK_STEP": "3"}, Job(3, 3)),  # --array=0-7:3: tasks 0 3 6
    ({"SGE_TASK_ID": "2", "SGE_TASK_FIRST": "1", "SGE_TASK_LAST": "5", "SGE_TASK_STEPSIZE": "1"}, Job(2, 5)),
    # qsub -t 2-10:4 (tasks 2 6 10): task 10 is the 3rd of 3
    ({"SGE_TASK_ID": "10", "SGE_TASK_FIRST": "2", "SGE_TASK_LAST": "10", "SGE_TASK_STEPSIZE": "4"}, Job(3, 3)),
    ({"LSB_JOBINDEX": "4", "LSB_JOBINDEX_END": "4"}, Job(4, 4)),
    # bsub -J "x[1-9:2]" (tasks 1 3 5 7 9): LSF sets no start, so it is 1; task 7 is the 4th of 5
    ({"LSB_JOBINDEX": "7", "LSB_JOBINDEX_END": "9", "LSB_JOBINDEX_STEP": "2"}, Job(4, 5)),
    ({"LSB_JOBINDEX": "9", "LSB_JOBINDEX_END": "10", "LSB_JOBINDEX_STEP": "2"}, Job(5, 5)),  # END as given: [1-10:2]
    ({"LSB_JOBINDEX": "1", "LSB_JOBINDEX_END": "3", "LSB_JOBINDEX_STEP": "1", "LSB_JOBNAME": "pack"}, Job(1, 3)),
    # the start, where the job name holds the array's range (and it agrees with END and STEP)
    ({"LSB_JOBINDEX": "7", "LSB_JOBINDEX_END": "11", "LSB_JOBINDEX_STEP": "2", "LSB_JOBNAME": "x[3-11:2]"}, Job(3, 5)),
    ({"LSB_JOBINDEX": "6", "LSB_JOBINDEX_END": "8", "LSB_JOBNAME": "pack[5-8]%2"}, Job(2, 4)),
    ({"LSB_JOBINDEX": "3", "LSB_JOBINDEX_END": "9", "LSB_JOBNAME": "x[2-5]"}, Job(3, 9)),  # disagrees: start 1
])
def test_auto_reads_the_array_task_and_size_of_slurm_sge_and_lsf(env, job):
    assert resolve_job("auto", "auto", env) == job


@pytest.mark.parametrize("env, needles", [
    # sbatch --array=1,3,7: no _STEP, and 3 tasks where 1..7 holds 7
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "7",
      "SLURM_ARRAY_TASK_COUNT": "3"}, ["the Slurm array is not one range", "SLURM_ARRAY_TASK_COUNT=3",
                                       "--array=1,3,7", "sbatch --array=1-N", "++num_jobs=N ++job_index=J"]),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "9",
      "SLURM_ARRAY_TASK_STEP": "2"}, ["SLURM_ARRAY_TASK_ID=4 is not in the range 1..9 in steps of 2",
                                      "++num_jobs=N ++job_index=J"]),
    # bsub -J "x[2-10:2]": LSF does not say the start; from 1 by 2, task 4 is no index
    ({"LSB_JOBINDEX": "4", "LSB_JOBINDEX_END": "10", "LSB_JOBINDEX_STEP": "2"},
     ["LSB_JOBINDEX=4 is not an index of the LSF array", "from 1 (taken as 1, LSF's default",
      "LSB_JOBINDEX_STEP=2", 'bsub -J "name[1-N]"', "++num_jobs=N ++job_index=J"]),
    ({"LSB_JOBINDEX": "5", "LSB_JOBINDEX_END": "7", "LSB_JOBNAME": "x[1,5,7]"},
     ["the LSF array 'x[1,5,7]' (LSB_JOBNAME) is an index list, not one range", "++num_jobs=N ++job_index=J"]),
    # variables that are not one array: MAX below MIN, a task past MAX, a task before MIN with only COUNT
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_MAX": "3"},
     ["SLURM_ARRAY_TASK_MAX=3 is below SLURM_ARRAY_TASK_MIN=5", "sbatch --array=MIN-MAX",
      "++num_jobs=N ++job_index=J"]),
    ({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "4"},
     ["SLURM_ARRAY_TASK_ID=9 is above SLURM_ARRAY_TASK_MAX=4", "++num_jobs=N ++job_index=J"]),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"},
     ["SLURM_ARRAY_TASK_ID=0 is not in the range 1..4 in steps of 1", "++num_jobs=N ++job_index=J"]),
], ids=["slurm-index-list", "slurm-off-step", "lsf-off-step", "lsf-index-list", "slurm-max-below-min",
        "slurm-past-max", "slurm-before-min"])
def test_auto_refuses_an_array_that_is_not_one_range_and_says_what_to_pass(env, needles):
    with pytest.raises(ConfigError) as err:
        resolve_job("auto", "auto", env)
    for needle in needles:
        assert needle in str(err.value), f"{needle!r} not in: {err.value}"


def test_a_slurm_task_id_alone_names_the_missing_variables_and_what_to_set_and_writes_nothing(tmp_path, fixture_corpus,
                                                                                             monkeypatch):
    for name in ("SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_STEP",
                 "SGE_TASK_ID", "PBS_ARRAY_INDEX", "LSB_JOBINDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    with pytest.raises(ConfigError) as err:
        scp2jsonl_job(tmp_path / "o.jsonl", "auto", "auto", [fixture_corpus / "wav.scp", fixture_corpus / "text"])
    message = str(err.value)
    assert ("SLURM_ARRAY_TASK_ID=0 is set but SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_MAX, SLURM_ARRAY_TASK_COUNT are "
            "not") in message
    assert "SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX=N-1" in message and "++num_jobs=N ++job_index=J" in message
    assert "None" not in message
    assert list(tmp_path.iterdir()) == []


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
    from corpus_io.commands import COMMANDS

    runs = {c.name: c.run for c in COMMANDS}
    assert {name: run for name, (_, run, *_) in JOB_COMMANDS.items()} == {name: runs[name] for name in JOB_COMMANDS}
    assert runs["merge-jobs"] == "corpus_io.jobs.parts:merge_jobs"


# --------------------------------------------------------------------------- scp2jsonl as jobs


def scp2jsonl_job(out: Path, n: int, j: int, tables: list[Path], **kw) -> None:
    from corpus_io.config import Scp2JsonlConfig
    from corpus_io.tables.manifest import scp2jsonl

    scp2jsonl(Scp2JsonlConfig(scp_file_list=[str(t) for t in tables], jsonl_file_out=str(out), num_workers=1,
                              num_jobs=n, job_index=j, **kw))


@pytest.mark.parametrize("segments", [False, True], ids=["wav.scp", "segments"])
def test_scp2jsonl_n_jobs_merge_to_the_bytes_of_one_job(tmp_path, fixture_corpus, segments):
    from corpus_io.config import MergeJobsConfig
    from corpus_io.jobs.parts import merge_jobs

    d = fixture_corpus / "segments_dir" if segments else fixture_corpus
    kw = {"segments": str(d / "segments")} if segments else {}
    tables = [d / "wav.scp", d / "text"]
    scp2jsonl_job(tmp_path / "one.jsonl", 1, 1, tables, **kw)
    reference = (tmp_path / "one.jsonl").read_bytes()
    assert reference.count(b"\n") >= 4
    for n in (2, 3, 7):
        out = tmp_path / f"n{n}.jsonl"
        for j in range(1, n + 1):
            scp2jsonl_job(out, n, j, tables, **kw)
        assert not out.exists(), "a job of N > 1 wrote the final jsonl"
        merge_jobs(MergeJobsConfig(path=str(out)))
        assert out.read_bytes() == reference, n
        merge_jobs(MergeJobsConfig(path=str(out)))
        assert out.read_bytes() == reference


def test_scp2jsonl_rerun_job_is_skipped_and_a_missing_part_is_refused(tmp_path, fixture_corpus):
    from corpus_io.config import MergeJobsConfig
    from corpus_io.errors import DataError
    from corpus_io.jobs.parts import merge_jobs

    tables = [fixture_corpus / "wav.scp", fixture_corpus / "text"]
    out = tmp_path / "o.jsonl"
    scp2jsonl_job(out, 2, 1, tables)
    part = tmp_path / "o.jsonl.scp2jsonl.part-000001-of-000002"
    stamp = part.stat().st_mtime_ns
    scp2jsonl_job(out, 2, 1, tables)
    assert part.stat().st_mtime_ns == stamp  # the record proves it complete: not rewritten
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(DataError, match="part 2 of 2 is missing"):
        merge_jobs(MergeJobsConfig(path=str(out)))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_run_job_composes_the_cli_config_and_runs_that_one_job(tmp_path, fixture_corpus):
    from corpus_io.jobs.parts import run_job

    out = tmp_path / "o.jsonl"
    overrides = [f"++scp_file_list=[{fixture_corpus / 'wav.scp'},{fixture_corpus / 'text'}]",
                 f"++jsonl_file_out={out}", "++num_workers=1", "++num_jobs=9"]
    summary = run_job("scp2jsonl", overrides, 2, 3)
    assert summary.kept == 8  # lines 8..15 of 24
    assert (tmp_path / "o.jsonl.scp2jsonl.part-000002-of-000003.json").is_file()


@pytest.mark.parametrize("env", [
    {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "3"},
    {"SGE_TASK_ID": "2", "SGE_TASK_FIRST": "1", "SGE_TASK_LAST": "3"},
    {"LSB_JOBINDEX": "2", "LSB_JOBINDEX_END": "3"},
    {"PBS_ARRAY_INDEX": "2", "num_jobs": "3"},
], ids=["slurm", "sge", "lsf", "pbs"])
def test_a_command_with_auto_writes_the_slice_of_its_array_task(tmp_path, fixture_corpus, monkeypatch, env):
    for name in ("SLURM_ARRAY_TASK_ID", "SGE_TASK_ID", "PBS_ARRAY_INDEX", "LSB_JOBINDEX"):
        monkeypatch.delenv(name, raising=False)
    env = dict(env)
    num_jobs = env.pop("num_jobs", "auto")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "o.jsonl"
    scp2jsonl_job(out, num_jobs, "auto", [fixture_corpus / "wav.scp", fixture_corpus / "text"])
    part = tmp_path / "o.jsonl.scp2jsonl.part-000002-of-000003"
    keys = [line.split(" ", 1)[0] for line in (fixture_corpus / "wav.scp").read_text().splitlines()]
    assert [json.loads(x)["key"] for x in part.read_text().splitlines()] == keys[8:16]


def test_merge_refuses_a_record_whose_output_path_leaves_its_directory_and_writes_nothing(tmp_path, fixture_corpus):
    from corpus_io.config import MergeJobsConfig
    from corpus_io.errors import DataError
    from corpus_io.jobs.parts import merge_jobs
    from corpus_io.storage.files import file_sha256

    tables = [fixture_corpus / "wav.scp", fixture_corpus / "text"]
    work = tmp_path / "work"
    work.mkdir()
    out = work / "o.jsonl"
    for j in (1, 2):
        scp2jsonl_job(out, 2, j, tables)
    secret = tmp_path / "secret.txt"  # outside the run's directory: a merge must never copy it into the output
    secret.write_text("not for the jsonl\n")
    record = work / "o.jsonl.scp2jsonl.part-000002-of-000002.json"
    part = json.loads(record.read_text())
    part["outputs"][0] = {"file": "../secret.txt", "bytes": secret.stat().st_size, "sha256": file_sha256(secret)}
    record.write_text(json.dumps(part))
    before = sorted(p.name for p in work.iterdir())
    with pytest.raises(DataError) as err:
        merge_jobs(MergeJobsConfig(path=str(out)))
    assert (f"part record {record}: outputs[0].file is '../secret.txt', not a relative path inside the record's "
            f"directory") in str(err.value)
    assert "Delete it and rerun that job" in str(err.value)
    assert sorted(p.name for p in work.iterdir()) == before and not out.exists()


# --------------------------------------------------------------------------- merge-jobs' check levels (issue 47 item 7)


@pytest.fixture(scope="module")
def sealed_template(tmp_path_factory) -> Path:
    """3 pack-shards jobs of the shard fixture corpus (6 shards of 4), not merged; tests work on a copy."""
    from tests.shards.conftest import fixture_records, write_jsonl
    from tests.shards.test_shard_jobs import pack_jobs

    d = tmp_path_factory.mktemp("sealed")
    pack_jobs(write_jsonl(d / "in.jsonl", fixture_records()), d / "out", 3)
    return d / "out"


@pytest.fixture
def sealed_run(sealed_template, tmp_path) -> Path:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(sealed_template, out)  # copy2: the shards keep their mtimes, as a shared disk shows them
    return out


@pytest.fixture
def shard_reads(monkeypatch) -> list[str]:
    """The shards whose tar headers merge-jobs reads (the real reader, counted)."""
    from corpus_io.shards import fields

    read: list[str] = []
    real = fields.iter_main_without_audio

    def counted(url, *args, **kw):
        read.append(os.path.basename(str(url)))
        return real(url, *args, **kw)

    monkeypatch.setattr(fields, "iter_main_without_audio", counted)
    return read


def _merge(out: Path, **kw) -> None:
    from corpus_io.config import MergeJobsConfig
    from corpus_io.jobs.parts import merge_jobs

    merge_jobs(MergeJobsConfig(path=str(out), **kw))


def _same_size_other_keys(shard: Path) -> str:
    """Rewrite ``shard`` (its job's record untouched) with its first key changed, same length: a shard of the same
    size and other content, as a stale run or a hand copy would leave. Returns the new first key."""
    import io
    import tarfile

    members = []
    with tarfile.open(shard) as tar:
        for info in tar.getmembers():
            members.append((info, tar.extractfile(info).read()))
    first = members[0][0].name.split(".")[0]
    other = first[:-1] + ("X" if first[-1] != "X" else "Y")
    size = shard.stat().st_size
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, payload in members:
            info.name = info.name.replace(first, other)
            if info.name.endswith(".json"):
                payload = payload.replace(first.encode(), other.encode())
            tar.addfile(info, io.BytesIO(payload))
    assert shard.stat().st_size == size, "the stand-in must keep the shard's size"
    return other


def test_default_merge_trusts_sealed_shards_without_opening_them(sealed_run, shard_reads):
    _merge(sealed_run)
    assert shard_reads == [], "the default check opened shards whose jobs sealed them"
    assert len((sealed_run / "data.list").read_text().splitlines()) == 6


def test_merge_check_headers_reads_every_shard(sealed_run, shard_reads):
    _merge(sealed_run, check="headers")
    assert sorted(shard_reads) == [f"shard-{k:06d}.tar" for k in range(6)]


def test_default_merge_reads_the_shards_of_a_record_without_a_seal(sealed_run, shard_reads):
    record = sealed_run / "pack-shards.part-000002-of-000003.json"
    part = json.loads(record.read_text())
    for out in part["outputs"]:  # a record of the version before seals
        del out["seal"], out["mtime_ns"]
    record.write_text(json.dumps(part))
    _merge(sealed_run)
    assert sorted(shard_reads) == ["shard-000002.tar", "shard-000003.tar"]


def test_default_merge_refuses_a_shard_replaced_after_its_record_with_the_same_size(sealed_run, shard_reads):
    from corpus_io.errors import DataError

    other = _same_size_other_keys(sealed_run / "shard-000002.tar")
    with pytest.raises(DataError, match=re.escape(f"but utterance 1 of shard shard-000002.tar is '{other}'")):
        _merge(sealed_run)
    assert shard_reads == ["shard-000002.tar"], "only the shard whose mtime changed is read"
    assert not (sealed_run / "data.list").exists()


def test_a_same_size_shard_given_back_its_mtime_passes_stat_and_is_refused_by_check_headers(sealed_run):
    """What the default (stat) check cannot see, as documented: a shard replaced by one of the same size whose
    mtime is set back to its job's. ++check=headers reads it."""
    from corpus_io.errors import DataError

    shard = sealed_run / "shard-000002.tar"
    mtime = shard.stat().st_mtime_ns
    other = _same_size_other_keys(shard)
    os.utime(shard, ns=(mtime, mtime))
    with pytest.raises(DataError, match=re.escape(f"but utterance 1 of shard shard-000002.tar is '{other}'")):
        _merge(sealed_run, check="headers")
    _merge(sealed_run)  # trusted by stat: the documented limit
