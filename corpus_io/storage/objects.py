"""Outputs on object storage (``s3://bucket/prefix``): whole objects only, each described by its metadata.

An object store has no rename, so the temp-name-then-rename protocol of :mod:`corpus_io.storage.files` becomes:
an output is made complete on local disk first, then sent in **one** request that creates the object
whole (:func:`put_object`: a single PUT, or a multipart upload, which S3 makes visible only when it
completes). No reader ever sees a final name half-written, and an upload killed midway leaves nothing
under the final name. The object carries its sha256 and the digest of the inputs it was made from in
its user metadata, so a rerun keeps an object whose size and metadata match (:func:`object_matches`)
without reading it back, and rewrites any other.

The hidden state a local output keeps beside it (sidecars, part records, the previous index) lives in a
local **state directory** instead (:func:`state_dir`: ``$CORPUS_IO_STATE_DIR/s3/<bucket>/<prefix>``, by
default under ``~/.cache/corpus-io/state``), so nothing but the shards, ``data.list``, ``index.jsonl`` and,
for jobs, their part records is written to the bucket: a job sends its record after its shards, and
``merge-jobs`` fetches the records from the bucket, so jobs on machines that share no disk merge anywhere.
Reads and writes use the readers' ``storage_options`` and AWS environment (:func:`corpus_io.storage.urls.filesystem`).
"""

from __future__ import annotations

import os

from corpus_io.errors import DataError
from corpus_io.storage.files import is_object_url, state_dir  # noqa: F401 - re-exported: where an output lives
from corpus_io.storage.urls import filesystem

SHA256_KEY = "sha256"  # user metadata (S3 lowercases the keys; x-amz-meta-sha256 on the wire)
DIGEST_KEY = "corpus-io-digest"


def join(url: str, *names: str) -> str:
    return "/".join([url.rstrip("/"), *(n.strip("/") for n in names if n)])


def _failed(url: str, what: str, exc: BaseException) -> DataError:
    return DataError(f"cannot {what} {url} ({type(exc).__name__}: {exc}). Check that the bucket exists and the "
                     f"credentials and endpoint (++storage_options, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
                     f"AWS_ENDPOINT_URL) allow it; rerunning the same command resumes.")


def put_object(local: str | os.PathLike, url: str, storage_options: dict | None = None, *, sha256: str,
               digest: str = "") -> None:
    """Send the complete local file ``local`` to ``url`` as one object (one PUT, or one multipart upload that
    becomes visible only when complete), with its sha256 and input digest as user metadata."""
    fs, path = filesystem(url, storage_options, fresh=True)
    metadata = {SHA256_KEY: sha256, **({DIGEST_KEY: digest} if digest else {})}
    try:
        fs.put_file(str(local), path, Metadata=metadata)
    except Exception as exc:  # noqa: BLE001 - botocore/aiohttp errors vary; all mean "not written"
        raise _failed(url, "write", exc) from None


def object_matches(url: str, storage_options: dict | None = None, *, size: int, sha256: str,
                   digest: str = "") -> bool:
    """Whether ``url`` exists with ``size`` bytes and the sha256 (and input digest) :func:`put_object` stored
    with it; an absent object is False, any other failure an error."""
    fs, path = filesystem(url, storage_options, fresh=True)
    bucket, key, _ = fs.split_path(path)
    try:
        head = fs.call_s3("head_object", Bucket=bucket, Key=key)
    except FileNotFoundError:
        return False
    except Exception as exc:  # noqa: BLE001
        raise _failed(url, "look up", exc) from None
    meta = {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}
    return (head.get("ContentLength") == size and meta.get(SHA256_KEY) == sha256
            and (not digest or meta.get(DIGEST_KEY) == digest))


def get_object(url: str, storage_options: dict | None = None) -> bytes:
    """The bytes of the (small) object ``url``."""
    fs, path = filesystem(url, storage_options, fresh=True)
    try:
        return fs.cat_file(path)
    except Exception as exc:  # noqa: BLE001
        raise _failed(url, "read", exc) from None


def object_sizes(url: str, storage_options: dict | None = None) -> dict[str, int]:
    """``{object URL: bytes}`` of every object under the prefix ``url`` (one listing, paged by the store)."""
    fs, path = filesystem(url, storage_options, fresh=True)
    fs.invalidate_cache()
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        return {}
    except Exception as exc:  # noqa: BLE001
        raise _failed(url, "list", exc) from None
    scheme = url.split("://", 1)[0]
    return {f"{scheme}://{p}": int(info.get("size") or 0) for p, info in found.items()}
