"""Raw mode: a JSONL list indexed by byte offsets (never Python objects), WeNet and FunASR keys."""

from __future__ import annotations

import json
import os

import numpy as np
import psutil
import pytest

from corpus_io.errors import DataError
from corpus_io.loader.dataset import build_dataloader
from corpus_io.loader.rawlist import RawList
from corpus_io.tokenizer import build_tokenizer
from tests.loader_data import FIXTURE, REPO, make_raw, small_conf, token_list


@pytest.mark.parametrize("wenet", [True, False])
def test_raw_list_with_wenet_or_funasr_keys_loads_every_utterance_once(tmp_path, wenet):
    raw, keys = make_raw(tmp_path, copies=2, wenet=wenet)
    tok = build_tokenizer(token_list(tmp_path))
    loader = build_dataloader(str(raw), small_conf(data_type="raw"), tok, train=True, rank=0, world_size=1)
    loader.set_epoch(0)
    got = [k for batch in loader for k in batch["keys"]]
    assert sorted(got) == sorted(keys)
    assert (tmp_path / "raw.list.idx").is_file()


def test_raw_segments_are_cut_by_start_and_end(tmp_path):
    long_wav = REPO / (FIXTURE / "segments_dir" / "wav.scp").read_text().split()[1]
    path = tmp_path / "seg.list"
    path.write_text("".join(json.dumps({"key": f"s{i}", "wav": str(long_wav), "txt": "one two",
                                        "start": 1.0 * i, "end": 1.0 * i + 0.5}) + "\n" for i in range(3)))
    loader = build_dataloader(str(path), small_conf(data_type="raw", num_workers=0), None, train=False, rank=0,
                              world_size=1)
    lengths = [int(n) for batch in loader for n in batch["feats_lengths"]]
    assert len(lengths) == 3 and all(48 <= n <= 50 for n in lengths)


def test_index_is_int64_offsets_cached_beside_the_list_and_rebuilt_when_it_changes(tmp_path):
    path = tmp_path / "a.list"
    path.write_text('{"key": "a", "wav": "x.wav", "txt": "t"}\n\n{"key": "b", "source": "y.wav"}\n')
    lst = RawList(path)
    assert len(lst) == 2 and lst.offsets.dtype == np.int64
    assert lst.record(1)["key"] == "b" and lst.record(0)["target"] == "t"
    with open(path, "a") as f:
        f.write('{"key": "c", "wav": "z.wav", "txt": "u"}\n')
    os.utime(path, ns=(1, 1))
    assert len(RawList(path)) == 3


def test_a_bad_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.list"
    path.write_text('{"key": "a", "wav": "x.wav"}\n{"key": "b"\n')
    with pytest.raises(DataError, match=r"bad.list:2"):
        RawList(path).record(1)


def test_one_million_lines_cost_offsets_not_python_objects(tmp_path):
    path = tmp_path / "big.list"
    line = '{"key": "utt%07d", "wav": "/data/wav/utt%07d.wav", "txt": "one two three four"}\n'
    with open(path, "w") as f:
        for start in range(0, 1_000_000, 100_000):
            f.write("".join(line % (i, i) for i in range(start, start + 100_000)))
    proc = psutil.Process()
    before = proc.memory_info().rss
    lst = RawList(path)
    again = RawList(path)  # from the cached .idx, memory-mapped
    grown = proc.memory_info().rss - before
    assert len(again) == 1_000_000 and again.record(999_999)["key"] == "utt0999999"
    assert isinstance(again.offsets.base, np.memmap) or isinstance(again.offsets, np.memmap)
    assert grown < 40 * 1024 * 1024, f"1M lines grew RSS by {grown / 2**20:.0f} MB"
    del lst


def test_a_list_of_jsonl_paths_reads_as_their_concatenation_and_names_each_files_lines(tmp_path):
    (tmp_path / "sub").mkdir()
    a = tmp_path / "a.jsonl"
    a.write_text('{"key": "a1", "source": "x.wav"}\n\n{"key": "a2", "source": "y.wav"}\n', encoding="utf-8")
    (tmp_path / "sub" / "b.jsonl").write_text('{"key": "b1", "source": "z.wav"}\nnot json\n', encoding="utf-8")
    lst = tmp_path / "multi.list"
    lst.write_text(f"{a}\nsub/b.jsonl\n")  # absolute, and relative to the list
    raw = RawList(lst)
    assert len(raw) == 4
    assert [raw.record(i)["key"] for i in range(3)] == ["a1", "a2", "b1"]
    with pytest.raises(DataError, match=r"sub/b.jsonl:2: not valid JSON"):
        raw.record(3)
    lst.write_text(f"{a}\nmissing.jsonl\n")
    with pytest.raises(DataError, match=r"multi.list:2: 'missing.jsonl' is not a file"):
        RawList(lst)
    lst.write_text("shards/shard-000000.tar\n")
    with pytest.raises(DataError, match=r"is a shard.*data_type=shard"):
        RawList(lst)


def test_the_line_permutation_is_computed_chunk_by_chunk_without_holding_it():
    from corpus_io.loader.rawlist import permuted_lines

    for n in (1, 2, 5, 1000, 12_345):
        whole = permuted_lines(n, 0, n, seed=7, epoch=1, shuffle=True)
        assert sorted(whole.tolist()) == list(range(n))  # a permutation: every line exactly once
        pieces = np.concatenate([permuted_lines(n, a, min(n, a + 333), seed=7, epoch=1, shuffle=True)
                                 for a in range(0, n, 333)])
        assert (pieces == whole).all()  # any chunk of it alone, in O(chunk) memory
    a, b = (permuted_lines(12_345, 0, 12_345, seed=7, epoch=e, shuffle=True) for e in (1, 2))
    assert (a != b).any() and (a != np.arange(12_345)).sum() > 12_000  # a new, thorough shuffle each epoch
    assert (permuted_lines(50, 0, 50, seed=7, epoch=1, shuffle=False) == np.arange(50)).all()


def test_raw_list_over_two_ranks_and_two_workers_reads_every_line_once_per_epoch(tmp_path):
    raw, keys = make_raw(tmp_path, copies=3)
    tok = build_tokenizer(token_list(tmp_path))
    orders = []
    for epoch in range(2):
        got = []
        for rank in range(2):
            loader = build_dataloader(str(raw), small_conf(data_type="raw"), tok, train=True, rank=rank, world_size=2)
            loader.set_epoch(epoch)
            got.append([k for batch in loader for k in batch["keys"]])
        assert sorted(got[0] + got[1]) == sorted(keys) and got[0] and got[1]
        orders.append(got)
    assert orders[0] != orders[1]


def test_parquet_given_to_the_raw_loader_is_refused_pointing_to_a_shard_list(tmp_path):
    """A parquet file, a directory of them or a list naming them, read as a raw list: one paragraph saying the audio
    is in the rows and how to list them as shards (no UnicodeDecodeError from reading parquet as text)."""
    from corpus_io.errors import ConfigError
    from tests.loader_data import make_hf_parquet

    data, _ = make_hf_parquet(tmp_path / "hf", num_utts=4, num_files=1)
    file = next(data.glob("*.parquet"))
    listed = tmp_path / "files.list"
    listed.write_text(f"{file}\n")
    for given, named in ((file, str(file)), (data, str(data)), (listed, f"{listed}:1: '{file}'")):
        with pytest.raises(ConfigError, match=rf"^{named} is Hugging Face parquet, .*make-datalist "
                                              rf"\+\+data_type=shard .*dataset_conf.data_type=shard"):
            RawList(given, cache=False)


def test_a_raw_list_asks_what_its_input_is_once_even_when_it_names_other_jsonl_files(tmp_path, monkeypatch):
    """Input detection runs once, at the first reader: a FunASR multi-file list's lines are told apart by their
    names (a .parquet or a shard line is refused), not detected again one by one."""
    from corpus_io.tables import parquet

    asked = []
    real = parquet.is_parquet
    monkeypatch.setattr(parquet, "is_parquet", lambda *a, **k: asked.append(a[0]) or real(*a, **k))
    names = []
    for i in range(3):
        part = tmp_path / f"part{i}.jsonl"
        part.write_text(f'{{"key": "k{i}", "source": "x{i}.wav", "target": "a"}}\n', encoding="utf-8")
        names.append(part.name)
    lst = tmp_path / "multi.list"
    lst.write_text("\n".join(names) + "\n")
    raw = RawList(lst, cache=False)
    assert [raw.record(i)["key"] for i in range(len(raw))] == ["k0", "k1", "k2"]
    assert asked == [str(lst)]


def test_a_kaldi_dir_read_as_a_raw_list_names_an_utterance_without_text_and_the_make_datalist_that_counts_it(
        tmp_path):
    data = tmp_path / "kaldi"
    data.mkdir()
    (data / "wav.scp").write_text("u1 a.wav\nu2 b.wav\n")
    (data / "text").write_text("u1 hello\n")
    with pytest.raises(DataError, match=r"u2.*make-datalist \+\+data_type=raw \+\+input=.*kaldi \+\+output"):
        RawList(data, cache=False)


def test_an_entry_is_read_from_the_index_it_was_opened_with_even_when_another_process_rebuilt_it(tmp_path):
    """record() reads an entry's offset with pread (issue 53: through the mmap, every worker kept the pages around
    each entry it read); a .idx replaced since (the list changed, another process rebuilt it) is not read: the
    offsets the list was opened with still are."""
    path = tmp_path / "a.list"
    path.write_text('{"key": "a", "wav": "x.wav"}\n{"key": "b", "wav": "y.wav"}\n')
    lst = RawList(path)
    assert lst._idx_at[0] is not None and lst.record(1)["key"] == "b"
    lst.close()
    path.write_text('{"key": "longer-key-a", "wav": "x.wav"}\n{"key": "c", "wav": "z.wav"}\n{"key": "d"}\n')
    os.utime(path, ns=(2, 2))
    assert len(RawList(path)) == 3  # rebuilt: a new .idx file in place of the one lst mapped
    assert lst._offset(0, 1) == int(lst.offsets[1]) == len('{"key": "a", "wav": "x.wav"}\n')
    assert lst._idx_at[0] is None  # the replaced file was seen and left alone
