"""Executors: the N jobs of a command (corpus_io.jobs.parts) submitted to an engine, then merged.

``++executor=dask ++executor_address=tcp://host:port`` (the ``[dask]`` extra): every job is
:func:`corpus_io.jobs.parts.run_job` submitted to an existing Dask cluster with ``pure=False`` (equal
arguments are never deduplicated). A job is idempotent and commits atomically (its outputs, then its
part record), so a task the scheduler reruns after a worker died ends with the same bytes. When all
N are done, ``merge-jobs`` joins the parts here, as one job would have written them.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from corpus_io.errors import ConfigError
from corpus_io.jobs.parts import merge_jobs, run_job

# the option that names P (what merge-jobs joins) for each command that runs as jobs
MERGE_PATH = {"pack-shards": "output_dir", "scp2jsonl": "jsonl_file_out", "compute-cmvn": "output",
              "add-field": "input", "verify-shards": "input", "segment": "output_dir",
              "score": "output_dir", "decode": "output_dir"}


def run_on_dask(command: str, overrides: list[str], cfg: Any) -> Any:
    """Run ``cfg.num_jobs`` jobs of ``command`` (the CLI's ``overrides``) on the Dask cluster at
    ``cfg.executor_address``, then merge them; returns merge-jobs' result."""
    from distributed import Client

    num_jobs = cfg.num_jobs
    if not isinstance(num_jobs, int) or num_jobs < 1:
        raise ConfigError(f"++executor=dask needs ++num_jobs=N (a number, not {num_jobs!r}): the executor submits "
                          f"jobs 1..N itself.")
    if not cfg.executor_address:
        raise ConfigError("++executor=dask needs ++executor_address=tcp://host:port, the scheduler of a running "
                          "Dask cluster (dask scheduler; dask worker tcp://host:port).")
    kept = [o for o in overrides if not re.match(r"\+*(executor|executor_address|num_jobs|job_index)=", o)]
    kept.append("++executor=local")
    with Client(cfg.executor_address, timeout=60) as client:
        futures = [client.submit(run_job, command, kept, j, num_jobs, pure=False, retries=2)
                   for j in range(1, num_jobs + 1)]
        client.gather(futures)
    # what=: the tag of these jobs' part records, so another command's parts beside P (verify-shards and add-field
    # both keep theirs beside the data.list) are left alone instead of refusing a merge this command cannot steer
    return merge_jobs(SimpleNamespace(path=getattr(cfg, MERGE_PATH[command]), what=part_tag(command, cfg),
                                      check="size", storage_options=getattr(cfg, "storage_options", None)))


def part_tag(command: str, cfg: Any) -> str:
    """The tag of ``command``'s part records (jobs.Place): the command, add-field's with its field."""
    return f"add-field-{cfg.field}" if command == "add-field" else command
