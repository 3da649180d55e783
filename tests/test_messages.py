"""Every message leads somewhere: a suggested ``++key`` is a key the command accepts, a data error names the
file and line (or shard and member) and the key, and the Kaldi tables scp2jsonl reads jsonl2scp writes back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli.commands import COMMANDS
from corpus_io.config import all_keys
from corpus_io.config.fields import schema_fields
from tests.conftest import REPO, assert_user_error, run_cli
from tests.test_remote import _StallServer

#: ``++key`` in a message, literal (a key assembled from ``{prefix}`` is checked by the tests that raise it)
SUGGESTION = re.compile(r"\+\+([A-Za-z_][\w.\[\]]*)")


def _accepted(key: str) -> bool:
    """A dotted key some command's schema takes (a key under a dict-valued key, e.g. storage_options.x, too)."""
    key = re.sub(r"\[\d*\]", "", key).rstrip(".")
    for c in COMMANDS:
        keys = set(all_keys(c.schema))
        if key in keys or any(k.startswith(key + ".") for k in keys):
            return True
        head, _, rest = key.partition(".")
        if rest and head in schema_fields(c.schema) and "Dict" in str(schema_fields(c.schema)[head].type):
            return True
    return False


def test_every_suggested_key_in_the_code_is_a_key_a_command_accepts():
    wrong = []
    for path in sorted((REPO / "corpus_io").rglob("*.py")) + sorted((REPO / "cli").rglob("*.py")):
        for m in SUGGESTION.finditer(path.read_text(encoding="utf-8")):
            key = m.group(1)
            if key in ("key",) or key.endswith("."):  # the generic "++key=value" of the override syntax
                continue
            if not _accepted(key):
                wrong.append(f"{path.relative_to(REPO)}: ++{key}")
    assert not wrong, "messages suggest keys no command accepts: " + ", ".join(wrong)


@pytest.mark.parametrize("command", ["scp2jsonl", "pack-shards"])
def test_a_stalled_server_names_the_timeout_key_of_the_command_that_stalled(tmp_path, command):
    server = _StallServer(body=False)
    url = f"{server.base}/a.wav"
    try:
        (tmp_path / "wav.scp").write_text(f"u1 {url}\n")
        (tmp_path / "text").write_text("u1 hello\n")
        args = {"scp2jsonl": [f"++scp_file_list=[{tmp_path / 'wav.scp'},{tmp_path / 'text'}]",
                              "++data_type_list=[source,target]", f"++jsonl_file_out={tmp_path / 'o.jsonl'}"],
                "pack-shards": [f"++input={tmp_path}", f"++output_dir={tmp_path / 'shards'}"]}[command]
        result = run_cli("corpus-io", command, *args, "++storage_options.read_timeout=1", timeout=120)
    finally:
        server.close()
    assert_user_error(result, "++storage_options.read_timeout", url)
    assert "dataset_conf.read_timeout" not in result.stderr  # a key these commands reject


def test_a_missing_wav_in_a_raw_list_names_the_list_line_and_key(tmp_path):
    from corpus_io.rawlist import RawList

    raw = tmp_path / "raw.list"
    good = json.dumps({"key": "a", "wav": str(REPO / "tests/fixtures/corpus/wav/spk0-utt000.wav"), "txt": "x"})
    raw.write_text(good + "\n\n" + json.dumps({"key": "gone", "wav": str(tmp_path / "gone.wav"), "txt": "y"}) + "\n")
    from corpus_io.errors import DataError

    with pytest.raises(DataError) as err:
        RawList(str(raw)).sample(1)
    assert f"{raw}:3: key 'gone'" in str(err.value) and "gone.wav does not exist" in str(err.value)
    assert "wav.scp" not in str(err.value)


@pytest.mark.parametrize("space", ["\u00a0", "\u3000"])
def test_a_key_scp2jsonl_reads_from_a_kaldi_table_jsonl2scp_writes_back(tmp_path, space):
    key = f"utt{space}1"
    wav = Path(REPO / "tests/fixtures/corpus/wav/spk0-utt000.wav")
    (tmp_path / "wav.scp").write_text(f"{key} {wav}\n", encoding="utf-8")
    (tmp_path / "text").write_text(f"{key} hello\n", encoding="utf-8")
    jsonl = tmp_path / "a.jsonl"
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{tmp_path / 'wav.scp'},{tmp_path / 'text'}]",
                     "++data_type_list=[source,target]", f"++jsonl_file_out={jsonl}")
    assert result.returncode == 0, result.stderr
    result = run_cli("corpus-io", "jsonl2scp", f"++jsonl_file_in={jsonl}", f"++scp_file_list=[{tmp_path / 'w2'},"
                     f"{tmp_path / 't2'}]", "++data_type_list=[source,target]")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "t2").read_text(encoding="utf-8") == f"{key} hello\n"
