"""User-facing errors.

A :class:`CorpusIOError` is a mistake the user can fix (bad input, bad config).
The CLI prints its message as one paragraph and exits non-zero, without a
Python traceback. Programming errors stay ordinary exceptions.
"""


class CorpusIOError(Exception):
    """An error caused by user input; the message says where and what to do."""

    exit_code = 2


class ConfigError(CorpusIOError):
    """An invalid configuration key or value."""


class DataError(CorpusIOError):
    """Invalid or unreadable data: a table line, an audio file, a shard member."""


class WorkerDied(CorpusIOError):
    """A process of a parallel job died without a Python exception (a signal or a native crash).

    Not the user's mistake, but the remedy is theirs (fewer workers, more memory), so the CLI
    reports it as one paragraph too.
    """

    exit_code = 1
