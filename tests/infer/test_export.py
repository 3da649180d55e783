"""export-model: ONNX and TorchScript files of the shared training run's model, checked against PyTorch on 20
real utterances of different lengths, decoded by decode, with and without the fbank front end inside; files
that are not ours refused; docs/DECODING.md's Python snippet run as written."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from corpus_io.errors import ConfigError
from tests.conftest import REPO, assert_user_error, doc_search, run_bounded, run_cli
from tests.test_hostile import corpus_io as in_process


def _twenty(corpus: dict, tmp_path: Path) -> Path:
    """A raw list of 20 of the fixture utterances (lengths 1-4 s, at 8, 16 and 44.1 kHz: resampled to 16 kHz)."""
    lines = Path(corpus["raw"]).read_text(encoding="utf-8").splitlines()[:20]
    out = tmp_path / "twenty.list"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> dict:
    """The average checkpoint exported four ways (ONNX, TorchScript; features or waveforms in), in-process."""
    out = tmp_path_factory.mktemp("exported")
    ckpt = trained["out"] / "model.pt.avg2"
    files = {}
    for name, args in (("onnx", ["++format=onnx"]), ("ts", ["++format=torchscript"]),
                       ("fe.onnx", ["++format=onnx", "++frontend=true"]),
                       ("fe.ts", ["++format=torchscript", "++frontend=true"])):
        path = out / f"model.{name}"
        result = run_cli("corpus-io", "export-model", f"++checkpoint={ckpt}", f"++output={path}", *args)
        assert result.returncode == 0, result.stderr[-3000:]
        gap = float(re.search(r"difference\| to PyTorch on a check batch (\S+)", result.stdout).group(1))
        assert gap < 1e-4, result.stdout
        files[name] = path
    return {"ckpt": ckpt, **files}


def _batches(ckpt: Path, data_list: Path, *, feats_on: str) -> tuple[list, object, object]:
    """The loader's batches of ``data_list`` as decode builds them (features or waveforms), the model, the conf."""
    from corpus_io.config import DecodeConfig
    from corpus_io.infer.decode import decode_dataset_conf, load_model
    from corpus_io.loader.dataset import build_dataloader

    model, tokenizer, tcfg = load_model(str(ckpt), torch.device("cpu"))
    user = DecodeConfig().dataset_conf
    user.data_type, user.num_workers, user.batch_size = "raw", 0, 8
    conf = decode_dataset_conf(user, tcfg.dataset_conf)
    conf.feats_on = feats_on
    batches = list(build_dataloader(str(data_list), conf, tokenizer, train=False, rank=0, world_size=1))
    return batches, model, conf


def _compare(ref: tuple, got: tuple) -> float:
    """The largest log-prob difference over valid frames; lengths must be equal."""
    (lp, n), (lp2, n2) = ref, got
    assert torch.equal(n, n2.cpu())
    valid = torch.arange(lp.shape[1])[None, :] < n[:, None]
    return float((lp - lp2.cpu()).abs()[valid].max())


def _hypotheses(log_probs: torch.Tensor, lengths: torch.Tensor) -> tuple[list, list]:
    from corpus_io.decoding.beam import ctc_prefix_beam_search
    from corpus_io.train.steps import greedy_ids

    beam = [[(h.ids, round(h.score, 3)) for h in hyps] for hyps in ctc_prefix_beam_search(log_probs, lengths, beam=8)]
    return greedy_ids(log_probs, lengths), beam


def _same_hypotheses(ref: tuple, got: tuple) -> None:
    g1, b1 = _hypotheses(*ref)
    g2, b2 = _hypotheses(*got)
    assert g1 == g2
    assert [[ids for ids, _ in row] for row in b1] == [[ids for ids, _ in row] for row in b2]
    for r1, r2 in zip(b1, b2):
        assert all(abs(s1 - s2) < 1e-2 for (_, s1), (_, s2) in zip(r1, r2))


def test_the_explicit_mask_path_equals_the_model_with_its_hooks():
    from corpus_io.infer.export import ExportedCTC
    from corpus_io.model.model import ConformerCTC

    torch.manual_seed(0)
    for pos in ("no_pos", "abs_pos"):
        model = ConformerCTC(80, 30, output_size=64, attention_heads=4, linear_units=128, num_blocks=2,
                             subsampling_channels=16, pos_enc_layer_type=pos).eval()
        feats = torch.randn(4, 230, 80) * 3
        lengths = torch.tensor([230, 171, 40, 9])
        with torch.no_grad():
            ref = model(feats, lengths)
            got = ExportedCTC(model).eval()(feats, lengths)
        assert torch.equal(ref[1], got[1])
        assert (ref[0] - got[0]).abs().max() <= 1e-6, pos


def test_onnx_and_torchscript_equal_pytorch_on_20_utterances_with_the_same_hypotheses(exported, corpus, tmp_path):
    from corpus_io.infer.exported import load_exported
    from corpus_io.model.frontend import build_front_end, model_inputs

    batches, model, conf = _batches(exported["ckpt"], _twenty(corpus, tmp_path), feats_on="loader")
    assert sum(len(b["keys"]) for b in batches) == 20
    assert len({int(n) for b in batches for n in b["feats_lengths"]}) >= 15  # different lengths
    front_end = build_front_end(conf, torch.device("cpu"))
    gaps = {}
    for name, limit in (("onnx", 1e-4), ("ts", 1e-5)):
        runner = load_exported(str(exported[name]), torch.device("cpu"))[0]
        gaps[name] = 0.0
        for batch in batches:
            feats, lengths = model_inputs(front_end, batch, torch.device("cpu"), train=False)
            with torch.no_grad():
                ref = model(feats, lengths)
            got = runner(feats, lengths)
            gaps[name] = max(gaps[name], _compare(ref, got))
            _same_hypotheses(ref, got)
        assert gaps[name] <= limit, (name, gaps[name])
    print(f"max |log-prob difference| over 20 utterances: {gaps}")


def test_with_the_front_end_inside_the_file_equals_feats_on_model(exported, corpus, tmp_path):
    from corpus_io.infer.exported import load_exported
    from corpus_io.model.frontend import build_front_end, model_inputs

    batches, model, conf = _batches(exported["ckpt"], _twenty(corpus, tmp_path), feats_on="model")
    front_end = build_front_end(conf, torch.device("cpu"))
    gaps = {}
    for name, limit in (("fe.onnx", 1e-4), ("fe.ts", 1e-5)):
        runner = load_exported(str(exported[name]), torch.device("cpu"))[0]
        assert runner.inputs == "waveform"
        gaps[name] = 0.0
        for batch in batches:
            with torch.no_grad():
                ref = model(*model_inputs(front_end, batch, torch.device("cpu"), train=False))
            got = runner(batch["wav"], batch["wav_lengths"])
            gaps[name] = max(gaps[name], _compare(ref, got))
            _same_hypotheses(ref, got)
        assert gaps[name] <= limit, (name, gaps[name])
    print(f"max |log-prob difference| with the front end, over 20 utterances: {gaps}")


def test_the_front_end_of_either_framing_exports_in_onnx_and_torchscript_and_the_file_says_which(
        trained, corpus, tmp_path):
    """The trained model has the default features (sherpa-onnx's: snip_edges=false, each row reflected at its own
    length); the same weights with Kaldi's framing (fbank_conf.snip_edges=true, high_freq=0): the front end inside
    the file computes only the frames that fit, as feats_on=model does, and each file says its snip_edges."""
    from omegaconf import OmegaConf

    from corpus_io.infer.exported import load_exported
    from corpus_io.model.frontend import build_front_end, model_inputs

    state = torch.load(trained["out"] / "model.pt.avg2", map_location="cpu", weights_only=True)
    config = OmegaConf.create(state["config"])
    config.dataset_conf.fbank_conf.high_freq, config.dataset_conf.fbank_conf.snip_edges = 0.0, True
    state["config"] = OmegaConf.to_yaml(config)
    ckpt = tmp_path / "model.pt"
    torch.save(state, ckpt)
    batches, model, conf = _batches(ckpt, _twenty(corpus, tmp_path), feats_on="model")
    assert conf.fbank_conf.snip_edges is True
    front_end = build_front_end(conf, torch.device("cpu"))
    for fmt, limit in (("onnx", 1e-4), ("torchscript", 1e-5)):
        path = tmp_path / f"model.{'onnx' if fmt == 'onnx' else 'ts'}"
        result = run_cli("corpus-io", "export-model", f"++checkpoint={ckpt}", f"++output={path}", f"++format={fmt}",
                         "++frontend=true")
        assert result.returncode == 0, result.stderr[-3000:]
        runner = load_exported(str(path), torch.device("cpu"))[0]
        for batch in batches:
            assert torch.equal(batch["feats_lengths"], (batch["wav_lengths"] - 400) // 160 + 1)
            with torch.no_grad():
                ref = model(*model_inputs(front_end, batch, torch.device("cpu"), train=False))
            got = runner(batch["wav"], batch["wav_lengths"])
            assert _compare(ref, got) <= limit, fmt
            _same_hypotheses(ref, got)
    from corpus_io.infer.decode import load_model
    from corpus_io.infer.export import deploy_metadata

    _, tokenizer, tcfg = load_model(str(ckpt), torch.device("cpu"))
    assert deploy_metadata(tcfg, tokenizer)["snip_edges"] == "true"  # a features-in file tells sherpa-onnx
    _, tokenizer, tcfg = load_model(str(trained["out"] / "model.pt.avg2"), torch.device("cpu"))
    assert deploy_metadata(tcfg, tokenizer)["snip_edges"] == "false"


def test_decode_of_the_exported_files_gives_the_checkpoints_text_and_nbest(exported, corpus, tmp_path, capfd):
    data_list = _twenty(corpus, tmp_path)
    for method, names in (("greedy", ("ckpt", "fe.onnx")), ("ctc_prefix_beam", ("ckpt", "onnx", "ts"))):
        outputs = {}
        for name in names:
            out = tmp_path / f"{method}-{name}"
            rc, err = in_process("decode", f"++data_list={data_list}", "++dataset_conf.data_type=raw",
                                 f"++checkpoint={exported[name]}", f"++output_dir={out}",
                                 "++dataset_conf.num_workers=0", f"++decoding.method={method}", "++decoding.beam=4",
                                 "++decoding.nbest=4", "++timestamps=true", capfd=capfd)
            assert rc == 0, err[-3000:]
            nbest = [line.split(" ", 3) for line in (out / "nbest").read_text(encoding="utf-8").splitlines()]
            assert (out / "ctm").is_file()
            outputs[name] = ((out / "text").read_text(encoding="utf-8"),
                             [(k, r, float(s), (t[0] if t else "")) for k, r, s, *t in nbest])
        ref_text, ref_nbest = outputs["ckpt"]
        assert len(ref_text.splitlines()) == 20
        for name, (text, nbest) in outputs.items():
            assert text == ref_text, (method, name)
            assert [(k, r, t) for k, r, _, t in nbest] == [(k, r, t) for k, r, _, t in ref_nbest], (method, name)
            assert all(abs(s - s0) < 2e-3 for (*_, s, _), (*_, s0, _) in zip(nbest, ref_nbest)), (method, name)


def test_a_file_that_takes_the_waveform_gets_the_speech_frames_of_the_checkpoints_features(exported, corpus,
                                                                                           tmp_path):
    """Word starts move back over speech frames found in the fbank energy. A file exported with its front end is fed
    waveforms, so decode's forward_batches computes that fbank itself: the same frames, for 20 utterances, as the
    checkpoint's loader fbank gives (so both time words alike: their log-probs already agree)."""
    from corpus_io.infer.decode import forward_batches

    data_list = _twenty(corpus, tmp_path)
    flags: dict = {}
    for name, feats_on in (("ckpt", "loader"), ("fe.onnx", "model")):
        batches, model, conf = _batches(exported[name], data_list, feats_on=feats_on)
        for fw in forward_batches(batches, model, None, conf, torch.device("cpu"), speech=True):
            for key, frames in zip(fw.keys, fw.speech):
                flags.setdefault(key, {})[name] = frames.tolist()
    assert len(flags) == 20
    for key, both in flags.items():
        assert both["ckpt"] == both["fe.onnx"] and any(both["ckpt"]) and not all(both["ckpt"]), key


def test_a_foreign_onnx_file_and_a_model_the_exporter_cannot_handle_are_refused_in_one_paragraph(
        exported, corpus, tmp_path, capfd):
    from corpus_io.infer.export import exportable
    from corpus_io.model.model import ConformerCTCAttention

    foreign = tmp_path / "foreign.onnx"
    torch.onnx.export(torch.nn.Linear(80, 10), (torch.randn(1, 80),), str(foreign), dynamo=False)
    result = run_cli("corpus-io", "decode", f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw",
                     f"++checkpoint={foreign}", f"++output_dir={tmp_path / 'dec'}", "++dataset_conf.num_workers=0")
    assert_user_error(result, str(foreign), "without corpus-io's metadata", "export-model")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a model at all" * 10)
    rc, err = in_process("decode", f"++data_list={corpus['raw']}", f"++checkpoint={tmp_path / 'junk.onnx'}",
                         f"++output_dir={tmp_path / 'dec2'}", capfd=capfd)
    assert rc == 2 and "junk.onnx is not a readable ONNX model" in err and "Traceback" not in err, err
    with pytest.raises(ConfigError, match="ConformerCTCAttention, which it cannot export"):
        exportable(ConformerCTCAttention(40, 12), "exp/att/model.pt")
    rc, err = in_process("export-model", f"++checkpoint={exported['ckpt']}", f"++output={exported['ckpt']}",
                         capfd=capfd)
    assert rc == 2 and "does not end in .onnx" in err, err


def test_the_readme_snippet_transcribes_a_wav_as_greedy_decoding_does(exported, tmp_path):
    import soundfile as sf

    from corpus_io.infer.exported import load_exported

    snippet = doc_search(r"<!-- snippet: transcribe-onnx[^\n]*\n```python\n(.*?)```", re.S).group(1)
    assert 8 <= len(snippet.strip().splitlines()) <= 14
    wav = next(p for p in sorted((REPO / "tests" / "fixtures" / "corpus" / "wav").glob("*.wav"))
               if sf.info(str(p)).samplerate == 16000 and sf.info(str(p)).channels == 1)
    shutil.copy(wav, tmp_path / "audio.wav")
    shutil.copy(exported["fe.onnx"], tmp_path / "model.onnx")
    (tmp_path / "snippet.py").write_text(snippet, encoding="utf-8")
    result = run_bounded([sys.executable, "snippet.py"], 120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # the same greedy tokens from the PyTorch checkpoint's model through feats_on=model
    from corpus_io.audio.features import batch_fbank
    from corpus_io.infer.decode import load_model
    from corpus_io.infer.export import feature_options
    from corpus_io.train.steps import greedy_ids

    model, tokenizer, tcfg = load_model(str(exported["ckpt"]), torch.device("cpu"))
    samples, _ = sf.read(str(wav), dtype="float32")
    x, n = torch.from_numpy(samples)[None, :], torch.tensor([len(samples)])
    with torch.no_grad():
        ids = greedy_ids(*model(*batch_fbank(x, n, 16000, **feature_options(tcfg.dataset_conf))))[0]
    assert result.stdout == " ".join(tokenizer.symbols[i] for i in ids) + "\n"
    assert load_exported(str(tmp_path / "model.onnx"), torch.device("cpu"))[1].symbols == tokenizer.symbols


def test_onnxruntime_is_installed_only_by_its_extra():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    named = {extra for extra, reqs in extras.items() if any(r.startswith(("onnxruntime", "onnx")) for r in reqs)}
    assert named == {"onnx"}
    assert not any(r.startswith("onnx") for r in project["dependencies"])
    assert "onnx" in re.search(r"\[(.*)\]", extras["all"][0]).group(1).split(",")  # dev installs all
    # the modules the core commands import do not import it
    code = ("import sys, corpus_io.commands, corpus_io.infer.decode, corpus_io.infer.export, corpus_io.infer.exported; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime'))))")
    result = run_bounded([sys.executable, "-c", "import json; " + code], 120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


# --------------------------------------------------------------------------- outputs that would lose an input


def _checkpoint_naming(trained, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the shared run's average checkpoint whose config names a token list and a CMVN file of its own
    (copies in ``tmp_path``, so the session's files are never at risk): (checkpoint, token list, CMVN file)."""
    from omegaconf import OmegaConf

    state = torch.load(trained["out"] / "model.pt.avg2", map_location="cpu", weights_only=True)
    config = OmegaConf.create(state["config"])
    tokens, cmvn = tmp_path / "tokens.txt", tmp_path / "cmvn.json"
    tokens.write_bytes(Path(config.tokenizer.token_list).read_bytes())
    cmvn.write_text('{"mean_stat": [0.0], "var_stat": [1.0], "frame_num": 1}\n')
    config.tokenizer.token_list, config.cmvn_file = str(tokens), str(cmvn)
    state["config"] = OmegaConf.to_yaml(config)
    ckpt = tmp_path / "model.pt"
    torch.save(state, ckpt)
    return ckpt, tokens, cmvn


def test_an_output_that_is_the_checkpoints_token_list_or_cmvn_or_of_the_wrong_suffix_is_refused_before_writing(
        trained, tmp_path, capfd):
    ckpt, tokens, cmvn = _checkpoint_naming(trained, tmp_path)
    kept = {p: p.read_bytes() for p in (ckpt, tokens, cmvn)}
    (tmp_path / "tokens.onnx").symlink_to(tokens)
    (tmp_path / "stats.ts").symlink_to(cmvn)
    cases = [([f"++output={tokens}"], "does not end in .onnx"),  # the hostile round's: the token list itself
             ([f"++output={cmvn}", "++format=torchscript"], "does not end in .ts or .torchscript"),
             ([f"++output={tmp_path / 'tokens.onnx'}"], f"is the input tokenizer.token_list of checkpoint {ckpt}"),
             ([f"++output={tmp_path / 'stats.ts'}", "++format=torchscript"], "is the input cmvn_file of checkpoint"),
             ([f"++output={tmp_path / 'm.ts'}", "++format=onnx"], "(the suffix of ++format=torchscript)"),
             ([f"++output={tmp_path / 'm.onnx'}", "++format=torchscript"], "(the suffix of ++format=onnx)"),
             ([f"++output={tmp_path / 'm.bin'}"], "would not recognise as an exported model")]
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, message in cases:
        rc, err = in_process("export-model", f"++checkpoint={ckpt}", *args, capfd=capfd)
        assert rc == 2 and message in err and "Traceback" not in err, (args, err)
        assert len(err.strip().splitlines()) == 1, err
    assert {p: p.read_bytes() for p in kept} == kept  # every input byte-identical
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no temp file left


def test_export_never_replaces_a_model_dirs_token_list_or_a_user_file_and_leaves_an_identical_tokens_txt(
        trained, corpus, tmp_path, capfd):
    """A shipped model dir (the checkpoint and its token list copied, so no path of the training machine matches):
    export beside them is refused and tokens.txt kept; a file at ++output that is not an export is kept; a re-export
    replaces its own files, a second model with the same tokens leaves tokens.txt as it is, an edited one is kept."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    shutil.copy(trained["out"] / "model.pt.avg2", shipped / "model.pt")
    shutil.copy(corpus["tokens"], shipped / "tokens.txt")
    kept = (shipped / "tokens.txt").read_bytes()
    rc, err = in_process("export-model", f"++checkpoint={shipped / 'model.pt'}", f"++output={shipped / 'model.onnx'}",
                         capfd=capfd)
    assert rc == 2 and f"tokens.txt beside ++output ({shipped / 'tokens.txt'}) exists and holds other tokens" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert (shipped / "tokens.txt").read_bytes() == kept and not (shipped / "model.onnx").exists()
    user = tmp_path / "user" / "model.ts"
    user.parent.mkdir()
    user.write_text("my notes\n")
    rc, err = in_process("export-model", f"++checkpoint={shipped / 'model.pt'}", f"++output={user}",
                         "++format=torchscript", capfd=capfd)
    assert rc == 2 and f"++output {user} exists and is not a model of corpus-io export-model" in err, err
    assert user.read_text() == "my notes\n"
    served = tmp_path / "served"
    for name in ("m.onnx", "m.onnx", "other.onnx"):  # a re-export, then a second model with the same tokens
        rc, err = in_process("export-model", f"++checkpoint={shipped / 'model.pt'}", f"++output={served / name}",
                             capfd=capfd)
        assert rc == 0, err
    written = (served / "tokens.txt").read_bytes()
    assert written.startswith(b"<blank> 0\n") and written != kept
    (served / "tokens.txt").write_bytes(written + b"extra 999\n")  # edited by hand
    rc, err = in_process("export-model", f"++checkpoint={shipped / 'model.pt'}", f"++output={served / 'm.onnx'}",
                         capfd=capfd)
    assert rc == 2 and "exists and holds other tokens" in err and "(changed since)" not in err, err
    assert (served / "tokens.txt").read_bytes() == written + b"extra 999\n"


def test_an_s3_output_is_uploaded_as_one_checked_object_and_nothing_written_locally(
        exported, seaweed, tmp_path, monkeypatch, capfd):
    from corpus_io.infer.exported import read_metadata

    endpoint, fs = seaweed
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "corpusio")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "corpusio-secret")
    monkeypatch.chdir(tmp_path)
    rc, err = in_process("export-model", f"++checkpoint={exported['ckpt']}", "++output=s3://corpus/models/m.onnx",
                         capfd=capfd)
    assert rc == 0, err
    assert list(tmp_path.iterdir()) == []  # no ./s3:/corpus/models/m.onnx
    local = tmp_path.parent / f"{tmp_path.name}-m.onnx"
    local.write_bytes(fs.cat_file("corpus/models/m.onnx"))
    assert read_metadata(str(local))[0] == "onnx"  # corpus-io's metadata inside: the checked file, uploaded whole
    rc, err = in_process("export-model", f"++checkpoint={exported['ckpt']}", "++output=http://host/m.onnx",
                         capfd=capfd)
    assert rc == 2 and "writes a local file or an object on object storage (s3://) only" in err, err


@pytest.fixture(scope="module")
def online_export(streaming_trained, tmp_path_factory) -> dict:
    """streaming_trained's average exported once with ++streaming=true (sherpa-onnx's online interface), with
    export-model's result: what the streaming tests below read."""
    ckpt = streaming_trained["out"] / "model.pt.avg2"
    path = tmp_path_factory.mktemp("online") / "model.onnx"
    result = run_cli("corpus-io", "export-model", f"++checkpoint={ckpt}", f"++output={path}", "++streaming=true")
    return {"ckpt": ckpt, "path": path, "result": result}


def test_a_streaming_export_run_as_sherpa_runs_it_equals_the_chunk_by_chunk_decode_on_real_utterances(
        online_export, corpus, tmp_path):
    """++streaming=true: sherpa-onnx's online WeNet CTC interface (six inputs by position, fixed caches, its offset
    and mask rule) gives the PyTorch chunk-by-chunk log-probs (16-frame chunks, 4 left) within 1e-4 on 20 real
    utterances, carries every metadata key sherpa's online model reads, and loads in sherpa-onnx itself."""
    import onnx
    import onnxruntime

    from corpus_io.infer.export import onnx_chunk_log_probs

    ckpt, path, result = online_export["ckpt"], online_export["path"], online_export["result"]
    assert result.returncode == 0, result.stderr[-3000:]
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    for key in ("head", "num_blocks", "output_size", "cnn_module_kernel", "right_context", "subsampling_factor",
                "vocab_size"):
        assert int(meta[key]) > 0, key
    assert meta["model_type"] == "wenet_ctc"
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x", "offset", "required_cache_size", "attn_cache",
                                                      "conv_cache", "attn_mask"]
    batches, model, _ = _batches(ckpt, _twenty(corpus, tmp_path), feats_on="loader")
    checked = 0
    for batch in batches:
        for feats, n in zip(batch["feats"], batch["feats_lengths"].tolist()):
            one = feats[None, :n]
            got = onnx_chunk_log_probs(session, one, 16, 4)
            with torch.no_grad():
                ref = model.ctc_log_probs(*model.encode_streaming(one, 16, 4))[0][0]
            assert got.shape[0] <= ref.shape[0]
            if got.shape[0]:
                assert float((got - ref[:got.shape[0]]).abs().max()) < 1e-4
                checked += 1
    assert checked >= 15
    sherpa_onnx = pytest.importorskip("sherpa_onnx", reason="the [deploy] extra (sherpa-onnx) is not installed")
    assert (path.parent / "tokens.txt").is_file()  # sherpa-onnx's, beside the model
    rec = sherpa_onnx.OnlineRecognizer.from_wenet_ctc(tokens=str(path.parent / "tokens.txt"), model=str(path),
                                                      feature_dim=model.input_dim)
    stream = rec.create_stream()
    stream.accept_waveform(16000, torch.zeros(16000).numpy())
    stream.input_finished()
    while rec.is_ready(stream):
        rec.decode_stream(stream)
    assert isinstance(rec.get_result(stream), str)


def test_decode_refuses_a_streaming_export_and_streaming_export_refuses_a_full_context_model(
        online_export, trained, tmp_path):
    path, ok = online_export["path"], online_export["result"]
    assert ok.returncode == 0, ok.stderr[-3000:]
    refused = run_cli("corpus-io", "decode", f"++checkpoint={path}", "++data_list=x.list",
                      f"++output_dir={tmp_path / 'dec'}")
    assert_user_error(refused, "is a streaming export", "corpus-io decode ++decoding_chunk_size=16")
    refused = run_cli("corpus-io", "export-model", f"++checkpoint={trained['out'] / 'model.pt.avg2'}",
                      f"++output={tmp_path / 'full.onnx'}", "++streaming=true")
    assert_user_error(refused, "++model.causal=true")
    assert not (tmp_path / "full.onnx").exists()
