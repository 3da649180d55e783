"""User-facing errors.

A :class:`CorpusIOError` is a mistake the user can fix (bad input, bad config).
The CLI prints its message as one paragraph and exits non-zero, without a
Python traceback. Programming errors stay ordinary exceptions.

No message shows a URL's credentials: ``scheme://user:password@host`` is written
``scheme://***@host`` (:func:`redact`), in every error, whichever code wrote the URL into it.
"""

import re

_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@'\"]+@")


def redact(text: str) -> str:
    """``text`` with the user info (``user:password@``) of every URL in it replaced by ``***@``."""
    return _USERINFO.sub(r"\1***@", text)


def excerpt(text: str, limit: int = 60) -> str:
    """``text`` quoted (``repr``), whole when at most ``limit`` characters, else its first ``limit``, an
    ellipsis and its length: a message quotes user data (a hotword, a line) without echoing a megabyte."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


class CorpusIOError(Exception):
    """An error caused by user input; the message says where and what to do (credentials redacted)."""

    exit_code = 2

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


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
