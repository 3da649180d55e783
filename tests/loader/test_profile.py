"""The loader's opt-in profile (CORPUS_IO_LOADER_PROFILE): where a batch's time goes, per worker and in the main
process; off, batches and the loader carry nothing of it."""

from __future__ import annotations

import pytest

from corpus_io.loader import profile
from corpus_io.loader.dataset import build_dataloader
from tests.loader_data import make_raw, make_shards, small_conf


@pytest.fixture(scope="module")
def lists(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    shards, keys = make_shards(out / "shards", per_shard=6)  # 24 utterances in 4 shards
    raw, _ = make_raw(out / "raw")
    return {"shard": shards, "raw": raw}, keys


@pytest.mark.parametrize("data_type", ["shard", "raw"])
def test_profiled_workers_and_main_process_account_for_every_stage_of_their_wall_time(lists, data_type,
                                                                                     monkeypatch):
    paths, keys = lists
    monkeypatch.setenv(profile.ENV, "1")
    loader = build_dataloader(str(paths[data_type]), small_conf(data_type=data_type), None, train=True, rank=0,
                              world_size=1)
    seen = [k for batch in loader for k in batch["keys"]]
    assert sorted(seen) == sorted(keys)  # profiling changes nothing that is read
    prof = loader.profile()
    assert sorted(prof["workers"]) == [0, 1]
    for totals in prof["workers"].values():
        for stage in ("read", "tar parse", "decode", "features", "filters", "buffers", "batch/pad/collate",
                      "hand-over"):
            assert totals[stage] > 0, (stage, totals)
        assert all(v >= 0 for v in totals.values()), totals
        assert sum(v for k, v in totals.items() if k != "wall") == pytest.approx(totals["wall"])
    main = prof["main"]
    assert main["hand-over"] > 0 and main["unpacking"] > 0
    shares = profile.shares(profile.merge(list(prof["workers"].values())))
    assert list(shares)[:2] == ["read", "tar parse"] and sum(shares.values()) == pytest.approx(1.0)


def test_unprofiled_batches_carry_no_profile(lists, monkeypatch):
    paths, _ = lists
    monkeypatch.delenv(profile.ENV, raising=False)
    loader = build_dataloader(str(paths["shard"]), small_conf(num_workers=1), None, train=True, rank=0, world_size=1)
    batch = next(iter(loader))
    assert "__profile__" not in batch and loader.profile() == {}
