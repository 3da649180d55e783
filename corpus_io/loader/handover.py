"""How a DataLoader worker's padded batches reach the main process: one shared-memory arena per worker.

DataLoader shares every tensor it receives from a worker as a shared-memory segment of its own and passes the
segment's file descriptor through a connection to the worker's resource-sharer thread: for a 2 MB batch that
is ~1.9 ms of the main process's CPU (connection, authentication, mmap, munmap) against ~0.2 ms for the
rest of the hand-over, and more in the worker. Here a worker writes its padded batches into one arena (a ring
of byte regions) that reaches the main process once, with the first batch written there; each later batch
travels as ``(offset, dtype, shape)`` descriptors and the main process makes tensors that view the arena.

A region is the worker's again when every tensor made from it has been freed in the main process: a finalizer
then writes the region's sequence number into the arena's release table, which the worker reads before it
allocates. When no region is free (the consumer keeps its batches), a batch gets a segment of its own, as
DataLoader would do: nothing ever waits for memory and no region is reused while a tensor still views it.

Off with ``pin_memory`` (DataLoader pins what it receives, and descriptors are not tensors) and without workers.
Units: bytes.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

#: entries of the release table at the start of an arena (a region's sequence number modulo this: a collision
#: only keeps a region busy longer, never frees one early)
RELEASE_SLOTS = 1 << 16
_TABLE_BYTES = 8 * RELEASE_SLOTS
_ALIGN = 64
MIN_ARENA_BYTES = 4 << 20
MAX_ARENA_BYTES = 512 << 20
#: batch keys of the hand-over (popped by :func:`unpack` in the main process)
ARENA_KEY, REGION_KEY, VIEWS_KEY = "__arena__", "__region__", "__views__"

_worker_arena: _Arena | None = None  # the arena of this worker process (one per worker per epoch)
_enabled = False
_prefetch = 2


def enable(prefetch: int) -> None:
    """In a DataLoader worker, before its first batch: write batches into an arena sized for ``prefetch`` batches
    in flight (from the first batch's size)."""
    global _enabled, _prefetch, _worker_arena
    _enabled, _prefetch, _worker_arena = True, max(1, int(prefetch)), None


class _Arena:
    """The worker's side: a shared storage, its release table and the regions handed out (oldest first)."""

    def __init__(self, nbytes: int):
        self.storage = torch.UntypedStorage._new_shared(_TABLE_BYTES + nbytes)
        self.released = torch.empty(0, dtype=torch.int64).set_(self.storage, 0, (RELEASE_SLOTS,)).numpy()
        self.released[:] = 0
        self.start, self.end = _TABLE_BYTES, _TABLE_BYTES + nbytes
        self.head = self.start
        self.regions: deque = deque()  # (seq, start) of regions handed out and not yet known free
        self.seq = 0
        self.sent = False

    def allocate(self, nbytes: int) -> tuple[int, int] | None:
        """``(seq, byte offset)`` of a free region of ``nbytes``, or None when the ring has no room."""
        while self.regions and self.released[self.regions[0][0] % RELEASE_SLOTS] == self.regions[0][0]:
            self.regions.popleft()
        nbytes = -(-nbytes // _ALIGN) * _ALIGN
        if not self.regions:
            self.head = self.start
            at = self.start if nbytes <= self.end - self.start else None
        else:
            oldest = self.regions[0][1]
            if self.head > oldest:  # the regions in use are [oldest, head): room after head, or from the start
                at = self.head if self.head + nbytes <= self.end else (
                    self.start if self.start + nbytes <= oldest else None)
            else:  # wrapped: the room is [head, oldest)
                at = self.head if self.head + nbytes <= oldest else None
        if at is None:
            return None
        self.seq += 1
        self.regions.append((self.seq, at))
        self.head = at + nbytes
        return self.seq, at


def storage_for(nbytes: int) -> tuple[Any, int]:
    """Where a worker writes a padded batch of ``nbytes``: ``(storage, byte offset)``, a region of the arena or a
    segment of its own (no arena, or the ring is full)."""
    global _worker_arena
    if _enabled:
        if _worker_arena is None:
            # what DataLoader holds in flight anyway (prefetch, plus one being consumed and one being built), with
            # room for batches half again as large and a region left unused at the wrap
            size = min(MAX_ARENA_BYTES, max(MIN_ARENA_BYTES, (_prefetch + 3) * nbytes * 3 // 2))
            _worker_arena = _Arena(size)
        got = _worker_arena.allocate(nbytes)
        if got is not None:
            return _worker_arena.storage, got[1]
    return torch.UntypedStorage._new_shared(nbytes), 0


def pack(batch: dict) -> dict:
    """In the worker, before the batch is handed over: the tensors that view the arena become descriptors (the
    arena itself goes with the first batch that uses it)."""
    arena = _worker_arena
    if arena is None:
        return batch
    views = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() == arena.storage.data_ptr():
            views[key] = (value.storage_offset() * value.element_size(), str(value.dtype).removeprefix("torch."),
                          tuple(value.shape))
    if not views:
        return batch
    for key in views:
        del batch[key]
    batch[VIEWS_KEY] = views
    first = min(offset for offset, _, _ in views.values())  # a region's first byte is its batch's lowest view
    batch[REGION_KEY] = next(seq for seq, start in reversed(arena.regions) if start == first)
    if not arena.sent:
        batch[ARENA_KEY] = torch.empty(0, dtype=torch.uint8).set_(arena.storage, 0, (arena.storage.nbytes(),))
        arena.sent = True
    return batch


def _release(table: np.ndarray, seq: int) -> None:
    table[seq % RELEASE_SLOTS] = seq


class Receiver:
    """The main process's side, for one loader iteration: each worker's arena, and tensors viewing it."""

    def __init__(self) -> None:
        self.arenas: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def unpack(self, batch: dict, worker: int) -> dict:
        """``batch`` with its descriptors turned into tensors viewing the worker's arena."""
        arena = batch.pop(ARENA_KEY, None)
        if arena is not None:
            data = arena.numpy()
            self.arenas[worker] = (data, data[:_TABLE_BYTES].view(np.int64))
        views = batch.pop(VIEWS_KEY, None)
        if views is None:
            return batch
        seq = batch.pop(REGION_KEY)
        data, table = self.arenas[worker]
        spans = [(key, offset, np.dtype(dtype), shape, math.prod(shape) * np.dtype(dtype).itemsize)
                 for key, (offset, dtype, shape) in views.items()]
        first = min(offset for _, offset, _, _, _ in spans)
        last = max(offset + size for _, offset, _, _, size in spans)
        # an array over a memoryview: views of it keep it as their base (numpy collapses a chain of ndarray views
        # to the array owning the memory, which would be the whole arena), so it dies with the last tensor below
        region = np.frombuffer(memoryview(data)[first:last], dtype=np.uint8)
        weakref.finalize(region, _release, table, seq)
        for key, offset, dtype, shape, size in spans:
            batch[key] = torch.from_numpy(region[offset - first:offset - first + size].view(dtype).reshape(shape))
        return batch
