"""Long recordings and wrong labels (issue 54, ``make bench BENCH=clean``): ``corpus-io segment`` throughput (audio
seconds per second) with 1 and 2 processes, and its peak RSS on a 1-hour recording, with each pause detector
(``++vad=energy``, ``++vad=silero`` and silero-vad alone: the VAD's cost, issue 58); ``corpus-io score`` throughput
on the same utterances with 1 and 2 processes (:func:`bench.bench_score.score_throughput`).

The corpus: espeak digit strings (``synth.make_digits``) joined into one 1-hour recording, and the same utterances
as two 30-minute recordings for the 2-process run (``++num_jobs=2``, the two jobs side by side, then
``merge-jobs``). The model: the default train config's ConformerCTC (``conf/train.yaml``) with random weights
over the corpus's token list: the model's and the Viterbi windows' cost are a trained model's, the segments are not
(the figures here are speed and memory, not quality: the tests and the espeak recipe's stage 10 measure that);
segment again with that model's output layer padded to a BPE model's 5,000 tokens (its memory). Smoke mode: 12
utterances, one recording of 6 and two of 3.

Models of other toolkits (issue 59, ``corpus_io/infer/foreign.py``): ``corpus-io align`` of the same 1-hour
recording, peak RSS and audio seconds per second, with a Hugging Face wav2vec2-base-sized Wav2Vec2ForCTC (the
``Wav2Vec2Config()`` defaults, 94M parameters, random weights, a 32-symbol letters vocabulary), the ConformerCTC above
exported as a plain sherpa-onnx ``wenet_ctc`` file (corpus-io's metadata taken out), and torchaudio's ``MMS_FA``
(random weights, 315M parameters) on a 10-minute recording of the same utterances (an hour takes over half an hour
on 2 cores; the pieces bound its memory, not the recording's length). ``BENCH_CLEAN=foreign`` runs these rows alone.
Smoke mode: a tiny Hugging Face model (2 layers of 32), the sherpa-onnx file, no MMS_FA (1.2 GB of weights).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from bench.bench_score import score_throughput
from bench.common import BIN, OUT, SMOKE, mb, run_measured, sized

UTTERANCES = sized(1200, 12)  # 3-7 digits each, ~2.3 s with their lead, ~0.75 s pause: ~1 hour


def corpus() -> tuple[Path, Path, Path]:
    """(the utterances, one long recording, two recordings of half each) under OUT, made once."""
    from corpus_io.tables import synth

    base = OUT / f"clean{UTTERANCES}"
    utts, one, two = base / "utts", base / "one", base / "two"
    if not (two / "wav.scp").exists():
        shutil.rmtree(base, ignore_errors=True)
        synth.make_digits(utts, UTTERANCES, seed=21)
        synth.join(utts, one, per_recording=UTTERANCES, seed=0)
        synth.join(utts, two, per_recording=(UTTERANCES + 1) // 2, seed=0)
    return utts, one, two


#: the output layer of a typical BPE model (WeNet's and icefall's LibriSpeech recipes: 5,000 tokens)
WIDE_VOCAB = 5000


def untrained_checkpoint(utts: Path, vocab: int = 0) -> Path:
    """The default ConformerCTC with random weights over the corpus's token list, as train would write it;
    ``vocab`` > 0: the list padded with tokens the text never uses to that many (a BPE model's output layer)."""
    import subprocess

    import torch

    from corpus_io.config import TrainConfig, compose, to_yaml
    from corpus_io.model.checkpoint import save_checkpoint, token_list_record
    from corpus_io.model.model import build_model, feature_dim
    from corpus_io.tokenizer import build_tokenizer

    path = utts.parent / (f"model-{vocab}.pt" if vocab else "model.pt")
    if path.exists():
        return path
    tokens = utts.parent / (f"tokens-{vocab}.txt" if vocab else "tokens.txt")
    subprocess.run([str(BIN / "corpus-io"), "make-tokenizer", f"++input={utts / 'text'}", f"++output={tokens}"],
                   check=True, capture_output=True)
    if vocab:
        lines = tokens.read_text(encoding="utf-8").split("\n")
        used = [line.rsplit(" ", 1)[0] for line in lines if line.strip()]
        names = used[:-1] + [f"unused{i}" for i in range(vocab - len(used))] + used[-1:]  # <sos/eos> stays last
        tokens.write_text("".join(f"{name} {i}\n" for i, name in enumerate(names)), encoding="utf-8")
    cfg = compose(TrainConfig, "train", [f"++tokenizer.token_list={tokens}", "++dataset_conf.data_type=raw",
                                         "++train_data_set_list=unused", "++output_dir=unused"])
    tokenizer = build_tokenizer(cfg.tokenizer)
    torch.manual_seed(0)
    model = build_model(dict(cfg.model), feature_dim(cfg.dataset_conf), tokenizer.vocab_size, None)
    save_checkpoint(path, {"model": model.state_dict(), "config": to_yaml(cfg),
                           "token_list": token_list_record(tokenizer)})
    return path


def segment_argv(recordings: Path, checkpoint: Path, out: Path, vad: str = "energy") -> list[str]:
    """segment with pause detector ``vad`` (energy, the core's: no cost beyond the model's own fbank)."""
    return [str(BIN / "corpus-io"), "segment", f"++input={recordings}", f"++checkpoint={checkpoint}",
            f"++output_dir={out}", "++dataset_conf.num_workers=0", "++device=cpu", f"++vad={vad}"]


def audio_seconds(recordings: Path) -> float:
    import soundfile as sf

    return sum(sf.info(line.split(" ", 1)[1].strip()).duration
               for line in (recordings / "wav.scp").read_text().splitlines())


def vad_cost(recordings: Path) -> str:
    """silero-vad alone over the first recording of ``recordings`` (read, resampled, every 32 ms window), timed in
    this process: the share of ``++vad=silero`` in segment's wall."""
    import time

    import soundfile as sf

    from corpus_io.audio.vad import silero_regions

    wave, rate = sf.read((recordings / "wav.scp").read_text().split("\n")[0].split(" ", 1)[1].strip(), dtype="float32")
    start = time.perf_counter()
    regions = silero_regions(wave, rate, 0.3)
    wall = time.perf_counter() - start
    return f"{len(wave) / rate / wall:.0f} audio s/s ({len(regions)} speech regions, {wall:.1f} s)"


# --------------------------------------------------------------------------- models of other toolkits (issue 59)

#: wav2vec2-base-960h's vocabulary layout: <pad> the blank, | the word delimiter, uppercase letters
HF_VOCAB = ["<pad>", "<s>", "</s>", "<unk>", "|", *"ETAONIHSRDLUMWCFGYPBVK'XJQZ"]
#: a tiny Wav2Vec2Config for smoke mode (the test's, tests/infer/test_foreign.py)
TINY_HF = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
           "conv_dim": (32,) * 7, "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2}


def hf_model(base: Path, tiny: bool) -> Path:
    """A Hugging Face CTC directory (save_pretrained of a random Wav2Vec2ForCTC and its Wav2Vec2Processor): the
    ``Wav2Vec2Config()`` defaults (wav2vec2-base: 12 layers of 768, 94M parameters), or :data:`TINY_HF`."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    out = base / ("hf-tiny" if tiny else "hf-base")
    if (out / "config.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(HF_VOCAB)}))
    tokenizer = transformers.Wav2Vec2CTCTokenizer(str(tmp / "vocab.json"), unk_token="<unk>", pad_token="<pad>",
                                                  word_delimiter_token="|")
    extractor = transformers.Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                                      do_normalize=True, return_attention_mask=False)
    config = transformers.Wav2Vec2Config(vocab_size=len(HF_VOCAB), pad_token_id=0, **(TINY_HF if tiny else {}))
    torch.manual_seed(0)
    transformers.Wav2Vec2ForCTC(config).save_pretrained(tmp)
    transformers.Wav2Vec2Processor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(tmp)
    tmp.rename(out)
    return out


def sherpa_file(checkpoint: Path) -> Path:
    """``checkpoint`` exported to ONNX (``corpus-io export-model``) as a plain sherpa-onnx WeNet CTC file: corpus-io's
    own metadata taken out, sherpa-onnx's (model_type wenet_ctc, subsampling_factor) and tokens.txt beside it kept."""
    import subprocess

    import onnx

    out = checkpoint.parent / f"sherpa-{checkpoint.stem}"
    if (out / "model.onnx").exists():
        return out / "model.onnx"
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    result = subprocess.run([str(BIN / "corpus-io"), "export-model", f"++checkpoint={checkpoint}",
                             f"++output={tmp / 'model.onnx'}"], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"export-model: {result.stderr[-3000:]}")
    proto = onnx.load(str(tmp / "model.onnx"))
    kept = [p for p in proto.metadata_props if not p.key.startswith("corpus_io.")]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    onnx.save(proto, str(tmp / "model.onnx"))
    tmp.rename(out)
    return out / "model.onnx"


def mms_weights(base: Path) -> Path:
    """torchaudio's MMS_FA model with random weights, its state dict saved as the bundle's file is."""
    import torch
    import torchaudio
    from torchaudio.pipelines._wav2vec2 import utils

    path = base / "mms_fa-random.pt"
    if not path.exists():
        bundle = torchaudio.pipelines.MMS_FA
        torch.manual_seed(0)
        torch.save(utils._get_model(bundle._model_type, bundle._params).state_dict(), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return path


#: MMS_FA's recording: the first 195 utterances joined, about 10 minutes
MMS_UTTERANCES = 195


def first_utterances(utts: Path, out: Path, num: int) -> Path:
    """One recording of the first ``num`` utterances of ``utts`` joined (synth.join), made once."""
    from corpus_io.tables import synth

    if (out / "wav.scp").exists():
        return out
    keys = sorted(line.split(" ", 1)[0] for line in (utts / "wav.scp").read_text().splitlines())[:num]
    subset = out.with_name(out.name + "-utts")
    shutil.rmtree(subset, ignore_errors=True)
    subset.mkdir(parents=True)
    for name in ("wav.scp", "text", "utt2spk"):
        if (utts / name).exists():
            lines = [line for line in (utts / name).read_text().splitlines() if line.split(" ", 1)[0] in keys]
            (subset / name).write_text("".join(line + "\n" for line in lines))
    return synth.join(subset, out, per_recording=num, seed=0)


def align_argv(data: Path, checkpoint: str, out: Path) -> list[str]:
    return [str(BIN / "corpus-io"), "align", f"++data_list={data}", f"++checkpoint={checkpoint}",
            f"++output_dir={out}", "++dataset_conf.num_workers=0", "++device=cpu"]


def foreign_rows(utts: Path, one: Path, checkpoint: Path, tmp: Path) -> None:
    """``corpus-io align`` of the recording ``one`` with each kind of foreign model: peak RSS, audio s/s."""
    mms_recording = None if SMOKE else first_utterances(utts, utts.parent / "mms", MMS_UTTERANCES)
    rows = [("Hugging Face Wav2Vec2ForCTC, " + ("tiny (smoke)" if SMOKE else "wav2vec2-base-sized (94M parameters)"),
             str(hf_model(utts.parent, tiny=SMOKE)), one),
            ("sherpa-onnx wenet_ctc file (the ConformerCTC above, exported)", str(sherpa_file(checkpoint)), one)]
    if mms_recording is not None:
        rows.append(("torchaudio MMS_FA (random weights, 315M parameters)",
                     f"torchaudio:MMS_FA:{mms_weights(utts.parent)}", mms_recording))
    else:
        print("align, torchaudio MMS_FA: not run in smoke mode (1.2 GB of weights)")
    for i, (what, model, recording) in enumerate(rows):
        length = audio_seconds(recording)
        wall, peak, result = run_measured(align_argv(recording, model, tmp / f"align{i}"))
        if result.returncode != 0:
            raise SystemExit(f"align with {what}: {result.stderr[-3000:]}")
        print(f"align, {what}, one {length / 60:.1f}-minute recording: {length / wall:.1f} audio s/s "
              f"(wall {wall:.1f} s), peak RSS {mb(peak)}", flush=True)


def main() -> None:
    import subprocess
    import tempfile
    import time

    utts, one, two = corpus()
    if os.environ.get("BENCH_CLEAN") == "foreign":
        with tempfile.TemporaryDirectory() as tmp:
            foreign_rows(utts, one, untrained_checkpoint(utts), Path(tmp))
        return
    checkpoint = untrained_checkpoint(utts)
    with tempfile.TemporaryDirectory() as tmp:
        seconds = audio_seconds(one)
        wall, peak, result = run_measured(segment_argv(one, checkpoint, Path(tmp) / "one"))
        if result.returncode != 0:
            raise SystemExit(f"segment: {result.stderr[-3000:]}")
        print(f"segment ++vad=energy, 1 process, one {seconds / 60:.1f}-minute recording: {seconds / wall:.1f} audio "
              f"s/s (wall {wall:.1f} s), peak RSS {mb(peak)}")
        wall_v, peak_v, result = run_measured(segment_argv(one, checkpoint, Path(tmp) / "silero", "silero"))
        if result.returncode != 0:
            raise SystemExit(f"segment ++vad=silero: {result.stderr[-3000:]}")
        print(f"segment ++vad=silero, the same recording: {seconds / wall_v:.1f} audio s/s (wall {wall_v:.1f} s), peak "
              f"RSS {mb(peak_v)}; the VAD alone: {vad_cost(one)} (++vad=energy reuses the model's fbank: ~0)")
        wide = untrained_checkpoint(utts, WIDE_VOCAB)
        wall_w, peak_w, result = run_measured(segment_argv(one, wide, Path(tmp) / "wide"))
        if result.returncode != 0:
            raise SystemExit(f"segment ({WIDE_VOCAB} tokens): {result.stderr[-3000:]}")
        print(f"segment, 1 process, the same recording, a {WIDE_VOCAB}-token output layer: {seconds / wall_w:.1f} "
              f"audio s/s (wall {wall_w:.1f} s), peak RSS {mb(peak_w)}")
        start = time.perf_counter()  # the two 30-minute recordings as 2 jobs side by side, then merge-jobs
        jobs = Path(tmp) / "jobs"
        procs = [subprocess.Popen(segment_argv(two, checkpoint, jobs) + ["++num_jobs=2", f"++job_index={j}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for j in (1, 2)]
        for p in procs:
            _, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"segment: {err[-3000:]}")
        merged = subprocess.run([str(BIN / "corpus-io"), "merge-jobs", f"++path={jobs}"], capture_output=True,
                                text=True)
        if merged.returncode != 0:
            raise SystemExit(f"merge-jobs: {merged.stderr[-3000:]}")
        wall2 = time.perf_counter() - start
        total = audio_seconds(two)
        print(f"segment, ++num_jobs=2 side by side (a {total / 120:.1f}-minute recording each) + merge-jobs: "
              f"{total / wall2:.1f} audio s/s (wall {wall2:.1f} s; 1 process: {seconds / wall:.1f})")
        data_list = Path(tmp) / "utts.jsonl"
        subprocess.run([str(BIN / "corpus-io"), "scp2jsonl",
                        f"++scp_file_list=[{utts / 'wav.scp'},{utts / 'text'}]", "++data_type_list=[source,target]",
                        f"++jsonl_file_out={data_list}"], check=True, capture_output=True)
        for processes in (1, 2):
            got = score_throughput(checkpoint, data_list, Path(tmp) / f"score{processes}", processes=processes)
            print(f"score, {processes} process(es) ({processes - 1} loader worker), {got['utterances']} utterances: "
                  f"{got['audio_s_per_s']:.1f} audio s/s (wall {got['wall_s']:.1f} s), peak RSS {mb(got['rss'])}")
        foreign_rows(utts, one, checkpoint, Path(tmp))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
