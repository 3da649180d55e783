"""Hostile input, as a user meets it (issue 21 items 5-8): a command line, its exit code and its message.

Each row of ``CASES`` is one command line built over a small corpus in ``tmp_path``; it runs in this process
exactly as the ``corpus-io`` CLI runs it (compose the config, run the command inside ``run_with_errors``), so
the exit code and the one-paragraph message are the user's. A row expects exit 2 and every needle in the
message, or exit 0. Rows that need a real process boundary (pipes, servers) are tests of their own below.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, REPO, assert_user_error, hang_limit, run_cli
from tests.loader_data import make_shards

WAV = str(REPO / "tests/fixtures/corpus/wav/spk0-utt000.wav")  # 3.162 s


def corpus_io(*args: str, capfd) -> tuple[int, str]:
    """``corpus-io ARGS`` in this process: (exit code, stderr)."""
    from cli._app import _target, run_with_errors
    from corpus_io.commands import COMMANDS
    from corpus_io.config import compose

    cmd = next(c for c in COMMANDS if c.name == args[0])

    def job() -> None:
        _target(cmd.run)(compose(cmd.schema, cmd.name.replace("-", "_"), list(args[1:])))

    capfd.readouterr()
    try:
        run_with_errors(job)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capfd.readouterr().err


def _jsonl(tmp: Path, *records: dict, name: str = "in.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _utt(**fields) -> dict:
    return {"key": "u1", "source": WAV, "target": "hi", **fields}


def _raw_list(tmp: Path, *records: dict) -> list[str]:
    return ["make-datalist", "++data_type=raw", f"++input=[{_jsonl(tmp, *records)}]", f"++output={tmp / 'o.list'}"]


def _pack(tmp: Path, *records: dict) -> list[str]:
    return ["pack-shards", f"++input={_jsonl(tmp, *records)}", f"++output_dir={tmp / 'sh'}", "++num_workers=1"]


def _segments(tmp: Path, start: str, end: str) -> list[str]:
    (tmp / "wav.scp").write_text(f"rec1 {WAV}\n")
    (tmp / "text").write_text("u1 hi\n")
    (tmp / "segments").write_text(f"u1 rec1 {start} {end}\n")
    return ["scp2jsonl", f"++scp_file_list=[{tmp / 'wav.scp'},{tmp / 'text'}]", f"++segments={tmp / 'segments'}",
            f"++jsonl_file_out={tmp / 'o.jsonl'}", "++num_workers=1"]


def _scp2jsonl_missing_text(tmp: Path, *extra: str) -> list[str]:
    (tmp / "wav.scp").write_text("".join(f"{k} {REPO / 'tests/fixtures/corpus/wav' / (k + '.wav')}\n"
                                         for k in ("spk0-utt000", "spk0-utt004")))
    (tmp / "text").write_text("spk0-utt000 hi\n")
    return ["scp2jsonl", f"++scp_file_list=[{tmp / 'wav.scp'},{tmp / 'text'}]", f"++jsonl_file_out={tmp / 'o.jsonl'}",
            "++num_workers=1", *extra]


def _shards(tmp: Path) -> Path:
    data_list, _ = make_shards(tmp / "s", per_shard=8)
    return data_list


def _index_edit(tmp: Path, **fields) -> list[str]:
    data_list = _shards(tmp)
    index = data_list.with_name("index.jsonl")
    lines = [json.loads(x) for x in index.read_text().splitlines()]
    lines[1].update(fields)
    index.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return ["bench-loader", f"++data_list={data_list}", "++dataset_conf.num_workers=0",
            "++dataset_conf.feats_type=raw"]


def _list_twice(tmp: Path, how: str) -> list[str]:
    data_list = _shards(tmp)
    first = data_list.read_text().splitlines()[0]
    if how == "symlink":
        os.symlink(first, tmp / "alias.tar")
        twin = str(tmp / "alias.tar")
    else:
        twin = os.path.relpath(first, REPO)  # the same shard, relative to the working directory
    data_list.write_text(data_list.read_text() + twin + "\n")
    return ["bench-loader", f"++data_list={data_list}", "++dataset_conf.num_workers=0"]


def _bpe_model_is_input(tmp: Path) -> list[str]:
    src = tmp / "corpus.model"
    src.write_bytes((FIXTURE / "text").read_bytes())
    return ["make-tokenizer", f"++input={src}", f"++output={tmp / 'corpus.txt'}", "++tokenizer.type=bpe"]


def _two_tables_one_inode(tmp: Path) -> list[str]:
    src = _jsonl(tmp, _utt())
    (tmp / "wav.scp").write_text("")
    os.link(tmp / "wav.scp", tmp / "text")
    return ["jsonl2scp", f"++jsonl_file_in={src}", f"++scp_file_list=[{tmp / 'wav.scp'},{tmp / 'text'}]",
            "++data_type_list=[source,target]"]


def _shard_list_over_itself(tmp: Path) -> list[str]:
    data_list = _shards(tmp)
    return ["make-datalist", f"++input=[{data_list.parent}]", f"++output={data_list}", f"++prefix={tmp}/x/"]


def _stats_over_its_input(tmp: Path) -> list[str]:
    data_list = _shards(tmp)
    return ["stats", f"++input={data_list}", f"++output={data_list}"]


OK, ERR = 0, 2
CASES = {
    # item 5: a line's key, times and numbers, checked where they enter
    "key null": (lambda t: _raw_list(t, _utt(key=None)), ERR, ["in.jsonl:1", "'key' is null, not a string"]),
    "key empty": (lambda t: _pack(t, _utt(key="")), ERR, ["in.jsonl:1", "key '' is empty"]),
    "key blank": (lambda t: _raw_list(t, _utt(key="   ")), ERR, ["key '   ' is empty"]),
    "key float": (lambda t: _raw_list(t, _utt(key=12.5)), ERR, ["'key' is 12.5, not a string"]),
    "key list": (lambda t: _pack(t, _utt(key=["a"])), ERR, ["'key' is [\"a\"], not a string"]),
    "start negative": (lambda t: _raw_list(t, _utt(start=-1.0, end=0.5)), ERR,
                       ["key 'u1': start -1.0 and end 0.5 s are not a segment", "0 <= start < end"]),
    "end before start": (lambda t: _pack(t, _utt(start=2.0, end=1.0)), ERR, ["start 2.0 and end 1.0 s"]),
    "end equals start": (lambda t: _raw_list(t, _utt(start=1.0, end=1.0)), ERR, ["are not a segment"]),
    "start infinite": (lambda t: _raw_list(t, _utt(start=float("inf"), end=2.0)), ERR, ["start is inf, not a number"]),
    "source_len negative": (lambda t: _raw_list(t, _utt(source_len=-5)), ERR, ["source_len is -5, below 0"]),
    "segment 9 s past its recording": (lambda t: _segments(t, "1.0", "12.16"), ERR,
                                       ["segments:1", "lies outside its recording (3.162 s)", "+ 0.5 s"]),
    "segment 0.3 s past is clipped": (lambda t: _segments(t, "1.0", "3.46"), OK, []),
    "segment to the end (-1)": (lambda t: _raw_list(t, _utt(start=0.5, end=-1)), OK, []),
    "raw segment past its recording": (lambda t: _raw_list(t, _utt(start=1.0, end=9.0)), ERR,
                                       ["in.jsonl:1: key 'u1'", "lies outside its recording"]),
    # item 5: filter bounds and ranges
    "max_length -1": (lambda t: ["bench-loader", "++data_list=x", "++dataset_conf.filter_conf.max_length=-1"], ERR,
                      ["dataset_conf.filter_conf.max_length=-1", "outside its range [1, 1000000000]"]),
    "token_max_length 0": (lambda t: ["bench-loader", "++data_list=x", "++dataset_conf.filter_conf.token_max_length=0"],
                           ERR, ["token_max_length=0"]),
    "ratio bound 0": (lambda t: ["bench-loader", "++data_list=x",
                                 "++dataset_conf.filter_conf.max_output_input_ratio=0"], ERR, ["outside its range (0"]),
    "min above max": (lambda t: ["bench-loader", f"++data_list={_shards(t)}",
                                 "++dataset_conf.filter_conf.min_length=500",
                                 "++dataset_conf.filter_conf.max_length=100"], ERR,
                      ["min_length=500 is above max_length=100", "every utterance would be dropped"]),
    "pipe_timeout 0": (lambda t: _scp2jsonl_missing_text(t, "++pipe_timeout=0"), ERR, ["pipe_timeout=0"]),
    "dataset pipe_timeout negative": (lambda t: ["bench-loader", "++data_list=x", "++dataset_conf.pipe_timeout=-5"],
                                      ERR, ["dataset_conf.pipe_timeout=-5"]),
    "max_nonfinite_steps 0": (lambda t: ["train", "++train_data_set_list=x", f"++output_dir={t}",
                                         "++train_conf.max_nonfinite_steps=0"], ERR, ["max_nonfinite_steps=0"]),
    # item 5: old spellings
    "on_missing=skip beats the YAML": (lambda t: _scp2jsonl_missing_text(t, "++on_missing=skip"), OK,
                                       ["read as 'on_error=skip'"]),
    "on_missing=bogus": (lambda t: _scp2jsonl_missing_text(t, "++on_missing=bogus"), ERR,
                         ["on_missing=bogus (the old name of on_error) must be one of fail | skip"]),
    "on_missing and on_error disagree": (lambda t: _scp2jsonl_missing_text(t, "++on_missing=skip", "++on_error=fail"),
                                         ERR, ["on_missing=skip and on_error=fail disagree", "give only ++on_error"]),
    "on_missing=error is fail": (lambda t: _scp2jsonl_missing_text(t, "++on_missing=error"), ERR,
                                 ["spk0-utt004"]),
    # item 5: output URLs a command does not write
    "decode to s3": (lambda t: ["decode", "++data_list=x", "++checkpoint=y", "++output_dir=s3://bucket/dec"], ERR,
                     ["++output_dir=s3://bucket/dec is a URL, but decode writes local files only"]),
    "make-datalist to s3": (lambda t: [*_raw_list(t, _utt())[:-1], "++output=s3://bucket/data.list"], ERR,
                            ["make-datalist writes local files only"]),
    "train to s3": (lambda t: ["train", "++train_data_set_list=x", "++output_dir=s3://b/exp"], ERR,
                    ["train writes local files only"]),
    "prepare to gs": (lambda t: ["prepare", "++corpus=aishell", f"++root={t}", "++output_dir=gs://b/data"], ERR,
                      ["prepare writes local files only"]),
    "stats png to s3": (lambda t: ["stats", f"++input={_shards(t)}", "++output=s3://b/x.png"], ERR,
                        ["stats writes local files only"]),
    "bench-loader state to http": (lambda t: ["bench-loader", "++data_list=x", "++state_file=http://h/s.json"], ERR,
                                   ["++state_file=http://h/s.json is a URL"]),
    "jsonl2scp table to file URL": (lambda t: ["jsonl2scp", f"++jsonl_file_in={_jsonl(t, _utt())}",
                                               "++scp_file_list=[file:///tmp/x/wav.scp]", "++data_type_list=[source]"],
                                    ERR, ["is a URL"]),
    # items 1-2 in other shapes
    "bpe model over its input": (_bpe_model_is_input, ERR, ["the sentencepiece model beside ++output", "is the input"]),
    "two tables, one inode": (_two_tables_one_inode, ERR, ["the outputs name the same file twice", "hard link"]),
    "shard list over itself": (_shard_list_over_itself, ERR, ["is the input ++input"]),
    "stats png over its list": (_stats_over_its_input, ERR, ["++output", "is the input ++input"]),
    "shard twice via symlink": (lambda t: _list_twice(t, "symlink"), ERR, ["names the same shard twice", "entry 4"]),
    "shard twice, relative": (lambda t: _list_twice(t, "relative"), ERR, ["names the same shard twice"]),
    "index num_utts negative": (lambda t: _index_edit(t, num_utts=-8), ERR, ["num_utts is -8"]),
    "index min above max": (lambda t: _index_edit(t, min_duration=5.0, max_duration=1.0), ERR,
                            ["min_duration 5.0 is above max_duration 1.0"]),
    "index duration 1e308": (lambda t: _index_edit(t, duration=1e308), ERR, ["more than 86400 s per utterance"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_command_line(name, tmp_path, capfd):
    build, code, needles = CASES[name]
    args = build(tmp_path)
    rc, err = corpus_io(*args, capfd=capfd)
    assert rc == code, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in: {err}"
    assert not Path("s3:").exists() and not Path("gs:").exists() and not Path("http:").exists()


def test_a_loader_state_with_impossible_positions_is_refused(tmp_path, capfd):
    data_list = _shards(tmp_path)
    state = tmp_path / "state.json"
    base = ["bench-loader", f"++data_list={data_list}", "++dataset_conf.num_workers=0", "++dataset_conf.batch_size=4",
            "++dataset_conf.feats_type=raw", f"++state_file={state}"]
    rc, err = corpus_io(*base, "++save_state_after=2", capfd=capfd)
    assert rc == 0, err
    saved = json.loads(state.read_text())
    for cursor, why in (([5000, 0], "unit 5000"), ([0, 999], "position 999"), ([-3, 0], "unit -3")):
        saved["workers"]["0"]["cursor"] = {"0": cursor}
        state.write_text(json.dumps(saved))
        rc, err = corpus_io(*base, capfd=capfd)
        assert rc == 2 and "the loader state's read position of worker 0 is impossible" in err and why in err, err


def test_a_pipe_that_never_ends_fails_naming_the_key_and_the_command_line(tmp_path):
    (tmp_path / "wav.scp").write_text("u1 sleep 1000 |\n")
    (tmp_path / "text").write_text("u1 hi\n")
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{tmp_path / 'wav.scp'},{tmp_path / 'text'}]",
                     f"++jsonl_file_out={tmp_path / 'o.jsonl'}", "++allow_pipe=true", "++pipe_timeout=1",
                     "++num_workers=1", timeout=60)
    assert_user_error(result, "wav.scp:1: key 'u1'", "command 'sleep 1000 |' did not finish within 1 s",
                      "pipe_timeout=1")
    assert result.returncode == 2 and not (tmp_path / "o.jsonl").exists()


def _endless_command(forks: bool) -> tuple[str, str]:
    """``(command entry, marker)``: a command that never ends, ``sleep 1000.<unique digits> |`` (the digits find
    what it leaves behind, and nothing of another test's), or one that starts it as its child (``sh -c``), which
    keeps stdout open when only ``sh`` is killed."""
    import uuid

    marker = f"sleep 1000.{uuid.uuid4().int % 10**12:012d}"
    return (f"sh -c '{marker}; true' |" if forks else f"{marker} |"), marker


def _left_behind(marker: str) -> list[str]:
    """The command lines of live processes running ``marker`` (after a moment for killed ones to go); kills
    them, so that a failing test leaves nothing either."""
    import time

    import psutil

    deadline = time.monotonic() + hang_limit(5)
    while True:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            line = " ".join(proc.info["cmdline"] or ())
            if marker in line and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append((proc, line))
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for proc, _ in found:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return [line for _, line in found]


def _run_timed(*args: str) -> tuple[object, float]:
    import time

    start = time.monotonic()
    result = run_cli(*args, timeout=90)
    return result, time.monotonic() - start


@pytest.mark.parametrize("forks", [False, True], ids=["sleep", "sh-starts-sleep"])
def test_pack_shards_over_a_pipe_that_never_ends_fails_naming_the_key_and_kills_it(tmp_path, forks):
    command, marker = _endless_command(forks)
    source = _jsonl(tmp_path, {"key": "u1", "source": command, "target": "hi"})
    result, seconds = _run_timed("corpus-io", "pack-shards", f"++input={source}", f"++output_dir={tmp_path / 'out'}",
                                 "++allow_pipe=true", "++pipe_timeout=1", "++num_workers=1")
    left = _left_behind(marker)
    assert_user_error(result, "in.jsonl:1: key 'u1'", f"command '{command}' did not finish within 1 s",
                      "the bound is pipe_timeout=1 s", "raise ++pipe_timeout")
    assert result.returncode == 2 and ".." not in result.stderr, result.stderr
    assert seconds < hang_limit(30), f"pack-shards took {seconds:.0f} s over a 1 s pipe_timeout"
    assert not left, f"left running: {left}"
    assert not (tmp_path / "out" / "data.list").exists()


@pytest.mark.parametrize("forks", [False, True], ids=["sleep", "sh-starts-sleep"])
def test_the_loader_over_a_pipe_that_never_ends_fails_naming_its_key_and_kills_it(tmp_path, forks):
    command, marker = _endless_command(forks)
    raw = _jsonl(tmp_path, {"key": "u1", "wav": command, "txt": "hi"}, name="raw.list")
    result, seconds = _run_timed("corpus-io", "bench-loader", f"++data_list={raw}", "++dataset_conf.data_type=raw",
                                 "++dataset_conf.allow_pipe=true", "++dataset_conf.pipe_timeout=1")
    left = _left_behind(marker)
    assert_user_error(result, "raw.list:1: key 'u1'", f"command '{command}' did not finish within 1 s",
                      "the bound is dataset_conf.pipe_timeout=1 s", "raise ++dataset_conf.pipe_timeout")
    assert result.returncode == 2, result.stderr
    assert seconds < hang_limit(30), f"bench-loader took {seconds:.0f} s over a 1 s dataset_conf.pipe_timeout"
    assert not left, f"left running: {left}"


@pytest.mark.parametrize("command, says", [("false |", "false exited 1 with no message on stderr. Fix"),
                                           ("sh -c 'echo no such take. >&2; exit 3' |",
                                            "sh exited 3 saying: no such take. Fix")])
def test_a_failing_pipe_says_its_exit_status_and_what_it_printed_in_one_sentence(tmp_path, command, says):
    (tmp_path / "wav.scp").write_text(f"u1 {command}\n")
    (tmp_path / "text").write_text("u1 hi\n")
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{tmp_path / 'wav.scp'},{tmp_path / 'text'}]",
                     f"++jsonl_file_out={tmp_path / 'o.jsonl'}", "++allow_pipe=true", "++num_workers=1", timeout=60)
    assert_user_error(result, "wav.scp:1: key 'u1'", says)
    assert ".." not in result.stderr and ":  " not in result.stderr


@pytest.mark.parametrize("fails", [False, True], ids=["succeeds", "fails"])
def test_a_pipe_that_floods_stderr_is_read_to_its_end_and_a_failure_quotes_its_last_words(tmp_path, fails):
    """300 KB of warnings on stderr (more than a pipe holds) must neither block the command into a timeout nor
    hide why it failed: the message quotes the end of what it printed."""
    from tests.conftest import FIXTURE, REPO

    wav = REPO / (FIXTURE / "wav.scp").read_text().split()[1]
    last_words = "exit 4" if fails else f"cat {wav}"
    command = f"sh -c 'yes warning: clipping | head -c 300000 >&2; echo the real reason >&2; {last_words}' |"
    (tmp_path / "wav.scp").write_text(f"u1 {command}\n")
    (tmp_path / "text").write_text("u1 hi\n")
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{tmp_path / 'wav.scp'},{tmp_path / 'text'}]",
                     f"++jsonl_file_out={tmp_path / 'o.jsonl'}", "++allow_pipe=true",
                     f"++pipe_timeout={hang_limit(30):.0f}", "++num_workers=1", timeout=120)
    assert "did not finish" not in result.stderr, result.stderr
    if fails:
        assert_user_error(result, "wav.scp:1: key 'u1'", "sh exited 4 saying: …", "the real reason. Fix")
        assert len(result.stderr) < 1000, result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert '"source_len"' in (tmp_path / "o.jsonl").read_text()


class _AuthHandler(SimpleHTTPRequestHandler):
    expected = "Basic " + base64.b64encode(b"reader:s3cr%t").decode()

    def do_GET(self):  # noqa: N802
        if self.headers.get("Authorization") != self.expected:
            self.send_error(401, "who are you")
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def auth_server(tmp_path):
    data_list = _shards(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_AuthHandler, directory=str(data_list.parent)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield data_list, server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_url_with_user_info_is_read_and_its_password_never_shown(tmp_path, auth_server, capfd):
    data_list, port = auth_server
    names = [Path(x).name for x in data_list.read_text().splitlines()]
    good = tmp_path / "good.list"
    good.write_text("".join(f"http://reader:s3cr%25t@127.0.0.1:{port}/{n}\n" for n in names))
    rc, err = corpus_io("bench-loader", f"++data_list={good}", "++dataset_conf.num_workers=0",
                        "++dataset_conf.feats_type=raw", "++train=false", capfd=capfd)
    assert rc == 0, err
    bad = tmp_path / "bad.list"
    bad.write_text(f"http://reader:wrong-pass@127.0.0.1:{port}/{names[0]}\n")
    rc, err = corpus_io("bench-loader", f"++data_list={bad}", "++dataset_conf.num_workers=0",
                        "++dataset_conf.feats_type=raw", "++dataset_conf.retries=1", capfd=capfd)
    assert rc == 2 and "HTTP 401" in err and "wrong-pass" not in err, err
    rc, err = corpus_io("verify-shards", f"++input={bad}", "++num_workers=1", capfd=capfd)
    out = capfd.readouterr().out
    assert rc == 2 and "wrong-pass" not in err + out and "reader" not in err + out, err + out
    from corpus_io.errors import DataError

    assert str(DataError("cannot open s3://AKIA:topsecret@bucket/x.tar")) == "cannot open s3://***@bucket/x.tar"
