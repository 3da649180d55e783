"""sherpa-onnx (the [deploy] extra, pinned) runs export-model's ONNX file unchanged: the `make smoke` model exported,
its tokens.txt beside it, decoded by the real runtime's offline WeNet CTC recognizer from audio fed in 0.1 s pieces,
word for word against `corpus-io decode` of the same model; and tokens.txt's ▁ convention for every tokenizer."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from corpus_io.tokenizer import is_cjk
from tests.conftest import REPO, run_bounded, run_cli
from tests.recipes.test_smoke import smoke  # noqa: F401  (the session's `make smoke` run: its model and test sets)

SETS = ("test_digits", "test_digits_newvoice")  # the smoke model's held-out digit sets (its test_mixed CER is >100 %)


def _sherpa() -> None:
    try:
        import sherpa_onnx  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"sherpa-onnx is not importable ({exc}); install the [deploy] extra: "
                    f"pip install -c constraints.txt -e '.[deploy]'")


@pytest.fixture(scope="module")
def served(smoke, tmp_path_factory) -> dict:  # noqa: F811
    """The smoke model's average checkpoint exported to ONNX (features in), with the stdout of export-model."""
    out = tmp_path_factory.mktemp("served")
    result = run_cli("corpus-io", "export-model", f"++checkpoint={smoke['exp'] / 'model.pt.avg1'}",
                     f"++output={out / 'model.onnx'}")
    assert result.returncode == 0, result.stderr[-3000:]
    return {"model": out / "model.onnx", "tokens": out / "tokens.txt", "stdout": result.stdout}


#: sherpa-onnx in a child process: it ends the process (exit code 255) on a file it cannot load, which would end
#: the test session. Default arguments but feature_dim; "features": FeatureExtractorConfig fields replaced, the
#: recognizer rebuilt from its config. Audio in 0.1 s pieces. Prints {key: text} as JSON.
RECOGNIZE = """
import json, sys
import sherpa_onnx, soundfile as sf
job = json.loads(sys.argv[1])
recognizer = sherpa_onnx.OfflineRecognizer.from_wenet_ctc(model=job["model"], tokens=job["tokens"],
                                                          feature_dim=job["feature_dim"])
if job["features"]:
    for name, value in job["features"].items():
        setattr(recognizer.config.feat_config, name, value)
    recognizer.recognizer = type(recognizer.recognizer)(recognizer.config)
texts = {}
for key, path in job["rows"]:
    samples, rate = sf.read(path, dtype="float32")
    stream = recognizer.create_stream()
    for start in range(0, len(samples), rate // 10):
        stream.accept_waveform(rate, samples[start:start + rate // 10])
    recognizer.decode_stream(stream)
    texts[key] = stream.result.text
print(json.dumps(texts))
"""


def _recognize(model: Path, tokens: Path, rows: list[dict], *, features: dict | None = None) -> dict[str, str]:
    """sherpa-onnx's offline WeNet CTC recognizer on ``rows`` (feature_dim from the file's metadata)."""
    import onnx

    _sherpa()
    meta = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    job = {"model": str(model), "tokens": str(tokens), "feature_dim": int(meta["feature_dim"]),
           "features": features or {}, "rows": [(r["key"], r["source"]) for r in rows]}
    result = run_bounded([sys.executable, "-c", RECOGNIZE, json.dumps(job)], 300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _test_sets(smoke: dict) -> tuple[list[dict], dict[str, str]]:  # noqa: F811
    """The smoke run's digit test utterances and the words `corpus-io decode` (greedy, the same checkpoint) gave."""
    rows, decoded = [], {}
    for name in SETS:
        rows += [json.loads(line) for line in (smoke["data"] / name / "data.jsonl").read_text().splitlines()]
        for line in (smoke["exp"] / f"decode_{name}" / "text").read_text(encoding="utf-8").splitlines():
            key, _, text = line.partition(" ")
            decoded[key] = text
    assert len(rows) >= 20 and {r["key"] for r in rows} == set(decoded)
    return rows, decoded


def _agreement(texts: dict[str, str], decoded: dict[str, str]) -> tuple[float, list]:
    differ = [(k, texts[k], decoded[k]) for k in decoded if texts[k].split() != decoded[k].split()]
    return 1 - len(differ) / len(decoded), differ


@pytest.mark.slow
def test_sherpa_onnx_runs_the_export_with_default_arguments_and_prints_words_with_spaces(served, smoke):  # noqa: F811
    """Default arguments but feature_dim: sherpa computes fbank with its own settings (high_freq -400, snip_edges
    false), which are the features a model trained with corpus-io's defaults (the recipe's conf) learnt, so it gives
    `corpus-io decode`'s words on at least 95 % of the held-out utterances, training voices and new ones (issue 52;
    with Kaldi's band and framing, 79-92 %). The text has spaces between the words (tokens.txt's ▁)."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(served["model"]), load_external_data=False).metadata_props}
    assert (meta["high_freq"], meta["snip_edges"]) == ("-400", "false")  # the file says what the model trained on
    rows, decoded = _test_sets(smoke)
    texts = _recognize(served["model"], served["tokens"], rows)
    share, differ = _agreement(texts, decoded)
    print(f"sherpa-onnx default features: {share:.1%} of {len(rows)} utterances give corpus-io decode's words; "
          f"differ: {differ}", file=sys.stderr)
    spoken = [t for t in texts.values() if len(t.split()) >= 2]
    assert len(spoken) >= len(rows) // 2 and all(re.fullmatch(r"[a-z]+( [a-z]+)+", t) for t in spoken), texts
    assert share >= 0.95, differ


@pytest.mark.slow
def test_sherpa_onnx_with_the_files_feature_settings_gives_corpus_io_decodes_words(served, smoke):  # noqa: F811
    """The feature settings the file carries (low_freq, high_freq, snip_edges), given to sherpa's feature extractor
    (what a model trained on other features needs): the same words as `corpus-io decode` on at least 95 % of the
    utterances (the file's graph, its CMVN inside, the int16 sample scale and tokens.txt are what sherpa needs)."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(served["model"]), load_external_data=False).metadata_props}
    assert meta["model_type"] == "wenet_ctc" and meta["subsampling_factor"] == "4"
    assert int(meta["vocab_size"]) == len(served["tokens"].read_text(encoding="utf-8").splitlines())
    assert (meta["sample_scale"], meta["dither"], meta["window_type"]) == ("int16", "0", "povey")
    rows, decoded = _test_sets(smoke)
    texts = _recognize(served["model"], served["tokens"], rows,
                       features={"low_freq": float(meta["low_freq"]), "high_freq": float(meta["high_freq"]),
                                 "snip_edges": meta["snip_edges"] == "true"})
    share, differ = _agreement(texts, decoded)
    print(f"sherpa-onnx with the file's feature settings: {share:.1%} of {len(rows)} utterances give corpus-io "
          f"decode's words", file=sys.stderr)
    assert share >= 0.95, differ


@pytest.mark.slow
def test_the_export_names_no_directory_of_the_training_run_and_decode_still_runs_it(served, smoke, tmp_path):  # noqa: F811,E501
    """The training config inside the file has its absolute paths (data lists, output_dir, token list, CMVN file,
    noise list) cut to base names: no byte of the file names the run's directories; decode of the file still gives
    the checkpoint's words."""
    data = served["model"].read_bytes()
    config = (smoke["exp"] / "config.yaml").read_text(encoding="utf-8")
    run_dirs = {str(smoke["data"]), str(smoke["exp"]), str(smoke["data"].parent)}
    assert all(d in config for d in run_dirs - {str(smoke["data"].parent)})  # the training config names them
    for directory in run_dirs:
        assert directory.encode() not in data, directory
    name = "test_digits"
    result = run_cli("corpus-io", "decode", f"++data_list={smoke['data'] / name / 'raw.list'}",
                     "++dataset_conf.data_type=raw", f"++checkpoint={served['model']}",
                     f"++output_dir={tmp_path / 'dec'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "dec" / "text").read_text(encoding="utf-8") == \
        (smoke["exp"] / f"decode_{name}" / "text").read_text(encoding="utf-8")
    assert f"-> {served['model']} and {served['tokens']} (sherpa-onnx's tokens.txt" in served["stdout"]


# --------------------------------------------------------------------------- tokens.txt, without a model


def _tokenizer(tmp_path: Path, tokens: list[str], **conf):
    from corpus_io.config import TokenizerConf
    from corpus_io.tokenizer import build_tokenizer, write_token_list

    path = tmp_path / "tokens.txt"
    write_token_list(path, tokens)
    return build_tokenizer(TokenizerConf(token_list=str(path), **conf))


def _sherpa_table(text: str) -> dict[int, str]:
    """tokens.txt read as sherpa-onnx's SymbolTable reads it (``symbol id`` per line), a leading ▁ printed as a
    space: the text sherpa prints for ids is the concatenation, its first space dropped."""
    table = {}
    for line in text.splitlines():
        symbol, idx = line.split(" ")
        table[int(idx)] = " " + symbol[1:] if symbol.startswith("\u2581") else symbol
    return table


def _printed(table: dict[int, str], ids: list[int]) -> str:
    text = "".join(table[i] for i in ids)
    return text[1:] if text.startswith(" ") else text


def test_tokens_txt_makes_sherpa_print_corpus_io_decodes_text_for_words_letters_and_cjk(tmp_path):
    from corpus_io.infer.export import sherpa_tokens

    cases = [({"latin_unit": "word"}, ["five", "eight", "nine", "中", "国"], "five eight nine nine"),
             ({"latin_unit": "word"}, ["five", "eight", "nine", "中", "国"], "中国"),
             ({"latin_unit": "letter"}, list("fiveght") + ["\u2581"], "five eight"),
             ({"type": "word"}, ["five", "eight", "中国"], "five eight")]
    for conf, tokens, text in cases:
        tok = _tokenizer(tmp_path, tokens, **conf)
        written = sherpa_tokens(tok)
        table = _sherpa_table(written)
        assert [line.split(" ")[1] for line in written.splitlines()] == [str(i) for i in range(tok.vocab_size)]
        assert written.splitlines()[0] == "<blank> 0"  # the blank sherpa's greedy search looks for
        ids = tok.encode(text)
        assert _printed(table, ids) == tok.decode(ids) == text, (conf, written)
        assert all(not is_cjk(s) or table[i] == s for i, s in enumerate(tok.symbols))  # CJK bare


def test_export_writes_tokens_txt_beside_the_onnx_file_and_refuses_one_that_is_an_input(trained, tmp_path,
                                                                                         capfd):
    from tests.infer.test_export import _checkpoint_naming
    from tests.test_hostile import corpus_io as in_process

    ckpt, tokens, cmvn = _checkpoint_naming(trained, tmp_path)
    kept = tokens.read_bytes()
    rc, err = in_process("export-model", f"++checkpoint={ckpt}", f"++output={tmp_path / 'm.onnx'}", capfd=capfd)
    assert rc == 2 and f"tokens.txt beside ++output ({tmp_path / 'tokens.txt'}) is the input tokenizer.token_list" \
        in err and "Traceback" not in err, err
    assert tokens.read_bytes() == kept and not (tmp_path / "m.onnx").exists()
    out = tmp_path / "served" / "m.onnx"
    rc, err = in_process("export-model", f"++checkpoint={ckpt}", f"++output={out}", capfd=capfd)
    assert rc == 0, err
    from corpus_io.tokenizer import read_token_list

    symbols = read_token_list(str(tokens))
    written = (out.parent / "tokens.txt").read_text(encoding="utf-8").splitlines()
    assert len(written) == len(symbols) and written[0] == "<blank> 0"
    assert [line.rsplit(" ", 1)[0].lstrip("\u2581") for line in written] == symbols
    # no temp file left; tokens.txt's record (export-model wrote it for m.onnx, so a re-export may replace it)
    assert sorted(p.name for p in out.parent.iterdir()) == [".tokens.txt.json", "m.onnx", "tokens.txt"]


# --------------------------------------------------------------------------- recipes/tools/sherpa_decode.py

TOOL = REPO / "recipes" / "tools" / "sherpa_decode.py"


def _tool(args: list, capfd, monkeypatch) -> tuple[int, str]:
    """sherpa_decode.py ARGS in this process (its main, as its command line runs it): (exit code, stderr)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sherpa_decode_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [str(TOOL), *map(str, args)])
    capfd.readouterr()
    try:
        code = module.main()
    except SystemExit as exc:
        code = exc.code
    return code, capfd.readouterr().err


def test_sherpa_decode_checks_its_arguments_and_inputs_in_one_paragraph_and_never_writes_over_an_input(
        trained, streaming_trained, corpus, tmp_path, capfd, monkeypatch):
    """Each mistake the hostile round found is one paragraph and exit 2, before sherpa-onnx is given anything (it
    ends the process on a bad argument: --chunk-size 0 was a SIGFPE) and before anything is written: the wrong
    --feature-dim, an offline recognizer on a streaming export and the reverse, chunk sizes below 1, a missing
    --compare file, OUT_DIR/text that is --compare, the list or a decode's text, NaN audio. A FunASR
    source/target JSONL is read, and a rerun replaces the tool's own outputs."""
    import numpy as np
    import onnx
    import soundfile as sf

    from tests.test_hostile import corpus_io as in_process

    _sherpa()
    off, on = tmp_path / "off" / "model.onnx", tmp_path / "on" / "model.onnx"
    for ckpt, path, extra in ((trained["out"], off, ()), (streaming_trained["out"], on, ("++streaming=true",))):
        rc, err = in_process("export-model", f"++checkpoint={ckpt / 'model.pt.avg2'}", f"++output={path}", *extra,
                             capfd=capfd)
        assert rc == 0, err
    dim = int({p.key: p.value for p in onnx.load(str(off), load_external_data=False).metadata_props}["feature_dim"])
    rows = [json.loads(line) for line in Path(corpus["raw"]).read_text(encoding="utf-8").splitlines()[:3]]
    funasr = tmp_path / "list.jsonl"
    funasr.write_text("".join(json.dumps({"key": r["key"], "source": r["wav"], "target": r["txt"]}) + "\n"
                              for r in rows), encoding="utf-8")
    decoded = tmp_path / "dec"
    decoded.mkdir()
    (decoded / "text").write_text("".join(f"{r['key']} {r['txt']}\n" for r in rows), encoding="utf-8")
    kept = (decoded / "text").read_bytes()
    nan = tmp_path / "nan.wav"
    sf.write(nan, np.array([0.1, float("nan")] * 8000, np.float32), 16000, subtype="FLOAT")
    nan_list = tmp_path / "nan.jsonl"
    nan_list.write_text(json.dumps({"key": "nan", "source": str(nan), "target": "x"}) + "\n")
    offline = [off, off.parent / "tokens.txt", funasr]
    online = [on, on.parent / "tokens.txt", funasr]
    cases = [([*offline, tmp_path / "o1", "--feature-dim", dim + 1], f"give {dim} (--feature-dim {dim})"),
             ([*online, tmp_path / "o2", "--feature-dim", dim], "is a streaming export"),
             ([*offline, tmp_path / "o3", "--feature-dim", dim, "--online"], "is a full-context export"),
             ([*online, tmp_path / "o4", "--feature-dim", dim, "--online", "--chunk-size", "-3"], "chunk size is -3"),
             ([*online, tmp_path / "o5", "--feature-dim", dim, "--online", "--left-chunks", "-1"],
              "number of left chunks is -1"),
             ([*offline, tmp_path / "o6", "--feature-dim", dim, "--compare", tmp_path / "none"],
              f"--compare {tmp_path / 'none'} does not exist"),
             ([*offline, decoded, "--feature-dim", dim, "--compare", decoded / "text"],
              f"OUT_DIR/text ({decoded / 'text'}) is the input --compare"),
             ([*offline, decoded, "--feature-dim", dim], f"OUT_DIR/text {decoded / 'text'} exists, and "
                                                        f"sherpa_decode.py did not write it"),
             ([off, off.parent / "tokens.txt", decoded / "text", decoded, "--feature-dim", dim],
              f"OUT_DIR/text ({decoded / 'text'}) is the input LIST"),
             ([off, off.parent / "tokens.txt", nan_list, tmp_path / "o7", "--feature-dim", dim],
              "the audio holds 8000 non-finite samples")]
    for args, message in cases:
        code, err = _tool(args, capfd, monkeypatch)
        assert code == 2 and message in err and "Traceback" not in err, (args, err)
        assert len(err.strip().splitlines()) == 1, err
    assert (decoded / "text").read_bytes() == kept
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 8))
    out = tmp_path / "served"
    zero = run_bounded([sys.executable, str(TOOL), *map(str, online), str(out), "--feature-dim", str(dim),
                        "--online", "--chunk-size", "0"], 120)
    assert zero.returncode == 2 and "the chunk size is 0" in zero.stderr and "Traceback" not in zero.stderr, zero
    for _ in range(2):  # the second run replaces the first's outputs
        result = run_bounded([sys.executable, str(TOOL), *map(str, online), str(out), "--feature-dim", str(dim),
                              "--online", "--compare", str(decoded / "text")], 300)
        assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(line.split(" ")[0] for line in (out / "text").read_text(encoding="utf-8").splitlines()) == \
        sorted(r["key"] for r in rows)
    assert f"same words as corpus-io decode ({decoded / 'text'}): " in (out / "summary.txt").read_text()
    assert (decoded / "text").read_bytes() == kept
