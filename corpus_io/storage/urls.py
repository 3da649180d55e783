"""Opening local paths, ``file://``, ``http(s)://``, ``s3://`` and (opt-in) commands.

Everything is opened for sequential reading. Remote URLs go through fsspec
(s3fs for ``s3://``), configured by ``storage_options`` or the standard AWS
environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``). Commands (a Kaldi ``cmd |`` entry or a ``pipe:cmd`` URL)
run only when the caller passes ``allow_pipe=True``, and never through a shell.

``http(s)://`` is read with one plain GET streamed front to back (no Range requests, so any server
works, ``python -m http.server`` included); only header probes and random-access readers (``seekable=True``)
use fsspec's ranged reads, and where the server ignores Range a random-access reader reads the file whole, up
to :data:`MAX_WHOLE_BYTES` (:func:`read_whole`). Every network read is bounded in time:
``storage_options["read_timeout"]`` (seconds, default :data:`DEFAULT_READ_TIMEOUT`; the loader sets it from
``dataset_conf.read_timeout``) is the longest wait for a connection or for the next byte. A stall past it, a
refused connection and an HTTP 5xx are :class:`RemoteReadError` (transient: the loader retries them); only
an HTTP 404/410 says "does not exist". A command is bounded by ``storage_options["pipe_timeout"]`` (seconds,
default :data:`DEFAULT_PIPE_TIMEOUT`; set from ``pipe_timeout`` / ``dataset_conf.pipe_timeout``): past it its
processes are killed and the entry fails naming the key and the command line. Each process of a command
runs in a session (and process group) of its own, so what it starts (``sh -c '...'``, a background child)
is killed with it: at the time limit, when the stream is closed, and when this process exits normally.
"""

from __future__ import annotations

import atexit
import io
import os
import shlex
import signal
import subprocess
import threading
from typing import IO, Any

from corpus_io.errors import DataError

REMOTE_SCHEMES = ("http://", "https://", "s3://", "gs://", "oss://")


#: seconds without a connection or a byte before a network read fails (dataset_conf.read_timeout)
DEFAULT_READ_TIMEOUT = 30.0
#: the key a user raises for a slow server: the data-preparation commands take ``storage_options`` (a dict,
#: so ``++storage_options.read_timeout=60``); the loader sets ``read_timeout`` from ``dataset_conf.read_timeout``
#: and names that key in ``storage_options[TIMEOUT_KEY_OPTION]`` (popped before fsspec sees the options)
TIMEOUT_KEY = "storage_options.read_timeout"
TIMEOUT_KEY_OPTION = "read_timeout_key"


def timeout_key(storage_options: dict | None) -> str:
    """The config key that sets the read timeout of the command these options came from."""
    return str((storage_options or {}).get(TIMEOUT_KEY_OPTION) or TIMEOUT_KEY)
#: seconds a command entry (``cmd |`` or ``pipe:cmd``) may run before it is killed (``pipe_timeout``)
DEFAULT_PIPE_TIMEOUT = 300.0
PIPE_TIMEOUT_KEY = "pipe_timeout"  # scp2jsonl and pack-shards; dataset_conf.pipe_timeout in the loader


def pipe_timeout_key(storage_options: dict | None) -> str:
    """The config key of the command time limit, as the command these options came from spells it: the loader
    names its read-timeout key ``dataset_conf.read_timeout`` (:data:`TIMEOUT_KEY_OPTION`), so its pipe key is
    ``dataset_conf.pipe_timeout``; the data-preparation commands' is ``pipe_timeout``."""
    read_key = str((storage_options or {}).get(TIMEOUT_KEY_OPTION) or "")
    if read_key.endswith(".read_timeout") and not read_key.startswith("storage_options."):
        return read_key[: -len("read_timeout")] + PIPE_TIMEOUT_KEY
    return PIPE_TIMEOUT_KEY


class RemoteReadError(DataError):
    """A network read failed in a way a retry may cure (stall, reset, refused, HTTP 5xx)."""

    transient = True


class URLNotFoundError(DataError):
    """An HTTP server answered 404/410: the URL names nothing (not retried; :func:`open_if_exists` says None)."""


class RemoteNotFoundError(DataError):
    """A remote URL could not be opened. HTTP servers under load answer 5xx and fsspec reports those as
    "not found" too, so loaders retry this one (``corpus_io.loader.read`` does)."""

    transient = True


def is_remote(url: str) -> bool:
    return url.startswith(REMOTE_SCHEMES)


def is_command(url: str) -> bool:
    return url.startswith("pipe:") or url.rstrip().endswith("|")


def local_path(url: str) -> str:
    return url[len("file://"):] if url.startswith("file://") else url


def beside(url: str, relative: str) -> str:
    """The path or URL ``relative`` names from the directory of ``url`` (``..`` resolved). A URL keeps its
    scheme and host and loses its query: ``os.path`` or ``pathlib`` would turn ``s3://b/x`` into ``s3:/b/x``."""
    import posixpath
    from urllib.parse import urlsplit, urlunsplit

    if "://" not in url:
        return os.path.normpath(os.path.join(os.path.dirname(url), relative))
    parts = urlsplit(url)
    path = posixpath.normpath(posixpath.join(posixpath.dirname(parts.path) or "/", relative))
    return urlunsplit((parts.scheme, parts.netloc, path if path.startswith("/") else "/" + path, "", ""))


def read_timeout(storage_options: dict | None) -> float:
    """The per-wait network bound in seconds (``storage_options["read_timeout"]``, else the default)."""
    value = (storage_options or {}).get("read_timeout")
    return DEFAULT_READ_TIMEOUT if value is None else float(value)


def _storage_options(url: str, storage_options: dict | None) -> dict:
    """fsspec's options for ``url``, with the read timeout turned into the backend's own settings."""
    opts = dict(storage_options or {})
    timeout = read_timeout(opts)
    opts.pop("read_timeout", None)
    opts.pop(PIPE_TIMEOUT_KEY, None)
    opts.pop(TIMEOUT_KEY_OPTION, None)
    if url.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in opts and "client_kwargs" not in opts:
            opts["endpoint_url"] = endpoint
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        opts["config_kwargs"] = config
    elif url.startswith(("http://", "https://")):
        import aiohttp

        client = dict(opts.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout))
        opts["client_kwargs"] = client
    return opts


def filesystem(url: str, storage_options: dict | None = None, *, fresh: bool = False) -> tuple[Any, str]:
    """``(fsspec filesystem, path)`` for a remote ``url``, configured as the readers configure it
    (``storage_options``, the AWS environment, the read timeout). ``fresh``: a new instance, not fsspec's
    cached one, whose connections close when it is dropped: a process that forks workers (pack-shards)
    then holds no pooled connection that a child could close under it."""
    import fsspec

    opts = _storage_options(url, storage_options)
    if fresh:
        opts["skip_instance_cache"] = True
    return fsspec.core.url_to_fs(url, **opts)


def _stall_message(url: str, timeout: float, key: str = TIMEOUT_KEY) -> str:
    return (f"{url}: no answer from the server for {timeout:g} s (the bound is {key}={timeout:g} s). "
            f"Check the server, or raise ++{key} for a slow one.")


class HTTPStream(io.RawIOBase):
    """The body of one plain GET, read front to back; every wait is bounded by ``timeout`` seconds."""

    def __init__(self, url: str, timeout: float, headers: dict | None = None, key: str = TIMEOUT_KEY):
        import urllib.error
        import urllib.request

        url, auth = split_credentials(url)
        self.url = url
        self.timeout = timeout
        self.key = key
        request = urllib.request.Request(url, headers={"User-Agent": "corpus-io", **auth, **(headers or {})})
        try:
            self._response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - http(s) only
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in (404, 410):
                raise URLNotFoundError(f"{url} does not exist on the server (HTTP {exc.code}). Check the URL in "
                                       f"the list.") from None
            error = RemoteReadError if exc.code >= 500 or exc.code in (408, 429) else DataError
            raise error(f"{url}: the server answered HTTP {exc.code} {exc.reason}.") from None
        except (TimeoutError, OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise RemoteReadError(_stall_message(url, timeout, key)) from None
            raise RemoteReadError(f"{url}: cannot connect ({reason}).") from None

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            return self._response.readinto(b)
        except TimeoutError:
            raise RemoteReadError(_stall_message(self.url, self.timeout, self.key)) from None
        except (OSError, ValueError) as exc:  # reset, or http.client.IncompleteRead (a ValueError subclass)
            raise RemoteReadError(f"{self.url}: the connection broke while reading "
                                  f"({type(exc).__name__}: {exc}).") from None

    def close(self) -> None:
        if not self.closed:
            self._response.close()
        super().close()


def split_credentials(url: str) -> tuple[str, dict]:
    """``(url without user info, {"Authorization": "Basic ..."})`` for ``http(s)://user:password@host/...``
    (percent-escapes in the user info decoded); ``(url, {})`` when it has none. urllib would take
    ``user:password@host`` for the host name."""
    import base64
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return clean, {"Authorization": f"Basic {token}"}


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


# the process groups of the commands running now: pgid -> the pid of the process that started them (a forked
# child inherits the table, and must not kill its parent's commands)
_LIVE_GROUPS: dict[int, int] = {}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


@atexit.register
def _kill_live_groups() -> None:
    """At a normal exit (an error, Ctrl-C), the commands this process still runs die with it: they are in
    groups of their own, which a terminal's Ctrl-C or a kill of our group does not reach."""
    me = os.getpid()
    for pgid, owner in list(_LIVE_GROUPS.items()):
        if owner == me:
            _kill_group(pgid)


class _StderrTail:
    """Reads a process's stderr to its end in a thread of its own and keeps the last ``keep`` bytes.

    A command that writes more than the pipe holds (64 KiB on Linux: a chatty sox, a decoder's warnings)
    would otherwise block on stderr, never finish, and be reported as a timeout."""

    def __init__(self, pipe: IO[bytes], keep: int = 4096):
        self._pipe, self._keep, self._tail = pipe, keep, bytearray()
        self.truncated = False
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        fd = self._pipe.fileno()
        try:
            while chunk := os.read(fd, 65536):
                self._tail += chunk
                if len(self._tail) > self._keep:
                    del self._tail[: len(self._tail) - self._keep]
                    self.truncated = True
        except OSError:
            pass
        finally:
            self._pipe.close()

    def text(self, wait: float = 2.0) -> str:
        """The kept tail, whitespace folded; waits up to ``wait`` seconds for the pipe's end (a process that
        escaped its group may hold it open)."""
        self._thread.join(wait)
        said = " ".join(bytes(self._tail).decode(errors="replace").split())
        return ("…" + said[-200:].lstrip()) if self.truncated or len(said) > 200 else said


class CommandStream(io.RawIOBase):
    """stdout of a chain of processes; closing it waits and reports a non-zero exit.

    Each process runs in a session of its own (no terminal to wait on, and a process group that holds what
    it starts). ``timeout`` seconds after the start every process group of the chain is killed (a command
    that never ends, ``sleep 1000 |``, or one whose child keeps stdout open, ``sh -c 'sleep 1000; true' |``,
    would hang the job) and reading or closing the stream is a DataError naming ``key`` (the config key of
    the limit) and the command line. Closing the stream also kills what the commands left running."""

    def __init__(self, url: str, timeout: float = DEFAULT_PIPE_TIMEOUT, key: str = PIPE_TIMEOUT_KEY):
        self.url = url
        self.timeout = timeout
        self.key = key
        self.timed_out = False
        self._finished = False
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self._stderr: list[_StderrTail] = []
        prev = None
        try:
            for argv in command_argv(url):
                proc = subprocess.Popen(argv, stdin=prev, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
                _LIVE_GROUPS[proc.pid] = os.getpid()
                self._stderr.append(_StderrTail(proc.stderr))
                if prev is not None:
                    prev.close()
                prev = proc.stdout
                self._procs.append(proc)
        except OSError as exc:
            if prev is not None:
                prev.close()
            self._kill()
            self._reap()
            if isinstance(exc, FileNotFoundError):
                raise DataError(f"cannot run '{url}': program {exc.filename!r} not found.") from None
            raise DataError(f"cannot run '{url}': {exc.strerror or exc} ({exc.filename!r}).") from None
        self._out = prev
        self._timer = threading.Timer(timeout, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self.timed_out = True
        self._kill()

    def _kill(self) -> None:
        """SIGKILL to every process group of the chain (what the commands started included)."""
        for proc in self._procs:
            _kill_group(proc.pid)

    def _reap(self) -> None:
        for proc in self._procs:
            proc.wait()
            if proc.stdout is not None and not proc.stdout.closed:
                proc.stdout.close()
            _LIVE_GROUPS.pop(proc.pid, None)  # stderr: its _StderrTail closes it at its end

    def _timeout_error(self) -> DataError:
        return DataError(f"command '{self.url}' did not finish within {self.timeout:g} s and was stopped (the bound "
                         f"is {self.key}={self.timeout:g} s). Run the command by hand to see why it hangs, or raise "
                         f"++{self.key} for a slow one.")

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._out.read(len(b))
        if not data and self.timed_out:
            raise self._timeout_error()
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        self._out.close()
        for proc in self._procs:  # bounded: the timer still runs, and kills the chain at the time limit
            proc.wait()
        with self._lock:
            self._finished = True
        self._timer.cancel()
        self._kill()  # what the commands left behind in their groups (a background child)
        if self.timed_out:
            self._reap()
            super().close()
            raise self._timeout_error()
        errors = []
        for proc, stderr in zip(self._procs, self._stderr):
            if proc.returncode != 0:
                said = stderr.text().rstrip(".")
                errors.append(f"{proc.args[0]} exited {proc.returncode}"
                              + (f" saying: {said}" if said else " with no message on stderr"))
        self._reap()
        super().close()
        if errors:
            raise DataError(f"command '{self.url}' failed: {'; '.join(errors)}.")


#: where each command turns pipes on, for the messages that refuse one
_ENABLE_PIPES = "scp2jsonl and pack-shards: ++allow_pipe=true; the loader: ++dataset_conf.allow_pipe=true"


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
                    f"a file, or, for a stream you trust, use a pipe:/'cmd |' entry ({_ENABLE_PIPES}).")


def open_url(url: str, *, storage_options: dict | None = None, allow_pipe: bool = False,
             block_size: int = 1 << 20, seekable: bool = False, cache_type: str | None = None) -> IO[bytes]:
    """Open ``url`` for sequential binary reading (no whole-file download, no seek required).

    ``seekable=True`` (header probes): a remote file that can seek, through fsspec's ranged reads; ``cache_type``:
    fsspec's cache of such a file (``"none"``: each read is one range request, for a reader such as parquet's that
    asks for exactly the ranges it needs).
    ``block_size``: the read buffer in bytes (0: a local file unbuffered, a raw ``FileIO``).
    """
    if is_command(url):
        if not allow_pipe:
            raise DataError(f"'{url}' is a command. Commands from data lists are off by default; if you trust "
                            f"the list, enable them ({_ENABLE_PIPES}; other commands read only files and URLs).")
        timeout = float((storage_options or {}).get(PIPE_TIMEOUT_KEY) or DEFAULT_PIPE_TIMEOUT)
        return io.BufferedReader(CommandStream(url, timeout, pipe_timeout_key(storage_options)),
                                 buffer_size=block_size)
    if url.startswith(("http://", "https://")) and not seekable:
        opts = storage_options or {}
        return io.BufferedReader(HTTPStream(url, read_timeout(opts), opts.get("headers"), timeout_key(opts)),
                                 buffer_size=block_size)
    if is_remote(url):
        try:
            fs, path = filesystem(url, storage_options)
            return fs.open(path, "rb", block_size=block_size, **({"cache_type": cache_type} if cache_type else {}))
        except FileNotFoundError as exc:
            cause = exc.__cause__ if url.startswith(("http://", "https://")) else None
            if cause is not None and "timeout" in type(cause).__name__.lower():
                raise RemoteReadError(_stall_message(url, read_timeout(storage_options),
                                                     timeout_key(storage_options))) from None
            if cause is not None and getattr(cause, "status", 404) != 404:  # fsspec says "not found" for a 5xx
                raise RemoteReadError(f"{url}: the server answered HTTP {cause.status}.") from None
            if isinstance(cause, Exception) and not hasattr(cause, "status"):
                raise RemoteReadError(f"{url}: cannot read it ({type(cause).__name__}: {cause}).") from None
            raise RemoteNotFoundError(f"{url} does not exist on the server (or the server did not answer "
                                      f"with it).") from None
        except Exception as exc:
            why = _unreachable(exc)
            if why is not None:
                raise RemoteReadError(_unreachable_message(url, storage_options, why)) from None
            if type(exc).__name__ != "NoCredentialsError":  # botocore's, for s3:// without any credentials
                raise
            raise DataError(f"{url}: no credentials for the object store. Give them in the storage_options of the "
                            f"command that reads it (the loader: dataset_conf.storage_options; key and secret, "
                            f"with client_kwargs.endpoint_url for a server other than AWS, or anon: true for a "
                            f"public bucket) or in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.") from None
    check_regular_file(local_path(url))
    try:
        return open(local_path(url), "rb", buffering=block_size)
    except FileNotFoundError:
        raise DataError(f"{url} does not exist. Check the path (relative paths are relative to the "
                        f"current directory).") from None
    except OSError as exc:
        raise DataError(f"cannot open {url}: {exc.strerror}.") from None


#: the exceptions (by type name: botocore, aiohttp and the OS) of an endpoint that cannot be connected to
_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionRefusedError",
                "ClientConnectorDNSError", "gaierror"}


def _unreachable(exc: BaseException) -> str | None:
    """What failed, where ``exc`` (or an exception it was raised from) says the server could not be connected to."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__name__ in _UNREACHABLE:
            return f"{type(exc).__name__}: {exc}"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1  # type: ignore[assignment]
    return None


def _unreachable_message(url: str, storage_options: dict | None, why: str) -> str:
    opts = storage_options or {}
    endpoint = (opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
                or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT_URL"))
    where = f"the object store at {endpoint}" if url.startswith("s3://") and endpoint else \
        "AWS S3" if url.startswith("s3://") else "its server"
    prefix = "dataset_conf.storage_options" if timeout_key(opts).startswith("dataset_conf.") else "storage_options"
    key = f"{prefix}.endpoint_url or AWS_ENDPOINT_URL" if url.startswith("s3://") else "the URL"
    return (f"{url}: cannot connect to {where} ({why}). Check {key} and that the server is up and reachable "
            f"from this machine (the connection wait is {timeout_key(opts)}={read_timeout(opts):g} s), then run "
            f"the command again.")


def open_if_exists(url: str, *, storage_options: dict | None = None) -> IO[bytes] | None:
    """:func:`open_url`, or None where ``url`` names nothing: a local path that is no file, an HTTP 404/410, an
    absent object-store key. Any other failure (no credentials, a stall, a 5xx) raises, so a sidecar that cannot
    be read is never taken for one that is not there."""
    if not is_remote(url):
        return open_url(url) if os.path.isfile(local_path(url)) else None
    try:
        return open_url(url, storage_options=storage_options)
    except URLNotFoundError:
        return None
    except RemoteNotFoundError:
        if url.startswith(("http://", "https://")):  # fsspec's http says "not found" for a 5xx too
            raise
        return None


#: bytes: the most a file on an HTTP server that ignores Range requests is read whole into memory, for a reader that
#: needs random access (parquet's footer, then its row groups)
MAX_WHOLE_BYTES = 1 << 30


def no_range_support(exc: BaseException) -> bool:
    """``exc`` is fsspec's answer to an HTTP server that sent the whole file (200) for a ranged read past its start."""
    return isinstance(exc, ValueError) and "support range requests" in str(exc)


def read_whole(url: str, *, storage_options: dict | None = None, max_bytes: int = MAX_WHOLE_BYTES) -> bytes:
    """The whole of ``url`` (one plain GET, streamed), for a random-access reader whose server ignores Range
    requests; a file past ``max_bytes`` is a DataError saying so (nothing beyond ``max_bytes + 1`` is read)."""
    with open_url(url, storage_options=storage_options) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DataError(f"{url}: the server does not answer Range requests (it sends the whole file), so this file "
                        f"would have to be read whole into memory, and it is larger than {max_bytes} bytes, the "
                        f"bound on such a read. Serve it from a server with Range support (an object store, nginx, "
                        f"the Hugging Face Hub), or copy it to a local disk.")
    return data


def read_url(url: str, **kwargs: Any) -> bytes:
    with open_url(url, **kwargs) as f:
        return f.read()
