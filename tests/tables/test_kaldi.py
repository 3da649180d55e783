"""Kaldi tables: tolerant of formatting, strict about content."""

from __future__ import annotations

import pytest

from corpus_io.errors import DataError
from corpus_io.tables import kaldi


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_blank_lines_crlf_bom_tabs_and_space_runs_are_accepted(tmp_path):
    table = write(tmp_path / "text", b"\xef\xbb\xbfa \t hello world\r\n\r\n   \nb\tsecond  line \r\n\n")
    lines = list(kaldi.iter_table(table))
    assert [(x.key, x.value) for x in lines] == [("a", "hello world"), ("b", "second  line")]
    assert [x.lineno for x in lines] == [1, 4]


def test_duplicate_key_names_both_lines(tmp_path):
    table = write(tmp_path / "wav.scp", b"a x.wav\nb y.wav\n\na z.wav\n")
    with pytest.raises(DataError) as err:
        kaldi.check_unique_keys(table)
    assert f"{table}:1" in str(err.value) and f"{table}:4" in str(err.value) and "'a'" in str(err.value)
    with pytest.raises(DataError):
        kaldi.KeyedTable(table)


def test_invalid_utf8_names_file_and_line(tmp_path):
    table = write(tmp_path / "text", "a 好\n".encode() + "b 坏\n".encode("gbk"))
    with pytest.raises(DataError, match=r"text:2: invalid UTF-8"):
        list(kaldi.iter_table(table))


def test_key_without_value_is_an_error_with_its_line(tmp_path):
    table = write(tmp_path / "text", b"a hi\nlonely\n")
    with pytest.raises(DataError, match=r"text:2: key 'lonely' has no value"):
        list(kaldi.iter_table(table))


def test_keyed_table_finds_values_and_reports_unused_keys(tmp_path):
    lines = "".join(f"utt{i:05d} value {i}\n" for i in range(2000))
    table = kaldi.KeyedTable(write(tmp_path / "text", lines.encode()))
    assert len(table) == 2000
    assert table.get("utt01234") == "value 1234"
    assert table.get("missing") is None
    for i in range(0, 2000, 2):
        table.get(f"utt{i:05d}")
    assert table.num_unused() == 1000
    assert table.unused_keys(3) == ["utt00001", "utt00003", "utt00005"]


def test_keyed_table_index_is_16_bytes_per_line(tmp_path):
    table = kaldi.KeyedTable(write(tmp_path / "t", "".join(f"k{i} v\n" for i in range(10000)).encode()))
    index_bytes = table._hashes.nbytes + table._offsets.nbytes
    assert index_bytes == 16 * 10000


def test_segments_reject_bad_times_with_line(tmp_path):
    good = write(tmp_path / "segments", b"u1 rec 0.0 1.5\nu2 rec 1.5 -1\n")
    assert [(s.key, s.start, s.end) for s in kaldi.iter_segments(good)] == [("u1", 0.0, 1.5), ("u2", 1.5, -1.0)]
    bad = write(tmp_path / "bad", b"u1 rec 2.0 1.0\n")
    with pytest.raises(DataError, match=r"bad:1: segment 'u1'"):
        list(kaldi.iter_segments(bad))
    short = write(tmp_path / "short", b"u1 rec 2.0\n")
    with pytest.raises(DataError, match=r"short:1: a segments line must be"):
        list(kaldi.iter_segments(short))


def test_write_table_is_atomic_and_uses_the_separator(tmp_path):
    out = tmp_path / "out" / "text"
    assert kaldi.write_table(out, [("a", "x y"), ("b", "z")], separator="\t") == 2
    assert out.read_text() == "a\tx y\nb\tz\n"
    assert not list(out.parent.glob(".*tmp*"))


def test_pipe_entries_are_recognised():
    assert kaldi.is_pipe("sox a.flac -t wav - |")
    assert not kaldi.is_pipe("a.wav")


def test_feats_scp_reads_kaldi_ark_offsets(tmp_path):
    import kaldiio
    import numpy as np

    mat = np.arange(12, dtype=np.float32).reshape(3, 4)
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/feats.ark,{tmp_path}/feats.scp") as writer:
        writer("utt1", mat)
    (line,) = kaldi.iter_table(tmp_path / "feats.scp")
    assert line.key == "utt1" and ".ark:" in line.value
    np.testing.assert_array_equal(kaldi.read_feats(line.value), mat)


def test_invalid_utf8_offset_counts_from_the_start_of_the_line(tmp_path):
    table = write(tmp_path / "text", b"ab \xff\n")  # the bad byte is the line's 4th: offset 3
    with pytest.raises(DataError, match=r"text:1: invalid UTF-8 at byte 3 of the line"):
        list(kaldi.iter_table(table))
