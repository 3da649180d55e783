"""Shard assignment to ranks and workers, the stride fallback, and the resumable slot state."""

from __future__ import annotations

import itertools
import json
import logging

from corpus_io.loader.partition import Slot, SlotState, all_ranks_have_data, assign, balance, epoch_order, unit_weights


def slots(world_size: int, num_workers: int):
    return [Slot(r, world_size, w, num_workers) for r in range(world_size) for w in range(num_workers)]


def test_every_shard_goes_to_exactly_one_slot_each_epoch_and_the_split_changes():
    n = 37
    splits = []
    for epoch in range(3):
        got = [assign(n, s, seed=1, epoch=epoch, shuffle=True).units for s in slots(2, 3)]
        flat = list(itertools.chain.from_iterable(got))
        assert sorted(flat) == list(range(n))
        splits.append(got)
    assert splits[0] != splits[1] != splits[2]
    again = [assign(n, s, seed=1, epoch=0, shuffle=True).units for s in slots(2, 3)]
    assert again == splits[0]


def test_ranks_are_balanced_by_duration_not_by_shard_count():
    durations = [100.0] * 4 + [10.0] * 40  # 4 long shards and 40 short ones
    w = unit_weights(len(durations), durations)
    per_rank = [sum(durations[u] for s in slots(2, 2) if s.rank == r
                    for u in assign(len(durations), s, seed=3, epoch=0, shuffle=True, weights=w).units)
                for r in range(2)]
    assert abs(per_rank[0] - per_rank[1]) <= 10.0
    per_slot = [sum(durations[u] for u in assign(len(durations), s, seed=3, epoch=0, shuffle=True,
                                                 weights=w).units) for s in slots(2, 2)]
    assert max(per_slot) - min(per_slot) <= 10.0


def test_weights_fall_back_to_utterance_counts_then_equal():
    assert unit_weights(3, [1.0, None, 2.0], [10, 20, 30]) == [10.0, 20.0, 30.0]
    assert unit_weights(2, None, None) == [1.0, 1.0]


def test_balance_keeps_the_shuffled_order_inside_a_bin():
    order = [5, 3, 9, 1, 7, 0]
    bins = balance(order, [1.0] * 10, 2)
    for b in bins:
        assert b == [u for u in order if u in b]


def test_fewer_shards_than_slots_strides_every_utterance_exactly_once(caplog):
    n, per_shard = 3, 10
    with caplog.at_level(logging.WARNING):
        kept = []
        for s in slots(2, 4):
            a = assign(n, s, seed=0, epoch=0, shuffle=True)
            assert a.stride == 8 and len(a.units) == n
            kept += [(a.units[o], p) for o in range(n) for p in range(per_shard) if a.keeps(o, p)]
    assert sorted(kept) == [(u, p) for u in range(n) for p in range(per_shard)]
    assert "every reader reads every one of them" in caplog.text


def test_epoch_order_is_seeded_by_seed_and_epoch():
    assert epoch_order(50, seed=1, epoch=0, shuffle=True) == epoch_order(50, seed=1, epoch=0, shuffle=True)
    assert epoch_order(50, seed=1, epoch=0, shuffle=True) != epoch_order(50, seed=1, epoch=1, shuffle=True)
    assert epoch_order(5, seed=1, epoch=3, shuffle=False) == [0, 1, 2, 3, 4]


def test_slot_state_resumes_from_the_earliest_open_unit_and_skips_emitted_samples():
    st = SlotState(epoch=2)
    for sid in [(0, 4, 0), (0, 4, 1), (0, 5, 0), (0, 5, 1), (0, 6, 0)]:
        st.enter(sid, 1.0)
    st.emit((0, 4, 0))
    st.emit((0, 5, 0))
    back = SlotState.from_dict(json.loads(json.dumps(st.to_dict())))
    assert back.start_unit(0) == 4
    assert back.already_done((0, 4, 0)) and back.already_done((0, 5, 0))
    assert not back.already_done((0, 4, 1)) and not back.already_done((0, 6, 1))
    back.enter((0, 4, 1), 1.0)  # a pending sample re-enters: the cursor does not move back
    assert back.cursor[0] == (6, 0) and back.seconds == st.seconds


def test_all_ranks_have_data_without_distributed_is_the_local_flag():
    assert all_ranks_have_data(True) is True
    assert all_ranks_have_data(False) is False


def test_all_ranks_have_data_under_torchrun_is_false_when_any_rank_ran_out(tmp_path):

    from tests.conftest import BIN, free_port, run_bounded

    script = tmp_path / "stop_together.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "from corpus_io.loader.partition import all_ranks_have_data\n"
        "dist.init_process_group('gloo')\n"
        "r = dist.get_rank()\n"
        "import sys\n"
        "flags = (all_ranks_have_data(True), all_ranks_have_data(r == 0))\n"
        "open(sys.argv[1] + f'.rank{r}', 'w').write(f'{flags[0]} {flags[1]}')\n"
        "dist.destroy_process_group()\n")
    result = run_bounded([str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={free_port()}",
                          str(script), str(tmp_path / "flags")], 120)
    assert result.returncode == 0, result.stderr
    # each rank writes its own file: stdout of two ranks interleaves
    assert [(tmp_path / f"flags.rank{r}").read_text() for r in (0, 1)] == ["True False", "True False"]


def test_a_duration_balanced_split_changes_every_epoch_and_stays_balanced():
    import random

    rnd = random.Random(5)
    durations = [rnd.uniform(50.0, 300.0) for _ in range(40)]  # all different: longest-first alone never varies
    w = unit_weights(len(durations), durations)
    splits, spreads = set(), []
    for epoch in range(4):
        per_rank = [assign(len(durations), s, seed=1, epoch=epoch, shuffle=True, weights=w).units
                    for s in slots(4, 1)]
        assert sorted(itertools.chain.from_iterable(per_rank)) == list(range(len(durations)))
        splits.add(frozenset(frozenset(units) for units in per_rank))
        loads = [sum(durations[u] for u in units) for units in per_rank]
        spreads.append((max(loads) - min(loads)) / (sum(loads) / 4))
    assert len(splits) == 4
    assert max(spreads) <= 0.02, spreads  # 10 shards per rank: within 2 % of the mean load


def test_a_state_with_a_thousand_buffered_samples_packs_small_and_round_trips_exactly():
    import json
    import random

    from corpus_io.loader.partition import SlotState

    rng = random.Random(1)
    state = SlotState(epoch=2, cursor={0: (7, 1200)}, taken={0: 15000}, seconds=4321.5)
    for pos in rng.sample(range(1200), 1000):  # a shuffle block's worth, seconds in 10 ms frames
        state.pending[(0, 6 + pos % 2, pos)] = float(rng.randint(50, 1500)) * 0.01
    state.pending[(1, 3, 5)] = 1.234567  # seconds not on the frame grid are kept as they are
    packed = json.dumps(state.to_dict())
    assert len(packed) < 10 * 1024  # ~8 bytes per buffered sample: 4 workers stay well below 64 KB per rank
    back = SlotState.from_dict(json.loads(packed))
    assert back.pending == state.pending and back.cursor == state.cursor  # bit-exact seconds
    old = {"epoch": 2, "cursor": {"0": [7, 1200]}, "pending": [[0, 6, 4, 1.5]]}  # the earlier one-entry form
    assert SlotState.from_dict(old).pending == {(0, 6, 4): 1.5}
