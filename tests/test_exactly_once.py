"""Exactly once across every list (issue 21 item 2): a hand-joined list that repeats a shard or a key never trains
an utterance twice silently, in shard and raw mode, with and without an index; verify-shards exits non-zero.

Without an index that records keys, local tars are scanned by their headers at loader start and raw lists by their
lines; remote shards are checked by each reader as it reads (tests/storage/test_remote.py has the remote case)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from corpus_io.errors import DataError
from corpus_io.loader.dataset import build_dataloader
from corpus_io.shards.index import index_entry_problems, repeated_shard, shard_identity
from tests.conftest import assert_user_error, run_cli
from tests.loader_data import fixture_utts, make_raw, make_shards, small_conf


def _keys(data_list, **conf) -> tuple[list[str], dict]:
    loader = build_dataloader(str(data_list), small_conf(num_workers=0, feats_type="raw", **conf), None, train=False,
                              rank=0, world_size=1)
    loader.set_epoch(0)
    return [k for batch in loader for k in batch["keys"]], loader.counts()


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """``a``: the 24 fixture utterances in 3 shards; ``b``: 8 of them again (same keys), in 1 shard. No index
    records keys (the index another tool writes: counts and durations only)."""
    root = tmp_path_factory.mktemp("corpora")
    a, keys = make_shards(root / "a", per_shard=8)
    b, _ = make_shards(root / "b", per_shard=8, utts=fixture_utts()[:8])
    return root, a, b, keys


def test_a_list_naming_a_shard_twice_is_refused_after_url_normalisation(two_corpora, tmp_path):
    _, a, _, _ = two_corpora
    first = a.read_text().splitlines()[0]
    for twin in (first, f"file://{first}", first.replace("/a/", "/a/./"), first.replace("/a/", "/a/../a/")):
        joined = tmp_path / "joined.list"
        joined.write_text(a.read_text() + twin + "\n")
        with pytest.raises(DataError, match=r"names the same shard twice: entry 1 .* and entry 4"):
            _keys(joined)
    assert shard_identity("S3://Bucket//x//shard.tar") == shard_identity("s3://bucket/x/shard.tar")
    assert shard_identity("https://h:443/a/s.tar") == shard_identity("https://H/a//s.tar")
    assert repeated_shard(["https://h/a.tar", "https://h/b.tar"]) is None


@pytest.mark.parametrize("index", [False, True])
def test_lists_joined_with_cat_fail_naming_both_shards_or_skip_and_count(two_corpora, tmp_path, index):
    root, a, b, keys = two_corpora
    joined = tmp_path / "data.list"
    joined.write_text(a.read_text() + b.read_text())
    if index:  # an index that records the keys (as pack-shards writes it): the repeat is found before reading
        entries = [json.loads(line) for line in (root / "a" / "index.jsonl").read_text().splitlines()]
        entries += [json.loads(line) for line in (root / "b" / "index.jsonl").read_text().splitlines()]
        per = [keys[0:8], keys[8:16], keys[16:24], keys[0:8]]
        (tmp_path / "index.jsonl").write_text("".join(json.dumps(dict(e, keys=k)) + "\n" for e, k in zip(entries, per)))
    with pytest.raises(DataError, match=f"key '{keys[0]}'") as err:
        _keys(joined)
    assert str(root / "a" / "shard-000000.tar") in str(err.value) and str(root / "b" / "shard-000000.tar") in str(
        err.value)
    got, counts = _keys(joined, on_error="skip")
    assert sorted(got) == sorted(keys) and counts["duplicate key"] == 8


def test_a_raw_list_with_a_repeated_key_fails_naming_both_entries_or_skips_and_counts(tmp_path):
    raw, keys = make_raw(tmp_path)
    lines = raw.read_text().splitlines()
    raw.write_text("\n".join([*lines, lines[2]]) + "\n")
    with pytest.raises(DataError, match=f"key '{keys[2]}' is in entries 3 and 25 \\({re.escape(str(raw))}:3 and "
                                        f"{re.escape(str(raw))}:25\\)"):
        _keys(raw, data_type="raw")
    got, counts = _keys(raw, data_type="raw", on_error="skip")
    assert sorted(got) == sorted(keys) and counts["duplicate key"] == 1


def test_a_raw_list_joined_with_cat_trains_each_key_once_over_workers_and_ranks(tmp_path):
    """The two copies of a key lie in different 1,000-line chunks, which different workers and ranks read: the
    list's repeated keys are found before reading, so every reader keeps the first entry only."""
    first, keys = make_raw(tmp_path / "a", copies=45)  # 1,080 lines
    joined = tmp_path / "joined.list"
    repeated = first.read_text().splitlines()[:30]
    joined.write_text(first.read_text() + "\n".join(repeated) + "\n")
    got, dropped = [], 0
    for rank in range(2):
        loader = build_dataloader(str(joined), small_conf(num_workers=2, feats_type="raw", data_type="raw",
                                                          on_error="skip"), None, train=False, rank=rank, world_size=2)
        loader.set_epoch(0)
        got += [k for batch in loader for k in batch["keys"]]
        dropped += loader.counts()["duplicate key"]
    assert sorted(got) == sorted(keys) and dropped == 30
    with pytest.raises(DataError, match=f"key '{keys[0]}' is in entries 1 and 1081"):
        _keys(joined, data_type="raw")


def test_training_on_a_joined_list_exits_2_naming_both_shards(two_corpora, tmp_path):
    root, a, b, _ = two_corpora
    joined = tmp_path / "joined.list"
    joined.write_text(a.read_text() + b.read_text())
    result = run_cli("corpus-io", "bench-loader", f"++data_list={joined}", "++dataset_conf.num_workers=0",
                     "++dataset_conf.feats_type=raw", "++train=false", timeout=120)
    assert_user_error(result, "(from the shards' member names)", str(root / "a" / "shard-000000.tar"),
                      str(root / "b" / "shard-000000.tar"), "on_error=skip")  # before any audio is read
    assert result.returncode == 2


def test_verify_shards_reports_a_repeated_shard_and_keys_without_an_index(two_corpora, tmp_path):
    root, a, b, keys = two_corpora
    joined = tmp_path / "joined.list"
    joined.write_text(a.read_text() + b.read_text() + a.read_text().splitlines()[1] + "\n")
    result = run_cli("corpus-io", "verify-shards", f"++input={joined}", "++decode_audio=false", "++num_workers=1")
    assert_user_error(result, "failed verification")
    assert result.returncode == 2
    assert f"entry 5 names the same shard as entry 2 ({root / 'a' / 'shard-000001.tar'})" in result.stdout
    assert f"key '{keys[0]}' repeats a key of {root / 'a' / 'shard-000000.tar'}" in result.stdout


CORRUPT = [  # (index field, value written, what the report says): one shard each
    ("duration", -3.0, "duration is -3.0, not a finite number of seconds >= 0"),
    ("duration", float("nan"), "duration is nan, not a finite number of seconds >= 0"),
    ("duration", 1e308, "more than 86400 s per utterance"),
    ("num_utts", 2_000_000, "the index says 2000000"),
    ("keys", None, "1 keys the shard does not hold (e.g. 'invented-key')"),
]


def test_verify_shards_compares_every_index_field_with_the_shard(tmp_path):
    data_list, keys = make_shards(tmp_path / "s", per_shard=5)  # 5 shards: 5, 5, 5, 5 and 4 utterances
    index = tmp_path / "s" / "index.jsonl"
    entries = [json.loads(line) for line in index.read_text().splitlines()]
    for i, (entry, (field, value, _)) in enumerate(zip(entries, CORRUPT)):
        entry["keys"] = keys[5 * i:5 * i + entry["num_utts"]]
        entry[field] = [*entry["keys"][:-1], "invented-key"] if field == "keys" else value
    index.write_text("".join(json.dumps(e) + "\n" for e in entries))
    result = run_cli("corpus-io", "verify-shards", f"++input={data_list}", "++decode_audio=false", "++num_workers=1")
    assert_user_error(result, "5 of 5 shards failed verification")
    for i, (_, _, why) in enumerate(CORRUPT):
        assert f"shard-{i:06d}.tar" in result.stdout and why in result.stdout, (why, result.stdout)
    assert re.search(r"duration is \d+\.\d{3} s in the shard, the index says -3.0", result.stdout)


def test_the_loader_refuses_an_index_with_impossible_values(tmp_path):
    data_list, _ = make_shards(tmp_path / "s", per_shard=24)
    index = tmp_path / "s" / "index.jsonl"
    entry = json.loads(index.read_text())
    index.write_text(json.dumps(dict(entry, duration=float("nan"))) + "\n")
    with pytest.raises(DataError, match=r"index.jsonl: the entry of shard .*shard-000000.tar: duration is nan"):
        _keys(data_list)
    assert index_entry_problems({"num_utts": 2, "duration": 3.0, "min_duration": 2.0, "max_duration": 1.0}) == [
        "min_duration 2.0 is above max_duration 1.0"]


def test_verify_shards_finds_a_shard_copied_under_two_names_by_its_keys(two_corpora, tmp_path):
    root, a, _, keys = two_corpora
    copy = tmp_path / "copy.tar"
    shutil.copy(root / "a" / "shard-000002.tar", copy)
    joined = tmp_path / "joined.list"
    joined.write_text(a.read_text() + f"{copy}\n")
    result = run_cli("corpus-io", "verify-shards", f"++input={joined}", "++decode_audio=false", "++num_workers=1")
    assert_user_error(result, "failed verification")
    assert f"repeats a key of {root / 'a' / 'shard-000002.tar'}" in result.stdout
