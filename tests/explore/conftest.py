"""Fixtures of the explorer tests: the fixture corpus packed to shards, a decode dir, a running server."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, run_cli

#: hypotheses of a pretend decode run: one substitution, one deletion, one insertion, the rest exact
HYP_EDITS = {"spk0-utt008": "the quick brown box jumps over the lazy dog",
             "spk0-utt012": "this is a test of system",
             "spk2-utt010": "hello hello world"}


def fixture_texts() -> dict[str, str]:
    return dict(line.split(" ", 1) for line in (FIXTURE / "text").read_text(encoding="utf-8").splitlines() if line)


@pytest.fixture(scope="session")
def packed(tmp_path_factory) -> Path:
    """The fixture corpus (12 wav + 12 flac, 8/16/44.1 kHz) packed by pack-shards, 8 utterances per shard."""
    out = tmp_path_factory.mktemp("explore") / "shards"
    result = run_cli("corpus-io", "pack-shards", f"++input={FIXTURE}", f"++output_dir={out}",
                     "++num_utts_per_shard=8", "++num_workers=1", timeout=120)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="session")
def decode_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """Two decode output dirs (``text`` of hypotheses): run 1 with :data:`HYP_EDITS`, run 2 exact but one."""
    root = tmp_path_factory.mktemp("decode")
    texts = fixture_texts()
    run1, run2 = root / "run1", root / "run2"
    for d, edits in ((run1, HYP_EDITS), (run2, {"spk0-utt012": "this is a test of system"})):
        d.mkdir()
        (d / "text").write_text("".join(f"{k} {edits.get(k, v)}\n" for k, v in sorted(texts.items())),
                                encoding="utf-8")
    return run1, run2


def copy_shards(packed: Path, dest: Path) -> Path:
    """A private copy of the packed shards (tests that break or change shards use one)."""
    shutil.copytree(packed, dest, ignore=shutil.ignore_patterns(".explore"))
    lst = dest / "data.list"  # pack-shards writes absolute paths: point them at the copy
    lst.write_text(lst.read_text().replace(str(packed), str(dest)))
    return lst


class Served:
    """A real explorer server on 127.0.0.1 (port from the OS), in a thread of the test process."""

    def __init__(self, catalog, **kwargs):
        from corpus_io.explore.query import Explorer
        from corpus_io.explore.server import make_server

        self.explorer = Explorer(catalog, **kwargs)
        self.server = make_server(self.explorer, "127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
