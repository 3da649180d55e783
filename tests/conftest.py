"""Shared test fixtures. Paths in the fixture corpus are relative to the repo root, so every
test runs with the repo root as its working directory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "corpus"
BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("CORPUS_IO_NO_PROGRESS", "1")


@pytest.fixture
def fixture_corpus() -> Path:
    """The committed Kaldi dir (wav.scp, text, utt2spk) of mixed zh/en speech at 8/16/44.1 kHz."""
    return FIXTURE


def run_cli(*args: str, timeout: float = 300, env: dict | None = None, cwd: str | os.PathLike | None = None):
    """Run a console script from the venv; returns CompletedProcess with text output."""
    exe = args[0] if os.path.isabs(args[0]) else str(BIN / args[0])
    full_env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1", **(env or {}))
    return subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd or REPO)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_user_error(result, *needles: str) -> None:
    """A user mistake: non-zero exit, a message naming the culprit, and no Python traceback."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in: {result.stderr}"


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
