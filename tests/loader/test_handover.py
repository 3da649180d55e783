"""A worker's batches reach the main process through its arena (corpus_io.loader.handover): the same values as
through a segment each, a region reused only after every tensor viewing it is freed, one segment per worker."""

from __future__ import annotations

import gc

import pytest
import torch

from corpus_io.loader import handover
from corpus_io.loader.dataset import build_dataloader
from tests.loader_data import make_shards, small_conf


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    data_list, keys = make_shards(tmp_path_factory.mktemp("handover"), copies=2, per_shard=4)  # 48 utterances
    return data_list, keys


def _epoch(data_list, *, keep: bool, **conf) -> tuple[list, list]:
    """Copies of every batch's tensors as received, and the batches themselves when ``keep``."""
    loader = build_dataloader(str(data_list), small_conf(**conf), None, train=True, rank=0, world_size=1)
    copies, kept = [], []
    for batch in loader:
        copies.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
        if keep:
            kept.append(batch)
    return copies, kept


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                       for k in a)


@pytest.mark.parametrize("feats_type", ["fbank", "raw"])
def test_batches_through_the_arena_equal_those_sent_as_a_segment_each(shards, feats_type):
    data_list, keys = shards
    # pin_memory keeps DataLoader's own hand-over (it pins tensors, not descriptors): the reference
    with pytest.warns(UserWarning, match="pin_memory"):
        reference, _ = _epoch(data_list, keep=False, feats_type=feats_type, pin_memory=True)
    arena, _ = _epoch(data_list, keep=False, feats_type=feats_type)
    assert sorted(k for b in arena for k in b["keys"]) == sorted(keys)
    assert len(arena) == len(reference) and all(_same(a, b) for a, b in zip(reference, arena))


def test_a_consumer_that_keeps_every_batch_still_holds_what_it_received(shards):
    """No region is written again while a kept batch views it: the ring fills, later batches get segments."""
    data_list, keys = shards
    copies, kept = _epoch(data_list, keep=True, feats_type="raw", batch_size=2)
    assert sorted(k for b in kept for k in b["keys"]) == sorted(keys)
    assert all(_same(c, b) for c, b in zip(copies, kept))


def test_a_consumer_that_frees_each_batch_gets_every_one_through_the_arena_not_a_segment_each(shards):
    """DataLoader's own hand-over makes every tensor a shared-memory segment of its own (is_shared); through the
    arena, a batch's tensors view the worker's one segment, so none is."""
    loader = build_dataloader(str(shards[0]), small_conf(feats_type="fbank"), None, train=True, rank=0, world_size=1)
    shared = [any(v.is_shared() for v in b.values() if isinstance(v, torch.Tensor)) for b in loader]
    assert len(shared) >= 8 and not any(shared)


def _hand_over(feats: torch.Tensor, receiver: handover.Receiver) -> dict:
    """What a worker's pad + pack and the main process's unpack do to one batch, in this process."""
    from corpus_io.loader.batching import _shared_batch

    padded, lengths, target, target_lengths = _shared_batch([feats], [[1, 2]])
    batch = {"feats": padded, "feats_lengths": lengths, "target": target, "target_lengths": target_lengths}
    return receiver.unpack(handover.pack(batch), worker=0)


def test_a_region_is_reused_only_after_every_tensor_viewing_it_is_freed(monkeypatch):
    import torch.utils.data

    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())  # pad as in a worker
    monkeypatch.setattr(handover, "MIN_ARENA_BYTES", 3 * 4096 + 3 * 64)
    monkeypatch.setattr(handover, "MAX_ARENA_BYTES", 3 * 4096 + 3 * 64)
    for name in ("_enabled", "_prefetch", "_worker_arena"):  # this process's hand-over state, restored after
        monkeypatch.setattr(handover, name, getattr(handover, name))
    handover.enable(prefetch=1)
    receiver = handover.Receiver()
    rows = [torch.full((1000, 1), float(i)) for i in range(6)]  # 4000 bytes of feats + 32 of ints each
    held = [_hand_over(rows[i], receiver) for i in range(3)]  # the ring holds three
    arena = handover._worker_arena
    assert [s for s, _ in arena.regions] == [1, 2, 3]
    fourth = _hand_over(rows[3], receiver)  # no room: a segment of its own
    assert handover.VIEWS_KEY not in fourth and fourth["feats"].is_shared()
    assert [torch.equal(b["feats"][0], rows[i]) for i, b in enumerate(held)] == [True] * 3
    lengths = held[0]["feats_lengths"]
    del held[0]["feats"], held[0]["target"], held[0]["target_lengths"]
    gc.collect()
    assert _hand_over(rows[4], receiver)["feats"].is_shared()  # a tensor of region 1 is still alive
    del lengths, held[0]
    gc.collect()
    fifth = _hand_over(rows[5], receiver)  # region 1 is free: written again, and the others are intact
    assert not fifth["feats"].is_shared() and torch.equal(fifth["feats"][0], rows[5])
    assert [torch.equal(b["feats"][0], rows[i + 1]) for i, b in enumerate(held)] == [True] * 2
