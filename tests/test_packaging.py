"""A regular install: the wheel carries the configs, the core runs data preparation without torch,
and corpus-io installs beside FunASR without taking its console scripts."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.conftest import FIXTURE, REPO, one_at_a_time, run_bounded

# FunASR's console scripts (its setup.py): installing corpus-io must not replace any of them
FUNASR_SCRIPTS = {"funasr", "funasr-hydra", "funasr-server", "funasr-train", "funasr-train-ds", "funasr-export",
                  "scp2jsonl", "jsonl2scp", "sensevoice2jsonl", "funasr-scp2jsonl", "funasr-jsonl2scp",
                  "funasr-sensevoice2jsonl"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    with one_at_a_time(tmp_path_factory, "build-in-tree"):  # it writes build/ and *.egg-info in the checkout
        result = run_bounded([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(REPO)], 600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (whl,) = out.glob("corpus_io-*.whl")
    return whl


@pytest.fixture(scope="module")
def core_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its core dependencies only (no extras)."""
    root = tmp_path_factory.mktemp("core-venv")
    venv.create(root, with_pip=False)  # this interpreter's pip installs into it (pip --python): no ensurepip
    # no PYTHONPATH: one naming a source tree (its corpus_io.egg-info) makes pip skip the wheel as installed
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = run_bounded([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "--quiet",
                          str(wheel)], 600, env=clean)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (root / "bin" / "corpus-io").is_file(), result.stdout[-3000:]
    return root / "bin"


def test_the_packages_list_names_every_package_directory():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for top in ("corpus_io", "cli")
               for p in (REPO / top).rglob("__init__.py")}
    on_disk |= {".".join(("corpus_io", *p.relative_to(REPO).parts)) for p in [REPO / "conf", *(REPO / "conf").iterdir()]
                if p.is_dir()}
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages in pyproject.toml"


def test_the_wheel_ships_every_config_and_no_funasr_script_name(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
        scripts = configparser.ConfigParser()
        scripts.read_string(z.read(entry_points).decode())
    shipped = {p.relative_to(REPO / "conf").as_posix() for p in (REPO / "conf").rglob("*.yaml")}
    assert {f"corpus_io/conf/{rel}" for rel in shipped} <= names
    assert "corpus-io" in scripts["console_scripts"]
    assert not set(scripts["console_scripts"]) & FUNASR_SCRIPTS


def test_core_install_prepares_data_without_torch_from_any_directory(core_venv, tmp_path):
    for module in ("torch", "onnxruntime", "onnx"):  # onnxruntime and onnx only with the [onnx] extra
        assert subprocess.run([str(core_venv / "python"), "-c", f"import {module}"],
                              capture_output=True).returncode != 0, module
    # a Kaldi dir with absolute paths, and every command run from an unrelated directory
    kaldi = tmp_path / "kaldi"
    kaldi.mkdir()
    with open(FIXTURE / "wav.scp") as src, open(kaldi / "wav.scp", "w") as dst:
        for line in src:
            key, path = line.split(maxsplit=1)
            dst.write(f"{key} {REPO / path.strip()}\n")
    (kaldi / "text").write_bytes((FIXTURE / "text").read_bytes())
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["CORPUS_IO_NO_PROGRESS"] = "1"

    def run(*args: str) -> subprocess.CompletedProcess:
        result = run_bounded([str(core_venv / args[0]), *args[1:]], 300, env=env, cwd=work)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        return result

    run("corpus-io", "scp2jsonl", f"++scp_file_list=[{kaldi}/wav.scp,{kaldi}/text]", "++jsonl_file_out=train.jsonl")
    run("pack-shards", "++input=train.jsonl", "++output_dir=shards", "++num_utts_per_shard=10")
    run("make-datalist", "++data_type=shard", "++input=shards", "++output=data.list")
    assert "3 ok, 0 failed" in run("corpus-io", "verify-shards", "++input=data.list").stdout
    stats = run("corpus-io", "stats", "++input=data.list").stdout
    assert "utterances                        24" in stats
    assert "pip install -e '<path-to-corpus-io-checkout>[plots]'" in stats, stats
    run("corpus-io", "make-tokenizer", "++input=train.jsonl", "++output=tokens.txt")
    run("corpus-io", "jsonl2scp", "++jsonl_file_in=train.jsonl", "++scp_file_list=[w.scp,t.txt]")
    # a command that needs an extra says which one, in one paragraph
    result = run_bounded([str(core_venv / "corpus-io"), "train", "++train_data_set_list=data.list",
                          "++output_dir=exp"], 300, env=env, cwd=work)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "pip install -e '<path-to-corpus-io-checkout>[train]'" in result.stderr, result.stderr
