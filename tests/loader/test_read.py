"""The shard loader reading Hugging Face parquet files listed in a data.list directly (issue 32): each file a unit,
with the promises of tar shards (exact partition across ranks and workers, each key once per epoch, exact
mid-epoch resume, broken files skipped and counted or named)."""

from __future__ import annotations

import pytest

from corpus_io.config import MakeDatalistConfig
from corpus_io.errors import DataError
from corpus_io.loader.dataset import build_dataloader
from corpus_io.shards.datalist import make_datalist
from corpus_io.tokenizer import build_tokenizer
from tests.loader_data import interrupted_epoch, make_hf_parquet, small_conf, token_list


@pytest.fixture(scope="module")
def parquet_list(tmp_path_factory):
    """A data.list of 4 parquet files (40 utterances, row groups of 4) written by ``datasets``."""
    root = tmp_path_factory.mktemp("pq")
    data, utts = make_hf_parquet(root, num_files=4, row_group=4)
    out = root / "data.list"
    make_datalist(MakeDatalistConfig(data_type="shard", input=[str(data)], output=str(out)))
    return out, utts, build_tokenizer(token_list(root))


def _epoch(loader, epoch: int) -> list[tuple[str, str]]:
    loader.set_epoch(epoch)
    return [(k, t) for batch in loader for k, t in zip(batch["keys"], batch["txt"])]


def test_ranks_and_workers_read_each_parquet_row_once_per_epoch_with_its_text(parquet_list):
    data_list, utts, tok = parquet_list
    want = sorted((k, t) for k, (_, t) in utts.items())
    for epoch in (0, 1):
        per_rank = [_epoch(build_dataloader(str(data_list), small_conf(), tok, train=True, rank=rank, world_size=2),
                           epoch) for rank in range(2)]
        assert sorted(per_rank[0] + per_rank[1]) == want  # each key once, none missing, texts as written
        assert per_rank[0] and per_rank[1]


def test_a_parquet_list_resumes_mid_epoch_exactly(parquet_list):
    data_list, utts, tok = parquet_list
    first, rest, resumed = interrupted_epoch(
        lambda: build_dataloader(str(data_list), small_conf(), tok, train=True, rank=0, world_size=1),
        epoch=1, batches=4)
    assert len(first) + len(rest) == len(utts) and sorted(first + rest) == sorted(utts)  # none twice or lost
    assert resumed.counts().get("resume.reread", 0) <= len(first)  # only the files still open are read again


def test_a_resumed_parquet_file_is_read_from_the_row_group_of_its_first_needed_row(parquet_list, monkeypatch):
    """A checkpoint in the middle of a parquet file: the resumed reader seeks to the row group holding the first row
    it still needs (its lowest pending row, or the one after the cursor), instead of reading the file again from
    its first row group; the epoch still reads every key once."""
    from corpus_io.tables.parquet import ParquetFileReader
    from tests.loader_data import epoch_keys, read_then_checkpoint

    data_list, utts, tok = parquet_list
    conf = small_conf(num_workers=0, shuffle=False)  # in process and in file order: the reads are seen here

    def make():
        return build_dataloader(str(data_list), conf, tok, train=True, rank=0, world_size=1)

    read: list[tuple[str, int]] = []
    group = ParquetFileReader._group

    def counting(self, g, audio):
        read.append((self.url, g))
        return group(self, g, audio)

    monkeypatch.setattr(ParquetFileReader, "_group", counting)
    first, state = read_then_checkpoint(make(), 0, 4)  # 16 rows: file 1's 10, then 6 of file 2 (groups of 4)
    before, read[:] = list(read), []
    resumed = make()
    resumed.load_state_dict(state)
    rest = epoch_keys(resumed)
    assert sorted(first + rest) == sorted(utts)  # every key once
    done, open_file = list(dict.fromkeys(url for url, _ in before))[:2]
    assert not [r for r in read if r[0] == done], read  # a file trained whole is not opened again
    assert (open_file, 0) in before and (open_file, 0) not in read, read  # the open one: from its needed group on
    assert any(url == open_file for url, _ in read)


def test_a_truncated_parquet_file_in_a_list_is_skipped_and_counted_or_named(parquet_list, tmp_path):
    data_list, utts, tok = parquet_list
    files = data_list.read_text().split()
    broken = tmp_path / "train-00001-of-00004.parquet"
    broken.write_bytes(open(files[1], "rb").read()[:3000])
    listed = tmp_path / "data.list"
    listed.write_text("\n".join([files[0], str(broken), *files[2:]]) + "\n")  # no index: by count
    loader = build_dataloader(str(listed), small_conf(on_error="skip"), tok, train=True, rank=0, world_size=1)
    got = [k for k, _ in _epoch(loader, 0)]
    assert sorted(got) == sorted(list(utts)[:10] + list(utts)[20:]) and loader.counts()["unreadable shards"] == 1
    failing = build_dataloader(str(listed), small_conf(on_error="fail"), tok, train=True, rank=0, world_size=1)
    with pytest.raises(DataError, match=r"train-00001-of-00004.parquet is not a readable parquet file"):
        _epoch(failing, 0)


# --------------------------------------------------------------------------- the list and index over a failing server


@pytest.fixture
def flaky_list(tmp_path):
    """A data.list + index.jsonl of 2 shards on a real HTTP server on 127.0.0.1 that answers 503 to the first
    ``server.failures[name]`` GETs of a file name, then serves it; ``server.gets`` counts GETs per name."""
    import functools
    import threading
    from collections import Counter
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
    from pathlib import Path

    from corpus_io.shards.index import load_index, write_list_and_index
    from tests.loader_data import make_shards

    class Flaky(SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            name = self.path.rsplit("/", 1)[-1]
            self.server.gets[name] += 1
            if self.server.failures.get(name, 0) > 0:
                self.server.failures[name] -= 1
                self.send_error(503, "try again")
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    www = tmp_path / "www"
    _, keys = make_shards(www / "shards", sizes=[3, 5])
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Flaky, directory=str(www)))
    server.gets, server.failures = Counter(), {}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    entries = [dict(e, path=f"{base}/shards/{Path(e['path']).name}")
               for e in load_index(www / "shards" / "data.list").values()]
    write_list_and_index(www / "list" / "data.list", entries)
    try:
        yield f"{base}/list/data.list", keys, server, build_tokenizer(token_list(tmp_path))
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.network
def test_a_data_list_and_index_that_fail_at_first_are_retried_like_shards_and_read_whole(flaky_list):
    url, keys, server, tok = flaky_list
    server.failures.update({"data.list": 2, "index.jsonl": 1})
    conf = small_conf(num_workers=0, retries=4, retry_backoff=0.01)
    loader = build_dataloader(url, conf, tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    assert sorted(k for batch in loader for k in batch["keys"]) == sorted(keys)
    assert server.failures == {"data.list": 0, "index.jsonl": 0}  # every failure was met and retried
    assert server.gets["data.list"] >= 3 and server.gets["index.jsonl"] >= 2


@pytest.mark.network
def test_an_outage_reading_the_data_list_says_wait_or_retry_not_skip_in_one_paragraph(flaky_list):
    from tests.conftest import assert_user_error, run_cli

    url, keys, server, tok = flaky_list
    server.failures["data.list"] = 10**6  # down for good
    with pytest.raises(DataError) as err:
        build_dataloader(url, small_conf(num_workers=0, retries=3, retry_backoff=0.01), tok, train=True, rank=0,
                         world_size=1)
    message = str(err.value)
    assert url in message and "HTTP 503" in message and "after 3 attempt(s)" in message, message
    assert "Wait until it answers and rerun" in message and "dataset_conf.retries" in message, message
    assert "on_error" not in message and "skip" not in message and "\n" not in message, message
    assert server.gets["data.list"] == 3
    result = run_cli("corpus-io", "bench-loader", f"++data_list={url}", "++dataset_conf.num_workers=0",
                     "++dataset_conf.retries=2", "++dataset_conf.retry_backoff=0.01", f"++tokenizer.token_list="
                     f"{tok.conf.token_list}", timeout=120, env={"OMP_NUM_THREADS": "1"})
    assert_user_error(result, f"data list {url} (or its index sidecar) could not be read after 2 attempt(s)")
    assert "on_error" not in result.stderr
