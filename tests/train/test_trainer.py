"""corpus-io train under real torchrun (2 gloo ranks, CPU): no hang on uneven shards, loss goes down,
checkpoints/TensorBoard/average, exact resume after kill -9 and after an elastic restart."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.conftest import BIN, REPO, hang_limit, run_bounded, run_cli
from tests.loader_data import make_shards
from tests.trained_models import run_train, torchrun_cmd


def epoch_losses(log: str) -> list[float]:
    return [float(m) for m in re.findall(r"epoch \d+ done .*?train loss ([0-9.]+)", log)]


def keys_by_epoch(out: Path, prefix: str) -> Counter:
    counts: Counter = Counter()
    for path in out.glob(f"{prefix}.rank*.txt"):
        for line in path.read_text(encoding="utf-8").splitlines():
            counts[tuple(line.split(" ", 1))] += 1
    return counts


def test_two_ranks_uneven_shards_end_every_epoch_together_and_loss_decreases(trained, corpus):
    out = trained["out"]
    log = (out / "train.log").read_text(encoding="utf-8")
    # 3 shards over 2 ranks: one rank runs out first, both leave the epoch, the leftover is reported
    assert log.count("training finished") == 1
    done = re.findall(r"epoch (\d+) done \(([^)]*)\).*left unused when the epoch ended: (.*?); loader", log)
    assert [d[0] for d in done] == ["0", "1", "2"], log
    assert any("ran out" in d[1] for d in done), log
    trained_keys, unused = keys_by_epoch(out, "trained_keys"), keys_by_epoch(out, "unused_keys")
    for epoch in ("0", "1", "2"):
        seen = [k for (e, k) in trained_keys if e == epoch] + [k for (e, k) in unused if e == epoch]
        assert sorted(seen) == sorted(corpus["keys"]), f"epoch {epoch}: trained + unused != the corpus"
    assert max(trained_keys.values()) == 1 and max(unused.values(), default=1) == 1
    reported = sum(int(n) for d in done for n in re.findall(r"(\d+) utts", d[2]))
    assert reported == sum(unused.values())
    # what an epoch left is carried into the next and trained there: never untrained two epochs in a row
    left = [{k for (e, k) in unused if e == epoch} for epoch in ("0", "1", "2")]
    assert any(left) and all(f"carried into epoch {int(d[0]) + 1}" in d[2] for d in done if left[int(d[0])])
    for epoch in (1, 2):
        assert left[epoch - 1] <= {k for (e, k) in trained_keys if e == str(epoch)}
        assert not left[epoch - 1] & left[epoch]
    losses = epoch_losses(log)
    assert losses[-1] < losses[0], losses
    # the shapes of each epoch (duration buckets by default: few padded lengths, little padding) and how far the
    # ranks' audio per step spreads
    shapes = re.findall(r"; (\d+) padded lengths, padding ([\d.]+)% of the batches' frames, audio per step across "
                        r"ranks within ([\d.]+)% of its mean", log)
    assert len(shapes) == 3 and all(0 < int(n) <= 31 and float(p) < 50 for n, p, _ in shapes), shapes
    # FunASR-style log line with timings, data wait, throughput and memory
    assert re.search(r"\[rank 1\] epoch: 0/3, step: 1 .*loss: .*lr: .*batch: .*padding: .*data_load: .*forward_time: "
                     r".*backward_time: .*optim_time: .*total_time: .*data_wait: .*%, audio_s/s: .*rss: \d+MB",
                     trained["result"].stderr)
    # checkpoints: latest, keep_nbest_models=2 epoch checkpoints, the average; cv metrics; tensorboard
    names = {p.name for p in out.iterdir()}
    assert {"model.pt", "model.pt.avg2", "cv_metrics.json", "config.yaml", "tensorboard"} <= names
    assert len([n for n in names if re.fullmatch(r"model\.pt\.ep\d+", n)]) == 2
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tensorboard").iterdir())
    latest = torch.load(out / "model.pt", map_location="cpu", weights_only=True)  # no pickled objects
    assert latest["epoch"] == 2 and latest["epoch_done"] and len(latest["loader_states"]) == 2
    assert [s["rank"] for s in latest["loader_states"]] == [0, 1]
    assert set(latest["cv_metrics"]) >= {"loss", "acc"} and "train_data_set_list" in latest["config"]


@pytest.mark.slow
def test_a_run_resumed_at_an_epoch_boundary_trains_what_the_last_epoch_carried_first(trained, tmp_path):
    import shutil

    out = tmp_path / "exp"
    shutil.copytree(trained["out"], out)
    carried = {k for (e, k) in keys_by_epoch(out, "unused_keys") if e == "2"}
    assert carried, "epoch 2 left nothing to carry into epoch 3"
    cmd = [a.replace(str(trained["out"]), str(out)) for a in trained["cmd"] if "train_conf.max_epoch" not in a]
    result = run_train([*cmd, "++train_conf.max_epoch=4"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    epoch3 = []
    for rank in range(2):  # one reader per rank (num_workers=0): its carried share comes first
        mine = [k for e, k in (line.split(" ", 1) for line in (out / f"trained_keys.rank{rank}.txt").read_text(
            encoding="utf-8").splitlines()) if e == "3"]
        at = [i for i, k in enumerate(mine) if k in carried]
        assert at == list(range(len(at))), (rank, at)
        epoch3 += mine
    assert carried <= set(epoch3) and len(epoch3) == len(set(epoch3))


def kill9_job(job: subprocess.Popen) -> None:
    """SIGKILL torchrun and every process under it (its workers run in their own sessions)."""
    import psutil

    procs = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=30)


@pytest.mark.slow
def test_elastic_restart_then_kill9_then_resume_trains_each_utterance_once(corpus, tmp_path):
    """With a streaming model (dynamic chunks drawn per batch): the chunk draw lives in the model, the data
    position in the loader, so exactly-once holds as for any model."""
    out = tmp_path / "exp"
    shards, keys = make_shards(tmp_path / "shards", copies=4, per_shard=32)  # 96 utts, 3 uneven shards
    corpus = dict(corpus, shards=shards, keys=keys)
    cmd = torchrun_cmd(out, corpus, "++train_conf.max_epoch=1", "++dataset_conf.batch_size=2",
                       "++dataset_conf.num_workers=1", "++train_conf.save_checkpoint_interval=2",
                       "++train_conf.dump_trained_keys=true", "++train_conf.debug_fail_at_step=3",
                       "++train_conf.avg_nbest_model=0", "++model.causal=true", "++model.use_dynamic_chunk=true",
                       "++model.use_dynamic_left_chunk=true", max_restarts=1)
    env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    stderr = open(tmp_path / "first_run.stderr", "w")
    job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        # rank 0 crashes at step 3 -> torchrun restarts both ranks -> they resume from model.pt.ep0.2;
        # once the restarted job has saved step 4, kill -9 the whole job (launcher and workers)
        deadline = time.time() + hang_limit(120)
        while not (out / "model.pt.ep0.4").exists():
            assert job.poll() is None, (tmp_path / "first_run.stderr").read_text()[-5000:]
            assert time.time() < deadline, "no checkpoint at step 4"
            time.sleep(0.05)
    finally:
        kill9_job(job)
        stderr.close()
    log = (out / "train.log").read_text(encoding="utf-8")
    assert "resumed from" in log and "step_in_epoch 2" in log, log  # the elastic restart
    assert (out / "model.pt.ep0.4").exists() and "resumed from" in log
    assert not (out / "model.pt.ep0").exists(), "the first run finished before the kill; the test needs more steps"

    result = run_train(cmd[:4] + ["--max-restarts=0"] + cmd[5:])
    assert result.returncode == 0, result.stderr[-5000:]
    log = (out / "train.log").read_text(encoding="utf-8")
    assert log.count("training finished") == 1
    trained_keys, unused = keys_by_epoch(out, "trained_keys"), keys_by_epoch(out, "unused_keys")
    assert max(trained_keys.values()) == 1, [k for k, n in trained_keys.items() if n > 1]
    assert sorted([k for _, k in trained_keys] + [k for _, k in unused]) == sorted(corpus["keys"])


def test_training_without_the_metric_to_average_by_still_succeeds_and_says_so(one_step_run):
    stderr, out = one_step_run["stderr"], one_step_run["out"]  # one process, no cv set: no acc is ever recorded
    assert one_step_run["returncode"] == 0, stderr[-3000:]
    assert "not averaging: no epoch recorded a 'acc'" in stderr and "++metric=loss" in stderr
    assert (out / "model.pt.ep0").is_file() and not list(out.glob("model.pt.avg*"))


def test_average_of_a_run_without_a_cv_set_says_it_ranked_by_training_loss(one_step_run, tmp_path):
    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]
    out = tmp_path / "exp"  # a copy: the fixture's output_dir is shared and must hold no average
    shutil.copytree(one_step_run["out"], out)
    result = run_cli("corpus-io", "average", f"++output_dir={out}", "++num=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "best by training loss" in result.stdout and "cv loss" not in result.stdout, result.stdout
    assert (out / "model.pt.avg1").is_file()


def test_funasr_finetune_sh_overrides_train_without_an_unknown_key(corpus, tmp_path):
    from tests.loader_data import make_raw
    from tests.test_config import FUNASR_FINETUNE_OVERRIDES

    jsonl, _ = make_raw(tmp_path / "data", wenet=False)  # a FunASR train.jsonl (key/source/target)
    out = tmp_path / "exp"
    cmd = [str(BIN / "corpus-io"), "train", f"++train_data_set_list={jsonl}",
           f"++valid_data_set_list={jsonl}", f"++output_dir={out}", f"++tokenizer.token_list={corpus['tokens']}",
           *FUNASR_FINETUNE_OVERRIDES,
           # then only what makes it a short CPU run on a FunASR jsonl
           "++dataset_conf.data_type=raw", "++dataset_conf.num_workers=0", "++train_conf.max_epoch=1",
           "++train_conf.max_steps_per_epoch=2", "++dataset_conf.filter_conf.token_min_length=0"]
    result = run_train(cmd, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "unknown config key" not in result.stderr
    assert "FunASR key 'dataset_conf.index_ds' has no effect" in result.stderr
    assert (out / "model.pt").is_file()


def test_intervals_are_range_checked_and_validate_interval_minus_one_follows_checkpoints(tmp_path):
    from corpus_io.config import TrainConf, resolve_intervals
    from corpus_io.errors import ConfigError

    tc = TrainConf(validate_interval=-1, save_checkpoint_interval=500)
    resolve_intervals(tc)
    assert tc.validate_interval == 500
    tc = TrainConf(validate_interval=-1, save_checkpoint_interval=0)
    resolve_intervals(tc)
    assert tc.validate_interval == 0  # no mid-epoch checkpoints: validate at epoch ends
    for bad, match in [(dict(log_interval=0), "log_interval=0.*at least 1"),
                       (dict(save_checkpoint_interval=-1), "save_checkpoint_interval=-1 is ambiguous"),
                       (dict(validate_interval=-3), "validate_interval=-3 must be")]:
        with pytest.raises(ConfigError, match=match):
            resolve_intervals(TrainConf(**bad))
    result = run_train([str(BIN / "corpus-io"), "train", "++train_data_set_list=x.list",
                        f"++output_dir={tmp_path}", "++train_conf.log_interval=0"], timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "train_conf.log_interval=0" in result.stderr


@pytest.mark.slow
def test_four_ranks_uneven_shards_split_differently_each_epoch_so_every_key_is_trained(tmp_path):
    from tests.loader_data import fixture_utts, token_list

    # 10 uneven shards (2..12 utterances) over 4 ranks, 4 epochs
    shards, keys = make_shards(tmp_path / "shards", utts=fixture_utts(3), sizes=[2, 3, 4, 5, 6, 7, 8, 9, 10, 12])
    corpus = {"shards": shards, "tokens": token_list(tmp_path).token_list}
    out = tmp_path / "exp"
    # WeNet's buffer sizes: a rank's whole share sits in one sort block, its longest utterances last
    result = run_train(torchrun_cmd(out, corpus, "++train_conf.max_epoch=4", "++train_conf.dump_trained_keys=true",
                                    "++model.num_blocks=1", "++dataset_conf.shuffle_conf.shuffle_size=1500",
                                    "++dataset_conf.sort_conf.sort_size=500", nproc=4), timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    log = (out / "train.log").read_text(encoding="utf-8")
    shares = [float(x) for x in re.findall(r"unused share ([0-9.]+)% of the epoch", log)]
    assert len(shares) == 4, log  # reported every epoch
    trained, unused = keys_by_epoch(out, "trained_keys"), keys_by_epoch(out, "unused_keys")
    for epoch in map(str, range(4)):
        seen = [k for (e, k) in trained if e == epoch] + [k for (e, k) in unused if e == epoch]
        assert sorted(seen) == sorted(keys), f"epoch {epoch}: trained + unused != the corpus"
    assert {k for (_, k) in trained} == set(keys)  # every key trained at least once over the 4 epochs
    # what each rank read (trained or left unused) changes from epoch to epoch: the split is not fixed
    read = {}
    for r in range(4):
        for name in ("trained_keys", "unused_keys"):
            path = out / f"{name}.rank{r}.txt"
            for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
                epoch, key = line.split(" ", 1)
                read.setdefault(epoch, [set() for _ in range(4)])[r].add(key)
    splits = {tuple(frozenset(s) for s in read[e]) for e in map(str, range(4))}
    assert len(splits) > 1, "every epoch gave every rank the same utterances"


def weighted_command(corpus: dict, out: Path, *extra: str) -> list[str]:
    """2 ranks (1 worker each) on 2 sources of other sizes and weights, no train_data_set_list: one epoch, a
    checkpoint per step, the trained keys recorded."""
    sources = (f"[{{data_list: {corpus['shards']}, weight: 1}}, "
               f"{{data_list: {corpus['raw']}, weight: 2, data_type: raw}}]")
    cmd = torchrun_cmd(out, corpus, f"++dataset_conf.sources={sources}", "++train_conf.max_epoch=1",
                       "++dataset_conf.batch_size=2", "++train_conf.save_checkpoint_interval=1",
                       "++train_conf.dump_trained_keys=true", "++train_conf.avg_nbest_model=0",
                       "++dataset_conf.num_workers=1", "++model.num_blocks=1", *extra)
    return [a for a in cmd if not a.startswith("++train_data_set_list=")]


@pytest.fixture(scope="module")
def weighted_run(corpus, tmp_path_factory) -> dict:
    """:func:`weighted_command`'s epoch run whole: what the kill -9 test compares its resumed run with."""
    out = tmp_path_factory.mktemp("weighted") / "whole"
    result = run_train(weighted_command(corpus, out))
    return {"out": out, "result": result}


def test_train_on_weighted_sources_without_train_data_set_list(weighted_run):
    result = weighted_run["result"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "epoch 0 done" in (weighted_run["out"] / "train.log").read_text(encoding="utf-8")


@pytest.mark.slow
def test_two_ranks_train_cv_and_decode_with_features_on_the_model_device_and_loss_decreases(streaming_trained, corpus,
                                                                                                tmp_path):
    """A streaming model (causal, dynamic chunks) on 2 ranks, bucketing and cv, features on the model device;
    decoded full context and chunk by chunk."""
    from tests.conftest import run_cli

    out = streaming_trained["out"]
    log = (out / "train.log").read_text(encoding="utf-8")
    losses = epoch_losses(log)
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    assert log.count("cv epoch") == 3 and "input_dim 80" in log
    assert "loader chain (train):" in log
    assert "waveform_frames(frame_length=25.0, frame_shift=10.0, snip_edges=False)" in log
    config = (out / "config.yaml").read_text(encoding="utf-8")
    assert "feats_on: model" in config and "use_dynamic_chunk: true" in config and "bucketing: true" in config
    for name, chunk in (("dec", []), ("dec_chunk4", ["++decoding_chunk_size=4", "++num_decoding_left_chunks=2"])):
        decoded = run_cli("corpus-io", "decode", f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw",
                          f"++checkpoint={out / 'model.pt.avg2'}", f"++output_dir={tmp_path / name}",
                          "++dataset_conf.num_workers=0", "++timestamps=true", *chunk)
        assert decoded.returncode == 0, decoded.stderr[-3000:]
        hyps = (tmp_path / name / "text").read_text(encoding="utf-8").splitlines()
        assert sorted(line.split(" ", 1)[0] for line in hyps) == sorted(corpus["raw_keys"])
        assert "%CER" in (tmp_path / name / "cer.txt").read_text(encoding="utf-8")
        assert (tmp_path / name / "ctm").exists()  # (words: the streaming smoke model, tests/recipes)


def test_a_run_that_trained_nothing_fails_on_every_rank_and_writes_no_model_even_with_on_error_skip(corpus, tmp_path):
    gone = tmp_path / "gone"
    data_list = tmp_path / "data.list"
    data_list.write_text("".join(f"{gone}/shard-00000{i}.tar\n" for i in range(3)))
    out = tmp_path / "exp"
    cmd = torchrun_cmd(out, dict(corpus, shards=data_list), "++dataset_conf.on_error=skip",
                       "++train_conf.max_epoch=2")
    result = run_train(cmd)
    assert result.returncode != 0, result.stderr[-3000:]
    assert "trained 0 utterances on 2 rank(s)" in result.stderr and "on_error=skip" in result.stderr
    assert "Traceback" not in result.stderr.split("trained 0 utterances")[0][-2000:]
    assert not list(out.glob("model.pt*")), sorted(p.name for p in out.iterdir())


@pytest.mark.slow
def test_world_size_changes_mid_epoch_2_1_2_and_every_key_is_trained_once(corpus, tmp_path):
    """Crash a 2-process run mid-epoch, resume it on 1 process, crash that mid-epoch, finish on 2 again."""
    out = tmp_path / "exp"
    common = ("++train_conf.max_epoch=1", "++dataset_conf.batch_size=2", "++train_conf.save_checkpoint_interval=2",
              "++train_conf.dump_trained_keys=true", "++train_conf.avg_nbest_model=0", "++model.num_blocks=1")
    for nproc, fail_at in ((2, 3), (1, 7), (2, 0)):
        result = run_train(torchrun_cmd(out, corpus, *common, f"++train_conf.debug_fail_at_step={fail_at}",
                                        nproc=nproc), timeout=300)
        assert (result.returncode != 0) == bool(fail_at), result.stderr[-5000:]
    log = (out / "train.log").read_text(encoding="utf-8")
    assert log.count("training finished") == 1
    # each resume re-split the rest of the epoch and said how
    assert re.search(r"loader state of 2 ranks x 1 workers re-split over 1 ranks x 1 workers: \d+ units not "
                     r"started, \d+ open units", log), log
    assert re.search(r"loader state of 1 ranks x 1 workers re-split over 2 ranks x 1 workers", log), log
    trained_keys, unused = keys_by_epoch(out, "trained_keys"), keys_by_epoch(out, "unused_keys")
    assert max(trained_keys.values()) == 1, [k for k, n in trained_keys.items() if n > 1]
    assert sorted([k for _, k in trained_keys] + [k for _, k in unused]) == sorted(corpus["keys"])


# --------------------------------------------------------------------------- one run per output_dir


@pytest.fixture(scope="module")
def one_process_run(corpus, tmp_path_factory) -> dict:
    """One process, no cv set, 2 epochs of 2 steps, the best epoch averaged: a finished run's output_dir."""
    out = tmp_path_factory.mktemp("one_process") / "exp"
    cmd = torchrun_cmd(out, corpus, "++train_conf.max_epoch=2", "++train_conf.max_steps_per_epoch=2",
                       "++train_conf.avg_nbest_model=1", "++model.num_blocks=1")
    cmd = cmd[cmd.index("--no-python") + 1:]
    result = run_train(cmd)
    assert result.returncode == 0, result.stderr[-5000:]
    return {"out": out, "cmd": cmd, "result": result}


def _files(out: Path) -> dict[str, bytes]:
    """Every file of ``out`` but train.lock (which names the last process that held it)."""
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "train.lock"}


def test_without_a_cv_set_the_end_of_training_lines_rank_by_train_loss_not_best_cv_loss(one_process_run):
    stderr = one_process_run["result"].stderr
    assert "averaged epochs [" in stderr and "(best train loss: no valid_data_set_list" in stderr, stderr[-3000:]
    assert "best cv" not in stderr and "best cv" not in (one_process_run["out"] / "train.log").read_text()


def test_model_pt_is_a_file_of_its_own_not_a_hard_link_to_the_last_epoch_checkpoint(one_process_run):
    out = one_process_run["out"]
    latest, last_epoch = (out / "model.pt").stat(), (out / "model.pt.ep1").stat()
    assert latest.st_ino != last_epoch.st_ino and latest.st_nlink == last_epoch.st_nlink == 1
    assert (out / "model.pt").read_bytes() == (out / "model.pt.ep1").read_bytes()


def test_a_fresh_run_into_a_dir_holding_another_runs_checkpoints_is_refused_or_replaced_on_request(
        one_process_run, tmp_path):
    from tests.conftest import assert_user_error

    out = tmp_path / "exp"
    shutil.copytree(one_process_run["out"], out)
    cmd = [a.replace(str(one_process_run["out"]), str(out)) for a in one_process_run["cmd"]]
    before = _files(out)
    refused = run_train([*cmd, "++train_conf.resume=false"])
    assert_user_error(refused, f"output_dir {out} holds another run's checkpoints", "train_conf.resume=false",
                      "++train_conf.overwrite_output_dir=true", "another ++output_dir")
    assert _files(out) == before  # config.yaml, checkpoints, metrics, logs: byte-identical

    (out / "model.pt").unlink()  # resume=true with nothing to resume: a fresh run too
    before = _files(out)
    refused = run_train(cmd)
    assert_user_error(refused, "holds another run's checkpoints", "there is no model.pt to resume")
    assert _files(out) == before

    replaced = run_train([*cmd, "++train_conf.resume=false", "++train_conf.overwrite_output_dir=true",
                          "++train_conf.max_epoch=1", "++train_conf.avg_nbest_model=0"])
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert "train_conf.overwrite_output_dir: deleted the previous run's" in replaced.stderr
    names = {p.name for p in out.iterdir()}
    assert {"model.pt", "model.pt.ep0"} <= names and not {"model.pt.ep1", "model.pt.avg1"} & names  # none of the old
    assert set(json.loads((out / "cv_metrics.json").read_text())) == {"0"}


def _dead_taker(lock: Path) -> str:
    """``lock`` taken by a process that is then killed -9 (it never releases it): the ``pid host`` it left."""
    code = ("import os, sys; from corpus_io.storage.files import try_lock; "
            "assert not isinstance(try_lock(sys.argv[1]), str); os.kill(os.getpid(), 9)")
    subprocess.run([str(BIN / "python"), "-c", code, str(lock)], cwd=REPO, check=False,
                   env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    line = lock.read_text()
    assert line.split()[0].isdigit(), line
    return line


def test_overwrite_output_dir_never_deletes_the_init_checkpoint_it_reads_and_a_refused_run_keeps_the_lock_holder(
        one_process_run, tmp_path):
    from tests.conftest import assert_user_error

    out = tmp_path / "exp"
    shutil.copytree(one_process_run["out"], out)
    cmd = [a.replace(str(one_process_run["out"]), str(out)) for a in one_process_run["cmd"]]
    holder = _dead_taker(out / "train.lock")
    before = _files(out)
    refused = run_train([*cmd, f"++init_param={out / 'model.pt.ep1'}", "++train_conf.resume=false",
                         "++train_conf.overwrite_output_dir=true"])
    assert_user_error(refused, f"train_conf.overwrite_output_dir would delete {out / 'model.pt.ep1'}",
                      f"++init_param={out / 'model.pt.ep1'}", "Copy it out of output_dir first", "Nothing was deleted")
    assert _files(out) == before  # the init checkpoint and every other file byte-identical
    assert (out / "train.lock").read_text() == holder  # the killed run's pid, not the refused run's


def _claim(out: Path, reads=(), **train_conf):
    """``claim_output_dir`` as rank 0 of a one-process run calls it, with the train_conf keys given."""
    from corpus_io.config import TrainConfig
    from corpus_io.train.distributed import DistContext
    from corpus_io.train.output_dir import claim_output_dir

    tc = TrainConfig().train_conf
    for key, value in train_conf.items():
        setattr(tc, key, value)
    return claim_output_dir(out, DistContext(), tc, list(reads))


def test_overwrite_output_dir_is_said_not_applied_when_model_pt_is_resumed(one_process_run, tmp_path):
    out = tmp_path / "exp"
    shutil.copytree(one_process_run["out"], out)
    before = _files(out)
    lock, notes = _claim(out, overwrite_output_dir=True)
    lock.release()
    assert any("train_conf.overwrite_output_dir is not applied" in n and "resume" in n for n in notes), notes
    assert _files(out) == before


def test_an_output_dir_whose_config_yaml_is_the_train_list_is_refused_and_the_list_kept(tmp_path):
    from corpus_io.config import TrainConfig
    from corpus_io.errors import ConfigError
    from corpus_io.train.output_dir import run_inputs

    out = tmp_path / "exp"
    out.mkdir()
    data_list = tmp_path / "train.list"
    data_list.write_text("shard-000000.tar\n")
    os.link(data_list, out / "config.yaml")  # the run would replace it with its config
    cfg = TrainConfig()
    cfg.train_data_set_list, cfg.output_dir = str(data_list), str(out)
    with pytest.raises(ConfigError, match=r"output_dir's config.yaml .* is the input \+\+train_data_set_list"):
        _claim(out, run_inputs(cfg, None))
    assert data_list.read_text() == "shard-000000.tar\n"


@pytest.mark.parametrize("name", ["train.lock", "train.log", "trained_keys.rank0.txt"])
def test_a_lock_log_or_key_record_that_is_a_symbolic_link_is_refused_and_its_target_kept(tmp_path, name):
    from corpus_io.errors import ConfigError

    out = tmp_path / "exp"
    out.mkdir()
    victim = tmp_path / "outside.txt"
    victim.write_text("a file outside output_dir\n")
    (out / name).symlink_to(victim)
    with pytest.raises(ConfigError) as info:
        _claim(out)
    assert all(part in str(info.value) for part in (str(out / name), "symbolic link", "Remove the link")), info.value
    assert victim.read_text() == "a file outside output_dir\n" and (out / name).is_symlink()


@pytest.mark.parametrize("override, named", [
    ("++model.num_blocks=2", "model.num_blocks=1 in the checkpoint, 2 now"),
    # same tensor shapes: it loaded, and the run went on as another model, averaged with the first one's epochs
    ("++model.causal=true", "model.causal=False in the checkpoint, True now")])
def test_resuming_with_changed_model_keys_names_them_in_one_paragraph_and_writes_nothing(one_process_run, tmp_path,
                                                                                         override, named):
    from tests.conftest import assert_user_error

    out = tmp_path / "exp"
    shutil.copytree(one_process_run["out"], out)
    cmd = [a.replace(str(one_process_run["out"]), str(out)) for a in one_process_run["cmd"]]
    before = _files(out)
    result = run_train([*[a for a in cmd if "model.num_blocks" not in a], override, "++train_conf.max_epoch=3"])
    assert_user_error(result, f"train_conf.resume: {out / 'model.pt'} holds a model that does not fit", named,
                      "start a new run in another ++output_dir")
    assert "load_state_dict" not in result.stderr
    assert {k: v for k, v in _files(out).items() if k != "train.log"} == \
        {k: v for k, v in before.items() if k != "train.log"}


def test_a_model_key_of_the_wrong_type_stops_train_before_its_output_dir_is_made(one_process_run, tmp_path):
    from tests.conftest import assert_user_error

    out = tmp_path / "exp"
    cmd = [a.replace(str(one_process_run["out"]), str(out)) for a in one_process_run["cmd"]]
    result = run_train([*cmd, "++model.causal=no"])  # a string: it built a causal model
    assert_user_error(result, "model.causal='no' (str): ConformerCTC's causal takes a boolean: true or false")
    assert result.returncode == 2 and not out.exists()


def _ranks(launcher: int) -> list:
    import psutil

    return [p for p in psutil.Process(launcher).children(recursive=True) if "train" in p.cmdline()]


@pytest.mark.slow
def test_a_second_run_into_a_held_output_dir_is_refused_and_ranks_stop_when_only_their_launcher_is_killed(
        corpus, tmp_path):
    import fcntl

    import psutil

    from tests.conftest import assert_user_error

    out = tmp_path / "exp"
    cmd = torchrun_cmd(out, corpus, "++train_conf.max_epoch=100", "++dataset_conf.batch_size=2",
                       "++train_conf.avg_nbest_model=0", "++model.num_blocks=1")
    env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    stderr = open(tmp_path / "first_run.stderr", "w")
    job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    ranks = []
    try:
        deadline = time.time() + hang_limit(120)
        while "step: 2 " not in ((out / "train.log").read_text() if (out / "train.log").exists() else ""):
            assert job.poll() is None, (tmp_path / "first_run.stderr").read_text()[-5000:]
            assert time.time() < deadline, "the first run trained no step"
            time.sleep(0.1)
        ranks = _ranks(job.pid)
        assert len(ranks) == 2, ranks
        rank0 = next(p for p in ranks if p.environ().get("RANK") == "0")
        one = cmd[cmd.index("--no-python") + 1:]
        second = run_train([*one, "++train_conf.max_epoch=1", "++train_conf.max_steps_per_epoch=1"])
        assert_user_error(second, f"output_dir {out} is in use by another training run: its rank 0, pid {rank0.pid}",
                          "Wait for that run to end")
        os.kill(job.pid, signal.SIGKILL)  # the launcher only: its ranks are in sessions of their own
        job.wait(timeout=hang_limit(30))
        _, alive = psutil.wait_procs(ranks, timeout=hang_limit(60))
        assert not alive, f"ranks {[p.pid for p in alive]} trained on after their launcher died"
    finally:
        for proc in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(job.pid, signal.SIGKILL)
        job.wait()
        stderr.close()
    err = (tmp_path / "first_run.stderr").read_text()
    assert f"its torchrun launcher (pid {job.pid}) is gone" in err, err[-3000:]
    assert "rerun the same torchrun command to resume" in err
    assert "training finished" not in (out / "train.log").read_text()
    with open(out / "train.lock", "r+") as f:  # the lock died with its holder
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.slow
def test_weighted_sources_killed_9_under_torchrun_and_resumed_train_each_key_as_often_as_uninterrupted(
        corpus, weighted_run, tmp_path):
    """2 ranks (1 worker each), 2 sources of other sizes and weights: kill -9 the whole job just after the checkpoint
    of a late step of epoch 0, resume, and compare with the epoch run whole (``weighted_run``). Rank 0 raises right
    after that checkpoint (debug_fail_at_step), so the kill never lands a step later. (The loader's every-boundary
    check of the same promise is tests/loader/test_mixing_resume.py.)"""
    def command(out: Path, *extra: str) -> list[str]:
        return weighted_command(corpus, out, *extra)

    def epoch0(out: Path) -> Counter:
        return Counter(k for (e, k), n in keys_by_epoch(out, "trained_keys").items() for _ in range(n) if e == "0")

    whole = weighted_run["result"]
    assert whole.returncode == 0, whole.stderr[-5000:]
    uninterrupted = epoch0(weighted_run["out"])
    steps = int(re.search(r"epoch 0 done \([^)]*\): (\d+) steps", (weighted_run["out"] / "train.log").read_text()
                          ).group(1))
    kill_after = steps - 2  # a late mid-epoch checkpoint, near where the mix ends
    assert kill_after >= 2, steps

    out = tmp_path / "exp"
    env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    stderr = open(tmp_path / "killed.stderr", "w")
    job = subprocess.Popen(command(out, f"++train_conf.debug_fail_at_step={kill_after}"), cwd=REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.time() + hang_limit(120)
        while not (out / f"model.pt.ep0.{kill_after}").exists():
            assert job.poll() is None, (tmp_path / "killed.stderr").read_text()[-5000:]
            assert time.time() < deadline, f"no checkpoint at step {kill_after}"
            time.sleep(0.02)
    finally:
        kill9_job(job)
        stderr.close()
    assert not (out / "model.pt.ep0").exists(), "the run finished its epoch before the kill"
    resumed = run_train(command(out))
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    assert f"step_in_epoch {kill_after}" in (out / "train.log").read_text()  # resumed where it was killed
    got = epoch0(out)
    more = {k: (n, uninterrupted[k]) for k, n in got.items() if n > uninterrupted[k]}
    assert not more, f"trained more often than in the uninterrupted epoch (resumed, uninterrupted): {more}"
    assert got == uninterrupted, (got - uninterrupted, uninterrupted - got)


def test_ranks_whose_cv_splits_differ_in_batches_validate_and_finish(corpus, tmp_path):
    """One cv shard of one utterance for 2 ranks: rank 0 validates a batch, rank 1 none. The first forward after
    training broadcasts the model's buffers (BatchNorm) under DDP, so rank 0 waited in that broadcast while rank 1
    waited in the cv all-reduce, until the gloo timeout (10 minutes, then a crash); validation runs the bare
    module."""
    cv, _ = make_shards(tmp_path / "cv", sizes=[1])
    out = tmp_path / "exp"
    cmd = torchrun_cmd(out, corpus, f"++valid_data_set_list={cv}", "++dataset_conf.batch_type=example",
                       "++dataset_conf.batch_size=1", "++dataset_conf.bucketing=false",
                       "++train_conf.max_epoch=2", "++train_conf.max_steps_per_epoch=2")
    result = run_train(cmd, timeout=hang_limit(120))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    log = (out / "train.log").read_text(encoding="utf-8")
    assert re.findall(r"cv epoch \d+ step \d+: .*?, (\d+) utts", log) == ["1", "1"], log[-3000:]


def _differences(a, b, where: str = "") -> list[str]:
    """Where two loaded checkpoints differ: tensors to the bit, containers item by item, other values by ==."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (_differences(a[k], b[k], f"{where}.{k}") if k in a and k in b else [f"{where}.{k}"])]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [where]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    if torch.is_tensor(a) and torch.is_tensor(b):
        return [] if a.dtype == b.dtype and torch.equal(a, b) else [where]
    return [] if a == b else [where]


def test_the_same_training_command_trains_the_same_checkpoint_whatever_the_threads_it_inherits(corpus, tmp_path):
    """Two 2-rank trainings of one command, one inheriting 1 intra-op thread (torchrun's OMP_NUM_THREADS) and one
    2: train sets its own count (train_conf.num_threads), so the checkpoints are identical to the bit: weights,
    optimizer, loader states and every RNG's state (numpy's was left unseeded, so two runs saved two states)."""
    checkpoints = []
    out = tmp_path / "exp"  # one output_dir, the first run's moved aside: the config records the path
    for threads in ("1", "2"):
        cmd = torchrun_cmd(out, corpus, "++train_conf.max_epoch=1", "++train_conf.max_steps_per_epoch=3",
                           "++train_conf.log_interval=1000", "++train_conf.avg_nbest_model=0")
        result = run_bounded(cmd, 150, env=dict(os.environ, CORPUS_IO_NO_PROGRESS="1", OMP_NUM_THREADS=threads))
        assert result.returncode == 0, result.stderr[-3000:]
        checkpoints.append(torch.load(out / "model.pt.ep0", map_location="cpu", weights_only=True))
        out.rename(tmp_path / f"exp_threads{threads}")
    assert checkpoints[0]["model"].keys() == checkpoints[1]["model"].keys()
    differ = _differences(*checkpoints)
    assert not differ, differ
