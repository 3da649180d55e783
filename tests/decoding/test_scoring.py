import pytest

from corpus_io.decoding.scoring import Scorer, char_units, edit_counts, word_units


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


def kaldi_compute_wer_counts(ref: list[str], hyp: list[str]) -> tuple[int, int, int]:
    """``(ins, del, sub)`` by the recursion of Kaldi's ``LevenshteinEditDistance`` (util/edit-distance-inl.h),
    which compute-wer calls: one row per hyp symbol over ref positions, unit costs, and on a tie a
    substitution is taken only when strictly cheaper than both others, else a deletion when strictly
    cheaper than an insertion, else an insertion. Written here from that rule, independent of kaldialign."""
    row = [(0, r, 0, r) for r in range(len(ref) + 1)]  # (ins, del, sub, cost)
    for h in hyp:
        cur = [(row[0][0] + 1, row[0][1], row[0][2], row[0][3] + 1)]
        for r in range(1, len(ref) + 1):
            ins_cost, del_cost = row[r][3] + 1, cur[r - 1][3] + 1
            wrong = int(h != ref[r - 1])
            sub_cost = row[r - 1][3] + wrong
            if sub_cost < ins_cost and sub_cost < del_cost:
                i, d, s, _ = row[r - 1]
                cur.append((i, d, s + wrong, sub_cost))
            elif del_cost < ins_cost:
                i, d, s, _ = cur[r - 1]
                cur.append((i, d + 1, s, del_cost))
            else:
                i, d, s, _ = row[r]
                cur.append((i + 1, d, s, ins_cost))
        row = cur
    return row[-1][:3]


def _test_pairs(fixture_corpus) -> list[tuple[str, str]]:
    """Real transcripts of the fixture corpus (zh, en, mixed) against seeded random edits of them."""
    import random

    rng = random.Random(13)
    refs = [line.split(maxsplit=1)[1] for line in (fixture_corpus / "text").read_text(encoding="utf-8").splitlines()]
    vocab = sorted({u for r in refs for u in word_units(r)})
    pairs = []
    for _ in range(60):
        for ref in refs:
            units = word_units(ref)
            for _ in range(rng.randint(0, 4)):
                op, pos = rng.choice("sid"), rng.randint(0, len(units))
                if op == "i":
                    units.insert(pos, rng.choice(vocab))
                elif units and pos < len(units):
                    if op == "s":
                        units[pos] = rng.choice(vocab)
                    else:
                        del units[pos]
            pairs.append((ref, " ".join(units)))
    return pairs


@pytest.mark.parametrize("binding", ["compiled", "public"])
def test_sub_ins_del_split_and_totals_equal_kaldi_compute_wer_on_real_transcripts(fixture_corpus, binding, monkeypatch):
    import kaldialign

    from corpus_io.decoding import scoring

    monkeypatch.setattr(scoring, "_ALIGN", kaldialign.edit_distance if binding == "public" else None)
    pairs = _test_pairs(fixture_corpus)
    scorer = Scorer()
    totals = [0, 0, 0, 0]
    tie_cases = 0
    for n, (ref, hyp) in enumerate(pairs):
        c, w = scorer.add(f"u{n}", ref, hyp)
        for units, got in ((word_units, w), (char_units, c)):
            ins, dele, sub = kaldi_compute_wer_counts(units(ref), units(hyp))
            assert (got.ins, got.dele, got.sub) == (ins, dele, sub), (ref, hyp)
        ins, dele, sub = kaldi_compute_wer_counts(word_units(ref), word_units(hyp))
        totals = [totals[0] + ins, totals[1] + dele, totals[2] + sub, totals[3] + len(word_units(ref))]
        tie_cases += sub and (ins or dele)
    assert (scorer.wer.ins, scorer.wer.dele, scorer.wer.sub, scorer.wer.ref) == tuple(totals)
    assert tie_cases > 0  # the set holds alignments where the tie rule decides the split


def test_kaldi_tie_rule_prefers_deletion_and_insertion_over_an_equal_cost_substitution():
    # 'a b' -> 'b c': Kaldi reports 1 del + 1 ins (a deleted, c inserted), not 2 substitutions
    c = edit_counts(["a", "b"], ["b", "c"])
    assert (c.sub, c.ins, c.dele) == (0, 1, 1)
    assert kaldi_compute_wer_counts(["a", "b"], ["b", "c"]) == (1, 1, 0)


def test_split_equals_kaldi_on_random_pairs_over_small_alphabets_where_ties_abound():
    import random

    rng = random.Random(7)
    for _ in range(3000):
        ref = [rng.choice("abc") for _ in range(rng.randint(0, 10))]
        hyp = [rng.choice("abcd") for _ in range(rng.randint(0, 10))]
        c = edit_counts(ref, hyp)
        assert (c.ins, c.dele, c.sub) == kaldi_compute_wer_counts(ref, hyp), (ref, hyp)


def test_the_report_lists_the_most_frequent_confusions_and_hotword_recall():
    s = Scorer(hotwords=["北京", "kaldi"])
    s.add("u1", "北京 天气 kaldi", "背景 天气 caldy", unbiased="背景天气 caldy")
    s.add("u2", "北京欢迎你", "北京欢迎", unbiased="背景欢迎")
    s.add("u3", "use kaldi now", "use kaldi", unbiased="use kaldi now")
    table = s.confusion_table()
    rows = [line.split() for line in table.splitlines()[1:]]
    assert rows[0] == ["1", "kaldi", "->", "caldy"] or ["1", "北", "->", "背"] in rows
    assert ["1", "你", "->", "*"] in rows and ["1", "now", "->", "*"] in rows
    assert len(rows) == 5  # 北->背, 京->景, kaldi->caldy, 你->*, now->*
    assert s.hotword_recall() == (2 / 4, 1 / 4)  # 北京 x2, kaldi x2: found 2 (u2, u3), without hotwords 1 (u3)
    assert "hotword recall 50.00% [ 2 / 4 occurrences of 2 hotwords ]; without hotwords 25.00%" in s.summary()
