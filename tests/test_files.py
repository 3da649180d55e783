"""Crash-safe writes and what the user sees when an output cannot be written."""

from __future__ import annotations

import pytest

from corpus_io.errors import DataError
from corpus_io.files import atomic_write, ensure_dir
from tests.conftest import FIXTURE, assert_user_error, run_cli


def test_atomic_write_renames_only_after_the_block_succeeds(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("good\n")
    with pytest.raises(RuntimeError), atomic_write(path) as f:
        f.write("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "good\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with atomic_write(path) as f:
        f.write("new\n")
    assert path.read_text() == "new\n"


def test_an_output_that_cannot_be_written_is_a_data_error_naming_it(tmp_path):
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(DataError, match="a_dir: it is a directory"):
        with atomic_write(tmp_path / "a_dir"):
            pass
    with pytest.raises(DataError, match="a_file is a file, not a directory"):
        ensure_dir(tmp_path / "a_file")
    with pytest.raises(DataError, match="a_file is a file, not a directory"):
        with atomic_write(tmp_path / "a_file" / "out.txt"):
            pass


def test_cli_output_errors_are_one_paragraph(tmp_path):
    args = [f"++scp_file_list=[{FIXTURE / 'wav.scp'},{FIXTURE / 'text'}]", "++data_type_list=[source,target]"]
    (tmp_path / "taken").mkdir()
    result = run_cli("corpus-io", "scp2jsonl", *args, f"++jsonl_file_out={tmp_path / 'taken'}")
    assert_user_error(result, "taken", "is a directory")
    result = run_cli("corpus-io", "scp2jsonl", *args, "++jsonl_file_out=/proc/no/such/dir/out.jsonl")
    assert_user_error(result, "/proc/no/such/dir")


def test_a_table_that_never_ends_a_line_is_refused_at_the_named_line_bound(tmp_path):
    from corpus_io.files import bounded_lines

    (tmp_path / "text").write_text("utt1 hello\n")
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[/dev/zero,{tmp_path / 'text'}]",
                     "++data_type_list=[source,target]", f"++jsonl_file_out={tmp_path / 'o.jsonl'}", timeout=120)
    assert_user_error(result, "/dev/zero is a device, not a regular file")
    binary = tmp_path / "wav.scp"  # a binary file given as a table: no newline for 5 MiB
    binary.write_bytes(b"\0" * (5 << 20))
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{binary},{tmp_path / 'text'}]",
                     "++data_type_list=[source,target]", f"++jsonl_file_out={tmp_path / 'o.jsonl'}", timeout=120)
    assert_user_error(result, f"{binary}:1: the line is longer than 4194304 bytes")
    path = tmp_path / "blob"
    path.write_bytes(b"ok line\n" + b"x" * 100 + b"\n")
    with open(path, "rb") as f:
        lines = bounded_lines(f, path, max_bytes=50)
        assert next(lines) == (1, b"ok line\n")
        with pytest.raises(DataError, match=r"blob:2: the line is longer than 50 bytes"):
            next(lines)
