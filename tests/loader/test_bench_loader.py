"""bench-loader as the partition and resume test: real torchrun (gloo, CPU), real worker processes, kill -9;
and its user errors (bad state files and counts), which are fast."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from corpus_io.config import BenchLoaderConfig, compose
from corpus_io.errors import ConfigError, DataError
from corpus_io.loader.bench import bench_loader
from tests.conftest import BIN, REPO, assert_user_error, free_port, hang_limit, run_bounded, run_cli
from tests.loader_data import env_no_threads, fixture_utts, make_shards, token_list


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_loader")
    data_list, keys = make_shards(out, copies=2, per_shard=3)  # 48 utterances, 16 shards
    tok = token_list(out)
    return data_list, keys, tok.token_list


def overrides(data_list: Path, tokens: str, *extra: str) -> list[str]:
    return [f"++data_list={data_list}", f"++tokenizer.token_list={tokens}", "++dataset_conf.batch_size=4",
            "++dataset_conf.shuffle_conf.shuffle_size=8", "++dataset_conf.sort_conf.sort_size=4",
            "++dataset_conf.bucketing=false", *extra]


def torchrun(data_list: Path, tokens: str, dump: Path) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={free_port()}", "--no-python",
           str(BIN / "corpus-io"), "bench-loader",
           *overrides(data_list, tokens, f"++dump_keys={dump}", "++epochs=2", "++dataset_conf.num_workers=2")]
    result = run_bounded(cmd, 240, env=env_no_threads())
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def read_keys(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split()


@pytest.mark.slow
def test_torchrun_two_ranks_every_key_once_per_epoch_new_order_each_epoch_same_seed_same_order(corpus, tmp_path):
    data_list, keys, tokens = corpus
    torchrun(data_list, tokens, tmp_path / "a")
    orders = {}
    for epoch in range(2):
        per_rank = [read_keys(tmp_path / "a" / f"keys.rank{r}.epoch{epoch}.txt") for r in range(2)]
        assert all(per_rank), "a rank got no data"
        merged = per_rank[0] + per_rank[1]
        assert sorted(merged) == sorted(keys), f"epoch {epoch}: not every key exactly once"
        orders[epoch] = per_rank
    assert orders[0] != orders[1]
    torchrun(data_list, tokens, tmp_path / "b")
    for epoch in range(2):
        for r in range(2):
            assert read_keys(tmp_path / "b" / f"keys.rank{r}.epoch{epoch}.txt") == orders[epoch][r]


@pytest.mark.slow
def test_kill_9_after_saving_state_then_resume_is_exact(corpus, tmp_path):
    data_list, keys, tokens = corpus
    state, dump = tmp_path / "state.json", tmp_path / "keys"
    cmd = [str(BIN / "corpus-io"), "bench-loader",
           *overrides(data_list, tokens, f"++dump_keys={dump}", "++dataset_conf.num_workers=2",
                      "++save_state_after=3", f"++state_file={state}")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env_no_threads(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + hang_limit(120)
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert state.exists(), proc.communicate()[1].decode()
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    before = read_keys(dump / "keys.rank0.epoch0.txt")
    assert len(before) == 12  # 3 batches of 4

    resumed = run_cli("corpus-io", "bench-loader", *overrides(data_list, tokens, f"++dump_keys={dump}",
                                                              "++dataset_conf.num_workers=2",
                                                              f"++state_file={state}"))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming epoch 0 after 3 batches" in resumed.stdout
    everything = read_keys(dump / "keys.rank0.epoch0.txt")
    assert everything[:12] == before
    assert sorted(everything) == sorted(keys)  # none twice, none missing
    assert "resume.reread" in resumed.stdout or "dropped: none" in resumed.stdout


@pytest.mark.slow
def test_a_state_saved_by_two_ranks_resumes_on_one_rank_with_one_worker_exactly(corpus, tmp_path):
    data_list, keys, tokens = corpus
    state, dump = tmp_path / "state.json", tmp_path / "keys"
    cmd = [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={free_port()}", "--no-python",
           str(BIN / "corpus-io"), "bench-loader",
           *overrides(data_list, tokens, f"++dump_keys={dump}", "++dataset_conf.num_workers=2",
                      "++save_state_after=2", f"++state_file={state}")]
    saved = run_bounded(cmd, 240, env=env_no_threads())
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert sorted(p.name for p in tmp_path.glob("state.json*")) == ["state.json.rank0", "state.json.rank1"]
    before = [read_keys(dump / f"keys.rank{r}.epoch0.txt") for r in range(2)]
    assert [len(b) for b in before] == [8, 8]

    resumed = run_cli("corpus-io", "bench-loader", *overrides(data_list, tokens, f"++dump_keys={dump}",
                                                              "++dataset_conf.num_workers=1", "++epochs=2",
                                                              f"++state_file={state}"))
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(r"resuming epoch 0 after \d+ batches \(loader state of 2 ranks x 2 workers re-split over "
                     r"1 ranks x 1 workers", resumed.stdout), resumed.stdout
    after = read_keys(dump / "keys.rank0.epoch0.txt")[8:]
    assert sorted(before[0] + before[1] + after) == sorted(keys)  # none twice, none missing
    assert sorted(read_keys(dump / "keys.rank0.epoch1.txt")) == sorted(keys)  # the next epoch is whole
    assert not list(tmp_path.glob("state.json*"))  # spent, every rank's file


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_loader_small")
    data_list, _ = make_shards(out, per_shard=24)  # 24 utterances, 1 shard
    return data_list, token_list(out).token_list


def bench(data_list: Path, tokens: str, *extra: str) -> dict:
    cfg = compose(BenchLoaderConfig, "bench_loader", [f"++data_list={data_list}", f"++tokenizer.token_list={tokens}",
                                                      "++dataset_conf.batch_size=8", *extra])
    return bench_loader(cfg)


@pytest.mark.parametrize("content, why", [
    (b'{"key": "a", "wav": "a.wav"}\n{"key": "b", "wav": "b.wav"}\n', "is not valid JSON"),  # a JSONL
    (b"", "is empty"),
    (b"[1, 2]", "JSON list"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"key": "a", "wav": "a.wav"}', "has no 'version', 'epoch', 'workers' entries"),
    (b'{"version": 1, "epoch": "zero", "workers": {}}', "epoch='zero'"),
    (b'{"version": 1, "epoch": 0, "workers": [1]}', "'workers' entry"),
])
def test_state_file_that_is_not_a_loader_state_is_a_data_error_naming_it_and_kept(small, tmp_path, content, why):
    state = tmp_path / "not_a_state.json"
    state.write_bytes(content)
    with pytest.raises(DataError) as err:
        bench(*small, f"++state_file={state}")
    assert str(state) in str(err.value) and why in str(err.value) and "not a loader state" in str(err.value)
    assert state.read_bytes() == content  # a user's file pointed at by mistake is not deleted


def test_state_file_and_count_mistakes_from_the_cli_are_one_paragraph_user_errors(small, tmp_path):
    data_list, tokens = small
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text('{"key": "a"}\n{"key": "b"}\n', encoding="utf-8")
    assert_user_error(run_cli("corpus-io", "bench-loader", *overrides(data_list, tokens, f"++state_file={jsonl}")),
                      "error: state_file", str(jsonl))
    assert_user_error(run_cli("corpus-io", "bench-loader", *overrides(data_list, tokens, "++epochs=0")),
                      "error: epochs=0")
    assert_user_error(run_cli("corpus-io", "bench-loader", f"++data_list={data_list}",
                              f"++tokenizer.token_list={tokens}", "++dataset_conf.batch_size=0"),
                      "error: dataset_conf.batch_size=0")


@pytest.mark.parametrize("override, key", [
    ("++epochs=0", "epochs=0"), ("++epochs=-1", "epochs=-1"), ("++dataset_conf.batch_size=0", "batch_size=0"),
    ("++dataset_conf.batch_size=-4", "dataset_conf.batch_size=-4"), ("++max_batches=-1", "max_batches=-1"),
    ("++save_state_after=-1", "save_state_after=-1"),
])
def test_counts_below_their_minimum_are_config_errors_naming_the_key(small, override, key):
    with pytest.raises(ConfigError, match=key):
        bench(*small, override)
    if "batch_size" in override:  # every batch_type, not only example
        with pytest.raises(ConfigError, match="dataset_conf.batch_size"):
            bench(*small, override, "++dataset_conf.batch_type=token")


def test_a_state_for_a_later_epoch_than_epochs_is_a_config_error_and_kept(small, tmp_path):
    state = tmp_path / "state.json"
    saved = bench(*small, "++save_state_after=1", f"++state_file={state}", "++epochs=3")
    assert saved["batches"] == 1
    later = json.loads(state.read_text())
    later["epoch"] = 2
    state.write_text(json.dumps(later))
    with pytest.raises(ConfigError, match="epochs=2"):
        bench(*small, f"++state_file={state}", "++epochs=2")
    assert state.is_file()  # not spent by a run that did nothing
    summary = bench(*small, f"++state_file={state}", "++epochs=3")
    assert [row["epoch"] for row in summary["epochs"]] == [2] and not state.exists()


def test_weighted_sources_alone_need_no_data_list(corpus, tmp_path):
    data_list, keys, tokens = corpus
    other, _ = make_shards(tmp_path / "b", utts=[(f"b-{k}", p, t) for k, p, t in fixture_utts(2)], per_shard=6)
    sources = f"[{{data_list: {data_list}, weight: 3}}, {{data_list: {other}, weight: 1}}]"
    result = run_cli("corpus-io", "bench-loader", f"++dataset_conf.sources={sources}", f"++dump_keys={tmp_path / 'k'}",
                     f"++tokenizer.token_list={tokens}", "++dataset_conf.batch_size=4", env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    got = read_keys(tmp_path / "k" / "keys.rank0.epoch0.txt")
    assert sorted(k for k in got if k in set(keys)) == sorted(keys)  # the first list (16 per weight) once
    assert abs(sum(k in set(keys) for k in got) / len(got) - 0.75) <= 0.02


def test_a_resumed_shard_epoch_reports_what_it_read_again(small, tmp_path):
    data_list, tokens = small
    state = tmp_path / "state.json"
    args = ("corpus-io", "bench-loader", f"++data_list={data_list}", f"++tokenizer.token_list={tokens}",
            "++dataset_conf.batch_size=8", f"++state_file={state}")
    assert run_cli(*args, "++save_state_after=1").returncode == 0
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    reread = re.search(r"re-read after the resume: (\d+) utterances", result.stdout)
    assert reread and int(reread.group(1)) > 0, result.stdout  # the open shard is read again up to the position
    assert "resume.reread" not in result.stdout  # not reported as dropped


def test_bench_loader_prints_the_loader_chain_it_runs_before_the_first_batch(small):
    data_list, tokens = small
    result = run_cli("corpus-io", "bench-loader", f"++data_list={data_list}", f"++tokenizer.token_list={tokens}",
                     "++dataset_conf.batch_size=8", "++dataset_conf.filter_conf.token_max_length=77",
                     env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    chain = result.stderr.split("loader chain:\n", 1)[1]
    names = [line.split(". ", 1)[1].split("(", 1)[0] for line in chain.splitlines() if ". " in line[:6]]
    assert names[:2] == ["decode", "filter_length"] and names[-1] == "pad"
    assert names.index("filter_tokens") < names.index("fbank")
    assert "filter_tokens(token_max_length=77," in chain


def test_bench_loader_reports_the_forkserver_start_apart_from_the_epochs(small):
    """The forkserver's start (its preload of torch) is timed before the first epoch and printed on its own line,
    so the first epoch's rate is the loader's (issue 53: 1,064 vs 1,556 audio-s/s in epochs 1 and 2 before)."""
    data_list, tokens = small
    result = run_cli("corpus-io", "bench-loader", f"++data_list={data_list}", f"++tokenizer.token_list={tokens}",
                     "++dataset_conf.batch_size=8", "++dataset_conf.num_workers=1", env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    start = re.search(r"worker start: forkserver ready in ([0-9.]+) s \(not counted in the epochs below\)",
                      result.stdout)
    assert start and float(start.group(1)) > 0, result.stdout
    assert result.stdout.index("worker start:") < result.stdout.index("epoch 0 rank 0:")


@pytest.mark.parametrize("edit", [
    lambda w: w.update(cursor={"0": "x"}), lambda w: w.update(pending=[[1]]), lambda w: w.update(taken=[3]),
    lambda w: w.update(seconds="a while"),
])
def test_a_hand_broken_worker_position_is_one_paragraph_not_a_worker_traceback(small, tmp_path, edit):
    data_list, tokens = small
    state = tmp_path / "state.json"
    bench(data_list, tokens, "++save_state_after=1", f"++state_file={state}", "++dataset_conf.num_workers=1")
    saved = json.loads(state.read_text())
    for worker in saved["workers"].values():
        edit(worker)
    state.write_text(json.dumps(saved))
    result = run_cli("corpus-io", "bench-loader", *overrides(data_list, tokens, f"++state_file={state}",
                                                             "++dataset_conf.num_workers=1"))
    assert_user_error(result, "read position in the loader state is malformed", "Drop it")


def test_a_save_missing_a_ranks_state_is_a_config_error_naming_the_rank(small, tmp_path):
    state = tmp_path / "state.json"
    bench(*small, "++save_state_after=1", f"++state_file={state}")
    saved = json.loads(state.read_text())
    state.unlink()
    saved.update(world_size=2, rank=0)  # rank 0 of a 2-rank save whose rank 1 file is gone
    (tmp_path / "state.json.rank0").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=r"saved by 2 ranks, but the states of rank\(s\) 1 are missing"):
        bench(*small, f"++state_file={state}")
    assert (tmp_path / "state.json.rank0").is_file()  # kept


def test_bench_loader_reports_the_padded_tensors_padding_its_lengths_and_the_edges_it_pads_to(small, capsys):
    """The padding is the padded tensors' (every row to its bucket's edge), not each batch's longest utterance;
    the count of distinct padded lengths is reported; the printed chain shows the planned edges; utterances above
    the top edge are reported as batched apart, not as dropped."""
    from collections import Counter

    from corpus_io.loader.batching import batch_shape

    data_list, tokens = small
    edges = "++dataset_conf.bucket_edges=[1.5,3.0]"
    summary = bench(data_list, tokens, edges, "++dataset_conf.num_workers=0")
    row = summary["epochs"][0]
    out, err = capsys.readouterr()
    cfg = compose(BenchLoaderConfig, "bench_loader", [f"++data_list={data_list}", f"++tokenizer.token_list={tokens}",
                                                      "++dataset_conf.batch_size=8", edges,
                                                      "++dataset_conf.num_workers=0"])
    from corpus_io.loader.dataset import build_dataloader

    loader = build_dataloader(str(data_list), cfg.dataset_conf, None, train=True, rank=0, world_size=1)
    widths, real, padded, longest_padded = Counter(), 0, 0, 0
    for batch in loader:
        width, rows_real, rows_padded = batch_shape(batch)
        widths[width] += 1
        real += rows_real
        padded += rows_padded
        longest_padded += int(batch["feats_lengths"].max()) * len(batch["keys"])
    assert row["padding_ratio"] == pytest.approx(1 - real / padded) and padded > longest_padded
    assert row["padded_lengths"] == len(widths) and f"{len(widths)} padded lengths" in out
    assert "pad_to_edge=True" in err and "boundaries=None" not in err
    above = row["batched"].get("batch.above_top_edge", 0)
    assert above > 0 and not any(k.startswith("batch.") for k in row["dropped"])
    assert f"{above} above the top bucket edge" in out and "dropped: none" in out
