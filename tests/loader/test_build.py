"""The loader chain as a value: named stages built from the config, folded, printable; config blocks
passed whole; tokens filtered before features."""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections import Counter
from pathlib import Path

import pytest

from corpus_io.config import DatasetConf
from corpus_io.loader.build import RUNTIME, Stage, describe_chain, loader_chain
from corpus_io.tokenizer import build_tokenizer
from tests.loader_data import fixture_utts, small_conf, token_list


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(token_list(tmp_path_factory.mktemp("tokens")))


def every_variant() -> list[tuple[DatasetConf, bool]]:
    """A conf for every branch of the chain, all optional stages on."""
    variants = []
    for feats_type in ("fbank", "mfcc", "raw", "precomputed"):
        for feats_on in ("loader", "model"):
            for bucketing in (False, True):
                conf = small_conf(feats_type=feats_type, feats_on=feats_on, bucketing=bucketing, speed_perturb=True,
                                  spec_aug=True, spec_sub=True, spec_trim=True, sort=True, shuffle=True)
                variants += [(conf, True), (conf, False)]
    return variants


def test_every_key_of_a_config_block_reaches_a_stage_and_every_stage_argument_is_supplied(tokenizer):
    """A new key in a block (filter_conf, fbank_conf, ...) that no stage takes fails here instead of being
    silently ignored; a stage argument that neither the config nor the fold supplies fails too."""
    taken: dict[type, set[str]] = {}
    for conf, train in every_variant():
        for stage in loader_chain(conf, tokenizer, train=train):
            params = inspect.signature(stage.fn).parameters
            if stage.block is not None:
                names = {f.name for f in dataclasses.fields(stage.block)}
                assert names & set(params), f"{stage.name} takes no key of {type(stage.block).__name__}"
                taken.setdefault(type(stage.block), set()).update(names & set(params))
            supplied = set(stage.config_kwargs()) | set(RUNTIME)
            required = {name for name, p in list(params.items())[1:] if p.default is inspect.Parameter.empty}
            assert required <= supplied, f"{stage.name}: {sorted(required - supplied)} never supplied"
    for block, names in taken.items():
        missing = {f.name for f in dataclasses.fields(block)} - names
        assert not missing, f"{block.__name__} keys no stage reads: {sorted(missing)}"
    assert {b.__name__ for b in taken} >= {"FilterConf", "ResampleConf", "SpeedPerturbConf", "FbankConf", "MfccConf",
                                           "SpecAugConf", "SpecSubConf", "SpecTrimConf", "ShuffleConf", "SortConf"}


def test_a_block_key_changed_in_the_config_reaches_the_stage():
    conf = small_conf()
    conf.filter_conf.token_max_length = 7
    conf.fbank_conf.num_mel_bins = 40
    chain = {s.name: s for s in loader_chain(conf, object(), train=True)}
    assert chain["filter_tokens"].config_kwargs()["token_max_length"] == 7
    assert chain["fbank"].config_kwargs()["num_mel_bins"] == 40


@pytest.mark.parametrize("feats_on", ["loader", "model"])
def test_tokens_are_counted_and_filtered_before_features(tokenizer, feats_on):
    names = [s.name for s in loader_chain(small_conf(feats_on=feats_on), tokenizer, train=True)]
    assert names.index("tokenize") < names.index("filter_tokens") < names.index("enter")
    if feats_on == "loader":
        assert names.index("count_frames") < names.index("filter_tokens") < names.index("fbank") < names.index(
            "spec_aug" if "spec_aug" in names else "enter")
    else:
        assert "fbank" not in names and names.index("waveform_frames") < names.index("tokenize")


def _read_samples() -> list[dict]:
    return [{"key": key, "audio": Path(path).read_bytes(), "audio_format": Path(path).suffix[1:], "txt": text,
             "meta": {}, "__url__": path} for key, path, text in fixture_utts()]


def _fold(chain: list[Stage], counts: Counter) -> list[dict]:
    samples = iter(_read_samples())
    runtime = {"counts": counts, "rng": random.Random(1), "generator": None, "state": None, "budget": None}
    for stage in chain:
        samples = stage(samples, runtime)
    return list(samples)


def test_filtering_tokens_before_features_keeps_and_drops_exactly_what_filtering_after_them_did(tokenizer):
    """count_frames gives the token filter Kaldi's exact frame count, so moving it ahead of fbank changes
    which work is done, never which utterances are kept."""
    conf = small_conf(feats_type="fbank")
    head = [s for s in loader_chain(conf, tokenizer, train=False) if s.name != "enter"]
    head = head[:[s.name for s in head].index("fbank") + 1]
    # a ratio bound that falls between the utterances: some are kept and some dropped by frames
    samples = _fold(head, Counter())
    per_frame = sorted(len(s["tokens"]) / s["feats"].shape[0] for s in samples)
    conf.filter_conf.max_output_input_ratio = (per_frame[len(per_frame) // 2] + per_frame[len(per_frame) // 2 + 1]) / 2
    before = [s for s in loader_chain(conf, tokenizer, train=False) if s.name != "enter"]
    before = before[:[s.name for s in before].index("fbank") + 1]
    after = [s for s in before if s.name not in ("tokenize", "filter_tokens")]
    after += [s for s in before if s.name in ("tokenize", "filter_tokens")]  # the old order: features first
    counts_before, counts_after = Counter(), Counter()
    kept_before, kept_after = _fold(before, counts_before), _fold(after, counts_after)
    assert [s["key"] for s in kept_before] == [s["key"] for s in kept_after]
    assert 0 < len(kept_before) < len(samples)
    assert counts_before == counts_after and counts_before["filter.ratio_too_high"] > 0
    assert all(s["feats"].equal(t["feats"]) and "frames" not in s for s, t in zip(kept_before, kept_after))


def test_the_chain_prints_one_named_stage_per_line_with_the_config_it_runs_with(tokenizer):
    conf = small_conf(spec_aug=True)
    text = describe_chain(loader_chain(conf, tokenizer, train=True))
    lines = text.splitlines()
    assert lines[0].strip().startswith("1. decode(on_error='fail')")
    assert any("filter_tokens(token_max_length=200, token_min_length=0" in line for line in lines)
    # sherpa-onnx's features by default, dithered in training by (seed, epoch, key), never in cv or decode
    assert any(f"fbank(num_mel_bins=80, frame_length=25.0, frame_shift=10.0, dither=1.0, low_freq=20.0, "
               f"high_freq=-400.0, snip_edges=False, seed={conf.seed})" in line for line in lines)
    assert lines[-1].strip().endswith("pad(frame_shift=0.01, frame_length_ms=25.0, frame_shift_ms=10.0, "
                                      "snip_edges=False)")
    assert "tokenizer" not in text and "rng" not in text
    assert "fbank(num_mel_bins=80, frame_length=25.0, frame_shift=10.0, dither=0.0, low_freq=20.0, " \
           "high_freq=-400.0, snip_edges=False)" in describe_chain(loader_chain(conf, tokenizer, train=False))


def test_a_shard_list_without_an_index_is_warned_once(tmp_path, capfd):
    from corpus_io.loader.read import Source
    from tests.loader_data import make_shards

    data_list, _ = make_shards(tmp_path / "s", per_shard=12, index=False)
    for _ in range(3):
        Source.open(str(data_list), "shard")
    err = capfd.readouterr().err
    assert err.count("has no index") == 1 and str(data_list) in err, err
    indexed, _ = make_shards(tmp_path / "t", per_shard=12)
    Source.open(str(indexed), "shard")
    assert "has no index" not in capfd.readouterr().err
