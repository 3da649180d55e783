"""n-gram language models: ``make-lm`` (interpolated modified Kneser-Ney, written as ARPA, no external
binary) and ``ctc_beam_lm``: shallow fusion of the n-gram into the batched CTC prefix beam search
(:class:`LmFusion`), on the device, with no extra package.

torchaudio's ``ctc_decoder`` (flashlight-text) was measured first and left out: with a lexicon it needs
a word-boundary token the CTC model emits (wav2letter's ``|``); our token lists have none, and without
it the decoder never takes a blank between words (every hypothesis garbage, score about -30 where the
right one is -2.4 on a synthetic test); lexicon-free, its scores did not follow the LM (a confusion an
n-gram of weight 1.0 should flip by 7.8 nats moved by 0.17).

Estimation follows Chen & Goodman (1998) as KenLM's ``lmplz`` does: the highest order uses raw
counts, lower orders continuation counts (the number of distinct words seen before), except n-grams
that start with ``<s>``, which keep raw counts; three discounts per order from the counts of counts
(D1, D2, D3+; when the text is too small for them, KenLM's fallback 0.5, 1.0, 1.5, as
``--discount_fallback``); every order interpolated with the one below and the unigrams with the
uniform distribution over the vocabulary (``<unk>`` gets only that share). Interpolated KN is exactly
a backoff model, so the ARPA holds each seen n-gram's interpolated probability and each context's
interpolation weight as its backoff.

Units: ``unit=token`` estimates over the tokenizer's tokens (CJK characters, words or letters, BPE
pieces): what ``ctc_beam_lm`` fuses; ``unit=word`` over whitespace words (an LM for other tools, e.g.
a lexicon decoder, or for a char tokenizer whose Latin unit is the word, where words are tokens).
"""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Iterator

from corpus_io.errors import ConfigError, DataError, excerpt

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
SIL = "<corpus-io-word-boundary>"
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)
NEG_LOG10 = -99.0  # ARPA's "impossible" (<s> as a predicted word)
LEXICON_MISS = -1e4  # a word outside decoding.lexicon: charged once, so such a hypothesis survives only where the
# beam holds nothing else (an utterance no vocabulary word fits still gets its best guess, and no score is -inf)
ARPA_MAX_LOG10 = 1000.0  # |log10| bound of a read probability or backoff: no n-gram of a text is near it, and
# 1e308 would overflow the fused scores to inf (and nan)


# --------------------------------------------------------------------------- estimation


def kneser_ney(sentences: Iterable[list[str]], order: int) -> tuple[list[dict], list[dict], list[tuple]]:
    """``(probs, backoffs, discounts)``: per order n (index n-1), ``probs[n-1][ngram]`` the interpolated
    probability of every seen n-gram, ``backoffs[n-1][context]`` the weight of each n-gram that is a
    context of a longer one, and the (D1, D2, D3+) used at each order."""
    counts: list[Counter] = [Counter() for _ in range(order)]
    vocab: set[str] = set()
    for words in sentences:
        seq = [BOS, *words, EOS]
        vocab.update(words)
        for n in range(1, order + 1):
            for i in range(max(0, 1 if n == 1 else 0), len(seq) - n + 1):
                counts[n - 1][tuple(seq[i:i + n])] += 1
    if not vocab and not counts[0]:
        raise DataError("the text has no sentences to estimate an LM from.")
    # adjusted counts: continuation counts below the top order, except n-grams that start with <s>
    adjusted: list[Counter] = [Counter() for _ in range(order)]
    adjusted[order - 1] = counts[order - 1]
    for n in range(order - 1, 0, -1):
        for gram in counts[n]:  # a distinct left extension of gram[1:]
            adjusted[n - 1][gram[1:]] += 1
        for gram, c in counts[n - 1].items():
            if gram[0] == BOS:
                adjusted[n - 1][gram] = c
    adjusted[0].pop((BOS,), None)
    discounts = [_discounts(adjusted[n]) for n in range(order)]
    vocab_size = len(vocab | {EOS, UNK})
    probs: list[dict] = [dict() for _ in range(order)]
    backoffs: list[dict] = [dict() for _ in range(order)]
    for n in range(1, order + 1):
        by_context: dict[tuple, list[tuple[tuple, int]]] = defaultdict(list)
        for gram, c in adjusted[n - 1].items():
            by_context[gram[:-1]].append((gram, c))
        d = discounts[n - 1]
        for context, grams in by_context.items():
            total = sum(c for _, c in grams)
            kinds = [0, 0, 0]
            for _, c in grams:
                kinds[min(c, 3) - 1] += 1
            gamma = (d[0] * kinds[0] + d[1] * kinds[1] + d[2] * kinds[2]) / total
            for gram, c in grams:
                lower = (1.0 / vocab_size) if n == 1 else probs[n - 2][gram[1:]]
                probs[n - 1][gram] = (c - d[min(c, 3) - 1]) / total + gamma * lower
            if n == 1:
                probs[0][(UNK,)] = probs[0].get((UNK,), 0.0) + gamma / vocab_size
                for w in vocab | {EOS}:  # every word gets the uniform share, seen or not
                    if (w,) not in probs[0]:
                        probs[0][(w,)] = gamma / vocab_size
            else:
                backoffs[n - 2][context] = gamma
    return probs, backoffs, discounts


def _discounts(counts: Counter) -> tuple[float, float, float]:
    """Modified KN discounts from the counts of counts; KenLM's fallback when the text is too small."""
    n = Counter(c for c in counts.values() if c <= 4)  # n_k: n-grams seen exactly k times
    n1, n2, n3, n4 = (n.get(k, 0) for k in (1, 2, 3, 4))
    if not (n1 and n2 and n3 and n4):
        return FALLBACK_DISCOUNTS
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    if not all(0 < x <= k + 1 for k, x in enumerate(d)):
        return FALLBACK_DISCOUNTS
    return d


def write_arpa(path: str | Path, probs: list[dict], backoffs: list[dict]) -> None:
    from corpus_io.storage.files import atomic_write

    order = len(probs)
    entries = [dict(p) for p in probs]
    entries[0][(BOS,)] = 0.0  # listed (it has a backoff) but never predicted
    with atomic_write(path) as f:
        f.write("\n\\data\\\n")
        for n in range(order):
            f.write(f"ngram {n + 1}={len(entries[n])}\n")
        for n in range(order):
            f.write(f"\n\\{n + 1}-grams:\n")
            for gram in sorted(entries[n]):
                p = entries[n][gram]
                logp = NEG_LOG10 if gram == (BOS,) else math.log10(p)
                line = f"{logp:.7f}\t{' '.join(gram)}"
                if n < order - 1 and gram in backoffs[n]:
                    line += f"\t{math.log10(backoffs[n][gram]):.7f}"
                f.write(line + "\n")
        f.write("\n\\end\\\n")


class Arpa:
    """A read ARPA model: ``logprob(word, context)`` (log10, with backoff) and sentence scoring.

    The file is checked as it is read, by KenLM's rules, so a truncated, edited or foreign file is refused
    naming its line rather than fused: UTF-8 text; ``\\data\\`` first (after blank or ``#`` lines); one
    ``ngram N=count`` per order from 1; each ``\\N-grams:`` section in order, with exactly ``count`` entries of
    a log10 probability (finite, in [-ARPA_MAX_LOG10, 0]), N words and, below the highest order, an optional
    finite backoff; ``\\end\\`` last.
    """

    def __init__(self, path: str | Path) -> None:
        from corpus_io.storage.files import iter_raw_lines

        self.path = str(path)
        self.prob: dict[tuple, float] = {}
        self.backoff: dict[tuple, float] = {}
        prob, backoff = self.prob, self.backoff
        counts: list[tuple[int, int]] = []  # per order: (n-grams the header announces, its line)
        section = entries = 0  # the section being read (0: the header) and its entries so far
        started = False
        lineno = 0
        for lineno, raw in iter_raw_lines(path, what="ARPA file"):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise self._bad(lineno, f"the line is not UTF-8 text (byte {exc.start} of the line; a binary LM "
                                        f"such as KenLM's build_binary output cannot be read)") from None
            if not started:
                if line == "\\data\\":
                    started = True
                elif line and not line.startswith("#"):
                    raise self._bad(lineno, f"the line holds {excerpt(line)} where the ARPA header \\data\\ should "
                                            f"begin (only blank lines and # comments may come before it)")
                continue
            if not line:
                continue
            if line.startswith("\\"):
                if section:  # a section ends: it must hold what the header announced
                    self._check_count(section, entries, counts, lineno)
                if line == "\\end\\" and section and section == len(counts):
                    break
                if not counts:
                    raise self._bad(lineno, "the \\data\\ header ends without an 'ngram 1=count' line")
                if line != f"\\{section + 1}-grams:" or section + 1 > len(counts):
                    want = f"\\{section + 1}-grams:" if section < len(counts) else "\\end\\"
                    raise self._bad(lineno, f"the line holds {excerpt(line)} where {want} should come (the header "
                                            f"announces {len(counts)} order{'s' if len(counts) > 1 else ''})")
                section, entries = section + 1, 0
                continue
            if not section:
                if not line.startswith("ngram "):
                    raise self._bad(lineno, f"the line holds {excerpt(line)} in the \\data\\ header, which lists "
                                            f"only 'ngram N=count' lines")
                order, _, count = line[6:].partition("=")
                if order.strip() != str(len(counts) + 1) or not count.strip().isdigit():
                    raise self._bad(lineno, f"the line holds {excerpt(line)}; the header's lines must be 'ngram "
                                            f"N=count' with N = 1, 2, ... in order and a count >= 0")
                counts.append((int(count), lineno))
                continue
            entries += 1  # an n-gram line, ``log10p w1 .. wn [backoff]`` (the fast path; _refuse_entry says why not)
            parts = line.split()
            width = len(parts) - section  # 1: no backoff, 2: a backoff
            try:
                logp = float(parts[0])
                bo = float(parts[-1]) if width == 2 else 0.0
            except ValueError:
                logp = bo = math.nan
            gram = tuple(parts[1:section + 1])
            if (width != 1 and (width != 2 or section == len(counts)) or not -ARPA_MAX_LOG10 <= logp <= 0.0
                    or not -ARPA_MAX_LOG10 <= bo <= ARPA_MAX_LOG10 or gram in prob):
                raise self._refuse_entry(parts, line, lineno, section, last=section == len(counts))
            prob[gram] = logp
            if width == 2:
                backoff[gram] = bo
        else:
            if not started:
                raise self._bad(lineno, f"the file {'ends' if lineno else 'is empty'}, without the ARPA header "
                                        f"\\data\\ (an ARPA file is what corpus-io make-lm or KenLM's lmplz write)")
            where = f"the \\{section}-grams: section ({entries} entries)" if section else "the \\data\\ header"
            raise self._bad(lineno, f"the file ends inside {where}, and \\end\\ never comes: it is truncated")
        self.order = len(counts)
        self.vocab = {g[0] for g in self.prob if len(g) == 1}
        self.known = self.vocab - {BOS, EOS, UNK}  # the words a decoder may call known (not <unk>)

    def _refuse_entry(self, parts: list[str], line: str, lineno: int, n: int, *, last: bool) -> DataError:
        """Why an n-gram line of section ``n`` is refused."""
        if len(parts) not in ((n + 1,) if last else (n + 1, n + 2)):
            fields = f"a log10 probability and {n} word{'s' if n > 1 else ''}" + ("" if last else ", then a backoff "
                                                                                   "or nothing")
            return self._bad(lineno, f"the line holds {excerpt(line)}, not an entry of the \\{n}-grams: section "
                                     f"({fields})")
        self._number(parts[0], lineno, "log10 probability", -ARPA_MAX_LOG10, 0.0)
        if len(parts) == n + 2:
            self._number(parts[-1], lineno, "backoff weight", -ARPA_MAX_LOG10, ARPA_MAX_LOG10)
        return self._bad(lineno, f"the line gives the {n}-gram {excerpt(' '.join(parts[1:n + 1]))} a second time")

    def _number(self, text: str, lineno: int, what: str, low: float, high: float) -> float:
        try:
            value = float(text)
        except ValueError:
            raise self._bad(lineno, f"the line has the {what} {excerpt(text)}, which is not a number") from None
        if not low <= value <= high:  # also nan and inf
            raise self._bad(lineno, f"the line has the {what} {excerpt(text)}, not a finite number in [{low:g}, "
                                    f"{high:g}] (log10; ARPA's 'impossible' is {NEG_LOG10:g})")
        return value

    def _check_count(self, section: int, entries: int, counts: list[tuple[int, int]], lineno: int) -> None:
        announced, at = counts[section - 1]
        if entries != announced:
            raise self._bad(lineno, f"the \\{section}-grams: section ends after {entries} entries, but the header "
                                    f"announces ngram {section}={announced} (line {at}): the file was cut or edited")

    def _bad(self, lineno: int, what: str) -> DataError:
        where = f"{self.path}:{lineno}" if lineno else self.path
        return DataError(f"{where}: {what}, so {self.path} is not a whole, valid ARPA n-gram "
                         f"file and is not used. Write it again (corpus-io make-lm ++output=...) and copy it whole.")

    def __repr__(self) -> str:
        return f"Arpa({self.path!r}, order {self.order})"

    def logprob(self, word: str, context: tuple[str, ...]) -> float:
        """log10 p(word | context) by backoff; an unknown word is ``<unk>``."""
        if word not in self.vocab:
            word = UNK
        context = context[len(context) - self.order + 1:] if self.order > 1 else ()
        penalty = 0.0
        while True:
            gram = (*context, word)
            if gram in self.prob:
                return penalty + self.prob[gram]
            if not context:
                return penalty + self.prob.get((UNK,), NEG_LOG10)
            penalty += self.backoff.get(context, 0.0)
            context = context[1:]

    def sentence_logprob(self, words: list[str]) -> float:
        seq = [BOS, *words, EOS]
        return sum(self.logprob(w, tuple(seq[max(0, i - self.order + 1):i])) for i, w in enumerate(seq) if i)


def perplexity(lm: Arpa, sentences: Iterable[list[str]]) -> float:
    total, n = 0.0, 0
    for words in sentences:
        total += lm.sentence_logprob(words)
        n += len(words) + 1
    return 10 ** (-total / max(n, 1))


# --------------------------------------------------------------------------- make-lm


def iter_sentences(path: str, fmt: str) -> Iterator[str]:
    """Transcripts of a JSONL, a Kaldi ``text`` or a plain text file (``fmt`` auto: jsonl by name or first
    line, Kaldi for a file named ``text`` or ``*.text``, else plain)."""
    from corpus_io.tokenizer import _looks_like_jsonl, iter_texts

    if fmt == "auto":
        name = Path(path).name
        fmt = "jsonl" if _looks_like_jsonl(path) else "kaldi" if name == "text" or name.endswith(".text") else "plain"
    if fmt in ("jsonl", "kaldi"):
        yield from iter_texts(path)
        return
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield line.strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}. ++input must be a UTF-8 JSONL, Kaldi text or plain "
                        f"text.") from None


def lm_units(text: str, tokenizer: Any, unit: str) -> list[str]:
    """The LM words of one transcript: the tokenizer's tokens, or whitespace words after its normalisation."""
    if unit == "word":
        return tokenizer.normalize(text).split()
    return tokenizer.tokenize(text)


def make_lm(cfg: Any) -> dict:
    """``corpus-io make-lm``: estimate and write the ARPA; print its size and training-text perplexity."""
    from corpus_io.config import require
    from corpus_io.storage.files import refuse_overwriting_inputs, refuse_remote_output
    from corpus_io.storage.progress import progress
    from corpus_io.tokenizer import Tokenizer, build_tokenizer, char_split

    require(cfg, "input", "output")
    refuse_remote_output(cfg.output, "++output", "make-lm")  # before the text is read or anything written
    refuse_overwriting_inputs([("++output", cfg.output)],
                              [("++input", cfg.input), ("++tokenizer.token_list", cfg.tokenizer.token_list),
                               ("++tokenizer.bpe_model", cfg.tokenizer.bpe_model)])
    if cfg.tokenizer.token_list or cfg.tokenizer.type == "bpe":
        tokenizer = build_tokenizer(cfg.tokenizer)
    elif cfg.tokenizer.type == "char":  # no token list: the split alone (the LM vocabulary comes from the text)
        tokenizer = Tokenizer([cfg.tokenizer.blank, cfg.tokenizer.unk],
                              char_split(cfg.tokenizer.latin_unit, cfg.tokenizer.space), cfg.tokenizer)
    else:
        raise ConfigError("make-lm with tokenizer.type=word or bpe needs the model's tokenizer "
                          "(++tokenizer.token_list=..., and tokenizer.bpe_model for bpe).")
    sentences = [lm_units(t, tokenizer, cfg.unit)
                 for t in progress(iter_sentences(cfg.input, cfg.input_format), desc="make-lm", unit="lines")]
    if not any(sentences):
        n = len(sentences)
        read = f"{n} transcript{'' if n == 1 else 's'}, none with a {cfg.unit}" if n else "not one transcript"
        raise DataError(f"make-lm: {cfg.input} holds no text to estimate an LM from ({read}), so nothing was "
                        f"written to {cfg.output}. Give ++input the training transcripts: a JSONL with 'target' (or "
                        f"'txt'), a Kaldi text ('key transcript' lines) or plain text, one sentence a line.")
    probs, backoffs, discounts = kneser_ney(sentences, cfg.order)
    write_arpa(cfg.output, probs, backoffs)
    ppl = perplexity(Arpa(cfg.output), sentences)
    summary = {"sentences": len(sentences), "order": cfg.order, "unit": cfg.unit,
               "ngrams": [len(p) for p in probs], "perplexity": round(ppl, 3),
               "discounts": [[round(x, 4) for x in d] for d in discounts], "output": str(cfg.output)}
    if any(d == FALLBACK_DISCOUNTS for d in discounts):
        print("make-lm: the text is too small for modified Kneser-Ney discounts at some order (a count of "
              "counts is 0); KenLM's fallback discounts 0.5 1.0 1.5 were used there.", file=sys.stderr)
    print("[make-lm] " + "; ".join(f"{k} {v}" for k, v in summary.items()), file=sys.stderr, flush=True)
    return summary


# --------------------------------------------------------------------------- ctc_beam_lm


def room_for(table: Any, row: int) -> Any:
    """``table`` (states along its first dimension, on the device), doubled (at least 64 rows) when ``row`` lies
    past its end, so a fusion's per-state table grows in amortised O(1) as the search meets new states."""
    import torch

    if row < table.shape[0]:
        return table
    grown = torch.zeros((max(64, 2 * table.shape[0]), *table.shape[1:]), dtype=table.dtype, device=table.device)
    grown[:table.shape[0]] = table
    return grown


def sentence_bonus(arpa: Arpa, words: list[str], weight: float, word_score: float, unk_score: float = 0.0) -> float:
    """A fusion's score of a whole hypothesis spelling ``words`` (the final ranking, with ``</s>``): ``weight``
    times its natural-log probability plus ``word_score`` per LM unit and ``unk_score`` per unit outside the LM's
    vocabulary (:func:`known_words`)."""
    known = known_words(arpa)
    return (weight * math.log(10) * arpa.sentence_logprob(words) + word_score * len(words)
            + unk_score * sum(1 for w in words if w not in known))


def known_words(arpa: Arpa) -> set[str]:
    """The LM's vocabulary as the decoder sees it: its unigrams but ``<s>``, ``</s>`` and ``<unk>`` (an
    ``<unk>`` token of the model is an unknown word too)."""
    return arpa.known


def start_states(start: int, batch: int, beam: int, device: Any) -> Any:
    """Every prefix of a new search in a fusion's start state: ``(batch, beam)`` state ids."""
    import torch

    return torch.full((batch, beam), start, dtype=torch.long, device=device)


class LmFusion:
    """Shallow fusion of an ARPA n-gram into :func:`corpus_io.decoding.beam.ctc_prefix_beam_search`:
    each appended token earns ``lm_weight * ln p(token | previous tokens) + word_score``, and the final
    ranking adds ``lm_weight * ln p(</s> | ...)``. LM words are the model's tokens (``make-lm
    ++unit=token`` with the model's tokenizer); a token the LM does not know is its ``<unk>`` and earns
    ``unk_score`` more (decoding.unk_score), or, with ``lexicon``, :data:`LEXICON_MISS` (pruned).

    A prefix's LM state is its last ``order - 1`` tokens; each state's log-probabilities over the whole
    vocabulary are one row of a table on the device, built once per state by backoff (the lower order's
    row plus the backoff weight, with the n-grams seen after that context written over it), so the
    batched search scores every candidate with one gather.
    """

    unit = "token"  # what the LM's words are (decoding.lm_unit)

    def __init__(self, path: str | Arpa, tokenizer: Any, lm_weight: float, word_score: float,
                 device: Any = "cpu", *, unk_score: float = 0.0, lexicon: bool = False) -> None:
        import torch

        self.arpa = path if isinstance(path, Arpa) else Arpa(path)
        self.weight, self.word_score = float(lm_weight), float(word_score)
        self.device = device
        self.words = [s if s in self.arpa.vocab else UNK for s in tokenizer.symbols]
        # what a token outside the LM's vocabulary earns on top of the LM's <unk> probability
        self.unk_score = LEXICON_MISS if lexicon else float(unk_score)
        self.unknown = torch.tensor([0.0 if w in known_words(self.arpa) else self.unk_score for w in self.words],
                                    device=device)
        self.id_of = {w: i for i, w in enumerate(tokenizer.symbols) if w in self.arpa.vocab}
        known = set(self.id_of) - {BOS, EOS, UNK}
        lm = self.arpa.path
        if not known:
            raise ConfigError(f"no word of decoding.lm={lm} is a token of the model's token list: ctc_beam_lm fuses "
                              f"an LM over the model's tokens. Make it with corpus-io make-lm ++unit=token and the "
                              f"model's tokenizer block (++tokenizer.token_list=...).")
        unknown = len(self.arpa.vocab - known - {BOS, EOS, UNK})
        if unknown > len(known):
            print(f"warning: {unknown} words of decoding.lm={lm} are not tokens of the model (only {len(known)} are); "
                  f"was it made with the model's tokenizer (make-lm ++unit=token ++tokenizer...)?",
                  file=sys.stderr, flush=True)
        self.seen: dict[tuple, list[tuple[int, float]]] = defaultdict(list)  # context -> (token id, log10 p)
        for gram, logp in self.arpa.prob.items():
            if gram[-1] in self.id_of:
                self.seen[gram[:-1]].append((self.id_of[gram[-1]], logp))
        unk = self.arpa.prob.get((UNK,), NEG_LOG10)
        base = torch.full((len(self.words),), unk, dtype=torch.float64)
        for i, lp in self.seen[()]:
            base[i] = lp
        self._rows_cpu: dict[tuple, Any] = {(): base}
        self.keys: list[tuple] = []
        self.state_of: dict[tuple, int] = {}
        self.table = torch.zeros((0, len(self.words)), device=device)
        self.start = self._state((BOS,))

    def _row(self, context: tuple) -> Any:
        row = self._rows_cpu.get(context)
        if row is None:
            row = self._row(context[1:]) + self.arpa.backoff.get(context, 0.0)
            row = row.clone()
            for i, lp in self.seen.get(context, ()):
                row[i] = lp
            self._rows_cpu[context] = row
        return row

    def _state(self, context: tuple) -> int:
        context = context[len(context) - self.arpa.order + 1:] if self.arpa.order > 1 else ()
        sid = self.state_of.get(context)
        if sid is None:
            sid = len(self.keys)
            self.keys.append(context)
            self.state_of[context] = sid
            self.table = room_for(self.table, sid)
            self.table[sid] = (self._row(context) * math.log(10)).float().to(self.device)
        return sid

    def initial_state(self, batch: int, beam: int) -> Any:
        return start_states(self.start, batch, beam, self.device)

    def bonus(self, state: Any, tokens: Any) -> Any:
        rows = self.table[state]  # (B, K, V)
        return self.weight * rows.gather(2, tokens) + self.word_score + self.unknown[tokens]

    def advance(self, state: Any, token: Any) -> Any:
        import torch

        st, tk = state.cpu().tolist(), token.cpu().tolist()
        out = [[s if t < 0 else self._state((*self.keys[s], self.words[t])) for s, t in zip(srow, trow)]
               for srow, trow in zip(st, tk)]
        return torch.tensor(out, dtype=torch.long, device=state.device)

    def sequence_bonus(self, seqs: list[list[int]]) -> list[float]:
        return [sentence_bonus(self.arpa, [self.words[t] for t in seq], self.weight, self.word_score, self.unk_score)
                for seq in seqs]


def lm_fusion(conf: Any, tokenizer: Any, device: Any = "cpu") -> LmFusion | WordLmFusion:
    """The fusion of ``conf.lm`` (a ``DecodingConf``) for this model: over its tokens, or over words its tokens
    spell (``conf.lm_unit``; auto: words when the model's tokens spell words and most LM words are not tokens)."""
    arpa = Arpa(conf.lm)
    unit = conf.lm_unit
    if unit == "auto":
        words = arpa.vocab - {BOS, EOS, UNK}
        tokens = len(words & set(tokenizer.symbols))
        unit = "word" if word_pieces(tokenizer) is not None and 2 * tokens < len(words) else "token"
    fusion = WordLmFusion if unit == "word" else LmFusion
    return fusion(arpa, tokenizer, conf.lm_weight, conf.word_score, device, unk_score=conf.unk_score,
                  lexicon=conf.lexicon)


def word_pieces(tokenizer: Any) -> tuple[list[bool], list[str]] | None:
    """How the model's tokens spell words, or None when they are whole words or characters that no space
    separates: ``(starts, texts)`` per token id; ``starts[t]``: token ``t`` begins a new word (a sentencepiece
    piece with ``▁``, the space token of ``latin_unit=letter``, an ``<unk>``), ``texts[t]``: the letters it adds."""
    conf = tokenizer.conf
    if conf.type == "bpe":
        marker = "\u2581"
    elif conf.type == "char" and conf.latin_unit == "letter":
        marker = conf.space
    else:
        return None
    starts, texts = [], []
    for i, sym in enumerate(tokenizer.symbols):
        if i in (tokenizer.blank_id, tokenizer.sos_eos_id):
            starts.append(False)
            texts.append("")
        elif i == tokenizer.unk_id:  # an unknown piece: a word the LM can only call <unk>
            starts.append(True)
            texts.append(UNK)
        else:
            starts.append(sym.startswith(marker))
            texts.append(sym.removeprefix(marker) if conf.type == "bpe" or sym == marker else sym)
    return starts, texts


class WordLmFusion:
    """Shallow fusion of a word n-gram (``make-lm ++unit=word``) into the beam search of a model whose tokens
    spell words (sentencepiece BPE, or letters with a space token): a word earns ``lm_weight * ln p(word |
    previous words) + word_score`` once it is complete, when the next word begins (and the last one at the end,
    with ``</s>``, in :meth:`sequence_bonus`); the pieces inside a word earn nothing until then, as in
    pyctcdecode's word-level decoding without its partial-word heuristic. A prefix's state is its last
    ``order - 1`` words and the word it is spelling; each state's completion score is one entry of a tensor on
    the device, so the search's bonus is one gather.

    Unknown words: a word outside the LM's vocabulary is scored as its ``<unk>`` plus ``unk_score``
    (decoding.unk_score, added unweighted, as flashlight's unk score). With ``lexicon`` the words are limited
    to the LM's: a trie of the LM's words, each spelled as the tokenizer splits it, follows the word being
    spelled, and the first piece that leaves it (or a word that ends inside it) costs :data:`LEXICON_MISS`
    once per word, so such prefixes are pruned as soon as the beam holds others. The trie's edges are one
    sorted tensor of ``node * vocabulary + token`` keys on the device, looked up with ``searchsorted``."""

    unit = "word"

    def __init__(self, path: str | Arpa, tokenizer: Any, lm_weight: float, word_score: float,
                 device: Any = "cpu", *, unk_score: float = 0.0, lexicon: bool = False) -> None:
        import torch

        pieces = word_pieces(tokenizer)
        if pieces is None:
            raise ConfigError(f"decoding.lm_unit=word needs a model whose tokens spell words (tokenizer.type=bpe, or "
                              f"char with latin_unit=letter); this model's tokens are {tokenizer.conf.type} units: "
                              f"make the LM with corpus-io make-lm ++unit=token and the model's tokenizer block.")
        self.arpa = path if isinstance(path, Arpa) else Arpa(path)
        self.weight, self.word_score, self.device = float(lm_weight), float(word_score), device
        self.unk_score, self.lexicon = float(unk_score), bool(lexicon)
        self.starts, self.texts = pieces
        self.starts_mask = torch.tensor(self.starts, dtype=torch.bool, device=device)
        self.vocab_size = len(self.starts)
        self.edges: dict[tuple[int, int], int] = {}  # the lexicon trie: (node, token) -> node; node 0 the root
        self.word_end = [False]
        if self.lexicon:
            self._build_trie(tokenizer)
        keys = sorted(n * self.vocab_size + t for n, t in self.edges)
        self.edge_keys = torch.tensor(keys or [-1], dtype=torch.long, device=device)
        # a word-starting piece's cost: none for the space token (it spells nothing), a miss when no LM word
        # begins with it
        self.start_cost = torch.tensor([0.0 if not self.lexicon or not t or (0, i) in self.edges else LEXICON_MISS
                                        for i, t in enumerate(self.texts)], device=device)
        # state -> (last order-1 words, the word being spelled, its trie node: -1 once it left the lexicon)
        self.keys: list[tuple[tuple[str, ...], str, int]] = []
        self.state_of: dict[tuple[tuple[str, ...], str, int], int] = {}
        self.step: dict[tuple[int, int], int] = {}  # (state, token) -> state
        self.done = torch.zeros(0, device=device)  # state -> the score its word earns when complete
        self.node = torch.zeros(0, dtype=torch.long, device=device)  # state -> its trie node
        self.start = self._state(((BOS,), "", 0))

    def _build_trie(self, tokenizer: Any) -> None:
        """The LM's words as paths of token ids (a leading piece that spells nothing, sentencepiece's lone
        ``▁``, left out: the search goes back to the root on it); words the tokens cannot spell are left out."""
        spelled = 0
        for word in sorted(self.arpa.known):
            ids = [tokenizer.token_id(t) for t in tokenizer.tokenize(word)]
            while ids and ids[0] is not None and self.starts[ids[0]] and not self.texts[ids[0]]:
                ids = ids[1:]
            if (not ids or any(i is None or i == tokenizer.unk_id for i in ids) or any(self.starts[i] for i in ids[1:])
                    or "".join(self.texts[i] for i in ids) != word):
                continue
            node = 0
            for t in ids:
                nxt = self.edges.get((node, t))
                if nxt is None:
                    nxt = self.edges[(node, t)] = len(self.word_end)
                    self.word_end.append(False)
                node = nxt
            self.word_end[node] = True
            spelled += 1
        if not spelled:
            raise ConfigError(f"decoding.lexicon=true: no word of decoding.lm={self.arpa.path} can be spelled with "
                              f"the model's tokens, so every hypothesis would be pruned. Make the LM from text of "
                              f"the model's language (make-lm ++unit=word), or decode without the lexicon.")

    def _state(self, key: tuple[tuple[str, ...], str, int]) -> int:
        sid = self.state_of.get(key)
        if sid is None:
            sid = self.state_of[key] = len(self.keys)
            self.keys.append(key)
            self.done = room_for(self.done, sid)
            self.node = room_for(self.node, sid)
            context, word, node = key
            self.node[sid] = node
            if word:
                self.done[sid] = self._word_score(word, context, node)
        return sid

    def _word_score(self, word: str, context: tuple[str, ...], node: int) -> float:
        """What a complete ``word`` earns after ``context`` (the lexicon's miss where it ends inside the trie)."""
        score = self.weight * math.log(10) * self.arpa.logprob(word, context) + self.word_score
        if word not in self.arpa.known:
            score += self.unk_score
        if self.lexicon and node >= 0 and not self.word_end[node]:
            score += LEXICON_MISS
        return score

    def _next(self, sid: int, token: int) -> int:
        nxt = self.step.get((sid, token))
        if nxt is None:
            context, word, node = self.keys[sid]
            if self.starts[token]:
                if word:
                    full = (*context, word)
                    context = full[max(0, len(full) - self.arpa.order + 1):] if self.arpa.order > 1 else ()
                word = self.texts[token]
                node = self.edges.get((0, token), -1) if word else 0
            else:
                word += self.texts[token]
                node = self.edges.get((node, token), -1) if node >= 0 else -1
            nxt = self.step[(sid, token)] = self._state((context, word, node if self.lexicon else 0))
        return nxt

    def initial_state(self, batch: int, beam: int) -> Any:
        return start_states(self.start, batch, beam, self.device)

    def bonus(self, state: Any, tokens: Any) -> Any:
        import torch

        started = self.done[state][..., None] + self.start_cost[tokens]
        if not self.lexicon:
            return torch.where(self.starts_mask[tokens], started, 0.0)
        node = self.node[state][..., None]  # (B, K, 1)
        want = node * self.vocab_size + tokens
        at = torch.searchsorted(self.edge_keys, want.flatten()).clamp(max=len(self.edge_keys) - 1)
        on_trie = (self.edge_keys[at].view_as(want) == want) | (node < 0)  # a word already off it pays once
        return torch.where(self.starts_mask[tokens], started, torch.where(on_trie, 0.0, LEXICON_MISS))

    def advance(self, state: Any, token: Any) -> Any:
        import torch

        st, tk = state.cpu().tolist(), token.cpu().tolist()
        out = [[s if t < 0 else self._next(s, t) for s, t in zip(srow, trow)] for srow, trow in zip(st, tk)]
        return torch.tensor(out, dtype=torch.long, device=state.device)

    def words(self, seq: list[int]) -> list[str]:
        """The words a token sequence spells, as the search completes them."""
        words, word = [], ""
        for t in seq:
            if self.starts[t]:
                if word:
                    words.append(word)
                word = self.texts[t]
            else:
                word += self.texts[t]
        return words + [word] if word else words

    def misses(self, seq: list[int]) -> int:
        """How many words of a token sequence the lexicon does not hold (spelled off its trie, or ending inside):
        each is charged :data:`LEXICON_MISS` once, in the search as in the final ranking."""
        count, node, word = 0, 0, ""
        for t in seq:
            if self.starts[t]:
                count += bool(word) and (node < 0 or not self.word_end[node])
                word = self.texts[t]
                node = self.edges.get((0, t), -1) if word else 0
            else:
                word += self.texts[t]
                node = self.edges.get((node, t), -1) if node >= 0 else -1
        return count + (bool(word) and (node < 0 or not self.word_end[node]))

    def sequence_bonus(self, seqs: list[list[int]]) -> list[float]:
        out = []
        for seq in seqs:
            score = sentence_bonus(self.arpa, self.words(seq), self.weight, self.word_score, self.unk_score)
            if self.lexicon:
                score += LEXICON_MISS * self.misses(seq)
            out.append(score)
        return out
