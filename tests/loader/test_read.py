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
