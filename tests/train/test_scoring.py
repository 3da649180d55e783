from corpus_io.train.scoring import Scorer, char_units, edit_counts, word_units


def test_edit_counts_separate_substitutions_insertions_and_deletions():
    c = edit_counts(list("abcd"), list("axcde"))
    assert (c.sub, c.ins, c.dele, c.ref) == (1, 1, 0, 4)
    c = edit_counts("one two three".split(), "one three".split())
    assert (c.sub, c.ins, c.dele, c.errors) == (0, 0, 1, 1)
    assert edit_counts([], ["x"]).ins == 1 and edit_counts(["x"], []).dele == 1


def test_chinese_is_scored_by_characters_english_by_words_mixed_by_both():
    assert word_units("今天 天气") == ["今", "天", "天", "气"]
    assert word_units("打开 wifi 设置") == ["打", "开", "wifi", "设", "置"]
    assert word_units("the quick fox") == ["the", "quick", "fox"]
    assert char_units("hi 你好") == ["h", "i", "你", "好"]


def test_scorer_report_has_totals_and_per_utterance_errors():
    s = Scorer()
    s.add("u1", "我喜欢 python 编程", "我喜欢 java 编程")
    s.add("u2", "one two three", "one two three")
    report = s.report()
    assert report.startswith("%CER")
    assert "%WER 11.11 [ 1 / 9, 0 ins, 0 del, 1 sub ]" in report  # 6 units + 3 words
    assert "u1 cer 6/11" in report and "u2 cer 0/11" in report
    assert "ref: 我喜欢 python 编程" in report and "hyp: 我喜欢 java 编程" in report
