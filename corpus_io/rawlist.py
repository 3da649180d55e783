"""Raw mode: a JSONL list of utterances, indexed by line offsets (never held as Python objects).

A line is WeNet's ``{"key", "wav", "txt"[, "start", "end"]}`` or FunASR's ``{"key", "source",
"target", ...}``. :class:`RawList` keeps one int64 byte offset per non-blank line in a numpy array,
cached next to the list as ``<list>.idx`` (a ``.npy`` file, memory-mapped; rebuilt when the list's
size or mtime changes, or kept in memory when the directory is read-only). A 10M-line list costs
80 MB of offsets; a line is parsed only when its utterance is read.
"""

from __future__ import annotations

import json
import os

import numpy as np

from corpus_io import audio
from corpus_io.errors import DataError
from corpus_io.manifest import canonical

#: lines per resumable unit in raw mode (see corpus_io.partition)
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


class RawList:
    """Random access to the utterances of a JSONL list by index, through cached line offsets."""

    def __init__(self, path: str | os.PathLike, *, cache: bool = True):
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise DataError(f"raw data list {self.path} does not exist. Pass an existing JSONL "
                            f"(make-datalist ++data_type=raw or scp2jsonl writes one).")
        self.offsets = self._load_or_build(cache)
        self._f = None

    def _load_or_build(self, cache: bool) -> np.ndarray:
        idx = self.path + ".idx"
        sig = _signature(self.path)
        if cache and os.path.isfile(idx):
            try:
                arr = np.load(idx, mmap_mode="r")
                if len(arr) >= 3 and np.array_equal(np.asarray(arr[:3]), sig):
                    return arr[3:]
            except (OSError, ValueError):
                pass
        offsets = build_offsets(self.path)
        if cache:
            tmp = f"{idx}.tmp{os.getpid()}"
            try:
                with open(tmp, "wb") as f:
                    np.save(f, np.concatenate([sig, offsets]))
                os.replace(tmp, idx)
                return np.load(idx, mmap_mode="r")[3:]
            except OSError:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        return offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def __getstate__(self) -> dict:  # workers re-open the file (and the mmap) themselves
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def _lineno(self, offset: int) -> int:
        with open(self.path, "rb") as f:
            return f.read(offset).count(b"\n") + 1

    def record(self, i: int) -> dict:
        """The canonical (FunASR names) record of entry ``i``."""
        if self._f is None:
            self._f = open(self.path, "rb")
        off = int(self.offsets[i])
        self._f.seek(off)
        raw = self._f.readline()
        try:
            rec = json.loads(raw)
        except ValueError as exc:
            raise DataError(f"{self.path}:{self._lineno(off)}: not valid JSON ({exc}). "
                            f"Each line must be one JSON object with key and wav/source.") from None
        if not isinstance(rec, dict):
            raise DataError(f"{self.path}:{self._lineno(off)}: a JSON {type(rec).__name__}, not an object. "
                            f"Each line must be one JSON object with key and wav/source.")
        try:
            return canonical(rec)
        except DataError as exc:  # the line number costs a read up to the line: only on error
            raise DataError(f"{self.path}:{self._lineno(off)}{exc}") from None

    def sample(self, i: int, *, storage_options: dict | None = None, allow_pipe: bool = False) -> dict:
        """Entry ``i`` as a pipeline sample (key, audio bytes, audio_format, txt, meta, start/end)."""
        rec = self.record(i)
        source = str(rec["source"])
        try:
            data = audio.read_source_bytes(source, allow_pipe=allow_pipe, storage_options=storage_options)
        except DataError as exc:
            raise DataError(f"{self.path} key {rec['key']}: {exc}") from None
        sample = {"key": rec["key"], "audio": data, "audio_format": audio.extension_of(source) or "wav",
                  "txt": str(rec.get("target", "")), "meta": rec}
        for name in ("start", "end"):
            if rec.get(name) is not None:
                sample[name] = float(rec[name])
        return sample


def slot_lines(n: int, *, slot_index: int, slot_count: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The line indices one slot reads in one epoch: a (seed, epoch) permutation, every ``slot_count``-th."""
    if shuffle:
        rng = np.random.default_rng([seed & 0xFFFFFFFF, epoch])
        order = rng.permutation(n).astype(np.int64 if n >= 2**31 else np.int32)
    else:
        order = np.arange(n, dtype=np.int64 if n >= 2**31 else np.int32)
    return np.ascontiguousarray(order[slot_index::slot_count])
