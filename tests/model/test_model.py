"""The model block built into a model (corpus_io/model/model.py): its keys typed by the constructor's annotations,
and what counts as a change of model."""

from __future__ import annotations

import pytest

from corpus_io.errors import ConfigError
from corpus_io.model.model import build_model, model_conf_changes

TINY = {"_target_": "corpus_io.model.model.ConformerCTC", "output_size": 16, "attention_heads": 2,
        "linear_units": 32, "num_blocks": 1, "subsampling_channels": 8}


@pytest.mark.parametrize("key, value, takes", [
    ("causal", "no", "a boolean: true or false"), ("causal", "maybe", "a boolean: true or false"),
    ("causal", 1, "a boolean: true or false"), ("num_blocks", 1.5, "an integer"), ("num_blocks", True, "an integer"),
    ("dropout_rate", "0.1", "a number"), ("pos_enc_layer_type", 3, "a string")])
def test_a_model_key_of_another_type_than_its_constructor_takes_is_one_paragraph_naming_it(key, value, takes):
    with pytest.raises(ConfigError) as info:
        build_model({**TINY, key: value}, 80, 10)
    message = str(info.value)
    assert f"model.{key}={value!r}" in message and takes in message and f"++model.{key}=" in message, message
    assert "\n" not in message


def test_booleans_ints_and_numbers_of_their_type_build_the_model_asked_for():
    assert build_model({**TINY, "causal": False}, 80, 10).causal is False
    assert build_model({**TINY, "causal": True, "dropout_rate": 0}, 80, 10).causal is True
    # keys passed up to ConformerCTC (**encoder) are checked against its annotations too
    with pytest.raises(ConfigError, match=r"model.causal='no' .*ConformerCTCAttention's causal takes a boolean"):
        build_model({**TINY, "_target_": "corpus_io.model.model.ConformerCTCAttention", "causal": "no",
                     "decoder_num_blocks": 1, "decoder_linear_units": 16}, 80, 10)


def test_a_key_set_to_its_default_is_no_change_of_model_and_another_value_is():
    assert model_conf_changes(TINY, {**TINY, "causal": False}) == []
    assert model_conf_changes(TINY, {**TINY, "causal": True}) == [("model.causal", False, True)]
    old_path = {**TINY, "_target_": "corpus_io.train.model.ConformerCTC"}  # a checkpoint from before the move
    assert model_conf_changes(old_path, TINY) == []


def test_nonfinite_rows_names_the_rows_with_a_nan_or_infinity_inside_their_frames_and_no_finite_one():
    """A diverged model's rows (checked in blocks of frames, so an hour's log-probs take no mask of their size): a
    NaN, +inf or -inf inside a row's frames names it, one past its length does not, and finite values however large
    (-3e38) are no divergence; a block boundary (1,000 frames of 5,000 values: 838 a block) loses nothing."""
    import torch

    from corpus_io.model.model import nonfinite_rows

    log_probs = torch.randn(4, 10, 7, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    assert nonfinite_rows(log_probs) == []
    log_probs[1, 3, 2] = float("nan")
    log_probs[2, 5, 1] = -float("inf")
    log_probs[3, 9, 0] = float("inf")
    assert nonfinite_rows(log_probs) == [1, 2, 3]
    assert nonfinite_rows(log_probs, torch.tensor([10, 10, 5, 9])) == [1]  # rows 2 and 3: past their frames
    assert nonfinite_rows(torch.full((2, 3, 5000), -3e38)) == []
    many = torch.zeros(1, 1000, 5000)
    many[0, 837, 4999] = float("nan")  # the last value of the first block
    assert nonfinite_rows(many) == [0]
    many[0, 837, 4999] = 0.0
    many[0, 999, 0] = float("inf")  # the last frame
    assert nonfinite_rows(many) == [0] and nonfinite_rows(many, torch.tensor([999])) == []
