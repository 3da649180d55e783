"""Raw mode: a JSONL list of utterances, indexed by line offsets (never held as Python objects).

A line is WeNet's ``{"key", "wav", "txt"[, "start", "end"]}``, FunASR's ``{"key", "source",
"target", ...}``, a NeMo manifest line or a Lhotse cut (:func:`corpus_io.tables.inputs.record_of_line`).
:class:`RawList` keeps one int64 byte offset per non-blank line in a numpy array,
cached next to the list as ``<list>.idx`` (a ``.npy`` file, memory-mapped; rebuilt when the list's
size or mtime changes, or kept in memory when the directory is read-only). A 10M-line list costs
80 MB of offsets on disk; reading an entry reads its 8 bytes (``pread``), so a worker's random reads keep no pages
of the ``.idx``; a line is parsed only when its utterance is read.

FunASR's multi-file list (one JSONL path per line, e.g. from ``data_split_num``) is read as the
concatenation of those files, in order: each file keeps its own ``.idx``. A relative path is taken
from the current directory, else from the list's directory.
"""

from __future__ import annotations

import json
import os

import numpy as np

from corpus_io.audio import io as audio
from corpus_io.errors import ConfigError, DataError
from corpus_io.shards.format import SHARD_SUFFIXES
from corpus_io.shards.kinds import PARQUET, shard_kind
from corpus_io.storage.files import atomic_write, parse_json_object
from corpus_io.tables.inputs import Skip, TypedInput, open_manifest, record_of_line, resolve_input

#: lines per resumable unit in raw mode (see corpus_io.loader.partition)
CHUNK_LINES = 1000
_IDX_VERSION = 1


def _signature(path: str) -> np.ndarray:
    st = os.stat(path)
    return np.array([_IDX_VERSION, st.st_size, st.st_mtime_ns], dtype=np.int64)


def build_offsets(path: str) -> np.ndarray:
    """Byte offsets of the non-blank lines of ``path``, in one streaming pass."""
    chunks: list[np.ndarray] = []
    buf = np.empty(1 << 16, dtype=np.int64)
    n = 0
    offset = 0
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                buf[n] = offset
                n += 1
                if n == len(buf):
                    chunks.append(buf.copy())
                    n = 0
            offset += len(raw)
    chunks.append(buf[:n].copy())
    return np.concatenate(chunks)


def _first_line(path: str) -> str:
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                return raw.decode("utf-8-sig", "replace").strip()
    return ""


def _refuse_parquet(what: str) -> None:
    """Hugging Face parquet given to the raw loader (input detection said so, or a multi-file list's line names a
    ``.parquet`` file): its audio is held in its rows, which the shard loader reads."""
    raise ConfigError(f"{what} is Hugging Face parquet, whose audio is held in its rows; the raw loader "
                      f"(dataset_conf.data_type=raw) reads lists that name audio files. List the parquet files "
                      f"as shards (make-datalist ++data_type=shard ++input=<the parquet files' directory or "
                      f"glob>) and train on that list with dataset_conf.data_type=shard, or pack them "
                      f"(pack-shards).")


def jsonl_paths_of(path: str) -> list[str] | None:
    """The JSONL files a FunASR multi-file list names (one path per line), or None when ``path`` is itself a
    JSONL (its first line is a JSON object). A missing file is a DataError naming the list line."""
    first = _first_line(path)
    if not first or first.startswith("{"):
        return None
    base = os.path.dirname(os.path.abspath(path))
    files = []
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            entry = line.strip()
            if not entry:
                continue
            if shard_kind(entry) == PARQUET:  # by its name, as a shard list's line is told apart
                _refuse_parquet(f"{path}:{lineno}: '{entry}'")
            if entry.endswith(SHARD_SUFFIXES):
                raise DataError(f"{path}:{lineno}: '{entry}' is a shard, but the list is read as a raw list. For a "
                                f"list of shards set ++dataset_conf.data_type=shard (stats: ++data_type=shard).")
            found = entry if os.path.isabs(entry) or os.path.isfile(entry) else os.path.join(base, entry)
            if not os.path.isfile(found):
                raise DataError(f"{path}:{lineno}: '{entry}' is not a file. A raw data list is either a JSONL of "
                                f"utterances or, as FunASR's multi-file list, one JSONL path per line (relative "
                                f"to the current directory or to the list).")
            files.append(found)
    return files


#: the field of a converted list's line that says where its record came from (``file:line`` of the input)
ORIGIN = "__where__"


def _needs_conversion(typed: TypedInput) -> bool:
    return (os.path.isdir(typed.path) or typed.path.endswith(".gz")
            or typed.kind in ("kaldi", "lhotse-recordings+supervisions"))


def _as_jsonl(typed: TypedInput, owner: object) -> str:
    """A Kaldi dir, a ``.gz`` manifest or a Lhotse RecordingSet + SupervisionSet as a temporary jsonl of canonical
    records (one streaming pass, memory flat in the corpus; removed with ``owner``), which the loader then reads
    by offsets like any list. A line that holds no utterance is an error here, as make-datalist would count it."""
    import tempfile
    import weakref

    records = open_manifest(typed).records()  # no scan for repeats: RawList.repeated_entries finds them
    fd, tmp = tempfile.mkstemp(prefix="corpus-io-raw-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for rec in records:
                if isinstance(rec, Skip):
                    raise DataError(f"{rec.where}: {rec.what}. Fix the input, or write a raw list with corpus-io "
                                    f"make-datalist ++data_type=raw ++input={typed.path} ++output=data.list, which "
                                    f"drops and counts such utterances.")
                out.write(json.dumps({k: v for k, v in rec.items() if k != "where"} | {ORIGIN: rec.get("where")},
                                     ensure_ascii=False) + "\n")
    except BaseException:
        _remove_jsonl(tmp, os.getpid())
        raise
    weakref.finalize(owner, _remove_jsonl, tmp, os.getpid())
    return tmp


def _remove_jsonl(path: str, creator: int) -> None:
    if os.getpid() != creator:  # a forked DataLoader worker exits: the main process still reads the file
        return
    hidden = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.repeats.json")
    for name in (path, path + ".idx", hidden):
        try:
            os.unlink(name)
        except OSError:
            pass


class RawList:
    """Random access to the utterances of a JSONL list (or of a list of JSONL files) by index, through
    cached line offsets."""

    def __init__(self, path: str | os.PathLike | TypedInput, *, cache: bool = True, lines: str | None = None):
        self.path = path.path if isinstance(path, TypedInput) else str(path)
        if not os.path.exists(self.path):
            raise DataError(f"raw data list {self.path} does not exist. Give a FunASR/WeNet/NeMo jsonl, a Lhotse "
                            f"manifest or a Kaldi data dir (++dataset_conf.data_type=raw), or a shard list "
                            f"(data_type=shard).")
        if lines is None:  # the first reader decides what the input is, once (a worker gets the converted lines)
            typed = resolve_input(path)
            if typed.kind == "hf-parquet":  # the input kind (tables.inputs.KINDS) that holds its audio
                _refuse_parquet(self.path)
            # the file read by offsets: the list itself, or the one-pass jsonl of a Kaldi dir, a .gz or a Lhotse pair
            lines = _as_jsonl(typed, self) if _needs_conversion(typed) else self.path
        self.lines = lines
        self.files = jsonl_paths_of(self.lines) or [self.lines]
        loaded = [self._load_or_build(f, cache) for f in self.files]
        self._offsets = [offsets for offsets, _ in loaded]
        # where entry 0 of each file's offsets lies in its .idx, and which file that is (None: in memory): record()
        # reads the one offset it needs with pread, never through the mmap, whose page faults map 64 KB of the .idx
        # around each entry read (the kernel's fault-around): random reads of a 10M-line list's 80 MB .idx left
        # ~55 MB of it in every worker (issue 53)
        self._idx_at = [at for _, at in loaded]
        # entry i lives in file k where starts[k] <= i < starts[k + 1]
        self._starts = np.cumsum([0] + [len(o) for o in self._offsets], dtype=np.int64)
        self._handles: dict[int, object] = {}
        self._idx_fds: dict[int, int] = {}

    @property
    def offsets(self) -> np.ndarray:
        """Line offsets of a single-file list (the common case; multi-file lists keep one array per file)."""
        return self._offsets[0] if len(self._offsets) == 1 else np.concatenate(self._offsets)

    @staticmethod
    def _load_or_build(path: str, cache: bool) -> tuple[np.ndarray, tuple | None]:
        """The offsets of ``path`` (memory-mapped from its ``.idx``, built and cached when stale) and where entry 0
        lies in the ``.idx``: ``(byte position, (st_dev, st_ino))``, None when they are kept in memory."""
        idx = path + ".idx"
        sig = _signature(path)

        def mapped() -> tuple[np.ndarray, tuple]:
            arr = np.load(idx, mmap_mode="r")
            st = os.stat(idx)
            return arr, (arr.offset + 3 * arr.itemsize, (st.st_dev, st.st_ino))

        if cache and os.path.isfile(idx):
            try:
                arr, at = mapped()
                if len(arr) >= 3 and np.array_equal(np.asarray(arr[:3]), sig):
                    return arr[3:], at
            except (OSError, ValueError):
                pass
        offsets = build_offsets(path)
        if cache:
            tmp = f"{idx}.tmp{os.getpid()}"
            try:
                with open(tmp, "wb") as f:
                    np.save(f, np.concatenate([sig, offsets]))
                os.replace(tmp, idx)
                arr, at = mapped()
                return arr[3:], at
            except OSError:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        return offsets, None

    def _offset(self, k: int, j: int) -> int:
        """Byte offset of line ``j`` of file ``k``: one 8-byte pread of its ``.idx`` (see ``_idx_at``)."""
        at = self._idx_at[k]
        if at is None:
            return int(self._offsets[k][j])
        fd = self._idx_fds.get(k)
        if fd is None:
            fd = os.open(self.files[k] + ".idx", os.O_RDONLY)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != at[1]:  # replaced since it was mapped (the list changed): the mapped one
                os.close(fd)
                self._idx_at[k] = None
                return int(self._offsets[k][j])
            self._idx_fds[k] = fd
        dtype = self._offsets[k].dtype
        raw = os.pread(fd, dtype.itemsize, at[0] + dtype.itemsize * j)
        if len(raw) != dtype.itemsize:  # the .idx was cut since it was opened: the mapped array says what it can
            return int(self._offsets[k][j])
        return int(np.frombuffer(raw, dtype)[0])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def repeated_entries(self) -> dict[str, list[int]]:
        """``{key: [entry, entry, ...]}`` (0-based entries, in list order) for every key the list holds more than
        once, across all its files, so that every rank and worker keeps a repeated key from its first entry only
        (per-reader tracking misses a repeat read by another worker or rank). Two passes that parse each line for
        its key (8 bytes per utterance), skipped when the ``.<list>.repeats.json`` sidecar says that these very
        files (same size and mtime) repeat no key; a line that does not parse is left to the reader to report."""
        from corpus_io.shards.index import find_repeated_keys

        where = os.path.dirname(os.path.abspath(self.lines))
        marker = os.path.join(where, f".{os.path.basename(self.lines)}.repeats.json")
        stamp = [[int(x) for x in _signature(f)[1:]] for f in [self.lines, *self.files]]
        try:
            with open(marker, encoding="utf-8") as f:
                stored = json.load(f)
            if stored.get("lists") == stamp and stored.get("repeated_keys") == 0:
                return {}
        except (OSError, ValueError, AttributeError):
            pass  # absent, stale or damaged: scan
        entries = find_repeated_keys(lambda: ((i, [key]) for i, key in enumerate(self._keys()) if key is not None))
        try:
            with atomic_write(marker) as f:
                json.dump({"lists": stamp, "repeated_keys": len(entries)}, f)
        except (OSError, DataError):
            pass  # a read-only directory: scanned again next time
        return entries  # type: ignore[return-value]

    def _keys(self):
        """The key of every entry, in entry order (None for a line only the reader can judge)."""
        for path in self.files:
            base = os.path.dirname(os.path.abspath(path))
            with open(path, "rb") as f:
                for raw in f:
                    if not raw.strip():
                        continue
                    try:
                        rec = record_of_line(json.loads(raw), "", base)
                        yield rec.key if isinstance(rec, Skip) else rec["key"]
                    except (ValueError, DataError, TypeError, KeyError, AttributeError):
                        yield None

    def close(self) -> None:
        """Close the files :meth:`record` opened (a process about to fork workers: they must not share offsets)."""
        for f in self._handles.values():
            f.close()  # type: ignore[attr-defined]
        self._handles.clear()
        for fd in self._idx_fds.values():
            os.close(fd)
        self._idx_fds.clear()

    def __getstate__(self) -> dict:  # workers re-open the file (and the mmap) themselves, never re-convert
        return {"path": self.path, "lines": self.lines}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], lines=state["lines"])

    @staticmethod
    def _lineno(path: str, offset: int) -> int:
        with open(path, "rb") as f:
            return f.read(offset).count(b"\n") + 1

    def where(self, i: int) -> str:
        """``file:line`` of entry ``i`` (a read up to the line: for error messages only); for a converted input
        (a Kaldi dir, a .gz, a Lhotse pair) the place in that input, never the temporary jsonl."""
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        off = self._offset(k, i - int(self._starts[k]))
        if self.lines != self.path:
            return self._origin(self.files[k], off)
        return f"{self.files[k]}:{self._lineno(self.files[k], off)}"

    def _origin(self, path: str, offset: int) -> str:
        with open(path, "rb") as f:
            f.seek(offset)
            try:
                return str(json.loads(f.readline())[ORIGIN])
            except (ValueError, KeyError, TypeError):
                return f"{self.path} (entry at byte {offset} of {path})"

    def record(self, i: int) -> dict:
        """The canonical (FunASR names) record of entry ``i``."""
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        path = self.files[k]
        f = self._handles.get(k)
        if f is None:
            f = self._handles[k] = open(path, "rb")
        off = self._offset(k, i - int(self._starts[k]))
        f.seek(off)
        raw = f.readline()
        # the line number costs a read up to the line: found only on error
        rec = parse_json_object(raw, lambda: f"{path}:{self._lineno(path, off)}",
                                "Each line must be one JSON object with key and wav/source.")
        rec.pop(ORIGIN, None)
        try:
            out = record_of_line(rec, "", os.path.dirname(os.path.abspath(path)))
            if isinstance(out, Skip):
                raise DataError(f": {out.what}. Drop the line, or let make-datalist "
                                f"++data_type=raw write the list (it skips and counts such lines).")
            return out
        except DataError as exc:  # the line number costs a read up to the line: only on error
            raise DataError(f"{self.where(i)}{exc}") from None

    def sample(self, i: int, *, storage_options: dict | None = None, allow_pipe: bool = False) -> dict:
        """Entry ``i`` as a pipeline sample (key, audio bytes, audio_format, txt, meta, start/end)."""
        rec = self.record(i)
        source = str(rec["source"])
        try:
            data = audio.read_source_bytes(source, allow_pipe=allow_pipe, storage_options=storage_options)
        except DataError as exc:
            raise DataError(f"{self.where(i)}: key '{rec['key']}', field 'source' (WeNet 'wav'): {exc}") from None
        sample = {"key": rec["key"], "audio": data, "audio_format": audio.extension_of(source) or "wav",
                  "txt": str(rec.get("target", "")), "meta": rec}
        for name in ("start", "end"):
            if rec.get(name) is not None:
                sample[name] = float(rec[name])
        return sample


def chunk_sizes(n: int) -> list[int]:
    """Lines per resumable unit of a raw list of ``n`` lines (``CHUNK_LINES`` each, the last one shorter)."""
    return [min(CHUNK_LINES, n - start) for start in range(0, n, CHUNK_LINES)]


_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _feistel(x: np.ndarray, keys: np.ndarray, half_bits: int) -> np.ndarray:
    """A keyed bijection of ``[0, 4**half_bits)`` (uint64 in, uint64 out): a 4-round Feistel network."""
    mask = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    left, right = x >> shift, x & mask
    for key in keys:
        v = right ^ key  # splitmix64's finalizer as the round function
        v = (v ^ (v >> np.uint64(30))) * _MIX1
        v = (v ^ (v >> np.uint64(27))) * _MIX2
        v ^= v >> np.uint64(31)
        left, right = right, left ^ (v & mask)
    return (left << shift) | right


def permuted_lines(n: int, start: int, stop: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Entries ``start:stop`` of a permutation of ``range(n)`` seeded by ``(seed, epoch)`` (int64 line indices).

    The permutation is never materialized: each entry is a keyed Feistel bijection over the next power of
    4 above ``n``, cycle-walked back into ``range(n)``. So a reader holds O(stop - start) memory whatever the
    list's length (a 10M-line list no longer costs every DataLoader worker a 10M-entry array), and every
    reader computes the same permutation.
    """
    x = np.arange(start, stop, dtype=np.uint64)
    if not shuffle or n < 2:
        return x.astype(np.int64)
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
    keys = np.random.default_rng([seed & 0xFFFFFFFF, epoch]).integers(0, 2**63, size=4, dtype=np.uint64)
    y = _feistel(x, keys, half_bits)
    outside = y >= np.uint64(n)
    while outside.any():  # cycle walking: a bijection of range(n) (at most 3/4 of the domain lies outside)
        y[outside] = _feistel(y[outside], keys, half_bits)
        outside = y >= np.uint64(n)
    return y.astype(np.int64)
