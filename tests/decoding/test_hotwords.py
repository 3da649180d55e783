"""Hotword biasing in the prefix beam search: the context graph's bonus (kept for a whole hotword, given
back for a broken partial match), recall raised on a set with the hotwords, CER kept on a set without."""

from __future__ import annotations

import random

import pytest
import torch

from corpus_io.config import DecodingConf, TokenizerConf
from corpus_io.decoding.beam import best_path_ids
from corpus_io.decoding.hotwords import ContextGraph
from corpus_io.decoding.scoring import Scorer
from corpus_io.decoding.search import Search
from corpus_io.tokenizer import Tokenizer, build_tokenizer, char_split


def test_a_whole_hotword_keeps_its_bonus_and_a_broken_partial_match_gives_it_back():
    graph = ContextGraph([[2, 3, 4], [3, 5]], vocab_size=8, weight=1.0)
    bonus = dict(zip(["whole", "partial", "broken", "two", "overlap"], graph.sequence_bonus(
        [[2, 3, 4], [7, 2, 3], [2, 3, 7, 6], [3, 5, 1, 2, 3, 4], [2, 3, 5]])))
    assert bonus["whole"] == pytest.approx(3.0)  # weight per token of the completed hotword
    assert bonus["partial"] == pytest.approx(0.0) and bonus["broken"] == pytest.approx(0.0)
    assert bonus["two"] == pytest.approx(5.0)
    assert bonus["overlap"] == pytest.approx(2.0)  # 2 3 fails on 5, falls back to 3 (the start of 3 5)
    state = graph.initial_state(1, 1)
    steps = []
    for tok in (2, 3, 7):
        steps.append(float(graph.bonus(state, torch.tensor([[[tok]]]))))
        state = graph.advance(state, torch.tensor([[tok]]))
    assert steps == [1.0, 1.0, -2.0]  # the partial bonus is taken back when the match fails


def tokenizer(kind: str, tmp_path) -> Tokenizer:
    if kind == "zh":
        symbols = list("北京背景上海伤害今天明去了会开")
        return Tokenizer(["<blank>", "<unk>", *symbols, "<sos/eos>"], char_split("word"), TokenizerConf(type="char"))
    if kind == "bpe":  # a real sentencepiece BPE model, trained as make-tokenizer trains one
        import sentencepiece as spm

        # the hotwords are not in the training text, so they split into several pieces
        words = "use now is fun speech torch audio model data train test the a of kind wet net lad".split()
        rng = random.Random(0)
        (tmp_path / "bpe.txt").write_text("".join(" ".join(rng.choices(words, k=8)) + "\n" for _ in range(400)))
        spm.SentencePieceTrainer.train(input=str(tmp_path / "bpe.txt"), model_prefix=str(tmp_path / "bpe"),
                                       vocab_size=60, model_type="bpe", character_coverage=1.0,
                                       minloglevel=2)
        return build_tokenizer(TokenizerConf(type="bpe", bpe_model=str(tmp_path / "bpe.model")))
    conf = TokenizerConf(type="char", latin_unit="letter")
    return Tokenizer(["<blank>", "<unk>", "▁", *"abcdefghijklmnopqrstuvwxyz", "<sos/eos>"],
                     char_split("letter"), conf, join=lambda t: "".join(t).replace("▁", " ").strip())


def twin_tokens(tok: Tokenizer, word: str, twin: str | None) -> list[str]:
    """The tokens of the hotword's acoustic twin: ``twin``'s, or (BPE, where a near spelling splits into other
    pieces) the hotword's with its last piece swapped for another piece of the model."""
    if twin is not None:
        return tok.tokenize(twin)
    pieces = tok.tokenize(word)
    other = next(t for t in tok.symbols[2:-1] if t != pieces[-1] and not t.startswith("▁") and len(t) == 1)
    return pieces[:-1] + [other]


CASES = {  # hotwords, sentence frames, the hotword's acoustic twin (wins narrowly without biasing), other words
    "zh": (["北京", "上海"], ["今天去{}", "明天去{}开会", "{}"], {"北京": "背景", "上海": "伤害"}, ["会了", "开会"]),
    "en": (["kaldi", "wenet"], ["use {} now", "{} is fun", "{}"], {"kaldi": "kaldy", "wenet": "wenit"},
           ["speech", "torch", "audio"]),
    "bpe": (["kaldi", "wenet"], ["use {} now", "{} is fun", "{}"], {"kaldi": None, "wenet": None},
            ["speech", "torch", "audio"]),
}


def emissions(tok: Tokenizer, texts: list[str], twins: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A frame per token and a blank; inside a hotword the twin's differing token wins 0.45 to 0.40."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for text in texts:
        spoken = tok.tokenize(text)
        heard = tok.tokenize(text)
        for word, twin in twins.items():
            for i in range(len(spoken)):
                if spoken[i:i + len(tok.tokenize(word))] == tok.tokenize(word):
                    heard[i:i + len(tok.tokenize(word))] = twin_tokens(tok, word, twin)
        frames = []
        for said, rival in zip(spoken, heard):
            for f in range(2):
                p = 0.02 + 0.01 * torch.rand(tok.vocab_size, generator=g)
                if f == 1:
                    p[0] = 0.9
                elif said != rival:
                    p[tok.ids[rival]], p[tok.ids[said]] = 0.45, 0.40
                else:
                    p[tok.ids[said]] = 0.9
                frames.append((p / p.sum()).log())
        rows.append(torch.stack(frames))
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), torch.tensor([len(r) for r in rows])


@pytest.mark.parametrize("kind", ["zh", "en", "bpe"])
def test_hotwords_raise_recall_without_costing_cer_where_they_are_absent(kind, tmp_path):
    tok = tokenizer(kind, tmp_path)
    hotwords, frames, twins, others = CASES[kind]
    (tmp_path / "hot.txt").write_text("\n".join(hotwords) + "\n", encoding="utf-8")
    rng = random.Random(0)
    with_them = [rng.choice(frames).format(rng.choice(hotwords)) for _ in range(30)]
    without = [rng.choice(frames).format(rng.choice(others)) for _ in range(30)]
    plain = Search(DecodingConf(method="ctc_prefix_beam", beam=8), tok)
    biased = Search(DecodingConf(method="ctc_prefix_beam", beam=8, hotwords=str(tmp_path / "hot.txt"),
                                 hotword_weight=1.5), tok)
    assert biased.hotwords == hotwords
    lp, lengths = emissions(tok, with_them, twins, 1)
    scores = {}
    for name, search in (("plain", plain), ("biased", biased)):
        s = Scorer(hotwords=hotwords)
        for i, (ref, hyps) in enumerate(zip(with_them, search(lp, lengths))):
            s.add(str(i), ref, tok.decode(hyps[0].ids))
        scores[name] = s.hotword_recall()[0]
    assert scores["plain"] < 0.2 and scores["biased"] >= 0.9
    # a set without the hotwords: CER may not rise by more than 1 % absolute
    lp, lengths = emissions(tok, without, {}, 2)
    cers = []
    for ids in (best_path_ids(lp, lengths), [h[0].ids for h in biased(lp, lengths)]):
        s = Scorer()
        for i, (ref, hyp) in enumerate(zip(without, ids)):
            s.add(str(i), ref, tok.decode(hyp))
        cers.append(s.cer.rate)
    assert cers[1] <= cers[0] + 0.01


def test_a_megabyte_hotword_left_out_is_quoted_in_a_bounded_excerpt(tmp_path, capfd):
    from corpus_io.decoding.hotwords import build_context

    huge = "北" + "x" * 1_000_000  # its Latin run is no token of the list: left out with a warning
    (tmp_path / "hot.txt").write_text(f"{huge}\n北京\n", encoding="utf-8")
    capfd.readouterr()
    _, kept = build_context(str(tmp_path / "hot.txt"), tokenizer("zh", tmp_path), 1.5)
    err = capfd.readouterr().err
    assert kept == ["北京"]
    assert f"warning: 1 hotwords of {tmp_path / 'hot.txt'} have tokens outside the token list" in err, err[:500]
    assert f"(e.g. '北{'x' * 59}'… (1000001 characters))" in err and len(err) < 500, err[:500]
