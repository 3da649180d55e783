"""make-lm (interpolated modified Kneser-Ney, ARPA) against hand-computed probabilities, normalisation
and KenLM's reading of the file; ctc_beam_lm (the n-gram fused into the prefix beam search) on CTC
outputs built at the logit level."""

from __future__ import annotations

import itertools
import random
from typing import Callable

import pytest
import torch

from corpus_io.config import DecodingConf, TokenizerConf
from corpus_io.decoding.beam import best_path_ids
from corpus_io.decoding.lm import BOS, EOS, UNK, Arpa, WordLmFusion, kneser_ney, write_arpa
from corpus_io.decoding.scoring import Scorer
from corpus_io.decoding.search import Search
from corpus_io.errors import ConfigError, DataError
from corpus_io.tokenizer import Tokenizer, build_tokenizer, char_split
from tests.conftest import assert_user_error, run_cli


def test_make_lm_writes_the_hand_computed_kneser_ney_probabilities(tmp_path):
    (tmp_path / "text.txt").write_text("a b\na a\n", encoding="utf-8")
    result = run_cli("corpus-io", "make-lm", f"++input={tmp_path / 'text.txt'}", f"++output={tmp_path / 'lm.arpa'}",
                     "++order=2", "++unit=word")
    assert result.returncode == 0, result.stderr[-2000:]
    lm = Arpa(tmp_path / "lm.arpa")
    p = lambda w, *ctx: 10 ** lm.logprob(w, ctx)  # noqa: E731
    # Bigrams <s> a, a b, b </s>, a a, a </s>. Unigram continuation counts: a 2 (after <s>, a), b 1, </s> 2;
    # too few counts of counts: discounts 0.5 (count 1), 1.0 (count 2). Vocabulary a b </s> <unk> (4).
    # gamma() = (0.5 * 1 + 1.0 * 2) / 5 = 0.5: p(a) = (2 - 1) / 5 + 0.5 / 4 = 0.325, p(b) = 0.5 / 5 + 0.125
    assert p("a") == pytest.approx(0.325) and p("b") == pytest.approx(0.225)
    assert p(EOS) == pytest.approx(0.325) and p(UNK) == pytest.approx(0.125)
    # context a: a b, a a, a </s> once each: gamma = 0.5 * 3 / 3; p(b|a) = 0.5 / 3 + 0.5 * 0.225
    assert p("b", "a") == pytest.approx(0.5 / 3 + 0.1125) and p("a", "a") == pytest.approx(0.5 / 3 + 0.1625)
    assert p(UNK, "a") == pytest.approx(0.0625)
    # context <s>: <s> a twice (raw count: it starts with <s>): p(a|<s>) = (2 - 1) / 2 + 0.5 * 0.325
    assert p("a", "<s>") == pytest.approx(0.6625) and p("b", "<s>") == pytest.approx(0.5 * 0.225)
    assert p(EOS, "b") == pytest.approx(0.5 + 0.5 * 0.325)
    assert "perplexity" in result.stderr


def test_discounts_follow_chen_and_goodman_from_the_counts_of_counts():
    from collections import Counter

    from corpus_io.decoding.lm import _discounts

    counts = Counter({f"g{i}": c for i, c in enumerate([1, 1, 1, 1, 2, 2, 3, 4, 7, 9])})  # n1 4, n2 2, n3 1, n4 1
    # Y = 4 / (4 + 2 * 2) = 0.5; D1 = 1 - 2Y n2/n1 = 0.5; D2 = 2 - 3Y n3/n2 = 1.25; D3+ = 3 - 4Y n4/n3 = 1.0
    assert _discounts(counts) == pytest.approx((0.5, 1.25, 1.0))
    assert _discounts(Counter({"a": 1, "b": 2, "c": 3})) == (0.5, 1.0, 1.5)  # n4 = 0: KenLM's fallback


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_every_context_is_a_distribution_with_discounts_from_counts_of_counts(tmp_path, order):
    rng = random.Random(order)
    words = "a b c d e f g h i j k l".split()
    sentences = [rng.choices(words, weights=[1 / (i + 1) for i in range(12)], k=rng.randint(1, 7))
                 for _ in range(400)]
    probs, backoffs, discounts = kneser_ney(sentences, order)
    for d in discounts[1:]:  # enough text for discounts from the counts of counts above the unigrams
        assert d != (0.5, 1.0, 1.5) and all(0 < x <= k + 1 for k, x in enumerate(d))
    write_arpa(tmp_path / "lm.arpa", probs, backoffs)
    lm = Arpa(tmp_path / "lm.arpa")
    vocab = [*words, EOS, UNK]
    for n in range(order):
        for context in itertools.product([*words[:3], "l", "<s>", "zz"], repeat=n):
            if "<s>" in context[1:]:
                continue
            assert sum(10 ** lm.logprob(w, context) for w in vocab) == pytest.approx(1.0, abs=1e-5)


def test_kenlm_reads_the_arpa_with_the_same_scores(tmp_path):
    from flashlight.lib.text.decoder.kenlm import KenLM
    from flashlight.lib.text.dictionary import Dictionary

    rng = random.Random(0)
    sentences = [[rng.choice("abcde") for _ in range(rng.randint(1, 6))] for _ in range(200)]
    probs, backoffs, _ = kneser_ney(sentences, 3)
    write_arpa(tmp_path / "lm.arpa", probs, backoffs)
    ours = Arpa(tmp_path / "lm.arpa")
    words = Dictionary()
    for w in [*"abcde", EOS, UNK, "<s>"]:
        words.add_entry(w)
    kenlm = KenLM(str(tmp_path / "lm.arpa"), words)
    for sentence in (list("abc"), list("eeaab"), ["a", "zz", "c"]):
        state, total = kenlm.start(False), 0.0
        for w in sentence:
            state, s = kenlm.score(state, words.get_index(w if w in "abcde" else UNK))
            total += s
        total += kenlm.finish(state)[1]
        assert total == pytest.approx(ours.sentence_logprob(sentence), abs=1e-4)


def test_make_lm_reads_kaldi_text_and_jsonl_and_refuses_a_missing_input(tmp_path):
    (tmp_path / "text").write_text("u1 今天 天气\nu2 天气 很好\n", encoding="utf-8")
    (tmp_path / "t.jsonl").write_text('{"key": "u1", "target": "今天天气"}\n{"key": "u2", "target": "天气很好"}\n',
                                      encoding="utf-8")
    arpas = []
    for name in ("text", "t.jsonl"):
        out = tmp_path / f"{name}.arpa"
        result = run_cli("corpus-io", "make-lm", f"++input={tmp_path / name}", f"++output={out}", "++order=3")
        assert result.returncode == 0, result.stderr[-2000:]
        arpas.append(out.read_text(encoding="utf-8"))
    assert arpas[0] == arpas[1] and "u1" not in arpas[0] and "\t今 天\t" in arpas[0]  # the keys are not text
    result = run_cli("corpus-io", "make-lm", f"++input={tmp_path / 'none.txt'}", f"++output={tmp_path / 'x.arpa'}")
    assert_user_error(result, "none.txt")


# --------------------------------------------------------------------------- ctc_beam_lm

CHARS = list("今天明气器很好北京上海下雨晴冷热")


def tokenizer() -> Tokenizer:
    return Tokenizer(["<blank>", "<unk>", *CHARS, "<sos/eos>"], char_split("word"), TokenizerConf(type="char"))


def sentences(rng: random.Random, n: int) -> list[str]:
    """A small grammar: <place><day>天气<state>."""
    return [rng.choice(["北京", "上海", ""]) + rng.choice(["今天", "明天"]) + "天气"
            + rng.choice(["很好", "晴", "冷", "热", "下雨"]) for _ in range(n)]


def token_frames(g: torch.Generator, vocab: int, true: int, heard: int) -> list[torch.Tensor]:
    """Three CTC frames of one token over a little noise: two where ``heard`` narrowly beats ``true`` (0.45
    against 0.40; 0.9 when they are the same token), then a blank."""
    frames = []
    for f in range(3):
        p = 0.02 + 0.01 * torch.rand(vocab, generator=g)
        if f == 2:
            p[0] = 0.9
        elif true != heard:
            p[heard], p[true] = 0.45, 0.40
        else:
            p[true] = 0.9
        frames.append((p / p.sum()).log())
    return frames


def padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), torch.tensor([len(r) for r in rows])


def emissions(tok: Tokenizer, texts: list[str], seed: int, confuse: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """CTC log-probs: two frames per character and a blank; a confused character loses narrowly to its twin."""
    g = torch.Generator().manual_seed(seed)
    return padded([torch.stack([f for c in text for f in token_frames(g, tok.vocab_size, tok.ids[c],
                                                                        tok.ids[confuse.get(c, c)])])
                   for text in texts])


def scored(tok: Tokenizer, refs: list[str], hyps: list[list[int]]) -> Scorer:
    s = Scorer()
    for i, (r, h) in enumerate(zip(refs, hyps)):
        s.add(str(i), r, tok.decode(h))
    return s


def cer(tok: Tokenizer, refs: list[str], hyps: list[list[int]]) -> float:
    return scored(tok, refs, hyps).cer.rate


def test_beam_with_an_lm_from_the_training_text_fixes_homophones_and_keeps_clean_speech(tmp_path):
    rng = random.Random(0)
    tok = tokenizer()
    train = sentences(rng, 300)
    (tmp_path / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    result = run_cli("corpus-io", "make-lm", f"++input={tmp_path / 'train.txt'}", f"++output={tmp_path / 'lm.arpa'}",
                     "++order=3")
    assert result.returncode == 0, result.stderr[-2000:]
    search = Search(DecodingConf(method="ctc_beam_lm", lm=str(tmp_path / "lm.arpa"), beam=8, lm_weight=0.5), tok)
    held_out = sentences(random.Random(1), 40)
    for confuse, name in (({}, "clean"), ({"气": "器"}, "homophones")):
        lp, lengths = emissions(tok, held_out, 2, confuse)
        greedy = cer(tok, held_out, best_path_ids(lp, lengths))
        fused = cer(tok, held_out, [h[0].ids for h in search(lp, lengths)])
        if name == "clean":
            assert fused <= greedy
        else:
            assert greedy > 0.1 and fused < greedy / 4, (greedy, fused)


def test_ctc_beam_lm_without_an_lm_file_says_what_to_do(tmp_path):
    with pytest.raises(Exception, match="make-lm"):
        Search(DecodingConf(method="ctc_beam_lm"), tokenizer())
    with pytest.raises(Exception, match="does not exist"):
        Search(DecodingConf(method="ctc_beam_lm", lm=str(tmp_path / "no.arpa")), tokenizer())


def test_an_lm_over_other_units_than_the_models_tokens_is_refused(tmp_path):
    probs, backoffs, _ = kneser_ney([["hello", "world"], ["good", "morning"]], 2)
    write_arpa(tmp_path / "words.arpa", probs, backoffs)
    with pytest.raises(Exception, match="make-lm ..unit=token"):
        Search(DecodingConf(method="ctc_beam_lm", lm=str(tmp_path / "words.arpa")), tokenizer())


# --------------------------------------------------------------------------- a word LM over BPE pieces

TWINS = {"see": "sea", "sea": "see", "tail": "tale", "tale": "tail"}


def english(rng: random.Random, n: int) -> list[str]:
    """Sentences in which the LM, not the sound, tells the twins apart (see/sea, tail/tale)."""
    return [f"{rng.choice(['we', 'they', 'you'])} " + rng.choice(["see the sea", "sail to the sea", "tell a tale",
                                                                  "wag a tail", "meet at noon"])
            for _ in range(n)]


@pytest.fixture(scope="module")
def bpe_and_word_lm(tmp_path_factory):
    """A real sentencepiece BPE model small enough to split words into pieces of unequal counts (tale: 4,
    tail: 2), and a word trigram from the same text by make-lm ++unit=word."""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("wordlm")
    train = english(random.Random(0), 400)
    (root / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(root / "train.txt"), model_prefix=str(root / "bpe"), vocab_size=36,
                                   model_type="bpe", character_coverage=1.0, minloglevel=2)
    tok = build_tokenizer(TokenizerConf(type="bpe", bpe_model=str(root / "bpe.model")))
    result = run_cli("corpus-io", "make-lm", f"++input={root / 'train.txt'}", f"++output={root / 'words.arpa'}",
                     "++order=3", "++unit=word")
    assert result.returncode == 0, result.stderr[-2000:]
    return tok, root / "words.arpa"


def piece_emissions(tok: Tokenizer, texts: list[str], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two frames per BPE piece and a blank; a twin's pieces narrowly beat the true ones, a blank standing in for
    the pieces the shorter of the two lacks."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for text in texts:
        frames = []
        for word in text.split():
            true, heard = tok.encode(word), tok.encode(TWINS.get(word, word))
            for i in range(max(len(true), len(heard))):
                frames += token_frames(g, tok.vocab_size, true[i] if i < len(true) else 0,
                                       heard[i] if i < len(heard) else 0)
        rows.append(torch.stack(frames))
    return padded(rows)


def wer(tok: Tokenizer, refs: list[str], hyps: list[list[int]]) -> float:
    return scored(tok, refs, hyps).wer.rate


def test_a_word_lm_scores_each_word_of_bpe_pieces_once_it_is_complete(bpe_and_word_lm):
    tok, arpa_path = bpe_and_word_lm
    assert len(tok.tokenize("tale")) > 1 and len(tok.tokenize("tail")) > 1  # words of several pieces
    arpa = Arpa(arpa_path)
    fusion = WordLmFusion(arpa, tok, lm_weight=0.7, word_score=0.25)
    ln = 0.7 * 2.302585092994046
    for text in english(random.Random(3), 30):
        ids = tok.encode(text)
        assert fusion.words(ids) == text.split()
        state, earned = fusion.initial_state(1, 1), 0.0
        for t in ids:
            earned += float(fusion.bonus(state, torch.tensor([[[t]]]))[0, 0, 0])
            state = fusion.advance(state, torch.tensor([[t]]))
        words = text.split()
        # each word but the last is scored when the next begins; the last (and </s>) only in the final ranking
        expect = sum(ln * arpa.logprob(w, tuple([BOS, *words][max(0, i - 1):i + 1])) + 0.25
                     for i, w in enumerate(words[:-1]))
        assert earned == pytest.approx(expect, abs=1e-4)
        assert fusion.sequence_bonus([ids])[0] == pytest.approx(ln * arpa.sentence_logprob(words) + 0.25 * len(words))


def test_beam_with_a_word_lm_over_bpe_pieces_tells_twins_apart_and_keeps_clean_speech(bpe_and_word_lm):
    tok, arpa_path = bpe_and_word_lm
    search = Search(DecodingConf(method="ctc_beam_lm", lm=str(arpa_path), beam=8, lm_weight=0.5), tok)
    assert isinstance(search.lm, WordLmFusion)  # lm_unit=auto: the LM's words are not the model's pieces
    assert "lm_unit=word(auto)" in search.description  # the report says what auto chose
    held_out = english(random.Random(1), 40)
    lp, lengths = piece_emissions(tok, held_out, 2)
    greedy, fused = wer(tok, held_out, best_path_ids(lp, lengths)), wer(tok, held_out,
                                                                         [h[0].ids for h in search(lp, lengths)])
    assert greedy > 0.1 and fused < greedy / 4, (greedy, fused)
    clean = [t for t in held_out if not set(t.split()) & set(TWINS)]
    lp, lengths = piece_emissions(tok, clean, 3)
    assert wer(tok, clean, [h[0].ids for h in search(lp, lengths)]) == 0.0
    with pytest.raises(Exception, match="make-lm ..unit=token"):  # a char model spells no words
        Search(DecodingConf(method="ctc_beam_lm", lm=str(arpa_path), lm_unit="word"), tokenizer())


# --------------------------------------------------------------------------- hostile ARPA files and LM options


def _lm_lines(tmp_path) -> list[str]:
    """The lines of a trigram over the CJK sentences, as make-lm writes it."""
    probs, backoffs, _ = kneser_ney([list(s) for s in sentences(random.Random(0), 40)], 3)
    write_arpa(tmp_path / "good.arpa", probs, backoffs)
    return (tmp_path / "good.arpa").read_text(encoding="utf-8").splitlines()


def _cut_in_the_trigrams(lines: list[str]) -> tuple[list[str], int, list[str]]:
    start = lines.index("\\3-grams:")
    kept = lines[:start + (len(lines) - start) // 2]
    return kept, len(kept), ["the file ends inside the \\3-grams: section", "it is truncated"]


def _bigram_count_lies(lines: list[str]) -> tuple[list[str], int, list[str]]:
    at = next(i for i, line in enumerate(lines) if line.startswith("ngram 2="))
    real = int(lines[at].split("=")[1])
    lines[at] = f"ngram 2={real + 1}"
    return lines, lines.index("\\3-grams:") + 1, [f"the \\2-grams: section ends after {real} entries, but the header "
                                                  f"announces ngram 2={real + 1} (line {at + 1})"]


def _first_bigram_scored(value: str, says: str) -> Callable:
    def edit(lines: list[str]) -> tuple[list[str], int, list[str]]:
        at = lines.index("\\2-grams:") + 1
        lines[at] = value + lines[at][lines[at].index("\t"):]
        return lines, at + 1, [f"the log10 probability '{value}', {says}"]
    return edit


DAMAGED = {"truncated": _cut_in_the_trigrams, "count-lying": _bigram_count_lies,
           "nan": _first_bigram_scored("nan", "not a finite number in [-1000, 0]"),
           "1e308": _first_bigram_scored("1e308", "not a finite number in [-1000, 0]"),
           "not a number": _first_bigram_scored("-0.3x", "which is not a number")}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_arpa_is_refused_naming_its_line(damage, tmp_path):
    lines, lineno, needles = DAMAGED[damage](_lm_lines(tmp_path))
    bad = tmp_path / "lm.arpa"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    Search(DecodingConf(method="ctc_beam_lm", lm=str(tmp_path / "good.arpa")), tokenizer())  # the intact file fuses
    with pytest.raises(DataError) as refused:
        Search(DecodingConf(method="ctc_beam_lm", lm=str(bad)), tokenizer())
    message = str(refused.value)
    assert message.startswith(f"{bad}:{lineno}: ") and "is not a whole, valid ARPA n-gram file" in message, message
    for needle in needles:
        assert needle in message, message


def test_a_binary_lm_is_refused_naming_its_first_line(tmp_path):
    import gzip

    gz = tmp_path / "lm.arpa.gz"  # a compressed ARPA: not text
    gz.write_bytes(gzip.compress(("\n".join(_lm_lines(tmp_path)) + "\n").encode("utf-8")))
    with pytest.raises(DataError, match=f"^{gz}:1: the line is not UTF-8 text"):
        Search(DecodingConf(method="ctc_beam_lm", lm=str(gz)), tokenizer())
    kenlm = tmp_path / "lm.bin"  # KenLM's build_binary output starts with a text line
    kenlm.write_bytes(b"mmap lm http://kheafield.com/code format version 5\n\0\0\0\x05" + bytes(range(256)))
    with pytest.raises(DataError, match=f"^{kenlm}:1: the line holds 'mmap lm http.* where the ARPA header"):
        Search(DecodingConf(method="ctc_beam_lm", lm=str(kenlm)), tokenizer())


@pytest.mark.parametrize("method", ["greedy", "ctc_prefix_beam", "attention_rescoring"])
def test_an_lm_given_to_a_method_without_one_is_refused_and_ctc_beam_lm_named(method, tmp_path):
    _lm_lines(tmp_path)
    lm = tmp_path / "good.arpa"
    with pytest.raises(ConfigError) as refused:
        Search(DecodingConf(method=method, lm=str(lm)), tokenizer())
    message = str(refused.value)
    assert f"decoding.lm={lm} is given, but decoding.method={method} uses no LM" in message, message
    assert "the LM would be ignored" in message and "++decoding.method=ctc_beam_lm" in message


def test_an_lm_warning_names_the_lm_file(tmp_path, capfd):
    probs, backoffs, _ = kneser_ney([["今天", "hello", "world"], ["good", "morning", "today"]], 2)
    write_arpa(tmp_path / "mixed.arpa", probs, backoffs)  # one word a token of the model, five not
    capfd.readouterr()
    Search(DecodingConf(method="ctc_beam_lm", lm=str(tmp_path / "mixed.arpa")),
           Tokenizer(["<blank>", "<unk>", "今天", "<sos/eos>"], str.split, TokenizerConf(type="char")))
    err = capfd.readouterr().err
    assert f"warning: 5 words of decoding.lm={tmp_path / 'mixed.arpa'} are not tokens of the model" in err, err
    assert "object at" not in err


@pytest.mark.parametrize("name, text, read", [
    ("empty.txt", "", "not one transcript"),
    ("silent.jsonl", '{"key": "u1", "source": "a.wav", "target": ""}\n', "1 transcript, none with a token")])
def test_make_lm_on_text_without_words_names_the_file_and_writes_nothing(name, text, read, tmp_path):
    from corpus_io.config import MakeLmConfig
    from corpus_io.decoding.lm import make_lm

    (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as refused:
        make_lm(MakeLmConfig(input=str(tmp_path / name), output=str(tmp_path / "lm.arpa")))
    message = str(refused.value)
    assert f"{tmp_path / name} holds no text to estimate an LM from ({read}), so nothing was written to " \
           f"{tmp_path / 'lm.arpa'}" in message and "Give ++input the training transcripts" in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


# --------------------------------------------------------------------------- unknown words: unk_score and the lexicon


def _unk_heavy_arpa(path, words: list[str]) -> None:
    """A unigram LM that finds ``<unk>`` likelier than any of its words (as a big-vocabulary LM does a rare word):
    without an unknown-word score it prefers a misspelling to the word it knows."""
    lines = ["\\data\\", f"ngram 1={len(words) + 3}", "", "\\1-grams:", "-99\t<s>", "-1.0\t</s>", "-0.5\t<unk>",
             *(f"-2.0\t{w}" for w in words), "", "\\end\\"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def spelled_emissions(tok: Tokenizer, pairs: list[tuple[str, str]], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three frames per piece (two of sound, a blank): where the heard spelling differs from the true one its piece
    (or a blank) clearly beats the true piece, 0.7 against 0.15."""
    g = torch.Generator().manual_seed(seed)
    frames = []
    for true, heard in pairs:
        t, h = tok.encode(true), tok.encode(heard)
        for i in range(max(len(t), len(h))):
            a, b = (t[i] if i < len(t) else 0), (h[i] if i < len(h) else 0)
            for f in range(3):
                p = 0.02 + 0.01 * torch.rand(tok.vocab_size, generator=g)
                if f == 2:
                    p[0] = 0.9
                elif a != b:
                    p[b], p[a] = 0.7, 0.15
                else:
                    p[a] = 0.9
                frames.append((p / p.sum()).log())
    return padded([torch.stack(frames)])


def test_an_unknown_word_penalty_turns_an_out_of_vocabulary_spelling_into_the_lm_word(bpe_and_word_lm, tmp_path):
    tok, _ = bpe_and_word_lm
    _unk_heavy_arpa(tmp_path / "unk.arpa", "we they you tell a tale wag tail see the sea".split())
    lp, lengths = spelled_emissions(tok, [("we", "we"), ("tell", "tel"), ("a", "a"), ("tale", "tale")])
    assert tok.decode(best_path_ids(lp, lengths)[0]) == "we tel a tale"  # the sound says "tel", not a word

    def best(**options) -> str:
        search = Search(DecodingConf(method="ctc_beam_lm", lm=str(tmp_path / "unk.arpa"), beam=8, lm_weight=0.5,
                                     **options), tok)
        return tok.decode(search(lp, lengths)[0][0].ids)

    assert best() == "we tel a tale"  # the LM's <unk> is likelier than "tell": the misspelling stays
    assert best(unk_score=-3.0) == "we tell a tale"
    assert best(lexicon=True) == "we tell a tale"
    assert len(best(unk_score=3.0).split()) > 4  # a bonus pays for inserted non-words: why tune-lm tunes it


def test_a_word_lm_charges_unk_score_per_unknown_word_and_the_lexicon_once_per_word_off_it(bpe_and_word_lm):
    from corpus_io.decoding.lm import LEXICON_MISS

    tok, arpa_path = bpe_and_word_lm
    arpa = Arpa(arpa_path)

    def walk(fusion: WordLmFusion, text: str) -> tuple[float, float]:
        """(what the search earned token by token, the final ranking's bonus) of ``text``'s pieces."""
        ids, state, earned = tok.encode(text), fusion.initial_state(1, 1), 0.0
        for t in ids:
            earned += float(fusion.bonus(state, torch.tensor([[[t]]]))[0, 0, 0])
            state = fusion.advance(state, torch.tensor([[t]]))
        return earned, fusion.sequence_bonus([ids])[0]

    plain = WordLmFusion(arpa, tok, lm_weight=0.5, word_score=0.0)
    penalised = WordLmFusion(arpa, tok, lm_weight=0.5, word_score=0.0, unk_score=-2.5)
    lexicon = WordLmFusion(arpa, tok, lm_weight=0.5, word_score=0.0, lexicon=True)
    for text, unknown in (("we tell a tale", []), ("we tel a tale", ["tel"]), ("tel we tal", ["tel", "tal"]),
                          ("we see the seat", ["seat"])):
        (e0, s0), (e1, s1), (e2, s2) = walk(plain, text), walk(penalised, text), walk(lexicon, text)
        last = text.split()[-1] in unknown  # the LM scores the last word only in the final ranking
        assert e1 - e0 == pytest.approx(-2.5 * (len(unknown) - last), abs=1e-3), text
        assert s1 - s0 == pytest.approx(-2.5 * len(unknown), abs=1e-3), text
        assert lexicon.misses(tok.encode(text)) == len(unknown)
        assert s2 - s0 == pytest.approx(LEXICON_MISS * len(unknown), abs=0.05), text
        # the search charges a word once: as soon as it leaves the trie ("tal" at its piece "l", "seat" at "t"
        # after "sea") or when the next word begins inside it ("tel", a prefix of "tell"), even the last word
        assert e2 - e0 == pytest.approx(LEXICON_MISS * len(unknown), abs=0.05), text
    (e0, s0), (e2, s2) = walk(plain, "we ta"), walk(lexicon, "we ta")  # the last word ends inside the trie
    assert e2 == pytest.approx(e0) and s2 - s0 == pytest.approx(LEXICON_MISS, abs=0.05)  # charged at the end


def test_a_token_lm_scores_tokens_outside_its_vocabulary_with_unk_score_or_prunes_them_with_the_lexicon(tmp_path):
    from corpus_io.decoding.lm import LEXICON_MISS, LmFusion

    tok = tokenizer()
    write_arpa(tmp_path / "lm.arpa", *kneser_ney([list(s) for s in sentences(random.Random(0), 50)], 2)[:2])
    arpa = Arpa(tmp_path / "lm.arpa")
    unknown = [c for c in CHARS if c not in arpa.known]
    assert "器" in unknown and "气" not in unknown
    plain = LmFusion(arpa, tok, 0.5, 0.0)
    for options, extra in (({"unk_score": -1.5}, -1.5), ({"lexicon": True}, LEXICON_MISS)):
        fusion = LmFusion(arpa, tok, 0.5, 0.0, **options)
        tokens = torch.tensor([[[tok.ids["器"], tok.ids["气"], tok.unk_id]]])
        diff = (fusion.bonus(fusion.initial_state(1, 1), tokens) - plain.bonus(plain.initial_state(1, 1), tokens))
        assert diff[0, 0].tolist() == pytest.approx([extra, 0.0, extra])  # the model's <unk> is unknown too
        seq = [tok.ids[c] for c in "今天天器很好"]
        assert fusion.sequence_bonus([seq])[0] - plain.sequence_bonus([seq])[0] == pytest.approx(extra, rel=1e-6)


@pytest.mark.parametrize("method", ["greedy", "ctc_prefix_beam", "attention_rescoring"])
def test_unk_score_and_the_lexicon_without_an_lm_are_refused_as_ignored(method):
    with pytest.raises(ConfigError, match=rf"decoding.unk_score=-2.0 is given, but decoding.method={method} uses "
                                          r"no LM: .* so it would be ignored"):
        Search(DecodingConf(method=method, unk_score=-2.0), tokenizer())
    with pytest.raises(ConfigError, match=r"decoding.unk_score=1.0 and decoding.lexicon=true are given, .* they "
                                          r"would be ignored.*leave decoding.unk_score and decoding.lexicon out"):
        Search(DecodingConf(method=method, unk_score=1.0, lexicon=True), tokenizer())


def test_unk_score_with_the_lexicon_is_refused_and_a_lexicon_no_token_spells_too(bpe_and_word_lm, tmp_path):
    tok, arpa_path = bpe_and_word_lm
    with pytest.raises(ConfigError, match=r"decoding.unk_score=-1.0 is given with decoding.lexicon=true, .*no word "
                                          r"is unknown, so the score would be ignored"):
        Search(DecodingConf(method="ctc_beam_lm", lm=str(arpa_path), unk_score=-1.0, lexicon=True), tok)
    search = Search(DecodingConf(method="ctc_beam_lm", lm=str(arpa_path), lexicon=True), tok)
    assert "lexicon=true" in search.description and "unk_score" not in search.description
    assert "unk_score=-1.0" in Search(DecodingConf(method="ctc_beam_lm", lm=str(arpa_path), unk_score=-1.0),
                                      tok).description
    probs, backoffs, _ = kneser_ney([["ёж", "щука"], ["щука"]], 2)  # words of letters the BPE model lacks
    write_arpa(tmp_path / "other.arpa", probs, backoffs)
    with pytest.raises(ConfigError, match="decoding.lexicon=true: no word of decoding.lm=.* can be spelled"):
        Search(DecodingConf(method="ctc_beam_lm", lm=str(tmp_path / "other.arpa"), lm_unit="word", lexicon=True),
               tok)
