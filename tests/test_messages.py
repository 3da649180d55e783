"""Every message leads somewhere: a suggested ``++key`` is a key of each command that can print it, a data error
names the file and line (or shard and member) and the key, and the Kaldi tables scp2jsonl reads jsonl2scp writes
back."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from corpus_io.commands import COMMANDS, SCHEMAS
from corpus_io.config import all_keys
from corpus_io.config.fields import nested_schema, schema_fields
from corpus_io.jobs.parts import JOB_COMMANDS
from tests.conftest import REPO, assert_user_error, run_cli
from tests.storage.test_remote import _StallServer
from tests.test_layering import source_modules

# Which commands can print a message is read from the source: a walk from each command's function (and the CLI's
# dispatch, and the schema classes whose help texts its --help prints) through every name the code mentions
# (functions, classes, module constants, "module:function" strings), function-level imports included. A
# ``++key`` in a message must then be a key of every command that reaches it, unless the message addresses another
# command by name: ``corpus-io make-lm ++input=a`` (in the same sentence), ``make-datalist: ++data_type=raw``,
# ``scp2jsonl ++allow_pipe=true``, ``average with ++metric=loss``, ``the loader: ++dataset_conf.x`` (the commands
# with a dataset_conf). A command a message addresses is told its own key there, so the message's other,
# unaddressed suggestions are for the rest. The tables below hold what a walk over names cannot see.

#: ``++key`` in a message, literal (a key assembled from ``{prefix}`` is checked by the tests that raise it)
SUGGESTION = re.compile(r"\+\+([A-Za-z_][\w.\[\]]*)")

#: code a command enters only when its config says so (the condition is in the caller): node -> (test of the
#: command's top-level schema fields, where the condition is)
GUARDED: dict[str, tuple] = {
    "corpus_io.jobs.executors:run_on_dask": (lambda fields: "executor" in fields,
                                             "cli/_app.py: cfg.executor == 'dask'"),
    "corpus_io.config.funasr:_funasr_dataset": (lambda fields: {"train_conf", "model"} <= set(fields),
                                                "config/funasr.py apply_funasr_keys: train.py's top level"),
    "corpus_io.config.funasr:_funasr_top_keys": (lambda fields: {"train_conf", "model"} <= set(fields),
                                                 "config/funasr.py apply_funasr_keys: train.py's top level"),
    "corpus_io.config.funasr:funasr_group_overrides": (lambda fields: "train_conf" in fields,
                                                       "config/compose.py compose: a schema with a train_conf"),
}
#: code reached through data, not names: node -> the nodes it runs
THROUGH_DATA = {
    # hydra's instantiate of the model block: the classes conf/model/*.yaml name in _target_
    "corpus_io.model.model:build_model": sorted({":".join(yaml.safe_load(p.read_text())["_target_"].rsplit(".", 1))
                                                for p in (REPO / "conf" / "model").glob("*.yaml")}),
}
#: what a command runs besides its function: merge-jobs, the merge and part keys of the command whose parts it
#: finds (jobs.JOB_COMMANDS, looked up by the parts' command, not by merge-jobs' name)
ROOTS = {"merge-jobs": [spec for row in JOB_COMMANDS.values() for spec in row[2:] if spec]}

#: the commands that run the loader (a dataset_conf block): "the loader" in a message
LOADER = tuple(c.name for c in COMMANDS if "dataset_conf" in schema_fields(c.schema))
_RERUN = "merge-jobs tells how to run (again) the jobs of the command whose parts it merges"
#: one suggestion at one node, and the commands that can print it where the walk sees more (a condition on a
#: value), or the command it addresses where the message cannot name it: (node, key) -> (commands, why)
SITE_RULES: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    **{(node, key): (tuple(JOB_COMMANDS), _RERUN) for key in ("num_jobs", "job_index")
       for node in ("corpus_io.jobs.parts:find_place", "corpus_io.jobs.parts:load_parts")},
    ("corpus_io.shards.pack_merge:_refuse_absent_objects", "num_jobs"): (("pack-shards",), _RERUN),
    ("corpus_io.shards.pack_merge:_refuse_absent_objects", "job_index"): (("pack-shards",), _RERUN),
    ("corpus_io.shards.pack_merge:_refuse_records_the_shards_deny", "num_jobs"): (("pack-shards",), _RERUN),
    ("corpus_io.shards.pack_merge:_refuse_records_the_shards_deny", "job_index"): (("pack-shards",), _RERUN),
    ("corpus_io.train.trainer:Trainer", "train_conf.ignore_init_mismatch"): (
        ("train",), "only train builds a Trainer (the walk reaches it from make-tokenizer through a name it shares)"),
    **{("corpus_io.infer.score:judgement_of", key): (("score",), "merge-jobs of score warns as score does: the keys "
                                                                  "are score's")
       for key in ("max_median_cer", "max_cer_spread", "cer_ceiling", "loss_per_token_ceiling")},
    ("corpus_io.infer.decode:refuse_others_outputs", "output_dir"): (
        ("decode", "align", "score"), "merge-jobs of score refuses as score does, naming score and its key"),
    ("corpus_io.shards.verify:_report", "input"): (
        ("verify-shards",), "merge-jobs reports the joined verification as one verify-shards run does, to its user"),
    ("corpus_io.commands:COMMANDS", "num_jobs"): (tuple(JOB_COMMANDS),
                                                  "merge-jobs' help: the keys of the jobs it joins"),
    ("corpus_io.commands:COMMANDS", "job_index"): (tuple(JOB_COMMANDS),
                                                   "merge-jobs' help: the keys of the jobs it joins"),
    ("corpus_io.storage.objects:_failed", "storage_options"): (
        ("pack-shards",), "only pack-shards writes s3:// objects (the other commands refuse a URL output); KNOWN GAP, "
                          "reported: merge-jobs of an s3:// output is told it too, but has no storage_options "
                          "(environment credentials only; jobs.py is being edited elsewhere)"),
    ("corpus_io.jobs.parts:find_place", "what"): (
        ("merge-jobs",), "executors.run_on_dask merges with what=<the tag its jobs write>: only merge-jobs can "
                         "meet the parts of several commands"),
    ("corpus_io.loader.rawlist:RawList", "dataset_conf.data_type"): (
        LOADER,
        "stats and explore refuse a missing input before (stats.run_stats, explore.catalog)"),
    ("corpus_io.loader.rawlist:jsonl_paths_of", "dataset_conf.data_type"): (
        LOADER,
        "KNOWN WRONG, reported: explore, which has no data_type key, is told ++dataset_conf.data_type=shard for a "
        "raw list naming a shard (rawlist.py is being edited elsewhere); remove this entry with the fix"),
}
#: modules no command runs (what they print reaches no command's user), and why
NO_COMMAND = {
    "corpus_io.api": "the Python API: its callers pass Python arguments",
    "corpus_io.tables.synth": "speech for tests, demos and benches",
    "corpus_io.infer.sherpa": "sherpa-onnx serving: recipes/tools/sherpa_decode.py and the stream bench call it",
}
_NAME = "|".join(sorted((re.escape(c.name) for c in COMMANDS), key=len, reverse=True)) + "|the loader"
#: ``make-datalist: ++a ++key``, ``pack-shards or make-datalist with ++key``, ``scp2jsonl ++key``
_BARE = re.compile(rf"(?<![\w-])((?:{_NAME})(?:(?:,\s*|\s+and\s+|\s+or\s+)(?:{_NAME}))*)(?:\s*:|\s+with)?"
                   rf"(?:\s+\+\+\S+)*\s+$")
_CORPUS_IO = re.compile(rf"corpus-io\s+({_NAME})(?![\w-])")


def _addressed(text: str, at: int) -> set[str]:
    """The commands the suggestion starting at ``text[at]`` is addressed to by name (none: to whoever prints it)."""
    bare = _BARE.search(text[:at])
    if bare:
        names = re.findall(_NAME, bare.group(1))
    else:
        sentence = re.split(r"[.;]\s", text[:at])[-1]
        names = [m.group(1) for m in _CORPUS_IO.finditer(sentence)][-1:]
    return {c for n in names for c in (LOADER if n == "the loader" else (n,))}


def _accepted_by(command: str, key: str) -> bool:
    """A dotted key ``command``'s schema takes (a key under a dict-valued key, e.g. storage_options.x, too)."""
    schema = SCHEMAS[command]
    key = re.sub(r"\[\d*\]", "", key).rstrip(".")
    keys = set(all_keys(schema))
    if key in keys or any(k.startswith(key + ".") for k in keys):
        return True
    parts = key.split(".")
    for i in range(1, len(parts)):  # storage_options.read_timeout: an entry of a dict-valued key
        owner, head = _schema_at(schema, parts[:i - 1]), parts[i - 1]
        if owner is not None and head in schema_fields(owner) and "Dict" in str(schema_fields(owner)[head].type):
            return True
    return False


def _schema_at(schema: type, path: list[str]) -> type | None:
    for part in path:
        f = schema_fields(schema).get(part)
        schema = nested_schema(f, schema) if f is not None else None
        if schema is None:
            return None
    return schema


def _schemas(schema: type) -> list[type]:
    nested = [nested_schema(f, schema) for f in dataclasses.fields(schema)]
    return [schema] + [s for n in nested if n is not None for s in _schemas(n)]


TOP = "<module>"  # the node of a module's statements that bind no name (imports, `if TYPE_CHECKING:` ...)


def _binds(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _imports(nodes) -> dict[str, tuple[str, str | None]]:
    """``name -> (module, attribute)`` for the imports among ``nodes`` (``import a.b``: ``a -> (a, None)``)."""
    found = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                found[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update({a.asname or a.name: (node.module, a.name) for a in node.names})
    return found


class Code:
    """The source as a graph. A node is ``(module, name)``: a top-level function, class or assignment (a class
    with its methods, a function with its nested ones), or ``(module, TOP)``. Its edges are the names its code
    mentions (calls, references, ``"module:function"`` strings), resolved through imports and re-exports.
    Names only: an attribute of an object (``loader.state_dict()``) is reached through the object's class."""

    def __init__(self):
        self.trees = {m: ast.parse(p.read_text(encoding="utf-8"), str(p)) for m, p in source_modules()}
        self.stmts: dict[tuple[str, str], list[ast.stmt]] = {}
        self.imports = {}
        self._edges: dict[tuple[str, str], frozenset] = {}
        self._reach: dict[str, frozenset] = {}
        for module, tree in self.trees.items():
            for stmt in tree.body:
                for name in _binds(stmt) or [TOP]:
                    self.stmts.setdefault((module, name), []).append(stmt)
            top_level = [n for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.ClassDef)) for n in ast.walk(s)]
            self.imports[module] = _imports(top_level)

    def resolve(self, module: str, attr: str | None, depth: int = 0) -> tuple[str, str] | None:
        """The node ``module.attr`` names (``attr`` None: the module itself); None outside the source."""
        if attr is None:
            return (module, TOP) if module in self.trees else None
        if (module, attr) in self.stmts:
            return module, attr
        if module in self.trees and attr in self.imports[module] and depth < 10:  # a re-export (it shadows a
            return self.resolve(*self.imports[module][attr], depth + 1)      # submodule of the same name)
        return (f"{module}.{attr}", TOP) if f"{module}.{attr}" in self.trees else None

    def edges(self, node: tuple[str, str]) -> frozenset[tuple[tuple[str, str], str | None]]:
        """``(node, command)`` pairs: ``command`` is None, or the only command that takes the edge (the row of a
        table keyed by command names, as jobs.JOB_COMMANDS, or of corpus_io.commands.COMMANDS)."""
        if node not in self._edges:
            self._edges[node] = self._find_edges(node)
        return self._edges[node]

    def _find_edges(self, node: tuple[str, str]) -> frozenset[tuple[tuple[str, str], str | None]]:
        module = node[0]
        local = _imports(n for s in self.stmts[node] for n in ast.walk(s))

        def target(expr: ast.AST) -> tuple[str, str] | None:
            if isinstance(expr, ast.Name):
                if expr.id in local:
                    return self.resolve(*local[expr.id])
                if (module, expr.id) in self.stmts:
                    return module, expr.id
                return self.resolve(*self.imports[module][expr.id]) if expr.id in self.imports[module] else None
            if isinstance(expr, ast.Attribute):
                base = target(expr.value)
                return self.resolve(base[0], expr.attr) if base and base[1] == TOP else None
            if isinstance(expr, ast.Constant) and isinstance(expr.value, str):  # "module:function" (cli/_app.py)
                m = re.fullmatch(r"((?:corpus_io|cli)[\w.]*):(\w+)", expr.value)
                return self.resolve(m.group(1), m.group(2)) if m else None
            return None

        found = {((module, TOP), None)}
        found.update((tuple(t.split(":")), None) for t in THROUGH_DATA.get(f"{module}:{node[1]}", ()))
        found.update((t, tag) for n, tag in _tagged(self.stmts[node]) if (t := target(n)) is not None and t != node)
        return frozenset(found)

    def reach(self, command: str) -> frozenset[tuple[str, str]]:
        """The nodes ``command`` can run: its function, the CLI's dispatch and the schema classes of its config
        (their help texts), then everything they mention, entering GUARDED code only where its condition holds."""
        if command in self._reach:
            return self._reach[command]
        schema = SCHEMAS[command]
        run = next(c.run for c in COMMANDS if c.name == command)
        roots = [run, "cli._app:build_app", "corpus_io.commands:COMMANDS", *ROOTS.get(command, ())]
        todo = [tuple(r.split(":")) for r in roots] + [(s.__module__, s.__name__) for s in _schemas(schema)]
        fields = schema_fields(schema)
        seen: set[tuple[str, str]] = set()
        while todo:
            node = todo.pop()
            guard = GUARDED.get(f"{node[0]}:{node[1]}")
            if node in seen or node not in self.stmts or (guard and not guard[0](fields)):
                continue
            seen.add(node)
            todo.extend(target for target, tag in self.edges(node) if tag in (None, command))
        self._reach[command] = frozenset(seen)
        return self._reach[command]

    def messages(self):
        """``(node, command, line, text)`` for every string in the source but docstrings (an f-string's holes as
        ``{}``); ``command``: None, or the only command that prints it (a string in that command's table row)."""
        for node, stmts in self.stmts.items():
            docs, parts = set(), set()
            for n in [self.trees[node[0]]] + [n for s in stmts for n in ast.walk(s)]:
                body = getattr(n, "body", None)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and \
                        isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    docs.add(id(body[0].value))
                if isinstance(n, ast.JoinedStr):
                    parts.update(id(v) for v in n.values)
            for n, tag in _tagged(stmts):
                if isinstance(n, ast.JoinedStr):
                    text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values)
                    yield node, tag, n.lineno, text
                elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs | parts:
                    yield node, tag, n.lineno, n.value


def _tagged(stmts: list[ast.stmt]):
    """``(ast node, command)`` for every node under ``stmts``: ``command`` is None, or the command whose row of a
    table keyed by command names holds it (jobs.JOB_COMMANDS, a ``Command("name", ...)`` of corpus_io.commands)."""
    todo = [(s, None) for s in stmts]
    while todo:
        n, tag = todo.pop()
        if isinstance(n, ast.Dict) and n.keys and all(isinstance(k, ast.Constant) and k.value in SCHEMAS
                                                      for k in n.keys):
            todo.extend((v, k.value) for k, v in zip(n.keys, n.values))
            continue
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Command" and n.args \
                and isinstance(n.args[0], ast.Constant) and n.args[0].value in SCHEMAS:
            tag = n.args[0].value
        yield n, tag
        todo.extend((child, tag) for child in ast.iter_child_nodes(n))


@cache
def _code() -> Code:
    return Code()


def _wrong_suggestions(code: Code) -> tuple[list[str], set]:
    """Each suggestion some command that can print it does not accept; and the SITE_RULES entries used."""
    wrong, used = [], set()
    for node, tag, line, text in code.messages():
        found = [(m.group(1), m.start()) for m in SUGGESTION.finditer(text)]
        found = [(k, at) for k, at in found if k != "key" and not k.endswith(".")]  # the generic "++key=value"
        if not found:
            continue
        name = f"{node[0]}:{node[1]}"
        where = f"{name} (line {line})"
        printers = {c.name for c in COMMANDS if node in code.reach(c.name) and tag in (None, c.name)}
        if not printers and node[0] not in NO_COMMAND:
            wrong.append(f"{where}: no command reaches this message (a path the walk cannot see: add it to "
                         f"GUARDED, THROUGH_DATA or ROOTS; code no command runs: NO_COMMAND)")
        told = set().union(*(_addressed(text, at) for _, at in found))
        for key, at in found:
            who = _addressed(text, at) or printers - told
            if (name, key) in SITE_RULES:
                used.add((name, key))
                who = set(SITE_RULES[name, key][0])
            rejecting = sorted(c for c in who if not _accepted_by(c, key))
            if rejecting:
                wrong.append(f"{where}: ++{key}, which {', '.join(rejecting)} reject(s)")
    return wrong, used


@pytest.mark.slow
def test_every_suggested_key_is_a_key_of_each_command_that_can_print_it():
    wrong, used = _wrong_suggestions(_code())
    assert not wrong, "messages suggest keys a command that prints them does not accept:\n" + "\n".join(wrong)
    assert not set(SITE_RULES) - used, f"SITE_RULES entries no message needs: {sorted(set(SITE_RULES) - used)}"


def test_the_walk_tables_name_code_that_exists():
    code = _code()
    for name in [*GUARDED, *THROUGH_DATA, *(t for v in THROUGH_DATA.values() for t in v),
                 *(r for v in ROOTS.values() for r in v), *(n for n, _ in SITE_RULES)]:
        assert tuple(name.split(":")) in code.stmts, name
    assert set(NO_COMMAND) <= set(code.trees)


def test_the_walk_finds_who_prints_what():
    """The walk itself, on messages whose printers are known."""
    code = _code()
    # the original bug: a message only scp2jsonl prints, suggesting a key only the loader's commands take
    assert {c.name for c in COMMANDS if ("corpus_io.tables.manifest",
                                         "scp2jsonl") in code.reach(c.name)} == {"scp2jsonl"}
    assert not _accepted_by("scp2jsonl", "dataset_conf.read_timeout")
    assert _accepted_by("train", "dataset_conf.read_timeout")
    assert _accepted_by("scp2jsonl", "storage_options.read_timeout")  # an entry of a dict-valued key
    urls = {c.name for c in COMMANDS if ("corpus_io.storage.urls", "open_url") in code.reach(c.name)}
    assert {"scp2jsonl", "pack-shards", "train", "verify-shards"} <= urls
    assert ("corpus_io.model.cmvn", "load_cmvn") in code.reach("train")  # through conf/model's _target_
    assert ("corpus_io.jobs.executors", "run_on_dask") not in code.reach("train")  # GUARDED: train has no executor
    assert ("corpus_io.shards.pack_merge", "merge_parts") in code.reach("merge-jobs")  # ROOTS
    assert ("corpus_io.shards.pack_merge", "merge_parts") not in code.reach("scp2jsonl")  # JOB_COMMANDS: its own row
    text = "x: corpus-io make-lm ++unit=token and the tokenizer (++tokenizer.token_list=a). Or ++input=b"
    assert _addressed(text, text.index("++tokenizer")) == {"make-lm"}
    assert _addressed(text, text.index("++input")) == set()  # another sentence
    text = "(the loader: ++dataset_conf.data_type=raw; make-datalist and stats: ++data_type=raw)"
    assert _addressed(text, text.index("++data_type")) == {"make-datalist", "stats"}
    assert _addressed(text, text.index("++dataset_conf")) == set(LOADER)
    text = "scp2jsonl timed out; raise ++dataset_conf.read_timeout"
    assert _addressed(text, text.index("++")) == set()


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
    from corpus_io.loader.rawlist import RawList

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


@pytest.mark.slow
@pytest.mark.parametrize("command", ["verify-shards", "stats", "bench-loader", "train"])
def test_a_dead_s3_endpoint_is_one_paragraph_naming_the_endpoint_and_the_key_of_the_command(tmp_path, command):
    from tests.conftest import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    loader = command in ("bench-loader", "train")
    prefix = "++dataset_conf.storage_options" if loader else "++storage_options"
    # botocore's own retries of a refused connection (legacy mode: 5 attempts, random backoff) would add 5-15 s of
    # sleep to every attempt; one attempt each (a user's storage option, passed through) gives the same message
    options = [f"{prefix}.endpoint_url={endpoint}", f"{prefix}.key=k", f"{prefix}.secret=s",
               f"{prefix}.config_kwargs.retries.total_max_attempts=1"]
    if loader:  # one retry of the loader's own shows the lines
        options.append("++dataset_conf.retries=2")
    (tmp_path / "tokens.txt").write_text("<blank> 0\n<unk> 1\na 2\n<sos/eos> 3\n")
    tokens = f"++tokenizer.token_list={tmp_path / 'tokens.txt'}"
    args = {"verify-shards": ["++input=s3://corpus/data.list"], "stats": ["++input=s3://corpus/data.list"],
            "bench-loader": ["++data_list=s3://corpus/data.list", tokens],
            "train": ["++train_data_set_list=s3://corpus/data.list", tokens, f"++output_dir={tmp_path / 'exp'}"]}
    result = run_cli("corpus-io", command, *args[command], *options, cwd=tmp_path, timeout=240)
    key = "dataset_conf.storage_options.endpoint_url" if loader else "storage_options.endpoint_url"
    assert_user_error(result, f"s3://corpus/data.list: cannot connect to the object store at {endpoint}",
                      f"Check {key} or AWS_ENDPOINT_URL")
    lines = result.stderr.strip().splitlines()
    # one paragraph, after one line per retry of the list read (the loader's: an outage may pass)
    assert lines[-1].startswith("error:") and all("retrying in" in line for line in lines[:-1]), result.stderr
    assert len(lines) == (2 if loader else 1), result.stderr
    assert not list(tmp_path.glob("exp/*.pt*")) and not list(tmp_path.glob("*.png")), list(tmp_path.rglob("*"))


def test_make_datalist_of_a_parquet_row_that_is_not_audio_suggests_what_it_accepts_not_dataset_conf(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = (REPO / "tests/fixtures/corpus/wav/spk0-utt000.wav").read_bytes()
    src = tmp_path / "junk.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "audio": [{"bytes": good, "path": None},
                                                         {"bytes": b"not audio at all", "path": None}],
                             "text": ["x", "y"]}), src)
    before = src.read_bytes()
    result = run_cli("corpus-io", "make-datalist", f"++input={src}", f"++output={tmp_path / 'out' / 'data.list'}")
    assert_user_error(result, f"{src} row 1: key 'b': its audio bytes are not a known audio format",
                      "make-datalist, pack-shards or export with columns.audio=<column>")
    assert "dataset_conf" not in result.stderr  # a key make-datalist rejects
    message = result.stderr.split("error: ", 1)[1]
    for key in re.findall(r"(?:with |\+\+)([a-z_.]+)=", message):  # every key it names, make-datalist accepts
        assert _accepted_by("make-datalist", key), key
    assert src.read_bytes() == before and not (tmp_path / "out" / "data.list").exists()
