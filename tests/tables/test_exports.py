"""NeMo and Lhotse manifests written by ``jsonl2scp ++output_format=nemo|lhotse`` (corpus_io.tables.exports) name their
audio
so that each reader finds it from wherever it runs: corpus-io's own reader (corpus_io.tables.inputs), Lhotse itself, and
NeMo's path rule."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import soundfile as sf

from corpus_io import api
from corpus_io.tables.inputs import iter_records
from tests.loader_data import fixture_utts

UTTS = fixture_utts()[:3]  # (key, path, text): real wav/flac


def _nemo_path(audio_filepath: str, manifest: Path) -> str:
    """The file NeMo opens for a manifest line (``nemo.collections.common.parts.preprocessing.manifest
    .get_full_path``): the path as given if it is a file from the current directory or absolute, else the path
    under the manifest's directory."""
    if os.path.isfile(audio_filepath) or os.path.isabs(audio_filepath):
        return audio_filepath
    return str(manifest.parent / audio_filepath)


@pytest.mark.parametrize("output_format, name", [("nemo", "train_manifest.json"), ("lhotse", "cuts.jsonl.gz")])
def test_a_manifest_exported_from_relative_paths_reads_the_same_audio_from_any_directory(tmp_path, monkeypatch,
                                                                                          output_format, name):
    corpus = tmp_path / "corpus"  # a FunASR jsonl naming its audio relative to corpus/, exported from there
    (corpus / "audio").mkdir(parents=True)
    lines, audio = [], {}
    for key, path, text in UTTS:
        (corpus / "audio" / Path(path).name).write_bytes(Path(path).read_bytes())
        lines.append({"key": key, "source": f"audio/{Path(path).name}", "target": text})
        audio[key] = Path(path).read_bytes()
    (corpus / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "manifests" / name
    out.parent.mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(corpus)
    api.jsonl2scp("train.jsonl", [], output_format=output_format, manifest_out=str(out))
    for cwd in (corpus, out.parent, tmp_path / "elsewhere"):
        monkeypatch.chdir(cwd)
        back = list(iter_records(out))  # corpus-io reads its export back
        assert [r["key"] for r in back] == list(audio), cwd
        assert [Path(r["source"]).read_bytes() for r in back] == list(audio.values()), cwd
        if output_format == "nemo":
            written = [json.loads(x) for x in out.read_text().splitlines()]
            assert [Path(_nemo_path(x["audio_filepath"], out)).read_bytes() for x in written] == list(audio.values())
        else:
            from lhotse import CutSet

            cuts = CutSet.from_file(out).to_eager()
            for cut, (_, path, _) in zip(cuts, UTTS):
                assert cut.load_audio().shape[-1] == sf.info(path).frames, cwd  # lhotse opens the same file
