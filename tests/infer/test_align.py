"""corpus-io align (corpus_io/infer/align.py): the known transcripts of the smoke model's test set force-aligned
(CTC Viterbi over the reference tokens), and words that cannot be aligned reported, never placed: text not spoken
(more tokens than the audio's frames) and tokens outside the token list."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli
from tests.test_hostile import corpus_io as in_process


@pytest.mark.slow
def test_align_places_every_spoken_word_in_order_and_reports_the_words_it_cannot_place(smoke, tmp_path):
    data = tmp_path / "test_digits"
    shutil.copytree(smoke["data"] / "test_digits", data)
    texts = dict(line.split(" ", 1) for line in (data / "text").read_text().splitlines())
    keys = sorted(texts)
    padded, foreign = keys[0], keys[1]
    texts[padded] = texts[padded] + " " + " ".join(["nine"] * 200)  # 200 words more than 2 s can hold
    texts[foreign] = texts[foreign] + " ωμέγα"  # not in the token list
    (data / "text").write_text("".join(f"{k} {texts[k]}\n" for k in keys))
    out = tmp_path / "align"
    result = run_cli("corpus-io", "align", f"++data_list={data}", f"++checkpoint={smoke['exp'] / 'model.pt.avg1'}",
                     f"++output_dir={out}", "++dataset_conf.num_workers=0")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["key"]: r for r in map(json.loads, (out / "alignment.jsonl").read_text().splitlines())}
    assert sorted(rows) == keys
    ctm = [line.split() for line in (out / "ctm").read_text().splitlines()]
    unaligned = [line.split(" ", 3) for line in (out / "unaligned").read_text().splitlines()]
    for key in keys:
        words = rows[key]["words"]
        assert [w["word"] for w in words] == texts[key].split()  # every word of the transcript, in order
        placed = [w for w in words if w["start"] is not None]
        assert [(w["start"], w["end"]) for w in placed] == sorted((w["start"], w["end"]) for w in placed)
        assert all(0 <= w["start"] < w["end"] and 0 <= w["score"] <= 1 for w in placed)
        assert len([row for row in ctm if row[0] == key]) == len(placed)
    # the 200 words not spoken have no path (never squeezed into the audio's end), the foreign word is outside
    reasons = {(k, int(i)): why for k, i, _, why in unaligned}
    spoken = len(texts[padded].split()) - 200
    assert sum(k == padded for k, _ in reasons) >= 200 and all(i >= spoken - 1 for k, i in reasons if k == padded)
    assert reasons[(foreign, len(texts[foreign].split()) - 1)].startswith("tokens outside the token list")
    others = [k for k in keys if k not in (padded, foreign)]
    placed_words = sum(w["start"] is not None for k in others for w in rows[k]["words"])
    assert placed_words >= 0.98 * sum(len(texts[k].split()) for k in others)  # the model's own test set
    assert "unaligned" in result.stdout and "no path" in result.stdout, result.stdout


def test_special_tokens_in_a_transcript_are_unaligned_words_outside_the_token_list(tmp_path):
    """A transcript word ``<blank>`` (or ``<unk>``, ``<sos/eos>``) is no token of the list: align reports it
    unaligned, and segment (which shares ``transcript``) never puts it in a segment's text."""
    from corpus_io.infer.align import OUTSIDE, transcript
    from tests.test_tokenizer import tiny_tokenizer

    tok = tiny_tokenizer(tmp_path)
    tr = transcript("hello <blank> 你 <unk> <sos/eos>", tok)
    assert tr.words == ["hello", "<blank>", "你", "<unk>", "<sos/eos>"]
    assert tr.outside == {1: ["<blank>"], 3: ["<unk>"], 4: ["<sos/eos>"]} and tr.ids == [4, 2]
    assert [bool(m) for m in tr.members] == [True, False, True, False, False]
    assert OUTSIDE == "tokens outside the token list"


def test_placed_words_start_where_input_frame_0_starts_as_decodes_do():
    """place_words (align's and segment's) moves every word by ``offset_seconds`` through decode's own rule
    (decoding.align.shifted): the 7.5 ms of frames centred on every shift (snip_edges=false, the default), none with
    Kaldi's framing; clipped at the audio's start."""
    from corpus_io.config import DatasetConf
    from corpus_io.infer.align import Transcript, place_words
    from corpus_io.infer.decode import input_frame_offset_seconds
    from tests.decoding.test_align import spikes

    lp = spikes(12, 4, {0: 1, 4: 2, 9: 3})
    tr = Transcript(["a", "b", "c"], [1, 2, 3], [[0], [1], [2]])
    conf = DatasetConf()
    kwargs = {"frame_seconds": 0.04, "duration": 0.48, "blank": 0, "window": 100, "min_word_score": 0.0}
    kaldi = place_words(lp, tr, offset_seconds=input_frame_offset_seconds(DatasetConf(fbank_conf={"snip_edges": True})),
                        **kwargs)
    centred = place_words(lp, tr, offset_seconds=input_frame_offset_seconds(conf), **kwargs)
    assert input_frame_offset_seconds(conf) == pytest.approx(-0.0075)
    assert [(w.start, w.end) for w in kaldi] == [(0.0, 0.04), (0.16, 0.2), (0.36, 0.4)]
    for a, b in zip(kaldi, centred):  # times in ms, as decode's
        assert b.start == pytest.approx(max(0.0, a.start - 0.0075), abs=1e-3) and b.end < a.end
        assert b.end == pytest.approx(a.end - 0.0075, abs=1e-3) and (b.start < a.start or a.start == 0.0)
    assert [w.score for w in centred] == [w.score for w in kaldi]


@pytest.mark.slow
def test_align_moves_word_times_by_the_offset_of_the_checkpoints_features(smoke, tmp_path):
    """`corpus-io align` with the smoke model (fbank without snip_edges, the default): each utterance's words are
    placed on its log-probs and moved by input_frame_offset_seconds (-7.5 ms), as decode's are; without the offset
    the same path gives the times 7.5 ms later."""
    from corpus_io import config
    from corpus_io.infer.align import load, passes, place_words, transcript, window_frames
    from corpus_io.infer.decode import input_frame_offset_seconds

    data = smoke["data"] / "test_digits"
    out = tmp_path / "align"
    args = [f"++data_list={data}", f"++checkpoint={smoke['exp'] / 'model.pt.avg1'}", f"++output_dir={out}",
            "++dataset_conf.num_workers=0", "++device=cpu"]
    result = run_cli("corpus-io", "align", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["key"]: r for r in map(json.loads, (out / "alignment.jsonl").read_text().splitlines())}
    cfg = config.compose(config.AlignConfig, "align", args)
    m = load(cfg.checkpoint, "cpu", cfg.dataset_conf)
    assert input_frame_offset_seconds(m.conf) == pytest.approx(-0.0075)
    checked = 0
    for p in passes(m, str(data), chunk_seconds=cfg.chunk_seconds, desc="test"):
        assert p.frame_offset == input_frame_offset_seconds(m.conf)
        kwargs = {"frame_seconds": m.frame_seconds, "duration": p.duration, "blank": m.tokenizer.blank_id,
                  "speech": p.speech, "speech_seconds": p.speech_seconds,
                  "window": window_frames(cfg.window_seconds, m.frame_seconds), "min_word_score": cfg.min_word_score}
        tr = transcript(p.text, m.tokenizer)
        moved, plain = place_words(p.log_probs, tr, offset_seconds=p.frame_offset, **kwargs), \
            place_words(p.log_probs, tr, **kwargs)
        # align writes no times for an unaligned word (a smoke training may score a spoken word under
        # min_word_score); the path's times are still there to compare for the offset
        assert [(w["start"], w["end"], w.get("reason", "")) for w in rows[p.key]["words"]] == \
            [(None, None, w.reason) if w.reason else (w.start, w.end, "") for w in moved]
        for a, b in zip(plain, moved):
            if a.start is not None:
                assert b.start == pytest.approx(max(0.0, a.start - 0.0075), abs=1e-3)
                assert b.end == pytest.approx(a.end - 0.0075, abs=1e-3)
                checked += 1
    assert checked >= len(rows)


@pytest.mark.slow
@pytest.mark.parametrize("chunk_seconds", [0.0, 0.8])
def test_log_probs_kept_to_the_transcripts_tokens_align_every_word_as_the_whole_vocabulary_does(smoke, chunk_seconds):
    """align and segment keep only the transcript's tokens' and blank's log-probs (an hour of a 5,000-token model's
    whole vocabulary is 1.8 GB): whole (chunk_seconds 0) or piece by piece (0.8 s pieces), the kept columns are the
    whole vocabulary's values and every word is placed at the same times with the same score and reason."""
    import torch

    from corpus_io import config
    from corpus_io.infer.align import columns_for, load, narrowed, passes, place_words, transcript, window_frames

    data = smoke["data"] / "test_digits"
    cfg = config.compose(config.AlignConfig, "align", [f"++data_list={data}",
                                                       f"++checkpoint={smoke['exp'] / 'model.pt.avg1'}",
                                                       "++output_dir=unused", "++dataset_conf.num_workers=0"])
    m = load(cfg.checkpoint, "cpu", cfg.dataset_conf)
    blank = m.tokenizer.blank_id
    full = {p.key: p for p in passes(m, str(data), chunk_seconds=chunk_seconds, desc="test")}
    kept = list(passes(m, str(data), chunk_seconds=chunk_seconds, desc="test",
                       columns=lambda key, text: columns_for(transcript(text, m.tokenizer), blank)))
    assert len(kept) == len(full) >= 20
    for p in kept:
        whole = full[p.key]
        tr = transcript(p.text, m.tokenizer)
        assert p.columns == columns_for(tr, blank) and whole.columns is None
        assert p.log_probs.shape[1] == len(p.columns) < whole.log_probs.shape[1]
        assert torch.equal(p.log_probs, whole.log_probs[:, p.columns])
        kwargs = {"frame_seconds": m.frame_seconds, "duration": p.duration, "speech": p.speech,
                  "speech_seconds": p.speech_seconds, "window": window_frames(cfg.window_seconds, m.frame_seconds),
                  "min_word_score": cfg.min_word_score, "offset_seconds": p.frame_offset}
        ids, kept_blank = narrowed(tr, p.columns, blank)
        assert place_words(p.log_probs, ids, blank=kept_blank, **kwargs) == \
            place_words(whole.log_probs, tr, blank=blank, **kwargs)


def align_args(one_step_run, data_list, out) -> list[str]:
    """align of ``data_list`` with the one-step model (the cheapest checkpoint: its words may score anything, so
    every path is placed: ++min_word_score=0)."""
    return [f"++data_list={data_list}", f"++checkpoint={one_step_run['out'] / 'model.pt.ep0'}", f"++output_dir={out}",
            "++dataset_conf.num_workers=0", "++device=cpu", "++min_word_score=0"]


def test_align_replaces_only_its_own_outputs_never_an_edited_ctm_or_someone_elses_unaligned(
        one_step_run, corpus, tmp_path, capfd):
    """A file under an output's name that align did not write (a user's unaligned list) is refused before any work,
    kept as it was; align's own outputs are recorded, so a rerun replaces them, but not once one is edited."""
    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "unaligned").write_text("utt1 0 hello checked by hand\n", encoding="utf-8")
    rc, err = in_process("align", *align_args(one_step_run, corpus["raw"], theirs), capfd=capfd)
    assert rc == 2 and f"++output_dir's unaligned {theirs / 'unaligned'} exists, and align did not write it" in err, err
    assert "Traceback" not in err and "Nothing was written" in err and not (theirs / "ctm").exists()
    assert (theirs / "unaligned").read_text(encoding="utf-8") == "utt1 0 hello checked by hand\n"
    out = tmp_path / "align"
    for _ in range(2):  # the second run replaces the first's files: align wrote them
        rc, err = in_process("align", *align_args(one_step_run, corpus["raw"], out), capfd=capfd)
        assert rc == 0, err
    with open(out / "ctm", "a", encoding="utf-8") as f:
        f.write("spk0-utt000 1 0.00 0.10 corrected 1.00\n")
    edited = (out / "ctm").read_bytes()
    rc, err = in_process("align", *align_args(one_step_run, corpus["raw"], out), capfd=capfd)
    assert rc == 2 and f"{out / 'ctm'} exists, and align did not write it (changed since)" in err, err
    assert (out / "ctm").read_bytes() == edited


def test_align_of_a_kaldi_dir_with_segments_names_ctm_recordings_by_recording_id_not_wav_file(
        one_step_run, fixture_corpus, tmp_path, capfd):
    """A Kaldi dir's segments name their recording by its id (wav.scp's first field, segments' second): the CTM's
    first field and alignment.jsonl's ``recording`` are that id, never the audio file's name (``long``)."""
    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]
    src = fixture_corpus / "segments_dir"
    data = tmp_path / "data"
    data.mkdir()
    wav = (src / "wav" / "long.wav").resolve()
    (data / "wav.scp").write_text(f"meeting-7 {wav}\n", encoding="utf-8")
    (data / "segments").write_text((src / "segments").read_text().replace(" long ", " meeting-7 "), encoding="utf-8")
    shutil.copy(src / "text", data / "text")
    out = tmp_path / "align"
    rc, err = in_process("align", *align_args(one_step_run, data, out), capfd=capfd)
    assert rc == 0, err
    ctm = [line.split() for line in (out / "ctm").read_text().splitlines()]
    assert ctm and {row[0] for row in ctm} == {"meeting-7"}
    rows = [json.loads(line) for line in (out / "alignment.jsonl").read_text().splitlines()]
    assert sorted((r["key"], r["recording"]) for r in rows) == [(f"long-seg{i:02d}", "meeting-7") for i in range(4)]


def test_align_refuses_a_repeated_key_naming_both_lines_or_with_on_error_skip_keeps_the_first_and_says_so(
        one_step_run, tmp_path, capfd):
    from tests.loader_data import raw_with_a_repeated_key

    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]
    data_list, key = raw_with_a_repeated_key(tmp_path)
    out = tmp_path / "align"
    rc, err = in_process("align", *align_args(one_step_run, data_list, out), capfd=capfd)
    assert rc == 2 and f"align: key '{key}' is at {data_list}:1 and {data_list}:5" in err, err
    assert "Traceback" not in err and "Nothing was written" in err and not out.exists()
    rc, err = in_process("align", *align_args(one_step_run, data_list, out), "++dataset_conf.on_error=skip",
                         capfd=capfd)
    assert rc == 0 and f"warning: key '{key}' is at {data_list}:1 and {data_list}:5" in err, err
    keys = [json.loads(line)["key"] for line in (out / "alignment.jsonl").read_text().splitlines()]
    assert len(keys) == 4 and keys.count(key) == 1


def test_align_refuses_a_feature_override_the_checkpoint_was_not_trained_with_naming_the_key(
        one_step_run, corpus, tmp_path, capfd):
    """Resampling to 8 kHz for a 16 kHz model was ignored in silence (the checkpoint's features won); now refused, one
    paragraph naming the key, nothing written."""
    assert one_step_run["returncode"] == 0, one_step_run["stderr"][-3000:]
    out = tmp_path / "align"
    rc, err = in_process("align", *align_args(one_step_run, corpus["raw"], out),
                         "++dataset_conf.resample_conf.resample_rate=8000", capfd=capfd)
    assert rc == 2, err
    assert "++dataset_conf.resample_conf.resample_rate=8000: the checkpoint was trained with " \
           "resample_conf.resample_rate=16000" in err, err
    assert "Traceback" not in err and not out.exists()
