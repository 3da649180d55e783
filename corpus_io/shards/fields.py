"""Companion field files: per-shard side files that add data without rewriting the shard.

Next to ``shard-000123.tar`` (see docs/FORMAT.md, "Companion fields"):

* ``shard-000123.<field>.tar``: one member per utterance, in the main shard's order:
  ``<safe_key>.npy`` (``numpy.save`` bytes) or ``<safe_key>.missing`` (0 bytes, an explicit
  placeholder for an utterance without a value);
* ``shard-000123.<field>.jsonl.gz``: one line per utterance, ``{"key": k, "<field>": value}``;
  ``null`` is the placeholder;
* ``shard-000123.meta.jsonl.gz``: the metadata companion, ``{"key", "txt", "meta"}`` per utterance
  (``meta`` is the ``.json`` member). With it, a loader that does not need audio never touches the
  main tar, so no audio byte is fetched (local, http or s3).

:func:`open_shard_fields` reads a shard's fields in lockstep and checks every key;
:func:`corpus_io.shards.add_field.add_field` (``corpus-io add-field``) writes companion files and
records them in the index.
This module imports no torch at import time.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import zlib
from typing import Any, Iterator

from corpus_io.errors import ConfigError, DataError
from corpus_io.shards.format import AUDIO_EXTS, key_from_member_name, shard_stem, split_member
from corpus_io.shards.reader import DEFAULT_MAX_MEMBER_BYTES
from corpus_io.storage.files import (
    parse_json_object,
)

META = "meta"
MISSING_EXT = "missing"
#: names read from the main shard itself (or from the meta companion for txt/meta)
MAIN_FIELDS = frozenset({"key", "txt", "json", "meta", "audio", "npy", *AUDIO_EXTS})
_AUDIO_FIELDS = frozenset({"audio", "npy", *AUDIO_EXTS})
_FIELD_NAME = re.compile(r"[A-Za-z0-9_]+")
KINDS = ("tar", "jsonl.gz")


# --------------------------------------------------------------------------- names


def check_field_name(name: str) -> None:
    if not _FIELD_NAME.fullmatch(name or "") or name in MAIN_FIELDS or name == MISSING_EXT:
        raise ConfigError(f"'{name}' cannot be a companion field name: use letters, digits and '_' only, and "
                          f"none of {', '.join(sorted(MAIN_FIELDS | {MISSING_EXT}))} (those are the main shard's "
                          f"members). Example: ++field=fbank or ++field=speaker.")


def companion_url(shard_url: str, field_name: str, kind: str) -> str:
    """``.../shard-000123.tar`` (or ``.tar.gz``) -> ``.../shard-000123.<field>.<kind>`` (kind: tar or jsonl.gz)."""
    return f"{shard_stem(shard_url)}.{field_name}.{kind}"


def meta_url(shard_url: str) -> str:
    return companion_url(shard_url, META, "jsonl.gz")


def _exists(url: str, storage_options: dict | None) -> bool:
    from corpus_io.storage.urls import is_remote, local_path

    if not is_remote(url):
        return os.path.isfile(local_path(url))
    import fsspec

    from corpus_io.storage.urls import _storage_options

    fs, path = fsspec.core.url_to_fs(url, **_storage_options(url, storage_options))
    try:
        return bool(fs.exists(path))
    except (OSError, ValueError):
        return False


def _companion_of(shard_url: str, name: str, entry: dict | None, storage_options: dict | None) -> tuple[str, str]:
    """(url, kind) of field ``name`` of a shard: from the index entry when it lists it, else by probing."""
    info = ((entry or {}).get("fields") or {}).get(name)
    if info and info.get("kind") in KINDS:
        return companion_url(shard_url, name, info["kind"]), info["kind"]
    for kind in KINDS:
        url = companion_url(shard_url, name, kind)
        if _exists(url, storage_options):
            return url, kind
    raise DataError(f"shard {shard_url} has no companion file for field '{name}' (looked for "
                    f"{companion_url(shard_url, name, 'tar')} and {companion_url(shard_url, name, 'jsonl.gz')}). "
                    f"Create it with corpus-io add-field ++input=<data.list> ++field={name}, or remove "
                    f"'{name}' from dataset_conf.fields.")


# --------------------------------------------------------------------------- reading


def iter_meta_companion(url: str, *, shard_url: str, storage_options: dict | None = None) -> Iterator[dict]:
    """Samples ``{key, txt, meta, __url__, __pos__}`` of a ``.meta.jsonl.gz`` companion."""
    for pos, rec in enumerate(_iter_jsonl_gz(url, storage_options)):
        if not isinstance(rec.get("key"), str) or not isinstance(rec.get("txt"), str):
            raise DataError(f"{url}: line {pos + 1} needs a string 'key' and 'txt'; the metadata companion is "
                            f"damaged. Delete it and re-run corpus-io add-field.")
        meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
        yield {"key": rec["key"], "txt": rec["txt"], "meta": meta, "__url__": shard_url, "__pos__": pos}


def iter_json_objects(lines: Any, where: str, hint: str) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of each non-blank line; anything else is a DataError with ``hint``."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        yield lineno, parse_json_object(line, f"{where}:{lineno}", hint)


def _iter_jsonl_gz(url: str, storage_options: dict | None) -> Iterator[dict]:
    from corpus_io.storage.urls import open_url

    with open_url(url, storage_options=storage_options) as raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
        try:
            for _, rec in iter_json_objects(f, url, "the companion file is damaged: delete it and re-run "
                                                "corpus-io add-field."):
                yield rec
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise DataError(f"{url}: not a complete gzip file ({exc}); delete it and re-run corpus-io add-field.") \
                from None


def iter_main_without_audio(url: str, *, storage_options: dict | None = None, allow_pipe: bool = False,
                            max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES) -> Iterator[dict]:
    """Samples ``{key, txt, meta, __url__, __pos__}`` of a main shard, never buffering an audio payload.

    A local shard is read with seeks, so audio bytes are not read at all. A remote or piped shard
    is a forward-only stream: audio members are read past in small blocks and discarded (never
    buffered whole), so their bytes still cross the network. The meta companion avoids that.
    """
    from corpus_io.shards.reader import group_samples, iter_tar_members
    from corpus_io.storage.urls import open_url

    f = open_url(url, storage_options=storage_options, allow_pipe=allow_pipe)
    try:
        members = iter_tar_members(f, url=url, max_member_bytes=max_member_bytes,
                                   skip_payload=lambda name: split_member(name)[1] not in ("txt", "json"))
        for sample in group_samples(members, url=url):
            yield _without_payloads(sample)
    finally:
        f.close()


def _without_payloads(sample: dict) -> dict:
    for name in [k for k in sample if k in _AUDIO_FIELDS or k == "audio_format"]:
        del sample[name]
    return sample


def _iter_tar_field(url: str, name: str, storage_options: dict | None,
                    max_member_bytes: int) -> Iterator[tuple[str, Any]]:
    from corpus_io.shards.reader import iter_tar_members
    from corpus_io.storage.urls import open_url

    with open_url(url, storage_options=storage_options) as f:
        for member, data in iter_tar_members(f, url=url, max_member_bytes=max_member_bytes):
            prefix, ext = split_member(member)
            try:
                key = key_from_member_name(prefix)
            except UnicodeDecodeError:
                key = prefix
            yield key, (None if ext == MISSING_EXT else data)


def _iter_jsonl_field(url: str, name: str, storage_options: dict | None) -> Iterator[tuple[str, Any]]:
    for rec in _iter_jsonl_gz(url, storage_options):
        yield str(rec.get("key")), rec.get(name)


def open_shard_fields(url: str, fields: list[str] | tuple[str, ...], index_entry: dict | None = None, *,
                      storage_options: dict | None = None, allow_pipe: bool = False,
                      max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES) -> Iterator[dict]:
    """Samples of shard ``url`` with only ``fields`` read, companions in lockstep with the main keys.

    ``fields`` names main-shard members (``txt``, ``meta``, ``audio``/``wav``/..., ``npy``) and
    companion fields (``fbank``, ``speaker``, ...). Without audio or ``npy`` in ``fields`` the keys,
    ``txt`` and ``meta`` come from the meta companion when it exists (the main tar is not opened), else
    from the main tar with audio payloads skipped. Each companion field adds ``sample[<field>]``:
    bytes (tar) or the JSON value (jsonl.gz); ``None`` for the explicit missing placeholder.
    A companion whose key at some position differs from the main shard's, or which is shorter or longer,
    raises :class:`DataError` naming the shard, the field file, the position and both keys.
    """
    from corpus_io.shards.reader import read_shard

    fields = list(fields)
    companions = [f for f in fields if f not in MAIN_FIELDS]
    so = storage_options
    if any(f in _AUDIO_FIELDS for f in fields):
        base = read_shard(url, storage_options=so, max_member_bytes=max_member_bytes, allow_pipe=allow_pipe)
    elif _has_meta(url, index_entry, so):
        base = iter_meta_companion(meta_url(url), shard_url=url, storage_options=so)
    else:
        base = iter_main_without_audio(url, storage_options=so, allow_pipe=allow_pipe,
                                       max_member_bytes=max_member_bytes)
    with contextlib.ExitStack() as stack:
        stack.callback(getattr(base, "close", lambda: None))
        streams = []
        for name in companions:
            curl, kind = _companion_of(url, name, index_entry, so)
            it = (_iter_tar_field(curl, name, so, max_member_bytes) if kind == "tar"
                  else _iter_jsonl_field(curl, name, so))
            stack.callback(it.close)
            streams.append((name, curl, it))
        pos = -1
        for pos, sample in enumerate(base):
            for name, curl, it in streams:
                got = next(it, None)
                if got is None:
                    raise DataError(f"shard {url}: field file {curl} ends after {pos} entries, but the shard has "
                                    f"more (expected key '{sample['key']}' at position {pos}). The field file is "
                                    f"incomplete or belongs to another shard: delete it and re-run corpus-io "
                                    f"add-field ++field={name}.")
                if got[0] != sample["key"]:
                    raise DataError(f"shard {url}: field file {curl} is out of step at position {pos}: expected "
                                    f"key '{sample['key']}', found '{got[0]}'. Companion files must list exactly "
                                    f"the shard's keys in the shard's order: delete it and re-run corpus-io "
                                    f"add-field ++field={name}.")
                sample[name] = got[1]
            yield sample
        for name, curl, it in streams:
            extra = next(it, None)
            if extra is not None:
                raise DataError(f"shard {url}: field file {curl} has more entries than the shard ({pos + 1}); "
                                f"the first extra key is '{extra[0]}' at position {pos + 1}. Delete it and re-run "
                                f"corpus-io add-field ++field={name}.")


def _has_meta(url: str, entry: dict | None, storage_options: dict | None) -> bool:
    if entry is not None and META in (entry.get("fields") or {}):
        return True
    return _exists(meta_url(url), storage_options)

