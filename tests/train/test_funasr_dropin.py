"""FunASR drop-in, verbatim: the ``++`` lines of FunASR's own fine-tuning scripts run ``corpus-io train``
unchanged: each is honoured where it maps to our keys, or accepted with one warning saying it has no effect.

The lines are held as FunASR writes them (shell variables as in the scripts, expanded by ``_expand`` the way
the shell would): examples/industrial_data_pretraining/paraformer/finetune.sh (train_ds.py), SenseVoice's
finetune.sh, and the train_ds.py lines its users pass for a local model (init_param, tokenizer_conf,
frontend_conf, ...).
"""

from __future__ import annotations

import re

import pytest

from corpus_io.config import FUNASR_KEYS, TrainConfig, compose
from corpus_io.errors import ConfigError
from tests.conftest import REPO, run_cli

#: the ``++`` lines of each script, verbatim (tests/fixtures/funasr/*.args; train_ds_local_model.args: train_ds.py with
#: a local model directory, as FunASR's docs and users write it)
FIXTURES = REPO / "tests" / "fixtures" / "funasr"

PARAFORMER_FINETUNE = (FIXTURES / "paraformer_finetune.args").read_text(encoding="utf-8")

SENSEVOICE_FINETUNE = (FIXTURES / "sensevoice_finetune.args").read_text(encoding="utf-8")

TRAIN_DS_LOCAL_MODEL = (FIXTURES / "train_ds_local_model.args").read_text(encoding="utf-8")

SCRIPTS = {"paraformer/finetune.sh": PARAFORMER_FINETUNE, "SenseVoice/finetune.sh": SENSEVOICE_FINETUNE,
           "train_ds.py local model": TRAIN_DS_LOCAL_MODEL}


def _expand(script: str, values: dict) -> list[str]:
    """The ``++`` arguments as the shell hands them over: variables expanded, quotes removed, redirection gone."""
    args = []
    for line in script.strip().splitlines():
        line = line.rstrip("\\ ").split(" &>")[0].strip()
        line = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], line)
        key, _, value = line.partition("=")
        args.append(f"{key}={value.strip(chr(34))}")
    return args


def _values(tmp_path, train_data) -> dict:
    return {"model_name_or_model_dir": "iic/SenseVoiceSmall", "model_dir": str(tmp_path / "model"),
            "train_data": str(train_data), "val_data": str(train_data), "deepspeed_config": "ds_stage1.json",
            "output_dir": str(tmp_path / "outputs"), "log_file": "log.txt"}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_funasr_script_lines_compose_unchanged_each_mapped_or_warned_once(name, tmp_path, capfd):
    args = _expand(SCRIPTS[name], _values(tmp_path, tmp_path / "train.jsonl"))
    cfg = compose(TrainConfig, "train", args)
    warnings = capfd.readouterr().err.splitlines()
    assert cfg.dataset_conf.batch_type == "token"
    # FunASR's lists are JSONL (IndexDSJsonl), our raw list: named by ++dataset=AudioDataset (paraformer) or, with no
    # dataset line (SenseVoice: the model's config names it), implied by the FunASR model
    assert cfg.dataset_conf.data_type == "raw"
    if "frontend_conf.cmvn_file" in SCRIPTS[name]:
        assert cfg.cmvn_file == str(tmp_path / "model" / "am.mvn")
    ours = {"train_data_set_list", "valid_data_set_list", "output_dir", "init_param"}
    for arg in args:
        key = arg.lstrip("+").split("=", 1)[0]
        if key in ours or key.startswith(("optim_conf.", "train_conf.max_epoch", "train_conf.log_interval",
                                          "train_conf.resume", "train_conf.validate_interval",
                                          "train_conf.save_checkpoint_interval", "train_conf.keep_nbest_models",
                                          "train_conf.avg_nbest_model", "train_conf.avg_keep_nbest_models_type",
                                          "train_conf.ignore_init_mismatch",
                                          "dataset_conf.batch_size", "dataset_conf.batch_type",
                                          "dataset_conf.num_workers")):
            continue  # our own keys, same names
        rule = FUNASR_KEYS.get(key)
        if rule is not None and rule.ours and not rule.note:  # honoured silently: the value is where ours is
            group = key.split(".", 1)[0]
            target = cfg
            for part in f"{group}.{rule.ours}".split("."):
                target = getattr(target, part)
            assert str(target) == arg.split("=", 1)[1], arg
            continue
        said = [w for w in warnings if f"'{key}'" in w or f"'{key}=" in w]
        assert len(said) == 1, f"{arg}: {said or warnings}"


def test_an_unknown_funasr_dataset_class_is_an_error_with_a_funasr_hint(tmp_path):
    with pytest.raises(ConfigError, match="FunASR key 'dataset=MyDataset'.*data_type=raw"):
        compose(TrainConfig, "train", [f"++output_dir={tmp_path}", "++train_data_set_list=x", "++dataset=MyDataset"])


def _train_verbatim(script: str, tmp_path, corpus) -> str:
    """``corpus-io train`` with the script's lines verbatim, then the few a user adds for a CPU smoke run (ours win:
    they come last; each only makes the run small: our token list, no workers, one epoch of two steps, smaller
    batches, no cv pass); returns stderr after checking the run finished with a model."""
    args = _expand(script, _values(tmp_path, corpus["raw"]))
    result = run_cli("corpus-io", "train", *args, f"++tokenizer.token_list={corpus['tokens']}",
                     "++dataset_conf.num_workers=0", "++train_conf.max_epoch=1", "++train_conf.max_steps_per_epoch=2",
                     "++dataset_conf.batch_size=1500", "++valid_data_set_list=null",
                     timeout=240, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert "epoch 0 done (max_steps_per_epoch): 2 steps" in result.stderr  # it trained, on the JSONL
    assert (tmp_path / "outputs" / "model.pt").is_file()
    return result.stderr


def test_paraformer_finetune_lines_run_corpus_io_train_unchanged(corpus, tmp_path):
    stderr = _train_verbatim(PARAFORMER_FINETUNE, tmp_path, corpus)
    assert "FunASR key 'dataset=AudioDataset' is read as dataset_conf.data_type=raw" in stderr


def test_sensevoice_finetune_lines_run_corpus_io_train_unchanged(corpus, tmp_path):
    """SenseVoice's lines name no dataset class: the FunASR JSONL they point at is still read as one."""
    stderr = _train_verbatim(SENSEVOICE_FINETUNE, tmp_path, corpus)
    assert "reads the data lists as FunASR's JSONL (dataset_conf.data_type=raw)" in stderr
    assert "FunASR key 'trust_remote_code' has no effect" in stderr
