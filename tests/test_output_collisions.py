"""No output overwrites an input (issue 21 item 1): every command that writes a file refuses, before any work,
an output that is one of its inputs by the same path, through a symbolic link, or as a hard link (the same
inode); the message names both, the exit code is 2 and the input is byte-identical afterwards."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corpus_io.errors import ConfigError
from corpus_io.storage.files import refuse_overwriting_inputs
from tests.conftest import FIXTURE, assert_user_error, run_cli
from tests.loader_data import make_shards

JSONL = ('{"key": "a", "source": "a.wav", "target": "hi", "spk": "s1", "emotion": "happy", "target_len": 2}\n'
         '{"key": "b", "source": "b.wav", "target": "yo", "spk": "s2", "emotion": "sad", "target_len": 2}\n')


def _kaldi_dir(root: Path) -> Path:
    data = root / "data"
    data.mkdir()
    for name in ("wav.scp", "text", "utt2spk"):
        (data / name).write_bytes((FIXTURE / name).read_bytes())
    (data / "data.list").write_text('{"key": "spk0-utt000", "wav": "a.wav", "txt": "x"}\n')
    return data


def _alias(victim: Path, kind: str, where: Path) -> Path:
    """``victim`` itself, a symbolic link to it, or a hard link to it, at ``where``."""
    if kind == "same":
        return victim
    where.parent.mkdir(parents=True, exist_ok=True)
    (os.symlink if kind == "symlink" else os.link)(victim, where)
    return where


# command -> (the input that would be lost, args given the output path, what the message names)
def _make_datalist(tmp: Path, kind: str):
    victim = tmp / "train.jsonl"
    victim.write_text(JSONL)
    out = _alias(victim, kind, tmp / "out" / "data.list")
    return victim, ["make-datalist", "++data_type=raw", f"++input=[{victim}]", f"++output={out}"], "++input"


def _make_lm(tmp: Path, kind: str):
    victim = tmp / "text.txt"
    victim.write_text("a b c\nb c a\n")
    out = _alias(victim, kind, tmp / "out" / "lm.arpa")
    return victim, ["make-lm", f"++input={victim}", f"++output={out}"], "++input"


def _compute_cmvn(tmp: Path, kind: str):
    victim = tmp / "data.list"
    victim.write_text(JSONL)
    out = _alias(victim, kind, tmp / "out" / "cmvn.json")
    return victim, ["compute-cmvn", f"++data_list={victim}", f"++output={out}"], "++data_list"


def _make_tokenizer(tmp: Path, kind: str):
    victim = tmp / "text"
    victim.write_bytes((FIXTURE / "text").read_bytes())
    out = _alias(victim, kind, tmp / "out" / "tokens.txt")
    return victim, ["make-tokenizer", f"++input={victim}", f"++output={out}"], "++input"


def _scp2jsonl(tmp: Path, kind: str):
    data = _kaldi_dir(tmp)
    victim = data / "text"
    out = _alias(victim, kind, tmp / "out" / "train.jsonl")
    return victim, ["scp2jsonl", f"++scp_file_list=[{data / 'wav.scp'},{victim}]",
                    "++data_type_list=[source,target]", f"++jsonl_file_out={out}"], "++scp_file_list entry 2"


def _jsonl2scp(tmp: Path, kind: str):
    victim = tmp / "train.jsonl"
    victim.write_text(JSONL)
    out = _alias(victim, kind, tmp / "out" / "wav.scp")
    return victim, ["jsonl2scp", f"++jsonl_file_in={victim}", f"++scp_file_list=[{out}]",
                    "++data_type_list=[source]"], "++jsonl_file_in"


def _decode(tmp: Path, kind: str):
    data = _kaldi_dir(tmp)
    victim = data / "text"
    out_dir = data if kind == "same" else tmp / "exp"
    if kind != "same":
        _alias(victim, kind, out_dir / "text")
    named = "Kaldi data dir" if kind == "same" else "the Kaldi table text beside ++data_list"
    return victim, ["decode", f"++data_list={data / 'data.list'}", f"++checkpoint={tmp / 'model.pt'}",
                    f"++output_dir={out_dir}"], named


def _pack_shards(tmp: Path, kind: str):
    victim = tmp / "data.list"
    victim.write_text(JSONL)
    out_dir = tmp if kind == "same" else tmp / "shards"
    if kind != "same":
        _alias(victim, kind, out_dir / "data.list")
    return victim, ["pack-shards", f"++input={victim}", f"++output_dir={out_dir}"], "++input"


COMMANDS = {"pack-shards": _pack_shards,
            "make-datalist": _make_datalist, "compute-cmvn": _compute_cmvn, "make-tokenizer": _make_tokenizer,
            "scp2jsonl": _scp2jsonl, "jsonl2scp": _jsonl2scp, "decode": _decode, "make-lm": _make_lm}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(command, tmp_path):
    victim, args, named = COMMANDS[command](tmp_path, "same")
    before = victim.read_bytes()
    result = run_cli("corpus-io", *args, timeout=60)
    assert_user_error(result, named, str(victim))
    assert result.returncode == 2
    assert victim.read_bytes() == before


def run_in_process(args: list[str]) -> str:
    """The command's message, run as the CLI runs it (composed config, then its function), in this process."""
    from cli._app import _target
    from corpus_io.commands import COMMANDS as TABLE
    from corpus_io.config import compose

    cmd = next(c for c in TABLE if c.name == args[0])
    cfg = compose(cmd.schema, cmd.name.replace("-", "_"), args[1:])
    with pytest.raises(ConfigError) as info:
        _target(cmd.run)(cfg)
    return str(info.value)


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_that_links_to_an_input_is_refused_and_the_input_kept(command, kind, tmp_path):
    victim, args, named = COMMANDS[command](tmp_path, kind)
    before = victim.read_bytes()
    message = run_in_process(args)
    assert named in message and str(victim) in message
    assert ("symbolic link" if kind == "symlink" else "hard link") in message
    assert victim.read_bytes() == before


def test_refuse_overwriting_inputs_allows_distinct_files_and_names_two_outputs_that_are_one(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x")
    refuse_overwriting_inputs([("++output", b), ("++other", None), ("++remote", "s3://bucket/x")],
                              [("++input", a), ("++url", "https://h/a")])
    with pytest.raises(ConfigError, match=r"the outputs name the same file twice: \+\+out1 .* and \+\+out2"):
        refuse_overwriting_inputs([("++out1", b), ("++out2", tmp_path / "." / "b")], [("++input", a)])
    with pytest.raises(ConfigError, match=r"is the input \+\+input"):
        refuse_overwriting_inputs([("++output", f"file://{a}")], [("++input", a)])


def test_make_datalist_writes_the_list_of_a_directory_of_bare_shards_and_refuses_to_rewrite_it_from_itself(tmp_path):
    shards = tmp_path / "shards"
    data_list, _ = make_shards(shards, per_shard=8)
    data_list.unlink()
    data_list.with_name("index.jsonl").unlink()  # only the tars, as copied from elsewhere
    tars = sorted(str(p) for p in shards.glob("*.tar"))
    args = ("corpus-io", "make-datalist", f"++input=[{shards}/]", f"++output={data_list}")
    first = run_cli(*args, timeout=60)
    assert first.returncode == 0, first.stderr
    assert data_list.read_text().split() == tars
    # now the directory's data.list exists, make-datalist reads it as the input: writing it again would replace it
    before = data_list.read_bytes()
    again = run_cli(*args, timeout=60)
    assert_user_error(again, "++output", "is the input ++input's data.list", str(data_list))
    assert again.returncode == 2
    assert data_list.read_bytes() == before


def test_make_datalist_rebuilds_a_directory_list_lost_after_its_index_was_written(tmp_path):
    shards = tmp_path / "shards"
    data_list, _ = make_shards(shards, per_shard=8)
    index = data_list.with_name("index.jsonl")
    entries = [json.loads(line) for line in index.read_text().splitlines()]
    data_list.unlink()  # a crash between the index's commit and the list's
    result = run_cli("corpus-io", "make-datalist", f"++input=[{shards}]", f"++output={data_list}", timeout=60)
    assert result.returncode == 0, result.stderr
    assert data_list.read_text().split() == [e["path"] for e in entries]
    rebuilt = [json.loads(line) for line in index.read_text().splitlines()]
    assert [(e["num_utts"], e["duration"]) for e in rebuilt] == [(e["num_utts"], e["duration"]) for e in entries]


#: every local-only writer given an s3:// output, with inputs that exist (nothing of them is read before the refusal)
S3_OUTPUTS = {
    "make-lm": ["++input={text}", "++output=s3://bucket/lm.arpa"],
    "tune-lm": ["++data_list={tmp}/dev.list", "++checkpoint={tmp}/model.pt", "++lm={tmp}/lm.arpa",
                "++output_dir=s3://bucket/tune"],
    "export": ["++format=hf-parquet", "++input={jsonl}", "++output_dir=s3://bucket/hf"],
    "average": ["++output_dir=s3://bucket/exp"],
    "jsonl2scp": ["++jsonl_file_in={jsonl}", "++output_format=nemo", "++manifest_out=s3://bucket/manifest.json"],
    "compute-cmvn": ["++data_list={jsonl}", "++output=s3://bucket/cmvn.json"],
    "make-tokenizer": ["++input={text}", "++output=s3://bucket/tokens.txt"],
    "decode": ["++data_list={jsonl}", "++checkpoint={tmp}/model.pt", "++output_dir=s3://bucket/decode"],
    "score": ["++data_list={jsonl}", "++checkpoint={tmp}/model.pt", "++output_dir=s3://bucket/score"],
    "train": ["++train_data_set_list={jsonl}", "++output_dir=s3://bucket/exp"],
}


@pytest.mark.parametrize("command", sorted(S3_OUTPUTS))
def test_a_local_only_writer_given_an_s3_output_is_refused_before_any_work(command, tmp_path):
    text, jsonl = tmp_path / "text.txt", tmp_path / "train.jsonl"
    text.write_text("a b c\nb c a\n")
    jsonl.write_text(JSONL)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    args = [a.format(text=text, jsonl=jsonl, tmp=tmp_path) for a in S3_OUTPUTS[command]]
    key = next(a for a in args if "s3://" in a)
    message = run_in_process_in(cwd, [command, *args])
    assert key in message and "writes local files only" in message, message
    assert list(cwd.iterdir()) == []  # no ./s3:/bucket/... tree


def run_in_process_in(cwd: Path, args: list[str]) -> str:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return run_in_process(args)
    finally:
        os.chdir(old)


def test_explore_given_an_s3_cache_dir_is_refused_before_it_builds_or_serves(tmp_path):
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text(JSONL)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = run_cli("corpus-io", "explore", f"++input={jsonl}", "++cache_dir=s3://bucket/cache", "++port=0",
                     cwd=cwd, timeout=60)  # the old code served a local ./s3:/bucket/cache catalog forever
    assert_user_error(result, "++cache_dir=s3://bucket/cache", "explore writes local files only")
    assert list(cwd.iterdir()) == []
