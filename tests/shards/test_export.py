"""``corpus-io export ++format=hf-parquet`` (issue 32): any input written as Hugging Face parquet that the real
``datasets`` reads with an Audio column, the audio bytes copied; deterministic, resumable, as jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_io.config import ExportConfig, MergeJobsConfig
from corpus_io.jobs.parts import merge_jobs
from corpus_io.shards.export import export
from corpus_io.tables.inputs import iter_records
from tests.conftest import FIXTURE, assert_user_error, run_cli
from tests.loader_data import fixture_utts, make_hf_parquet


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return make_hf_parquet(tmp_path_factory.mktemp("hf"))


def _cfg(input_, out, **kw) -> ExportConfig:
    kw.setdefault("num_workers", 1)
    kw.setdefault("num_utts_per_file", 16)
    kw.setdefault("format", "hf-parquet")
    return ExportConfig(input=str(input_), output_dir=str(out), **kw)


def _tree(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "data").glob("*.parquet"))}


def _read_back(out: Path) -> dict[str, tuple[bytes, str]]:
    import datasets

    ds = datasets.load_dataset("parquet", data_files=str(out / "data" / "*.parquet"), split="train")
    assert isinstance(ds.features["audio"], datasets.Audio)  # HF's features in the schema metadata
    ds = ds.cast_column("audio", datasets.Audio(decode=False))
    return {row["id"]: (row["audio"]["bytes"], row["text"]) for row in ds}


def test_parquet_exported_again_is_read_by_datasets_with_every_keys_bytes_and_text(hf, tmp_path):
    data, utts = hf
    summary = export(_cfg(data, tmp_path / "out"))
    assert summary.kept == 40 and sorted(_tree(tmp_path / "out")) == [f"train-0000{i}-of-00003.parquet"
                                                                       for i in range(3)]
    assert _read_back(tmp_path / "out") == utts
    again = {r["key"]: (r["source_bytes"], r["target"], r["speaker"]) for r in iter_records(str(tmp_path / "out"))}
    assert {k: v[:2] for k, v in again.items()} == utts and again[list(utts)[0]][2] == "spk0"


def test_a_kaldi_dir_is_exported_with_its_files_bytes_and_speakers(tmp_path):
    summary = export(_cfg(FIXTURE, tmp_path / "out", split="dev"))
    want = {k: (Path(p).read_bytes(), t) for k, p, t in fixture_utts()}
    assert summary.kept == 24 and _read_back(tmp_path / "out") == want
    assert {p.name for p in (tmp_path / "out" / "data").iterdir()} == {f"dev-0000{i}-of-00002.parquet"
                                                                       for i in range(2)}


def test_export_is_deterministic_resumable_and_as_jobs_equals_one_run(hf, tmp_path):
    data, _ = hf
    export(_cfg(data, tmp_path / "a"))
    export(_cfg(data, tmp_path / "b", num_workers=2))
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    again = export(_cfg(data, tmp_path / "a"))
    assert again.extra["resumed"] == 3 and _tree(tmp_path / "a") == _tree(tmp_path / "b")
    for j in (1, 2):
        export(_cfg(data, tmp_path / "jobs", num_jobs=2, job_index=j))
    merged = merge_jobs(MergeJobsConfig(path=str(tmp_path / "jobs")))
    assert merged.kept == 40 and _tree(tmp_path / "jobs") == _tree(tmp_path / "a")


def test_the_export_command_writes_hf_parquet(hf, tmp_path):
    data, utts = hf
    result = run_cli("corpus-io", "export", "++format=hf-parquet", f"++input={data}", f"++output_dir={tmp_path / 'o'}",
                     "++num_workers=1")
    assert result.returncode == 0, result.stderr
    assert _read_back(tmp_path / "o") == utts


def test_the_export_command_writes_a_lhotse_shar_that_lhotse_reads_with_every_keys_samples_and_text(hf, tmp_path):
    import io

    import numpy as np
    import soundfile as sf
    from lhotse import CutSet

    data, utts = hf
    result = run_cli("corpus-io", "export", "++format=lhotse-shar", f"++input={data}", f"++output_dir={tmp_path}",
                     "++split=dev", "++num_workers=1", "++num_utts_per_file=16")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "dev"  # from_shar(in_dir=...) reads every file of its directory: export's records stay above
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{kind}.{i:06d}.{ext}" for i in range(3) for kind, ext in (("cuts", "jsonl.gz"), ("recording", "tar")))
    cuts = CutSet.from_shar(in_dir=str(out))
    got = {cut.id: (cut.load_audio()[0], cut.supervisions[0].text) for cut in cuts}
    assert sorted(got) == sorted(utts)
    for key, (audio_bytes, text) in utts.items():
        want, _ = sf.read(io.BytesIO(audio_bytes), dtype="float32")
        assert got[key][1] == text and np.array_equal(got[key][0], want), key


# --------------------------------------------------------------------------- packed shards as the input (issue 41)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The fixture corpus (speakers, a language) packed by pack-shards into 3 shards of 10/10/4, and what the
    shards hold: ``(data.list, {key: (audio bytes, text)})``."""
    from corpus_io.config import PackShardsConfig
    from corpus_io.shards.pack import pack_shards
    from corpus_io.shards.reader import read_shard
    from tests.shards.conftest import fixture_records, write_jsonl

    tmp = tmp_path_factory.mktemp("packed")
    jsonl = write_jsonl(tmp / "train.jsonl", fixture_records())
    pack_shards(PackShardsConfig(input=str(jsonl), output_dir=str(tmp / "shards"), num_workers=1,
                                 num_utts_per_shard=10))
    data_list = tmp / "shards" / "data.list"
    held = {s["key"]: (bytes(s["audio"]), s["txt"]) for url in data_list.read_text().split()
            for s in read_shard(url)}
    assert len(held) == 24
    return data_list, held


def _shar_back(out: Path) -> dict[str, tuple]:
    from lhotse import CutSet

    return {cut.id: (cut.load_audio()[0], cut.supervisions[0].text) for cut in CutSet.from_shar(in_dir=str(out))}


def _samples(held: dict[str, tuple[bytes, str]]) -> dict[str, tuple]:
    import io

    import soundfile as sf

    return {k: (sf.read(io.BytesIO(b), dtype="float32")[0], t) for k, (b, t) in held.items()}


def _same_samples(got: dict, want: dict) -> None:
    import numpy as np

    assert sorted(got) == sorted(want)
    for key, (samples, text) in want.items():
        assert got[key][1] == text and np.array_equal(got[key][0], samples), key


class _Www:
    """A directory served on 127.0.0.1 (the real http.server, ranged reads included)."""

    def __init__(self, root: Path):
        import functools
        import threading
        from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(SimpleHTTPRequestHandler, directory=str(root)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.server.shutdown()
        self.server.server_close()


def test_a_packed_shard_list_is_exported_to_parquet_and_shar_with_every_keys_audio_bytes_text_and_speaker(packed,
                                                                                                        tmp_path):
    data_list, held = packed
    summary = export(_cfg(data_list, tmp_path / "hf", num_utts_per_file=7))
    assert summary.kept == 24 and summary.extra["files"] == 4
    assert _read_back(tmp_path / "hf") == held  # the shards' audio bytes, copied
    from tests.shards.conftest import fixture_records

    again = {r["key"]: (r["speaker"], r["language"]) for r in iter_records(str(tmp_path / "hf"))}
    assert again == {r["key"]: (r["speaker"], r["language"]) for r in fixture_records()}
    result = run_cli("corpus-io", "export", "++format=lhotse-shar", f"++input={data_list}",
                     f"++output_dir={tmp_path / 'shar'}", "++num_workers=1", "++num_utts_per_file=10")
    assert result.returncode == 0, result.stderr
    _same_samples(_shar_back(tmp_path / "shar" / "train"), _samples(held))


def test_a_shard_list_served_over_http_exports_what_the_local_one_does(packed, tmp_path):
    import shutil

    from corpus_io.shards.index import load_index, write_list_and_index

    data_list, held = packed
    www = tmp_path / "www"
    shutil.copytree(data_list.parent, www / "shards")
    export(_cfg(data_list, tmp_path / "local", num_utts_per_file=7))
    with _Www(www) as server:
        entries = [dict(e, path=f"{server.base}/shards/{Path(e['path']).name}")
                   for e in load_index(www / "shards" / "data.list", keys=True).values()]
        write_list_and_index(www / "remote" / "data.list", entries)
        (www / "bare").mkdir()  # no index: counted and keyed by one reading of the shards
        (www / "bare" / "data.list").write_text("".join(e["path"] + "\n" for e in entries))
        for name in ("remote", "bare"):
            summary = export(_cfg(f"{server.base}/{name}/data.list", tmp_path / name, num_utts_per_file=7))
            assert summary.kept == 24 and _read_back(tmp_path / name) == held
            assert _tree(tmp_path / name) == _tree(tmp_path / "local")
        result = run_cli("corpus-io", "export", "++format=lhotse-shar", f"++input={server.base}/remote/data.list",
                         f"++output_dir={tmp_path / 'shar'}", "++num_workers=1", "++num_utts_per_file=10")
    assert result.returncode == 0, result.stderr
    _same_samples(_shar_back(tmp_path / "shar" / "train"), _samples(held))


def test_a_shard_directory_and_a_wenet_targz_list_are_exported(packed, tmp_path):
    from tests.shards.test_targz import make_wenet_targz

    data_list, held = packed
    assert export(_cfg(data_list.parent, tmp_path / "dir")).kept == 24
    assert _read_back(tmp_path / "dir") == held
    wenet_list, keys = make_wenet_targz(tmp_path / "wenet", copies=1, per_shard=5)
    summary = export(_cfg(wenet_list, tmp_path / "wenet-out", num_utts_per_file=7))
    want = {f"c0-{k}" if k not in keys else k: (Path(p).read_bytes(), t) for k, p, t in fixture_utts()}
    assert summary.kept == 24 and _read_back(tmp_path / "wenet-out") == want


def test_a_shard_list_export_is_deterministic_resumable_and_as_jobs_equals_one_run(packed, tmp_path):
    data_list, _ = packed
    export(_cfg(data_list, tmp_path / "a", num_utts_per_file=7))
    export(_cfg(data_list, tmp_path / "b", num_utts_per_file=7, num_workers=2))
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    again = export(_cfg(data_list, tmp_path / "a", num_utts_per_file=7))
    assert again.extra["resumed"] == 4 and _tree(tmp_path / "a") == _tree(tmp_path / "b")
    for j in (1, 2, 3):
        export(_cfg(data_list, tmp_path / "jobs", num_utts_per_file=7, num_jobs=3, job_index=j))
    merged = merge_jobs(MergeJobsConfig(path=str(tmp_path / "jobs")))
    assert merged.kept == 24 and _tree(tmp_path / "jobs") == _tree(tmp_path / "a")


def test_a_shard_holding_fewer_utterances_than_its_index_says_is_named_or_counted_when_skipping(packed, tmp_path):
    import json
    import shutil

    data_list, _ = packed
    shards = tmp_path / "shards"
    shutil.copytree(data_list.parent, shards)
    (shards / "data.list").write_text("".join(f"{shards / Path(u).name}\n" for u in data_list.read_text().split()))
    index = shards / "index.jsonl"
    lines = [json.loads(x) for x in index.read_text().splitlines()]
    lines[2]["num_utts"], lines[2]["keys"] = 5, lines[2]["keys"] + ["invented"]  # the shard holds 4
    lines[2]["durations"].append(0.0)  # an index consistent in itself (one duration per utterance it counts)
    index.write_text("".join(json.dumps(x) + "\n" for x in lines))
    before = {p.name: p.read_bytes() for p in shards.iterdir()}
    result = run_cli("corpus-io", "export", f"++input={shards / 'data.list'}", f"++output_dir={tmp_path / 'o'}",
                     "++num_workers=1", "++num_utts_per_file=100")
    assert_user_error(result, "shard-000002.tar ends after 4 utterances, but its index entry counts 5",
                      "verify-shards", "++on_error=skip")
    assert not list((tmp_path / "o").glob("data/*.parquet"))
    skipped = export(_cfg(shards / "data.list", tmp_path / "s", num_utts_per_file=100, on_error="skip"))
    assert skipped.kept == 24 and skipped.skipped == {"unreadable shard": 1}
    assert {p.name: p.read_bytes() for p in shards.iterdir()} == before


def test_a_key_two_listed_shards_hold_is_refused_before_anything_is_written(tmp_path):
    from tests.shards.conftest import packed_with_a_repeat

    merged, _, _ = packed_with_a_repeat(tmp_path)
    result = run_cli("corpus-io", "export", f"++input={merged}", f"++output_dir={tmp_path / 'o'}", "++num_workers=1")
    assert_user_error(result, "is held twice", "Nothing was written")
    assert not (tmp_path / "o").exists()


def test_every_key_export_shares_with_pack_shards_has_its_default_range_and_choices():
    import dataclasses

    from corpus_io.config import PackShardsConfig

    def spec(schema, name):
        f = {f.name: f for f in dataclasses.fields(schema)}[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        return default, f.metadata["range"], f.metadata["choices"], f.metadata["unit"]

    shared = {"num_utts_per_file": "num_utts_per_shard", **{k: k for k in (
        "audio_format", "resample", "columns", "num_workers", "on_error", "allow_pipe", "pipe_timeout",
        "storage_options", "num_jobs", "job_index", "executor", "executor_address")}}
    for mine, theirs in shared.items():
        assert spec(ExportConfig, mine) == spec(PackShardsConfig, theirs), mine


# --------------------------------------------------------------------------- never mixed, never overwritten (issue 41)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_output_that_is_the_input_inside_it_or_holding_it_is_refused_before_anything_is_written(hf, tmp_path):
    import shutil

    data, _ = hf
    export(_cfg(data, tmp_path / "hf"))  # hf/data/train-*.parquet
    export(_cfg(data, tmp_path / "shar", format="lhotse-shar", split="dev"))  # shar/dev/
    shutil.copytree(FIXTURE, tmp_path / "kaldi")
    one = sorted((tmp_path / "hf" / "data").glob("*.parquet"))[0]
    cases = [  # (input, output_dir, extra args, what the message says)
        (tmp_path / "hf" / "data", tmp_path / "hf", ["++split=dev"], f"({tmp_path / 'hf' / 'data'}) is the input"),
        (one, tmp_path / "hf", ["++split=test"], "holds the input"),
        (tmp_path / "shar" / "dev", tmp_path / "shar", ["++format=lhotse-shar", "++split=dev"], "is the input"),
        (tmp_path / "kaldi", tmp_path / "kaldi" / "out", [], "is inside the input"),
    ]
    before = _snapshot(tmp_path)
    for input_, out, extra, says in cases:
        result = run_cli("corpus-io", "export", f"++input={input_}", f"++output_dir={out}", "++num_workers=1", *extra)
        assert_user_error(result, says, "Nothing was written")
        assert _snapshot(tmp_path) == before, input_
    assert not (tmp_path / "kaldi" / "out").exists()


def test_a_rerun_into_another_inputs_export_is_refused_and_replace_leaves_only_the_new_export(hf, tmp_path):
    data, _ = hf
    out = tmp_path / "out"
    export(_cfg(data, out, num_utts_per_file=16))  # 40 utterances in 3 files
    before = _snapshot(out)
    other = run_cli("corpus-io", "export", f"++input={FIXTURE}", f"++output_dir={out}", "++num_workers=1")
    assert_user_error(other, f"holds the train export of another input ({data})", "++replace=true",
                      "Nothing was written")
    options = run_cli("corpus-io", "export", f"++input={data}", f"++output_dir={out}", "++num_workers=1",
                      "++num_utts_per_file=30")
    assert_user_error(options, "holds a train export of this input made with other options")
    assert _snapshot(out) == before
    replaced = export(_cfg(FIXTURE, out, replace=True))
    assert replaced.kept == 24
    want = {k: (Path(p).read_bytes(), t) for k, p, t in fixture_utts()}
    assert _read_back(out) == want  # none of the old input's 40 rows stays beside them
    assert sorted(_tree(out)) == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert sorted(p.name for p in out.glob(".export-*.json")) == [
        ".export-train-000000.json", ".export-train-000001.json", ".export-train.json"]
    assert export(_cfg(FIXTURE, out, replace=True)).extra["resumed"] == 2  # replacing itself: resumed


def test_another_split_of_another_input_is_written_beside_the_first(hf, tmp_path):
    data, utts = hf
    export(_cfg(data, tmp_path, split="train"))
    export(_cfg(FIXTURE, tmp_path, split="dev"))
    assert len(_tree(tmp_path)) == 5 and export(_cfg(data, tmp_path, split="train")).extra["resumed"] == 3


@pytest.mark.parametrize("split", ["../x", "a/b", "..", "", "dev/../../x"])
def test_a_split_name_with_a_slash_or_dots_is_refused_and_nothing_is_written(hf, tmp_path, split):
    data, _ = hf
    result = run_cli("corpus-io", "export", f"++input={data}", f"++output_dir={tmp_path / 'o'}",
                     "++format=lhotse-shar", f"++split={split}")
    assert_user_error(result, "is not a split name", "no '/', no '..'")
    assert not (tmp_path / "o").exists() and not (tmp_path / "x").exists()


def test_a_shard_key_that_is_not_one_token_is_refused_before_anything_is_written(tmp_path):
    from tests.loader_data import make_shards

    utts = fixture_utts()[:6]
    utts[4] = ("old key", *utts[4][1:])  # packed by a tool that let whitespace through
    data_list, _ = make_shards(tmp_path / "shards", utts=utts, per_shard=3)
    before = _snapshot(tmp_path)
    result = run_cli("corpus-io", "export", f"++input={data_list}", f"++output_dir={tmp_path / 'o'}",
                     "++num_workers=1")
    assert_user_error(result, "shard-000001.tar (utterance 2): key 'old key' is not one word", "A key is one token")
    assert _snapshot(tmp_path) == before and not (tmp_path / "o").exists()


def test_a_replacement_killed_before_it_deleted_the_old_files_has_them_deleted_by_the_next_run(hf, tmp_path):
    data, _ = hf
    out = tmp_path / "out"
    export(_cfg(FIXTURE, out))
    trash = out / ".export-train.replaced"  # as a replacement killed between the marker and the deletion leaves it
    trash.mkdir()
    (trash / "000000-train-00000-of-00003.parquet").write_bytes(b"the replaced export's file")
    assert export(_cfg(FIXTURE, out)).extra["resumed"] == 2
    assert not trash.exists()
    assert sorted(_tree(out)) == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
