"""The explorer's storage helpers: DuckDB connections, SQL string literals, file stamps and JSON stamps
(what decides whether a cached Parquet file is still current). Cached files are data (Parquet, JSON),
never code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CATALOG_VERSION = 3


def file_stamp(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return ["missing"]
    return [st.st_size, st.st_mtime_ns]


def connect(cache_dir: Path, memory_limit: str = "1GB"):
    """An in-memory DuckDB whose memory is bounded; what does not fit spills under ``cache_dir`` (never the
    current directory, DuckDB's default)."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET memory_limit='{memory_limit}'")
    con.execute(f"SET temp_directory={sql_str(Path(cache_dir) / '.duckdb-tmp')}")
    con.execute("SET preserve_insertion_order=false")
    return con


def sql_str(text: str | os.PathLike) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def read_stamp(path: Path) -> dict | None:
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
        return stamp if isinstance(stamp, dict) and stamp.get("version") == CATALOG_VERSION else None
    except (OSError, ValueError):
        return None


def write_json(path: Path, obj: Any) -> None:
    from corpus_io.storage.files import atomic_write

    with atomic_write(path) as f:
        json.dump(obj, f, ensure_ascii=False)
