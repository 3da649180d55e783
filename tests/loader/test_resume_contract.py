"""The resume contract, for every loader configuration (in the spirit of torchdata's run_test_save_load_state).

Each simulated rank is a real :class:`CorpusLoader` built for its ``rank``/``world_size`` (and real
DataLoader worker processes where the worker count is > 0), reading real shards or raw lists. The harness
stops every rank after a different number of batches, takes every rank's ``state_dict()`` (a JSON round
trip, as a checkpoint does), restores them on the same and on other topologies (W=4 -> 2 -> 3 ranks,
N=2 -> 1 workers, ...) and checks that the utterances consumed before and after make one uninterrupted
epoch exactly, and that the next epoch is the one a fresh run of the new topology reads.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import pytest

from corpus_io.config import SourceConf
from corpus_io.loader.dataset import build_dataloader
from corpus_io.tokenizer import build_tokenizer
from tests.loader_data import fixture_utts, make_hf_parquet, make_raw, make_shar, make_shards, small_conf, token_list


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    # 48 utterances in 10 uneven shards (duration balancing matters), a raw list of the same 48
    shards, keys = make_shards(root / "shards", utts=fixture_utts(2), sizes=[2, 3, 4, 5, 6, 7, 8, 9, 2, 2])
    raw, raw_keys = make_raw(root / "raw", copies=2)
    other = [(f"b-{k}", p, t) for k, p, t in fixture_utts(2)]
    shards_b, keys_b = make_shards(root / "b", utts=other, per_shard=6)
    assert sorted(raw_keys) == sorted(keys)
    return {"shard": str(shards), "raw": str(raw), "keys": keys, "b": str(shards_b), "keys_b": keys_b,
            "tok": build_tokenizer(token_list(root))}


@dataclass
class Config:
    """One loader configuration of the contract."""

    name: str
    overrides: dict = field(default_factory=dict)
    data_type: str = "shard"
    mix: bool = False

    def conf(self, data: dict, num_workers: int):
        conf = small_conf(num_workers=num_workers, data_type=self.data_type, **self.overrides)
        if self.mix:  # a (3 per weight) is read once per epoch; b continues across epochs
            conf.sources = [SourceConf(data_list=data["shard"], weight=3.0, data_type="shard"),
                            SourceConf(data_list=data["b"], weight=1.0, data_type="shard")]
        return conf


CONFIGS = [
    Config("shards"),
    Config("raw", data_type="raw"),
    Config("sort_no_shuffle", {"shuffle": False, "sort": True}),
    Config("bucketing", {"bucketing": True, "num_buckets": 3}),
    Config("length_batches", {"batch_type": "length", "batch_size": 1200}),
    Config("token_batches_bucketing", {"batch_type": "token", "batch_size": 1500, "bucketing": True,
                                       "num_buckets": 2}),
    Config("sources_mix", mix=True),
    Config("epoch_hours", {"epoch_hours": 80 / 3600}),
    # the defaults' batcher (edges from the data, padded to them, synchronised turns) under a mix and epoch_hours
    Config("sources_mix_bucketing", {"bucketing": True, "num_buckets": 4}, mix=True),
    Config("epoch_hours_bucketing", {"epoch_hours": 80 / 3600, "bucketing": True, "num_buckets": 4}),
]

#: (world size, workers) of each stage: the first run, then each resumed run
TOPOLOGIES = {
    "W4-2-3": [(4, 0), (2, 0), (3, 0)],
    "N2-1": [(1, 2), (1, 1)],
    "W2N2-W1N0": [(2, 2), (1, 0)],
    "same": [(2, 0), (2, 0)],
}


def loaders(data, config: Config, world_size: int, num_workers: int):
    conf = config.conf(data, num_workers)
    data_list = None if config.mix else data[config.data_type]
    return [build_dataloader(data_list, conf, data["tok"], train=True, rank=r, world_size=world_size)
            for r in range(world_size)]


def run_stage(data, config, topology, epoch: int, states: list[dict] | None, stop_after: list[int] | None):
    """Every rank of ``topology``: resume from ``states`` (if any), read ``epoch`` (until ``stop_after[rank]``
    batches); returns (keys, audio seconds, the ranks' states) in rank order."""
    keys, seconds, out_states = [], 0.0, []
    for rank, loader in enumerate(loaders(data, config, *topology)):
        loader.set_epoch(epoch)
        if states is not None:
            loader.load_rank_states(states)
        for i, batch in enumerate(loader):
            keys += batch["keys"]
            seconds += batch["audio_seconds"]
            if stop_after is not None and i + 1 >= stop_after[rank]:
                break
        out_states.append(json.loads(json.dumps(loader.state_dict())))
    return keys, seconds, out_states


def epoch_of_fresh_run(data, config, topology, epoch):
    per_rank = []
    for loader in loaders(data, config, *topology):
        loader.set_epoch(epoch)
        per_rank.append(sorted(k for batch in loader for k in batch["keys"]))
    return per_rank


@pytest.mark.parametrize("when", ["early", "late"])
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_consumed_before_and_after_any_topology_change_is_one_epoch_exactly(data, config, topology, when):
    stages = TOPOLOGIES[topology]
    epoch = 1
    consumed: list[str] = []
    seconds = 0.0
    states = None
    for n, stage in enumerate(stages):
        last = n == len(stages) - 1
        # each rank stops after its own number of batches (ranks are never in step)
        stop = None if last else [(1 if when == "early" else 4) + r % 3 for r in range(stage[0])]
        keys, secs, states = run_stage(data, config, stage, epoch, states, stop)
        consumed += keys
        seconds += secs
    counts = Counter(consumed)
    assert max(counts.values()) == 1, [k for k, c in counts.items() if c > 1]  # nothing twice
    keys = set(data["keys"])
    if config.overrides.get("epoch_hours"):
        budget = config.overrides["epoch_hours"] * 3600
        assert budget <= seconds <= budget + 8 * 3.0, seconds  # the epoch's audio: one utterance over per reader
    else:
        assert {k for k in consumed if k in keys} == keys  # nothing lost: the whole list once
    if config.mix:
        return  # a mix's next epochs continue its streams: pinned by test_dataset's mix tests
    if not config.overrides.get("epoch_hours"):
        # the next epoch is unaffected: what a fresh run of the last topology reads in it
        final = stages[-1]
        after = []
        for loader, state in zip(loaders(data, config, *final), [states] * final[0]):
            loader.set_epoch(epoch)
            loader.load_rank_states(state)
            list(loader)
            loader.set_epoch(epoch + 1)
            after.append(sorted(k for batch in loader for k in batch["keys"]))
        assert after == epoch_of_fresh_run(data, config, final, epoch + 1)


def test_an_unchanged_topology_loads_each_ranks_own_state_exactly_as_before(data):
    config = CONFIGS[0]
    _, _, states = run_stage(data, config, (2, 0), 0, None, [2, 3])
    for rank, loader in enumerate(loaders(data, config, 2, 0)):
        assert loader.load_rank_states(states) is None  # no re-split
        assert loader.state_dict()["workers"] == states[rank]["workers"]


def test_a_resplit_says_what_it_moved_and_rereads_only_the_open_shards(data):
    config = CONFIGS[0]
    first, _, states = run_stage(data, config, (2, 0), 0, None, [2, 3])
    loader = loaders(data, config, 1, 0)[0]
    plan = loader.load_rank_states(states)
    assert plan is not None and plan.old == (2, 1) and plan.new == (1, 1)
    text = plan.describe()
    assert "2 ranks x 1 workers re-split over 1 ranks x 1 workers" in text and "buffered samples" in text
    assert plan.whole + plan.open <= 10 and plan.open >= 1
    rest = [k for batch in loader for k in batch["keys"]]
    assert sorted(first + rest) == sorted(data["keys"])
    assert loader.counts().get("resume.reread", 0) <= len(first)  # only positions of the open shards


@pytest.fixture(scope="module")
def shar_data(data, tmp_path_factory):
    """The contract's data with a Lhotse Shar (written by Lhotse: 24 cuts + 16 windows in 7 shards) as the list."""
    from corpus_io.shards.datalist import make_shard_list

    root = tmp_path_factory.mktemp("shar")
    shar_dir, texts = make_shar(root / "shar", shard_size=6)
    make_shard_list([str(shar_dir)], str(root / "data.list"))
    return dict(data, shard=str(root / "data.list"), keys=sorted(texts))


@pytest.mark.parametrize("topology", ["W2N2-W1N0", "W4-2-3"])
def test_a_lhotse_shar_list_resumes_on_any_topology_exactly_as_tar_shards_do(shar_data, topology):
    test_consumed_before_and_after_any_topology_change_is_one_epoch_exactly(shar_data, CONFIGS[0], topology, "early")


@pytest.fixture(scope="module")
def parquet_data(data, tmp_path_factory):
    """The contract's data with Hugging Face parquet (written by ``datasets``: the same 48 keys in 5 uneven files of
    row groups of 4) as the list."""
    from corpus_io.shards.datalist import make_shard_list

    root = tmp_path_factory.mktemp("parquet")
    files, utts = make_hf_parquet(root / "hf", num_utts=48, num_files=5, row_group=4)
    make_shard_list([str(files)], str(root / "data.list"))
    assert sorted(utts) == sorted(data["keys"])
    return dict(data, shard=str(root / "data.list"))


@pytest.mark.parametrize("topology", ["W2N2-W1N0", "W4-2-3"])
def test_a_parquet_list_resumes_on_any_topology_exactly_as_tar_shards_do(parquet_data, topology):
    test_consumed_before_and_after_any_topology_change_is_one_epoch_exactly(parquet_data, CONFIGS[0], topology, "early")


@pytest.mark.parametrize("kind", ["parquet", "shar"])
@pytest.mark.parametrize("config", [next(c for c in CONFIGS if c.mix),
                                    Config("epoch_hours", {"epoch_hours": 30 / 3600})], ids=lambda c: c.name)
def test_weighted_sources_and_epoch_hours_over_parquet_and_shar_lists_resume_exactly(request, kind, config):
    """``sources`` (the parquet or Shar list at weight 3 beside tar shards) and ``epoch_hours`` (30 s: under the
    Shar's 72 s of audio, so an epoch never wraps) read and resume as on tar shards."""
    data = request.getfixturevalue(f"{kind}_data")
    test_consumed_before_and_after_any_topology_change_is_one_epoch_exactly(data, config, "W2N2-W1N0", "early")
