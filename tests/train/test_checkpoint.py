"""Checkpoint files: atomic save, ranking by the cv metric, pruning, averaging, the average CLI."""

from __future__ import annotations

import torch

from corpus_io.train import checkpoint as ckpt
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
