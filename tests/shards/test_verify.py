"""verify-shards catches a flipped byte, a truncated shard and a missing shard, each by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_io.config import VerifyShardsConfig
from corpus_io.errors import DataError
from corpus_io.shards.pack import pack_shards
from corpus_io.shards.verify import verify_shards
from corpus_io.shards.writer import ShardWriter
from tests.conftest import assert_user_error, run_cli
from tests.shards.conftest import packed_with_a_repeat
from tests.shards.test_pack import _cfg


@pytest.fixture
def packed(tmp_path, fixture_jsonl) -> Path:
    pack_shards(_cfg(fixture_jsonl, tmp_path / "out"))
    return tmp_path / "out"


def _verify(out: Path) -> str:
    with pytest.raises(DataError) as err:
        verify_shards(VerifyShardsConfig(input=str(out / "data.list"), num_workers=2))
    return str(err.value)


def test_clean_shards_pass(packed, capsys):
    results = verify_shards(VerifyShardsConfig(input=str(packed / "data.list"), num_workers=1))
    assert sum(r.num_utts for r in results) == 24 and not any(r.problems for r in results)
    assert "3 ok, 0 failed" in capsys.readouterr().out


def test_flipped_byte_is_caught_by_name(packed):
    victim = packed / "shard-000001.tar"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    message = _verify(packed)
    assert "shard-000001.tar" in message and ("sha256" in message or "member" in message)


def test_truncated_shard_is_caught_naming_shard_and_member(packed, capsys):
    victim = packed / "shard-000002.tar"
    victim.write_bytes(victim.read_bytes()[:60000])
    _verify(packed)
    report = capsys.readouterr().out
    assert "FAIL " + str(victim) in report and "truncated" in report and "member '" in report
    assert "size 60000 bytes" in report


def test_missing_shard_is_caught_by_name_and_exits_2(packed):
    (packed / "shard-000000.tar").unlink()
    r = run_cli("corpus-io", "verify-shards", f"++input={packed / 'data.list'}")
    assert_user_error(r, "shard-000000.tar")
    assert r.returncode == 2 and "FAIL" in r.stdout


def test_undecodable_audio_and_duplicate_keys_name_the_member(tmp_path):
    shard = tmp_path / "s.tar"
    with ShardWriter(shard) as w:
        for name, data in [("k1.txt", b"a"), ("k1.wav", b"RIFF garbage"), ("k2.txt", b"b"), ("k2.flac", b"x"),
                           ("k1.txt", b"c"), ("k1.npy", b"n")]:
            w.add(name, data)
    (tmp_path / "data.list").write_text(f"{shard}\n")
    with pytest.raises(DataError):
        verify_shards(VerifyShardsConfig(input=str(tmp_path / "data.list"), num_workers=1))
    r = run_cli("corpus-io", "verify-shards", f"++input={tmp_path / 'data.list'}")
    assert "member 'k1.wav'" in r.stdout and "member 'k2.flac'" in r.stdout and "duplicate key 'k1'" in r.stdout


def test_an_empty_shard_list_fails_verification(tmp_path):
    empty = tmp_path / "data.list"
    empty.write_text("")
    result = run_cli("corpus-io", "verify-shards", f"++input={empty}")
    assert_user_error(result, "0 utterances")
    assert result.returncode == 2


def test_a_key_repeated_across_shards_is_found_from_the_index_without_reading_audio(tmp_path):
    from corpus_io.shards.index import repeated_keys

    merged, a, again = packed_with_a_repeat(tmp_path)
    result = run_cli("corpus-io", "verify-shards", f"++input={merged}", "++decode_audio=false")
    assert_user_error(result, "1 of 4 shards failed", f"{again}/shard-000000.tar: key '", f"repeats a key of {a}")
    assert result.stdout.count("repeats a key of") == 4
    for tar in [*a.glob("*.tar"), *again.glob("*.tar")]:
        tar.unlink()  # the index alone names the repeats
    repeats = repeated_keys(merged)
    assert len(repeats) == 4
    assert all(shards == [str(a / "shard-000000.tar"), str(again / "shard-000000.tar")] for shards in repeats.values())


def test_an_index_without_keys_says_repeats_across_shards_are_not_checked(tmp_path):
    from tests.loader_data import make_shards

    data_list, _ = make_shards(tmp_path / "old", per_shard=12)  # an index as other tools write it: no keys
    result = run_cli("corpus-io", "verify-shards", f"++input={data_list}", "++decode_audio=false")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "records no utterance keys" in result.stderr and "from the shards' members instead" in result.stderr


def test_index_durations_that_differ_from_the_audio_fail_naming_the_utterance(packed, capsys):
    """Each utterance's ``durations`` value against its audio header (within 10 ms), not only their sum and
    extremes: two values swapped keep the total, minimum and maximum."""
    import json

    from corpus_io.shards.index import index_path_for

    index = index_path_for(packed / "data.list")
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    durations = lines[0]["durations"]
    i, j = min(range(len(durations)), key=durations.__getitem__), max(range(len(durations)), key=durations.__getitem__)
    durations[i], durations[j] = durations[j], durations[i]
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    message = _verify(packed)
    assert "the index's durations differ from the audio for 2 of 10 utterances" in message
    assert lines[0]["keys"][i] in message and "pack-shards" in message
    assert "2 ok, 1 failed" in capsys.readouterr().out


def test_an_index_entry_without_durations_beside_entries_with_them_fails_as_the_loader_refuses_it(packed, capsys):
    import json

    from corpus_io.shards.index import index_path_for

    index = index_path_for(packed / "data.list")
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    original = list(lines)
    del lines[1]["durations"]
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    message = _verify(packed)
    assert f"{lines[1]['file']}: the index entry has no 'durations' while other entries" in message, message
    assert "2 ok, 1 failed" in capsys.readouterr().out
    # an older index, without durations in any entry, is one the loader reads (its first shards give the edges)
    index.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "durations"}) + "\n"
                             for line in original))
    verify_shards(VerifyShardsConfig(input=str(packed / "data.list"), num_workers=2))
