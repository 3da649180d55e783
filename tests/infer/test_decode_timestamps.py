"""decode ++timestamps=true ++min_confidence on real audio with the suite's trained model (tests/trained_models.py):
joined pairs, clean and noisy copies, Kaldi segments. The timing rules themselves: tests/decoding/test_align.py."""

from __future__ import annotations

import json

import torch

from corpus_io.decoding.scoring import word_units
from tests.decoding.test_align import pairs


def test_decode_times_real_pairs_noisy_copies_and_segments_with_the_trained_model(trained, tmp_path, capfd):
    """The suite's trained model decodes 10 joined pairs, 20 utterances clean and with white noise at 0 dB,
    and the 4 segments of one recording, with ++timestamps=true ++min_confidence: every utterance has a row in
    timestamps.jsonl with its confidence in [0, 1], times that grow and lie inside its audio, Kaldi's six CTM
    fields, segments named by their recording and placed at their start. (This 12-step model emits few words; the
    onset and clean/noisy figures are checked on the model `make smoke` trains: tests/recipes/test_smoke.py.)"""
    import soundfile as sf

    from corpus_io.audio.mix import add_noise
    from tests.loader_data import fixture_utts
    from tests.test_hostile import corpus_io as in_process

    lines, durations = [], {}
    for i, (x, _, ta, tb) in enumerate(pairs()):
        key = f"pair{i:02d}"
        sf.write(tmp_path / f"{key}.wav", x, 16000)
        durations[key] = len(x) / 16000
        lines.append({"key": key, "wav": str(tmp_path / f"{key}.wav"), "txt": f"{ta} {tb}"})
    noise = torch.Generator().manual_seed(0)
    for key, path, text in fixture_utts()[:20]:
        x, sr = sf.read(path, dtype="float32", always_2d=True)
        wav = torch.from_numpy(x.mean(axis=1))[None]
        noisy = add_noise(wav, torch.tensor([wav.shape[1]]), torch.randn(wav.shape, generator=noise),
                          torch.tensor([0.0]), sr)
        for kind, samples in (("clean", wav), ("noisy", noisy)):
            sf.write(tmp_path / f"{kind}-{key}.wav", samples[0].numpy(), sr)
            lines.append({"key": f"{kind}-{key}", "wav": str(tmp_path / f"{kind}-{key}.wav"), "txt": text})
            durations[f"{kind}-{key}"] = wav.shape[1] / sr
    seg_dir = "tests/fixtures/corpus/segments_dir"
    starts = {}
    for line in open(f"{seg_dir}/segments").read().splitlines():
        key, _, start, end = line.split()
        starts[key] = float(start)
        lines.append({"key": key, "wav": f"{seg_dir}/wav/long.wav", "txt": "x", "start": float(start),
                      "end": float(end)})
        durations[key] = (float(end) if float(end) > 0 else sf.info(f"{seg_dir}/wav/long.wav").duration) - float(start)
    raw = tmp_path / "raw.list"
    raw.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    out = tmp_path / "dec"
    rc, err = in_process("decode", f"++data_list={raw}", "++dataset_conf.data_type=raw", "++dataset_conf.num_workers=0",
                         f"++checkpoint={trained['out'] / 'model.pt.avg2'}", f"++output_dir={out}",
                         "++timestamps=true", "++min_confidence=0.5", capfd=capfd)
    assert rc == 0, err[-3000:]
    recs = {json.loads(x)["key"]: json.loads(x) for x in (out / "timestamps.jsonl").read_text().splitlines()}
    assert sorted(recs) == sorted(durations)
    for key, rec in recs.items():
        offset = starts.get(key, 0.0)
        assert 0.0 <= rec["confidence"] <= 1.0
        for spans in (rec["words"], rec["tokens"]):
            assert [s["start"] for s in spans] == sorted(s["start"] for s in spans)
            assert all(offset <= s["start"] <= s["end"] <= offset + durations[key] + 1e-3 for s in spans)
            assert all(0.0 <= s["confidence"] <= 1.0 for s in spans)
        if key in starts:
            assert rec["recording"] == "long" and rec["offset"] == starts[key]
    for row in (line.split() for line in (out / "ctm").read_text().splitlines()):
        assert len(row) == 6 and row[1] == "1" and float(row[3]) >= 0 and 0 <= float(row[5]) <= 1
        assert row[0] not in starts  # segments are named by their recording
    kept_lines = (out / "kept_text").read_text(encoding="utf-8").splitlines()
    kept = dict((line.split(" ", 1) + [""])[:2] for line in kept_lines)
    assert sorted(kept) == sorted(k for k, r in recs.items() if r["confidence"] >= 0.5)
    pseudo = [json.loads(x) for x in (out / "kept.list").read_text(encoding="utf-8").splitlines()]
    assert {r["key"]: r["target"] for r in pseudo} == kept  # the raw list's lines, hypotheses as transcripts
    assert all(r["start"] == starts[r["key"]] for r in pseudo if r["key"] in starts)


def test_the_trained_model_aligns_the_references_of_real_pairs_in_order_inside_the_audio(trained, tmp_path):
    """Every word of a real transcript force-aligned to the trained model's log-probs (align takes any token
    sequence, a reference as well as a hypothesis): as many words as scoring counts, in order, inside the audio,
    confidences in [0, 1]."""
    import soundfile as sf

    from corpus_io.decoding.align import align
    from corpus_io.infer.decode import load_model
    from tests.infer.test_decode import model_outputs

    ckpt = trained["out"] / "model.pt.avg2"
    joined = {f"pair{i:02d}": p for i, p in enumerate(pairs())}
    lines = []
    for key, (x, _, ta, tb) in joined.items():
        sf.write(tmp_path / f"{key}.wav", x, 16000)
        lines.append({"key": key, "wav": str(tmp_path / f"{key}.wav"), "txt": f"{ta} {tb}"})
    raw = tmp_path / "raw.list"
    raw.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    _, tokenizer, _ = load_model(str(ckpt), torch.device("cpu"))
    seen = 0
    for keys, log_probs, lengths in model_outputs(ckpt, str(raw)):
        for i, key in enumerate(keys):
            x, _, ta, tb = joined[key]
            duration = len(x) / 16000
            timed = align(log_probs[i, : int(lengths[i])], tokenizer.encode(f"{ta} {tb}"), tokenizer.decode,
                          word_units, frame_seconds=0.04, duration=duration)
            assert [w.text for w in timed.words] == word_units(tokenizer.decode(tokenizer.encode(f"{ta} {tb}")))
            starts = [w.start for w in timed.words]
            assert starts == sorted(starts) and all(0 <= w.start < w.end <= duration for w in timed.words)
            assert all(0.0 <= w.confidence <= 1.0 for w in timed.words) and 0.0 <= timed.confidence <= 1.0
            seen += 1
    assert seen == 10
