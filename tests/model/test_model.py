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
