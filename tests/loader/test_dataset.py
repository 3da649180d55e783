"""The loader end to end with real DataLoader worker processes, real audio and real shards."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from corpus_io.errors import ConfigError, DataError
from corpus_io.loader.dataset import WorkerStartTimeout, build_dataloader
from corpus_io.loader.partition import SlotState
from corpus_io.tokenizer import build_tokenizer
from tests.conftest import REPO, free_port, hang_limit, run_bounded
from tests.loader_data import (
    epoch_keys,
    fixture_utts,
    interrupted_epoch,
    make_raw,
    make_shards,
    read_then_checkpoint,
    small_conf,
    token_list,
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    data_list, keys = make_shards(out, copies=2, per_shard=2)  # 48 utterances in 24 shards
    return data_list, keys, build_tokenizer(token_list(out))


def test_batch_dict_has_the_documented_keys_and_shapes(shards):
    data_list, _, tok = shards
    loader = build_dataloader(str(data_list), small_conf(num_workers=1), tok, train=True, rank=0, world_size=1)
    batch = next(iter(loader))
    assert set(batch) == {"keys", "txt", "feats", "feats_lengths", "target", "target_lengths", "audio_seconds",
                          "padding_ratio"}
    b, t, d = batch["feats"].shape
    assert d == 80 and b == len(batch["keys"]) == 4 and t == int(batch["feats_lengths"].max())
    assert batch["target"].shape[0] == b and (batch["target"] >= -1).all()
    assert batch["audio_seconds"] == pytest.approx(float(batch["feats_lengths"].sum()) * 0.01)


def test_every_utterance_once_per_epoch_with_workers_and_a_new_order_each_epoch(shards):
    data_list, keys, tok = shards
    loader = build_dataloader(str(data_list), small_conf(), tok, train=True, rank=0, world_size=1)
    e0, e1 = epoch_keys(loader, 0), epoch_keys(loader, 1)
    assert sorted(e0) == sorted(keys) == sorted(e1)
    assert e0 != e1
    again = build_dataloader(str(data_list), small_conf(), tok, train=True, rank=0, world_size=1)
    assert epoch_keys(again, 0) == e0  # same seed, same order


def test_cv_mode_splits_across_ranks_without_shuffling(shards):
    data_list, keys, tok = shards
    per_rank = [epoch_keys(build_dataloader(str(data_list), small_conf(sort=False), tok, train=False, rank=r,
                                            world_size=2), 0) for r in range(2)]
    assert sorted(per_rank[0] + per_rank[1]) == sorted(keys)
    assert not set(per_rank[0]) & set(per_rank[1])
    assert per_rank[0] == epoch_keys(build_dataloader(str(data_list), small_conf(sort=False, seed=5), tok,
                                                      train=False, rank=0, world_size=2), 0)


@pytest.mark.parametrize("bucketing", [False, True])
def test_resume_is_exact_and_rereads_only_the_open_shards(shards, bucketing):
    data_list, keys, tok = shards
    conf = small_conf(bucketing=bucketing, num_buckets=3)
    first, rest, resumed = interrupted_epoch(
        lambda: build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1), epoch=1, batches=6)
    assert len(first) + len(rest) == len(keys)
    assert sorted(first + rest) == sorted(keys)  # none twice, none missing
    # bounded re-read: only units still open at the checkpoint are read again, never more than the epoch so far
    # (buckets may hold a sample of the very first unit, which then is still open)
    reread = resumed.counts().get("resume.reread", 0)
    assert reread <= len(first) if bucketing else reread < len(first)


def test_resume_with_a_different_worker_count_is_a_clear_error(shards):
    data_list, _, tok = shards
    loader = build_dataloader(str(data_list), small_conf(), tok, train=True, rank=0, world_size=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = build_dataloader(str(data_list), small_conf(num_workers=1), tok, train=True, rank=0, world_size=1)
    with pytest.raises(ConfigError, match="num_workers"):
        other.load_state_dict(state)


def test_a_state_that_is_not_a_loader_state_is_a_config_error_saying_what_to_pass(shards):
    data_list, keys, tok = shards
    loader = build_dataloader(str(data_list), small_conf(num_workers=0), tok, train=True, rank=0, world_size=1)
    for call, got in [("load_state_dict", None), ("load_rank_states", [None]), ("load_rank_states", None),
                      ("load_state_dict", "loader_state.json")]:
        with pytest.raises(ConfigError) as err:
            getattr(loader, call)(got)
        message = str(err.value)
        assert f"{call}(state" in message and "state_dict()" in message and "start the epoch afresh" in message
    assert sorted(epoch_keys(loader, 0)) == sorted(keys)  # nothing was loaded: a whole epoch


def test_loader_states_with_a_duplicated_rank_are_a_config_error_naming_the_ranks(shards):
    data_list, keys, tok = shards
    states = []
    for rank in range(2):
        loader = build_dataloader(str(data_list), small_conf(num_workers=0), tok, train=True, rank=rank,
                                  world_size=2)
        loader.set_epoch(0)
        next(iter(loader))
        states.append(loader.state_dict())
    loader = build_dataloader(str(data_list), small_conf(num_workers=0), tok, train=True, rank=1, world_size=2)
    with pytest.raises(ConfigError) as err:  # rank 0's state twice: rank 1's is missing
        loader.load_rank_states([states[0], states[0]])
    message = str(err.value)
    assert "repeated: [0]" in message and "missing: [1]" in message and "\n" not in message, message
    assert loader.load_rank_states(states) is None  # one per rank: the exact resume


def test_fewer_shards_than_workers_strides_without_hang(tmp_path, caplog):
    data_list, keys = make_shards(tmp_path, per_shard=24)  # one shard, 2 ranks x 2 workers
    tok = build_tokenizer(token_list(tmp_path))
    got = []
    with caplog.at_level("WARNING"):
        for rank in range(2):
            got += epoch_keys(build_dataloader(str(data_list), small_conf(), tok, train=True, rank=rank,
                                               world_size=2), 0)
    assert sorted(got) == sorted(keys)


def test_filters_count_what_they_drop(shards):
    data_list, keys, tok = shards
    conf = small_conf()
    conf.filter_conf.max_length = 300  # 3 s: drops the long utterances
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    got = epoch_keys(loader, 0)
    dropped = loader.counts().get("filter.too_long", 0)
    assert dropped > 0 and len(got) + dropped == len(keys)
    assert loader.epoch_counts() == loader.counts()


def test_truncated_shard_is_skipped_and_counted_or_named(tmp_path):
    data_list, keys = make_shards(tmp_path, per_shard=6)
    tok = build_tokenizer(token_list(tmp_path))
    bad = tmp_path / "shard-000001.tar"
    bad.write_bytes(bad.read_bytes()[:5000])
    loader = build_dataloader(str(data_list), small_conf(on_error="skip"), tok, train=True, rank=0, world_size=1)
    got = epoch_keys(loader, 0)
    assert loader.counts()["unreadable shards"] == 1
    assert 18 <= len(got) < len(keys) and len(set(got)) == len(got)
    # the utterances lost, not just "1 shard": from the index's num_utts minus those read before the break
    assert loader.counts()["utterances lost in unreadable shards"] == len(keys) - len(got)
    failing = build_dataloader(str(data_list), small_conf(on_error="fail"), tok, train=True, rank=0, world_size=1)
    with pytest.raises(DataError, match="shard-000001.tar"):
        epoch_keys(failing, 0)


def test_mixing_interleaves_by_weight_and_resumes(tmp_path):
    from corpus_io.config import SourceConf

    a, keys_a = make_shards(tmp_path / "a", per_shard=2)  # 24 utterances
    b, keys_b = make_raw(tmp_path / "b", copies=2, wenet=False)  # 48 others (c0-..., c1-...)
    tok = build_tokenizer(token_list(tmp_path))
    conf = small_conf(shuffle=False, sort=False, num_workers=1)
    conf.sources = [SourceConf(data_list=str(a), weight=1.0, data_type="shard"),
                    SourceConf(data_list=str(b), weight=3.0, data_type="raw")]
    loader = build_dataloader(None, conf, tok, train=True, rank=0, world_size=1)
    got = epoch_keys(loader, 0)
    # the epoch ends when b (48 utterances / weight 3 = 16 per weight, less than a's 24) has been read once
    assert sorted(got) == sorted(keys_a[:16] + keys_b)
    assert sum(k in set(keys_b) for k in got[:16]) == 12  # 3:1 by weight
    first, state = read_then_checkpoint(loader, epoch=0, batches=4)
    resumed = build_dataloader(None, conf, tok, train=True, rank=0, world_size=1)
    resumed.load_state_dict(state)
    rest = epoch_keys(resumed)
    assert sorted(first + rest) == sorted(keys_a[:16] + keys_b)


def test_epoch_hours_defines_an_epoch_as_an_amount_of_audio(shards):
    data_list, keys, tok = shards
    conf = small_conf(num_workers=1, epoch_hours=60 / 3600)  # one minute of audio per epoch
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    seen, seconds = [], []
    for epoch in range(3):
        loader.set_epoch(epoch)
        total = 0.0
        for batch in loader:
            seen += batch["keys"]
            total += batch["audio_seconds"]
        seconds.append(total)
    assert all(60 <= s < 90 for s in seconds), seconds
    # the epochs continue the stream: the first full pass has every key once before any repeats
    n = len(keys)
    assert sorted(seen[:n]) == sorted(keys)


def test_an_epoch_hours_epoch_stopped_early_loses_nothing_from_the_stream(shards):
    data_list, keys, tok = shards
    conf = small_conf(num_workers=1, epoch_hours=60 / 3600)
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    seen = []
    for epoch in range(4):
        loader.set_epoch(epoch)
        for batch in loader:
            seen += batch["keys"]
            if epoch == 0:
                break  # the trainer's max_steps_per_epoch: samples are still in the buffers
    # the buffered samples come back in epoch 1: the first pass still has every key once before any repeats
    assert sorted(seen[:len(keys)]) == sorted(keys)


def test_an_epoch_hours_stream_with_nothing_usable_ends_instead_of_spinning(shards):
    data_list, _, tok = shards
    conf = small_conf(num_workers=0, epoch_hours=1.0)
    conf.filter_conf.min_length, conf.filter_conf.max_length = 0, 1  # every utterance is longer: a pass yields nothing
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)

    def spinning(*_):
        raise AssertionError("the loader re-read its shards for 60 s without yielding")

    old = signal.signal(signal.SIGALRM, spinning)
    signal.alarm(60)
    try:
        assert list(loader) == []
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert loader.epoch_counts()["epoch_hours.empty_pass"] == 1


def test_companion_fields_on_a_raw_list_are_a_config_error_not_ignored(tmp_path):
    raw, _ = make_raw(tmp_path)
    conf = small_conf()
    conf.data_type, conf.fields = "raw", ["fbank"]
    with pytest.raises(ConfigError, match=r"fields=\['fbank'\].*raw list.*add-field"):
        build_dataloader(str(raw), conf, build_tokenizer(token_list(tmp_path)), train=True, rank=0, world_size=1)


def test_without_workers_the_loader_leaves_the_callers_torch_threads_alone(shards):
    import torch

    data_list, _, tok = shards
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        conf = small_conf()
        conf.num_workers = 0  # the loader runs in the training process, whose model wants every thread
        assert next(iter(build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)))["keys"]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _funasr_multi_file_list(tmp_path, parts: int = 3):
    """FunASR's multi-file data list: the lines of one real JSONL split over ``parts`` files, one path per line
    (relative to the list's directory, as FunASR's data_split_num lists are)."""
    raw, keys = make_raw(tmp_path, copies=2, wenet=False)
    lines = raw.read_text(encoding="utf-8").splitlines(keepends=True)
    names = []
    for p in range(parts):
        name = f"train.{p}.jsonl"
        (tmp_path / name).write_text("".join(lines[p::parts]), encoding="utf-8")
        names.append(name)
    (tmp_path / "train.list").write_text("".join(n + "\n" for n in names))
    return tmp_path / "train.list", keys


def test_a_funasr_list_of_jsonl_files_loads_every_key_once_in_raw_mode(tmp_path):
    data_list, keys = _funasr_multi_file_list(tmp_path)
    tok = build_tokenizer(token_list(tmp_path))
    got = []
    for rank in range(2):
        got += epoch_keys(build_dataloader(str(data_list), small_conf(data_type="raw"), tok, train=True, rank=rank,
                                           world_size=2), 0)
    assert sorted(got) == sorted(keys)


def test_shard_mode_given_jsonl_says_what_it_is_and_what_to_set(tmp_path):
    data_list, _ = _funasr_multi_file_list(tmp_path)
    tok = build_tokenizer(token_list(tmp_path))
    with pytest.raises(DataError, match=r"lists JSONL files .*FunASR's multi-file.*data_type=raw"):
        build_dataloader(str(data_list), small_conf(data_type="shard"), tok, train=True, rank=0, world_size=1)
    with pytest.raises(DataError, match=r"holds JSON lines.*data_type=raw"):
        build_dataloader(str(tmp_path / "train.0.jsonl"), small_conf(data_type="shard"), tok, train=True, rank=0,
                         world_size=1)


def test_without_workers_the_data_work_runs_on_one_torch_thread(shards):
    import torch

    data_list, _, tok = shards

    class ThreadsSeen:  # the real tokenizer, noting torch's thread count while the pipeline runs
        def __init__(self, inner):
            self.inner, self.seen = inner, set()

        def encode(self, text):
            self.seen.add(torch.get_num_threads())
            return self.inner.encode(text)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        observed = ThreadsSeen(tok)
        conf = small_conf()
        conf.num_workers = 0
        batches = list(build_dataloader(str(data_list), conf, observed, train=True, rank=0, world_size=1))
        assert batches and observed.seen == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _epochs_of_keys(loader, epochs: range) -> list[list[str]]:
    return [epoch_keys(loader, e) for e in epochs]


def test_epoch_hours_resume_after_the_budget_is_spent_equals_the_uninterrupted_run(shards):
    data_list, keys, tok = shards
    conf = small_conf(num_workers=2, epoch_hours=60 / 3600)  # 30 s per worker: spent before the first batch
    conf.shuffle_conf.shuffle_size = 40
    whole = _epochs_of_keys(build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1), range(3))
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    first = []
    for batch in loader:
        first += batch["keys"]
        if len(first) >= 4:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    assert any(w["seconds"] >= 30 and w["pending"] for w in state["workers"].values()), state  # the bug's setup
    resumed = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    resumed.load_state_dict(state)
    rest = [epoch_keys(resumed, 0), *_epochs_of_keys(resumed, range(1, 3))]
    assert sorted(first + rest[0]) == sorted(whole[0])  # the buffered samples come back after the resume
    assert [sorted(e) for e in rest[1:]] == [sorted(e) for e in whole[1:]]  # and the next epochs are unchanged


def test_epoch_hours_epoch_after_an_early_stop_has_its_configured_hours(shards):
    import soundfile as sf

    data_list, _, tok = shards
    conf = small_conf(num_workers=1, epoch_hours=60 / 3600)
    conf.shuffle_conf.shuffle_size = 40
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    next(iter(loader))  # the trainer's max_steps_per_epoch: the rest of the buffers stays pending
    assert sum(len(SlotState.from_dict(w).pending) for w in loader.state_dict()["workers"].values()) >= 10
    loader.set_epoch(1)
    seconds = sum(batch["audio_seconds"] for batch in loader)
    longest = max(sf.info(path).duration for _, path, _ in fixture_utts())
    assert 60 <= seconds < 60 + longest + 0.1, seconds  # the carried samples count towards epoch 1's budget


def test_weighted_sources_without_epoch_hours_give_shares_by_weight_every_epoch(tmp_path):
    from corpus_io.config import SourceConf

    a, keys_a = make_shards(tmp_path / "a", copies=2, per_shard=4)  # 48 utterances, weight 3
    # 48 others, weight 1: a (16 per weight) is the source read once per epoch
    b, keys_b = make_shards(tmp_path / "b", utts=[(f"b-{k}", p, t) for k, p, t in fixture_utts(2)], per_shard=4)
    tok = build_tokenizer(token_list(tmp_path))
    conf = small_conf(num_workers=2)
    conf.sources = [SourceConf(data_list=str(a), weight=3.0, data_type="shard"),
                    SourceConf(data_list=str(b), weight=1.0, data_type="shard")]
    loader = build_dataloader(None, conf, tok, train=True, rank=0, world_size=1)
    epochs = _epochs_of_keys(loader, range(3))
    for got in epochs:
        share = sum(k in set(keys_a) for k in got) / len(got)
        assert abs(share - 0.75) <= 0.02, (share, len(got))
        assert sorted(k for k in got if k in set(keys_a)) == sorted(keys_a)  # a: read once per epoch
    # b continues where it stopped: 3 epochs x 16 = each of its 48 utterances once
    assert sorted(k for got in epochs for k in got if k in set(keys_b)) == sorted(keys_b)


def test_raw_waveform_batches_count_audio_seconds_from_samples(shards):
    data_list, _, _ = shards
    loader = build_dataloader(str(data_list), small_conf(num_workers=0, feats_type="raw"), None, train=False, rank=0,
                              world_size=1)
    batch = next(iter(loader))
    assert batch["feats"].shape[-1] == 1
    assert batch["audio_seconds"] == pytest.approx(float(batch["feats_lengths"].sum()) / 16000)


def test_a_key_two_shards_hold_fails_naming_both_or_with_skip_is_read_once_and_counted(tmp_path):
    from tests.shards.conftest import packed_with_a_repeat

    merged, a, again = packed_with_a_repeat(tmp_path)
    tok = build_tokenizer(token_list(tmp_path))
    conf = small_conf()
    conf.filter_conf.token_min_length = 0
    with pytest.raises(DataError, match=f"in shards {a}/shard-000000.tar, {again}/shard-000000.tar"):
        build_dataloader(str(merged), conf, tok, train=True, rank=0, world_size=1)
    conf.on_error = "skip"
    loader = build_dataloader(str(merged), conf, tok, train=True, rank=0, world_size=1)
    got = epoch_keys(loader, 0)
    assert len(got) == len(set(got)) == 24  # 28 samples in the shards, 24 distinct keys
    assert loader.counts().get("duplicate key") == 4


def test_a_copied_shard_appended_to_a_list_whose_index_lacks_it_is_refused_or_with_skip_read_once(tmp_path):
    import shutil

    from corpus_io.config import PackShardsConfig
    from corpus_io.shards.pack import pack_shards
    from tests.shards.conftest import fixture_records, write_jsonl

    out = tmp_path / "a"
    pack_shards(PackShardsConfig(input=str(write_jsonl(tmp_path / "a.jsonl", fixture_records())), output_dir=str(out),
                                 num_workers=1, num_utts_per_shard=10))
    shutil.copy(out / "shard-000001.tar", out / "copy-000001.tar")  # same content, another name, no index entry
    with open(out / "data.list", "a") as f:
        f.write(f"{out / 'copy-000001.tar'}\n")
    tok = build_tokenizer(token_list(tmp_path))
    conf = small_conf()
    with pytest.raises(DataError) as err:  # before any batch: nothing is trained
        build_dataloader(str(out / "data.list"), conf, tok, train=True, rank=0, world_size=1)
    assert f"in shards {out}/shard-000001.tar, {out}/copy-000001.tar" in str(err.value)
    assert "the member names of the 1 listed shard(s) it has no entry for" in str(err.value)
    conf.on_error = "skip"
    loader = build_dataloader(str(out / "data.list"), conf, tok, train=True, rank=0, world_size=1)
    got = epoch_keys(loader, 0)
    assert len(got) == len(set(got)) == 24  # 34 samples in the shards, 24 distinct keys
    assert loader.counts().get("duplicate key") == 10


def test_a_worker_stuck_past_batch_timeout_fails_naming_rank_and_worker(tmp_path):
    tok = build_tokenizer(token_list(tmp_path))
    listed = tmp_path / "stuck.list"  # a pipe that never ends: the read neither fails nor delivers
    listed.write_text(json.dumps({"key": "stuck", "wav": f"pipe:sleep {hang_limit(20):.0f}", "txt": "a"}) + "\n",
                      encoding="utf-8")
    conf = small_conf(num_workers=1, data_type="raw", allow_pipe=True, batch_timeout=3.0)
    loader = build_dataloader(str(listed), conf, tok, train=True, rank=0, world_size=1)
    with pytest.raises(DataError) as err:
        list(loader)
    message = str(err.value)
    assert "rank 0: DataLoader worker 0 of 1 sent no batch for 3 s" in message
    assert "dataset_conf.batch_timeout" in message


def test_a_worker_that_has_not_started_within_worker_start_timeout_fails_naming_rank_loader_and_epoch(shards):
    data_list, _, tok = shards
    # a spawned worker is a fresh interpreter: it cannot import torch in 50 ms, so it has not started by then
    conf = small_conf(num_workers=1, worker_start_method="spawn", worker_start_timeout=0.05)
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=1, world_size=2)
    loader.set_epoch(3)
    with pytest.raises(WorkerStartTimeout) as err:
        list(loader)
    message = str(err.value)
    assert message.startswith("rank 1: the train loader in epoch 3: DataLoader worker 0 of 1 (pid ")
    assert "did not start within 0.05 s (dataset_conf.worker_start_timeout)" in message
    assert "worker_start_method=spawn" in message and "\n" not in message


def _frozen_objects(queue) -> None:
    import gc

    queue.put(gc.get_freeze_count())


def test_a_forkserver_worker_never_walks_what_the_forkserver_preloaded():
    """The forkserver freezes what its preload made (gc.freeze, issue 53): a worker's full collections would write
    to every one of torch's objects and so copy their pages into every worker."""
    from corpus_io.loader.workers import main_not_run_again, start_forkserver, worker_context

    ctx = worker_context("forkserver")
    start_forkserver("forkserver")
    queue = ctx.Queue()
    with main_not_run_again(True):
        proc = ctx.Process(target=_frozen_objects, args=(queue,))
        proc.start()
    frozen = queue.get(timeout=hang_limit(120))
    proc.join(timeout=hang_limit(30))
    assert frozen > 50_000, frozen  # torch's and the loader's objects


def test_a_thread_holding_torchs_generator_lock_stops_a_forked_worker_but_not_a_forkserver_one(shards):
    """Issue 47's hang, reproduced: a fork taken while another thread of the rank holds a lock leaves the lock held
    in the child forever. torch's CPU generator is one such lock (every DataLoader worker seeds torch first)."""
    import threading

    import torch

    data_list, keys, tok = shards
    stop, entering = threading.Event(), threading.Event()
    # one intra-op thread, and a draw sized to last about 0.3 s: on a many-core machine torch splits a draw across
    # its threads, and a 20M draw (0.15 s on 2 cores) ends before the fork (CI's runner lost 24 races in a row)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    torch.randn(1_000_000)
    draw_size = int(min(80_000_000, max(5_000_000, 0.3 / max(time.perf_counter() - started, 1e-6) * 1_000_000)))

    def draw() -> None:  # inside torch.randn, holding the generator's lock, nearly all the time
        while not stop.is_set():
            entering.set()
            torch.randn(draw_size)

    # two drawers: while main waits for the lock (its loader's base seed is a draw too), the other drawer waits
    # inside torch as well, needing no GIL, and takes the lock the moment main lets it go: held again before the
    # fork that follows within milliseconds (one drawer needs the GIL to draw again, and lost that race under load)
    threads = [threading.Thread(target=draw) for _ in range(2)]
    for thread in threads:
        thread.start()
    stuck, read = [], []
    try:
        # each fork is taken just after the thread entered a draw (torch releases the GIL inside it, and the main
        # thread waits for the GIL until then), so the lock is held then unless the draw already ended: a race
        # the fork nearly always loses, even when other tests load the machine (a random time between draws lost
        # it 24 times in a row beside 3 pytest-xdist workers). Up to 24 forks until one is stuck, then 2 forkservers
        for method in ["fork"] * 24 + ["forkserver"] * 2:
            if method == "fork" and stuck:
                continue
            bound = hang_limit(2) if method == "fork" else hang_limit(60)  # the forkserver's first start imports torch
            conf = small_conf(num_workers=1, worker_start_method=method, worker_start_timeout=bound)
            loader = build_dataloader(str(data_list), conf, tok, train=False, rank=0, world_size=1)
            entering.clear()
            entering.wait()
            try:
                read.append((method, sum(len(batch["keys"]) for batch in loader)))
            except WorkerStartTimeout as err:
                stuck.append((method, str(err)))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        torch.set_num_threads(threads_before)
    assert read.count(("forkserver", len(keys))) == 2, (read, stuck)
    assert stuck and {method for method, _ in stuck} == {"fork"}, "the hazard did not show: the test shows nothing"
    for _, message in stuck:
        assert message.startswith("rank 0: the cv/test loader in epoch 0: DataLoader worker 0 of 1 (pid ")
        assert "worker_start_method=fork) and never ran" in message and "forkserver" in message
        assert "\n" not in message


@pytest.mark.slow
def test_the_cv_loader_starts_100_times_on_2_gloo_ranks_beside_tensorboard_a_train_loader_and_a_drawing_thread(
        tmp_path):
    """Issue 47: the cv worker forked from a rank with threads alive hung at a random epoch (17 to 97). With a thread
    drawing from torch's generator beside them (``--draw``), the old fork start hangs within the first epochs."""
    cv_list, _ = make_shards(tmp_path / "cv", per_shard=1, utts=fixture_utts()[:2])  # one utterance per rank
    train_list, _ = make_shards(tmp_path / "train", copies=2, per_shard=8)
    tokens = token_list(tmp_path).token_list
    epochs = 100
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node=2", f"--master_port={free_port()}",
           str(REPO / "tests" / "threaded_ranks.py"), str(train_list), str(cv_list), tokens, str(tmp_path / "tb"),
           str(epochs), "--hang-s", f"{hang_limit(60):.0f}", "--draw"]
    env = dict(os.environ, PYTHONPATH=str(REPO), CORPUS_IO_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    result = run_bounded(cmd, 600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for rank in range(2):
        assert f"rank {rank}: started the cv loader {epochs} times, 1 utterances each" in result.stdout
    assert list((tmp_path / "tb").glob("events.out.tfevents.*")), "rank 0's TensorBoard writer wrote nothing"


@pytest.mark.parametrize("num_workers, data_type", [(0, "shard"), (2, "shard"), (2, "raw")])
def test_what_a_rank_leaves_unused_is_counted_from_its_state_without_reading(shards, tmp_path, num_workers,
                                                                             data_type):
    data_list, keys, tok = shards
    if data_type == "raw":  # one chunk of 48 lines for 4 readers: strided
        data_list, _ = make_raw(tmp_path, copies=2)
    conf = small_conf(num_workers=num_workers, data_type=data_type)
    loader = build_dataloader(str(data_list), conf, tok, train=True, rank=1, world_size=2)
    loader.set_epoch(3)
    consumed, it = [], iter(loader)
    for _ in range(2):
        consumed += next(it)["keys"]
    before = loader.counts()
    left = loader.left_in_epoch()
    assert loader.counts() == before  # nothing was read to count it
    del it
    rest = build_dataloader(str(data_list), conf, tok, train=True, rank=1, world_size=2)
    rest.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert left == len([k for batch in rest for k in batch["keys"]]) > 0


# --------------------------------------------------------------------------- ranks holding unequal data

#: the shapes users train on (issue 29), at default settings but the batch size: (utterances, shard sizes, batch)
UNEVEN_SHAPES = {
    "60 utterances in shards of 7": ("fixture", 7, 4),
    "10 real recordings in shards of 3": ("real", 3, 2),
    "10 shards of 2 to 9 utterances for 4 readers": ("fixture", [2, 3, 4, 5, 6, 7, 8, 9, 2, 2], 4),
}
UNEVEN_EPOCHS = 8


def _real_utts() -> list[tuple[str, str, str]]:
    spec = importlib.util.spec_from_file_location("real_recordings", REPO / "recipes" / "tools" / "real_recordings.py")
    real_recordings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_recordings)
    path = real_recordings.cache_dir()
    if not real_recordings.is_complete(path):
        pytest.fail(f"the real recordings are not fetched ({path}): run `make install` or "
                    f"`python recipes/tools/real_recordings.py fetch` once.")
    texts = dict(line.split(" ", 1) for line in (path / "text").read_text().splitlines())
    return [(key, wav, texts[key]) for key, wav in (line.split(" ", 1) for line in
                                                   (path / "wav.scp").read_text().splitlines())]


@pytest.fixture(scope="module")
def uneven_runs(tmp_path_factory):
    """Each shape on 2 real gloo ranks for 8 epochs with docs/API.md's loop (tests/uneven_ranks.py), and the first
    shape again, checkpointed after the first batch of epoch 1 (which begins with what epoch 0 left) and resumed."""
    import soundfile as sf

    root = tmp_path_factory.mktemp("uneven")
    real = _real_utts()
    chars = sorted({c for utts in (real, fixture_utts()) for _, _, text in utts for c in text if not c.isspace()})
    tokens = root / "tokens.txt"
    tokens.write_text("".join(f"{s} {i}\n" for i, s in enumerate(["<blank>", "<unk>", *chars, "<sos/eos>"])))
    runs, shapes = [], {}
    for n, (name, (corpus, sizes, batch)) in enumerate(UNEVEN_SHAPES.items()):
        utts = fixture_utts(3)[:60] if corpus == "fixture" and sizes == 7 else real if corpus == "real" else \
            fixture_utts(2)
        data_list, keys = make_shards(root / f"shape{n}", utts=utts, **(
            {"per_shard": sizes} if isinstance(sizes, int) else {"sizes": sizes}))
        seconds = {key: sf.info(str(REPO / path)).duration for key, path, _ in utts}
        shapes[name] = {"keys": keys, "batch": batch, "out": root / f"out{n}", "seconds": seconds}
        runs.append({"data_list": str(data_list), "tokens": str(tokens), "dataset_conf": {"batch_size": batch},
                     "epochs": UNEVEN_EPOCHS, "out": str(root / f"out{n}")})
    first = runs[0]
    resumed = {**first, "out": str(root / "resumed"), "epochs": 3}
    runs += [{**resumed, "save_after": [1, 1]}, {**resumed, "resume": True}]
    shapes["resumed"] = {**shapes[next(iter(UNEVEN_SHAPES))], "out": root / "resumed"}
    for run in runs:
        Path(run["out"]).mkdir(exist_ok=True)
    (root / "spec.json").write_text(json.dumps({"world_size": 2, "runs": runs}))
    result = run_bounded([sys.executable, str(REPO / "tests" / "uneven_ranks.py"), str(root / "spec.json")], 900)
    assert result.returncode == 0, result.stderr[-5000:]
    for shape in shapes.values():
        shape["epochs"] = [[json.loads((shape["out"] / f"rank{r}.epoch{e}.json").read_text()) for r in range(2)]
                           for e in range(len(list(shape["out"].glob("rank0.epoch*.json"))))]
    return shapes


def _untrained_by_epoch(shape: dict) -> list[set[str]]:
    out = []
    for epoch, ranks in enumerate(shape["epochs"]):
        keys = [k for r in ranks for k in r["keys"]]
        twice = [k for k, n in Counter(keys).items() if n > 1]
        assert not twice, f"epoch {epoch}: {twice} trained twice"
        out.append(set(shape["keys"]) - set(keys))
    return out


@pytest.mark.parametrize("name", list(UNEVEN_SHAPES))
def test_ranks_holding_unequal_data_leave_no_utterance_untrained_two_epochs_in_a_row(uneven_runs, name):
    shape = uneven_runs[name]
    untrained = _untrained_by_epoch(shape)  # and each key at most once per epoch
    assert len(untrained) == UNEVEN_EPOCHS and sum(map(len, untrained)) > 0  # the shape does leave some untrained
    for epoch in range(1, UNEVEN_EPOCHS):
        assert not untrained[epoch] & untrained[epoch - 1], f"epoch {epoch - 1} and {epoch}: the same untrained"
    for epoch, ranks in enumerate(shape["epochs"]):
        # the counts say it: what the ranks left untrained, and that it is carried into the next epoch
        assert sum(r["counts"].get("uneven_ranks.unused", 0) for r in ranks) == len(untrained[epoch])
        assert sum(r["counts"].get("uneven_ranks.carried", 0) for r in ranks) == len(untrained[epoch])
        if epoch and untrained[epoch - 1]:  # carried first: among each rank's first batches (2 workers)
            at = [i for r in ranks for i, k in enumerate(r["keys"]) if k in untrained[epoch - 1]]
            most = max(r["counts"].get("uneven_ranks.carried", 0) for r in shape["epochs"][epoch - 1])
            assert max(at) < 2 * shape["batch"] * math.ceil(most / shape["batch"]), (epoch, at)


@pytest.mark.parametrize("name", list(UNEVEN_SHAPES))
def test_what_ranks_holding_unequal_data_leave_untrained_is_not_their_longest(uneven_runs, name):
    shape = uneven_runs[name]
    longest = set(sorted(shape["keys"], key=lambda k: -shape["seconds"][k])[:math.ceil(len(shape["keys"]) / 10)])
    left = [k for untrained in _untrained_by_epoch(shape) for k in untrained]
    assert sum(k in longest for k in left) <= len(left) // 3, (sorted(longest), left)  # 10 % by chance


def test_an_epoch_resumed_while_training_the_carried_rest_trains_it_and_each_key_once(uneven_runs):
    shape = uneven_runs["resumed"]
    untrained = _untrained_by_epoch(shape)  # epoch 1: before and after the resume; each key at most once
    assert len(untrained) == 3 and untrained[0], "epoch 0 left nothing: epoch 1 carries nothing"
    assert not untrained[1] & untrained[0] and not untrained[2] & untrained[1]
    first = uneven_runs[next(iter(UNEVEN_SHAPES))]["epochs"][0]
    assert shape["epochs"][0] == first  # the same run up to the checkpoint


@pytest.mark.parametrize("num_workers", [0, 1])
def test_raw_waveform_batches_hold_exactly_the_decoded_float_samples(shards, num_workers):
    """16-bit PCM travels as int16 from decode to pad (build.int16_decode); the batch holds k / 32768 as float32,
    bit for bit what soundfile decodes, in the worker's shared batch and in the main process alike."""
    import soundfile as sf
    import torch

    from corpus_io.loader.build import int16_decode, loader_chain

    data_list, _, _ = shards
    conf = small_conf(feats_type="raw", num_workers=num_workers)
    assert int16_decode(loader_chain(conf, None, train=True))
    paths = {key: path for key, path, _ in fixture_utts(copies=2)}
    loader = build_dataloader(str(data_list), conf, None, train=True, rank=0, world_size=1)
    seen = 0
    for batch in loader:
        assert batch["feats"].dtype == torch.float32
        for key, row, n in zip(batch["keys"], batch["feats"], batch["feats_lengths"].tolist()):
            wave, rate = sf.read(paths[key], dtype="float32")
            if rate != 16000 or wave.ndim != 1 or sf.info(paths[key]).subtype != "PCM_16":
                continue  # resampled or not 16-bit: not the int16 path
            assert torch.equal(row[:n, 0], torch.from_numpy(wave)) and not row[n:].any(), key
            seen += 1
    assert seen >= 4


_KILLED_RANK = """
import json, os, signal, sys
from corpus_io.config import TokenizerConf
from corpus_io.loader.dataset import build_dataloader
from corpus_io.tokenizer import build_tokenizer
from tests.loader_data import small_conf

if __name__ == "__main__":
    tok = build_tokenizer(TokenizerConf(**json.loads(sys.argv[2])))
    loader = build_dataloader(sys.argv[1], small_conf(num_workers=2), tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    batches = iter(loader)
    next(batches)  # the workers run while the epoch does
    import psutil
    print(" ".join(str(p.pid) for p in psutil.Process().children(recursive=True)), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_processs_forkserver_workers_and_forkserver_end_with_it(shards, tmp_path):
    """kill -9 of a rank: torch's worker watches only its parent, which with the forkserver is the forkserver; it
    lived on while a worker held its alive pipe, so the killed rank's workers and forkserver never ended."""
    import psutil

    data_list, _, tok = shards
    script = tmp_path / "killed_rank.py"
    script.write_text(_KILLED_RANK)
    tok_conf = {"type": tok.conf.type, "token_list": tok.conf.token_list}
    result = run_bounded([sys.executable, str(script), str(data_list), json.dumps(tok_conf)], 120,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) >= 3, result.stdout  # the forkserver, its 2 workers (and the resource tracker)
    deadline = time.monotonic() + hang_limit(20)
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, f"processes of the killed process still alive: {alive}"
