"""The inputs a new (or hostile) user tried that ended in tracebacks: each is now one paragraph naming the key,
the file and line, or the path, and what to do (issue 25)."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import assert_user_error, run_cli
from tests.loader_data import make_shards, token_list


@pytest.mark.parametrize("override, needle", [
    ("++dataset_conf.speed_perturb_conf.speeds=[]", "dataset_conf.speed_perturb_conf.speeds=[] holds 0 items"),
    ("++dataset_conf.speed_perturb_conf.speeds=[-1.0]", "dataset_conf.speed_perturb_conf.speeds[0]=-1.0 is outside"),
    ("++dataset_conf.fbank_conf.num_mel_bins=2", "dataset_conf.fbank_conf.num_mel_bins=2 is outside its range [4,"),
])
def test_train_options_that_crashed_are_one_line_errors_naming_the_key(tmp_path, override, needle):
    result = run_cli("corpus-io", "train", "++train_data_set_list=x.list", f"++output_dir={tmp_path}",
                     "++dataset_conf.speed_perturb=true", override)
    assert_user_error(result, needle)


def test_an_index_with_a_count_that_is_not_a_number_names_its_shard_and_field(tmp_path):
    data_list, _ = make_shards(tmp_path / "shards", per_shard=12)
    index = data_list.with_name("index.jsonl")
    lines = index.read_text().splitlines()
    entry = json.loads(lines[1])
    entry["num_utts"] = "five"
    index.write_text("\n".join([lines[0], json.dumps(entry)]) + "\n")
    tokens = token_list(tmp_path).token_list
    result = run_cli("corpus-io", "bench-loader", f"++data_list={data_list}", f"++tokenizer.token_list={tokens}",
                     "++dataset_conf.num_workers=0")
    assert_user_error(result, f"{index}: the entry of shard", "num_utts is 'five', not a whole number", "rebuild it")


@pytest.mark.parametrize("command, key", [("train", "output_dir"), ("pack-shards", "output_dir")])
def test_a_self_looping_symlink_as_output_dir_is_named_as_such(tmp_path, fixture_corpus, command, key):
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    args = {"train": ["++train_data_set_list=x.list"], "pack-shards": [f"++input={fixture_corpus}"]}[command]
    result = run_cli("corpus-io", command, *args, f"++{key}={loop}")
    assert_user_error(result, str(loop), "symbolic link")
