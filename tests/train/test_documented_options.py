"""Every documented training option trains: ``feats_on`` (loader, model) x every augmentation docs/LOADER.md
lists x every batch type runs ``train`` for two steps and ``decode`` on the result.

The cross product runs in this process through the library (the same ``train``/``decode`` functions the
CLI calls, on configs composed once from the shipped YAML, then set per case and range-checked as
``validate`` does); two CLI runs check that the commands themselves take the same options as overrides.
"""

from __future__ import annotations

import copy

import pytest

from corpus_io.config import DecodeConfig, TrainConfig, check_values, compose
from tests.conftest import run_cli
from tests.loader_data import make_raw, token_list

FEATS_ON = ("loader", "model")
#: docs/LOADER.md's augmentations (dataset_conf table: speed perturb, spec_aug, spec_sub, spec_trim, and the fbank
#: dither of train mode), each alone, and all of them at once
AUGMENTATIONS = {
    "none": {"dataset_conf.fbank_conf.dither": 0.0},  # training dithers by default
    "speed_perturb": {"dataset_conf.speed_perturb": True, "dataset_conf.speed_perturb_conf.speeds": [0.9, 1.0, 1.1]},
    "spec_aug": {"dataset_conf.spec_aug": True},
    "spec_sub": {"dataset_conf.spec_sub": True},
    "spec_trim": {"dataset_conf.spec_trim": True},
    "dither": {"dataset_conf.fbank_conf.dither": 1.0},
}
AUGMENTATIONS["all"] = {k: v for values in AUGMENTATIONS.values() for k, v in values.items()}
AUGMENTATIONS["all"].update({"dataset_conf.silence_pad": True, "dataset_conf.silence_pad_conf.prob": 1.0})
#: batch_size per batch type: a few utterances of the fixture corpus per batch
BATCH_TYPES = {"example": 4, "length": 1200, "token": 1300}


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread, as OMP_NUM_THREADS=1 gives the CLI runs: on a shared 2-core machine a second thread
    only spins (5x the CPU time of the cross product)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("options")
    raw, _ = make_raw(root / "raw")
    head = root / "head.list"
    head.write_text("".join(raw.read_text(encoding="utf-8").splitlines(keepends=True)[:6]), encoding="utf-8")
    small = {"root": root, "raw": raw, "head": head, "tokens": token_list(root).token_list}
    base = _train_overrides(small, root / "unused", "loader", "example", "none")
    small["train"] = compose(TrainConfig, "train", base)
    small["decode"] = compose(DecodeConfig, "decode", _decode_overrides(small, root / "unused.pt", root / "unused"))
    return small


def _case(small: dict, out, feats_on: str, batch_type: str, aug: str) -> dict:
    return {"train_data_set_list": str(small["raw"]), "output_dir": str(out), "tokenizer.token_list": small["tokens"],
            "dataset_conf.data_type": "raw", "dataset_conf.num_workers": 0, "dataset_conf.feats_on": feats_on,
            "dataset_conf.batch_type": batch_type, "dataset_conf.batch_size": BATCH_TYPES[batch_type],
            "dataset_conf.filter_conf.token_min_length": 0, "dataset_conf.shuffle_conf.shuffle_size": 8,
            "dataset_conf.sort_conf.sort_size": 4, "train_conf.max_epoch": 1, "train_conf.max_steps_per_epoch": 2,
            "train_conf.log_interval": 1, "train_conf.avg_nbest_model": 0, "train_conf.keep_nbest_models": 1,
            "scheduler_conf.warmup_steps": 2, **AUGMENTATIONS[aug]}


def _train_overrides(small: dict, out, feats_on: str, batch_type: str, aug: str) -> list[str]:
    """The case as the CLI's ``++key=value`` overrides."""
    def text(value) -> str:
        return "[" + ",".join(map(str, value)) + "]" if isinstance(value, list) else str(value).lower() \
            if isinstance(value, bool) else str(value)

    return [f"++{k}={text(v)}" for k, v in _case(small, out, feats_on, batch_type, aug).items()]


def _configured(base, values: dict):
    """A copy of the composed ``base`` with dotted ``values`` set, range-checked as ``validate`` does."""
    cfg = copy.deepcopy(base)
    for key, value in values.items():
        *parents, leaf = key.split(".")
        owner = cfg
        for part in parents:
            owner = getattr(owner, part)
        setattr(owner, leaf, value)
    check_values(cfg)
    return cfg


def _decode_overrides(small: dict, checkpoint, out) -> list[str]:
    return [f"++data_list={small['head']}", "++dataset_conf.data_type=raw", "++dataset_conf.num_workers=0",
            f"++checkpoint={checkpoint}", f"++output_dir={out}", "++dataset_conf.batch_size=3"]


@pytest.mark.parametrize("batch_type", list(BATCH_TYPES))
@pytest.mark.parametrize("aug", list(AUGMENTATIONS))
@pytest.mark.parametrize("feats_on", FEATS_ON)
def test_every_feats_on_augmentation_and_batch_type_trains_and_decodes(small, one_thread, tmp_path, feats_on, aug,
                                                                       batch_type, monkeypatch):
    from corpus_io.infer.decode import decode
    from corpus_io.train.trainer import train

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "exp"
    train(_configured(small["train"], _case(small, out, feats_on, batch_type, aug)))
    log = (out / "train.log").read_text(encoding="utf-8")
    assert "epoch 0 done (max_steps_per_epoch): 2 steps" in log, log[-2000:]
    report = decode(_configured(small["decode"], {"checkpoint": str(out / "model.pt"),
                                                  "output_dir": str(tmp_path / "dec")}))
    assert report["utts"] == 6
    assert len((tmp_path / "dec" / "text").read_text(encoding="utf-8").splitlines()) == 6


@pytest.mark.parametrize("feats_on", FEATS_ON)
def test_train_and_decode_commands_take_every_augmentation_at_once(small, tmp_path, feats_on):
    out = tmp_path / "exp"
    result = run_cli("corpus-io", "train", *_train_overrides(small, out, feats_on, "token", "all"), timeout=240,
                     env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    result = run_cli("corpus-io", "decode", *_decode_overrides(small, out / "model.pt", tmp_path / "dec"),
                     timeout=240, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert "decode: 6 utterances" in result.stdout
