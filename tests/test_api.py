"""The Python API (corpus_io/api.py, re-exported lazily by the package): configs checked as the CLI checks
them, typed schemas, the loader train uses (equal steps per rank, exact resume, no dishonest len), and the
Python API page's example (docs/API.md). The DDP tests run real torchrun (gloo, CPU) on the fixture corpus."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
from pathlib import Path

import pytest

import corpus_io
from corpus_io import api
from corpus_io.config import data, dataset, training
from tests.conftest import BIN, FIXTURE, REPO, doc_section, free_port, run_bounded, run_cli


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), CORPUS_IO_NO_PROGRESS="1", OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """The fixture corpus through the API: jsonl, shards of 3 (even over 2 ranks) and of 5 (uneven), tokens,
    CMVN."""
    root = tmp_path_factory.mktemp("api")
    jsonl = root / "train.jsonl"
    corpus_io.scp2jsonl([FIXTURE / "wav.scp", FIXTURE / "text"], jsonl)
    out = {"root": root, "jsonl": jsonl, "tokens": root / "tokens.txt", "cmvn": root / "cmvn.json",
           "keys": sorted(r["key"] for r in corpus_io.read_manifest(jsonl))}
    out["shards"] = corpus_io.pack_shards(jsonl, root / "shards", num_utts_per_shard=3)
    out["uneven"] = corpus_io.pack_shards(jsonl, root / "uneven", num_utts_per_shard=5)
    corpus_io.make_tokenizer(jsonl, out["tokens"])
    corpus_io.compute_cmvn(out["shards"], out["cmvn"], dataset_conf={"num_workers": 0})
    return out


def test_import_corpus_io_and_its_config_api_stay_torch_free():
    code = ("import sys, corpus_io\nfrom corpus_io import load_config, DatasetConf, read_manifest\n"
            "load_config({'dataset_conf': {'batch_size': 4}}, missing_ok=['output_dir'])\n"
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH')")
    result = run_bounded([str(BIN / "python"), "-c", code], 60, env=env())
    assert result.stdout.strip() == "NOTORCH", result.stdout + result.stderr


def test_the_package_exports_exactly_the_documented_api():
    assert corpus_io.__all__ == api.__all__
    for name in corpus_io.__all__:
        assert getattr(corpus_io, name) is getattr(api, name)
        assert getattr(api, name).__doc__, f"{name} has no docstring"
    with pytest.raises(AttributeError, match="no attribute 'build_dataloader'"):
        corpus_io.build_dataloader  # noqa: B018
    readme = doc_section("Python API")
    undocumented = [n for n in api.__all__ if f"`{n}" not in readme and n not in ("ConfigError", "DataError")
                    and not n.endswith(("Conf", "Config"))]
    assert not undocumented, undocumented


# --------------------------------------------------------------------------- typed configs


def _schemas() -> list[type]:
    return [c for module in (data, dataset, training) for c in vars(module).values()
            if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == module.__name__]


@pytest.mark.parametrize("schema", _schemas(), ids=lambda c: c.__name__)
def test_every_schema_rejects_a_wrong_type_at_construction_naming_the_key(schema):
    hints = typing.get_type_hints(schema)
    checked = 0
    for f in dataclasses.fields(schema):
        if hints[f.name] is typing.Any:
            continue
        with pytest.raises(corpus_io.ConfigError, match=rf"config key '{f.name}' takes "):
            schema(**{f.name: object()})
        checked += 1
    assert checked


def test_a_plain_dict_block_becomes_its_schema_and_its_keys_are_checked():
    conf = corpus_io.DatasetConf(fbank_conf={"num_mel_bins": 40}, sources=[{"data_list": Path("a.list")}])
    assert conf.fbank_conf == dataset.FbankConf(num_mel_bins=40)
    assert conf.sources == [dataset.SourceConf(data_list="a.list")]
    with pytest.raises(corpus_io.ConfigError, match="'fbank_conf.num_mel_bin'. The closest valid key is "
                                                     "'fbank_conf.num_mel_bins'"):
        corpus_io.DatasetConf(fbank_conf={"num_mel_bin": 40})
    with pytest.raises(corpus_io.ConfigError, match=r"'fbank_conf.num_mel_bins' takes int, but got str '40'"):
        corpus_io.DatasetConf(fbank_conf={"num_mel_bins": "40"})
    with pytest.raises(corpus_io.ConfigError, match=r"'dataset_conf.speed_perturb_conf.speeds' takes a list of float"):
        corpus_io.TrainConfig(dataset_conf={"speed_perturb_conf": {"speeds": 0.9}})
    with pytest.raises(corpus_io.ConfigError, match="'shuffle' takes bool, but got int 1"):
        corpus_io.DatasetConf(shuffle=1)
    assert corpus_io.DatasetConf(epoch_hours=2).epoch_hours == 2  # an int is a float


# --------------------------------------------------------------------------- manifests and shards


def test_manifests_and_shards_round_trip_through_the_api(prepared, tmp_path):
    records = list(corpus_io.read_manifest(prepared["jsonl"]))
    wenet = [{"key": r["key"], "wav": r["source"], "txt": r["target"]} for r in records]
    assert corpus_io.write_manifest(tmp_path / "wenet.jsonl", wenet) == len(records)
    assert [(r["key"], r["source"], r["target"]) for r in corpus_io.read_manifest(tmp_path / "wenet.jsonl")] == \
        [(r["key"], r["source"], r["target"]) for r in records]
    with pytest.raises(corpus_io.DataError, match="record 2: a line needs 'key' and 'source'"):
        corpus_io.write_manifest(tmp_path / "bad.jsonl", [wenet[0], {"txt": "no key"}])
    assert not (tmp_path / "bad.jsonl").exists()  # nothing half-written
    assert corpus_io.jsonl2scp(prepared["jsonl"], [tmp_path / "wav.scp", tmp_path / "text"]) == len(records)
    first_line = (tmp_path / "text").read_text(encoding="utf-8").split("\n")[0]
    assert first_line == f"{records[0]['key']} {records[0]['target']}"
    raw = corpus_io.make_datalist([prepared["jsonl"]], tmp_path / "raw.list", data_type="raw")
    assert len(Path(raw).read_text(encoding="utf-8").splitlines()) == len(records)
    results = corpus_io.verify_shards(prepared["shards"], num_workers=1)
    assert len(results) == 8 and sum(1 for _ in corpus_io.read_shards(prepared["shards"])) == len(records)
    sample = next(corpus_io.read_shards(prepared["shards"]))
    assert {"key", "audio", "audio_format", "txt"} <= set(sample) and isinstance(sample["audio"], bytes)


# --------------------------------------------------------------------------- load_config


def test_a_dict_a_yaml_file_and_overrides_give_the_same_config(tmp_path):
    values = {"train_data_set_list": "x.list", "dataset_conf": {"batch_size": 7, "fbank_conf": {"num_mel_bins": 40}}}
    from_dict = corpus_io.load_config(values, missing_ok=["output_dir"])
    yaml_file = tmp_path / "mine.yaml"
    yaml_file.write_text("defaults:\n  - dataset_conf: shard\n  - tokenizer: char\n  - model: conformer_tiny\n"
                         "  - _self_\ntrain_data_set_list: x.list\noutput_dir: ''\ndataset_conf:\n  batch_size: 7\n"
                         "  fbank_conf:\n    num_mel_bins: 40\n")
    from_yaml = corpus_io.load_config(yaml_file)
    from_overrides = corpus_io.load_config(overrides=["++train_data_set_list=x.list", "++output_dir=",
                                                      "++dataset_conf.batch_size=7",
                                                      "++dataset_conf.fbank_conf.num_mel_bins=40"])
    assert from_dict == from_yaml == from_overrides
    assert from_dict.dataset_conf.batch_size == 7 and from_dict.model  # the shipped groups are composed


def test_load_config_errors_are_the_clis(tmp_path):
    with pytest.raises(corpus_io.ConfigError) as api_error:
        corpus_io.load_config({"dataset_conf": {"batch_sise": 4}}, command="bench-loader")
    cli = run_cli("corpus-io", "bench-loader", "++data_list=x", "++dataset_conf.batch_sise=4")
    assert str(api_error.value) in cli.stderr and "closest valid key is 'dataset_conf.batch_size'" in cli.stderr
    with pytest.raises(corpus_io.ConfigError, match=r"dataset_conf.prefetch=0 is outside its range \[1, 64\]"):
        corpus_io.build_loader({"dataset_conf": {"prefetch": 0}})
    with pytest.raises(corpus_io.ConfigError, match="'output_dir' is required"):
        corpus_io.load_config({})
    with pytest.raises(corpus_io.ConfigError, match="no corpus-io command 'trian'"):
        corpus_io.load_config(command="trian")
    with pytest.raises(corpus_io.ConfigError, match="uneven='even', but it must be one of stop, error, allow"):
        corpus_io.build_loader({"train_data_set_list": str(FIXTURE / "wav.scp")}, uneven="even")


# --------------------------------------------------------------------------- the loader


def _loader(prepared, **extra):
    return corpus_io.build_loader({"train_data_set_list": prepared["shards"],
                                   "tokenizer": {"token_list": str(prepared["tokens"])},
                                   "dataset_conf": {"batch_size": 2, "num_workers": 0, **extra}})


def test_the_loader_has_no_len_and_resumes_exactly_from_its_state(prepared):
    loader = _loader(prepared)
    assert not hasattr(loader, "__len__")
    with pytest.raises(TypeError):
        len(loader)
    loader.set_epoch(1)
    whole = [batch["keys"] for batch in loader]
    assert sorted(k for keys in whole for k in keys) == prepared["keys"]
    first = _loader(prepared)
    first.set_epoch(1)
    batches = iter(first)
    head = [next(batches)["keys"] for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = _loader(prepared)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    # docs/PARTITIONING.md "Partitioning and resume": the batches before the checkpoint are the uninterrupted run's,
    # and the two runs together read every key once; the order after it is the refilled buffers' own
    rest = [batch["keys"] for batch in resumed]
    assert head == whole[:3]
    assert sorted(k for keys in head + rest for k in keys) == prepared["keys"]


def test_build_loader_takes_a_dataset_conf_and_a_cv_loader_reads_everything_without_augmentation(prepared):
    conf = corpus_io.DatasetConf(batch_size=4, num_workers=0, spec_aug=True)
    cv = corpus_io.build_loader(conf, data_list=prepared["shards"], tokenizer=corpus_io.build_tokenizer(
        prepared["tokens"]), train=False)
    assert cv.uneven == "allow" and not cv.conf.spec_aug and not cv.conf.shuffle
    assert sorted(k for batch in cv for k in batch["keys"]) == sorted(
        s["key"] for s in corpus_io.read_shards(prepared["shards"])) == prepared["keys"]


def test_the_front_end_turns_waveform_batches_into_the_loaders_features(prepared):
    import torch

    conf = {"dataset_conf": {"feats_on": "model", "shuffle": False}}
    on_model = _loader(prepared, feats_on="model", shuffle=False)
    on_loader = _loader(prepared, shuffle=False)
    model_batch, loader_batch = next(iter(on_model)), next(iter(on_loader))
    assert "feats" not in model_batch and model_batch["keys"] == loader_batch["keys"]
    feats, lengths = corpus_io.build_front_end(conf)(model_batch)  # training: dithered alike
    assert torch.equal(lengths, loader_batch["feats_lengths"])
    torch.testing.assert_close(feats, loader_batch["feats"], atol=1e-3, rtol=1e-4)
    same, _ = corpus_io.build_front_end(corpus_io.DatasetConf())(loader_batch)  # feats_on=loader: passed through
    assert same is loader_batch["feats"] or torch.equal(same, loader_batch["feats"])


def test_build_loader_decides_what_a_kaldi_dir_is_with_one_listing_of_it(tmp_path, monkeypatch):
    """Input kind is decided once, at the first reader (tables.inputs.resolve_input), and passed down: building the
    loader on a Kaldi dir and reading an epoch lists that directory once (it was walked again by each check)."""
    from tests.loader_data import small_conf, token_list

    tokens = token_list(tmp_path)
    listings: list[str] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def counted(real):
        def listing(path="."):
            if os.path.realpath(path) == str(FIXTURE.resolve()):
                listings.append(real.__name__)
            return real(path)
        return listing

    monkeypatch.setattr(os, "scandir", counted(real_scandir))
    monkeypatch.setattr(os, "listdir", counted(real_listdir))
    conf = small_conf(data_type="raw", num_workers=0)
    loader = corpus_io.build_loader({"train_data_set_list": str(FIXTURE), "tokenizer": tokens, "dataset_conf": conf})
    keys = [k for batch in loader for k in batch["keys"]]
    assert len(keys) == len((FIXTURE / "text").read_text().splitlines())
    assert listings == ["scandir"]


def _torchrun(*args: str, timeout: float = 240) -> object:
    cmd = [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={free_port()}", *args]
    return run_bounded(cmd, timeout, env=env())


@pytest.mark.slow
def test_plain_ddp_loop_killed_mid_epoch_resumes_and_trains_every_key_once_with_equal_steps(prepared, tmp_path):
    args = [str(REPO / "tests" / "ddp_loop.py"), prepared["shards"], str(prepared["tokens"]), str(prepared["cmvn"]),
            str(tmp_path)]
    killed = _torchrun(*args, "--crash-at-step", "3")
    assert killed.returncode != 0 and "Signal 9 (SIGKILL)" in killed.stdout + killed.stderr, killed.stderr[-3000:]
    assert not list(tmp_path.glob("trained.*")), "the first run finished an epoch: the kill was not mid-epoch"
    resumed = _torchrun(*args, "--uneven-list", prepared["uneven"])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed epoch 0 at step 2" in resumed.stdout
    for epoch in range(2):
        ranks = [json.loads((tmp_path / f"trained.rank{r}.epoch{epoch}.json").read_text()) for r in range(2)]
        trained = ranks[0]["keys"] + ranks[1]["keys"]
        assert sorted(trained) == prepared["keys"], f"epoch {epoch}: not every key exactly once"
        steps = ranks[0]["steps_of_every_rank"]
        assert steps[0] == steps[1] > 0 and all("uneven_ranks.unused" not in r["counts"] for r in ranks)
    uneven = [json.loads((tmp_path / f"uneven.rank{r}.json").read_text()) for r in range(2)]
    allowed = [u["allow"]["batches"] for u in uneven]
    assert allowed[0] != allowed[1], "the uneven list did not give the ranks different batch counts"
    assert [u["stop"]["batches"] for u in uneven] == [min(allowed)] * 2  # the default: equal steps
    longer = uneven[allowed.index(max(allowed))]
    # the utterances of the batches the longer rank would have taken past the others' last step
    assert longer["stop"]["counts"]["uneven_ranks.unused"] == sum(longer["allow"]["sizes"][min(allowed):])
    for u in uneven:
        assert "uneven='allow'" in u["error"]["error"] and u["error"]["batches"] == min(allowed)


# --------------------------------------------------------------------------- the docs/API.md example


def readme_examples() -> dict[str, str]:
    section = doc_section("Python API")
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return {block.split(":", 1)[0].removeprefix("# ").strip(): block for block in blocks}


@pytest.mark.slow
def test_the_readme_api_example_runs_as_written_under_torchrun(tmp_path):
    examples = readme_examples()
    assert set(examples) == {"prepare.py", "train_ddp.py"}, list(examples)
    for name, code in examples.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    kaldi = tmp_path / "data" / "train"
    kaldi.mkdir(parents=True)
    (kaldi / "text").write_text((FIXTURE / "text").read_text(encoding="utf-8"), encoding="utf-8")
    (kaldi / "wav.scp").write_text("".join(f"{key} {REPO / path}\n" for key, path in (
        line.split(maxsplit=1) for line in (FIXTURE / "wav.scp").read_text().split("\n") if line)))
    prepare = run_bounded([str(BIN / "python"), "prepare.py"], 120, env=env(), cwd=tmp_path)
    assert prepare.returncode == 0, prepare.stderr[-3000:]
    cmd = [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={free_port()}", "train_ddp.py"]
    train = run_bounded(cmd, 240, env=env(), cwd=tmp_path)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert re.findall(r"epoch (\d): \d+ steps", train.stdout) == ["0", "1", "2"], train.stdout
    assert (tmp_path / "exp" / "checkpoint.pt").is_file()
