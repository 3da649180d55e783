"""The rest of an epoch that DDP ranks ended together (one ran out of batches first), carried into the next
epoch (corpus_io.loader.elastic.carry_over, through CorpusLoader.carry_rest): ranks are real loaders built for
their rank, run one after the other in this process, each stopped at the step the shortest rank ran out."""

from __future__ import annotations

import json

import pytest

from corpus_io.loader.dataset import build_dataloader
from corpus_io.loader.partition import NO_MORE, Piece, SlotState
from corpus_io.tokenizer import build_tokenizer
from tests.loader_data import fixture_utts, make_raw, make_shards, small_conf, token_list


@pytest.fixture(scope="module")
def lists(tmp_path_factory):
    root = tmp_path_factory.mktemp("carry")
    shards, keys = make_shards(root / "shards", utts=fixture_utts(2), sizes=[2, 3, 4, 5, 6, 7, 8, 9, 2, 2])
    raw, raw_keys = make_raw(root / "raw")
    raw.write_text("".join(raw.read_text().splitlines(keepends=True)[:17]))  # strided over 2 ranks: 9 and 8
    return {"shard": str(shards), "raw": str(raw), "keys": {"shard": keys, "raw": raw_keys[:17]},
            "tok": build_tokenizer(token_list(root))}


def stopped_epoch(lists, data_type: str, epoch: int, loaders=None):
    """Two ranks read ``epoch``; every rank stops at the step the shorter one ran out and the rest is carried.
    Returns (loaders, keys trained per rank, keys left untrained)."""
    conf = small_conf(num_workers=0, data_type=data_type)
    loaders = loaders or [build_dataloader(lists[data_type], conf, lists["tok"], train=True, rank=r, world_size=2)
                          for r in range(2)]
    batches, states = [], []
    for loader in loaders:
        loader.set_epoch(epoch)
        mine = [(batch["keys"], json.loads(json.dumps(loader.state_dict()))) for batch in loader]
        batches.append([keys for keys, _ in mine])
        states.append([state for _, state in mine])
    step = min(map(len, batches))
    assert max(map(len, batches)) > step, "the ranks did not run out at different steps"
    for loader in loaders:  # what every rank does at that step (the loader itself, gathering the states, under DDP)
        loader.carry_rest([s[step - 1] for s in states])
    trained = [[k for keys in b[:step] for k in keys] for b in batches]
    return loaders, trained, {k for b in batches for keys in b[step:] for k in keys}


@pytest.mark.parametrize("data_type", ["shard", "raw"])
def test_the_next_epoch_trains_the_carried_rest_first_and_every_other_key_once(lists, data_type):
    loaders, _, left = stopped_epoch(lists, data_type, 3)
    assert left and sum(loader.epoch_counts().get("uneven_ranks.carried", 0) for loader in loaders) == len(left)
    next_epoch = []
    for loader in loaders:  # allow: every batch of epoch 4, so the two ranks together read all of it
        loader.set_epoch(4)
        keys = [k for batch in loader for k in batch["keys"]]
        mine = [i for i, k in enumerate(keys) if k in left]
        assert mine == list(range(len(mine)))  # the carried rest first
        next_epoch += keys
    assert sorted(next_epoch) == sorted(lists["keys"][data_type])  # its own pass left out what was carried: once each


@pytest.mark.parametrize("data_type", ["shard", "raw"])
def test_the_carried_rest_resumed_on_another_world_size_is_still_first_and_once(lists, data_type):
    loaders, _, left = stopped_epoch(lists, data_type, 5)
    states = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]
    assert [s["epoch"] for s in states] == [6, 6] and all(s["batches"] == 0 for s in states)
    one = build_dataloader(lists[data_type], small_conf(num_workers=2, data_type=data_type), lists["tok"], train=True,
                           rank=0, world_size=1)
    one.load_rank_states(states)  # elastic: 2 ranks x 0 workers -> 1 rank x 2 workers
    one.set_epoch(6)
    keys = [k for batch in one for k in batch["keys"]]
    assert sorted(keys) == sorted(lists["keys"][data_type])
    assert max(i for i, k in enumerate(keys) if k in left) < len(left) + 2 * 4  # first, per worker


def test_an_epoch_that_starts_with_a_carried_rest_carries_its_own_rest_again_without_repeats(lists):
    loaders, trained3, left3 = stopped_epoch(lists, "shard", 3)
    _, trained4, left4 = stopped_epoch(lists, "shard", 4, loaders)
    epoch4 = [k for keys in trained4 for k in keys]
    assert len(epoch4) == len(set(epoch4)) and left3 <= set(epoch4) and not left3 & left4
    assert set(epoch4) | left4 == set(lists["keys"]["shard"])


def test_a_piece_that_leaves_carried_utterances_out_round_trips_and_a_state_without_them_loads():
    carried = Piece(3, 1, 0, 0, 0, NO_MORE, frozenset({2, 5}))
    piece = Piece(3, 2, 4, 2, 1, -1, frozenset(), (carried,))
    assert Piece.from_list(json.loads(json.dumps(piece.to_list()))) == piece
    assert [p for p in range(8) if piece.keeps(p)] == [1, 3, 7]  # in its stride, but not the carried 5
    old = {"epoch": 2, "plans": {"0": [2, [[3, 2, 4, 2, 1, -1, []]]]}}  # a state written before pieces had skip
    assert SlotState.from_dict(old).plans[0][1] == [Piece(3, 2, 4, 2, 1, -1, frozenset())]
