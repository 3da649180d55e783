"""Jobs: one data command run as N jobs, on one machine or many.

``parts`` splits a command into jobs (``++num_jobs``/``++job_index``, Kaldi's ``JOB=1:$nj``, scheduler
arrays), writes and checks their part records and joins them (``merge-jobs``); ``executors`` submits the
jobs to an engine (Dask). The commands a job runs are named by ``"module:function"`` strings
(``parts.JOB_COMMANDS``), imported only when a job runs.

May import: ``corpus_io.storage``, ``corpus_io.config``, ``corpus_io.keys``, ``corpus_io.errors``; never
tables, audio or anything above (tables and shards import it).
"""


def __getattr__(name: str):
    """The old module's names (``corpus_io.jobs.run_job``, the executor API) until corpus-io 0.2, with a
    DeprecationWarning: they live in :mod:`corpus_io.jobs.parts`."""
    from corpus_io import _moved_attribute

    return _moved_attribute(__name__, name, "corpus_io.jobs.parts")

