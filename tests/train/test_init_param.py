"""Fine-tuning: ``train ++init_param=<checkpoint>`` starts from a corpus-io checkpoint's weights (local or a URL) with
a fresh optimizer and data position, its model config and tokenizer; what does not fit is an error before anything
is written, unless ``train_conf.ignore_init_mismatch`` or ``init_param_excludes`` say which tensors start fresh.

The runs are in this process (the ``train`` function the CLI calls), one optimizer step each, from the checkpoint
of the shared ``trained`` run; one CLI run checks the user error is one paragraph."""

from __future__ import annotations

import re

import pytest
import torch

from corpus_io.config import TrainConfig, compose
from corpus_io.errors import ConfigError, DataError
from corpus_io.model import checkpoint as ckpt
from tests.conftest import assert_user_error, run_cli

#: batch-norm statistics move with every forward pass in train mode, whatever the learning rate
_RUNNING = ("running_mean", "running_var", "num_batches_tracked")


def _config(corpus, out, *overrides: str):
    """One optimizer step on the shards; no tokenizer or model keys: those come from the checkpoint."""
    return compose(TrainConfig, "train", [
        f"++train_data_set_list={corpus['shards']}", f"++output_dir={out}", "++dataset_conf.num_workers=0",
        "++dataset_conf.batch_size=4", "++dataset_conf.filter_conf.token_min_length=0",
        "++train_conf.max_epoch=1", "++train_conf.max_steps_per_epoch=1", "++train_conf.log_interval=1",
        "++train_conf.avg_nbest_model=0", *overrides])


def _train(corpus, out, *overrides: str) -> str:
    from corpus_io.train.trainer import train

    train(_config(corpus, out, *overrides))
    return (out / "train.log").read_text(encoding="utf-8")


def _weights(path) -> dict:
    return ckpt.load_checkpoint(path)["model"]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=0, atol=1e-5)


def _bigger_token_list(tokens, out, extra: int = 3):
    """The token list with ``extra`` new tokens before ``<sos/eos>`` (a new vocabulary for the same speech)."""
    symbols = [line.split()[0] for line in open(tokens, encoding="utf-8").read().splitlines()]
    symbols = symbols[:-1] + [f"NEW{i}" for i in range(extra)] + symbols[-1:]
    out.write_text("".join(f"{s} {i}\n" for i, s in enumerate(symbols)), encoding="utf-8")
    return out


def test_init_param_with_a_tiny_learning_rate_saves_the_checkpoints_weights_and_starts_at_epoch_0(
        trained, corpus, tmp_path, one_process):
    base = trained["out"] / "model.pt"
    out = tmp_path / "ft"
    log = _train(corpus, out, f"++init_param={base}", "++optim_conf.lr=1e-9")
    start, state = _weights(base), ckpt.load_checkpoint(out / "model.pt.ep0")
    compared = [name for name in start if not name.endswith(_RUNNING)]
    assert len(compared) > 10 and all(_same(state["model"][n], start[n]) for n in compared), \
        [n for n in compared if not _same(state["model"][n], start[n])]
    # a fresh optimizer, scheduler and data position: one step of epoch 0, not the base run's count
    assert (state["epoch"], state["global_step"]) == (0, 1) and ckpt.load_checkpoint(base)["global_step"] > 1
    assert re.search(rf"init_param {re.escape(str(base))}: (\d+) of the model's \1 tensors loaded", log), log
    # the model config and the tokenizer are the checkpoint's (none was given here)
    assert "model corpus_io.model.model.ConformerCTC as its config has it" in log
    assert f"tokenizer: the checkpoint's ({corpus['tokens']})" in log

    # resume wins: the run continues output_dir/model.pt, and init_param (even a missing one) is not read
    log = _train(corpus, out, f"++init_param={tmp_path / 'gone.pt'}", "++train_conf.max_epoch=2")
    assert f"train_conf.resume: continuing {out / 'model.pt'}; init_param {tmp_path / 'gone.pt'} is not read" in log
    assert ckpt.load_checkpoint(out / "model.pt")["global_step"] == 2


def _swapped_token_list(tokens, out):
    """The same tokens with two swapped: every shape fits, every output id would mean another token."""
    lines = open(tokens, encoding="utf-8").read().splitlines()
    symbols = [line.split()[0] for line in lines]
    symbols[2], symbols[3] = symbols[3], symbols[2]
    out.write_text("".join(f"{s} {i}\n" for i, s in enumerate(symbols)), encoding="utf-8")
    return out


def _funasr_state_dict(path):
    """A FunASR/ModelScope model.pt: a bare state dict of another model's tensors."""
    torch.save({"encoder.encoders.0.self_attn.linear_q.weight": torch.zeros(4, 4),
                "decoder.decoders.0.feed_forward.w_1.bias": torch.zeros(4)}, path)
    return path


def _renamed(base, path):
    """Our checkpoint format and config, but a model whose tensors have other names (another architecture)."""
    state = ckpt.load_checkpoint(base)
    state["model"] = {f"backbone.{name}": t for name, t in state["model"].items()}
    torch.save(state, path)
    return path


#: case -> (init_param and extra overrides, from (tmp_path, base checkpoint, corpus)), the error, what it says
UNFIT = {
    "missing": (lambda tmp, base, corpus: (tmp / "nope" / "model.pt", []), ConfigError, "does not exist"),
    "funasr": (lambda tmp, base, corpus: (_funasr_state_dict(tmp / "model.pt"), []), DataError,
               "is not a corpus-io checkpoint: it has no 'model' entry (a bare state dict of 2 tensors such as "
               "'encoder.encoders.0.self_attn.linear_q.weight'"),
    "renamed": (lambda tmp, base, corpus: (_renamed(base, tmp / "other.pt"), []), DataError,
                "none of its"),
    "vocab": (lambda tmp, base, corpus: (base, [f"++tokenizer.token_list="
                                                f"{_bigger_token_list(corpus['tokens'], tmp / 'tokens.txt')}"]),
              ConfigError, "changed shape (checkpoint -> model): ctc.weight ["),
    "swapped_tokens": (lambda tmp, base, corpus: (
        base, [f"++tokenizer.token_list={_swapped_token_list(corpus['tokens'], tmp / 'tokens.txt')}"]),
        ConfigError, "but not the same tokens in the same order"),
    "unknown_exclude": (lambda tmp, base, corpus: (base, ["++init_param_excludes=[ctcc.]"]), ConfigError,
                        "init_param_excludes: 'ctcc.' is the start of no tensor name"),
}


@pytest.mark.parametrize("case", list(UNFIT))
def test_a_checkpoint_that_cannot_start_the_run_is_an_error_before_anything_is_written(
        case, trained, corpus, tmp_path, one_process):
    make, error, needle = UNFIT[case]
    init, extra = make(tmp_path, trained["out"] / "model.pt", corpus)
    out = tmp_path / "exp"
    with pytest.raises(error) as err:
        _train(corpus, out, f"++init_param={init}", *extra)
    message = str(err.value)
    assert needle in message and "\n" not in message, message
    assert str(init) in message or case == "unknown_exclude", message  # that one names the key and the model
    if case == "vocab":
        assert "ignore_init_mismatch=true" in message and "ctc.bias [" in message
    assert not out.exists()  # no log, no config.yaml, no checkpoint: nothing trained


def test_the_cli_says_a_missing_init_param_in_one_paragraph_and_trains_nothing(corpus, tmp_path):
    out = tmp_path / "exp"
    result = run_cli("corpus-io", "train", f"++train_data_set_list={corpus['shards']}", f"++output_dir={out}",
                     f"++init_param={tmp_path / 'model.pt'}", env={"OMP_NUM_THREADS": "1"})
    assert_user_error(result, f"init_param {tmp_path / 'model.pt'} does not exist")
    assert not out.exists()


def test_ignore_init_mismatch_starts_the_output_layer_of_a_bigger_token_list_fresh_and_names_it(
        trained, corpus, tmp_path, one_process):
    base = trained["out"] / "model.pt"
    tokens = _bigger_token_list(corpus["tokens"], tmp_path / "tokens.txt")
    log = _train(corpus, tmp_path / "ft", f"++init_param={base}", f"++tokenizer.token_list={tokens}",
                 "++train_conf.ignore_init_mismatch=true", "++optim_conf.lr=1e-9")
    start, tuned = _weights(base), _weights(tmp_path / "ft" / "model.pt")
    vocab, dim = start["ctc.weight"].shape
    assert (f"fresh init (train_conf.ignore_init_mismatch) where 2 changed shape (checkpoint -> model): "
            f"ctc.weight [{vocab}, {dim}] -> [{vocab + 3}, {dim}], ctc.bias [{vocab}] -> [{vocab + 3}]") in log, log
    assert tuned["ctc.weight"].shape == (vocab + 3, dim)
    assert all(_same(tuned[n], start[n]) for n in start if not n.startswith("ctc.") and not n.endswith(_RUNNING))


def test_init_param_excludes_leave_the_layers_under_a_prefix_at_their_fresh_init(trained, corpus, tmp_path,
                                                                                   one_process):
    base = trained["out"] / "model.pt"
    log = _train(corpus, tmp_path / "ft", f"++init_param={base}", "++init_param_excludes=[ctc.]",
                 "++optim_conf.lr=1e-9")
    start, tuned = _weights(base), _weights(tmp_path / "ft" / "model.pt")
    assert "fresh init (init_param_excludes ['ctc.']): ctc.weight, ctc.bias" in log, log
    assert not _same(tuned["ctc.weight"], start["ctc.weight"])
    assert all(_same(tuned[n], start[n]) for n in start if not n.startswith("ctc.") and not n.endswith(_RUNNING))


def test_the_model_config_comes_from_the_checkpoint_with_the_command_lines_model_keys_over_it(trained, tmp_path):
    from corpus_io.train.init_param import prepare

    base = trained["out"] / "model.pt"
    trained_model = compose(TrainConfig, "train", ["++output_dir=x"]).model  # the base run's: the default preset
    given = ["++output_dir=x", "++train_data_set_list=x", f"++init_param={base}"]
    assert compose(TrainConfig, "train", given).model == {}  # the YAML's model does not override the checkpoint's
    cfg = compose(TrainConfig, "train", [*given, "++model.dropout_rate=0.3", "++model.num_blocks=1"])
    assert cfg.model == {"dropout_rate": 0.3, "num_blocks": 1}
    prepare(cfg)
    assert cfg.model == {**trained_model, "dropout_rate": 0.3, "num_blocks": 1}
    # the Python API the same way: the keys of its dict are the ones given
    from corpus_io.api import load_config

    assert load_config({"output_dir": "x", "init_param": str(base), "model": {"num_blocks": 1}}).model == {
        "num_blocks": 1}
    # without init_param the YAML's model stays whole
    assert compose(TrainConfig, "train", ["++output_dir=x", "++model.num_blocks=1"]).model["output_size"] == 64


@pytest.fixture
def http_dir(tmp_path):
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_init_param_from_an_http_url_and_from_s3_with_the_loaders_storage_options(trained, http_dir, seaweed):
    from corpus_io.train.init_param import prepare

    base = trained["out"] / "model.pt"
    expected = _weights(base)
    root, url = http_dir
    (root / "model.pt").write_bytes(base.read_bytes())
    cfg = compose(TrainConfig, "train", ["++output_dir=x", "++train_data_set_list=x", f"++init_param={url}/model.pt"])
    weights = prepare(cfg).weights
    assert all(_same(weights[n], expected[n]) for n in expected)
    cfg.init_param = f"{url}/gone.pt"
    with pytest.raises(DataError, match="gone.pt does not exist"):
        prepare(cfg)

    endpoint, fs = seaweed
    fs.pipe("corpus/finetune/model.pt", base.read_bytes())
    cfg = compose(TrainConfig, "train", ["++output_dir=x", "++train_data_set_list=x",
                                         "++init_param=s3://corpus/finetune/model.pt",
                                         f"++dataset_conf.storage_options={{anon: true, client_kwargs: "
                                         f"{{endpoint_url: '{endpoint}'}}}}"])
    weights = prepare(cfg).weights
    assert all(_same(weights[n], expected[n]) for n in expected)


def test_fine_tuning_on_text_outside_the_checkpoints_token_list_warns_at_the_start_with_the_count_and_the_fix(
        trained, corpus, tmp_path, one_process):
    import json

    new_text = tmp_path / "new.list"  # the same speech, transcripts with two letters the token list lacks
    with open(corpus["raw"], encoding="utf-8") as f, open(new_text, "w", encoding="utf-8") as out:
        for line in f:
            record = json.loads(line)
            out.write(json.dumps(dict(record, txt=record["txt"] + "ЖЯ"), ensure_ascii=False) + "\n")
    log = _train(dict(corpus, shards=new_text), tmp_path / "exp", f"++init_param={trained['out'] / 'model.pt'}",
                 "++dataset_conf.data_type=raw")
    found = re.search(r"warning: the transcripts read for the first step hold (\d+) token\(s\) outside the token "
                      r"list (\S+) .*", log)
    assert found, log
    assert int(found.group(1)) >= 8 and found.group(2) == str(corpus["tokens"])  # 2 in each of >= 4 utterances
    assert "make-tokenizer" in found.group(0) and "++train_conf.ignore_init_mismatch=true" in found.group(0)
    assert log.index(found.group(0)) < log.index("epoch 0 done")  # at the start, not only in the epoch's counts


def test_a_url_init_param_is_downloaded_once_per_node_and_every_rank_starts_from_it(trained, corpus, tmp_path):
    import functools
    import os
    import threading
    from collections import Counter
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from tests.conftest import run_bounded
    from tests.trained_models import torchrun_cmd

    gets: Counter = Counter()

    class Counting(SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            gets[self.path] += 1
            super().do_GET()

        def log_message(self, *args):
            pass

    www, scratch = tmp_path / "www", tmp_path / "tmp"
    www.mkdir()
    scratch.mkdir()
    (www / "model.pt").write_bytes((trained["out"] / "model.pt").read_bytes())
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Counting, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/model.pt"
    out = tmp_path / "exp"
    try:
        cmd = torchrun_cmd(out, corpus, f"++init_param={url}", "++train_conf.max_epoch=1",
                           "++train_conf.max_steps_per_epoch=1", "++train_conf.avg_nbest_model=0")
        env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1", OMP_NUM_THREADS="1", TMPDIR=str(scratch))
        result = run_bounded(cmd, 150, env=env)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr[-5000:]
    assert gets == {"/model.pt": 1}, gets  # 2 ranks on one node: local rank 0 downloaded it, rank 1 read its copy
    assert re.search(rf"init_param {re.escape(url)}: (\d+) of the model's \1 tensors loaded",
                     (out / "train.log").read_text(encoding="utf-8"))
    assert not list(scratch.glob("corpus-io-init-param-*"))  # the node's copy is gone once every rank read it


def test_a_checkpoint_from_before_the_fbank_band_keys_counts_as_their_defaults_not_as_different_features():
    """A checkpoint saved before fbank_conf.low_freq/high_freq/snip_edges existed was trained on their values then
    (20 Hz to Nyquist, Kaldi's framing), not today's defaults (sherpa-onnx's): no warning for the same features, one
    naming each key that differs."""
    from corpus_io.config import DatasetConf
    from corpus_io.train.init_param import feature_differences

    older = {"feats_type": "fbank", "fbank_conf": {"num_mel_bins": 80, "frame_length": 25.0, "frame_shift": 10.0,
                                                   "dither": 0.0}}
    conf = DatasetConf()
    conf.fbank_conf.high_freq, conf.fbank_conf.snip_edges = 0.0, True
    assert feature_differences(older, conf) == []
    conf.fbank_conf.high_freq = -400.0
    assert feature_differences(older, conf) == ["dataset_conf.fbank_conf.high_freq: -400.0 here, 0.0 in the "
                                                "checkpoint"]
    assert len(feature_differences(older, DatasetConf())) == 2  # today's defaults: high_freq and snip_edges
