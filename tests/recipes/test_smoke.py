"""The recipes end to end with tiny settings: `make smoke` (the espeak recipe, every stage, a few training
steps) and the AISHELL-1 / LibriSpeech recipes on look-alike trees built with espeak-ng."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpus_io.tables import synth
from tests.conftest import REPO, built_once, free_port, hang_limit, load_scale, run_bounded, run_cli

RECIPES = REPO / "recipes"
PIPELINE = ("prepare", "scp2jsonl", "make-tokenizer", "compute-cmvn", "pack-shards", "make-datalist", "train",
            "average", "decode")

@pytest.fixture(scope="module")
def pipeline_commands():
    """Every subcommand the recipes call is registered."""
    listed = run_cli("corpus-io", "--help").stdout
    missing = [c for c in PIPELINE if not re.search(rf"^\s+{re.escape(c)}\s", listed, re.M)]
    assert not missing, f"corpus-io has no {', '.join(missing)} subcommand; the recipes need every stage"


def run_recipe(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1")
    return run_bounded([str(RECIPES / name / "run.sh"), *args], timeout, env=env)


def stage_lines(stderr: str) -> set[int]:
    return {int(n) for n in re.findall(r"\[stage (\d+)\] ", stderr)}


def test_recipe_rejects_an_unknown_option():
    result = run_recipe("espeak", "--stop-stage", "3", "--max_epochs", "2")
    assert result.returncode == 2
    assert "unknown option --max_epochs" in result.stderr and "--max_epoch" in result.stderr


def test_recipe_help_lists_stages_and_options():
    result = run_recipe("espeak", "--help")
    assert result.returncode == 0
    assert "0 synthesize" in result.stdout and "--stop_stage" in result.stdout and "--nproc" in result.stdout


def test_recipe_init_option_starts_training_from_the_checkpoint_it_names(tmp_path):
    """--init reaches train as ++init_param (common.sh's init_args, which aishell's and librispeech's stage 6 pass
    too): a missing checkpoint stops the training stage naming it, before anything is written."""
    base = tmp_path / "base" / "model.pt"
    result = run_recipe("espeak", "--stage", "6", "--stop_stage", "6", "--nproc", "1", "--data",
                        str(tmp_path / "data"), "--exp", str(tmp_path / "exp"), "--init", str(base))
    assert result.returncode != 0
    assert f"error: init_param {base} does not exist" in result.stderr, result.stderr[-3000:]  # ++init_param={base}
    assert not (tmp_path / "exp").exists()


def test_recipe_noise_option_is_off_by_default_and_names_the_stages_that_make_its_noise(tmp_path):
    assert "--noise                  false" in run_recipe("espeak", "--help").stdout
    result = run_recipe("espeak", "--stage", "6", "--stop_stage", "6", "--noise", "true", "--data",
                        str(tmp_path / "data"), "--exp", str(tmp_path / "exp"))
    assert result.returncode == 2
    assert f"--noise true trains with {tmp_path / 'data' / 'noise' / 'shard.list'}, which does not exist" in \
        result.stderr and "--noise true --stage 0 --stop_stage 5" in result.stderr, result.stderr
    assert not (tmp_path / "exp").exists()
    result = run_recipe("espeak", "--stop_stage", "0", "--noise", "yes")
    assert result.returncode == 2 and "--noise must be true or false, not 'yes'" in result.stderr


@pytest.fixture(scope="session")
def smoke(tmp_path_factory) -> dict:
    """`make smoke` once per session: the espeak recipe, every stage, with conf/smoke.opts (as the Makefile runs
    it); its data and exp dirs, stderr and wall seconds."""
    def build(root: Path) -> dict:
        opts = shlex.split((RECIPES / "espeak" / "conf" / "smoke.opts").read_text())
        start = time.monotonic()
        result = run_recipe("espeak", *opts, "--data", str(root / "data"), "--exp", str(root / "exp"),
                            timeout=hang_limit(480))
        (root / "stderr.txt").write_text(result.stderr, encoding="utf-8")
        return {"data": str(root / "data"), "exp": str(root / "exp"), "returncode": result.returncode,
                "stderr": str(root / "stderr.txt"), "elapsed": time.monotonic() - start}

    built = built_once(tmp_path_factory, "make_smoke", build)
    stderr = Path(built["stderr"]).read_text(encoding="utf-8")
    assert built["returncode"] == 0, stderr[-6000:]
    return {**built, "data": Path(built["data"]), "exp": Path(built["exp"]), "stderr": stderr}


@pytest.mark.slow
def test_make_smoke_runs_every_stage_of_the_espeak_recipe(pipeline_commands, smoke):
    assert stage_lines(smoke["stderr"]) == set(range(11)), smoke["stderr"][-3000:]  # 9: serving, skipped
    data, exp = smoke["data"], smoke["exp"]
    assert len(list((data / "train" / "shards").glob("*.tar"))) >= 2
    assert (data / "train" / "shard.list").read_text().count(".tar") >= 2
    assert (exp / "model.pt.avg1").is_file()
    table = (exp / "RESULTS.md").read_text()
    assert re.search(r"^\| test_digits \| [0-9.]+ \| [0-9.]+ \|", table, re.M), table
    assert re.search(r"^\| test_mixed \| [0-9.]+ \|", table, re.M), table
    assert re.search(r"^\| test_digits_newvoice \| [0-9.]+ \|", table, re.M), table
    assert re.search(r"^\| real \| [0-9.]+ \|", table, re.M), table  # stage 8: the real recordings
    # a row per decoding method, with the real-time factor of model and search
    assert re.search(r"^\| test_mixed \| ctc_beam_lm \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$",
                     table, re.M), table
    assert (exp / "lm_3gram.arpa").is_file() and (exp / "decode_test_mixed.ctc_beam_lm" / "nbest").is_file()
    # every decode writes word times: Kaldi's CTM, a line per hypothesis word
    words = sum(len(line.split()) - 1 for line in (exp / "decode_test_digits" / "text").read_text().splitlines())
    ctm = [line.split() for line in (exp / "decode_test_digits" / "ctm").read_text().splitlines()]
    assert len(ctm) == words > 0 and all(len(row) == 6 and row[1] == "1" for row in ctm)
    # --noise true (smoke.opts): the noise set packed as shards and mixed into training by the loader
    assert (data / "noise" / "shard.list").read_text().count(".tar") >= 1
    assert f"add_noise(noise_list='{data / 'noise' / 'shard.list'}'" in (exp / "train.log").read_text()
    speakers = {line.split()[1] for line in (data / "test_digits_newvoice" / "utt2spk").read_text().splitlines()}
    trained = {line.split()[1] for line in (data / "train" / "utt2spk").read_text().splitlines()}
    assert speakers and not speakers & trained
    held_out = {voice for voice, _ in synth.HELD_OUT_SPEAKERS}
    assert not held_out & {voice for voice, _ in synth.SPEAKERS + synth.ZH_VOICES}  # no training set uses them
    # stage 10: the test set joined into long recordings and segmented, scored against the joins
    score = json.loads((exp / "segment_test_digits_long" / "score.json").read_text())
    assert score["segments"] > 0 and score["order_ok"] and score["cuts_in_speech"] == 0, score
    assert smoke["elapsed"] < 200 * load_scale(), f"make smoke took {smoke['elapsed']:.0f} s"


@pytest.mark.slow
def test_the_smoke_model_starts_a_joined_second_utterance_at_its_onset_and_is_less_sure_in_noise(smoke, tmp_path):
    """Issue 40's acceptance on the model `make smoke` trains: 10 pairs of its held-out test_digits utterances
    joined by 0.5 s of silence (16-bit silence, as the corpus's own: triangular dither of one step), decoded with
    ++timestamps=true. The second utterance's first word (the first word that starts after the first utterance's
    audio ends: a word inserted in the silence counts as a miss) starts within 0.2 s of its sound in at least 9
    pairs; times grow and lie inside the audio. The same 20 utterances with white noise at 0 dB get a lower mean
    word confidence than clean, and with 0.5 s of exact zeros before and after no word more than clean (issue 60)."""
    import numpy as np
    import soundfile as sf
    import torch

    from corpus_io.audio.mix import add_noise
    from tests.decoding.test_align import speech_onset

    data = smoke["data"] / "test_digits"
    wavs = dict(line.split(" ", 1) for line in (data / "wav.scp").read_text().splitlines())
    texts = dict(line.split(" ", 1) for line in (data / "text").read_text().splitlines())
    keys = sorted(wavs)[:20]
    assert len(keys) == 20
    audio = {k: sf.read(wavs[k].strip(), dtype="float32")[0] for k in keys}
    lines, truth, durations = [], {}, {}
    for i in range(10):
        a, b = audio[keys[2 * i]], audio[keys[2 * i + 1]]
        dither = np.random.default_rng(i)
        gap = ((dither.uniform(-1, 1, 8000) + dither.uniform(-1, 1, 8000)) / 32768).astype(np.float32)
        joined = np.concatenate([a, gap, b])
        key = f"pair{i:02d}"
        sf.write(tmp_path / f"{key}.wav", joined, 16000)
        truth[key] = (len(a) / 16000, len(a) / 16000 + 0.5 + speech_onset(b))
        durations[key] = len(joined) / 16000
        lines.append({"key": key, "wav": str(tmp_path / f"{key}.wav"),
                      "txt": f"{texts[keys[2 * i]]} {texts[keys[2 * i + 1]]}"})
    noise = torch.Generator().manual_seed(0)
    for k in keys:
        wav = torch.from_numpy(audio[k])[None]
        noisy = add_noise(wav, torch.tensor([wav.shape[1]]), torch.randn(wav.shape, generator=noise),
                          torch.tensor([0.0]), 16000)
        zeros = torch.nn.functional.pad(wav, (8000, 8000))  # 0.5 s of digital silence each side (issue 60)
        for kind, samples in (("clean", wav), ("noisy", noisy), ("zeros", zeros)):
            sf.write(tmp_path / f"{kind}-{k}.wav", samples[0].numpy(), 16000)
            lines.append({"key": f"{kind}-{k}", "wav": str(tmp_path / f"{kind}-{k}.wav"), "txt": texts[k]})
            durations[f"{kind}-{k}"] = samples.shape[1] / 16000
    raw = tmp_path / "raw.list"
    raw.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    result = run_cli("corpus-io", "decode", f"++data_list={raw}", "++dataset_conf.data_type=raw",
                     f"++checkpoint={smoke['exp'] / 'model.pt.avg1'}", f"++output_dir={tmp_path / 'dec'}",
                     "++timestamps=true")
    assert result.returncode == 0, result.stderr[-3000:]
    recs = {r["key"]: r for r in map(json.loads, (tmp_path / "dec" / "timestamps.jsonl").read_text().splitlines())}
    assert sorted(recs) == sorted(durations)
    for key, rec in recs.items():
        starts = [w["start"] for w in rec["words"]]
        assert starts == sorted(starts) and all(0 <= w["start"] <= w["end"] <= durations[key] + 1e-3
                                                for w in rec["words"]), rec
    errors = {}
    for key, (first_ends, onset) in truth.items():
        after = [w for w in recs[key]["words"] if w["start"] >= first_ends]
        errors[key] = round(after[0]["start"] - onset, 2) if after else None
    hits = sum(e is not None and abs(e) <= 0.2 for e in errors.values())
    confidence = {kind: [w["confidence"] for k, r in recs.items() if k.startswith(kind) for w in r["words"]]
                  for kind in ("clean", "noisy")}
    mean = {kind: float(np.mean(c)) if c else 0.0 for kind, c in confidence.items()}
    print(f"smoke model: second-utterance onsets within 0.2 s: {hits} / 10 (seconds off: {errors}); mean word "
          f"confidence clean {mean['clean']:.3f} ({len(confidence['clean'])} words), 0 dB noise "
          f"{mean['noisy']:.3f} ({len(confidence['noisy'])} words)", file=sys.stderr)
    assert hits >= 9, errors
    assert confidence["clean"] and mean["noisy"] < mean["clean"], mean
    # issue 60: how many words the model reads into 0.5 s of exact zeros before and after the speech (printed: the
    # recipe's conf trains without silence_pad for now, docs/TRAINING.md; with it, 1 of 20 still had one)
    hyps = {k: v.split() for k, _, v in (f"{line} ".partition(" ") for line in
                                         (tmp_path / "dec" / "text").read_text(encoding="utf-8").splitlines())}
    inserted = {k: (hyps[f"clean-{k}"], hyps[f"zeros-{k}"]) for k in keys
                if len(hyps[f"zeros-{k}"]) > len(hyps[f"clean-{k}"])}
    same = sum(hyps[f"zeros-{k}"] == hyps[f"clean-{k}"] for k in keys)
    print(f"smoke model: 0.5 s of zeros each side: the same words on {same} / 20, a word inserted on "
          f"{len(inserted)}", file=sys.stderr)


@pytest.fixture(scope="session")
def stage_8_alone(tmp_path_factory) -> dict:
    """The real recordings' stage on its own (--stage 8 --stop_stage 8 --streaming true, one training step) into a
    data dir and an exp dir that no earlier stage made: its stderr and exit code, and its real_overfit dir (a causal,
    dynamic-chunk model of the 10 real utterances, decoded full context and chunk by chunk), which smoke_streaming's
    stage 9 serves instead of training one more."""
    def build(root: Path) -> dict:
        data, exp = root / "data", root / "exp" / "conformer_ctc"
        result = run_recipe("espeak", "--stage", "8", "--stop_stage", "8", "--streaming", "true", "--real_epochs",
                            "1", "--max_steps_per_epoch", "1", "--data", str(data), "--exp", str(exp),
                            timeout=hang_limit(300))
        (root / "stderr.txt").write_text(result.stderr, encoding="utf-8")
        return {"exp": str(exp), "real": str(root / "exp" / "real_overfit"), "returncode": result.returncode,
                "stderr": str(root / "stderr.txt")}

    built = built_once(tmp_path_factory, "stage_8_alone", build)
    return {"exp": Path(built["exp"]), "real": Path(built["real"]), "returncode": built["returncode"],
            "stderr": Path(built["stderr"]).read_text(encoding="utf-8")}


@pytest.fixture(scope="session")
def smoke_streaming(smoke, stage_8_alone, tmp_path_factory) -> dict:
    """`make smoke`'s options with --streaming true on a copy of its data: stages 6-7 (a causal, dynamic-chunk model
    decoded full context and in 16-frame chunks) and 9 (served by sherpa-onnx, offline and online), with the real
    recordings' streaming model of stage 8 taken from ``stage_8_alone`` (copied beside the exp dir, where stage 8
    writes it), so stage 9 serves it too."""
    import shutil

    assert stage_8_alone["returncode"] == 0, stage_8_alone["stderr"][-6000:]

    def build(root: Path) -> dict:
        shutil.copytree(smoke["data"], root / "data", symlinks=True)
        shutil.copytree(stage_8_alone["real"], root / "real_overfit", symlinks=True)
        opts = shlex.split((RECIPES / "espeak" / "conf" / "smoke.opts").read_text())
        stderr, returncode = "", 0
        for first, last in (("6", "7"), ("9", "9")):  # stage 8: stage_8_alone's model
            result = run_recipe("espeak", *opts, "--streaming", "true", "--stage", first, "--stop_stage", last,
                                "--decode_methods", "greedy", "--data", str(root / "data"), "--exp",
                                str(root / "exp"), timeout=hang_limit(480))
            stderr, returncode = stderr + result.stderr, result.returncode
            if returncode != 0:
                break
        (root / "stderr.txt").write_text(stderr, encoding="utf-8")
        return {"exp": str(root / "exp"), "real": str(root / "real_overfit"), "returncode": returncode,
                "stderr": str(root / "stderr.txt")}

    built = built_once(tmp_path_factory, "smoke_streaming", build)
    stderr = Path(built["stderr"]).read_text(encoding="utf-8")
    assert built["returncode"] == 0, stderr[-6000:]
    return {"exp": Path(built["exp"]), "real": Path(built["real"]), "stderr": stderr}


def _cer(decode_dir: Path) -> float:
    return float(re.search(r"^%CER ([0-9.]+)", (decode_dir / "cer.txt").read_text(), re.M).group(1))


def _agreement(summary: Path) -> tuple[int, int]:
    same, total = re.search(r"same words as corpus-io decode .*: (\d+) of (\d+)", summary.read_text()).groups()
    return int(same), int(total)


@pytest.mark.slow
def test_one_streaming_checkpoint_decodes_full_context_and_chunk_by_chunk_with_word_times(smoke_streaming):
    """Issue 45: the recipe with --streaming true trains one checkpoint that decodes both ways; chunk 16 is close to
    full context on test_digits, and the chunk decode writes word times too.

    Issue 45's 15 % relative (or 1 point) is the recipe model's figure (docs/BENCHMARKS.md). The smoke set has 20
    utterances and 353 characters, so one word ("eight", 1.4 points) decides 1 point, and the smoke training is not
    bit-reproducible under pytest-xdist (the same commit gave 1.98 / 2.55 and 5.95 / 7.37, one word apart each
    time). Here: at most 2 of the 20 utterances decode differently, and chunk CER within 15 % or 2 points."""
    exp = smoke_streaming["exp"]
    assert stage_lines(smoke_streaming["stderr"]) >= {6, 7, 9}, smoke_streaming["stderr"][-3000:]  # 8: stage_8_alone
    assert "use_dynamic_chunk: true" in (exp / "config.yaml").read_text()
    full, chunk = _cer(exp / "decode_test_digits"), _cer(exp / "decode_test_digits.chunk16")
    assert chunk <= max(full * 1.15, full + 2.0), (full, chunk)
    hypotheses = [dict(line.partition(" ")[::2] for line in (exp / name / "text").read_text().splitlines())
                  for name in ("decode_test_digits", "decode_test_digits.chunk16")]
    assert hypotheses[0].keys() == hypotheses[1].keys()
    differ = sorted(key for key in hypotheses[0] if hypotheses[0][key].split() != hypotheses[1][key].split())
    assert len(differ) <= max(2, len(hypotheses[0]) // 10), differ
    text = (exp / "decode_test_digits.chunk16" / "text").read_text().splitlines()
    words = sum(len(line.split()) - 1 for line in text)
    ctm = (exp / "decode_test_digits.chunk16" / "ctm").read_text().splitlines()
    assert len(ctm) == words > 0
    # the cached chunk-by-chunk forward equals the chunk-masked full forward on every test utterance
    import dataclasses

    import torch

    from corpus_io.audio.features import fbank
    from corpus_io.infer.decode import load_model
    from corpus_io.infer.transcribe import read_recording

    model, _, tcfg = load_model(str(exp / "model.pt.avg1"), torch.device("cpu"))
    options = {k: v for k, v in dataclasses.asdict(tcfg.dataset_conf.fbank_conf).items() if k != "dither"}
    assert options["snip_edges"] is False and options["high_freq"] == -400  # the defaults: sherpa-onnx's features
    gaps = []
    for line in (exp.parent / "data" / "test_digits" / "wav.scp").read_text().splitlines():
        feats = fbank(read_recording(line.split(" ", 1)[1].strip(), 16000)[None], 16000, **options)[None]
        with torch.no_grad():
            cached = model.ctc_log_probs(*model.encode_streaming(feats, 16, 4))[0]
            masked = model.ctc_log_probs(*model.encode(feats, torch.tensor([feats.shape[1]]), 16, 4))[0]
        gaps.append(float((cached - masked).abs().max()))
    assert len(gaps) == 20 and max(gaps) < 1e-4, gaps


@pytest.mark.xfail(reason="issue 52, open: the small make smoke streaming model (40 bins, 336 utterances) reads a "
                          "'two' into sherpa-onnx's tail of exact zeros online (5 of 20 the same words; the recipe's "
                          "80-bin streaming model reads nothing into them: docs/DECODING.md)", strict=False)
@pytest.mark.slow
def test_sherpa_onnx_serves_the_export_with_the_words_corpus_io_decodes_offline_and_online(smoke_streaming):
    """Issue 45: sherpa-onnx 2.0.1 itself (default arguments but feature_dim; online fed 0.1 s pieces) on the files of
    export-model gives corpus-io decode's words (full context; chunk 16 with 4 left chunks) on >= 95 % of the
    test_digits utterances, with spaces between words; the real recordings (the stage 8 model) run through both."""
    exp = smoke_streaming["exp"]
    for mode in ("offline", "online"):
        same, total = _agreement(exp / "serve" / f"decode_test_digits.{mode}" / "summary.txt")
        assert total >= 20 and same >= 0.95 * total, (mode, same, total)
        texts = (exp / "serve" / f"decode_test_digits.{mode}" / "text").read_text().splitlines()
        assert sum(len(line.split()) > 2 for line in texts) >= total // 2  # several words, spaces between
        assert (exp / "serve" / mode / "tokens.txt").is_file()
    # the real recordings through both: stage 8's one-step model of them (stage_8_alone) says little
    # (docs/DECODING.md has the full recipe's figures), so only that sherpa-onnx serves every one and offline reads
    # what decode reads
    real = smoke_streaming["real"]
    for mode in ("offline", "online"):
        same, total = _agreement(real / "serve" / f"decode_real.{mode}" / "summary.txt")
        assert total == 10 and (mode == "online" or same == total), (mode, same, total)


@pytest.mark.xfail(reason="issue 52, open: the small make smoke streaming model (40 bins, 336 utterances) reads a "
                          "'two' into sherpa-onnx's tail of exact zeros online (5 of 20 the same words; the recipe's "
                          "80-bin streaming model reads nothing into them: docs/DECODING.md)", strict=False)
@pytest.mark.slow
def test_sherpa_onnxs_online_command_line_tool_with_its_default_padding_prints_corpus_io_decodes_words(
        smoke_streaming, smoke):
    """Issue 52: sherpa-onnx's own online tool (the sherpa-onnx-bin wheel of the [deploy] extra), default arguments but
    the files and --feat-dim, pads 0.5 s of exact zeros before the audio and 0.8 s after; the recipe's streaming model
    (trained with the defaults: sherpa's features, training dither) gives corpus-io's chunk-16 words on >= 95 % of
    test_digits (the models trained without dither read a word into those zeros: 19-26 of 40)."""
    tool = Path(sys.executable).parent / "sherpa-onnx"
    if not tool.is_file():
        pytest.skip(f"{tool} is not installed (the sherpa-onnx-bin wheel of the [deploy] extra)")
    exp = smoke_streaming["exp"]
    hyps = dict((line.split(" ", 1) + [""])[:2]
                for line in (exp / "decode_test_digits.chunk16" / "text").read_text().splitlines())
    wavs = dict(line.split(" ", 1) for line in (smoke["data"] / "test_digits" / "wav.scp").read_text().splitlines())
    online = exp / "serve" / "online"
    result = run_bounded([str(tool), f"--tokens={online / 'tokens.txt'}", f"--wenet-ctc-model={online / 'model.onnx'}",
                          "--feat-dim=40", "--num-threads=1", *[wavs[k].strip() for k in sorted(hyps)]], 300)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr
    texts = {}
    for key in sorted(hyps):
        at = printed.index(wavs[key].strip() + "\n")
        texts[key] = json.loads(re.search(r"^\{ \"text\".*\}$", printed[at:], re.M).group(0))["text"]
    differ = {k: (texts[k], hyps[k]) for k in hyps if texts[k].split() != hyps[k].split()}
    print(f"sherpa-onnx online tool: {len(hyps) - len(differ)} of {len(hyps)} give corpus-io's chunk-16 words; "
          f"differ: {differ}", file=sys.stderr)
    assert len(hyps) >= 20 and len(differ) <= 0.05 * len(hyps), differ


@pytest.mark.xfail(reason="issue 52, open: the small make smoke streaming model (40 bins, 336 utterances) reads a "
                          "'two' into sherpa-onnx's tail of exact zeros online (5 of 20 the same words; the recipe's "
                          "80-bin streaming model reads nothing into them: docs/DECODING.md)", strict=False)
@pytest.mark.slow
def test_the_readme_sherpa_onnx_lines_print_the_words_corpus_io_decodes_chunk_by_chunk(smoke_streaming, smoke):
    """README "Streaming and serving": its Python lines, run as written on the recipe's online export (paths and
    feature_dim put in), print corpus-io's chunk-16 words for held-out utterances."""
    from tests.conftest import doc_section

    code = re.search(r"```python\n(.*?)```", doc_section("Streaming and serving"), re.S).group(1)
    exp = smoke_streaming["exp"]
    hyps = dict(line.split(" ", 1) for line in (exp / "decode_test_digits.chunk16" / "text").read_text().splitlines()
                if " " in line)
    wavs = dict(line.split(" ", 1) for line in (smoke["data"] / "test_digits" / "wav.scp").read_text().splitlines())
    same = 0
    for key in sorted(hyps)[:3]:
        script = (code.replace("exp/serve/online", str(exp / "serve" / "online"))
                  .replace("audio.wav", wavs[key].strip()).replace("feature_dim=80", "feature_dim=40"))
        result = run_bounded([sys.executable, "-c", script], 120)
        assert result.returncode == 0, result.stderr[-3000:]
        same += result.stdout.split() == hyps[key].split()
    assert same >= 2, same


def tiny_training(tmp_path: Path) -> list[str]:
    return ["--data", str(tmp_path / "data"), "--exp", str(tmp_path / "exp"), "--nj", "2", "--nproc", "2",
            "--num_workers", "1", "--num_utts_per_shard", "4", "--max_epoch", "1", "--max_steps_per_epoch", "2",
            "--average_num", "1", "--cmvn_max_utts", "0", "--batch_size", "3000",
            "--train_config", str(tmp_path / "train.yaml"), "--master_port", str(free_port()),
            "--tune_lm", "false"]  # make_lm's tune-lm grid runs in the espeak smoke test; here it would add ~20 s each


def cpu_train_config(recipe: str, tmp_path: Path) -> None:
    """The recipe's train.yaml with a CPU-sized model (the real one is 12 blocks of 256)."""
    text = (RECIPES / recipe / "conf" / "train.yaml").read_text()
    for key, value in {"num_blocks": 1, "output_size": 32, "linear_units": 64, "subsampling_channels": 8,
                       "attention_heads": 2, "num_workers": 1, "min_length": 10}.items():
        text = re.sub(rf"(\b{key}: )\d+", rf"\g<1>{value}", text)
    # a collective stuck on one rank fails within 90 s, naming the op, instead of running into the test timeout
    text = text.replace("train_conf:\n", f"train_conf:\n  timeout_s: {hang_limit(90):.0f}\n")
    (tmp_path / "train.yaml").write_text(text.replace("pin_memory: true", "pin_memory: false"))


@pytest.mark.slow
def test_aishell_recipe_prepares_trains_and_decodes_a_lookalike_tree(pipeline_commands, tmp_path):
    synth.make_aishell_lookalike(tmp_path / "corpus", speakers_per_split=2, utts_per_speaker=4)
    cpu_train_config("aishell", tmp_path)
    result = run_recipe("aishell", "--aishell_root", str(tmp_path / "corpus"), *tiny_training(tmp_path))
    assert result.returncode == 0, result.stderr[-6000:]
    assert stage_lines(result.stderr) == set(range(8)), result.stderr[-3000:]
    assert "[prepare train] 8 utterances, 2 speakers" in result.stderr
    assert (tmp_path / "data" / "train" / "text").read_text().count("BAC009S0002W") == 4
    table = (tmp_path / "exp" / "RESULTS.md").read_text()
    assert re.search(r"^\| test \| [0-9.]+ \|", table, re.M), table
    assert re.search(r"^\| test \| ctc_beam_lm \| [0-9.]+ \|", table, re.M), table  # a character 3-gram
    assert "lm_unit=token" in (tmp_path / "exp" / "decode_test.ctc_beam_lm" / "cer.txt").read_text()


@pytest.mark.slow
def test_librispeech_recipe_prepares_trains_and_decodes_a_lookalike_tree(pipeline_commands, tmp_path):
    synth.make_librispeech_lookalike(tmp_path / "corpus", subsets=("train-clean-100", "dev-clean", "test-clean"),
                                     readers_per_subset=2, utts_per_chapter=4)
    cpu_train_config("librispeech", tmp_path)
    result = run_recipe("librispeech", "--librispeech_root", str(tmp_path / "corpus"),
                        "--train_sets", "train-clean-100", "--dev_sets", "dev-clean", "--test_sets", "test-clean",
                        "--vocab_size", "40", *tiny_training(tmp_path))
    assert result.returncode == 0, result.stderr[-6000:]
    assert stage_lines(result.stderr) == set(range(8)), result.stderr[-3000:]
    assert (tmp_path / "data" / "train" / "wav.scp").read_text().count(".flac") == 8
    assert (tmp_path / "data" / "lang" / "tokens.model").is_file()
    table = (tmp_path / "exp" / "RESULTS.md").read_text()
    assert re.search(r"^\| test_clean \| [0-9.]+ \|", table, re.M), table
    assert re.search(r"^\| test_clean \| ctc_beam_lm \| [0-9.]+ \| [0-9.]+ \|", table, re.M), table
    # a word 3-gram over the BPE pieces' words (lm_unit auto -> word)
    assert "lm_unit=word" in (tmp_path / "exp" / "decode_test_clean.ctc_beam_lm" / "cer.txt").read_text()


@pytest.mark.slow
def test_the_cleaning_stage_scores_the_training_set_and_repacks_it_without_the_flagged_keys(smoke, tmp_path):
    """Stage 11 on the smoke run's training set and model (its own data and exp dirs: the smoke run's are read
    only): scores.jsonl has a row per training utterance, the re-packed list holds every one but the flagged, and
    the counts are printed."""
    data, exp = tmp_path / "data", tmp_path / "exp"
    data.mkdir()
    exp.mkdir()
    (data / "train").symlink_to(smoke["data"] / "train")
    (exp / "model.pt.avg1").symlink_to(smoke["exp"] / "model.pt.avg1")
    result = run_recipe("espeak", "--stage", "11", "--stop_stage", "11", "--average_num", "1", "--data", str(data),
                        "--exp", str(exp), timeout=hang_limit(300))
    assert result.returncode == 0, result.stderr[-3000:]
    trained = (smoke["data"] / "train" / "data.jsonl").read_text().splitlines()
    scores = [json.loads(line) for line in (exp / "score_train" / "scores.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in scores) == sorted(json.loads(line)["key"] for line in trained)
    flagged = {line.split()[0] for line in (exp / "score_train" / "flagged").read_text().splitlines()}
    assert flagged == {r["key"] for r in scores if r["flagged"]}
    kept = {k for url in (data / "train_clean" / "shard.list").read_text().split()
            for k in _shard_keys(url)}
    assert kept == {r["key"] for r in scores} - flagged
    assert re.search(rf"\[stage 11\] scored {len(scores)} training utterances, flagged {len(flagged)} \(flagged by: "
                     rf".*\): kept {len(kept)} in ", result.stderr), result.stderr[-3000:]


def _shard_keys(url: str) -> list[str]:
    from corpus_io.shards.reader import read_shard

    return [sample["key"] for sample in read_shard(url)]


def test_stage_8_runs_alone_streaming_and_makes_the_dirs_it_writes_into(stage_8_alone):
    """The real recordings' stage needs no earlier stage: one training step, then its CER appended to an exp dir
    that only stage 6 made before (its last ``tee`` exited 1 there)."""
    assert stage_8_alone["returncode"] == 0, stage_8_alone["stderr"][-4000:]
    assert stage_lines(stage_8_alone["stderr"]) == {8}
    assert re.search(r"^\| real \| [0-9.]+ \|", (stage_8_alone["exp"] / "RESULTS.md").read_text(), re.M)
    assert (stage_8_alone["real"] / "decode_real.chunk16" / "text").is_file()  # decoded chunk by chunk
