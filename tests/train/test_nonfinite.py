"""Nothing non-finite is trained or saved as a result (issue 21 item 3): a NaN CMVN file is refused at load, a run
of non-finite steps (an exploding learning rate) stops training with a clear error, and no checkpoint or average
of a non-finite model is written."""

from __future__ import annotations

import json
import re

import pytest
import torch

from corpus_io.errors import ConfigError, DataError
from corpus_io.model import checkpoint as ckpt
from corpus_io.model.cmvn import load_cmvn
from tests.trained_models import run_train, torchrun_cmd

TINY = ("++dataset_conf.num_workers=0", "++model.num_blocks=1", "++train_conf.max_epoch=2",
        "++train_conf.log_interval=1")


def _train(out, corpus, *overrides):
    cmd = torchrun_cmd(out, corpus, *TINY, *overrides)
    return run_train(cmd[cmd.index("--no-python") + 1:])  # one process


def test_a_nan_cmvn_file_ends_train_before_any_step_with_no_checkpoint(corpus, tmp_path):
    cmvn = tmp_path / "cmvn.json"
    cmvn.write_text(json.dumps({"dim": 80, "frame_num": 10, "mean_stat": [0.0] * 80, "var_stat": [1.0] * 80,
                                "mean": [float("nan")] + [0.0] * 79, "istd": [1.0] * 80}))
    out = tmp_path / "exp"
    result = _train(out, corpus, f"++cmvn_file={cmvn}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"cmvn_file {cmvn} holds a non-finite mean (nan at dimension 0)" in result.stderr
    assert "Traceback" not in result.stderr and not list(out.glob("model.pt*"))
    (tmp_path / "inf.json").write_text(json.dumps({"mean": [0.0, 0.0], "istd": [1.0, float("inf")]}))
    with pytest.raises(ConfigError, match="non-finite istd"):
        load_cmvn(str(tmp_path / "inf.json"))


def test_an_exploding_learning_rate_stops_training_naming_the_causes_and_writes_no_checkpoint(corpus, tmp_path):
    out = tmp_path / "exp"
    result = _train(out, corpus, "++optim_conf.optim=sgd", "++optim_conf.lr=10", "++train_conf.grad_clip=0",
                    "++scheduler_conf.scheduler=constant", "++train_conf.max_nonfinite_steps=2")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "2 optimizer steps in a row had a non-finite loss or gradient norm" in result.stderr
    assert "train_conf.max_nonfinite_steps=2" in result.stderr and "optim_conf.lr=10.0" in result.stderr
    assert "no cmvn_file" in result.stderr and "verify-shards" in result.stderr
    skipped = re.search(r"the step was skipped \(1 in a row, 1 in all\); rank 0's batch: keys (\S+?),", result.stderr)
    assert skipped and skipped.group(1) in corpus["keys"], result.stderr[-3000:]  # the keys lead to the data
    assert not list(out.glob("model.pt*")), sorted(p.name for p in out.iterdir())


def test_a_skipped_non_finite_step_is_counted_in_the_epoch_summary(corpus, tmp_path):
    out = tmp_path / "exp"
    # lr 10 without clipping: the steps go non-finite; 1000 allowed in a row, so the epochs end on their own
    result = _train(out, corpus, "++optim_conf.optim=sgd", "++optim_conf.lr=10", "++train_conf.grad_clip=0",
                    "++scheduler_conf.scheduler=constant", "++train_conf.max_nonfinite_steps=1000",
                    "++train_conf.max_epoch=1")
    skipped = result.stderr.count("the step was skipped")
    summary = re.search(r"epoch 0 done .*; non-finite steps skipped: (\d+)", result.stderr)
    assert skipped >= 1 and summary and int(summary.group(1)) == skipped, result.stderr[-3000:]


def test_average_refuses_a_non_finite_epoch_checkpoint(tmp_path):
    for epoch, value in ((0, 1.0), (1, float("nan"))):
        ckpt.save_checkpoint(tmp_path / f"model.pt.ep{epoch}", {"model": {"w": torch.full((2,), value)},
                                                                "config": "x: 1\n"})
        ckpt.write_metrics(tmp_path, epoch, {"loss": 1.0 + epoch})
    with pytest.raises(DataError, match=r"the average of epochs \[0, 1\] .* non-finite values in 'w'"):
        ckpt.average_checkpoints(tmp_path, 2)
    assert not (tmp_path / "model.pt.avg2").exists()
    ckpt.write_metrics(tmp_path, 1, {"loss": float("nan")})  # a nan cv loss ranks nowhere
    assert ckpt.ranked_epochs(tmp_path, "loss") == [0]


def _diverged(checkpoint, out):
    """``checkpoint`` with every floating-point weight times 1e30: finite (load_checkpoint takes it), but its
    forward overflows to inf and NaN, as a run that blew up without a non-finite step would leave it."""
    state = ckpt.load_checkpoint(checkpoint)
    state["model"] = {k: v * 1e30 if v.is_floating_point() else v for k, v in state["model"].items()}
    assert ckpt.nonfinite_tensor(state["model"]) is None
    ckpt.save_checkpoint(out, state)
    return out


def test_a_diverged_model_is_never_exported_decoded_or_transcribed_in_silence(trained, streaming_trained, corpus,
                                                                               tmp_path, capfd):
    """Finite weights times 1e30: export-model, decode and transcribe (full context and chunk by chunk) each
    exit 2 with one paragraph naming the model, instead of empty text at rc 0; nothing is written."""
    from tests.infer.test_transcribe import WAV
    from tests.test_hostile import corpus_io as in_process

    bad = _diverged(trained["out"] / "model.pt.avg2", tmp_path / "diverged.pt")
    said = f"the model {bad} gives non-finite log-probabilities (NaN or infinity)"
    rc, err = in_process("export-model", f"++checkpoint={bad}", f"++output={tmp_path / 'm.onnx'}", capfd=capfd)
    assert rc == 2 and said in err and "Nothing was exported" in err and "Traceback" not in err, err
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "tokens.txt").exists()
    rc, err = in_process("decode", f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw",
                         f"++checkpoint={bad}", f"++output_dir={tmp_path / 'dec'}", "++dataset_conf.num_workers=0",
                         capfd=capfd)
    assert rc == 2 and said in err and f"on {corpus['raw']} (utterances " in err and "Traceback" not in err, err
    assert not (tmp_path / "dec" / "text").exists()
    rc, err = in_process("transcribe", f"++model={bad}", f"++input={WAV}", "++stream=false", capfd=capfd)
    assert rc == 2 and said in err and "the audio (full context)" in err and "Traceback" not in err, err
    bad = _diverged(streaming_trained["out"] / "model.pt.avg2", tmp_path / "diverged_streaming.pt")
    rc, err = in_process("transcribe", f"++model={bad}", f"++input={WAV}", "++stream=true", capfd=capfd)
    assert rc == 2 and f"the model {bad} gives non-finite" in err and "chunk 1 of the audio" in err, err


def test_the_export_check_fails_on_nan_or_a_difference_above_its_tolerance():
    from corpus_io.infer.export import CHECK_TOLERANCE, within_tolerance

    assert within_tolerance(2e-5, "m.onnx") == 2e-5
    for gap in (float("nan"), float("inf"), CHECK_TOLERANCE * 2):
        with pytest.raises(ConfigError, match="differs from the PyTorch model by up to .* NaN never passes"):
            within_tolerance(gap, "m.onnx")
