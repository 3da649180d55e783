"""Token and word times and confidences (corpus_io.decoding.align) on exactly constructed CTC log-probabilities:
the frame -> seconds rule (subsampling x frame shift), word grouping by the tokenizer's text, confidences in [0, 1],
and decode's CTM / timestamps.jsonl for whole recordings and Kaldi segments."""

from __future__ import annotations

import json
import math

import pytest
import torch

from corpus_io.decoding.align import align, token_frames
from corpus_io.decoding.scoring import word_units

FRAME = 0.04  # ConformerCTC: 4 x 10 ms


def spikes(T: int, V: int, at: dict[int, int], p: float = 0.9) -> torch.Tensor:
    """(T, V) log-probs: blank with probability p everywhere except frame -> token ``at`` (the token with p);
    the rest spread evenly."""
    probs = torch.full((T, V), (1 - p) / (V - 1))
    probs[:, 0] = p
    for t, tok in at.items():
        probs[t] = (1 - p) / (V - 1)
        probs[t, tok] = p
    return probs.log()


def tokenizer_of(tmp_path, tokens: list[str], **conf):
    from corpus_io.config import TokenizerConf
    from corpus_io.tokenizer import build_tokenizer, write_token_list

    path = tmp_path / "tokens.txt"
    write_token_list(path, tokens)
    return build_tokenizer(TokenizerConf(token_list=str(path), **conf))


def test_token_times_are_output_frames_times_the_frame_seconds_and_repeats_stay_apart():
    lp = spikes(50, 4, {5: 1, 6: 1, 20: 2, 22: 2, 40: 3})  # token 1 held two frames; 2 twice, a blank between
    assert token_frames(lp, [1, 2, 2, 3]) == [[5, 6], [20], [22], [40]]
    timed = align(lp, [1, 2, 2, 3], lambda ids: " ".join(f"w{i}" for i in ids), word_units, frame_seconds=FRAME)
    assert [(t.start, t.end) for t in timed.tokens] == [(0.2, 0.28), (0.8, 0.84), (0.88, 0.92), (1.6, 1.64)]
    assert [w.text for w in timed.words] == ["w1", "w2", "w2", "w3"]
    assert all(math.isclose(t.confidence, 0.9, abs_tol=1e-5) for t in timed.tokens)
    assert math.isclose(timed.confidence, 0.9, abs_tol=1e-5)
    # clipped to the audio: a last frame past the duration ends at the duration
    late = align(spikes(10, 4, {9: 1}), [1], lambda ids: "w", word_units, frame_seconds=FRAME, duration=0.38)
    assert (late.tokens[0].start, late.tokens[0].end) == (0.36, 0.38)


def test_words_span_their_tokens_for_letters_cjk_characters_and_a_word_of_two_characters(tmp_path):
    letters = tokenizer_of(tmp_path, ["▁", "h", "i", "y", "o", "今", "天"], latin_unit="letter")
    ids = [letters.ids[c] for c in ["h", "i", "▁", "y", "o", "今", "天"]]
    lp = spikes(60, letters.vocab_size, {2 + 5 * k: i for k, i in enumerate(ids)})
    timed = align(lp, ids, letters.decode, word_units, frame_seconds=FRAME)
    assert letters.decode(ids) == "hi yo今天"
    assert [(w.text, w.start, w.end) for w in timed.words] == [
        ("hi", 0.08, 0.32), ("yo", 0.68, 0.92), ("今", 1.08, 1.12), ("天", 1.28, 1.32)]  # the ▁ belongs to none
    words = tokenizer_of(tmp_path, ["今天", "好"], type="word")  # a token of two CJK words: its frames shared
    wid = [words.ids["今天"], words.ids["好"]]
    timed = align(spikes(30, words.vocab_size, {10: wid[0], 11: wid[0], 20: wid[1]}), wid, words.decode, word_units,
                  frame_seconds=FRAME)
    assert [(w.text, w.start, w.end) for w in timed.words] == [("今", 0.4, 0.44), ("天", 0.44, 0.48), ("好", 0.8, 0.84)]


def test_confidence_is_in_0_1_falls_with_flatter_posteriors_and_an_empty_hypothesis_has_blanks():
    decode = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    sure = align(spikes(30, 5, {10: 1, 20: 2}, p=0.95), [1, 2], decode, word_units, frame_seconds=FRAME)
    unsure = align(spikes(30, 5, {10: 1, 20: 2}, p=0.4), [1, 2], decode, word_units, frame_seconds=FRAME)
    for timed in (sure, unsure):
        assert all(0.0 <= w.confidence <= 1.0 for w in timed.words) and 0.0 <= timed.confidence <= 1.0
    assert unsure.confidence < sure.confidence and unsure.words[0].confidence < sure.words[0].confidence
    empty = align(spikes(30, 5, {}, p=0.8), [], decode, word_units, frame_seconds=FRAME)
    assert empty.words == [] and math.isclose(empty.confidence, 0.8, abs_tol=1e-5)


def speech_onset(x) -> float:
    """Seconds to the first 10 ms frame of 16 kHz samples ``x`` within 40 dB of the loudest (the sound's start)."""
    import numpy as np

    energy = np.array([np.mean(x[i:i + 160] ** 2) for i in range(0, len(x) - 160, 160)])
    return int(np.argmax(energy > energy.max() * 1e-4)) * 0.01


def pairs(n: int = 10):
    """Two fixture utterances joined by 0.5 s of silence, at 16 kHz: (samples, true onset of the second one's
    speech in seconds: the first 10 ms frame within 40 dB of its loudest)."""
    import numpy as np
    import soundfile as sf

    from corpus_io.audio.io import resample
    from tests.loader_data import fixture_utts

    def load(path):
        x, sr = sf.read(path, dtype="float32", always_2d=True)
        x = x.mean(axis=1)
        return np.asarray(resample(x, sr, 16000), dtype=np.float32).reshape(-1) if sr != 16000 else x

    utts = fixture_utts()
    out = []
    for i in range(n):
        (_, pa, ta), (_, pb, tb) = utts[2 * i], utts[2 * i + 1]
        a, b = load(pa), load(pb)
        out.append((np.concatenate([a, np.zeros(8000, np.float32), b]), len(a) / 16000 + 0.5 + speech_onset(b), ta, tb))
    return out


def test_a_word_spans_its_sound_a_pause_splits_two_words_and_fluent_words_meet_in_the_middle_of_their_gap():
    """With ``speech`` (10 ms frames), word bounds move from the CTC frames to the sound between the words: a
    pause (silence of PAUSE_SECONDS or more) between two words ends the first where it starts and starts the second
    where it ends; a shorter silence (a stop's closure) does not split; two words with no pause between meet in the
    middle of the frames between their tokens; a start moves back at most ONSET_BACK_SECONDS, an end forward at
    most END_FORWARD_SECONDS; tokens keep the CTC path's times."""
    from corpus_io.decoding.align import END_FORWARD_SECONDS, ONSET_BACK_SECONDS, PAUSE_SECONDS

    decode = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    lp = spikes(100, 4, {10: 1, 50: 2, 80: 3})  # w1 at 0.4 s, w2 at 2.0 s, w3 at 3.2 s
    speech = torch.zeros(400, dtype=torch.bool)
    speech[30:44] = True  # w1: sound 0.30-0.44 s
    speech[170:190] = True  # w2: sound from 1.70 s, a 0.05 s closure, more sound up to 2.05 s
    speech[195:205] = True
    speech[260:390] = True  # w3: sound from 2.60 s (more than 0.5 s before its token) to 3.90 s (0.66 s after it)
    timed = align(lp, [1, 2, 3], decode, word_units, frame_seconds=FRAME, speech=speech, speech_seconds=0.01)
    assert [w.start for w in timed.words] == [0.3, 1.7, round(3.2 - ONSET_BACK_SECONDS, 3)]
    assert [w.end for w in timed.words] == [0.44, 2.05, round(3.24 + END_FORWARD_SECONDS, 3)]
    assert [t.start for t in timed.tokens] == [0.4, 2.0, 3.2]  # the CTC path's
    pause = speech.clone()
    pause[170:195] = False
    pause[170:180] = True  # w2: 0.15 s of silence (a pause) between sound at 1.7-1.8 s and sound from 1.95 s
    assert int(round(PAUSE_SECONDS / 0.01)) <= 15
    timed = align(lp, [1, 2, 3], decode, word_units, frame_seconds=FRAME, speech=pause, speech_seconds=0.01)
    assert timed.words[1].start == 1.95
    fluent = torch.zeros(400, dtype=torch.bool)
    fluent[140:210] = True  # w1 at 1.6 s, w2 at 2.0 s in one run of sound 1.4-2.1 s: they meet at 1.82 s
    timed = align(spikes(100, 4, {40: 1, 50: 2}), [1, 2], decode, word_units, frame_seconds=FRAME, speech=fluent,
                  speech_seconds=0.01)
    assert [(w.start, w.end) for w in timed.words] == [(1.4, 1.82), (1.82, 2.1)]
    plain = align(lp, [1, 2, 3], decode, word_units, frame_seconds=FRAME)
    assert [(w.start, w.end) for w in plain.words] == [(0.4, 0.44), (2.0, 2.04), (3.2, 3.24)]  # no speech: CTC's


def test_no_word_starts_before_the_sound_nor_ends_after_it_and_a_click_at_the_files_start_is_not_sound():
    """A CTC path that starts at frame 0 while the sound starts 0.25 s in (a model that spikes before the sound),
    and whose last token ends before the sound does: the first word starts at the sound's first frame, the last
    ends at its last, each word after the one before; a short click at the file's very start, parted from the
    speech by silence, is not where the first word starts."""
    decode = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    speech = torch.zeros(100, dtype=torch.bool)
    speech[25:80] = True  # sound 0.25-0.80 s
    timed = align(spikes(25, 4, {0: 1, 2: 2, 10: 3}), [1, 2, 3], decode, word_units, frame_seconds=FRAME,
                  speech=speech, speech_seconds=0.01)
    assert timed.words[0].start == 0.25 and timed.words[-1].end == 0.8
    assert all(a.end <= b.start for a, b in zip(timed.words, timed.words[1:]))
    assert all(w.start < w.end for w in timed.words)
    clicked = speech.clone()
    clicked[0:8] = True  # a 0.08 s click at the file's start, 0.17 s before the speech: a cut-off neighbour's tail
    timed = align(spikes(25, 4, {0: 1, 2: 2, 10: 3}), [1, 2, 3], decode, word_units, frame_seconds=FRAME,
                  speech=clicked, speech_seconds=0.01)
    assert timed.words[0].start == 0.25


def test_speech_frames_are_near_the_loudest_and_above_the_background():
    from corpus_io.decoding.align import SPEECH_FLOOR_DB, SPEECH_TOP_DB, speech_frames

    energy = torch.tensor([40.0] * 20 + [100.0, 95.0, 100.0 - SPEECH_TOP_DB + 1, 100.0 - SPEECH_TOP_DB - 1] + [40.0])
    assert speech_frames(energy).tolist() == [False] * 20 + [True, True, True, False, False]
    noisy = torch.tensor([80.0] * 20 + [100.0, 80.0 + SPEECH_FLOOR_DB + 1, 80.0 + SPEECH_FLOOR_DB - 1])
    assert speech_frames(noisy).tolist() == [False] * 20 + [True, True, False]  # 10 dB above the background
    assert speech_frames(torch.zeros(0)).tolist() == []


def test_joined_pairs_second_utterance_starts_at_its_onset_on_the_model_frame_grid(tmp_path):
    """10 real pairs through the loader's fbank and ConformerCTC's own length rule; log-probs constructed with
    each token spiking at the output frame that holds its reference time (the second utterance's first token at
    its true onset): decode's frame seconds (output_frame_seconds: 10 ms x 4) put its first word within 0.2 s of
    the onset, in every pair, and the times grow and stay inside the audio."""
    from corpus_io.audio.features import num_frames
    from corpus_io.config import DatasetConf
    from corpus_io.infer.decode import _durations, output_frame_seconds
    from corpus_io.model.model import build_model

    model = build_model({"_target_": "corpus_io.model.model.ConformerCTC", "output_size": 16, "attention_heads": 2,
                         "linear_units": 16, "num_blocks": 1, "subsampling_channels": 4}, 80, 8)
    conf = DatasetConf()
    frame = output_frame_seconds(model, conf)
    assert frame == pytest.approx(0.04)
    hits = 0
    for x, true_onset, ta, tb in pairs():
        # the loader's fbank frames (25 ms window, 10 ms shift, the default framing: snip_edges=false since issue 52)
        feats = num_frames(len(x), 16000, snip_edges=conf.fbank_conf.snip_edges)
        T = int(model.embed.output_lengths(torch.tensor([feats]))[0])
        duration = _durations({"feats_lengths": torch.tensor([feats])}, conf)[0]
        assert abs(duration - len(x) / 16000) < 0.011
        na, nb = len(word_units(ta)), len(word_units(tb))
        # one token per word: the first utterance's words spread over its speech, the second's from its onset
        first = [int(k * (true_onset - 0.5) / FRAME / max(1, na)) for k in range(na)]
        second = [int(true_onset / FRAME) + 2 * k for k in range(nb)]
        at = {t: 1 + (j % 7) for j, t in enumerate(first + second) if t < T}
        ids = [at[t] for t in sorted(at)]
        timed = align(spikes(T, 8, at), ids, lambda s: " ".join(f"w{i}" for i in s), word_units,
                      frame_seconds=frame, duration=duration)
        starts = [w.start for w in timed.words]
        assert starts == sorted(starts) and all(0 <= w.start < w.end <= duration for w in timed.words)
        hits += abs(timed.words[len(first)].start - true_onset) <= 0.2
    assert hits == 10


def test_ctm_and_jsonl_give_recording_times_for_segments_read_by_the_loader(tmp_path, fixture_corpus):
    """The segments fixture (one recording 'long', 4 segments) read by the raw loader: each batch row knows its
    recording and start; decode's CTM names the recording and shifts each word by its segment's start, Kaldi's six
    fields, sorted by time; whole recordings keep their own key and times."""
    from corpus_io.config import DecodeConfig
    from corpus_io.infer.decode import DecodeRun, result_row, run_totals, write_results
    from corpus_io.loader.dataset import build_dataloader
    from tests.conftest import run_cli

    seg = fixture_corpus / "segments_dir"
    raw = tmp_path / "seg.jsonl"
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{seg}/wav.scp,{seg}/text]",
                     "++data_type_list=[source,target]", f"++segments={seg}/segments", f"++jsonl_file_out={raw}")
    assert result.returncode == 0, result.stderr
    conf = DecodeConfig().dataset_conf
    conf.data_type, conf.num_workers = "raw", 0
    segments = {}
    for batch in build_dataloader(str(raw), conf, None, train=False, rank=0, world_size=1):
        segments.update(zip(batch["keys"], batch["segments"]))
    starts = {line.split()[0]: float(line.split()[2]) for line in (seg / "segments").read_text().splitlines()}
    assert segments == {k: ["long", s] for k, s in starts.items()}
    run = DecodeRun(segments=segments)
    decode = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    for key in segments:
        run.timed[key] = align(spikes(40, 4, {3: 1, 10: 2}), [1, 2], decode, word_units, frame_seconds=FRAME)
        run.nbest[key] = [("w1 w2", 0.0)]
    run.timed["whole"] = align(spikes(40, 4, {5: 3}, p=0.4), [3], decode, word_units, frame_seconds=FRAME)
    run.nbest["whole"] = [("w3", 0.0)]
    rows, missing = tmp_path / "rows.jsonl", tmp_path / "missing.jsonl"
    rows.write_text("".join(json.dumps({**result_row(k, "", run.nbest[k], None, (run.timed[k], run.segments.get(k))),
                                        "tokens": 0}) + "\n" for k in sorted(run.timed)))
    missing.write_text("")
    totals = {**run_totals(run), "skipped": "none"}
    options = {"method": "greedy", "nbest": 1, "timestamps": True, "min_confidence": 0.5, "data_list": str(raw),
               "data_type": "shard"}
    write_results(tmp_path, rows, missing, totals, options, tmp=tmp_path)
    rows = [line.split() for line in (tmp_path / "ctm").read_text().splitlines()]
    assert all(len(r) == 6 and r[1] == "1" and 0 <= float(r[5]) <= 1 and float(r[3]) > 0 for r in rows)
    long = [r for r in rows if r[0] == "long"]
    assert [float(r[2]) for r in long] == [round(s + t, 2) for s in sorted(starts.values()) for t in (0.12, 0.4)]
    assert [r for r in rows if r[0] == "whole"] == [["whole", "1", "0.20", "0.04", "w3", "0.40"]]
    recs = {json.loads(line)["key"]: json.loads(line) for line in (tmp_path / "timestamps.jsonl").read_text()
            .splitlines()}
    first = min(starts, key=starts.get)
    second = sorted(starts, key=starts.get)[1]
    assert recs[second]["recording"] == "long" and recs[second]["offset"] == starts[second]
    assert recs[second]["words"][0]["start"] == pytest.approx(starts[second] + 0.12)
    assert [t["token"] for t in recs[first]["tokens"]] == ["w1", "w2"] and "recording" not in recs["whole"]
    kept = (tmp_path / "kept_text").read_text().splitlines()  # min_confidence 0.5: the unsure one (0.4) is left out
    assert kept == [f"{k} w1 w2" for k in sorted(starts)] and (tmp_path / "confidence").read_text().count("\n") == 5



def test_bpe_pieces_group_into_the_words_the_hypothesis_text_has(tmp_path):
    from tests.decoding.test_hotwords import tokenizer as bpe_tokenizer

    tok = bpe_tokenizer("bpe", tmp_path)
    text = "speech torchaudio is fun"
    ids = tok.encode(text)
    assert len(ids) > 4  # torchaudio (not a training word) spells in several pieces
    at = {3 + 4 * k: i for k, i in enumerate(ids)}
    timed = align(spikes(4 * len(ids) + 6, tok.vocab_size, at), ids, tok.decode, word_units, frame_seconds=FRAME)
    assert [w.text for w in timed.words] == text.split() == word_units(tok.decode(ids))
    pieces = [tok.symbols[i] for i in ids]
    assert "▁" in pieces  # a bare ▁ piece (before a word sentencepiece has no ▁-piece for) adds only a space
    # each word from its first piece with letters to the last one before the next word's ▁: a bare ▁ is in none
    marks = [k for k, p in enumerate(pieces) if p.startswith("▁")]
    starts = [k + 1 if pieces[k] == "▁" else k for k in marks]
    ends = [(k - 1) for k in marks[1:]] + [len(ids) - 1]
    assert [(w.start, w.end) for w in timed.words] == [
        (round((3 + 4 * a) * FRAME, 3), round((4 + 4 * b) * FRAME, 3)) for a, b in zip(starts, ends)]


def test_ctc_viterbi_finds_forced_aligns_path_and_none_when_the_tokens_cannot_fit():
    from corpus_io.decoding.align import ctc_viterbi

    torch.manual_seed(0)
    lp = torch.randn(120, 9).log_softmax(-1)
    ids = [3, 4, 4, 5, 1, 2, 7, 7, 7, 8]  # repeats need a blank between
    assert ctc_viterbi(lp, ids) == token_frames(lp, ids)
    assert ctc_viterbi(lp[:4], [1, 2, 3, 4, 5]) is None  # more tokens than frames
    assert ctc_viterbi(lp[:4], [1, 1, 1]) is None  # three equal tokens need five frames: a blank between two
    assert ctc_viterbi(lp[:5], [1, 1, 1]) == [[0], [2], [4]]


def test_ctc_viterbi_free_end_stops_where_the_frames_end_and_windows_align_a_long_text_like_one_trellis():
    from corpus_io.decoding.align import ctc_viterbi, windowed_token_frames

    ids = [1 + (k * 7) % 11 for k in range(600)]  # 600 tokens, one every 8 frames: 4800 frames, 3 tokens a word
    lp = spikes(8 * len(ids), 12, {8 * k + 3: tok for k, tok in enumerate(ids)}, p=0.95)
    head = ctc_viterbi(lp[:100], ids, free_end=True)
    assert head is not None and len(head) == 13 and head[-1] == [99]  # the tokens spoken in these frames only
    words = list(range(0, len(ids), 3))
    windowed = windowed_token_frames(lp, ids, words, window=300)
    assert windowed == token_frames(lp, ids)  # windows of 300 frames, the whole path of one 4800 x 1201 trellis
    # text the audio does not hold: the tokens after the speech are reported (None), not squeezed into its end
    more = windowed_token_frames(lp, ids + [5, 6, 7], words + [600], window=300)
    assert more[:600] == windowed and more[600:] == [None, None, None]


def test_word_times_of_frames_centred_on_every_shift_start_half_a_window_earlier():
    """Without snip_edges (sherpa-onnx's framing, the default since issue 52) input frame k starts 7.5 ms before
    k * 10 ms: every token and word time moves by that offset, kept inside the audio; Kaldi's framing moves none."""
    from corpus_io.config import DatasetConf
    from corpus_io.infer.decode import input_frame_offset_seconds

    conf = DatasetConf()
    assert input_frame_offset_seconds(conf) == pytest.approx(-0.0075)
    conf.fbank_conf.snip_edges = True
    assert input_frame_offset_seconds(conf) == 0.0
    at = {0: 1, 5: 2, 9: 3}
    ids = [1, 2, 3]
    kwargs = {"frame_seconds": 0.04, "duration": 0.4}
    plain = align(spikes(10, 8, at), ids, lambda s: " ".join(f"w{i}" for i in s), word_units, **kwargs)
    moved = align(spikes(10, 8, at), ids, lambda s: " ".join(f"w{i}" for i in s), word_units, offset_seconds=-0.0075,
                  **kwargs)
    for a, b in zip(plain.words + plain.tokens, moved.words + moved.tokens):
        assert b.start == pytest.approx(max(0.0, a.start - 0.0075), abs=1e-3)  # times: ms
        assert b.end == pytest.approx(a.end - 0.0075, abs=1e-3) and b.end < a.end
    assert moved.words[0].start == 0.0 and moved.confidence == plain.confidence


def test_free_audio_ends_leave_speech_the_text_does_not_say_to_no_token():
    """ctc_viterbi with free audio before and after the text (CTC segmentation's way): the model hears token 1 for
    frames 0-7, then 3 at frame 10 and 4 at 14, then 5 for frames 17-21; 3 and 4 sound a little like what is said
    around them. A transcript "3 4" (it starts late and ends early), forced, stretches 3 and 4 over the speech of 1
    and 5 (repeats cost less than blank on speech); with free ends they hold their own frames, and the silence at
    frames 8-9 and 11-13 still goes to blank."""
    import torch

    from corpus_io.decoding.align import ctc_viterbi

    lp = torch.full((22, 6), -8.0)
    lp[:, 0] = -0.01
    for frames, token in ((range(0, 8), 1), ([10], 3), ([14], 4), (range(17, 22), 5)):
        for t in frames:
            lp[t, 0], lp[t, token] = -8.0, -0.01
    lp[0:8, 3] = -3.0
    lp[17:22, 4] = -3.0
    forced = ctc_viterbi(lp, [3, 4])
    assert forced[0][0] == 0 and forced[1][-1] == 21, forced  # stretched over speech that says 1 and 5
    assert ctc_viterbi(lp, [3, 4], free_audio=(True, True)) == [[10], [14]]
    assert ctc_viterbi(lp, [1, 3, 4, 5], free_audio=(True, True)) == [list(range(8)), [10], [14], list(range(17, 22))]
