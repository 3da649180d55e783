"""``corpus-io export ++format=hf-parquet`` (issue 32): any input written as Hugging Face parquet that the real
``datasets`` reads with an Audio column, the audio bytes copied; deterministic, resumable, as jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_io.config import ExportConfig, MergeJobsConfig
from corpus_io.jobs.parts import merge_jobs
from corpus_io.shards.export import export
from corpus_io.tables.inputs import iter_records
from tests.conftest import FIXTURE, run_cli
from tests.loader_data import fixture_utts, make_hf_parquet


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return make_hf_parquet(tmp_path_factory.mktemp("hf"))


def _cfg(input_, out, **kw) -> ExportConfig:
    kw.setdefault("num_workers", 1)
    kw.setdefault("num_utts_per_file", 16)
    return ExportConfig(format="hf-parquet", input=str(input_), output_dir=str(out), **kw)


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
