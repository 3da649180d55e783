"""Lhotse Shar in and out (corpus_io.tables.shar, issue 32): a Shar that Lhotse 1.33 writes itself from the real
fixture recordings (24 whole cuts + 16 windows, 5 shards) is packed, listed and trained on directly, and exported
back; Lhotse's own ``CutSet.from_shar`` is the reference for every key's samples and text."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import lhotse  # noqa: F401 - a [dev] dependency: a broken install fails these tests, never skips them
import numpy as np
import pytest

from corpus_io.config import PackShardsConfig
from corpus_io.errors import ConfigError, DataError
from corpus_io.loader import stages
from corpus_io.loader.dataset import build_dataloader
from corpus_io.shards.datalist import make_shard_list
from corpus_io.shards.index import load_index, read_datalist
from corpus_io.shards.pack import pack_shards
from corpus_io.shards.reader import read_shard
from corpus_io.tables import shar
from corpus_io.tables.inputs import detect, iter_records
from tests.loader_data import make_shar, small_conf


def lhotse_view(shar_dir: Path) -> dict[str, tuple[np.ndarray, str]]:
    """key -> (mono float32 samples, text) as Lhotse reads the Shar."""
    from lhotse import CutSet

    return {c.id: (c.load_audio()[0].astype(np.float32), " ".join(s.text for s in c.supervisions))
            for c in CutSet.from_shar(in_dir=str(shar_dir))}


def decoded(samples) -> dict[str, tuple[np.ndarray, str]]:
    """key -> (samples, text) through the loader's own decode stage."""
    return {s["key"]: (s["wav"][0].numpy(), s["txt"]) for s in stages.decode(samples)}


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, (wave, text) in want.items():
        assert got[key][1] == text, key
        assert got[key][0].shape == wave.shape, key
        assert np.array_equal(got[key][0], wave), key


@pytest.fixture(scope="module")
def lhotse_shar(tmp_path_factory):
    root = tmp_path_factory.mktemp("shar")
    shar_dir, texts = make_shar(root / "flac")
    return {"root": root, "dir": shar_dir, "texts": texts, "want": lhotse_view(shar_dir)}


def _cuts(shar_dir: Path) -> list[str]:
    return [str(p) for p in sorted(shar_dir.glob("cuts.*.jsonl.gz"))]


def test_the_loaders_shard_reader_gives_lhotses_samples_and_text_for_every_cut(lhotse_shar):
    counts: Counter = Counter()
    samples = [s for url in _cuts(lhotse_shar["dir"]) for s in shar.read_shar_shard(url, counts=counts)]
    assert len(lhotse_shar["want"]) == 40 and not counts
    assert [s["__pos__"] for s in samples[:8]] == list(range(8))
    assert samples[0]["meta"]["corpus"] == "fixture" and samples[0]["meta"]["speaker"] == "spk0"
    assert_same(decoded(samples), lhotse_shar["want"])


def test_pack_shards_of_a_shar_dir_keeps_lhotses_samples_text_and_bytes(lhotse_shar, tmp_path):
    assert detect(str(lhotse_shar["dir"])) == "lhotse-shar"
    pack_shards(PackShardsConfig(input=str(lhotse_shar["dir"]), output_dir=str(tmp_path / "out"), num_workers=1,
                                 num_utts_per_shard=16))
    samples = [s for url in read_datalist(tmp_path / "out" / "data.list") for s in read_shard(url)]
    assert_same(decoded([dict(s) for s in samples]), lhotse_shar["want"])
    by_key = {s["key"]: s for s in samples}
    with tarfile.open(lhotse_shar["dir"] / "recording.000000.tar") as tar:  # audio_format=keep: bytes copied
        first = tar.getmembers()[0]
        assert by_key[first.name[:-len(".flac")]]["audio"] == tar.extractfile(first).read()
    assert by_key["spk0-utt000"]["meta"]["corpus"] == "fixture"


def test_make_datalist_indexes_a_shar_from_its_cuts_and_the_loader_reads_each_key_once_per_epoch(lhotse_shar):
    data_list = lhotse_shar["root"] / "data.list"
    assert make_shard_list([str(lhotse_shar["dir"])], str(data_list)) == 5
    index = load_index(data_list, keys=True)
    assert sum(e["num_utts"] for e in index.values()) == 40
    total = sum(len(w) / 1.0 for w, _ in lhotse_shar["want"].values())  # samples; durations below in seconds
    assert total > 0 and all(e["keys"] and e["duration"] > 0 for e in index.values())
    for epoch in (0, 1):
        seen: list[str] = []
        texts: dict[str, str] = {}
        for rank in (0, 1):
            loader = build_dataloader(str(data_list), small_conf(num_workers=2, feats_type="raw"), None, train=True,
                                      rank=rank, world_size=2)
            loader.set_epoch(epoch)
            for batch in loader:
                seen += batch["keys"]
                texts.update(zip(batch["keys"], batch["txt"]))
        assert sorted(seen) == sorted(lhotse_shar["texts"]), epoch
        assert texts == lhotse_shar["texts"]


def test_export_copies_the_audio_bytes_and_lhotse_reads_the_same_samples_and_text(lhotse_shar, tmp_path):
    out = tmp_path / "export"
    written = shar.write_shar(iter_records(str(lhotse_shar["dir"])), str(out), shard_size=16)
    assert sorted(written) == sorted(p.name for p in out.iterdir()) and len(written) == 6
    assert_same(lhotse_view(out), lhotse_shar["want"])
    source, copy = lhotse_shar["dir"] / "recording.000001.tar", out / "recording.000000.tar"
    with tarfile.open(source) as a, tarfile.open(copy) as b:
        original = {m.name: a.extractfile(m).read() for m in a.getmembers() if not m.name.endswith(".json")}
        exported = {m.name: b.extractfile(m).read() for m in b.getmembers()}
    assert original and all(exported[name] == data for name, data in original.items())
    again = tmp_path / "again"
    shar.write_shar(iter_records(str(lhotse_shar["dir"])), str(again), shard_size=16)
    assert all((out / p.name).read_bytes() == p.read_bytes() for p in again.iterdir())  # deterministic bytes


def test_original_format_members_are_sniffed_and_copied_as_they_are(tmp_path):
    shar_dir, texts = make_shar(tmp_path / "orig", windows=2, shard_size=13, fmt="original")
    with tarfile.open(shar_dir / "recording.000000.tar") as tar:
        names = tar.getnames()
    assert names[0].endswith(".original")  # Lhotse names the member by the literal format name
    samples = list(shar.read_shar_shard(str(shar_dir / "cuts.000000.jsonl.gz")))
    assert {s["audio_format"] for s in samples} == {"wav", "flac"}
    assert_same(decoded([dict(s) for s in samples]),
                {k: v for k, v in lhotse_view(shar_dir).items() if k in {s["key"] for s in samples}})
    shar.write_shar(iter_records(str(shar_dir)), str(tmp_path / "out"))
    assert sorted(lhotse_view(tmp_path / "out")) == sorted(texts)


def test_a_cut_that_is_a_window_of_its_stored_recording_is_read_as_that_window(lhotse_shar, tmp_path):
    copy = tmp_path / "window"
    shutil.copytree(lhotse_shar["dir"], copy)
    cuts_file = copy / "cuts.000000.jsonl.gz"
    lines = [json.loads(x) for x in gzip.decompress(cuts_file.read_bytes()).decode().splitlines()]
    lines[0]["start"], lines[0]["duration"] = 0.5, 1.0  # another writer's Shar: the tar holds the whole recording
    cuts_file.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    sample = next(shar.read_shar_shard(str(cuts_file)))
    assert (sample["start"], sample["end"]) == (0.5, 1.5)
    whole, _ = lhotse_shar["want"][lines[0]["id"]]
    rate = lines[0]["recording"]["sampling_rate"]
    got = decoded([sample])[lines[0]["id"]][0]
    assert np.array_equal(got, whole[int(0.5 * rate):int(1.5 * rate)])
    rec = next(iter_records(str(copy)))
    assert (rec["start"], rec["end"]) == (0.5, 1.5)


def test_a_cutset_merely_named_cuts_jsonl_gz_is_still_read_as_a_cutset(tmp_path):
    from lhotse import CutSet, Recording, SupervisionSegment

    from tests.loader_data import fixture_utts

    key, path, text = fixture_utts()[0]
    cut = Recording.from_file(path, recording_id=key).to_cut()
    cut.supervisions = [SupervisionSegment(id=key, recording_id=key, start=0, duration=cut.duration, text=text)]
    CutSet.from_cuts([cut]).to_file(tmp_path / "cuts.jsonl.gz")
    assert detect(str(tmp_path / "cuts.jsonl.gz")) == "lhotse-cuts"
    assert [r["source"] for r in iter_records(str(tmp_path / "cuts.jsonl.gz"))] == [str(Path(path).resolve())]


# --------------------------------------------------------------------------- malformed Shar


@pytest.fixture
def broken(lhotse_shar, tmp_path):
    copy = tmp_path / "broken"
    shutil.copytree(lhotse_shar["dir"], copy)
    return copy


def _rewrite_tar(path: Path, order) -> None:
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w") as tar:
        for m, data in order(members):
            tar.addfile(m, io.BytesIO(data))


def test_cuts_without_their_tar_name_both_files_everywhere(broken):
    (broken / "recording.000002.tar").unlink()
    for read in (lambda: list(iter_records(str(broken))), lambda: make_shard_list([str(broken)], str(broken / "l"))):
        with pytest.raises(DataError, match=r"cuts\.000002\.jsonl\.gz has no recording tar beside it "
                                            r"\(recording\.000002\.tar"):
            read()
    with pytest.raises(DataError, match="recording.000002.tar"):
        list(shar.read_shar_shard(str(broken / "cuts.000002.jsonl.gz")))


def test_members_out_of_the_cuts_order_name_the_cut_and_the_member(broken):
    tar = broken / "recording.000001.tar"
    _rewrite_tar(tar, lambda m: m[2:4] + m[0:2] + m[4:])  # the second pair first
    with tarfile.open(tar) as t:
        member = t.getnames()[0]
    first = json.loads(gzip.decompress((broken / "cuts.000001.jsonl.gz").read_bytes()).decode().splitlines()[0])["id"]
    message = rf"cuts\.000001\.jsonl\.gz:1: cut '{first}' is paired with tar member '{member}' .* out of the cuts'"
    with pytest.raises(DataError, match=message):
        list(iter_records(str(broken)))
    with pytest.raises(DataError, match=message):
        list(shar.read_shar_shard(str(broken / "cuts.000001.jsonl.gz")))


def test_a_truncated_tar_is_named_and_the_loader_skips_and_counts_it_when_configured(broken):
    tar = broken / "recording.000003.tar"
    tar.write_bytes(tar.read_bytes()[:tar.stat().st_size // 2])
    with pytest.raises(DataError, match=r"recording\.000003\.tar: truncated"):
        list(iter_records(str(broken)))
    with pytest.raises(DataError, match=r"recording\.000003\.tar"):
        list(shar.read_shar_shard(str(broken / "cuts.000003.jsonl.gz")))
    data_list = broken / "data.list"
    make_shard_list([str(broken)], str(data_list))  # the index needs the cuts only
    loader = build_dataloader(str(data_list), small_conf(num_workers=0, feats_type="raw", on_error="skip"), None,
                              train=False, rank=0, world_size=1)
    loader.set_epoch(0)
    keys = [k for batch in loader for k in batch["keys"]]
    counts = loader.counts()
    assert counts["unreadable shards"] == 1 and 0 < counts["utterances lost in unreadable shards"] <= 8
    assert len(keys) + counts["utterances lost in unreadable shards"] == 40


def test_a_remote_shar_as_a_pack_input_says_to_train_on_it_directly():
    with pytest.raises(ConfigError, match=r"read directly by the loader: list it with make-datalist "
                                          r"\+\+data_type=shard"):
        detect("s3://bucket/shar/cuts.000000.jsonl.gz")


def test_stats_of_a_shar_list_come_from_its_cuts_and_agree_with_the_index(lhotse_shar):
    from corpus_io.stats import collect

    data_list = lhotse_shar["root"] / "stats.list"
    make_shard_list([str(lhotse_shar["dir"])], str(data_list))
    stats = collect(str(data_list))
    want = sum(len(w) / rate for (w, _), rate in zip(lhotse_shar["want"].values(), _rates(lhotse_shar["dir"])))
    assert stats.num_utts == 40 and stats.index_totals[0] == 40
    assert abs(stats.seconds - want) < 0.01 and abs(stats.index_totals[1] - want) < 0.01


def _rates(shar_dir: Path) -> list[int]:
    from lhotse import CutSet

    return [c.sampling_rate for c in CutSet.from_shar(in_dir=str(shar_dir))]


# --------------------------------------------------------------------------- hostile cuts files and tars


def _gzip_of_blank_lines(gib: int = 1) -> bytes:
    """A gzip that inflates to ``gib`` GiB of newlines (a run of identical 1 MiB gzip members: ~1 MB on disk)."""
    return gzip.compress(b"\n" * (1 << 20), mtime=0) * (1024 * gib)


@pytest.mark.parametrize("shape", ["shar dir", "lhotse cuts file"])
def test_a_gzip_cuts_file_inflating_to_a_gib_of_blank_lines_is_refused_in_seconds_naming_the_file_and_bound(
        broken, tmp_path, shape):
    import time

    from tests.conftest import assert_user_error, load_scale, run_cli

    cuts = broken / "cuts.000000.jsonl.gz"
    cuts.write_bytes(_gzip_of_blank_lines() + cuts.read_bytes())  # the real cuts after the padding
    if shape == "lhotse cuts file":
        cuts = cuts.rename(tmp_path / "train_cuts.jsonl.gz")
    before = cuts.read_bytes()
    started = time.monotonic()
    result = run_cli("corpus-io", "pack-shards", f"++input={broken if shape == 'shar dir' else cuts}",
                     f"++output_dir={tmp_path / 'out'}", timeout=120)
    elapsed = time.monotonic() - started
    assert_user_error(result, f"{cuts}", "bytes of blank lines in a row", "the per-line bound of 4194304 bytes")
    assert elapsed < 10 * load_scale(), elapsed  # the bound; reading it all took 13 minutes
    assert cuts.read_bytes() == before and not (tmp_path / "out").exists()


def test_an_inflated_cuts_file_past_the_per_file_bound_is_refused_naming_it_and_the_bound(lhotse_shar, tmp_path):
    from corpus_io.storage.files import bounded_lines, copy_inflated

    cuts = _cuts(lhotse_shar["dir"])[0]
    inflated = len(gzip.decompress(Path(cuts).read_bytes()))
    with gzip.open(cuts, "rb") as f, pytest.raises(DataError) as err:
        list(bounded_lines(f, cuts, max_total=inflated - 1))
    assert str(err.value).startswith(f"{cuts}: inflates to more than {inflated - 1} bytes (the bound on what a "
                                     f"compressed text file may inflate to")
    with gzip.open(cuts, "rb") as f, pytest.raises(DataError, match=rf"inflates to more than {inflated - 1} bytes"):
        copy_inflated(f, io.BytesIO(), cuts, max_total=inflated - 1)
    with gzip.open(cuts, "rb") as f:  # at the bound: read whole
        assert sum(len(raw) for _, raw in bounded_lines(f, cuts, max_total=inflated)) == inflated


def test_a_shar_whose_cuts_file_is_one_huge_line_names_the_file_and_the_line_bound(broken, tmp_path):
    from tests.conftest import assert_user_error, run_cli

    cuts = broken / "cuts.000000.jsonl.gz"
    cuts.write_bytes(gzip.compress(b'{"id": "x", "pad": "' + b"a" * (5 << 20) + b'"}\n', mtime=0))
    result = run_cli("corpus-io", "pack-shards", f"++input={broken}", f"++output_dir={tmp_path / 'out'}")
    assert_user_error(result, f"{cuts}:1: the line is longer than 4194304 bytes")
    assert "neither a Kaldi data dir" not in result.stderr  # the old message: the Shar was not even recognised
    with pytest.raises(DataError, match=rf"{cuts}:1: the line is longer than 4194304 bytes"):
        list(shar.read_shar_shard(str(cuts)))


def test_a_shar_tar_with_a_symlink_member_names_the_member_and_that_it_is_a_link(broken, tmp_path):
    from tests.conftest import assert_user_error, run_cli

    tar = broken / "recording.000001.tar"

    def linked(members):
        info = tarfile.TarInfo(members[2][0].name)
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        return members[:2] + [(info, b"")] + members[3:]

    _rewrite_tar(tar, linked)
    member = linked([(m, b"") for m in tarfile.open(tar).getmembers()])[2][0].name
    before = tar.read_bytes()
    message = f"member '{member}' (after '"
    result = run_cli("corpus-io", "pack-shards", f"++input={broken}", f"++output_dir={tmp_path / 'out'}")
    assert_user_error(result, f"{tar}: {message}", "is a symbolic link to '/etc/passwd', not a regular file")
    with pytest.raises(DataError, match=r"is a symbolic link to '/etc/passwd', not a regular file"):
        list(shar.read_shar_shard(str(broken / "cuts.000001.jsonl.gz")))
    assert tar.read_bytes() == before
