"""pack-shards, add-field and verify-shards as N jobs + merge-jobs: the bytes of one job, refusals that change
nothing, kill -9."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from corpus_io.config import MergeJobsConfig, PackShardsConfig
from corpus_io.errors import DataError
from corpus_io.jobs.parts import Job, merge_jobs
from corpus_io.shards.pack import pack_shards
from tests.conftest import BIN, REPO, hang_limit
from tests.shards.conftest import fixture_records, write_jsonl


def tree(d: Path) -> dict[str, bytes]:
    """The files a user sees (not the hidden sidecars, not part records), data.list with its dir neutral."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and not p.name.startswith(".") and ".part-" not in p.name:
            data = p.read_bytes()
            out[str(p.relative_to(d))] = data.replace(str(d).encode(), b"<D>") if p.name == "data.list" else data
    return out


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def pack(jsonl: Path, out: Path, n: int = 1, j: int = 1, **kw) -> None:
    pack_shards(PackShardsConfig(input=str(jsonl), output_dir=str(out), num_workers=1, num_utts_per_shard=4,
                                 num_jobs=n, job_index=j, **kw))


def pack_jobs(jsonl: Path, out: Path, n: int, **kw) -> None:
    for j in range(1, n + 1):
        pack(jsonl, out, n, j, **kw)
        assert not (out / "data.list").exists(), "a job of N > 1 wrote a data.list"


def merge(path: Path, **kw) -> None:
    merge_jobs(MergeJobsConfig(path=str(path), **kw))


@pytest.mark.parametrize("options", [{}, {"shuffle": True, "filter_group": ["0:250", "250:100000"]}],
                         ids=["plain", "shuffle+filter_group"])
def test_n_jobs_merge_to_the_bytes_of_one_job(tmp_path, fixture_jsonl, options):
    pack(fixture_jsonl, tmp_path / "one", **options)
    reference = tree(tmp_path / "one")
    assert sum(name.endswith(".tar") for name in reference) >= 6
    for n in (2, 3, 7):  # 7: some jobs get no shard
        out = tmp_path / f"n{n}"
        pack_jobs(fixture_jsonl, out, n, **options)
        merge(out)
        assert tree(out) == reference, n
        merged = snapshot(out)
        merge(out)  # idempotent
        assert {k: v for k, v in snapshot(out).items() if "repeats" not in k} == \
            {k: v for k, v in merged.items() if "repeats" not in k}


def test_shard_k_has_the_same_bytes_whatever_n_also_resampled(tmp_path, fixture_jsonl):
    pack(fixture_jsonl, tmp_path / "one", resample=8000, audio_format="wav")
    pack_jobs(fixture_jsonl, tmp_path / "three", 3, resample=8000, audio_format="wav")
    merge(tmp_path / "three")
    assert tree(tmp_path / "three") == tree(tmp_path / "one")


def test_a_kaldi_dir_with_skipped_utterances_splits_like_one_job(tmp_path, fixture_corpus):
    kaldi = tmp_path / "kaldi"
    kaldi.mkdir()
    lines = (fixture_corpus / "wav.scp").read_text().splitlines()
    (kaldi / "wav.scp").write_text("".join(f"{k} {REPO / v}\n" for k, v in (x.split(" ", 1) for x in lines)))
    text = (fixture_corpus / "text").read_text().splitlines()
    (kaldi / "text").write_text("\n".join(t for i, t in enumerate(text) if i % 5) + "\n")  # 5 transcripts missing
    pack(kaldi, tmp_path / "one", on_error="skip")
    pack_jobs(kaldi, tmp_path / "two", 2, on_error="skip")
    merge(tmp_path / "two")
    assert tree(tmp_path / "two") == tree(tmp_path / "one")


def test_a_rerun_job_keeps_its_complete_part_and_refuses_other_options(tmp_path, fixture_jsonl):
    out = tmp_path / "out"
    pack(fixture_jsonl, out, 2, 1)
    before = snapshot(out)
    pack(fixture_jsonl, out, 2, 1)
    assert snapshot(out) == before  # nothing rewritten
    with pytest.raises(DataError, match="other options"):
        pack(fixture_jsonl, out, 2, 2, shuffle=True)
    with pytest.raises(DataError, match="2-job run"):
        pack(fixture_jsonl, out, 3, 2)
    assert snapshot(out) == before


def test_two_runs_with_different_shard_prefix_into_one_dir_are_refused(tmp_path, fixture_jsonl):
    out = tmp_path / "out"
    pack(fixture_jsonl, out, shard_prefix="a")
    before = snapshot(out)
    with pytest.raises(DataError, match="holds shards of another run"):
        pack(fixture_jsonl, out, shard_prefix="b")
    with pytest.raises(DataError, match="holds shards of another run"):
        pack(fixture_jsonl, out, 2, 1, shard_prefix="b")
    assert snapshot(out) == before


def test_a_job_does_not_overwrite_shards_another_run_wrote(tmp_path, fixture_jsonl):
    out = tmp_path / "out"
    pack_shards(PackShardsConfig(input=str(fixture_jsonl), output_dir=str(out), num_workers=1, num_utts_per_shard=5))
    before = snapshot(out)
    with pytest.raises(DataError, match="written by another run"):
        pack(fixture_jsonl, out, 2, 1)
    assert snapshot(out) == before


@pytest.fixture
def three_parts(tmp_path, fixture_jsonl) -> Path:
    out = tmp_path / "out"
    pack_jobs(fixture_jsonl, out, 3)
    return out


def refused(out: Path, match: str) -> None:
    before = snapshot(out)
    with pytest.raises(DataError, match=match):
        merge(out)
    assert snapshot(out) == before, "a refused merge changed something"
    assert not (out / "data.list").exists()


def test_merge_refuses_a_missing_part_naming_it(three_parts):
    (three_parts / "pack-shards.part-000002-of-000003.json").unlink()
    refused(three_parts, "part 2 of 3 is missing")


def test_merge_refuses_a_part_of_another_n(three_parts, fixture_jsonl):
    other = three_parts.parent / "other"
    pack(fixture_jsonl, other, 2, 1)
    os.replace(other / "pack-shards.part-000001-of-000002.json", three_parts / "pack-shards.part-000001-of-000002.json")
    refused(three_parts, r"part-000001-of-000002.json \(2 jobs\)")


def test_merge_refuses_a_part_of_other_options(three_parts, fixture_jsonl):
    other = three_parts.parent / "other"
    pack(fixture_jsonl, other, 3, 2, seed=1, shuffle=True)
    os.replace(other / "pack-shards.part-000002-of-000003.json", three_parts / "pack-shards.part-000002-of-000003.json")
    refused(three_parts, "part-000002-of-000003.json was made with other options")


def test_merge_refuses_a_part_whose_shard_is_absent_or_changed(three_parts):
    shard = three_parts / "shard-000002.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:-512])
    refused(three_parts, "shard-000002.tar has")
    shard.unlink()
    refused(three_parts, "shard-000002.tar is absent")
    shard.write_bytes(data[:3000] + bytes([data[3000] ^ 1]) + data[3001:])  # same size, other bytes
    merge(three_parts)  # the fast check is sizes; ++check=sha256 reads every output
    (three_parts / "data.list").unlink()
    before = snapshot(three_parts)
    with pytest.raises(DataError, match="changed since the job wrote it"):
        merge(three_parts, check="sha256")
    assert snapshot(three_parts) == before


def test_merge_refuses_a_key_two_parts_hold(three_parts):
    import json

    record = three_parts / "pack-shards.part-000003-of-000003.json"
    part = json.loads(record.read_text())
    first = json.loads((three_parts / "pack-shards.part-000001-of-000003.json").read_text())
    stolen = first["data"]["groups"][0]["entries"][0]["keys"][0]
    part["data"]["groups"][0]["entries"][0]["keys"][0] = stolen
    record.write_text(json.dumps(part))
    refused(three_parts, f"key '{stolen}' is held by two parts")


@pytest.fixture(scope="module")
def parts_template(tmp_path_factory) -> Path:
    """3 pack-shards jobs of the fixture corpus (6 shards of 4), not merged; tests tamper with a copy."""
    d = tmp_path_factory.mktemp("parts")
    pack_jobs(write_jsonl(d / "in.jsonl", fixture_records()), d / "out", 3)
    return d / "out"


def _entry(r: dict) -> dict:
    return r["data"]["groups"][0]["entries"][0]


def _escape(r: dict) -> None:
    r["outputs"][0]["file"] = _entry(r)["path"] = "../elsewhere.tar"


TAMPERED = {  # what is done to the record of job 1 of 3, and what the refusal says about it
    "negative duration": (lambda r: _entry(r).update(duration=-3.0),
                          "data.groups[0].entries[0].duration is -3.0, not a finite number of seconds >= 0"),
    "../ output path": (_escape, "outputs[0].file is '../elsewhere.tar', not a relative path inside the record's "
                                 "directory"),
    "kept disagrees": (lambda r: r["data"]["summary"].update(kept=r["data"]["summary"]["kept"] + 1),
                       "data.summary.kept is 9, but the shard entries hold 8 utterances"),
    "num_utts disagrees with keys": (lambda r: _entry(r).update(num_utts=5),
                                     "data.groups[0].entries[0].keys lists 4 keys but num_utts is 5"),
    "sha256 disagrees with outputs": (lambda r: _entry(r).update(sha256="0" * 64),
                                      "data.groups[0].entries[0] is {'path': 'shard-000000.tar'"),
    "span disagrees": (lambda r: r.update(span=[0, 5]), "span is [0, 5], but job 1 of 3 over 6 units covers [0, 2]"),
    "job index disagrees with the name": (lambda r: r.update(job_index=2),
                                          "num_jobs/job_index is [3, 2], but the record's file name says job 1 of 3"),
    # issue 41 item 9: what the record says of a shard is checked against the shard's tar headers and .json members
    "a false duration": (lambda r: _entry(r).update(duration=round(_entry(r)["duration"] + 7.5, 3)),
                         "data.groups[0].entries[0].duration is "),
    "a false max_duration": (lambda r: _entry(r).update(max_duration=_entry(r)["min_duration"]),
                             "data.groups[0].entries[0].max_duration is "),
    "an invented key": (lambda r: _entry(r)["keys"].__setitem__(1, "invented-utt"),
                        "data.groups[0].entries[0].keys[1] is 'invented-utt', but utterance 2 of shard "
                        "shard-000000.tar is "),
}


@pytest.mark.parametrize("tampering", list(TAMPERED))
def test_merge_refuses_a_tampered_record_naming_the_record_and_the_field(parts_template, tmp_path, tampering):
    import json
    import shutil

    out = tmp_path / "out"
    shutil.copytree(parts_template, out)
    record = out / "pack-shards.part-000001-of-000003.json"
    part = json.loads(record.read_text())
    change, says = TAMPERED[tampering]
    change(part)
    record.write_text(json.dumps(part))
    refused(out, re.escape(f"part record {record}: {says}"))


def test_merge_without_parts_says_what_to_run(tmp_path):
    with pytest.raises(DataError, match="no part records"):
        merge(tmp_path)


def test_kill_9_mid_job_then_rerun_merges_to_the_bytes_of_one_job(tmp_path):
    recs = [dict(r, key=f"c{c}-{r['key']}") for c in range(4) for r in fixture_records()]  # 96 utterances
    jsonl = write_jsonl(tmp_path / "big.jsonl", recs)
    args = [f"++input={jsonl}", "++num_utts_per_shard=4", "++num_workers=1", "++audio_format=flac"]
    pack(jsonl, tmp_path / "ref", audio_format="flac")  # in-process: only the killed job needs a process
    out = tmp_path / "out"
    env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1")
    job = [str(BIN / "corpus-io"), "pack-shards", *args, f"++output_dir={out}", "++num_jobs=2"]
    proc = subprocess.Popen([*job, "++job_index=1"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + hang_limit(120)
    while time.time() < deadline and len(list(out.glob(".shard-*.tar.json"))) < 3:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "pack-shards.part-000001-of-000002.json").exists(), "the job finished before the kill"
    pack_jobs(jsonl, out, 2, audio_format="flac")  # the reruns and the merge, in-process
    merge(out)
    assert tree(out) == tree(tmp_path / "ref")
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


# --------------------------------------------------------------------------- add-field and verify-shards


@pytest.fixture
def packed(tmp_path, fixture_jsonl) -> Path:
    """The fixture corpus packed (6 shards of 4), copied per run below."""
    pack(fixture_jsonl, tmp_path / "packed")
    return tmp_path / "packed"


def copy_of(packed: Path, name: str) -> Path:
    import shutil

    out = packed.parent / name
    shutil.copytree(packed, out)
    listed = out / "data.list"
    listed.write_text(listed.read_text().replace(str(packed), str(out)))
    return out


def test_add_field_n_jobs_merge_to_the_index_and_files_of_one_job(tmp_path, packed):
    from corpus_io.config import AddFieldConfig
    from corpus_io.shards.add_field import add_field

    values = write_jsonl(tmp_path / "spk.jsonl", [{"key": r["key"], "spk": r["speaker"]} for r in fixture_records()])

    def run(out: Path, n: int, j: int) -> None:
        add_field(AddFieldConfig(input=str(out / "data.list"), field="spk", from_jsonl=str(values), num_workers=1,
                                 num_jobs=n, job_index=j))

    one = copy_of(packed, "one")
    run(one, 1, 1)
    reference = tree(one)
    assert any(name.endswith(".spk.jsonl.gz") for name in reference)
    for n in (2, 3, 7):
        out = copy_of(packed, f"n{n}")
        index = (out / "index.jsonl").read_bytes()
        for j in range(1, n + 1):
            run(out, n, j)
            assert (out / "index.jsonl").read_bytes() == index, "a job of N > 1 rewrote the index"
        merge(out / "data.list")
        assert tree(out) == reference, n
        merge(out / "data.list")
        assert tree(out) == reference


def test_verify_shards_n_jobs_merge_to_the_report_of_one_job(tmp_path, packed):
    from corpus_io.config import VerifyShardsConfig
    from corpus_io.shards.verify import verify_shards

    shard = packed / "shard-000004.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:3000] + bytes([data[3000] ^ 1]) + data[3001:])  # one bad shard: the report names it

    def run(report: Path, n: int, j: int) -> None:
        verify_shards(VerifyShardsConfig(input=str(packed / "data.list"), num_workers=1, report=str(report),
                                         num_jobs=n, job_index=j))

    with pytest.raises(DataError, match="1 of 6 shards failed"):
        run(tmp_path / "one.txt", 1, 1)
    reference = (tmp_path / "one.txt").read_text()
    assert "FAIL" in reference and "shard-000004.tar" in reference
    for n in (2, 3, 7):
        for part in packed.glob("data.list.verify-shards.part-*"):
            part.unlink()
        for j in range(1, n + 1):
            lo, hi = Job(j, n).span(6)
            if lo <= 4 < hi:  # the job holding the bad shard fails, naming it (after writing its part)
                with pytest.raises(DataError, match="shard-000004.tar"):
                    run(tmp_path / f"n{n}.txt", n, j)
            else:
                run(tmp_path / f"n{n}.txt", n, j)
        assert not (tmp_path / f"n{n}.txt").exists()
        with pytest.raises(DataError, match="1 of 6 shards failed"):
            merge(packed / "data.list")
        assert (tmp_path / f"n{n}.txt").read_text() == reference, n


def test_a_key_repeated_in_the_input_is_refused_by_one_job_and_by_the_merge_of_n(tmp_path):
    recs = fixture_records()
    recs[20] = dict(recs[20], key=recs[0]["key"])  # in job 2's shards; the original is in job 1's
    jsonl = write_jsonl(tmp_path / "dup.jsonl", recs)
    with pytest.raises(DataError, match="duplicate key"):
        pack(jsonl, tmp_path / "one")
    pack_jobs(jsonl, tmp_path / "two", 2)
    refused(tmp_path / "two", f"key '{recs[0]['key']}' is held by two parts")


def test_n_jobs_with_exclude_keys_merge_to_the_bytes_of_one_job(tmp_path, fixture_jsonl):
    keys = [json.loads(line)["key"] for line in fixture_jsonl.read_text().splitlines()]
    flagged = tmp_path / "flagged"
    flagged.write_text("".join(f"{k} loss_per_token 9 > 1\n" for k in keys[1::5]), encoding="utf-8")
    pack(fixture_jsonl, tmp_path / "one", exclude_keys=str(flagged))
    reference = tree(tmp_path / "one")
    pack_jobs(fixture_jsonl, tmp_path / "n3", 3, exclude_keys=str(flagged))
    merge(tmp_path / "n3")
    assert tree(tmp_path / "n3") == reference
