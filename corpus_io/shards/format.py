"""The shard format: member names, grouping rule, audio sniffing and the ``.json`` metadata.

See ``docs/FORMAT.md`` for the contract. In short, a shard is an uncompressed tar in
which each utterance is adjacent members ``<name>.txt``, ``<name>.<audio ext>``,
``<name>.json`` (and optionally ``<name>.npy``), where ``<name>`` is the key with only what
breaks member grouping percent-encoded by :func:`safe_member_name` (dots, slashes, ``%``,
whitespace, control characters); Unicode letters and digits stay as they are.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import unquote

from corpus_io.audio.io import AUDIO_EXTENSIONS, sniff_audio_format  # noqa: F401 - the shard format's sniffing
from corpus_io.errors import DataError

AUDIO_EXTS: frozenset[str] = frozenset(AUDIO_EXTENSIONS)
#: Shard file names the scanners pick up: our tars, and WeNet's gzip-compressed tars (read alike).
SHARD_SUFFIXES: tuple[str, ...] = (".tar", ".tar.gz", ".tgz")
#: Extensions the grouping rule knows; a basename ending in one of these is split at its last dot.
KNOWN_EXTS: frozenset[str] = AUDIO_EXTS | {"txt", "json", "npy"}

# Fixed tar header fields: identical bytes on every machine and every run.
TAR_MTIME = 1704067200  # 2024-01-01T00:00:00Z (GNU tar warns about 1970 timestamps)
TAR_MODE = 0o644
TAR_UID = 0
TAR_GID = 0
TAR_UNAME = ""
TAR_GNAME = ""

_SAFE = re.compile(r"[A-Za-z0-9_\-]+")
#: Characters escaped in member names besides whitespace and control/format characters: ``.`` splits the
#: key (WeNet: last dot, WebDataset: first dot), slash and backslash are path separators, ``%`` is the escape.
_BREAKS_GROUPING = frozenset("./\\%")


def shard_name(prefix: str, index: int, compression: str = "none") -> str:
    """``<prefix>-000042.tar``, or ``<prefix>-000042.tar.gz`` with ``compression="gzip"``."""
    return f"{prefix}-{index:06d}.tar" + (".gz" if compression == "gzip" else "")


def shard_stem(name: str) -> str:
    """The name of a shard file without its shard suffix (``.tar``, ``.tar.gz``, ``.tgz``)."""
    for suffix in sorted(SHARD_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def shard_stem_pattern(prefix: str) -> str:
    """A regex matching the stem ``<prefix>-000042`` of :func:`shard_name` (for scanning a directory)."""
    return rf"{re.escape(prefix)}-\d{{6}}"


def _must_escape(c: str) -> bool:
    return c in _BREAKS_GROUPING or c.isspace() or unicodedata.category(c)[0] == "C"


def _escape(c: str) -> str:
    return "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))


def safe_member_name(key: str) -> str:
    """The member-name stem of ``key``: the key itself, with only what breaks member grouping escaped.

    ``.``, slash, backslash, ``%``, whitespace and control/format characters become ``%XX`` per UTF-8 byte;
    everything else, Unicode letters and digits included, is kept (``中文004`` stays ``中文004``, so
    WeNet's reader, which keys samples by member name, sees the original key). The result has no dot
    and no slash, so WeNet (last dot) and WebDataset (first dot) group the members under the same key;
    the mapping is reversible (:func:`key_from_member_name`) and injective, since ``%`` itself is escaped.
    Shards written before (every non-ASCII byte escaped) decode with the same inverse.
    """
    if not key:
        raise DataError("an utterance has an empty key; every utterance needs a non-empty key.")
    if _SAFE.fullmatch(key):
        return key
    return "".join(_escape(c) if _must_escape(c) else c for c in key)


def legacy_member_name(key: str) -> str:
    """The stem shards packed before issue 13 used: every character outside ``[A-Za-z0-9_-]`` escaped."""
    return key if _SAFE.fullmatch(key) else "".join(c if _SAFE.fullmatch(c) else _escape(c) for c in key)


def key_from_member_name(stem: str) -> str:
    """Inverse of :func:`safe_member_name`, for current and older shards (used only when a sample has no
    ``.json``)."""
    return unquote(stem, errors="strict") if "%" in stem else stem


def split_member(name: str) -> tuple[str, str]:
    """``(prefix, field)`` of a member name: the grouping rule shared by our reader and verifier.

    The basename (after the last ``/``) is split at its **last** dot when the text after it is a
    known extension (txt, json, npy, wav, flac, ogg, opus, mp3, ...), so WeNet keys that contain
    dots (``a.b.wav`` -> ``a.b``) group as WeNet groups them. Otherwise it is split at the
    **first** dot, WebDataset's rule (``k.seg.cls`` -> ``k`` / ``seg.cls``). Our own names have no
    dot in the stem, so both rules agree on them. A name without a dot has field ``""``.
    """
    base = name.rsplit("/", 1)[-1]
    head, dot, last = base.rpartition(".")
    if dot and last.lower() in KNOWN_EXTS and head:
        return head, last.lower()
    head, dot, rest = base.partition(".")
    return head, rest.lower() if dot else ""


