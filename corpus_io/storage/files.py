"""Crash-safe file writing (temp name, then rename), resumable outputs with sidecars, JSON-line parsing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, TypeVar

from corpus_io.errors import ConfigError, DataError

UTF8_BOM = b"\xef\xbb\xbf"
T = TypeVar("T")


def temp_name(path: str | os.PathLike) -> Path:
    """The temp name used while ``path`` is being written (same directory, so rename is atomic)."""
    p = Path(path)
    return p.with_name(f".{p.name}.tmp-{os.getpid()}")


def remove_temp_files(directory: str | os.PathLike, is_ours: Callable[[str], bool]) -> int:
    """Delete the :func:`temp_name` files a killed run left in ``directory`` for final names that
    ``is_ours(final_name)`` accepts; returns how many. Call it before a rerun writes anything."""
    removed = 0
    for entry in os.scandir(directory):
        match = _TEMP.fullmatch(entry.name)
        if match and is_ours(match.group(1)) and entry.is_file():
            os.unlink(entry.path)
            removed += 1
    return removed


_TEMP = re.compile(r"\.(.+)\.tmp-\d+")


def refuse_non_directory(path: str | os.PathLike, *, what: str = "output directory") -> None:
    """A :class:`DataError` if ``path`` exists as something :func:`ensure_dir` cannot use (a file, a symbolic link
    that leads nowhere); nothing is created, so a command can check its output early, before slow set-up."""
    p = Path(path)
    if os.path.islink(p) and not os.path.exists(p):
        raise DataError(f"{what} {p} is a symbolic link that leads nowhere (to itself, a loop, or a missing "
                        f"target: {os.readlink(p)}). Point it at a directory or give another path.")
    if os.path.exists(p) and not os.path.isdir(p):
        raise DataError(f"{what} {p} is a file, not a directory. Give a directory path.")


def ensure_dir(path: str | os.PathLike, *, what: str = "output directory") -> Path:
    """``mkdir -p path``; a file in the way or a path that cannot be made is a :class:`DataError`."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        refuse_non_directory(p, what=what)
        raise DataError(f"{what} {p} is a file, not a directory. Give a directory path.") from None
    except OSError as exc:
        raise DataError(f"cannot create {what} {p}: {exc.strerror}. Check the path and its permissions.") from None
    return p


class UnnamedFile:
    """A file written in ``final``'s directory that has no name until :meth:`commit` gives it ``final``.

    On Linux it is an ``O_TMPFILE`` inode, so a writer killed at any point (even by SIGKILL, or with
    its parent) leaves nothing behind; :meth:`commit` links a new output straight under ``final``, and a
    rewrite under :func:`temp_name`, then renames it over ``final`` (both atomic; only a writer killed
    between that link and rename leaves the temp name, which a rerun's :func:`remove_temp_files` deletes).
    Where the filesystem has no ``O_TMPFILE`` the file is the visible
    :func:`temp_name` from the start (removed by :meth:`abort`, or by a rerun's :func:`remove_temp_files`).
    """

    def __init__(self, final: str | os.PathLike, mode: str = "wb", *, buffering: int = -1,
                 encoding: str | None = None, newline: str | None = None):
        self.final = Path(final)
        self.tmp = temp_name(self.final)
        fd = None
        if hasattr(os, "O_TMPFILE"):
            with contextlib.suppress(OSError):  # EOPNOTSUPP/EISDIR: this filesystem has no O_TMPFILE
                fd = os.open(self.final.parent, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o666)
        self.unnamed = fd is not None
        kwargs: dict = {"buffering": buffering, "encoding": encoding, "newline": newline}
        self.file: IO = os.fdopen(fd, mode, **kwargs) if fd is not None else open(self.tmp, mode, **kwargs)

    def commit(self, *, fsync: bool = False) -> None:
        """Give the file its final name. ``fsync``: its bytes, then its directory's entry, are on disk before this
        returns (a checkpoint that must survive a power cut, not only a killed process)."""
        self.file.flush()
        if fsync:
            os.fsync(self.file.fileno())
        if self.unnamed:
            try:  # a new output: linked straight under its final name, so no visible temp name ever exists
                self._link_to(self.final)
                self.file.close()
                if fsync:
                    _fsync_dir(self.final.parent)
                return
            except OSError:  # it exists (a rewrite: replaced atomically below), or no /proc
                pass
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)  # left by a writer of the same pid that was killed between link and rename
            try:
                self._link_to(self.tmp)
            except OSError:  # no /proc: copy the bytes out instead
                self._copy_to_tmp(fsync=fsync)
        self.file.close()
        os.replace(self.tmp, self.final)
        if fsync:
            _fsync_dir(self.final.parent)

    def _link_to(self, path: Path) -> None:
        """Give the unnamed inode the name ``path``. ``linkat(AT_SYMLINK_FOLLOW)`` through /proc/self/fd:
        os.link with default arguments calls link(2), which does not follow that magic link (EXDEV), so a
        ``src_dir_fd`` makes CPython use linkat with the follow flag."""
        proc_fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.link(str(self.file.fileno()), path, src_dir_fd=proc_fds, follow_symlinks=True)
        finally:
            os.close(proc_fds)

    def _copy_to_tmp(self, *, fsync: bool = False) -> None:
        fd, offset = self.file.fileno(), 0
        with open(self.tmp, "wb") as out:
            while chunk := os.pread(fd, 1 << 20, offset):
                out.write(chunk)
                offset += len(chunk)
            if fsync:
                out.flush()
                os.fsync(out.fileno())

    def abort(self) -> None:
        self.file.close()
        if not self.unnamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)


def _fsync_dir(directory: Path) -> None:
    """Put a rename or link in ``directory`` on disk (a filesystem that cannot fsync a directory is left as is)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8",
                 newline: str | None = "\n", fsync: bool = False, owner: str | None = None) -> Iterator[IO]:
    """Write an :class:`UnnamedFile`; it becomes ``path`` only if the block succeeds (nothing is left
    behind otherwise, even when the process is killed). ``fsync``: the file and its directory entry are on disk
    when the block ends (checkpoints). A binary ``mode`` gives a binary file that any writer takes
    (``torch.save(state, f)``, ``shutil.copyfileobj(src, f)``). ``owner`` (a command name): the file is then
    recorded as that command's (:func:`record_written`), which a rerun may replace (:func:`refuse_replacing_others`).

    An output that cannot be written (a directory in the way, no permission) is a :class:`DataError`
    naming ``path``, raised before anything is written.
    """
    final = Path(path)
    if final.is_dir():
        raise DataError(f"cannot write {final}: it is a directory. Give a file path for this output.")
    ensure_dir(final.parent, what=f"the directory of {final}")
    binary = "b" in mode
    try:
        out = UnnamedFile(final, mode, encoding=None if binary else encoding, newline=None if binary else newline)
    except OSError as exc:
        raise DataError(f"cannot write {final}: {exc.strerror}. Check the path and its permissions.") from None
    try:
        yield out.file
        out.commit(fsync=fsync)
    except BaseException:
        out.abort()
        raise
    if owner is not None:
        record_written(final, owner)


def write_checked(path: str | os.PathLike, data: bytes, check: Callable[[Path], T]) -> T:
    """Write ``data`` under ``path``'s :func:`temp_name`, call ``check(temp path)`` (which reads the file back and
    raises if it is wrong), then rename it to ``path``; returns what ``check`` returned. A failed check, or any
    error, removes the temp file: ``path`` is either its old self or the checked new file, never half-written."""
    final = Path(path)
    if final.is_dir():
        raise DataError(f"cannot write {final}: it is a directory. Give a file path for this output.")
    ensure_dir(final.parent, what=f"the directory of {final}")
    tmp = temp_name(final)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a killed writer's of the same pid
    try:
        f = open(tmp, "xb")  # created here, never opened through a link left at that name
    except OSError as exc:
        raise DataError(f"cannot write {final}: {exc.strerror}. Check the path and its permissions.") from None
    try:
        with f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        result = check(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return result


def read_json_object(path: str | os.PathLike, bad: Callable[[str], DataError]) -> dict:
    """The JSON object stored in ``path``; anything else raises ``bad(why)``, a DataError whose
    message names the file and says what to do (``why``: "is empty", "is not UTF-8 text", ...)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise bad(f"is not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise bad("is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); it may be truncated") \
            from None
    if not isinstance(data, dict):
        raise bad(f"holds a JSON {type(data).__name__}, not an object")
    return data


MAX_LINE_BYTES = 4 * 1024 * 1024  # bytes: one line of a table, jsonl or list; longer is not text (/dev/zero)
#: bytes: what a compressed text file (a .gz manifest, a Shar cuts file) may inflate to; more is refused as a
#: decompression bomb (the largest public corpora's cut manifests inflate to a few GiB)
MAX_INFLATED_BYTES = 16 * 1024 ** 3


def _too_long(path: str | os.PathLike, lineno: int, max_bytes: int) -> DataError:
    return DataError(f"{path}:{lineno}: the line is longer than {max_bytes} bytes (the per-line bound of text "
                     f"inputs), so this is not a text table, jsonl or list (a binary file or a device such as "
                     f"/dev/zero?). Point the option at the right file.")


def _too_blank(path: str | os.PathLike, lineno: int, run: int, max_bytes: int) -> DataError:
    return DataError(f"{path}:{lineno}: {run} bytes of blank lines in a row, more than the per-line bound of "
                     f"{max_bytes} bytes (blank lines count towards it): this is not a text table, jsonl or list "
                     f"but padding (a compressed file inflating to blank lines?). Point the option at the right "
                     f"file, or remove the blank lines.")


def _too_big(path: str | os.PathLike, max_total: int) -> DataError:
    return DataError(f"{path}: inflates to more than {max_total} bytes (the bound on what a compressed text file may "
                     f"inflate to, blank lines included), so it is refused as a decompression bomb. Point the option "
                     f"at the right file, or split it.")


def bounded_lines(f: IO[bytes], path: str | os.PathLike, max_bytes: int = MAX_LINE_BYTES,
                  max_total: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(lineno, raw line)`` of a binary file, like ``enumerate(f, 1)``, but bounded: a line longer than
    ``max_bytes``, or blank lines in a row adding up to more (a gzip inflating to a GiB of newlines reads in
    seconds, not minutes), is a DataError instead of an unbounded read (a device, or a binary file given as a
    table); ``max_total`` (an inflated stream: :data:`MAX_INFLATED_BYTES`) bounds the bytes of the whole file."""
    lineno = blank = total = 0
    while raw := f.readline(max_bytes + 1):
        lineno += 1
        if len(raw) > max_bytes:
            raise _too_long(path, lineno, max_bytes)
        total += len(raw)
        if max_total is not None and total > max_total:
            raise _too_big(path, max_total)
        if raw.isspace():
            blank += len(raw)
            if blank > max_bytes:
                raise _too_blank(path, lineno, blank, max_bytes)
        else:
            blank = 0
        yield lineno, raw


def copy_inflated(src: IO[bytes], dst: IO[bytes], path: str | os.PathLike, *, max_total: int = MAX_INFLATED_BYTES,
                  max_blank: int = MAX_LINE_BYTES) -> int:
    """Copy the inflated stream ``src`` of the compressed text file ``path`` into ``dst`` by 1 MiB reads, refusing
    it (a DataError naming ``path`` and the bound) once it passes ``max_total`` bytes or holds more than
    ``max_blank`` bytes without a character other than whitespace (blank lines); returns the bytes copied."""
    total = blank = 0
    while chunk := src.read(1 << 20):
        total += len(chunk)
        if total > max_total:
            raise _too_big(path, max_total)
        kept = len(chunk.rstrip())
        blank = blank + len(chunk) if kept == 0 else len(chunk) - kept
        if blank > max_blank:
            raise DataError(f"{path}: more than {max_blank} bytes of blank lines in a row (by inflated byte "
                            f"{total}), more than the per-line bound of text inputs (blank lines count towards "
                            f"it): this is not a manifest but padding (a compressed file inflating to blank "
                            f"lines?). Point the option at the right file, or remove the blank lines.")
        dst.write(chunk)
    return total


def iter_raw_lines(path: str | os.PathLike, *, what: str = "file") -> Iterator[tuple[int, bytes]]:
    """``(lineno, bytes)`` of a text file, streamed, with a leading UTF-8 BOM removed; lines are bounded
    (:func:`bounded_lines`).

    Opening errors become a :class:`DataError` naming the file.
    """
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot open {what} {path}: {exc.strerror}. Check the path.") from None
    with f:
        for lineno, raw in bounded_lines(f, path):
            if lineno == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
            yield lineno, raw


def parse_json_object(raw: bytes | str, where: str | Callable[[], str], hint: str) -> dict:
    """The JSON object on one line of a JSON-lines file, or a :class:`DataError` naming ``where``.

    ``where`` is ``"file:line"`` (or a function returning it, for readers that find the line number
    only when something is wrong); ``hint`` says what the line should hold or what to do.
    """
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise DataError(f"{_where(where)}: invalid UTF-8 (byte {exc.start}). {hint}") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{_where(where)}: not valid JSON ({exc.msg} at column {exc.colno}). {hint}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{_where(where)}: a JSON {type(obj).__name__}, not an object. {hint}")
    return obj


def _where(where: str | Callable[[], str]) -> str:
    return where if isinstance(where, str) else where()


# --------------------------------------------------------------------------- resumable outputs
# The crash-safe output protocol of pack-shards and add-field: an output is written under a temp name
# while its sha256 is computed, renamed, and then described by a hidden sidecar ``.<name>.json`` holding
# its size, sha256 and a digest of the inputs it was made from. A rerun keeps an output whose sidecar
# matches (same inputs, same bytes) and rewrites anything else; a sidecar is written last, so an output
# without one was never finished.


def inputs_digest(parts: object) -> str:
    """sha256 (hex) of ``parts`` as canonical JSON: what an output was made from."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sidecar_path(path: str | os.PathLike) -> Path:
    """The hidden stat file ``.<name>.json`` next to the output ``path``."""
    p = Path(path)
    return p.with_name(f".{p.name}.json")


def completed_output(path: str | os.PathLike, digest: str) -> dict | None:
    """The sidecar stat of ``path`` when the file is complete and was made from inputs with ``digest``
    (the sidecar's digest, byte count and sha256 all match), else None: the output must be (re)written."""
    try:
        stat = json.loads(sidecar_path(path).read_text(encoding="utf-8"))
        if stat.get("digest") != digest or os.path.getsize(path) != stat["bytes"]:
            return None
        if file_sha256(path) != stat["sha256"]:
            return None
        return stat
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_sidecar(path: str | os.PathLike, stat: dict) -> None:
    """Mark ``path`` complete: write its stat (``digest``, ``bytes``, ``sha256``, ...) atomically."""
    with atomic_write(sidecar_path(path)) as f:
        f.write(json.dumps(stat, sort_keys=True) + "\n")


class HashingWriter:
    """A binary file wrapper that counts and hashes the bytes written through it (no second read)."""

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self._sha.update(data)
        self.bytes += len(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


# --------------------------------------------------------------------------- outputs a command owns
# A command that writes fixed names into a directory the user names (decode's text, export-model's tokens.txt)
# replaces an existing file under such a name only when it wrote that file itself: each output it writes gets a
# sidecar (``.<name>.json``: the writer, size and sha256), and an existing output without one, or changed since
# (a data dir's transcripts, a file a person edited, a model dir's token list), is refused before any work.


def writer_digest(writer: str) -> str:
    """The sidecar digest of the outputs ``writer`` (a command name) wrote: :func:`completed_output` with it says
    whether a file is one of that command's, unchanged."""
    return inputs_digest({"written by": writer})


def record_written(path: str | os.PathLike, writer: str, **extra: object) -> None:
    """Mark ``path``, just written, as ``writer``'s own output (its sidecar: size, sha256, ``extra`` fields), so a
    rerun of ``writer`` may replace it (:func:`refuse_replacing_others`)."""
    write_sidecar(path, {"digest": writer_digest(writer), "writer": writer, "bytes": os.path.getsize(path),
                         "sha256": file_sha256(path), **extra})


def written_by(path: str | os.PathLike, writer: str) -> dict | None:
    """The sidecar of ``path`` when ``writer`` wrote it and it has not changed since (size and sha256), else None."""
    return completed_output(path, writer_digest(writer))


def refuse_replacing_others(outputs: Named, writer: str, *, way_out: str) -> None:
    """Before any work: a :class:`DataError` for the first of ``outputs`` (``(name, path)`` pairs, URLs skipped)
    that exists and that ``writer`` has no record of writing (:func:`written_by`), naming the file, why it is
    kept, and ``way_out`` (what to do)."""
    for name, path in _local(outputs):
        if not os.path.lexists(path) or written_by(path, writer) is not None:
            continue
        try:
            other = json.loads(sidecar_path(path).read_text(encoding="utf-8")).get("writer")
            why = f"{other} wrote it" if isinstance(other, str) and other != writer else "changed since"
        except (OSError, ValueError, AttributeError):
            why = f"no record {sidecar_path(path).name} beside it says it did"
        raise DataError(f"{name} {path} exists, and {writer} did not write it ({why}): it may be the transcripts "
                        f"of a data dir, a token list or a file someone edited, and {writer} would replace it. "
                        f"{way_out} Nothing was written.")


# --------------------------------------------------------------------------- outputs vs inputs
# One check, run by every command before it reads or writes anything: an output that is one of the
# command's inputs (the same path, a symbolic link to it, or a hard link: the same inode) would replace
# that input, and a later rerun would read the wrong file: refused, naming both.

Named = Iterable[tuple[str, "str | os.PathLike | None"]]
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


def is_url(path: str | os.PathLike) -> bool:
    """``scheme://...`` (s3://, http://, file://, ...), as opposed to a local path."""
    return bool(_URL_SCHEME.match(str(path)))


def refuse_remote_output(path: str | os.PathLike | None, name: str, command: str, *, objects: bool = False) -> None:
    """The one check of an output given as a URL, before any work: a command that writes local files only is given
    a URL (``++output_dir=s3://...``), or one that also uploads to object storage (``objects``: ``s3://``, by
    :func:`corpus_io.storage.objects.put_object`) another kind of URL: a ConfigError, instead of a local
    ``./s3:/...`` tree."""
    if path is None or not is_url(path) or (objects and is_object_url(path)):
        return
    scheme = str(path).split("://")[0]
    if objects:
        raise ConfigError(f"{name}={path} is a {scheme}:// URL, but {command} writes a local file or an object on "
                          f"object storage ({', '.join(OBJECT_SCHEMES)}) only. Give a local path or an s3:// URL.")
    raise ConfigError(f"{name}={path} is a URL, but {command} writes local files only (it would create a "
                      f"local directory named '{scheme}:'). Give a local path, and copy the result to the remote "
                      f"store afterwards (e.g. aws s3 cp --recursive).")


def _identity(path: str) -> tuple[str, tuple[int, int] | None]:
    try:
        st = os.stat(path)
        inode = (st.st_dev, st.st_ino)
    except (OSError, ValueError):
        inode = None
    return os.path.realpath(path), inode


def _local(named: Named) -> list[tuple[str, str]]:
    """The local paths of ``named`` (``file://`` stripped; other URLs, None and empty left out)."""
    paths = [(name, str(p)) for name, p in named if p not in (None, "", "???")]
    return [(name, p[len("file://"):] if p.startswith("file://") else p) for name, p in paths
            if p.startswith("file://") or not is_url(p)]


def refuse_overwriting_inputs(outputs: Named, inputs: Named) -> None:
    """Refuse, before any work, an output that is an input or another output of the same command.

    ``outputs``/``inputs`` are ``(name, path)`` pairs (``("++output", "data.list")``; ``None``, empty and URL
    paths are skipped). Two paths are the same file when their real paths match (symbolic links resolved,
    the file need not exist yet) or when both exist with one inode (hard links). A :class:`ConfigError`
    names both, and nothing has been read or written yet.
    """
    outs = _local(outputs)
    seen: list[tuple[str, str]] = []
    for name, path in outs:
        found = input_of(path, inputs)
        if found is not None:
            in_name, in_path, how = found
            raise ConfigError(f"{name} ({path}) is the input {in_name} ({in_path}){how}; writing it would "
                              f"replace the input, which would be lost. Give {name} another path.")
        found = input_of(path, seen)
        if found is not None:
            first_name, first, how = found
            raise ConfigError(f"the outputs name the same file twice: {first_name} ({first}) and {name} "
                              f"({path}){how}. Each output needs its own path.")
        seen.append((name, path))


def input_of(path: str | os.PathLike, inputs: Named) -> tuple[str, str, str] | None:
    """``(name, input path, how)`` of the first of ``inputs`` (``(name, path)`` pairs; None, empty and URL paths
    skipped) that is the same file as the local ``path`` (by path, through a symbolic link, or a hard link; ``how``
    says which, "" for the same path), else None: the one test of "this file is one of the inputs" that writers
    (:func:`refuse_overwriting_inputs`) and deleters (train's overwrite_output_dir) share."""
    real, inode = _identity(str(path))
    for in_name, in_path in _local(inputs):
        how = _same_file(str(path), real, inode, in_path, *_identity(in_path))
        if how is not None:
            return in_name, in_path, how
    return None


def _same_file(a: str, a_real: str, a_inode: tuple[int, int] | None,
               b: str, b_real: str, b_inode: tuple[int, int] | None) -> str | None:
    """None when ``a`` and ``b`` are different files, else how they are one: "" (the same path),
    " (through a symbolic link)" or " (a hard link: the same inode)"."""
    if a_real == b_real:
        return "" if os.path.abspath(a) == os.path.abspath(b) else " (through a symbolic link)"
    if a_inode is not None and a_inode == b_inode:
        return " (a hard link: the same inode)"
    return None


# --------------------------------------------------------------------------- outputs on object storage
# (corpus_io.storage.objects writes them; their hidden state lives in a local state dir, found here so that any
# module, merge-jobs included, can map an s3:// output to it)

OBJECT_SCHEMES = ("s3://",)


def is_object_url(path: str | os.PathLike) -> bool:
    """An output on object storage (``s3://``), written by :func:`corpus_io.storage.objects.put_object`, not a local
    path."""
    return str(path).startswith(OBJECT_SCHEMES)


def state_dir(url: str) -> Path:
    """The local directory that holds the hidden state of the outputs under ``url`` (absolute)."""
    base = os.environ.get("CORPUS_IO_STATE_DIR") or \
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "corpus-io", "state")
    scheme, rest = url.split("://", 1)
    parts = [p for p in rest.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise DataError(f"{url} is not an object URL of the form {scheme}://bucket/prefix. Give the bucket and a "
                        f"prefix, e.g. {scheme}://my-bucket/corpus/train.")
    return Path(base, scheme, *parts).resolve()


class HeldLock:
    """An exclusive lock on a file, held until :meth:`release` or until the process ends (a kill -9 included):
    a POSIX record lock (``fcntl.lockf``), which the kernel drops with its process, which forked children
    (DataLoader workers) do not inherit, and which works on NFS. The file holds ``pid host`` of the holder, and
    keeps it after the holder ends (so a killed run's pid can be read there); ``previous`` is what it held when
    this lock was taken (``pid host`` of the last holder, "" for a new file)."""

    def __init__(self, path: Path, fd: int, previous: str = "") -> None:
        self.path, self.fd, self.previous = path, fd, previous

    def release(self, *, restore: bool = False) -> None:
        """Drop the lock; ``restore``: first put back the last holder's line (a taker that did nothing leaves the
        file naming the holder before it, e.g. a killed run)."""
        if self.fd >= 0:
            if restore:
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, (self.previous + "\n").encode() if self.previous else b"", 0)
            os.close(self.fd)  # closing drops the lock
            self.fd = -1


def try_lock(path: str | os.PathLike) -> HeldLock | str:
    """Take the exclusive lock on ``path`` (created if missing) without waiting: a :class:`HeldLock`, or, when
    another process holds it, what that holder wrote (``pid host``, or ``unknown`` while it is writing it).
    The process that holds the lock must never open and close ``path`` again (that would drop a POSIX lock).
    A ``path`` that is a symbolic link, or not a regular file (a FIFO, a device), is a :class:`DataError`: the
    lock would write through it into a file outside the output."""
    import fcntl
    import socket
    import stat

    p = Path(path)
    try:
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if os.path.islink(p):
            raise DataError(f"the lock file {p} is a symbolic link (to {os.readlink(p)}); taking the lock would "
                            f"write this process's pid into the file it points to. Remove the link (rm {p}); the "
                            f"lock file is created afresh.") from None
        raise DataError(f"cannot open the lock file {p}: {exc.strerror}. Check the path and its permissions.") \
            from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DataError(f"the lock file {p} is not a regular file (a FIFO, a device or a socket); remove it "
                        f"(rm {p}), and the lock file is created afresh.")
    os.set_blocking(fd, True)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        os.close(fd)
        return holder or "unknown"
    previous = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return HeldLock(p, fd, previous)
