"""Real speech for tests, demos and benchmarks, synthesized locally with espeak-ng and sox.

Nothing is downloaded. ``python -m corpus_io.tables.synth fixture DIR`` rebuilds the committed
fixture corpus; ``python -m corpus_io.tables.synth digits DIR --num N`` makes a digits corpus
for the demo recipe; ``python -m corpus_io.tables.synth replicate`` multiplies a corpus for benchmarks;
``python -m corpus_io.tables.synth join`` joins a corpus's utterances into long recordings (``corpus-io segment``).
Every command runs espeak-ng and sox with argument lists, never through a shell.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corpus_io.storage.progress import parallel_imap, progress, resolve_num_workers

if TYPE_CHECKING:
    import numpy as np

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
# (espeak voice variant, words per minute): each pair is one "speaker".
SPEAKERS = [("en-us+m1", 150), ("en-us+f2", 165), ("en-us+m3", 175), ("en-us+f4", 140),
            ("en+m2", 160), ("en-us+m7", 155), ("en+f3", 170), ("en-us+m4", 145)]
# voices no training set uses (other accents, other variants): a test of generalization to new speakers
HELD_OUT_SPEAKERS = [("en-gb-scotland+m5", 150), ("en-029+f1", 160), ("en-gb-x-rp+m6", 155), ("en-us+f5", 145)]
ZH_SENTENCES = ["今天天气很好", "我们一起学习语音识别", "北京欢迎你", "请打开窗户", "这是一个测试",
                "数据准备很重要", "模型训练需要时间", "你好世界"]
EN_SENTENCES = ["the quick brown fox jumps over the lazy dog", "speech recognition is fun",
                "hello world", "please open the window", "this is a test of the system"]
MIXED_SENTENCES = ["我喜欢 python 编程", "打开 wifi 设置", "今天的 meeting 取消了", "这个 model 很好"]
ZH_VOICES = [("cmn", 150), ("cmn+f2", 165), ("cmn+m3", 175), ("cmn+f4", 140)]


LEAD_SECONDS = (0.05, 0.5)  # the recipe corpora's leading silence, drawn per utterance
LEAD_SEED = 1_000_003


def require_tools() -> None:
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed. Install it with: apt-get install -y espeak-ng sox")


@dataclass(frozen=True)
class Utterance:
    key: str
    text: str
    voice: str
    speed: int
    sample_rate: int
    fmt: str  # wav | flac
    path: str
    lead: float = 0.0  # seconds of silence before the speech (espeak-ng speaks from the first sample)


def speak(utt: Utterance) -> Utterance:
    """Synthesize ``utt.text`` into ``utt.path`` at ``utt.sample_rate`` Hz, mono 16-bit."""
    with tempfile.NamedTemporaryFile(suffix=".wav") as tmp:
        subprocess.run(["espeak-ng", "-v", utt.voice, "-s", str(utt.speed), "-w", tmp.name, utt.text],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        Path(utt.path).parent.mkdir(parents=True, exist_ok=True)
        pad = ["pad", f"{utt.lead:.3f}"] if utt.lead > 0 else []
        subprocess.run(["sox", "-R", tmp.name, "-r", str(utt.sample_rate), "-c", "1", "-b", "16", utt.path, *pad],
                       check=True, stderr=subprocess.DEVNULL)
    return utt


def synthesize_all(utts: list[Utterance], num_workers: int = 0) -> None:
    require_tools()
    workers = resolve_num_workers(num_workers)
    for _ in progress(parallel_imap(speak, utts, num_workers=workers, chunksize=8), total=len(utts),
                      desc="synthesize", unit="utt"):
        pass


def write_kaldi_dir(data_dir: Path, utts: list[Utterance], *, spk_of: dict[str, str]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    ordered = sorted(utts, key=lambda u: u.key)
    (data_dir / "wav.scp").write_text("".join(f"{u.key} {u.path}\n" for u in ordered), encoding="utf-8")
    (data_dir / "text").write_text("".join(f"{u.key} {u.text}\n" for u in ordered), encoding="utf-8")
    (data_dir / "utt2spk").write_text("".join(f"{u.key} {spk_of[u.key]}\n" for u in ordered), encoding="utf-8")


def digits_text(rng: random.Random, min_len: int = 3, max_len: int = 7) -> str:
    return " ".join(rng.choice(DIGITS) for _ in range(rng.randint(min_len, max_len)))


def _make_corpus(out_dir: str | os.PathLike, num: int, pick, *, seed: int, sample_rate: int, fmt: str,
                 num_workers: int) -> Path:
    """``num`` utterances, ``pick(i, rng) -> (spk, text, voice, speed)``, as a Kaldi dir; keys ``<spk>-<i>``.

    Each starts with 0.05-0.5 s of silence, as a recording does: a model that only ever heard speech from the first
    sample places nothing well after a pause (the timestamps of a second utterance joined after silence)."""
    out = Path(out_dir).resolve()
    rng = random.Random(seed)
    leads = random.Random(seed + LEAD_SEED)  # its own stream: the texts, voices and speeds are the seed's as before
    utts, spk_of = [], {}
    for i in range(num):
        spk, text, voice, speed = pick(i, rng)
        key = f"{spk}-{i:06d}"
        utts.append(Utterance(key, text, voice, speed, sample_rate, fmt, str(out / "wav" / spk / f"{key}.{fmt}"),
                              lead=round(leads.uniform(*LEAD_SECONDS), 3)))
        spk_of[key] = spk
    synthesize_all(utts, num_workers)
    write_kaldi_dir(out, utts, spk_of=spk_of)
    return out


def make_digits(out_dir: str | os.PathLike, num: int, *, seed: int = 0, sample_rate: int = 16000,
                fmt: str = "wav", num_workers: int = 0, held_out_voices: bool = False) -> Path:
    """An English digit-string corpus as a Kaldi data dir ``out_dir`` (wav.scp, text, utt2spk).

    Speakers are espeak voice variants; keys are ``<spk>-<index>``. ``held_out_voices``: speakers
    ``new00``.. use :data:`HELD_OUT_SPEAKERS`, voices that no other set of this module uses.
    """
    speakers, prefix = (HELD_OUT_SPEAKERS, "new") if held_out_voices else (SPEAKERS, "spk")

    def pick(i: int, rng: random.Random) -> tuple[str, str, str, int]:
        voice, speed = speakers[i % len(speakers)]
        speed += rng.randint(-15, 15)
        return f"{prefix}{i % len(speakers):02d}", digits_text(rng), voice, speed

    return _make_corpus(out_dir, num, pick, seed=seed, sample_rate=sample_rate, fmt=fmt, num_workers=num_workers)


def make_mixed(out_dir: str | os.PathLike, num: int, *, seed: int = 0, sample_rate: int = 16000,
               fmt: str = "wav", num_workers: int = 0) -> Path:
    """Chinese, English and code-switched sentences as a Kaldi dir; keys are ``mix<NN>-<index>``.

    Speakers ``mix00``-``mix03`` are Mandarin voices reading Chinese and mixed sentences; ``mix04``-``mix07``
    are English voices reading English sentences.
    """
    def pick(i: int, rng: random.Random) -> tuple[str, str, str, int]:
        n = i % (len(ZH_VOICES) + 4)
        voice, speed = ZH_VOICES[n] if n < len(ZH_VOICES) else SPEAKERS[n - len(ZH_VOICES)]
        pool = ZH_SENTENCES + MIXED_SENTENCES if n < len(ZH_VOICES) else EN_SENTENCES
        return f"mix{n:02d}", rng.choice(pool), voice, speed + rng.randint(-15, 15)

    return _make_corpus(out_dir, num, pick, seed=seed, sample_rate=sample_rate, fmt=fmt, num_workers=num_workers)


def make_fixture(out_dir: str | os.PathLike, *, relative_to: str | os.PathLike | None = None) -> Path:
    """The committed test corpus: mixed Chinese/English, 8/16/44.1 kHz, wav and flac, plus segments.

    ``out_dir/`` is a Kaldi dir (wav.scp, text, utt2spk); ``out_dir/segments_dir/`` holds one long
    recording cut by a ``segments`` file. Paths in wav.scp are relative to ``relative_to``
    (default: the current directory) so the committed corpus is relocatable with the repo.
    """
    out = Path(out_dir)
    base = Path(relative_to or os.getcwd()).resolve()
    rng = random.Random(2026)
    texts = [(t, "cmn") for t in ZH_SENTENCES] + [(t, "en-us") for t in EN_SENTENCES] + \
            [(t, "cmn") for t in MIXED_SENTENCES] + [(digits_text(rng), "en-us") for _ in range(7)]
    rates = [8000, 16000, 44100]
    utts, spk_of = [], {}
    for i, (text, voice) in enumerate(texts):
        rate = rates[i % 3]
        fmt = "flac" if i % 2 else "wav"
        spk = f"spk{i % 4}"
        key = f"{spk}-utt{i:03d}"
        path = (out / "wav" / f"{key}.{fmt}").resolve()
        utts.append(Utterance(key, text, voice + ("+f2" if i % 4 == 1 else ""), 160 + 5 * (i % 3), rate, fmt,
                              str(path)))
        spk_of[key] = spk
    synthesize_all(utts, num_workers=0)
    rel = [Utterance(u.key, u.text, u.voice, u.speed, u.sample_rate, u.fmt, os.path.relpath(u.path, base))
           for u in utts]
    write_kaldi_dir(out, rel, spk_of=spk_of)

    # One long recording (16 kHz wav) made of several sentences, cut by `segments`.
    seg_dir = out / "segments_dir"
    parts = [Utterance(f"part{i}", t, "en-us", 160, 16000, "wav", str((seg_dir / f"part{i}.wav").resolve()))
             for i, t in enumerate(EN_SENTENCES[:3] + ["one two three four five"])]
    synthesize_all(parts, num_workers=0)
    long_path = (seg_dir / "wav" / "long.wav").resolve()
    long_path.parent.mkdir(parents=True, exist_ok=True)
    import soundfile as sf

    durations = [sf.info(p.path).duration for p in parts]
    subprocess.run(["sox", "-R", *[p.path for p in parts], str(long_path)], check=True)
    for p in parts:
        os.unlink(p.path)
    seg_lines, text_lines, spk_lines, t = [], [], [], 0.0
    for i, (p, d) in enumerate(zip(parts, durations)):
        key = f"long-seg{i:02d}"
        end = -1 if i == len(parts) - 1 else round(t + d, 3)
        seg_lines.append(f"{key} long {round(t, 3)} {end}\n")
        text_lines.append(f"{key} {p.text}\n")
        spk_lines.append(f"{key} long\n")
        t += d
    (seg_dir / "wav.scp").write_text(f"long {os.path.relpath(long_path, base)}\n", encoding="utf-8")
    (seg_dir / "segments").write_text("".join(seg_lines), encoding="utf-8")
    (seg_dir / "text").write_text("".join(text_lines), encoding="utf-8")
    (seg_dir / "utt2spk").write_text("".join(spk_lines), encoding="utf-8")
    return out


# Word-segmented like AISHELL-1's transcript (spaces between words).
AISHELL_SENTENCES = ["今天 天气 很 好", "我们 一起 学习 语音 识别", "北京 欢迎 你", "请 打开 窗户", "这 是 一个 测试",
                     "数据 准备 很 重要", "模型 训练 需要 时间", "你好 世界"]
# Speaker and chapter ids chosen so that string order is tricky ("103" < "1034" < "19").
LIBRI_READERS = ["103", "1034", "19", "2"]


def make_aishell_lookalike(root: str | os.PathLike, *, speakers_per_split: int = 2, utts_per_speaker: int = 2,
                           splits: tuple[str, ...] = ("train", "dev", "test"), seed: int = 0) -> Path:
    """A tiny AISHELL-1 tree: ``root/data_aishell/wav/<split>/S0xxx/BAC009S0xxxW0yyy.wav`` (16 kHz) and
    ``root/data_aishell/transcript/aishell_transcript_v0.8.txt`` (word-segmented, all splits, unsorted).

    Returns ``root/data_aishell``.
    """
    base = Path(root).resolve() / "data_aishell"
    rng = random.Random(seed)
    utts, lines = [], []
    spk_num = 2
    for split in splits:
        for _ in range(speakers_per_split):
            spk = f"S{spk_num:04d}"
            spk_num += 1
            for w in range(utts_per_speaker):
                key = f"BAC009{spk}W{121 + w:04d}"
                text = rng.choice(AISHELL_SENTENCES)
                utts.append(Utterance(key, text.replace(" ", ""), "cmn", 150 + rng.randint(0, 30), 16000, "wav",
                                      str(base / "wav" / split / spk / f"{key}.wav")))
                lines.append(f"{key} {text}\n")
    synthesize_all(utts)
    rng.shuffle(lines)
    (base / "transcript").mkdir(parents=True, exist_ok=True)
    (base / "transcript" / "aishell_transcript_v0.8.txt").write_text("".join(lines), encoding="utf-8")
    return base


def make_librispeech_lookalike(root: str | os.PathLike, *,
                               subsets: tuple[str, ...] = ("train-clean-100", "dev-clean", "test-clean"),
                               readers_per_subset: int = 2, utts_per_chapter: int = 2, seed: int = 0) -> Path:
    """A tiny LibriSpeech tree: ``root/LibriSpeech/<subset>/<reader>/<chapter>/<reader>-<chapter>-<nnnn>.flac``
    (16 kHz) and ``<reader>-<chapter>.trans.txt`` (upper case) per chapter. Returns ``root/LibriSpeech``.
    """
    base = Path(root).resolve() / "LibriSpeech"
    rng = random.Random(seed)
    utts, chapters = [], {}
    readers = iter(LIBRI_READERS * (1 + len(subsets) * readers_per_subset // len(LIBRI_READERS)))
    for n, subset in enumerate(subsets):
        for r in range(readers_per_subset):
            reader = next(readers) + ("" if n < 2 else str(n))  # ids never repeat across subsets
            chapter = str(1240 + 10 * r + n)
            chapter_dir = base / subset / reader / chapter
            for i in range(utts_per_chapter):
                key = f"{reader}-{chapter}-{i:04d}"
                text = rng.choice(EN_SENTENCES + [digits_text(rng)]).upper()
                utts.append(Utterance(key, text, "en-us", 150 + rng.randint(0, 30), 16000, "flac",
                                      str(chapter_dir / f"{key}.flac")))
                chapters.setdefault(chapter_dir / f"{reader}-{chapter}.trans.txt", []).append(f"{key} {text}\n")
    synthesize_all(utts)
    for path, lines in chapters.items():
        path.write_text("".join(lines), encoding="utf-8")
    return base


def replicate(src_dir: str | os.PathLike, out_dir: str | os.PathLike, copies: int) -> Path:
    """Multiply a Kaldi dir ``copies`` times (hard links when possible) for benchmarks at scale."""
    src, out = Path(src_dir), Path(out_dir).resolve()
    from corpus_io.tables import kaldi

    wavs = [(line.key, line.value) for line in kaldi.iter_table(src / "wav.scp")]
    texts = {line.key: line.value for line in kaldi.iter_table(src / "text")}
    (out / "wav").mkdir(parents=True, exist_ok=True)
    with open(out / "wav.scp", "w", encoding="utf-8") as fw, open(out / "text", "w", encoding="utf-8") as ft:
        for c in range(copies):
            for key, path in wavs:
                new_key = f"c{c:04d}-{key}"
                ext = Path(path).suffix
                target = out / "wav" / f"{new_key}{ext}"
                if not target.exists():
                    try:
                        os.link(path, target)
                    except OSError:
                        shutil.copyfile(path, target)
                fw.write(f"{new_key} {target}\n")
                ft.write(f"{new_key} {texts[key]}\n")
    return out


#: the pauses join puts between two utterances (seconds, drawn uniformly)
JOIN_PAUSE_SECONDS = (0.3, 1.2)


def join(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *, per_recording: int = 40, seed: int = 0,
         pause: tuple[float, float] = JOIN_PAUSE_SECONDS, room_tone: bool = False) -> Path:
    """Long recordings for ``corpus-io segment``: the utterances of the Kaldi dir ``src_dir`` (sorted by key, mono
    WAV/FLAC at one rate) joined ``per_recording`` at a time with a pause of ``pause`` seconds between two (16-bit
    silence: triangular dither of one step; ``room_tone``: the recordings' own room tone, :func:`room_tone_of`), as
    the Kaldi dir ``out_dir`` (``wav/<rec>.wav``, ``wav.scp``, ``text`` with all of a recording's words on one line)
    plus ``joins.jsonl``, the truth: each utterance's recording, start and end in it, where its speech starts and
    ends (samples above 1 % of its peak), and its words."""
    import json

    import numpy as np
    import soundfile as sf

    from corpus_io.tables import kaldi

    src, out = Path(src_dir), Path(out_dir).resolve()
    wavs = sorted((line.key, line.value) for line in kaldi.iter_table(src / "wav.scp"))
    texts = {line.key: line.value for line in kaldi.iter_table(src / "text")}
    rng = np.random.default_rng(seed)
    tone = room_tone_of([sf.read(path.strip(), dtype="float32")[0] for _, path in wavs]) if room_tone else None
    (out / "wav").mkdir(parents=True, exist_ok=True)
    scp, text, truth = [], [], []
    for r, first in enumerate(range(0, len(wavs), per_recording)):
        rec = f"long{r:04d}"
        pieces, words, at, rate = [], [], 0, None
        for k, (key, path) in enumerate(wavs[first:first + per_recording]):
            audio, sr = sf.read(path.strip(), dtype="float32")
            rate = rate or sr
            if sr != rate or audio.ndim != 1:
                raise ValueError(f"{path}: join takes mono audio at one rate ({rate} Hz)")
            if k:
                n = int(rng.uniform(*pause) * rate)
                if tone is not None:
                    at_tone = int(rng.integers(0, max(1, len(tone) - n)))  # one stretch of it, no wrap
                    pieces.append(faded(np.resize(tone[at_tone:], n)))
                else:
                    pieces.append(((rng.uniform(-1, 1, n) + rng.uniform(-1, 1, n)) / 32768).astype(np.float32))
                at += n
            loud = np.flatnonzero(np.abs(audio) > 0.01 * max(1e-9, float(np.abs(audio).max())))
            on, off = (int(loud[0]), int(loud[-1]) + 1) if len(loud) else (0, len(audio))
            truth.append({"recording": rec, "key": key, "start": at / rate, "end": (at + len(audio)) / rate,
                          "speech_start": (at + on) / rate, "speech_end": (at + off) / rate,
                          "words": texts[key].split()})
            words += texts[key].split()
            pieces.append(faded(audio) if tone is not None else audio)
            at += len(audio)
        target = out / "wav" / f"{rec}.wav"
        sf.write(target, np.concatenate(pieces), rate, subtype="PCM_16")
        scp.append(f"{rec} {target}\n")
        text.append(f"{rec} {' '.join(words)}\n")
    (out / "wav.scp").write_text("".join(scp), encoding="utf-8")
    (out / "text").write_text("".join(text), encoding="utf-8")
    (out / "joins.jsonl").write_text("".join(json.dumps(t) + "\n" for t in truth), encoding="utf-8")
    return out


#: room tone is read in pieces of this many samples (10 ms at 16 kHz) ...
ROOM_TONE_PIECE = 160
#: ... and kept from the quietest fifth of each recording's pieces, in runs of at least 5 (50 ms: its own texture)
ROOM_TONE_SHARE, ROOM_TONE_RUN = 0.2, 5


#: samples over which room tone's pieces cross-fade, and pauses and utterances fade in and out (5 ms at 16 kHz)
ROOM_TONE_FADE = 80


def room_tone_of(waves: list) -> np.ndarray:
    """The recordings' own room tone, one array: the runs of at least :data:`ROOM_TONE_RUN` consecutive 10 ms pieces
    among each recording's quietest :data:`ROOM_TONE_SHARE` (by RMS), cross-faded end to start over
    :data:`ROOM_TONE_FADE` samples (no click where two runs meet: a room's tone is continuous)."""
    import numpy as np

    ramp = 0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, ROOM_TONE_FADE, dtype=np.float32))
    tone = np.zeros(0, dtype=np.float32)
    for wave in waves:
        n = len(wave) // ROOM_TONE_PIECE
        if n == 0:
            continue
        pieces = np.asarray(wave[: n * ROOM_TONE_PIECE], dtype=np.float32).reshape(n, ROOM_TONE_PIECE)
        rms = np.sqrt((pieces ** 2).mean(axis=1))
        quiet = rms <= np.quantile(rms, ROOM_TONE_SHARE)
        start = None
        for i, q in enumerate([*quiet, False]):
            if q and start is None:
                start = i
            elif not q and start is not None:
                if i - start >= ROOM_TONE_RUN:
                    run = pieces[start:i].reshape(-1)
                    if len(tone) >= ROOM_TONE_FADE:
                        run = run.copy()
                        run[:ROOM_TONE_FADE] = run[:ROOM_TONE_FADE] * ramp + tone[-ROOM_TONE_FADE:] * ramp[::-1]
                        tone = tone[:-ROOM_TONE_FADE]
                    tone = np.concatenate([tone, run])
                start = None
    if not len(tone):
        raise ValueError("join --room-tone: the recordings hold no 50 ms of quiet to take their room tone from")
    return tone


def faded(wave: np.ndarray) -> np.ndarray:
    """``wave`` faded in and out over :data:`ROOM_TONE_FADE` samples (a cut file's edge joins tone without a click)."""
    import numpy as np

    ramp = 0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, min(ROOM_TONE_FADE, len(wave) // 2), dtype=np.float32))
    out = np.array(wave, dtype=np.float32)
    if len(ramp):
        out[: len(ramp)] *= ramp
        out[len(out) - len(ramp):] *= ramp[::-1]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m corpus_io.tables.synth", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("fixture", help="the committed test corpus")
    p.add_argument("out_dir")
    p = sub.add_parser("digits", help="an English digits corpus")
    p.add_argument("out_dir")
    p.add_argument("--num", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-rate", type=int, default=16000)
    p.add_argument("--format", default="wav", choices=["wav", "flac"])
    p.add_argument("--held-out-voices", action="store_true", help="voices no training set uses")
    p = sub.add_parser("mixed", help="a mixed Chinese/English corpus")
    p.add_argument("out_dir")
    p.add_argument("--num", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("aishell", help="a tiny AISHELL-1 look-alike tree (ROOT/data_aishell)")
    p.add_argument("root")
    p.add_argument("--speakers-per-split", type=int, default=2)
    p.add_argument("--utts-per-speaker", type=int, default=2)
    p = sub.add_parser("librispeech", help="a tiny LibriSpeech look-alike tree (ROOT/LibriSpeech)")
    p.add_argument("root")
    p.add_argument("--readers-per-subset", type=int, default=2)
    p.add_argument("--utts-per-chapter", type=int, default=2)
    p = sub.add_parser("replicate", help="multiply a Kaldi dir for benchmarks")
    p.add_argument("src_dir")
    p.add_argument("out_dir")
    p.add_argument("--copies", type=int, default=10)
    p = sub.add_parser("join", help="long recordings: a Kaldi dir's utterances joined with pauses (corpus-io segment)")
    p.add_argument("src_dir")
    p.add_argument("out_dir")
    p.add_argument("--per-recording", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--room-tone", action="store_true", help="pauses of the recordings' own room tone, not silence")
    args = parser.parse_args(argv)
    if args.what == "fixture":
        make_fixture(args.out_dir)
    elif args.what == "digits":
        make_digits(args.out_dir, args.num, seed=args.seed, sample_rate=args.sample_rate, fmt=args.format,
                    held_out_voices=args.held_out_voices)
    elif args.what == "mixed":
        make_mixed(args.out_dir, args.num, seed=args.seed)
    elif args.what == "aishell":
        make_aishell_lookalike(args.root, speakers_per_split=args.speakers_per_split,
                               utts_per_speaker=args.utts_per_speaker)
    elif args.what == "librispeech":
        make_librispeech_lookalike(args.root, readers_per_subset=args.readers_per_subset,
                                   utts_per_chapter=args.utts_per_chapter)
    elif args.what == "join":
        join(args.src_dir, args.out_dir, per_recording=args.per_recording, seed=args.seed, room_tone=args.room_tone)
    else:
        replicate(args.src_dir, args.out_dir, args.copies)


if __name__ == "__main__":
    main()
