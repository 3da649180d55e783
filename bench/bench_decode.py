"""Decoding search speed (issue 23): greedy, the batched CTC prefix beam search (beam 10), the same one
utterance at a time, and the beam with an n-gram fused and with hotwords, on the same CTC outputs.

The outputs are seeded, peaked log-softmax matrices shaped like a 4x-subsampled model's (40 ms frames):
32 utterances of 6-10 s over a 500-token (demo-sized) and a 5,000-token (AISHELL-sized) vocabulary.
Each figure is search seconds per audio second (a search RTF) measured side by side in this run, and
the batched/one-at-a-time ratio; the LM is a 3-gram of 2,000 random sentences (make-lm's estimator).
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

import torch

from bench.common import sized
from corpus_io.config import TokenizerConf
from corpus_io.decoding.beam import best_path_ids, ctc_prefix_beam_search
from corpus_io.decoding.hotwords import ContextGraph
from corpus_io.decoding.lm import LmFusion, kneser_ney, write_arpa
from corpus_io.tokenizer import Tokenizer, char_split

FRAME_S = 0.04
UTTERANCES = sized(32, 4)
LM_SENTENCES = sized(2000, 100)
HOTWORDS = sized(100, 10)
FRAMES = sized((150, 251), (20, 41))  # output frames per utterance: [low, high)


def outputs(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(*FRAMES, (UTTERANCES,), generator=g)
    logits = torch.randn(UTTERANCES, int(lengths.max()), vocab, generator=g) * 4
    logits[:, :, 0] += 3  # blank-heavy, as a trained CTC model
    return torch.log_softmax(logits, dim=-1), lengths


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(1)
    for vocab in (500, 5000):
        run(vocab)


def run(vocab: int) -> None:
    lp, lengths = outputs(vocab)
    audio = float(lengths.sum()) * FRAME_S
    symbols = ["<blank>", "<unk>", *[chr(0x4E00 + i) for i in range(vocab - 3)], "<sos/eos>"]
    tok = Tokenizer(symbols, char_split("word"), TokenizerConf(type="char"))
    rng = random.Random(0)
    text = [[rng.choice(symbols[2:200]) for _ in range(rng.randint(3, 12))] for _ in range(LM_SENTENCES)]
    with tempfile.TemporaryDirectory() as tmp:
        arpa = Path(tmp) / "lm.arpa"
        write_arpa(arpa, *kneser_ney(text, 3)[:2])
        lm = LmFusion(str(arpa), tok, 0.3, 0.0)
    context = ContextGraph([[rng.randrange(2, vocab - 1) for _ in range(3)] for _ in range(HOTWORDS)], vocab, 1.5)
    t_greedy = timed(lambda: best_path_ids(lp, lengths))
    t_batched = timed(lambda: ctc_prefix_beam_search(lp, lengths, beam=10))
    t_single = timed(lambda: [ctc_prefix_beam_search(lp[i:i + 1, :int(n)], lengths[i:i + 1], beam=10)
                              for i, n in enumerate(lengths.tolist())])
    t_lm = timed(lambda: ctc_prefix_beam_search(lp, lengths, beam=10, lm=lm))
    t_hot = timed(lambda: ctc_prefix_beam_search(lp, lengths, beam=10, context=context))
    print(f"vocab {vocab}, {UTTERANCES} utterances, {audio:.0f} s audio, 1 thread: search RTF greedy "
          f"{t_greedy / audio:.5f}, prefix beam 10 batched {t_batched / audio:.5f}, one at a time "
          f"{t_single / audio:.5f} (batched {t_single / t_batched:.1f}x faster), + 3-gram LM {t_lm / audio:.5f}, "
          f"+ {HOTWORDS} hotwords {t_hot / audio:.5f}", flush=True)


if __name__ == "__main__":
    main()
