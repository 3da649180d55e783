"""``corpus-io explore`` on a simulated 10M-utterance catalog: first page, every sort and filter, server RSS.

The catalog is simulated, not scanned: DuckDB writes ``base.parquet`` (the scan's output: keys, 10,000
shards of 1,000 members with offsets, durations 1-16 s, texts of 3-14 words from a 20,000-word vocabulary
with some CJK and a duplicate every 50th row, 20,000 speakers) and a decode run's per-utterance results;
then the real :func:`corpus_io.explore.catalog.build_table` derives the table the server reads (ranks,
chars, cps, duplicate counts, vocabulary). The server is the real one (``make_server`` over ``Explorer``)
in a child process; every figure is an HTTP request from this process, JSON included, one at a time.

Targets (issue 24): first page < 1 s after the catalog exists, any sort or filter < 300 ms, server RSS < 1 GB.
``BENCH_EXPLORE_N`` sets the number of utterances (default 10,000,000); the catalog is cached under bench/out/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.common import OUT, sized

N = sized(int(os.environ.get("BENCH_EXPLORE_N", "10000000")), 5000)
PER_SHARD = 1000


def simulate(cache: Path, n: int) -> float:
    """Write the simulated ``base.parquet`` and decode results, then the real table; returns build seconds."""
    from corpus_io.explore.catalog import build_table
    from corpus_io.explore.engine import connect

    cache.mkdir(parents=True, exist_ok=True)
    if (cache / "table.parquet").is_file():
        return float(json.loads((cache / "sim.json").read_text())["build_s"])
    t0 = time.perf_counter()
    if (cache / "run-sim.parquet").is_file():  # the simulated scan exists: rebuild only the table
        build_table(cache, [cache / "run-sim.parquet"])
        seconds = time.perf_counter() - t0
        (cache / "sim.json").write_text(json.dumps({"n": n, "build_s": seconds}))
        return seconds
    con = connect(cache, "2GB")
    word = "'w' || (hash(i * {k} + {k}) % 20000)::VARCHAR"
    words = " || ' ' || ".join(word.format(k=k) for k in range(1, 15))
    con.execute(f"""COPY (SELECT (i // {PER_SHARD})::INTEGER AS shard_id, (i % {PER_SHARD})::BIGINT AS pos,
        'spk' || (i % 20000)::VARCHAR || '-utt' || lpad(i::VARCHAR, 9, '0') AS key,
        'spk' || (i % 20000)::VARCHAR || '-utt' || lpad(i::VARCHAR, 9, '0') || '.wav' AS member,
        ((i % {PER_SHARD}) * 260000 + 1536)::BIGINT AS audio_offset, (32044 + hash(i) % 480000)::BIGINT AS audio_size,
        'wav' AS audio_format, NULL::VARCHAR AS source, NULL::DOUBLE AS seg_start, NULL::DOUBLE AS seg_end,
        1.0 + (hash(i) % 15000) / 1000.0 AS duration, 16000 AS sample_rate,
        CASE WHEN i % 50 = 0 THEN 'yes' WHEN i % 7 = 0 THEN '今天天气很好 ' || {word.format(k=3)}
             ELSE array_to_string(list_slice(string_split({words}, ' '), 1, 3 + (hash(i * 31) % 12)::INTEGER), ' ')
        END AS text,
        'spk' || (i % 20000)::VARCHAR AS speaker, NULL::VARCHAR AS extra, NULL::VARCHAR AS error
        FROM range({n}) t(i)) TO '{cache / "base.parquet"}' (FORMAT parquet, COMPRESSION zstd)""")
    con.execute(f"""COPY (SELECT key, text AS hyp, (hash(row_number() OVER ()) % 1000) / 2000.0 AS cer,
        0 AS char_errors, 0 AS chars_ref, (hash(pos * 7) % 1000) / 1500.0 AS wer, 0 AS word_errors, 0 AS words_ref,
        0.9 AS wmr FROM '{cache / "base.parquet"}') TO '{cache / "run-sim.parquet"}' (FORMAT parquet)""")
    con.close()
    build_table(cache, [cache / "run-sim.parquet"])
    seconds = time.perf_counter() - t0
    (cache / "sim.json").write_text(json.dumps({"n": n, "build_s": seconds}))
    return seconds


def serve(cache: str) -> None:
    """The child: the real server over the simulated catalog; prints its port, serves until killed."""
    from corpus_io.explore.catalog import Catalog, Shard
    from corpus_io.explore.query import Explorer
    from corpus_io.explore.server import make_server

    n = json.loads((Path(cache) / "sim.json").read_text())["n"]
    shards = [Shard(f"s3://sim/shard-{i:06d}.tar") for i in range(-(-n // PER_SHARD))]
    catalog = Catalog("simulated", "shard", Path(cache), shards, runs=["sim"])
    server = make_server(Explorer(catalog), "127.0.0.1", 0)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def get(url: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:  # noqa: S310 - loopback
        body = json.loads(r.read())
    return time.perf_counter() - t0, body


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


DEEP_PAGE = min(10_000, N // 50 - 1)  # of 50-row pages; a page past the last is a 400

REQUESTS = [("sort " + c + (" desc" if d else ""), f"sort={c}&desc={int(d)}")
            for c in ("key", "text", "speaker", "shard", "duration", "chars", "cps", "text_count", "cer", "wer")
            for d in (False, True)] + [
    ("filter duration 3-4 s", "dur_min=3&dur_max=4"),
    ("filter duration 3-4 s, sort text", "dur_min=3&dur_max=4&sort=text"),
    ("filter speaker", "speaker=spk1234"),
    ("filter shard", f"shard={min(4321, N // PER_SHARD - 1)}"),
    ("filter CER >= 0.45", "cer_min=0.45"),
    ("filter chars/s 20-25", "cps_min=20&cps_max=25"),
    ("filter duplicate text", "flag=duplicate"),
    ("filter empty text", "flag=empty"),
    ("filter key contains", "key=utt000123"),
    ("filter text regex (literal)", "text=w123%20w4"),
    ("filter text regex (class)", "text=%5Ew1%5B0-9%5D%2B%20w2"),
    ("filter text regex + sort duration", "text=w123%20w4&sort=duration&desc=1"),
    (f"page {DEEP_PAGE} of a sort", f"sort=duration&page={DEEP_PAGE}"),
    ("histogram duration", None),
]


def main() -> None:
    cache = OUT / f"explore{N}"
    build_s = simulate(cache, N)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    child = subprocess.Popen([sys.executable, "-m", "bench.bench_explore", "--serve", str(cache)],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        base = f"http://127.0.0.1:{child.stdout.readline().strip()}"
        first, body = get(base + "/api/rows?size=50")
        start_to_first = time.perf_counter() - t0
        print(f"explore bench: {body['total']:,} utterances, catalog built in {build_s:.0f} s "
              f"({(cache / 'table.parquet').stat().st_size / 1e6:.0f} MB table)")
        print(f"{'first page (server start -> 50 rows)':45s} {1000 * start_to_first:8.0f} ms   target < 1000 ms")
        print(f"{'first page request alone':45s} {1000 * first:8.0f} ms")
        took, _ = get(base + "/api/info")
        print(f"{'page info (row count, runs, shards)':45s} {1000 * took:8.0f} ms")
        took, _ = get(base + "/api/dataset")
        print(f"{'dataset view (totals, shards, vocabulary)':45s} {1000 * took:8.0f} ms")
        took, _ = get(base + f"/api/row/{body['total'] // 2}")
        print(f"{'one row (all fields)':45s} {1000 * took:8.0f} ms")
        worst = 0.0
        results = {}
        for name, query in REQUESTS:
            path = "/api/hist?column=duration&bins=40" if query is None else f"/api/rows?size=50&{query}"
            get(base + path)  # warm: the OS page cache, as a user's second click finds it
            took, body = get(base + path)
            worst = max(worst, took) if query is not None else worst
            results[name] = took
            total = body.get("total", sum(body.get("counts", [])))
            flag = "" if took < 0.3 else "  (over 300 ms)"
            print(f"{name:45s} {1000 * took:8.0f} ms   {total:>11,} rows{flag}")
        rss = peak_rss_mb(child.pid)
        print(f"{'slowest sort/filter':45s} {1000 * worst:8.0f} ms   target < 300 ms")
        print(f"{'server peak RSS':45s} {rss:8.0f} MB   target < 1024 MB")
    finally:
        child.terminate()
        child.wait()
        child.stdout.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        main()
