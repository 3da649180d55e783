"""Tokenizers (char/word/bpe over a WeNet token list) and the make-tokenizer command."""

from __future__ import annotations

import time

import pytest

from corpus_io.config import MakeTokenizerConfig, TokenizerConf
from corpus_io.errors import ConfigError, DataError
from corpus_io.tokenizer import build_tokenizer, iter_texts, make_tokenizer, read_token_list, write_token_list
from tests.conftest import assert_user_error, load_scale, run_cli


def _make(tmp_path, fixture_corpus, name="tokens.txt", **tok) -> str:
    out = tmp_path / name
    extra = {k: tok.pop(k) for k in ("vocab_size", "min_count") if k in tok}
    make_tokenizer(MakeTokenizerConfig(input=str(fixture_corpus / "text"), output=str(out),
                                       tokenizer=TokenizerConf(**tok), **extra))
    return str(out)


def test_token_list_has_blank_unk_first_and_sos_eos_last(tmp_path, fixture_corpus):
    symbols = read_token_list(_make(tmp_path, fixture_corpus))
    assert symbols[:2] == ["<blank>", "<unk>"] and symbols[-1] == "<sos/eos>"
    assert "天" in symbols and "quick" in symbols and "这个" not in symbols


def test_make_tokenizer_is_deterministic(tmp_path, fixture_corpus):
    a = _make(tmp_path, fixture_corpus, "a.txt")
    b = _make(tmp_path, fixture_corpus, "b.txt")
    assert open(a, encoding="utf-8").read() == open(b, encoding="utf-8").read()


def test_char_word_unit_round_trips_mixed_text(tmp_path, fixture_corpus):
    tok = build_tokenizer(TokenizerConf(type="char", token_list=_make(tmp_path, fixture_corpus)))
    assert tok.tokenize("这个 model 很好") == ["这", "个", "model", "很", "好"]
    for text in iter_texts(str(fixture_corpus / "text")):
        assert tok.decode(tok.encode(text)) == text
    assert tok.num_unknown == 0 and tok.num_tokens > 0 and tok.blank_id == 0 and tok.unk_id == 1


def test_char_letter_unit_marks_word_boundaries(tmp_path, fixture_corpus):
    path = _make(tmp_path, fixture_corpus, latin_unit="letter")
    tok = build_tokenizer(TokenizerConf(type="char", latin_unit="letter", token_list=path))
    assert tok.tokenize("打开 wifi 设置") == ["打", "开", "▁", "w", "i", "f", "i", "▁", "设", "置"]
    assert tok.tokenize("hello world") == ["h", "e", "l", "l", "o", "▁", "w", "o", "r", "l", "d"]
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert all(len(t) == 1 for t in read_token_list(path)[2:-1])  # letters and ▁, no words


def test_unknown_tokens_are_counted(tmp_path, fixture_corpus):
    tok = build_tokenizer(TokenizerConf(type="char", token_list=_make(tmp_path, fixture_corpus)))
    ids = tok.encode("今天 zebra 很好")
    assert ids.count(tok.unk_id) == 1
    assert (tok.num_unknown, tok.num_tokens) == (1, 5)


def tiny_tokenizer(tmp_path, tokens=("你", "好", "hello"), **conf):
    """A char tokenizer (Latin words whole) over ``<blank> <unk> tokens <sos/eos>``."""
    path = tmp_path / "tiny_units.txt"
    write_token_list(path, tokens, **{k: conf[k] for k in ("blank", "unk") if k in conf})
    return build_tokenizer(TokenizerConf(type="char", token_list=str(path), **conf))


def test_special_tokens_written_in_a_transcript_are_unknown_words_not_the_specials(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    ids = tok.encode("你 <blank> 好 <unk> hello <sos/eos>")
    assert ids == [2, tok.unk_id, 3, tok.unk_id, 4, tok.unk_id] and tok.blank_id not in ids
    assert (tok.num_unknown, tok.num_tokens) == (3, 6)
    assert [tok.token_id(t) for t in ("<blank>", "<unk>", "<sos/eos>", "hello")] == [None, None, None, 4]
    assert tok.encode("<BLANK>") == [tok.unk_id] == tiny_tokenizer(tmp_path, lowercase=True).encode("<BLANK>")


def test_renamed_blank_and_unk_are_special_in_a_transcript_too(tmp_path):
    tok = tiny_tokenizer(tmp_path, blank="<eps>", unk="<oov>")
    assert tok.encode("<eps> <oov> 你") == [tok.unk_id, tok.unk_id, 2] and tok.num_unknown == 2


def test_cjk_spaces_are_removed_only_between_cjk(tmp_path, fixture_corpus):
    path = _make(tmp_path, fixture_corpus, latin_unit="letter")
    keep = build_tokenizer(TokenizerConf(type="char", latin_unit="letter", token_list=path, remove_cjk_spaces=False))
    drop = build_tokenizer(TokenizerConf(type="char", latin_unit="letter", token_list=path))
    assert keep.tokenize("今天 天气") == ["今", "天", "▁", "天", "气"]
    assert drop.tokenize("今天 天气 nice") == ["今", "天", "天", "气", "▁", "n", "i", "c", "e"]


def test_lowercase_option(tmp_path, fixture_corpus):
    path = _make(tmp_path, fixture_corpus)
    assert build_tokenizer(TokenizerConf(token_list=path, lowercase=True)).encode("HELLO") == \
        build_tokenizer(TokenizerConf(token_list=path)).encode("hello")


def test_word_tokenizer_uses_jieba_for_chinese(tmp_path, fixture_corpus):
    path = _make(tmp_path, fixture_corpus, type="word")
    tok = build_tokenizer(TokenizerConf(type="word", token_list=path))
    words = tok.tokenize("我们一起学习语音识别 hello world")
    assert "我们" in words and words[-2:] == ["hello", "world"]
    assert tok.decode(tok.encode("北京欢迎你")) == "北京欢迎你" and tok.num_unknown == 0


def test_bpe_trains_sentencepiece_next_to_output_and_round_trips(tmp_path, fixture_corpus):
    start = time.perf_counter()
    path = _make(tmp_path, fixture_corpus, "bpe.txt", type="bpe", vocab_size=120)
    assert time.perf_counter() - start < 5 * load_scale()
    assert (tmp_path / "bpe.model").is_file()
    tok = build_tokenizer(TokenizerConf(type="bpe", token_list=path, bpe_model=str(tmp_path / "bpe.model")))
    assert tok.decode(tok.encode("今天 的 meeting 取消了")) == "今天的 meeting 取消了"
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.num_unknown == 0
    tok.encode("zebra ☃")
    assert tok.num_unknown >= 1


def test_missing_token_list_is_a_config_error_naming_make_tokenizer():
    with pytest.raises(ConfigError, match="make-tokenizer"):
        build_tokenizer(TokenizerConf(type="char"))


def test_token_list_with_id_gap_names_file(tmp_path):
    bad = tmp_path / "units.txt"
    bad.write_text("<blank> 0\n<unk> 1\na 3\n", encoding="utf-8")
    with pytest.raises(DataError, match="units.txt"):
        read_token_list(str(bad))


def test_make_tokenizer_cli_reads_jsonl(tmp_path):
    src = tmp_path / "train.jsonl"
    src.write_text('{"key": "a", "source": "x.wav", "target": "你好 world"}\n', encoding="utf-8")
    result = run_cli("corpus-io", "make-tokenizer", f"++input={src}", f"++output={tmp_path / 'units.txt'}")
    assert result.returncode == 0, result.stderr
    assert "vocab_size 6" in result.stderr
    assert read_token_list(str(tmp_path / "units.txt")) == ["<blank>", "<unk>", "world", "你", "好", "<sos/eos>"]


@pytest.mark.parametrize("content, needles", [
    ("a 你好\nb\nc world\n", ["text:2", "'b'", "no transcript"]),
    ("a 你好\nb world\n\na again\n", ["duplicate key 'a'", "text:1", "text:4"]),
    ("\n", ["text has no utterances"]),
])
def test_make_tokenizer_rejects_bad_kaldi_text_and_writes_nothing(tmp_path, content, needles):
    src = tmp_path / "text"
    src.write_text(content, encoding="utf-8")
    for kind in ("char", "bpe"):
        with pytest.raises(DataError) as info:
            make_tokenizer(MakeTokenizerConfig(input=str(src), output=str(tmp_path / "out" / "units.txt"),
                                               tokenizer=TokenizerConf(type=kind), vocab_size=10))
        assert all(n in str(info.value) for n in needles), (kind, str(info.value))
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_make_tokenizer_cli_duplicate_key_is_a_user_error(tmp_path):
    src = tmp_path / "text"
    src.write_text("a 你好\na world\n", encoding="utf-8")
    result = run_cli("corpus-io", "make-tokenizer", f"++input={src}", f"++output={tmp_path / 'units.txt'}")
    assert_user_error(result, "duplicate key 'a'", "text:1", "text:2")
    assert result.returncode == 2 and not (tmp_path / "units.txt").exists()


def test_make_tokenizer_empty_jsonl_is_an_error(tmp_path):
    src = tmp_path / "train.jsonl"
    src.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="train.jsonl has no utterances"):
        make_tokenizer(MakeTokenizerConfig(input=str(src), output=str(tmp_path / "units.txt")))
    assert not (tmp_path / "units.txt").exists()


def test_bpe_vocab_below_the_character_count_says_to_raise_vocab_size(tmp_path, fixture_corpus):
    with pytest.raises(ConfigError) as info:
        _make(tmp_path, fixture_corpus, "bpe.txt", type="bpe", vocab_size=8)
    message = str(info.value)
    assert "raise ++vocab_size" in message and "Lower" not in message, message
