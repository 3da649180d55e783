"""Weighted ``sources`` resumed at every batch boundary read each key as often as the uninterrupted epoch, and what
was read before the checkpoint is the uninterrupted run's (the order after it is not:
docs/PARTITIONING.md "Partitioning and resume")."""

from __future__ import annotations

from collections import Counter

import pytest

from corpus_io.api import build_tokenizer
from corpus_io.config import SourceConf
from corpus_io.loader.dataset import build_dataloader
from tests.loader_data import epoch_keys, make_raw, make_shards, read_then_checkpoint, small_conf, token_list


def _mixed_conf(tmp_path, sources: int, workers: int):
    a, _ = make_shards(tmp_path / "a", per_shard=3)  # 24 utterances
    b, _ = make_raw(tmp_path / "b", copies=2, wenet=False)  # 48 others
    c, _ = make_shards(tmp_path / "c", copies=3, per_shard=5)  # 72 more (c0-.., c1-.., c2-..)
    lists = [SourceConf(data_list=str(a), weight=1.0, data_type="shard"),
             SourceConf(data_list=str(b), weight=3.0, data_type="raw"),
             SourceConf(data_list=str(c), weight=2.0, data_type="shard")][:sources]
    conf = small_conf(num_workers=workers)
    conf.sources = lists
    return conf, build_tokenizer(token_list(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("sources,workers", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_weighted_sources_resumed_at_every_batch_read_each_key_as_often_as_uninterrupted(tmp_path, sources, workers):
    conf, tok = _mixed_conf(tmp_path, sources, workers)

    def make():
        return build_dataloader(None, conf, tok, train=True, rank=0, world_size=1)

    for epoch in (0, 1):
        in_order = epoch_keys(_advanced(make(), epoch), epoch)
        whole = Counter(in_order)
        batches = sum(1 for _ in _advanced(make(), epoch))
        assert batches >= 3
        for stop in range(1, batches):
            loader = _advanced(make(), epoch)
            first, state = read_then_checkpoint(loader, epoch, stop)
            resumed = make()
            resumed.load_state_dict(state)
            assert first == in_order[:len(first)]  # what was trained before the checkpoint is the uninterrupted run's
            got = Counter(first + epoch_keys(resumed))
            twice = {k: n for k, n in got.items() if n > whole[k]}
            assert not twice, f"epoch {epoch}, resumed after batch {stop}: read more often than uninterrupted: {twice}"
            assert got == whole, f"epoch {epoch}, resumed after batch {stop}: {got - whole} / {whole - got}"


def _advanced(loader, epoch: int):
    """``loader`` after reading epochs 0..epoch-1 whole (a mix continues its streams across epochs)."""
    for e in range(epoch):
        epoch_keys(loader, e)
    loader.set_epoch(epoch)
    return loader
