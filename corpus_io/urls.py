"""Opening local paths, ``file://``, ``http(s)://``, ``s3://`` and (opt-in) commands.

Everything is opened for sequential reading. Remote URLs go through fsspec
(s3fs for ``s3://``), configured by ``storage_options`` or the standard AWS
environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``). Commands (a Kaldi ``cmd |`` entry or a ``pipe:cmd`` URL)
run only when the caller passes ``allow_pipe=True``, and never through a shell.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
from typing import IO, Any

from corpus_io.errors import DataError

REMOTE_SCHEMES = ("http://", "https://", "s3://", "gs://", "oss://")


class RemoteNotFoundError(DataError):
    """A remote URL could not be opened. HTTP servers under load answer 5xx and fsspec reports those as
    "not found" too, so loaders retry this one (``corpus_io.pipeline.read`` does)."""

    transient = True


def is_remote(url: str) -> bool:
    return url.startswith(REMOTE_SCHEMES)


def is_command(url: str) -> bool:
    return url.startswith("pipe:") or url.rstrip().endswith("|")


def local_path(url: str) -> str:
    return url[len("file://"):] if url.startswith("file://") else url


def _storage_options(url: str, storage_options: dict | None) -> dict:
    opts = dict(storage_options or {})
    if url.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in opts and "client_kwargs" not in opts:
            opts["endpoint_url"] = endpoint
    return opts


def command_argv(url: str) -> list[list[str]]:
    """Split ``pipe:a | b`` or Kaldi's ``a | b |`` into argv lists, one per process (no shell)."""
    text = url[len("pipe:"):] if url.startswith("pipe:") else url.rstrip()[:-1]
    tokens = shlex.split(text)
    stages: list[list[str]] = [[]]
    for token in tokens:
        if token == "|":
            stages.append([])
        else:
            stages[-1].append(token)
    if any(not argv for argv in stages):
        raise DataError(f"cannot parse the command '{url}': an empty stage between pipes.")
    return stages


class CommandStream(io.RawIOBase):
    """stdout of a chain of processes; closing it waits and reports a non-zero exit."""

    def __init__(self, url: str):
        self.url = url
        self._procs: list[subprocess.Popen] = []
        prev = None
        try:
            for argv in command_argv(url):
                proc = subprocess.Popen(argv, stdin=prev, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                if prev is not None:
                    prev.close()
                prev = proc.stdout
                self._procs.append(proc)
        except FileNotFoundError as exc:
            raise DataError(f"cannot run '{url}': program {exc.filename!r} not found.") from None
        self._out = prev

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._out.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        self._out.close()
        errors = []
        for proc in self._procs:
            proc.wait()
            if proc.returncode != 0:
                errors.append(f"{proc.args[0]} exited {proc.returncode}: "
                              f"{proc.stderr.read().decode(errors='replace').strip()[:200]}")
            proc.stderr.close()
        super().close()
        if errors:
            raise DataError(f"command '{self.url}' failed: {'; '.join(errors)}")


def check_regular_file(path: str) -> None:
    """Refuse a local path that is not a regular file before opening it: a FIFO would block the open (or
    the read) forever, and a device such as /dev/zero never ends. Missing paths are left to the opener."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device")
    raise DataError(f"{path} is {kind}, not a regular file; corpus-io reads data only from regular files or URLs "
                    f"(a FIFO would block forever and a device such as /dev/zero never ends). Point the entry at "
                    f"a file, or use a pipe:/'cmd |' entry with ++allow_pipe=true for a stream you trust.")


def open_url(url: str, *, storage_options: dict | None = None, allow_pipe: bool = False,
             block_size: int = 1 << 20) -> IO[bytes]:
    """Open ``url`` for sequential binary reading (no whole-file download, no seek required)."""
    if is_command(url):
        if not allow_pipe:
            raise DataError(f"'{url}' is a command. Commands from data lists are off by default; "
                            f"enable them with ++allow_pipe=true (or ++dataset_conf.allow_pipe=true) "
                            f"if you trust the list.")
        return io.BufferedReader(CommandStream(url), buffer_size=block_size)
    if is_remote(url):
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(url, **_storage_options(url, storage_options))
            return fs.open(path, "rb", block_size=block_size)
        except FileNotFoundError:
            raise RemoteNotFoundError(f"{url} does not exist on the server (or the server did not answer "
                                      f"with it).") from None
    check_regular_file(local_path(url))
    try:
        return open(local_path(url), "rb", buffering=block_size)
    except FileNotFoundError:
        raise DataError(f"{url} does not exist. Check the path (relative paths are relative to the "
                        f"current directory).") from None
    except OSError as exc:
        raise DataError(f"cannot open {url}: {exc.strerror}.") from None


def read_url(url: str, **kwargs: Any) -> bytes:
    with open_url(url, **kwargs) as f:
        return f.read()
