"""decode and compute-cmvn through the CLI, on real lists; decode uses the shared 2-rank training run."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil

import pytest
import torch

from corpus_io.config import ComputeCmvnConfig, SourceConf
from corpus_io.decoding.scoring import Scorer
from corpus_io.loader.dataset import build_dataloader
from corpus_io.model.cmvn import compute_cmvn, eval_dataset_conf
from tests.conftest import assert_user_error, run_cli
from tests.loader_data import small_conf
from tests.test_hostile import corpus_io as in_process
from tests.trained_models import run_train, torchrun_cmd


def test_decode_writes_kaldi_text_and_a_cer_report(trained, corpus, tmp_path):
    out = tmp_path / "decode"
    result = run_cli("corpus-io", "decode", f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw",
                     f"++checkpoint={trained['out'] / 'model.pt.avg2'}", f"++output_dir={out}",
                     "++dataset_conf.num_workers=0")
    assert result.returncode == 0, result.stderr[-3000:]
    hyps = dict((line.split(" ", 1) + [""])[:2] for line in (out / "text").read_text(encoding="utf-8").splitlines())
    assert sorted(hyps) == sorted(corpus["raw_keys"])
    report = (out / "cer.txt").read_text(encoding="utf-8")
    assert re.search(r"^%CER \d+\.\d+ \[ \d+ / \d+, \d+ ins, \d+ del, \d+ sub \]", report, re.M)
    assert re.search(r"^%WER ", report, re.M) and "spk0-utt000 cer " in report and "ref: 今天天气很好" in report
    assert "%CER" in result.stdout


def test_decode_replaces_only_its_own_outputs_never_a_data_dirs_text_or_an_edited_file(trained, corpus, tmp_path,
                                                                                       capfd):
    """A data dir of a JSONL and its reference ``text`` given as ++output_dir is refused (rc 2, one paragraph naming
    the file, the text kept); decode's own outputs are recorded, so a rerun replaces them, but not once edited."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(corpus["raw"], data / "data.jsonl")
    (data / "text").write_text("spk0-utt000 the reference\n", encoding="utf-8")
    kept = (data / "text").read_bytes()
    args = [f"++checkpoint={trained['out'] / 'model.pt.avg2'}", "++dataset_conf.data_type=raw",
            "++dataset_conf.num_workers=0"]
    rc, err = in_process("decode", f"++data_list={data / 'data.jsonl'}", f"++output_dir={data}", *args, capfd=capfd)
    assert rc == 2 and f"++output_dir's text {data / 'text'} exists, and decode did not write it" in err, err
    assert "Traceback" not in err and "Nothing was written" in err
    assert (data / "text").read_bytes() == kept and not (data / "cer.txt").exists()
    out = tmp_path / "decode"
    for _ in range(2):  # the second run replaces the first's files: decode wrote them
        rc, err = in_process("decode", f"++data_list={corpus['raw']}", f"++output_dir={out}", *args, capfd=capfd)
        assert rc == 0, err
    assert (out / ".text.json").is_file() and (out / ".cer.txt.json").is_file()
    with open(out / "text", "a", encoding="utf-8") as f:
        f.write("spk0-utt000 a corrected hypothesis\n")
    edited = (out / "text").read_bytes()
    rc, err = in_process("decode", f"++data_list={corpus['raw']}", f"++output_dir={out}", *args, capfd=capfd)
    assert rc == 2 and f"{out / 'text'} exists, and decode did not write it (changed since)" in err, err
    assert (out / "text").read_bytes() == edited


def test_decode_user_errors_have_no_traceback(tmp_path, corpus):
    result = run_cli("corpus-io", "decode", f"++data_list={corpus['raw']}", f"++checkpoint={tmp_path / 'none.pt'}",
                     f"++output_dir={tmp_path}")
    assert_user_error(result, "none.pt", "does not exist")


def test_compute_cmvn_normalises_the_loader_features(corpus, tmp_path):
    conf = small_conf(data_type="raw", num_workers=0)
    cfg = ComputeCmvnConfig(data_list=str(corpus["raw"]), output=str(tmp_path / "cmvn.json"), dataset_conf=conf)
    stats = compute_cmvn(cfg)
    saved = json.loads((tmp_path / "cmvn.json").read_text())
    assert saved["dim"] == 80 and saved["frame_num"] == stats["frame_num"] > 0
    mean, istd = torch.tensor(saved["mean"]), torch.tensor(saved["istd"])
    frames = []
    for batch in build_dataloader(str(corpus["raw"]), eval_dataset_conf(conf), None, train=False, rank=0,
                                  world_size=1):
        for feats, n in zip(batch["feats"], batch["feats_lengths"]):
            frames.append(feats[: int(n)])
    x = (torch.cat(frames).double() - mean) * istd
    assert len(x) == saved["frame_num"]
    assert x.mean(0).abs().max() < 1e-3 and (x.std(0) - 1).abs().max() < 1e-2


def test_cv_and_decode_read_their_own_list_once_even_when_training_mixes_lists_by_hours(corpus):
    conf = small_conf(data_type="raw", num_workers=0)  # a training conf: a weighted mix of the shards, epochs of 0.01 h
    conf.sources = [SourceConf(data_list=str(corpus["shards"]), weight=1.0)]
    conf.epoch_hours = 0.01
    keys = [k for batch in build_dataloader(str(corpus["raw"]), eval_dataset_conf(conf), None, train=False, rank=0,
                                            world_size=1) for k in batch["keys"]]
    assert sorted(keys) == sorted(corpus["raw_keys"])  # the raw list, each utterance once, not the training mix


def test_a_model_trained_with_a_relative_token_list_decodes_from_another_directory(corpus, one_step_run, tmp_path):
    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]  # trained with ++tokenizer.token_list=NAME
    result = run_cli("corpus-io", "decode", f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw",
                     f"++checkpoint={one_step_run['out'] / 'model.pt.ep0'}", f"++output_dir={tmp_path / 'dec'}",
                     "++dataset_conf.num_workers=0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def test_decode_that_reads_nothing_fails_and_a_repeated_key_is_scored_once_with_a_warning(trained, tmp_path):
    from tests.shards.conftest import packed_with_a_repeat

    ckpt = trained["out"] / "model.pt.avg2"
    gone = tmp_path / "gone.list"
    gone.write_text(f"{tmp_path / 'nowhere' / 'shard-000000.tar'}\n")
    result = run_cli("corpus-io", "decode", f"++data_list={gone}", f"++checkpoint={ckpt}",
                     f"++output_dir={tmp_path / 'none'}", "++dataset_conf.on_error=skip",
                     "++dataset_conf.num_workers=0")
    assert_user_error(result, "decode read 0 utterances")
    assert not (tmp_path / "none" / "cer.txt").exists()
    (tmp_path / "rep").mkdir()
    merged, _, _ = packed_with_a_repeat(tmp_path / "rep")  # 28 samples, 24 distinct keys
    out = tmp_path / "dec"
    result = run_cli("corpus-io", "decode", f"++data_list={merged}", f"++checkpoint={ckpt}", f"++output_dir={out}",
                     "++dataset_conf.num_workers=0", "++dataset_conf.on_error=skip")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len((out / "text").read_text(encoding="utf-8").splitlines()) == 24
    assert "duplicate key: 4" in result.stdout


def test_decode_scores_the_transcript_not_token_ids_and_counts_out_of_vocabulary_reference_tokens(
        trained, tmp_path, capfd):
    from corpus_io.decoding.scoring import Scorer, char_units, normalize
    from tests.loader_data import fixture_utts, make_shards

    # upper case and punctuation (normalised away), and two characters no token list entry covers (鑫, K)
    edits = {"spk2-utt002": "北京欢迎你鑫！", "spk2-utt010": "Hello, World.", "spk0-utt020": "nine one one KKK"}
    utts = [(k, p, edits.get(k, t)) for k, p, t in fixture_utts()]
    raw = tmp_path / "raw.list"
    raw.write_text("".join(json.dumps({"key": k, "wav": p, "txt": t}, ensure_ascii=False) + "\n" for k, p, t in utts),
                   encoding="utf-8")
    shards, _ = make_shards(tmp_path / "shards", utts=utts, per_shard=8)
    ckpt = trained["out"] / "model.pt.avg2"
    true_ref = sum(len(char_units(normalize(t))) for _, _, t in utts)
    cer_lines = []
    for name, data_list, data_type in (("raw", raw, "raw"), ("shard", shards, "shard")):
        out = tmp_path / name
        rc, err = in_process("decode", f"++data_list={data_list}", f"++dataset_conf.data_type={data_type}",
                             f"++checkpoint={ckpt}", f"++output_dir={out}", "++dataset_conf.num_workers=0", capfd=capfd)
        assert rc == 0, err[-3000:]
        report = (out / "cer.txt").read_text(encoding="utf-8")
        cer = re.search(r"^%CER .*$", report, re.M).group(0)
        assert f" / {true_ref}," in cer  # 鑫 and KKK count as 4 reference characters, not as <unk> (5 each)
        hyps = dict((line.split(" ", 1) + [""])[:2] for line in (out / "text").read_text(encoding="utf-8").splitlines())
        expected = Scorer()
        for key, _, text in utts:
            expected.add(key, text, hyps[key])
        assert expected.summary().splitlines()[0] == cer
        assert re.search(r"reference tokens outside the token list: 2 / \d+ \(\d+\.\d+%\), e\.g\. ", report)
        assert "ref: 北京欢迎你鑫" in report and "ref: hello world" in report
        cer_lines.append(cer)
    assert cer_lines[0] == cer_lines[1]  # raw and shard lists score alike


def test_scoring_normalises_case_punctuation_and_cjk_spacing_on_both_sides():
    from corpus_io.decoding.scoring import normalize

    assert normalize("Hello, World!") == "hello world"
    assert normalize("今天 天气，很好。") == "今天天气很好"
    assert normalize("Don't STOP 打开 wifi 设置") == "dont stop 打开 wifi 设置"
    s = Scorer()
    c, w = s.add("u", "今天 天气，很好。 OK", "今天天气很好 ok")
    assert c.errors == 0 and w.errors == 0


def model_outputs(ckpt, data_list: str) -> list[tuple]:
    """(keys, log_probs, lengths) per batch of a raw list, through the trained model."""
    from corpus_io.config import DecodeConfig
    from corpus_io.infer.decode import decode_dataset_conf, load_model
    from corpus_io.model.frontend import build_front_end, model_inputs

    model, tokenizer, tcfg = load_model(str(ckpt), torch.device("cpu"))
    user = DecodeConfig().dataset_conf
    user.data_type, user.num_workers, user.batch_size = "raw", 0, 8
    conf = decode_dataset_conf(user, tcfg.dataset_conf)
    front_end = build_front_end(conf, torch.device("cpu"))
    out = []
    with torch.no_grad():
        for batch in build_dataloader(data_list, conf, tokenizer, train=False, rank=0, world_size=1):
            out.append((batch["keys"], *model(*model_inputs(front_end, batch, torch.device("cpu"), train=False))))
    return out


def test_prefix_beam_on_a_trained_model_is_greedy_at_beam_one_and_never_below_greedy_wider(trained, corpus):
    from corpus_io.decoding.beam import ctc_prefix_beam_search, ctc_scores
    from corpus_io.train.steps import greedy_ids

    checked = 0
    for ckpt in ("model.pt.ep1", "model.pt.avg2"):  # an epoch checkpoint and the average
        for keys, log_probs, lengths in model_outputs(trained["out"] / ckpt, str(corpus["raw"])):
            greedy = greedy_ids(log_probs, lengths)
            assert [h[0].ids for h in ctc_prefix_beam_search(log_probs, lengths, beam=1)] == greedy
            floor = ctc_scores(log_probs, lengths, list(range(len(keys))), greedy).tolist()
            for hyps, g in zip(ctc_prefix_beam_search(log_probs, lengths, beam=8), floor):
                assert hyps[0].score >= g - 1e-4
                assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
                checked += 1
    assert checked == 48


def test_decode_by_prefix_beam_writes_a_sorted_nbest_and_reports_method_and_rtf(trained, corpus, tmp_path, capfd):
    ckpt = trained["out"] / "model.pt.avg2"
    texts = {}
    for method in ("greedy", "ctc_prefix_beam"):  # in-process: the report and n-best, not the CLI, are the promise
        out = tmp_path / method
        rc, err = in_process("decode", f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw",
                             f"++checkpoint={ckpt}", f"++output_dir={out}", "++dataset_conf.num_workers=0",
                             f"++decoding.method={method}", "++decoding.beam=4", "++decoding.nbest=3", capfd=capfd)
        assert rc == 0, err[-3000:]
        report = (out / "cer.txt").read_text(encoding="utf-8")
        assert f"decoding: method={method}" in report
        assert re.search(r"^RTF \d+\.\d+ \(wall .* model \d+\.\d+, search \d+\.\d+\)", report, re.M)
        texts[method] = (out / "text").read_text(encoding="utf-8")
    rows = [line.split(" ", 3) for line in (tmp_path / "ctc_prefix_beam" / "nbest").read_text(
        encoding="utf-8").splitlines()]
    by_key: dict = {}
    for key, rank, score, *_ in rows:
        by_key.setdefault(key, []).append((int(rank), float(score)))
    assert sorted(by_key) == sorted(corpus["raw_keys"])
    for ranks in by_key.values():
        assert [r for r, _ in ranks] == list(range(1, len(ranks) + 1)) and len(ranks) <= 3
        assert [s for _, s in ranks] == sorted((s for _, s in ranks), reverse=True)
    best = dict((line.split(" ", 1) + [""])[:2] for line in texts["ctc_prefix_beam"].splitlines())
    top = dict((line.split(" ", 3) + [""])[0:4:3] for line in (tmp_path / "ctc_prefix_beam" / "nbest")
               .read_text(encoding="utf-8").splitlines() if line.split(" ", 2)[1] == "1")
    assert best == top  # text holds each utterance's first n-best entry


def test_make_lm_tune_lm_and_decode_with_the_lm_and_hotwords_from_the_command_line(trained, corpus, tmp_path):
    ckpt = trained["out"] / "model.pt.avg2"
    lm = tmp_path / "lm.arpa"
    result = run_cli("corpus-io", "make-lm", f"++input={corpus['raw']}", f"++output={lm}", "++order=3",
                     f"++tokenizer.token_list={corpus['tokens']}")
    assert result.returncode == 0, result.stderr[-3000:]
    common = [f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw", f"++checkpoint={ckpt}",
              "++dataset_conf.num_workers=0"]
    result = run_cli("corpus-io", "tune-lm", *common, f"++output_dir={tmp_path / 'tune'}", f"++lm={lm}",
                     "++lm_weights=[0.0,0.5]", "++word_scores=[0.0]", "++decoding.beam=4")
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "tune" / "tune.txt").read_text().splitlines()
    assert table[0] == "lm_weight word_score unk_score %CER %WER" and len(table) == 1 + 2 * 3  # unk_scores: -2, 0, 2
    best = (tmp_path / "tune" / "best.txt").read_text().split()
    assert best[0] == "++decoding.method=ctc_beam_lm" and "best CER" in result.stdout
    (tmp_path / "hot.txt").write_text("北京\n天气\n", encoding="utf-8")
    out = tmp_path / "dec"
    result = run_cli("corpus-io", "decode", *common, f"++output_dir={out}", *best, "++decoding.beam=4",
                     f"++decoding.hotwords={tmp_path / 'hot.txt'}")
    assert result.returncode == 0, result.stderr[-3000:]
    report = (out / "cer.txt").read_text(encoding="utf-8")
    assert "decoding: method=ctc_beam_lm" in report and f"hotwords={tmp_path / 'hot.txt'}" in report
    assert re.search(r"^hotword recall \d+\.\d+% \[ \d+ / 2 occurrences of 2 hotwords \]; without hotwords "
                     r"\d+\.\d+%$", report, re.M)


@pytest.mark.slow
def test_a_conformer_ctc_att_model_trains_and_decodes_by_all_four_methods(corpus, trained, tmp_path, capfd):
    exp = tmp_path / "att"
    cmd = torchrun_cmd(exp, corpus, "model=conformer_ctc_att", "++train_conf.max_epoch=1", "++optim_conf.lr=0.002",
                       "++train_conf.max_steps_per_epoch=4", "++train_conf.avg_nbest_model=0", nproc=1)
    result = run_train(cmd[cmd.index("--no-python") + 1:])
    assert result.returncode == 0, result.stderr[-3000:]
    lm = tmp_path / "lm.arpa"
    rc, err = in_process("make-lm", f"++input={corpus['raw']}", f"++output={lm}",
                         f"++tokenizer.token_list={corpus['tokens']}", capfd=capfd)
    assert rc == 0, err[-3000:]
    common = [f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw", "++dataset_conf.num_workers=0",
              "++decoding.beam=4"]
    for method in ("greedy", "ctc_prefix_beam", "ctc_beam_lm", "attention_rescoring"):  # in-process: the methods
        out = tmp_path / method
        uses_lm = [f"++decoding.lm={lm}"] if method == "ctc_beam_lm" else []  # the others refuse one
        rc, err = in_process("decode", *common, f"++checkpoint={exp / 'model.pt'}", f"++output_dir={out}",
                             f"++decoding.method={method}", *uses_lm, capfd=capfd)
        assert rc == 0, err[-3000:]
        assert len((out / "text").read_text(encoding="utf-8").splitlines()) == 24
        assert f"decoding: method={method}" in (out / "cer.txt").read_text(encoding="utf-8")
    # a CTC-only checkpoint still decodes, and says why it cannot rescore
    result = run_cli("corpus-io", "decode", *common, f"++checkpoint={trained['out'] / 'model.pt.avg2'}",
                     f"++output_dir={tmp_path / 'old'}", "++decoding.method=attention_rescoring")
    assert_user_error(result, "conformer_ctc_att")


def _encode_a_segment_twice(pos_enc_layer_type: str) -> tuple[torch.Tensor, int]:
    """The encoder output of one random 40-frame segment played twice (frames 40-79 and 120-159, silence
    between), and the subsampled offset between the two copies."""
    from corpus_io.model.model import ConformerCTC

    torch.manual_seed(0)
    model = ConformerCTC(40, 12, output_size=32, attention_heads=2, linear_units=64, num_blocks=1,
                         subsampling_channels=8, pos_enc_layer_type=pos_enc_layer_type).eval()
    segment = torch.randn(40, 40)
    feats = torch.zeros(1, 200, 40)
    feats[0, 40:80] = segment
    feats[0, 120:160] = segment
    with torch.no_grad():
        encoded, _ = model.encode(feats, torch.tensor([200]))
    return encoded[0], 80 // 4


def test_abs_pos_lets_the_decoder_tell_two_identical_words_apart_and_no_pos_keeps_ctc_checkpoints_as_trained():
    """torchaudio's Conformer has no positional encoding, so two identical stretches of audio give identical
    encoder frames (away from their edges): the attention decoder then cannot count "eight eight" and
    attention rescoring dropped a repeated word. conformer_ctc_att encodes with abs_pos; CTC-only models keep
    no_pos, the encoder their checkpoints were trained with."""
    from corpus_io.model.model import ConformerCTC, ConformerCTCAttention

    for kind, same in (("no_pos", True), ("abs_pos", False)):
        encoded, offset = _encode_a_segment_twice(kind)
        first, second = encoded[12:18], encoded[12 + offset:18 + offset]  # the middles of the two copies
        assert torch.allclose(first, second, atol=1e-5) is same, kind
    assert ConformerCTC(40, 12).pos_enc_layer_type == "no_pos"
    assert ConformerCTCAttention(40, 12).pos_enc_layer_type == "abs_pos"
    with pytest.raises(ValueError, match="pos_enc_layer_type='rel_pos' must be one of"):
        ConformerCTC(40, 12, pos_enc_layer_type="rel_pos")


# --------------------------------------------------------------------------- refused before anything is written


def _own_token_list(trained, corpus, tmp_path, *, record: bool = True) -> tuple:
    """The shared run's model.pt.avg2, its config naming a copy of its token list (which a test may change), and
    without the token list record where ``record`` is false (a checkpoint of an older corpus-io)."""
    from omegaconf import OmegaConf

    state = torch.load(trained["out"] / "model.pt.avg2", weights_only=True)
    tokens = tmp_path / "tokens.txt"
    shutil.copyfile(corpus["tokens"], tokens)
    conf = OmegaConf.create(state["config"])
    conf.tokenizer.token_list = str(tokens)
    state["config"] = OmegaConf.to_yaml(conf)
    if not record:
        state.pop("token_list", None)
    torch.save(state, tmp_path / "model.pt")
    return tmp_path / "model.pt", tokens


def _lm(tmp_path, name: str = "lm.arpa"):
    from corpus_io.decoding.lm import kneser_ney, write_arpa

    write_arpa(tmp_path / name, *kneser_ney([list("今天天气很好"), list("北京天气")], 2)[:2])
    return tmp_path / name


def test_a_token_list_changed_after_training_is_refused_naming_both_files(trained, corpus, tmp_path, capfd):
    from corpus_io.infer.decode import load_model

    ckpt, tokens = _own_token_list(trained, corpus, tmp_path)
    recorded = torch.load(trained["out"] / "model.pt.avg2", weights_only=True)["token_list"]  # the average keeps it
    assert recorded["sha256"] == hashlib.sha256(tokens.read_bytes()).hexdigest()  # the list's own sha256sum
    load_model(str(ckpt), "cpu")  # the copy is the token list it was trained with
    lines = tokens.read_text(encoding="utf-8").splitlines()
    (a, i), (b, j) = (line.split() for line in lines[2:4])
    lines[2:4] = [f"{b} {i}", f"{a} {j}"]  # two tokens swapped: the same size, every id still 0..V-1
    tokens.write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = [f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw", f"++checkpoint={ckpt}",
              "++dataset_conf.num_workers=0"]
    for args in (["decode", *common, f"++output_dir={tmp_path / 'dec'}"],
                 ["tune-lm", *common, f"++output_dir={tmp_path / 'tune'}", f"++lm={_lm(tmp_path)}"]):
        rc, err = in_process(*args, capfd=capfd)
        assert rc == 2 and "Traceback" not in err, err
        assert f"the token list {tokens} ({recorded['size']} tokens, sha256 " in err, err
        assert f"is not the one checkpoint {ckpt} was trained with ({recorded['size']} tokens, sha256 " \
               f"{recorded['sha256'][:12]}…, then {corpus['tokens']}): it changed after training" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm.arpa", "model.pt", "tokens.txt"]  # nothing written


def test_a_checkpoint_without_a_token_list_record_decodes_with_one_warning(trained, corpus, tmp_path, capfd):
    from corpus_io.infer.decode import load_model

    ckpt, tokens = _own_token_list(trained, corpus, tmp_path, record=False)
    capfd.readouterr()
    for _ in range(2):
        load_model(str(ckpt), "cpu")
    err = capfd.readouterr().err
    assert err.count(f"warning: checkpoint {ckpt} does not record its token list") == 1, err
    assert f"so {tokens} cannot be checked against the token list it was trained with" in err


def test_decode_refuses_a_count_lying_lm_and_an_lm_for_greedy_and_writes_nothing(trained, corpus, tmp_path, capfd):
    good = _lm(tmp_path)
    text = good.read_text(encoding="utf-8")
    unigrams = int(text.split("ngram 1=")[1].split()[0])
    lying = tmp_path / "lying.arpa"
    lying.write_text(text.replace(f"ngram 1={unigrams}\n", f"ngram 1={unigrams + 3}\n"), encoding="utf-8")
    common = [f"++data_list={corpus['raw']}", "++dataset_conf.data_type=raw", "++dataset_conf.num_workers=0",
              f"++checkpoint={trained['out'] / 'model.pt.avg2'}", f"++output_dir={tmp_path / 'dec'}"]
    for options, needles in (
            (["++decoding.method=ctc_beam_lm", f"++decoding.lm={lying}"],
             [f"{lying}:", f"section ends after {unigrams} entries, but the header announces ngram 1={unigrams + 3}"]),
            (["++decoding.method=greedy", f"++decoding.lm={good}"],
             [f"decoding.lm={good} is given, but decoding.method=greedy uses no LM", "++decoding.method=ctc_beam_lm"])):
        rc, err = in_process("decode", *common, *options, capfd=capfd)
        assert rc == 2 and "Traceback" not in err, err
        for needle in needles:
            assert needle in err, err
        assert not (tmp_path / "dec").exists()


def test_decode_scores_every_utterance_a_long_one_decoded_a_dropped_one_as_deletions_named_with_the_count(
        trained, tmp_path, capfd):
    """Training's filters do not apply at decode: a 105 s utterance (above filter_conf.max_length's 102 s) gets a
    hypothesis (through the model in two pieces). An utterance that cannot be decoded (unreadable audio under
    on_error=skip; the long one under a max_length the user sets) is scored as all deletions and named, and
    cer.txt / wer.txt say how many utterances were scored of how many the reference holds."""
    import numpy as np
    import soundfile as sf

    from corpus_io.decoding.scoring import char_units, normalize
    from tests.loader_data import fixture_utts

    utts = fixture_utts()[:5]
    x, sr = sf.read(utts[0][1], dtype="float32")
    reps = int(105 * sr / len(x)) + 1
    sf.write(tmp_path / "long.wav", np.tile(x, reps), sr)
    (tmp_path / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot audio")
    lines = [{"key": k, "wav": p, "txt": t} for k, p, t in utts]
    lines += [{"key": "long-utt", "wav": str(tmp_path / "long.wav"), "txt": " ".join([utts[0][2]] * reps)},
              {"key": "broken-utt", "wav": str(tmp_path / "broken.wav"), "txt": "你好世界"}]
    raw = tmp_path / "raw.list"
    raw.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    ckpt = trained["out"] / "model.pt.avg2"
    true_ref = sum(len(char_units(normalize(x["txt"]))) for x in lines)
    common = (f"++data_list={raw}", "++dataset_conf.data_type=raw", f"++checkpoint={ckpt}",
              "++dataset_conf.num_workers=0", "++dataset_conf.on_error=skip")
    for out, extra, missing in ((tmp_path / "all", (), ["broken-utt"]),
                                (tmp_path / "filtered", ("++dataset_conf.filter_conf.max_length=10240",),
                                 ["broken-utt", "long-utt"])):
        rc, err = in_process("decode", *common, f"++output_dir={out}", *extra, capfd=capfd)
        assert rc == 0, err[-3000:]
        hyps = dict((line.split(" ", 1) + [""])[:2] for line in (out / "text").read_text(encoding="utf-8").splitlines())
        assert sorted(hyps) == sorted(x["key"] for x in lines if x["key"] not in missing)
        for name in ("cer.txt", "wer.txt"):
            report = (out / name).read_text(encoding="utf-8")
            assert f" / {true_ref}," in re.search(r"^%CER .*$", report, re.M).group(0)  # every reference character
            count = re.search(r"^utterances scored: .*$", report, re.M).group(0)
            assert count.startswith("utterances scored: 7 of 7 in the reference "
                                    f"({7 - len(missing)} decoded; {len(missing)} not decoded, scored as all "
                                    f"deletions: {', '.join(missing)})"), count
            for key in missing:
                line = re.search(rf"^{key} cer (\d+)/(\d+) \(S=0 I=0 D=(\d+)\).* NOT DECODED", report, re.M)
                assert line and line.group(1) == line.group(2) == line.group(3) != "0", report[-2000:]
        assert sorted(line.split(" ", 1)[0] for line in (out / "ref").read_text(encoding="utf-8").splitlines()) == \
            sorted(x["key"] for x in lines)


def test_a_long_utterance_through_the_model_in_pieces_keeps_every_output_frame_of_the_whole(trained):
    """chunked: the pieces' outputs joined have exactly the whole utterance's frame count (each frame at its time),
    a piece as long as the utterance is the whole forward, and a shorter row is padded with zeros."""
    from corpus_io.infer.decode import chunked, load_model

    model, _, _ = load_model(str(trained["out"] / "model.pt.avg2"), torch.device("cpu"))
    lengths = torch.tensor([1203, 357, 1000, 9])
    feats = torch.randn(4, 1203, 80, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole, whole_lengths = model(feats, lengths)
        pieces, piece_lengths = chunked(model, feats, lengths, step=4, piece=400, context=200)
        same, same_lengths = chunked(model, feats, lengths, step=4, piece=1204, context=200)
    assert piece_lengths.tolist() == whole_lengths.tolist() == same_lengths.tolist()
    for i, n in enumerate(whole_lengths.tolist()):
        assert torch.allclose(same[i, :n], whole[i, :n], atol=1e-4)
        # away from the pieces' edges the frames see most of what the whole did: the same best token
        assert (pieces[i, :n].argmax(-1) == whole[i, :n].argmax(-1)).float().mean() > 0.8
        assert not pieces[i, n:].any() and not same[i, n:].any()  # past a row's frames: padding, zeros


def test_an_utterances_seconds_from_its_frames_are_its_audios_with_snip_edges_false_too():
    """feats_on=loader batches carry frames, not samples: decode's durations (which bound the word times) are the
    audio's within a frame shift either way (snip_edges=false: a frame per 10 ms, no window's tail)."""
    from corpus_io.audio.features import num_frames
    from corpus_io.config import DatasetConf
    from corpus_io.infer.decode import _durations

    conf = DatasetConf()
    for snip in (True, False):
        conf.fbank_conf.snip_edges = snip
        for n in (4000, 16000, 16079, 16080, 16159, 48123):
            frames = num_frames(n, 16000, snip_edges=snip)
            seconds = _durations({"feats_lengths": torch.tensor([frames])}, conf)[0]
            assert abs(seconds - n / 16000) <= (0.01 if snip else 0.005) + 1e-9, (snip, n)


def test_a_checkpoint_whose_config_predates_the_feature_defaults_keeps_the_features_it_was_trained_on(trained,
                                                                                                      tmp_path):
    """sherpa-onnx's features and training dither became the defaults (issue 52): a checkpoint whose saved config
    lacks fbank_conf.high_freq / snip_edges / dither (written before those keys) was trained on Kaldi's features
    (high_freq 0, snip_edges true, dither 0), and decode, transcribe, export and fine-tuning read it that way; a
    config that names them keeps what it names."""
    from omegaconf import OmegaConf

    from corpus_io.infer.decode import load_model
    from corpus_io.model.checkpoint import load_checkpoint, save_checkpoint
    from corpus_io.train.init_param import feature_differences

    state = load_checkpoint(trained["out"] / "model.pt.avg2")
    saved = OmegaConf.to_container(OmegaConf.create(state["config"]))
    assert saved["dataset_conf"]["fbank_conf"]["snip_edges"] is False  # trained on today's defaults
    old = copy.deepcopy(saved)
    for key in ("high_freq", "snip_edges", "dither"):
        del old["dataset_conf"]["fbank_conf"][key]
    named = copy.deepcopy(old)
    named["dataset_conf"]["fbank_conf"]["high_freq"] = -100.0
    for name, config, expected in (("old.pt", old, (0.0, True)), ("named.pt", named, (-100.0, True)),
                                   ("today.pt", saved, (-400.0, False))):
        save_checkpoint(tmp_path / name, {**state, "config": OmegaConf.to_yaml(OmegaConf.create(config))})
        _, _, tcfg = load_model(str(tmp_path / name), torch.device("cpu"))
        fbank = tcfg.dataset_conf.fbank_conf
        assert (fbank.high_freq, fbank.snip_edges) == expected, name
    assert sorted(feature_differences(old["dataset_conf"], small_conf())) == [
        "dataset_conf.fbank_conf.high_freq: -400.0 here, 0.0 in the checkpoint",
        "dataset_conf.fbank_conf.snip_edges: False here, True in the checkpoint"]


def test_decode_refuses_a_repeated_key_naming_both_lines_or_with_on_error_skip_names_it_in_a_warning(
        one_step_run, tmp_path, capfd):
    """As align and score (one rule, decode.check_repeated_keys): refused unless ++dataset_conf.on_error=skip, which
    decodes the first and names the key and both lines, not only a count of the loader's."""
    from tests.loader_data import raw_with_a_repeated_key

    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]
    data_list, key = raw_with_a_repeated_key(tmp_path)
    args = [f"++data_list={data_list}", "++dataset_conf.data_type=raw", "++device=cpu", "++dataset_conf.num_workers=0",
            f"++checkpoint={one_step_run['out'] / 'model.pt.ep0'}", f"++output_dir={tmp_path / 'dec'}"]
    rc, err = in_process("decode", *args, capfd=capfd)
    assert rc == 2 and f"decode: key '{key}' is at {data_list}:1 and {data_list}:5" in err, err
    assert "Traceback" not in err and not (tmp_path / "dec").exists()
    rc, err = in_process("decode", *args, "++dataset_conf.on_error=skip", capfd=capfd)
    assert rc == 0 and f"warning: key '{key}' is at {data_list}:1 and {data_list}:5" in err, err
    assert len((tmp_path / "dec" / "text").read_text(encoding="utf-8").splitlines()) == 4


def test_a_feature_override_unlike_the_checkpoints_is_refused_naming_the_key_and_where_features_run_is_honoured():
    """decode_dataset_conf (decode, align, segment, score): the checkpoint's features win, so a key the user set to
    another value (another rate, mel bins, feature type) is a ConfigError naming it, not ignored in silence; one
    restating the checkpoint's value, or left at its default, is not; ``feats_on`` (where the same features are
    computed) is the user's when given."""
    from corpus_io.config import DatasetConf
    from corpus_io.errors import ConfigError
    from corpus_io.infer.decode import decode_dataset_conf

    trained = DatasetConf(fbank_conf={"num_mel_bins": 40}, feats_on="loader")
    for user, key in ((DatasetConf(resample_conf={"resample_rate": 8000}), "resample_conf.resample_rate=8000"),
                      (DatasetConf(fbank_conf={"num_mel_bins": 64}), "fbank_conf.num_mel_bins=64"),
                      (DatasetConf(feats_type="mfcc"), "feats_type=mfcc")):
        with pytest.raises(ConfigError, match=re.escape(f"++dataset_conf.{key}: the checkpoint was trained with")):
            decode_dataset_conf(user, trained)
    same = decode_dataset_conf(DatasetConf(fbank_conf={"num_mel_bins": 40, "dither": 1.0}), trained)
    assert same.fbank_conf.num_mel_bins == 40 and same.fbank_conf.dither == 0.0 and same.feats_on == "loader"
    assert decode_dataset_conf(DatasetConf(feats_on="model"), trained).feats_on == "model"


def test_output_that_is_not_finite_from_inputs_that_are_not_is_blamed_on_the_audio_not_the_weights():
    """forward_batches (decode, align, segment, score) blames a non-finite output on the checkpoint's weights only
    when the utterance's inputs were finite: features overflowed by absurd audio (or a feature matrix holding
    infinity) are the audio's fault, and the error names the utterance."""
    from corpus_io.config import DatasetConf
    from corpus_io.errors import DataError
    from corpus_io.infer.decode import forward_batches

    class Mean(torch.nn.Module):  # any weights: the output is as finite as the input
        def forward(self, feats, lengths):
            return feats.mean(-1, keepdim=True).expand(-1, -1, 3).log_softmax(-1), lengths

    conf = DatasetConf()
    conf.feats_on, conf.feats_type = "loader", "precomputed"
    feats = torch.zeros(2, 8, 4)
    batch = {"keys": ["fine", "loud"], "txt": ["a", "b"], "target": torch.ones(2, 1, dtype=torch.long),
             "target_lengths": torch.ones(2, dtype=torch.long), "feats": feats, "feats_lengths": torch.tensor([8, 8])}
    feats[1, 3, 0] = float("inf")
    with pytest.raises(DataError) as err:
        list(forward_batches([batch], Mean(), None, conf, torch.device("cpu"), chunk_seconds=0,
                             source=("m.pt", "list.jsonl")))
    said = str(err.value)
    assert "the model inputs of 1 utterances of list.jsonl are not finite" in said and ": loud." in said, said
    assert "at fault, not the model m.pt" in said and "weights have diverged" not in said, said
    feats[1, 3, 0] = 0.0

    class Diverged(Mean):
        def forward(self, feats, lengths):
            return torch.full((feats.shape[0], feats.shape[1], 3), float("nan")), lengths

    with pytest.raises(DataError, match="its weights have diverged"):
        list(forward_batches([batch], Diverged(), None, conf, torch.device("cpu"), chunk_seconds=0,
                             source=("m.pt", "list.jsonl")))
