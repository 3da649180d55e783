"""recipes/tools/run_jobs.sh local: N jobs as background processes (Kaldi's run.pl `JOB=1:N log.JOB.log`), a log
per job, `++num_jobs=N ++job_index=J` appended, and the first failure stops the rest naming its log."""

from __future__ import annotations

import os
import sys
import time

from tests.conftest import REPO, hang_limit, run_bounded

RUN_JOBS = REPO / "recipes" / "tools" / "run_jobs.sh"

# A stand-in job: writes its pid and arguments to OUT/job.J, then sleeps S_J seconds and exits RC_J
JOB = """
import os, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
j = args["job_index"]
out = os.environ["OUT"]
open(f"{out}/job.{j}", "w").write(f"{os.getpid()} {args['num_jobs']} {j}")
print("job", j, "of", args["num_jobs"], "running")
time.sleep(float(os.environ.get(f"S_{j}", "0")))
sys.exit(int(os.environ.get(f"RC_{j}", "0")))
"""


def run_jobs(tmp_path, *args: str, env: dict | None = None):
    return run_bounded(["bash", str(RUN_JOBS), *args], 120, env=dict(os.environ, OUT=str(tmp_path), **(env or {})))


def test_local_jobs_run_with_their_index_and_a_log_each(tmp_path):
    result = run_jobs(tmp_path, "local", "JOB=1:3", f"{tmp_path}/log/fake.JOB.log", "--", sys.executable, "-c", JOB)
    assert result.returncode == 0, result.stderr
    for j in (1, 2, 3):
        assert (tmp_path / f"job.{j}").read_text().split()[1:] == ["3", str(j)]
        assert (tmp_path / "log" / f"fake.{j}.log").read_text() == f"job {j} of 3 running\n"


def test_local_stops_on_the_first_failure_naming_its_log_and_ends_the_others(tmp_path):
    start = time.monotonic()
    result = run_jobs(tmp_path, "local", "JOB=1:3", f"{tmp_path}/log/fake.JOB.log", "--", sys.executable, "-c", JOB,
                      env={"S_1": f"{hang_limit(600):.0f}", "S_3": f"{hang_limit(600):.0f}", "S_2": "0.5", "RC_2": "3"})
    assert result.returncode == 1
    assert f"job 2 of 3 failed (exit 3): see {tmp_path}/log/fake.2.log" in result.stderr, result.stderr
    assert "job 2 of 3 running" in result.stderr  # the tail of its log
    assert time.monotonic() - start < hang_limit(50)  # it did not wait for the 10-minute jobs
    for j in (1, 3):
        pid = int((tmp_path / f"job.{j}").read_text().split()[0])
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_bad_job_ranges_and_options_are_refused(tmp_path):
    bad = run_jobs(tmp_path, "local", "JOB=0:3", "log.JOB.log", "--", "true")
    assert bad.returncode == 2 and "jobs count from 1" in bad.stderr
    bad = run_jobs(tmp_path, "local", "--time=1:00", "JOB=1:3", "log.JOB.log", "--", "true")
    assert bad.returncode == 2 and "only the slurm engine" in bad.stderr
    bad = run_jobs(tmp_path, "pbs", "JOB=1:3", "log.JOB.log", "--", "true")
    assert bad.returncode == 2 and "use local or slurm" in bad.stderr
