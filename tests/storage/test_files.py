"""Crash-safe writes and what the user sees when an output cannot be written."""

from __future__ import annotations

import pytest

from corpus_io.errors import DataError
from corpus_io.storage.files import (
    HashingWriter,
    UnnamedFile,
    atomic_write,
    completed_output,
    ensure_dir,
    file_sha256,
    inputs_digest,
    parse_json_object,
    refuse_replacing_others,
    sidecar_path,
    write_sidecar,
)
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


@pytest.mark.parametrize("existing", [False, True], ids=["new_output", "rewrite"])
def test_a_committed_unnamed_file_is_the_written_inode_itself_and_no_name_shows_while_writing(tmp_path, existing):
    """The kill-safety promise: while a file is written nothing in the directory names it, and commit names
    that very inode (a copy would show a partial temp file to a writer killed mid-copy)."""
    import os

    path = tmp_path / "shard.tar"
    if existing:
        path.write_bytes(b"old")
    out = UnnamedFile(path, "wb")
    if not out.unnamed:
        pytest.skip(f"{tmp_path} has no O_TMPFILE: the visible temp name is the documented fallback")
    out.file.write(b"x" * 100_000)
    out.file.flush()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["shard.tar"] if existing else [])
    written = os.fstat(out.file.fileno()).st_ino
    out.commit()
    assert os.stat(path).st_ino == written and path.read_bytes() == b"x" * 100_000
    assert [p.name for p in tmp_path.iterdir()] == ["shard.tar"]


@pytest.mark.parametrize("existing", [False, True])
def test_atomic_write_with_fsync_puts_the_file_then_its_directory_entry_on_disk(tmp_path, monkeypatch, existing):
    """fsync=True (checkpoints): the bytes are fsynced before the file takes its name, and the directory after it,
    so the new name survives a power cut; a new file and a rewrite alike."""
    import os
    import stat

    target = tmp_path / "model.pt"
    if existing:
        target.write_bytes(b"old")
    synced: list[tuple[str, bytes | None]] = []  # what was fsynced, and what the name held at that moment
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file",
                       target.read_bytes() if target.exists() else None))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with atomic_write(target, "wb", encoding=None, newline=None, fsync=True) as f:
        f.write(b"new")
    assert target.read_bytes() == b"new"
    assert synced == [("file", b"old" if existing else None), ("dir", b"new")]


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


@pytest.mark.parametrize(("raw", "why"), [
    (b'{"key": "a", ', "not valid JSON"),
    (b'[1, 2]', "a JSON list, not an object"),
    (b'{"key": "\xff"}', "invalid UTF-8"),
])
def test_a_bad_json_line_is_a_data_error_naming_file_line_and_the_fix(raw, why):
    with pytest.raises(DataError, match=rf"^data.jsonl:7: {why}.*One object per line\.$"):
        parse_json_object(raw, "data.jsonl:7", "One object per line.")
    assert parse_json_object(b'{"key": "a"}\n', "data.jsonl:7", "") == {"key": "a"}


def test_a_json_line_finds_its_line_number_only_when_it_is_bad():
    asked = []
    assert parse_json_object('{"a": 1}', lambda: asked.append(1) or "x:1", "") == {"a": 1}
    assert not asked
    with pytest.raises(DataError, match=r"^x:9: not valid JSON"):
        parse_json_object("{", lambda: "x:9", "")


def test_an_output_is_reused_only_with_its_sidecar_and_the_same_inputs_and_bytes(tmp_path):
    out = tmp_path / "part.bin"
    digest = inputs_digest(["inputs", 1])
    with atomic_write(out, "wb") as raw:
        writer = HashingWriter(raw)
        writer.write(b"payload" * 1000)
    assert (writer.bytes, writer.sha256) == (7000, file_sha256(out))  # hashed while writing
    assert completed_output(out, digest) is None  # no sidecar: never finished
    write_sidecar(out, {"digest": digest, "bytes": writer.bytes, "sha256": writer.sha256, "n": 3})
    assert sidecar_path(out).name == ".part.bin.json"
    assert completed_output(out, digest)["n"] == 3
    assert completed_output(out, inputs_digest(["inputs", 2])) is None  # other inputs
    out.write_bytes(b"PAYLOAD" * 1000)  # same size, other bytes
    assert completed_output(out, digest) is None
    sidecar_path(out).write_text("{trunc")
    assert completed_output(out, digest) is None


def test_a_writer_replaces_only_files_it_recorded_writing_and_not_once_they_changed(tmp_path):
    """atomic_write(owner=) records the file; refuse_replacing_others lets that writer (not another) replace it,
    refuses a file without a record or changed since, and passes a path that does not exist."""
    ours, theirs = tmp_path / "text", tmp_path / "ref"
    theirs.write_text("a reference\n")
    with atomic_write(ours, owner="decode") as f:
        f.write("a hypothesis\n")
    refuse_replacing_others([("text", ours), ("new", tmp_path / "new")], "decode", way_out="Move it.")
    for path, writer, why in ((theirs, "decode", "no record .ref.json beside it says it did"),
                              (ours, "export-model", "decode wrote it")):
        with pytest.raises(DataError, match=f"exists, and {writer} did not write it \\({why}\\).* Move it. "
                                            f"Nothing was written."):
            refuse_replacing_others([("out", path)], writer, way_out="Move it.")
    ours.write_text("edited\n")
    with pytest.raises(DataError, match="changed since"):
        refuse_replacing_others([("text", ours)], "decode", way_out="")


def test_a_table_that_never_ends_a_line_is_refused_at_the_named_line_bound(tmp_path):
    from corpus_io.storage.files import bounded_lines

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
