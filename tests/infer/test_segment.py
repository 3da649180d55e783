"""corpus-io segment (corpus_io/infer/segment.py): long recordings made by joining utterances with pauses of 0.3-1.2 s
(``synth.join``), their text known only as one line each, cut by the model `make smoke` trains; scored against where
the joins really are (recipes/tools/score_segments.py). Bad input: one paragraph, exit 2, nothing written."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from corpus_io.tables import synth
from tests.conftest import REPO, run_cli

_spec = importlib.util.spec_from_file_location("score_segments", REPO / "recipes" / "tools" / "score_segments.py")
score_segments = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(score_segments)


@pytest.fixture(scope="module")
def joined(tmp_path_factory) -> Path:
    """80 espeak digit strings (the smoke model's voices, texts it never heard) joined 40 a recording."""
    root = tmp_path_factory.mktemp("joined")
    synth.make_digits(root / "utts", 80, seed=11)
    return synth.join(root / "utts", root / "long", per_recording=40, seed=0)


def segment(smoke_exp: Path, input_dir: Path, out: Path, *args: str):
    return run_cli("corpus-io", "segment", f"++input={input_dir}", f"++checkpoint={smoke_exp / 'model.pt.avg1'}",
                   f"++output_dir={out}", "++dataset_conf.num_workers=0", *args)


@pytest.mark.slow
def test_segment_cuts_joined_recordings_in_their_pauses_and_places_every_word_once(smoke, joined, tmp_path):
    """The acceptance of issue 54 on espeak speech: no cut inside an utterance's speech, >= 95 % of segments hold
    exactly the words spoken inside them, the segments' words in order are the transcript less `unaligned` (<= 3 %
    with this small model, see below), segments at most 20 s; the same with 8 s Viterbi windows (a window boundary
    every few utterances); the Kaldi dir goes into scp2jsonl and pack-shards as it is."""
    results = {}
    for name, args in (("whole", ()), ("windows", ("++window_seconds=8",))):
        out = tmp_path / name
        result = segment(smoke["exp"], joined, out, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "transcript words:" in result.stdout and "skipped audio" in result.stdout, result.stdout
        figures = score_segments.score(joined, out)
        print(f"segment ({name}): {json.dumps(figures)}")
        assert figures["cuts_in_speech"] == 0, figures
        assert figures["exact"] >= 0.95, figures
        # the 2 % is the recipe model's (docs/BENCHMARKS.md: 0 unaligned with the dev run's model). Smoke
        # models of earlier trainings left 7 and 11 of the 412 words (1.7 %, 2.7 %): one or two spoken words scored
        # just under min_word_score (0.044 and 0.048 against 0.05) took their phrases with them. CI's model of
        # 2026-12-07 left 42 (10 %) by onset words it half heard (sure_word_posterior), 0 now; 3 % keeps that
        # noise out and still fails a segmenter that loses phrases it can hear
        assert figures["order_ok"] and figures["unaligned"] <= 0.03, figures
        rows = [json.loads(line) for line in (out / "segments.jsonl").read_text().splitlines()]
        assert rows and all(0 < r["end"] - r["start"] <= 20.0 and 0 <= r["score"] <= 1 for r in rows)
        results[name] = [(r["key"], r["text"]) for r in rows]
    assert results["windows"] == results["whole"]
    out = tmp_path / "whole"
    jsonl = tmp_path / "segments.jsonl"
    result = run_cli("corpus-io", "scp2jsonl", f"++scp_file_list=[{out}/wav.scp,{out}/text]",
                     "++data_type_list=[source,target]", f"++segments={out}/segments", f"++jsonl_file_out={jsonl}")
    assert result.returncode == 0, result.stderr
    assert len(jsonl.read_text().splitlines()) == len(results["whole"])
    result = run_cli("corpus-io", "pack-shards", f"++input={out}", f"++output_dir={tmp_path / 'shards'}",
                     "++num_workers=1")
    assert result.returncode == 0, result.stderr
    assert f"{len(results['whole'])} utterances" in result.stdout + result.stderr


def copy_dir(src: Path, dst: Path, keep: int = 1) -> Path:
    """The first ``keep`` recordings of a joined Kaldi dir."""
    dst.mkdir(parents=True)
    for name in ("wav.scp", "text"):
        lines = (src / name).read_text().splitlines()[:keep]
        (dst / name).write_text("".join(line + "\n" for line in lines))
    return dst


def bad_inputs(joined: Path, root: Path) -> dict:
    """name -> (input dir, what the message must say)."""
    cases = {}
    d = copy_dir(joined, root / "text_without_audio")
    (d / "text").write_text((d / "text").read_text() + "ghost one two three\n")
    cases["text_without_audio"] = (d, "have no recording in")
    d = copy_dir(joined, root / "audio_without_text", keep=2)
    (d / "text").write_text((d / "text").read_text().splitlines()[0] + "\n")
    cases["audio_without_text"] = (d, "have no transcript line")
    d = copy_dir(joined, root / "empty_transcript")
    (d / "text").write_text("long0000 \n")
    cases["empty_transcript"] = (d, "key 'long0000' has no value")  # the Kaldi table reader's own message
    jsonl = root / "empty_target.jsonl"
    wav = (joined / "wav.scp").read_text().split()[1]
    jsonl.write_text(json.dumps({"key": "long0000", "source": wav, "target": " "}) + "\n")
    cases["empty_target"] = (jsonl, "empty transcript")
    d = copy_dir(joined, root / "too_short")
    wav = (d / "wav.scp").read_text().split()[1]
    short = d / "short.wav"
    import soundfile as sf

    audio, rate = sf.read(wav, frames=16000)
    sf.write(short, audio, rate)
    (d / "wav.scp").write_text(f"long0000 {short}\n")
    cases["too_short"] = (d, "lasts 1.00 s but its transcript is")
    d = copy_dir(joined, root / "unspellable")
    (d / "text").write_text("long0000 αβγ δεζ ηθι κλμ\n")
    cases["unspellable"] = (d, "cannot spell 4 of the 4 words")
    return cases


@pytest.mark.slow
def test_segment_refuses_bad_input_in_one_paragraph_and_writes_nothing(smoke, joined, tmp_path):
    for name, (input_dir, said) in bad_inputs(joined, tmp_path / "in").items():
        out = tmp_path / f"out_{name}"
        result = segment(smoke["exp"], input_dir, out)
        assert result.returncode == 2, (name, result.stdout[-2000:], result.stderr[-2000:])
        assert said in result.stderr and "Traceback" not in result.stderr, (name, result.stderr)
        assert not out.exists() or not any(out.iterdir()), name
    # a wav.scp command runs only with allow_pipe, its length probe included: this one would leave a trace
    d = copy_dir(joined, tmp_path / "in" / "pipe")
    trace = tmp_path / "pipe-ran"
    (d / "wav.scp").write_text(f"long0000 touch {trace} |\n")
    result = segment(smoke["exp"], d, tmp_path / "out_pipe")
    assert result.returncode == 2 and "allow_pipe" in result.stderr and "Traceback" not in result.stderr, \
        result.stderr
    assert not trace.exists(), "segment ran a wav.scp command while commands are off"
    # the output dir is the input: refused before the model is loaded, the inputs untouched
    d = copy_dir(joined, tmp_path / "in" / "same")
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    result = segment(smoke["exp"], d, d)
    assert result.returncode == 2 and "is ++input" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    # the output dir is another Kaldi dir (its wav.scp and text are not segment's): refused, nothing replaced
    other = copy_dir(joined, tmp_path / "in" / "other")
    before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    result = segment(smoke["exp"], joined, other)
    assert result.returncode == 2 and "segment did not write it" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "_segmented" in result.stderr, result.stderr
    assert {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()} == before


def test_an_unaligned_word_takes_its_phrase_with_it_so_that_cuts_stay_in_pauses():
    """Three phrases (speech regions) parted by 0.5 s pauses; the middle one holds a word scored below
    min_word_score: its whole phrase is left out (listed with its reason), the others are segments bounded in the
    pauses around them."""
    from corpus_io.infer.align import LOW_SCORE, Placed
    from corpus_io.infer.segment import BESIDE, cut

    placed = [Placed("one", 0.5, 1.0, 0.9), Placed("two", 1.05, 2.0, 0.9),  # phrase A
              Placed("three", 2.5, 3.0, 0.9), Placed("four", 3.05, 3.5, 0.01, LOW_SCORE),  # phrase B
              Placed("five", 3.55, 4.0, 0.9),
              Placed("six", 4.5, 5.0, 0.9)]  # phrase C
    regions = [(0.5, 2.0), (2.5, 4.0), (4.5, 5.0)]
    got = cut("rec", placed, 6.0, regions, max_seconds=20, max_pause=3, padding=0.2)
    assert [(s.text, s.start, s.end) for s in got.segments] == [("one two", 0.3, 2.2), ("six", 4.3, 5.2)]
    assert [p.reason for p in placed] == ["", "", BESIDE, LOW_SCORE, BESIDE, ""]


def test_segments_are_cut_in_the_audio_pauses_not_in_gaps_the_word_times_leave():
    """The CTC path's word times fill a real 0.6 s pause ("two" ends 0.3 s into it, "three" starts 0.2 s early) and
    leave a 0.15 s gap inside a phrase: the pause the audio has is where the cut falls, and the word the path put
    across it stays on its side of the pause."""
    from corpus_io.infer.align import Placed
    from corpus_io.infer.segment import cut

    placed = [Placed("one", 0.5, 1.0, 0.9), Placed("two", 1.15, 2.3, 0.9),  # the audio: one two | three four
              Placed("three", 2.4, 3.0, 0.9), Placed("four", 3.0, 3.5, 0.9)]
    regions = [(0.5, 2.0), (2.6, 3.5)]
    got = cut("rec", placed, 4.0, regions, max_seconds=2.5, max_pause=3, padding=0.2)
    assert [(s.text, s.start, s.end) for s in got.segments] == [("one two", 0.3, 2.2), ("three four", 2.4, 3.7)]
    assert all(not p.reason for p in placed)


def test_speech_no_word_was_placed_in_ends_the_segment_and_is_counted_not_kept():
    """A sentence the transcript lacks (a region the model hears, no word in it) between two transcribed ones ends
    the segment and is skipped and counted; a breath (a region the model hears nothing in) ends nothing."""
    from corpus_io.infer.align import Placed
    from corpus_io.infer.segment import cut

    placed = [Placed("one", 0.5, 1.0, 0.9), Placed("two", 3.5, 4.0, 0.9), Placed("three", 5.5, 6.0, 0.9)]
    regions = [(0.5, 1.0), (1.5, 3.0), (3.5, 4.0), (4.6, 4.9), (5.5, 6.0)]
    got = cut("rec", placed, 7.0, regions, max_seconds=20, max_pause=3, padding=0.2,
              heard=[True, True, True, False, True])
    assert [(s.text, s.start, s.end) for s in got.segments] == [("one", 0.3, 1.2), ("two three", 3.3, 6.2)]
    assert got.untranscribed == [(1.5, 3.0)]


def test_padding_shrinks_so_that_no_segment_is_longer_than_max_segment_seconds():
    """++padding_seconds=5 ++max_segment_seconds=3 wrote a 3.24 s segment: the padding gives way to the bound."""
    from corpus_io.infer.align import Placed
    from corpus_io.infer.segment import cut

    placed = [Placed("one", 10.0, 10.5, 0.9), Placed("two", 10.6, 12.0, 0.9)]
    got = cut("rec", placed, 30.0, [(10.0, 12.0)], max_seconds=3, max_pause=3, padding=5)
    (seg,) = got.segments
    assert seg.end - seg.start <= 3.0 and seg.start <= 10.0 and seg.end >= 12.0, seg


def _greedy_rows(rows: list[tuple[int, float]], vocab: int):
    """CTC log-posteriors (T, vocab): frame t gives token rows[t][0] posterior rows[t][1], blank (id 0) the rest."""
    import torch

    probs = torch.full((len(rows), vocab), 1e-6)
    for t, (token, p) in enumerate(rows):
        probs[t, token] += p
        probs[t, 0] += 1 - p
    return (probs / probs.sum(-1, keepdim=True)).log()


@pytest.mark.parametrize("peak, fails", [(0.6, False), (0.97, True)])
def test_a_word_the_text_lacks_fails_the_segment_only_when_the_model_is_sure_of_it(tmp_path, peak, fails):
    """The whole-segment check: the greedy path reads "one three two" over a segment whose text is "one two". A
    "three" the model half hears (peak posterior 0.6: the smoke model's onset insertions measured 0.45-0.76) is no
    speech the text leaves out; one it is sure of (0.97: a word deleted from the transcript, 0.93-0.99) is. With
    ``sure=0`` (every word counts, the old check) both fail the segment."""
    from corpus_io.config import TokenizerConf
    from corpus_io.infer.align import Placed
    from corpus_io.infer.segment import Segment, unsaid_run
    from corpus_io.tokenizer import build_tokenizer, write_token_list

    write_token_list(tmp_path / "tokens.txt", ["<blank>", "<unk>", "one", "two", "three", "<sos/eos>"])
    tokenizer = build_tokenizer(TokenizerConf(token_list=str(tmp_path / "tokens.txt")))
    lp = _greedy_rows([(2, 0.95), (2, 0.9), (0, 1.0), (4, peak), (0, 1.0), (3, 0.95), (0, 1.0)], 6)
    seg = Segment("rec", 0.0, 0.28, [(0, Placed("one", 0.0, 0.08, 0.9)), (1, Placed("two", 0.2, 0.24, 0.9))])
    assert unsaid_run(lp, None, 0, tokenizer, seg, 0.04, 0.0, sure=0.85) == (1 if fails else 0)
    assert unsaid_run(lp, None, 0, tokenizer, seg, 0.04, 0.0, sure=0.0) == 1


def test_a_pseudo_label_word_half_heard_in_the_pause_before_speech_is_dropped_and_cuts_nothing():
    """A recording with no text: the greedy path reads "eight" in the pause just before the speech "five six"
    (heard 0.05 s before the region, score 0.6). It is dropped with its reason, leaves its neighbours in their
    segment and does not move its start into the speech. The same word heard sure (0.95) stays (within the 0.5 s
    a CTC model may emit a word beside its sound)."""
    from corpus_io.infer.align import Placed
    from corpus_io.infer.segment import READ_IN_PAUSE, cut, drop_read_in_pauses

    regions = [(1.0, 2.0), (2.5, 3.0)]
    for score, text in ((0.6, "five six seven"), (0.95, "eight five six seven")):
        placed = [Placed("eight", 0.9, 1.05, score, heard=0.95), Placed("five", 1.05, 1.5, 0.95, heard=1.2),
                  Placed("six", 1.6, 2.0, 0.95, heard=1.8), Placed("seven", 2.5, 3.0, 0.9, heard=2.7)]
        drop_read_in_pauses(placed, regions, sure=0.85)
        got = cut("rec", placed, 4.0, regions, max_seconds=20, max_pause=3, padding=0.2)
        assert [(s.text, s.start, s.end) for s in got.segments] == [(text, 0.8, 3.2)], score
        assert [p.reason for p in placed] == [READ_IN_PAUSE if score < 0.85 else "", "", "", ""]


def test_a_word_the_path_put_in_a_pause_is_unaligned_with_its_neighbours_phrases():
    from corpus_io.infer.align import Placed
    from corpus_io.infer.segment import BESIDE, IN_NO_SPEECH, cut

    placed = [Placed("one", 0.5, 1.0, 0.9), Placed("two", 1.5, 1.7, 0.9), Placed("three", 2.5, 3.0, 0.9),
              Placed("four", 4.0, 4.5, 0.9)]
    got = cut("rec", placed, 5.0, [(0.5, 1.0), (2.5, 3.0), (4.0, 4.5)], max_seconds=20, max_pause=3, padding=0.2)
    assert [p.reason for p in placed] == [BESIDE, IN_NO_SPEECH, BESIDE, ""]
    assert [s.text for s in got.segments] == ["four"]


def faulty_transcripts(joined: Path, root: Path) -> dict:
    """name -> a Kaldi dir of recording long0000 (40 joined utterances) with a transcript wrong the way real ones
    are, its joins.jsonl marking the utterances whose speech the transcript does not (wholly) say."""
    truth = [json.loads(line) for line in (joined / "joins.jsonl").read_text().splitlines()]
    utts = [t for t in truth if t["recording"] == "long0000"]
    other = [w for t in truth if t["recording"] == "long0001" for w in t["words"]]
    half = len(utts) // 2
    shortest = min(range(5, len(utts) - 5), key=lambda i: len(utts[i]["words"]))  # spoken in a pause, unwritten
    cases = {"first_half": ({i: None for i in range(half, len(utts))}, None),
             "second_half": ({i: None for i in range(half)}, None),
             "other_text": ({i: None for i in range(len(utts))}, other),
             "word_deleted": ({i: len(utts[i]["words"]) // 2 for i in (3, 17, 30)}, None),
             "word_in_pause": ({shortest: None}, None)}
    out = {}
    for name, (unsaid, replacement) in cases.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "wav.scp").write_text((joined / "wav.scp").read_text().splitlines()[0] + "\n")
        words = []
        for i, t in enumerate(utts):
            if i in unsaid:
                t = {**t, "untranscribed": True}
                if unsaid[i] is not None:  # one word of the sentence missing from the transcript
                    words += [w for k, w in enumerate(t["words"]) if k != unsaid[i]]
                utts[i] = t
                continue
            words += t["words"]
            utts[i] = {k: v for k, v in t.items() if k != "untranscribed"}
        (d / "text").write_text(f"long0000 {' '.join(replacement or words)}\n")
        (d / "joins.jsonl").write_text("".join(json.dumps(t) + "\n" for t in utts))
        out[name] = (d, len(replacement or words))
    return out


@pytest.mark.slow
def test_segment_puts_no_transcript_on_speech_that_did_not_say_it(smoke, joined, tmp_path):
    """Issue 58's transcripts that run out, on 40 joined espeak utterances: only the first half of the words, only
    the second half, other utterances' text, one word deleted in 3 sentences, a whole sentence spoken in a pause but
    not written. No segment holds other words than those spoken inside it, no bound falls in speech, the speech the
    transcript does not say lies in no segment and is counted, and what the transcript says of the audio is still
    mostly segmented."""
    for name, (d, words) in faulty_transcripts(joined, tmp_path / "in").items():
        out = tmp_path / f"out_{name}"
        result = segment(smoke["exp"], d, out)
        assert result.returncode in (0, 2), result.stderr[-3000:]
        if result.returncode == 2:  # nothing to segment: only other_text may end so
            assert name == "other_text" and "Traceback" not in result.stderr, (name, result.stderr[-2000:])
            continue
        figures = score_segments.score(d, out)
        rows = [json.loads(line) for line in (out / "segments.jsonl").read_text().splitlines()]
        truth = [json.loads(line) for line in (d / "joins.jsonl").read_text().splitlines()]
        unsaid_kept = [t["key"] for t in truth if t.get("untranscribed")
                       for r in rows if r["start"] < t["speech_end"] and t["speech_start"] < r["end"]]
        said = re.search(r"untranscribed speech ([0-9.]+) s in ([0-9]+) stretches\); ([0-9]+) segments failed",
                         result.stdout)
        print(f"segment, transcript {name}: {json.dumps(figures)}; {said.group(0) if said else result.stdout}")
        assert figures["cuts_in_speech"] == 0, (name, figures)
        assert not figures["not_exact"], (name, figures)
        assert not unsaid_kept, (name, unsaid_kept)
        assert figures["order_ok"], (name, figures)
        assert said and (float(said.group(1)) > 0 or int(said.group(3)) > 0), (name, result.stdout)
        if name != "other_text":
            in_segments = sum(len(r["text"].split()) for r in rows)
            assert in_segments >= 0.6 * words, (name, in_segments, words)


def word_errors(ref: list[str], hyp: list[str]) -> int:
    import kaldialign

    return kaldialign.edit_distance(ref, hyp)["total"]


@pytest.mark.slow
def test_segment_transcribes_recordings_with_no_text_at_the_models_own_wer(smoke, joined, tmp_path):
    """++pseudo_label=true, a recording of 40 joined utterances with no transcript line: segments bounded in the
    audio's pauses (none in speech), each at most max_segment_seconds, labelled by the checkpoint at its own WER on
    the utterances one by one or better, each with its confidence; a low one is flagged as score flags."""
    d = tmp_path / "no_text"
    d.mkdir()
    (d / "wav.scp").write_text((joined / "wav.scp").read_text().splitlines()[0] + "\n")
    (d / "text").write_text("")
    out = tmp_path / "out"
    refused = segment(smoke["exp"], d, tmp_path / "refused")
    assert refused.returncode == 2 and "++pseudo_label=true" in refused.stderr, refused.stderr[-2000:]
    result = segment(smoke["exp"], d, out, "++pseudo_label=true", "++max_segment_seconds=10",
                     "++min_confidence=0.99")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 with no text, transcribed by the checkpoint" in result.stdout, result.stdout
    truth = [json.loads(line) for line in (joined / "joins.jsonl").read_text().splitlines()
             if json.loads(line)["recording"] == "long0000"]
    rows = [json.loads(line) for line in (out / "segments.jsonl").read_text().splitlines()]
    assert len(rows) >= 5 and all(r["pseudo_label"] and 0 < r["score"] <= 1 for r in rows), rows[:3]
    assert all(r["end"] - r["start"] <= 10.0 for r in rows), rows
    errors = words = 0
    for r in rows:
        for bound in (r["start"], r["end"]):
            assert not any(t["speech_start"] < bound < t["speech_end"] for t in truth), (r, bound)
        spoken = [w for t in truth if r["start"] <= t["speech_start"] and t["speech_end"] <= r["end"]
                  for w in t["words"]]
        errors, words = errors + word_errors(spoken, r["text"].split()), words + len(spoken)
    in_segments = {t["key"] for t in truth for r in rows if r["start"] <= t["speech_start"] < r["end"]}
    errors += sum(len(t["words"]) for t in truth if t["key"] not in in_segments)  # speech left out: deletions
    words += sum(len(t["words"]) for t in truth if t["key"] not in in_segments)
    # the model's own WER: decode of the same 40 utterances one by one
    utts = tmp_path / "utts.jsonl"
    src = joined.parent / "utts"
    wavs = dict(line.split(" ", 1) for line in (src / "wav.scp").read_text().splitlines())
    utts.write_text("".join(json.dumps({"key": t["key"], "source": wavs[t["key"]].strip(), "target": " ".join(
        t["words"])}) + "\n" for t in truth))
    dec = run_cli("corpus-io", "decode", f"++data_list={utts}", "++dataset_conf.data_type=raw",
                  f"++checkpoint={smoke['exp'] / 'model.pt.avg1'}", f"++output_dir={tmp_path / 'dec'}",
                  "++dataset_conf.num_workers=0")
    assert dec.returncode == 0, dec.stderr[-3000:]
    hyps = dict((line.split(" ", 1) + [""])[:2] for line in (tmp_path / "dec" / "text").read_text().splitlines())
    own = sum(word_errors(t["words"], hyps.get(t["key"], "").split()) for t in truth)
    own_words = sum(len(t["words"]) for t in truth)
    print(f"pseudo-labels: {len(rows)} segments, WER {100 * errors / words:.2f} % ({errors}/{words}); the model's "
          f"own WER one by one {100 * own / own_words:.2f} % ({own}/{own_words})")
    assert errors / words <= own / own_words + 0.01, (errors, words, own, own_words)
    flagged = (out / "flagged").read_text().splitlines()
    assert {line.split()[0] for line in flagged} == {r["key"] for r in rows if r["score"] < 0.99}, flagged


@pytest.mark.slow
def test_segment_as_two_jobs_merges_to_the_bytes_of_one_job(smoke, joined, tmp_path):
    """``++num_jobs=2``: each job segments its recording into its part directory and writes no final file;
    merge-jobs refuses while a part is missing or a part's file changed (changing nothing), a job of other options
    beside the parts is refused before it writes, a rerun of a done job does nothing, and the merge writes the files
    one job writes, byte for byte."""
    from corpus_io.infer.segment import SEGMENT_OUTPUTS

    one = tmp_path / "one"
    result = segment(smoke["exp"], joined, one)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "jobs"
    result = segment(smoke["exp"], joined, out, "++num_jobs=2", "++job_index=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "segment job 1 of 2: 1 recordings" in result.stdout, result.stdout
    assert not any((out / name).exists() for name in SEGMENT_OUTPUTS)
    assert (out / "segment.part-000001-of-000002.json").is_file()
    merge = run_cli("corpus-io", "merge-jobs", f"++path={out}")
    assert merge.returncode == 2 and "part 2 of 2 is missing" in merge.stderr, merge.stderr
    assert "Traceback" not in merge.stderr and not any((out / name).exists() for name in SEGMENT_OUTPUTS)
    stale = segment(smoke["exp"], joined, out, "++num_jobs=2", "++job_index=2", "++padding_seconds=0.1")
    assert stale.returncode == 2 and "other options" in stale.stderr and "Traceback" not in stale.stderr, stale.stderr
    assert not (out / "segment.part-000002-of-000002").exists()
    result = segment(smoke["exp"], joined, out, "++num_jobs=2", "++job_index=2")
    assert result.returncode == 0, result.stderr[-3000:]
    again = segment(smoke["exp"], joined, out, "++num_jobs=2", "++job_index=2")
    assert again.returncode == 0 and "already complete" in again.stdout, again.stdout + again.stderr[-2000:]
    part_text = out / "segment.part-000001-of-000002" / "text"  # a part's file changed since its job wrote it
    kept = part_text.read_bytes()
    part_text.write_bytes(kept + b"long0000-9999998-9999999 one\n")
    merge = run_cli("corpus-io", "merge-jobs", f"++path={out}")
    assert merge.returncode == 2 and "Rerun job 1" in merge.stderr and "Traceback" not in merge.stderr, merge.stderr
    assert not any((out / name).exists() for name in SEGMENT_OUTPUTS)
    part_text.write_bytes(kept)
    merge = run_cli("corpus-io", "merge-jobs", f"++path={out}")
    assert merge.returncode == 0, merge.stderr[-3000:]
    assert "[merge-jobs] 2 parts of segment" in merge.stdout + merge.stderr
    assert "transcript words:" in merge.stdout, merge.stdout
    for name in SEGMENT_OUTPUTS:
        assert (out / name).read_bytes() == (one / name).read_bytes(), name
    # its own outputs, unchanged since: a rerun of segment, and of the merge, replaces them
    again = segment(smoke["exp"], joined, one)
    assert again.returncode == 0, again.stderr[-3000:]
    merge = run_cli("corpus-io", "merge-jobs", f"++path={out}")
    assert merge.returncode == 0, merge.stderr[-3000:]
    assert len((one / "segments").read_text().splitlines()) >= 10
    assert {line.split()[1] for line in (one / "segments").read_text().splitlines()} == {"long0000", "long0001"}


def test_merge_sorted_keeps_the_one_job_order_with_few_files_open(tmp_path):
    """merge-jobs' merge of segment's part files: the lines of 5 sorted files in one sorted order whether all are
    open at once or 2 at a time (3 passes), ties in the files' order; recordings 'a' and 'a+b' interleave by segment
    key ('a+b-...' < 'a-...'), so the parts' files are merged, not concatenated."""
    import io

    from corpus_io.infer.segment import ORDER, merge_sorted

    parts = [["a+b-0000000-0000100 x\n", "a-0000000-0000200 y\n"], ["a+b-0000300-0000400 z\n", "a-0000100-0000300 w\n"],
             [], ["b-0000000-0000100 v\n"], ["a-0000100-0000300 tie\n", "c-0000000-0000001 u\n"]]
    paths = []
    for i, lines in enumerate(parts):
        paths.append(tmp_path / f"part{i}")
        paths[-1].write_text("".join(lines))
    want = sorted((line for lines in parts for line in lines), key=ORDER["segments"])  # a stable sort
    for fan_in in (256, 2):
        out = io.StringIO()
        (tmp_path / f"tmp{fan_in}").mkdir()
        merge_sorted(paths, ORDER["segments"], out, tmp_path / f"tmp{fan_in}", fan_in=fan_in)
        assert out.getvalue() == "".join(want), fan_in
    assert want.index("a-0000100-0000300 w\n") < want.index("a-0000100-0000300 tie\n")


@pytest.mark.parametrize("speaker", ["reader 1", "reader\n1", ""])
def test_segment_refuses_a_speaker_its_utt2spk_could_not_hold_before_the_model_loads(tmp_path, speaker):
    """segment writes each recording's ``speaker`` as the second field of utt2spk: one that is empty or holds
    whitespace is refused when the recordings are read, naming the line and field, as a key would be."""
    from corpus_io.errors import DataError
    from corpus_io.infer.segment import read_recordings

    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps({"key": "rec1", "source": "rec1.wav", "target": "one two", "speaker": speaker}) + "\n")
    with pytest.raises(DataError) as err:
        read_recordings(str(src))
    assert f"{src}:1: key 'rec1': 'speaker'" in str(err.value) and "A speaker id is one token" in str(err.value)
