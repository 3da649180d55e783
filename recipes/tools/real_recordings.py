#!/usr/bin/env python3
"""Real recordings for the tests and the demo, fetched once at set-up from a package registry (PyPI).

Source: the source distribution of ``pocketsphinx==5.1.1`` on PyPI (sha256 pinned below), which carries
the test audio of CMU Sphinx with its transcripts:

* ``test/data/librivox/``: 5 utterances (25 s) of "Sense and Sensibility", chapter 1, read for LibriVox
  (LibriVox recordings are in the public domain), transcripts in ``transcription``;
* ``test/data/cards/``: 5 utterances (10 s) of playing-card names spoken by a second (CMU) speaker,
  transcripts in ``cards.transcription``, under the pocketsphinx licence (BSD-style, copied beside them).

Why this source: it is the only widely mirrored registry package found whose audio is real read speech
*with* transcripts (two speakers, 16 kHz 16-bit mono, 35 s in all: small enough to fetch at every CI
set-up, long enough to overfit); it is fetched by ``pip download``, the registry's ordinary client, so
CI needs no other host; the archive is checked against a pinned sha256.

    python recipes/tools/real_recordings.py fetch   # once (make install runs it); prints the directory
    python recipes/tools/real_recordings.py path    # the directory; exit 1 when it was not fetched

The directory (``$CORPUS_IO_REAL_RECORDINGS``, else ``$XDG_CACHE_HOME/corpus-io/``, else
``~/.cache/corpus-io/``, never the repository) is a Kaldi data dir: ``wav/*.wav``, ``wav.scp`` (absolute
paths), ``text``, ``utt2spk``, plus ``ORIGIN.md`` (origin, licences, sha256) and ``LICENSE.pocketsphinx``.
Only the listed members are read from the archive (no extraction of anything else).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE, VERSION = "pocketsphinx", "5.1.1"
SDIST_SHA256 = "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355"
ROOT = f"{PACKAGE}-{VERSION}/test/data"
SETS = {  # speaker -> (directory in the archive, transcription file); keys are <speaker>-<file id>
    "librivox": ("librivox", "transcription"),
    "cards": ("cards", "cards.transcription"),
}
NAME = f"real-recordings-{PACKAGE}-{VERSION}"
_LINE = re.compile(r"^<s>\s*(.*?)\s*</s>\s*\((\S+)\)\s*$")


def cache_dir() -> Path:
    if os.environ.get("CORPUS_IO_REAL_RECORDINGS"):
        return Path(os.environ["CORPUS_IO_REAL_RECORDINGS"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "corpus-io" / NAME


def is_complete(path: Path) -> bool:
    return (path / ".complete").is_file()


def _download(tmp: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", PACKAGE,
           f"{PACKAGE}=={VERSION}", "-d", tmp]
    subprocess.run(cmd, check=True)
    sdist = Path(tmp) / f"{PACKAGE}-{VERSION}.tar.gz"
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{sdist.name} has sha256 {digest}, not the pinned {SDIST_SHA256}: refusing it.")
    return sdist


def _transcripts(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            pairs.append((m.group(2), " ".join(m.group(1).split())))
    return pairs


def fetch(out: Path) -> Path:
    if is_complete(out):
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "wav").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = _download(tmp)
        with tarfile.open(sdist) as tar:
            def member(name: str) -> bytes:
                f = tar.extractfile(name)
                assert f is not None, name
                return f.read()

            rows = []
            for speaker, (folder, transcription) in SETS.items():
                for file_id, words in _transcripts(member(f"{ROOT}/{folder}/{transcription}").decode("utf-8")):
                    key = f"{speaker}-{file_id.rsplit('-', 1)[-1]}"
                    wav = out / "wav" / f"{key}.wav"
                    wav.write_bytes(member(f"{ROOT}/{folder}/{file_id}.wav"))
                    rows.append((key, str(wav.resolve()), words, speaker))
            (out / "LICENSE.pocketsphinx").write_bytes(member(f"{PACKAGE}-{VERSION}/LICENSE"))
    rows.sort()
    (out / "wav.scp").write_text("".join(f"{k} {p}\n" for k, p, _, _ in rows))
    (out / "text").write_text("".join(f"{k} {t}\n" for k, _, t, _ in rows))
    (out / "utt2spk").write_text("".join(f"{k} {s}\n" for k, _, _, s in rows))
    (out / "ORIGIN.md").write_text(
        f"# Real recordings ({len(rows)} utterances)\n\n"
        f"Fetched by recipes/tools/real_recordings.py from PyPI: `pip download --no-deps --no-binary {PACKAGE} "
        f"{PACKAGE}=={VERSION}` (sdist sha256 {SDIST_SHA256}), members `{ROOT}/librivox/*` and "
        f"`{ROOT}/cards/*`.\n\n"
        "- `librivox-*`: LibriVox reading of Jane Austen, *Sense and Sensibility*, chapter 1: public domain "
        "(https://librivox.org/pages/public-domain/).\n"
        "- `cards-*`: CMU Sphinx test recordings, under the pocketsphinx licence (LICENSE.pocketsphinx, "
        "BSD-style, Copyright (c) 1999-2016 Carnegie Mellon University).\n")
    (out / ".complete").write_text(SDIST_SHA256 + "\n")
    return out


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "fetch"
    out = cache_dir()
    if command == "path":
        if not is_complete(out):
            print(f"not fetched: run `python recipes/tools/real_recordings.py fetch` (make install does) -> {out}",
                  file=sys.stderr)
            return 1
        print(out)
        return 0
    if command == "fetch":
        print(fetch(out))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
