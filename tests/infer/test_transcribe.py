"""corpus-io transcribe and StreamingTranscriber (corpus_io/infer/transcribe.py) on the streaming model that
tests/trained_models.py trains (causal, dynamic chunks, 3 epochs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from corpus_io.decoding.scoring import word_units
from corpus_io.errors import ConfigError
from corpus_io.infer.transcribe import StreamingTranscriber, read_recording
from corpus_io.model.frontend import FrontEnd
from tests.conftest import assert_user_error, run_cli
from tests.loader_data import REPO

#: 2.98 s of English at 44.1 kHz: resampled to the model's 16 kHz, 4 whole chunks of 16 and a last shorter one
WAV = REPO / "tests" / "fixtures" / "corpus" / "wav" / "spk0-utt008.wav"


@pytest.fixture(scope="module")
def voiced(streaming_trained, tmp_path_factory) -> Path:
    """streaming_trained's averaged model with the CTC head's blank bias lowered by the median margin, over WAV's
    frames, between blank and the best other token. After 3 epochs it emits blanks only, and partial results,
    words and texts need tokens; every other weight is the trained one (a real checkpoint that decode and
    transcribe both read)."""
    src = streaming_trained["out"] / "model.pt.avg2"
    full = StreamingTranscriber(str(src), decoding_chunk_size=0)
    full.accept_waveform(read_recording(str(WAV), full.sample_rate), full.sample_rate)
    lp = full.finish().log_probs
    margin = float((lp[:, 0] - lp[:, 1:].max(dim=-1).values).median())
    state = torch.load(src, map_location="cpu", weights_only=True)
    state["model"]["ctc.bias"][0] -= margin
    out = tmp_path_factory.mktemp("voiced") / "model.pt.avg2"
    torch.save(state, out)
    return out


@pytest.fixture(scope="module")
def kaldi_features(streaming_trained, tmp_path_factory) -> Path:
    """streaming_trained's averaged model (trained on the defaults, sherpa-onnx's features), its config set to
    Kaldi's framing and band (fbank_conf.high_freq=0, snip_edges=true): every weight the trained one."""
    from omegaconf import OmegaConf

    state = torch.load(streaming_trained["out"] / "model.pt.avg2", map_location="cpu", weights_only=True)
    config = OmegaConf.create(state["config"])
    config.dataset_conf.fbank_conf.high_freq, config.dataset_conf.fbank_conf.snip_edges = 0.0, True
    state["config"] = OmegaConf.to_yaml(config)
    out = tmp_path_factory.mktemp("kaldi_features") / "model.pt.avg2"
    torch.save(state, out)
    return out


def fed(transcriber: StreamingTranscriber, samples: torch.Tensor, piece_seconds: float) -> tuple[list, object]:
    """``samples`` fed in pieces: ``[(end sample of the piece, Partial)]`` for each partial, and the final result."""
    piece = round(piece_seconds * transcriber.sample_rate)
    partials = []
    for start in range(0, samples.shape[0], piece):
        partial = transcriber.accept_waveform(samples[start:start + piece].numpy(), transcriber.sample_rate)
        if partial is not None:
            partials.append((min(start + piece, samples.shape[0]), partial))
    return partials, transcriber.finish()


def whole_features(transcriber: StreamingTranscriber, samples: torch.Tensor) -> torch.Tensor:
    """The whole recording's features (1, T, D) as decode computes them for this model (feats_on=model)."""
    batch = {"wav": samples[None], "wav_lengths": torch.tensor([samples.shape[0]]),
             "sample_rate": transcriber.sample_rate, "keys": ["whole"]}
    return FrontEnd(transcriber.conf)(batch, train=False)[0]


def greedy_text(transcriber: StreamingTranscriber, log_probs: torch.Tensor) -> str:
    from corpus_io.decoding.beam import best_path_ids

    return transcriber.tokenizer.decode(best_path_ids(log_probs[None], torch.tensor([log_probs.shape[0]]))[0])


@pytest.mark.parametrize("piece_seconds, left, snip_edges", [(0.1, -1, True), (0.037, 1, True),
                                                             (0.1, -1, False), (0.037, 1, False)])
def test_audio_fed_in_pieces_gives_the_whole_utterances_chunk_by_chunk_and_chunk_masked_log_probs(
        streaming_trained, kaldi_features, piece_seconds, left, snip_edges):
    """snip_edges=false (sherpa-onnx's features, the default): the first frames reflect the start, the last ones the
    end; snip_edges=true (Kaldi's): only frames that fit."""
    checkpoint = kaldi_features if snip_edges else streaming_trained["out"] / "model.pt.avg2"
    transcriber = StreamingTranscriber(str(checkpoint), decoding_chunk_size=16, num_decoding_left_chunks=left)
    samples = read_recording(str(WAV), transcriber.sample_rate)
    _, result = fed(transcriber, samples, piece_seconds)
    feats = whole_features(transcriber, samples)
    assert feats.shape[1] == (1 + (samples.shape[0] - 400) // 160 if snip_edges else (samples.shape[0] + 80) // 160)
    model = transcriber.model
    with torch.no_grad():
        streamed = model.ctc_log_probs(*model.encode_streaming(feats, 16, left))[0][0]
        masked = model.ctc_log_probs(*model.encode(feats, torch.tensor([feats.shape[1]]), 16, left))[0][0]
    chunks = len(range(0, feats.shape[1] - model.RIGHT_CONTEXT, 64))
    assert chunks >= 4 and len(result.chunk_latency) == chunks
    assert result.log_probs.shape == streamed.shape == masked.shape
    assert (result.log_probs - streamed).abs().max() < 1e-4
    assert (result.log_probs - masked).abs().max() < 1e-4
    assert result.audio_seconds == pytest.approx(samples.shape[0] / transcriber.sample_rate)
    assert result.rtf == pytest.approx(result.compute_seconds / result.audio_seconds)


def test_full_context_runs_the_whole_recording_through_encode_on_any_checkpoint(streaming_trained):
    transcriber = StreamingTranscriber(str(streaming_trained["out"] / "model.pt.avg2"), decoding_chunk_size=0)
    samples = read_recording(str(WAV), transcriber.sample_rate)
    partials, result = fed(transcriber, samples, 0.1)
    feats = whole_features(transcriber, samples)
    with torch.no_grad():
        whole = transcriber.model(feats, torch.tensor([feats.shape[1]]))[0][0]
    assert partials == [] and result.chunk_latency == []
    assert (result.log_probs - whole).abs().max() < 1e-4


def test_partial_results_arrive_as_each_chunk_completes_before_finish(voiced):
    transcriber = StreamingTranscriber(str(voiced), decoding_chunk_size=16)
    samples = read_recording(str(WAV), transcriber.sample_rate)
    partials, result = fed(transcriber, samples, 0.1)
    # what each chunk's end should show: the greedy text of the whole utterance's chunk-by-chunk log-probs so far
    expected, last = [], ""
    for k in range(1, result.log_probs.shape[0] // 16 + 1):
        text = greedy_text(transcriber, result.log_probs[: 16 * k])
        if text != last:
            # the chunk's last input frame (k - 1) * 64 + 66 ends at this sample (snip_edges=false, the default:
            # frames centred on each shift start offset = shift / 2 - window / 2 samples earlier)
            needed = ((k - 1) * 64 + 66) * transcriber.shift + transcriber.offset + transcriber.window
            expected.append((needed, text, round(0.64 * k, 2)))
        last = text
    assert expected, "the voiced model shows no partial text; the test would prove nothing"
    assert [(p.text, round(p.seconds, 2)) for _, p in partials] == [(t, s) for _, t, s in expected]
    for (end, _), (needed, _, _) in zip(partials, expected):  # in the piece that completed the chunk
        assert needed <= end < needed + round(0.1 * transcriber.sample_rate)
    assert result.text == greedy_text(transcriber, result.log_probs) != ""
    assert [w.text for w in result.words] == word_units(result.text)
    assert all(0 <= w.start <= w.end <= result.audio_seconds for w in result.words)
    # the transcriber starts afresh after finish: the same audio again gives the same result
    assert fed(transcriber, samples, 0.1)[1].text == result.text


def test_audio_at_another_rate_or_with_two_channels_is_refused_by_the_api(voiced):
    transcriber = StreamingTranscriber(str(voiced), decoding_chunk_size=16)
    with pytest.raises(ConfigError, match="44100 Hz; the model takes 16000 Hz"):
        transcriber.accept_waveform(torch.zeros(4410), 44100)
    with pytest.raises(Exception, match="one channel"):
        transcriber.accept_waveform(torch.zeros(2, 1600), 16000)


def test_transcribe_prints_partials_words_and_latency_and_its_text_is_decodes(voiced, tmp_path):
    raw = tmp_path / "one.list"
    raw.write_text(json.dumps({"key": "utt", "wav": str(WAV), "txt": "the quick brown fox"}) + "\n")
    decoded = run_cli("corpus-io", "decode", f"++data_list={raw}", "++dataset_conf.data_type=raw",
                      f"++checkpoint={voiced}", f"++output_dir={tmp_path / 'decode'}", "++dataset_conf.num_workers=0",
                      "++decoding_chunk_size=16", "++device=cpu")
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    decode_text = (tmp_path / "decode" / "text").read_text(encoding="utf-8").rstrip("\n").partition(" ")[2]

    result = run_cli("corpus-io", "transcribe", f"++model={voiced}", f"++input={WAV}", "++stream=true",
                     "++decoding_chunk_size=16", "++piece_seconds=0.1", env={"OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    partials = [line for line in lines if line.startswith("partial ")]
    assert partials and all(re.fullmatch(r"partial \d+\.\d\d s: .*", line) for line in partials)
    final = next(line for line in lines if line.startswith("final:"))
    assert final == f"final: {decode_text}".rstrip() and decode_text
    words = [line for line in lines if re.fullmatch(r"  \d+\.\d\d \d+\.\d\d \S+ \(\d\.\d\d\)", line)]
    assert [w.split()[2] for w in words] == word_units(decode_text)
    assert re.fullmatch(r"latency per chunk: mean \d+\.\d ms, p95 \d+\.\d ms, max \d+\.\d ms over 5 chunks of "
                        r"640 ms; RTF \d+\.\d{4}; 1 torch thread \(num_threads\)", lines[-1]), lines[-1]

    # a latency tool: one intra-op thread by default, even where torch's default would take every core
    whole = run_cli("corpus-io", "transcribe", f"++model={voiced}", f"++input={WAV}", "++stream=false",
                    "++num_threads=3", env={"OMP_NUM_THREADS": "2"})
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert not [line for line in whole.stdout.splitlines() if line.startswith("partial")]
    assert "final:" in whole.stdout and re.search(r"^full context: RTF \d+\.\d{4} .*; 3 torch threads "
                                                  r"\(num_threads\)$", whole.stdout, re.M), whole.stdout


def test_transcribe_user_errors_are_one_paragraph_with_exit_code_2(trained, tmp_path):
    missing = run_cli("corpus-io", "transcribe", f"++model={tmp_path / 'model.pt'}",
                      f"++input={tmp_path / 'missing.wav'}")
    assert_user_error(missing, "missing.wav", "does not exist")
    assert missing.returncode == 2
    not_causal = run_cli("corpus-io", "transcribe", f"++model={trained['out'] / 'model.pt.avg2'}", f"++input={WAV}",
                         "++stream=true")
    assert_user_error(not_causal, "model.causal=true", "++stream=false")
    assert not_causal.returncode == 2
    exported = run_cli("corpus-io", "transcribe", f"++model={tmp_path / 'model.onnx'}", f"++input={WAV}")
    assert_user_error(exported, "model.onnx", "exported file", "sherpa-onnx")
    assert exported.returncode == 2
