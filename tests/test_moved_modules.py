"""The old module paths (before the wings, issue 30; the model and its doors out of train/, issue 53) keep working
until corpus-io 0.2: the moved module
objects themselves, with a DeprecationWarning (a FutureWarning for ``python -m``)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize(("old", "new"), [("corpus_io.files", "corpus_io.storage.files"),
                                          ("corpus_io.kaldi", "corpus_io.tables.kaldi"),
                                          ("corpus_io.pipeline", "corpus_io.loader"),
                                          ("corpus_io.executors", "corpus_io.jobs.executors"),
                                          ("corpus_io.train.decode", "corpus_io.infer.decode"),
                                          ("corpus_io.train.model", "corpus_io.model.model"),
                                          ("corpus_io.train.scoring", "corpus_io.decoding.scoring")])
def test_an_old_module_path_imports_the_moved_module_itself_with_a_deprecation_warning(old, new):
    sys.modules.pop(old, None)  # the alias only: the moved module stays loaded
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_an_old_package_path_reaches_its_moved_submodules():
    sys.modules.pop("corpus_io.pipeline", None)
    sys.modules.pop("corpus_io.pipeline.elastic", None)
    with pytest.warns(DeprecationWarning):
        from corpus_io.pipeline import elastic
    assert elastic is importlib.import_module("corpus_io.loader.elastic")


def test_names_of_the_old_jobs_and_audio_modules_are_read_from_their_wings():
    import corpus_io.audio
    import corpus_io.jobs
    from corpus_io.audio import io
    from corpus_io.jobs import parts

    with pytest.warns(DeprecationWarning, match="corpus_io.jobs.run_job moved to corpus_io.jobs.parts.run_job"):
        assert corpus_io.jobs.run_job is parts.run_job  # docs/CLUSTERS.md "Executors"
    with pytest.warns(DeprecationWarning, match="corpus_io.audio.probe moved"):
        assert corpus_io.audio.probe is io.probe
    with pytest.raises(AttributeError):
        corpus_io.jobs.no_such_name  # noqa: B018


def test_python_m_with_an_old_module_path_runs_the_moved_module():
    result = subprocess.run([sys.executable, "-m", "corpus_io.synth", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "fixture" in result.stdout and "FutureWarning" in result.stderr and "corpus_io.tables.synth" in result.stderr


def test_a_checkpoint_naming_the_model_class_by_its_old_path_builds_the_model_without_a_warning():
    import warnings

    from corpus_io.model.model import build_model

    conf = {"_target_": "corpus_io.train.model.ConformerCTC", "output_size": 16, "attention_heads": 2,
            "linear_units": 16, "num_blocks": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = build_model(conf, input_dim=80, vocab_size=10)
    assert type(model).__module__ == "corpus_io.model.model"
