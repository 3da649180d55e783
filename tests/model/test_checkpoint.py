"""Checkpoint files: atomic save, ranking by the cv metric, pruning, averaging, the average CLI."""

from __future__ import annotations

import pytest
import torch

from corpus_io.errors import ConfigError, DataError
from corpus_io.model import checkpoint as ckpt
from tests.conftest import assert_user_error, run_cli


def write_epochs(out, losses):
    for epoch, loss in enumerate(losses):
        state = {"model": {"w": torch.full((2,), float(epoch)), "n": torch.tensor(epoch)},
                 "config": "x: 1\n", "cv_metrics": {"loss": loss, "acc": 1 - loss}}
        ckpt.save_checkpoint(out / f"model.pt.ep{epoch}", state)
        ckpt.write_metrics(out, epoch, state["cv_metrics"])


def test_average_takes_the_n_best_epochs_by_cv_loss_or_acc(tmp_path):
    write_epochs(tmp_path, [0.9, 0.2, 0.5, 0.1])
    path = ckpt.average_checkpoints(tmp_path, 2, "loss")
    state = ckpt.load_checkpoint(path)
    assert path.name == "model.pt.avg2" and state["averaged_epochs"] == [3, 1]
    assert torch.allclose(state["model"]["w"], torch.full((2,), 2.0))
    assert ckpt.ranked_epochs(tmp_path, "acc") == [3, 1, 2, 0]
    assert not list(tmp_path.glob(".*tmp*"))  # no temp files left behind


def test_prune_keeps_the_best_epochs_and_drops_finished_mid_epoch_saves(tmp_path):
    write_epochs(tmp_path, [0.9, 0.2, 0.5])
    ckpt.save_checkpoint(tmp_path / "model.pt.ep2.10", {"model": {}})
    ckpt.prune(tmp_path, 1, "loss", current_epoch=2)
    assert sorted(p.name for p in tmp_path.glob("model.pt*")) == ["model.pt.ep1", "model.pt.ep2"]


def test_average_cli_and_its_user_errors(tmp_path):
    write_epochs(tmp_path, [0.3, 0.2])
    result = run_cli("corpus-io", "average", f"++output_dir={tmp_path}", "++num=2", "++metric=acc")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "model.pt.avg2").is_file() and "epochs [1, 0]" in result.stdout
    assert_user_error(run_cli("corpus-io", "average", f"++output_dir={tmp_path / 'nope'}"), "does not exist")
    (tmp_path / "broken").write_bytes(b"not a checkpoint")
    try:
        ckpt.load_checkpoint(tmp_path / "broken")
    except Exception as exc:  # DataError naming the file
        assert "broken" in str(exc) and type(exc).__name__ == "DataError"


def test_average_cli_num_below_one_is_a_config_error_naming_num(tmp_path):
    write_epochs(tmp_path, [0.3, 0.2])
    for num in ("0", "-2"):
        result = run_cli("corpus-io", "average", f"++output_dir={tmp_path}", f"++num={num}")
        assert_user_error(result, f"num={num}", "range [1,")
    assert not list(tmp_path.glob("model.pt.avg*"))
    with pytest.raises(ConfigError, match="avg_nbest_model=0"):
        ckpt.average_checkpoints(tmp_path, 0, key="avg_nbest_model")


@pytest.mark.parametrize("content, why", [
    (b"", "is empty"),
    (b'{"0": {"loss": 0.3, "acc": 0.', "not valid JSON"),  # truncated
    (b'{"0": {"loss": 0.3}}\xff\xfe', "not UTF-8"),
    (b'[0.3, 0.2]', "JSON list"),
    (b'{"best": {"loss": 0.3}}', "not an epoch number"),
    (b'{"0": 0.3}', "not an object of metrics"),
    (b'{"0": {"loss": "low"}}', "not a number"),
])
def test_unreadable_cv_metrics_file_is_a_data_error_naming_it(tmp_path, content, why):
    write_epochs(tmp_path, [0.3, 0.2])
    metrics_file = tmp_path / ckpt.METRICS_FILE
    metrics_file.write_bytes(content)
    with pytest.raises(DataError) as err:
        ckpt.read_metrics(tmp_path)
    assert str(metrics_file) in str(err.value) and why in str(err.value) and "Delete" in str(err.value)
    with pytest.raises(DataError):
        ckpt.ranked_epochs(tmp_path, "loss")


def test_average_cli_with_a_broken_cv_metrics_file_is_a_user_error_and_deleting_it_recovers(tmp_path):
    write_epochs(tmp_path, [0.3, 0.2])
    (tmp_path / ckpt.METRICS_FILE).write_text('{"0": {"loss": 0.3', encoding="utf-8")
    assert_user_error(run_cli("corpus-io", "average", f"++output_dir={tmp_path}", "++num=2"), ckpt.METRICS_FILE)
    (tmp_path / ckpt.METRICS_FILE).unlink()  # the remedy the message gives
    assert ckpt.ranked_epochs(tmp_path, "loss") == [1, 0]  # read from the checkpoints
    ckpt.write_metrics(tmp_path, 2, {"loss": 0.1, "acc": 0.9})  # rewritten with every epoch, not just the new one
    assert sorted(ckpt.read_metrics(tmp_path)) == [0, 1, 2]


def test_averaging_fewer_epochs_than_asked_keeps_the_name_and_warns_naming_them(tmp_path, capsys):
    write_epochs(tmp_path, [0.3, 0.2])
    ckpt.save_checkpoint(tmp_path / "model.pt.ep2", {"model": {"w": torch.zeros(2), "n": torch.tensor(2)}})  # no cv
    result = run_cli("corpus-io", "average", f"++output_dir={tmp_path}", "++num=10")
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "num=10" in warning[0] and "only 2 epochs (1, 0)" in warning[0], result.stderr
    state = ckpt.load_checkpoint(tmp_path / "model.pt.avg10")
    assert state["averaged_epochs"] == [1, 0] and state["requested_num"] == 10

    # the trainer's call: a warning on stderr by default, or to its own log through warn=
    capsys.readouterr()
    ckpt.average_checkpoints(tmp_path, 3, "loss")
    assert "averages only 2 epochs (1, 0)" in capsys.readouterr().err
    logged = []
    ckpt.average_checkpoints(tmp_path, 3, "loss", key="avg_nbest_model", warn=logged.append)
    assert len(logged) == 1 and "avg_nbest_model=3" in logged[0] and capsys.readouterr().err == ""
    ckpt.average_checkpoints(tmp_path, 2, "loss", warn=logged.append)  # enough epochs: no warning
    assert len(logged) == 1


class _CreatesFileWhenUnpickled:
    """A crafted object: unpickling it calls open(path, 'w'), i.e. runs code chosen by the file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_that_would_run_code_is_refused_and_the_code_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "model.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "extra": _CreatesFileWhenUnpickled(marker)}, evil)
    with pytest.raises(DataError, match=r"refused.*global io\.open.*weights_only") as err:
        ckpt.load_checkpoint(evil)
    assert not marker.exists(), "loading the checkpoint ran the code it names"
    assert str(evil) in str(err.value)
    # decode and average open checkpoints the same way: the CLI says it in one paragraph, no traceback
    result = run_cli("corpus-io", "decode", f"++data_list={tmp_path / 'data.list'}", f"++checkpoint={evil}",
                     f"++output_dir={tmp_path / 'dec'}")
    assert_user_error(result, "refused")
    assert not marker.exists()


def test_random_bytes_as_a_checkpoint_are_called_no_checkpoint_not_code_that_would_run(tmp_path):
    import random

    path = tmp_path / "model.pt"
    path.write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
    with pytest.raises(DataError) as err:
        ckpt.load_checkpoint(path)
    message = str(err.value)
    assert f"checkpoint {path} is not a PyTorch checkpoint" in message and "corrupt data" in message, message
    assert "run code" not in message and "refused" not in message


def test_a_checkpoint_with_nan_weights_is_refused_at_load_naming_the_file_and_tensor(trained, corpus, tmp_path):
    from corpus_io.config import DecodeConfig, compose
    from corpus_io.infer.decode import decode

    state = ckpt.load_checkpoint(trained["out"] / "model.pt")
    name = next(n for n, t in state["model"].items() if n.startswith("encoder") and t.is_floating_point())
    state["model"][name].view(-1)[0] = float("nan")
    bad = tmp_path / "model.pt"
    torch.save(state, bad)
    out = tmp_path / "dec"
    cfg = compose(DecodeConfig, "decode", [f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw",
                                           f"++checkpoint={bad}", f"++output_dir={out}"])
    with pytest.raises(DataError) as err:  # it decoded every utterance to an empty hypothesis, exit 0
        decode(cfg)
    assert f"checkpoint {bad} holds non-finite values (inf or nan) in the tensor '{name}'" in str(err.value)
    assert not out.exists()
    # average and the metric reads still open it: the average names the epochs, the metrics need no weights
    assert ckpt.load_checkpoint(bad, finite=False)["model"][name].isnan().any()


def test_trainer_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    from corpus_io.model.checkpoint import rng_state, set_rng_state

    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    ckpt.save_checkpoint(tmp_path / "model.pt", {"model": {}, "rng_states": [rng_state(torch.device("cpu"))]})
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(ckpt.load_checkpoint(tmp_path / "model.pt")["rng_states"][0], torch.device("cpu"))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_average_keeps_the_token_list_record_and_refuses_epochs_of_two_token_lists(tmp_path):
    write_epochs(tmp_path, [0.9, 0.2, 0.5])
    for epoch, sha in ((0, "b" * 64), (1, "a" * 64), (2, "a" * 64)):  # 1 and 2: resumed with another list
        state = ckpt.load_checkpoint(tmp_path / f"model.pt.ep{epoch}")
        state["token_list"] = {"file": "/data/tokens.txt", "size": 7, "sha256": sha}
        ckpt.save_checkpoint(tmp_path / f"model.pt.ep{epoch}", state)
    kept = ckpt.load_checkpoint(ckpt.average_checkpoints(tmp_path, 2, "loss"))["token_list"]  # epochs 1 and 2
    assert kept == {"file": "/data/tokens.txt", "size": 7, "sha256": "a" * 64}
    with pytest.raises(DataError, match=r"epochs 1 and 0 of .* were trained with different token lists.*"
                                        r"nothing was written.*a smaller \+\+num"):
        ckpt.average_checkpoints(tmp_path, 3, "loss", key="num")
    assert not (tmp_path / "model.pt.avg3").exists()


def test_model_pt_is_a_copy_of_its_own_so_cp_into_it_leaves_the_epoch_checkpoint_unchanged(tmp_path):
    import subprocess

    epoch, latest, other = tmp_path / "model.pt.ep3", tmp_path / "model.pt", tmp_path / "other.pt"
    ckpt.save_checkpoint(epoch, {"model": {"w": torch.ones(3)}})
    ckpt.copy_checkpoint(epoch, latest)  # what train writes after each checkpoint
    ckpt.save_checkpoint(other, {"model": {"w": torch.zeros(3)}})
    before = epoch.read_bytes()
    assert latest.read_bytes() == before and latest.stat().st_ino != epoch.stat().st_ino
    subprocess.run(["cp", str(other), str(latest)], check=True)  # cp writes into the existing model.pt
    assert epoch.read_bytes() == before and latest.read_bytes() == other.read_bytes()
    assert not list(tmp_path.glob(".*tmp*"))  # written under a temp name, then renamed


def test_a_checkpoint_save_killed_midway_leaves_no_file_behind(tmp_path):
    """save_checkpoint writes through storage.files.atomic_write: a process killed (SIGKILL) while torch.save is
    writing leaves neither the checkpoint nor a temp file (an unnamed inode), and the old model.pt stays whole."""
    import subprocess
    import sys

    from tests.conftest import REPO

    ckpt.save_checkpoint(tmp_path / "model.pt", {"model": {"w": torch.zeros(2)}})
    code = ("import os, signal, torch\n"
            "from corpus_io.model import checkpoint as ckpt\n"
            "class Kill:\n"
            "    def __reduce__(self):\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            f"ckpt.save_checkpoint({str(tmp_path / 'model.pt')!r}, {{'model': {{'w': torch.ones(1 << 16)}}, "
            f"'x': Kill()}})\n")
    proc = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]
    assert torch.equal(ckpt.load_checkpoint(tmp_path / "model.pt")["model"]["w"], torch.zeros(2))


def test_average_refuses_epochs_of_a_streaming_and_a_full_context_model_through_the_cli(tmp_path):
    write_epochs(tmp_path, [0.9, 0.2, 0.5])
    target = "_target_: corpus_io.model.model.ConformerCTC"
    for epoch, model in ((0, f"{target}\n  causal: true"), (1, f"{target}\n  causal: false"), (2, target)):
        state = ckpt.load_checkpoint(tmp_path / f"model.pt.ep{epoch}")
        state["config"] = f"model:\n  {model}\n"  # epoch 0 from a streaming run; 1 and 2 full context
        ckpt.save_checkpoint(tmp_path / f"model.pt.ep{epoch}", state)
    # causal unset and causal=false are one model (the constructor's default)
    assert ckpt.load_checkpoint(ckpt.average_checkpoints(tmp_path, 2, "loss"))["averaged_epochs"] == [1, 2]
    result = run_cli("corpus-io", "average", f"++output_dir={tmp_path}", "++num=3")
    assert_user_error(result, "epochs 1 and 0 of", "are checkpoints of different models",
                      "model.causal=False in epoch 1, True in epoch 0", "nothing was written", "a smaller ++num")
    assert not (tmp_path / "model.pt.avg3").exists()
