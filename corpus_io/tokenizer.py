"""Tokenizers (char, bpe, word) over a WeNet-style token list, and ``make-tokenizer``.

A token list (WeNet ``units.txt``) has one ``<token> <id>`` per line, ids 0..V-1:
``<blank> 0``, ``<unk> 1``, the tokens, and ``<sos/eos>`` last.

* ``char``: each CJK character is a token; Latin runs are words (``latin_unit=word``)
  or letters (``latin_unit=letter``, with ``▁`` standing for every space between words).
* ``bpe``: a sentencepiece model (``bpe_model``); its pieces are looked up in the token list.
* ``word``: jieba segments CJK runs; other text splits on whitespace.

Text normalisation, before splitting: ``lowercase`` and ``remove_cjk_spaces`` (spaces
between two CJK characters are removed: a sentencepiece model would map them to ``<unk>``).
``decode`` writes CJK tokens without spaces and separates Latin words by one space.
No torch here: ``make-tokenizer`` is a data-prep command.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from corpus_io.config import MakeTokenizerConfig, TokenizerConf, require
from corpus_io.errors import ConfigError, CorpusIOError, DataError
from corpus_io.storage.files import atomic_write, refuse_overwriting_inputs, refuse_remote_output, temp_name

SOS_EOS = "<sos/eos>"

# CJK ideographs (+ ext. A, compatibility), kana, hangul, CJK and full-width punctuation: one token each.
_CJK = "\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_CJK_CHAR = re.compile(f"[{_CJK}]")
_CJK_SPACE = re.compile(f"(?<=[{_CJK}])\\s+(?=[{_CJK}])")
_PIECES = re.compile(f"([{_CJK}]+)|(\\s+)|([^\\s{_CJK}]+)")


def is_cjk(token: str) -> bool:
    return bool(token) and _CJK_CHAR.match(token) is not None


# --------------------------------------------------------------------------- token lists


def read_token_list(path: str) -> list[str]:
    """Symbols by id from a ``<token> <id>`` file; ids must be 0..V-1 without gaps or repeats."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot open token list {path}: {exc.strerror}. Set tokenizer.token_list "
                          f"to a file written by 'corpus-io make-tokenizer'.") from None
    by_id: dict[int, str] = {}
    seen: dict[str, int] = {}
    with f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise DataError(f"{path}:{lineno}: expected '<token> <id>', got {line.strip()!r}.")
            token, idx = parts[0], int(parts[1])
            if idx in by_id or token in seen:
                raise DataError(f"{path}:{lineno}: token {token!r} or id {idx} appears twice "
                                f"(first at line {seen.get(token, '?')}). Each token and id must be unique.")
            by_id[idx] = token
            seen[token] = lineno
    if sorted(by_id) != list(range(len(by_id))):
        missing = sorted(set(range(len(by_id))) - set(by_id))[:3]
        raise DataError(f"{path}: ids must run 0..{len(by_id) - 1} without gaps; missing {missing}.")
    return [by_id[i] for i in range(len(by_id))]


def write_token_list(path: str | Path, tokens: Iterable[str], *, blank: str = "<blank>", unk: str = "<unk>") -> int:
    """Write ``<blank> 0``, ``<unk> 1``, ``tokens``..., ``<sos/eos>``; return the vocabulary size."""
    symbols = [blank, unk] + [t for t in tokens if t not in (blank, unk, SOS_EOS)] + [SOS_EOS]
    with atomic_write(path) as f:
        f.write(token_list_text(symbols))
    return len(symbols)


def token_list_text(symbols: list[str]) -> str:
    """A token list in its canonical form: one ``<token> <id>`` line per symbol, ids in order."""
    return "".join(f"{token} {i}\n" for i, token in enumerate(symbols))


def token_list_sha256(symbols: list[str]) -> str:
    """sha256 (hex) of :func:`token_list_text`: what a checkpoint records of its token list (for a list that
    make-tokenizer wrote, the file's own ``sha256sum``)."""
    return hashlib.sha256(token_list_text(symbols).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- tokenizers


class Tokenizer:
    """Text <-> ids over a token list. ``encode`` counts tokens and unknown tokens; a special token written in
    the text is an unknown token like any word the list lacks (:meth:`token_id`)."""

    def __init__(self, symbols: list[str], split: Callable[[str], list[str]], conf: TokenizerConf,
                 *, join: Callable[[list[str]], str] | None = None, where: str = "") -> None:
        self.symbols = symbols
        self.ids = {s: i for i, s in enumerate(symbols)}
        self.conf = conf
        self._split = split
        self._join = join or _join_words
        for name, symbol in (("blank", conf.blank), ("unk", conf.unk)):
            if symbol not in self.ids:
                raise ConfigError(f"token list {where} has no {symbol!r} (tokenizer.{name}). Rebuild it with "
                                  f"'corpus-io make-tokenizer' or set tokenizer.{name}.")
        if self.ids[conf.blank] != 0:
            raise ConfigError(f"token list {where}: {conf.blank!r} must have id 0 (CTC blank), "
                              f"it has {self.ids[conf.blank]}.")
        self.blank_id = 0
        self.unk_id = self.ids[conf.unk]
        self.sos_eos_id = self.ids.get(SOS_EOS, len(symbols) - 1)
        # the list's reserved symbols: a transcript that writes one means a word, never the symbol itself
        self.specials = frozenset({conf.blank, conf.unk, SOS_EOS, symbols[self.sos_eos_id]})
        self.num_tokens = 0
        self.num_unknown = 0
        self._rebuild: tuple | None = None  # (symbols, conf, where) of a tokenizer build_tokenizer made

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self._rebuild is None:  # a split of the caller's own: pickled as it is (a closure cannot be)
            return super().__reduce_ex__(protocol)
        return _of_conf, self._rebuild

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    def normalize(self, text: str) -> str:
        if self.conf.lowercase:
            text = text.lower()
        if self.conf.remove_cjk_spaces:
            text = _CJK_SPACE.sub("", text)
        return text.strip()

    def tokenize(self, text: str) -> list[str]:
        return self._split(self.normalize(text))

    def token_id(self, token: str) -> int | None:
        """The id of a transcript's token; None for one outside the token list, a special token
        (``<blank>``, ``<unk>``, ``<sos/eos>``) included: every command spells transcripts through here."""
        return None if token in self.specials else self.ids.get(token)

    def encode(self, text: str) -> list[int]:
        ids = [self.token_id(t) for t in self.tokenize(text)]
        ids = [self.unk_id if i is None else i for i in ids]
        self.num_tokens += len(ids)
        self.num_unknown += sum(1 for i in ids if i == self.unk_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        skip = {self.blank_id, self.sos_eos_id}
        return self._join([self.symbols[i] for i in ids if i not in skip])

    @property
    def unknown_rate(self) -> float:
        return self.num_unknown / self.num_tokens if self.num_tokens else 0.0


def _join_words(tokens: list[str]) -> str:
    out: list[str] = []
    for token in tokens:
        if out and not (is_cjk(token) and is_cjk(out[-1])):
            out.append(" ")
        out.append(token)
    return "".join(out)


def _join_letters(space: str) -> Callable[[list[str]], str]:
    return lambda tokens: "".join(tokens).replace(space, " ").strip()


def char_split(latin_unit: str = "word", space: str = "▁") -> Callable[[str], list[str]]:
    """CJK characters one by one; Latin runs as words, or letters with ``space`` between words."""
    def split(text: str) -> list[str]:
        out: list[str] = []
        for cjk, blank, latin in _PIECES.findall(text):
            if cjk:
                out.extend(cjk)
            elif blank:
                if latin_unit == "letter" and out:
                    out.append(space)
            elif latin_unit == "letter":
                out.extend(latin)
            else:
                out.append(latin)
        return out

    return split


def word_split() -> Callable[[str], list[str]]:
    """jieba for CJK runs (dictionary only, no HMM: deterministic), whitespace for the rest."""
    import jieba

    jieba.setLogLevel(60)

    def split(text: str) -> list[str]:
        out: list[str] = []
        for cjk, _blank, latin in _PIECES.findall(text):
            if cjk:
                out.extend(w for w in jieba.lcut(cjk, HMM=False) if w.strip())
            elif latin:
                out.append(latin)
        return out

    return split


def _load_sentencepiece(model: str | None):
    import sentencepiece as spm

    if not model:
        raise ConfigError("tokenizer.type=bpe needs tokenizer.bpe_model (a sentencepiece .model). "
                          "Train one with 'corpus-io make-tokenizer ++tokenizer.type=bpe ++vocab_size=N'.")
    sp = spm.SentencePieceProcessor()
    try:
        sp.load(str(model))
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"cannot load sentencepiece model {model}: {exc}. Check tokenizer.bpe_model.") from None
    return sp


def sentencepiece_pieces(sp) -> list[str]:
    """The model's pieces in id order, without its unk/control symbols (the token list body)."""
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())
            if not (sp.is_unknown(i) or sp.is_control(i))]


def build_tokenizer(conf: TokenizerConf) -> Tokenizer:
    """The tokenizer ``conf`` describes. ``token_list`` is required, except for bpe (derived from the model)."""
    sp = _load_sentencepiece(conf.bpe_model) if conf.type == "bpe" else None
    if conf.token_list:
        symbols = read_token_list(conf.token_list)
    elif sp is not None:
        symbols = [conf.blank, conf.unk] + sentencepiece_pieces(sp) + [SOS_EOS]
    else:
        raise ConfigError(f"tokenizer.token_list is required for tokenizer.type={conf.type}. Build one with "
                          f"'corpus-io make-tokenizer ++input=train.jsonl ++output=tokens.txt'.")
    return _of_conf(symbols, conf, conf.token_list or str(conf.bpe_model), sp)


def _of_conf(symbols: list[str], conf: TokenizerConf, where: str, sp: Any = None) -> Tokenizer:
    """The tokenizer of ``conf`` over ``symbols``; also how a pickled one is rebuilt (a DataLoader worker started
    from a forkserver or spawned: its split and join functions are closures, rebuilt here from ``conf``)."""
    if conf.type == "char":
        tok = Tokenizer(symbols, char_split(conf.latin_unit, conf.space), conf, where=where,
                        join=_join_letters(conf.space) if conf.latin_unit == "letter" else None)
    elif conf.type == "word":
        tok = Tokenizer(symbols, word_split(), conf, where=where)
    elif conf.type == "bpe":
        sp = sp if sp is not None else _load_sentencepiece(conf.bpe_model)
        tok = Tokenizer(symbols, lambda text: sp.encode(text, out_type=str) if text else [], conf, where=where,
                        join=lambda pieces: sp.decode_pieces(pieces))
    else:
        raise ConfigError(f"tokenizer.type is '{conf.type}'; it must be char, bpe or word.")
    tok._rebuild = (symbols, conf, where)
    return tok


# --------------------------------------------------------------------------- make-tokenizer


def iter_texts(path: str) -> Iterator[str]:
    """Transcripts of a Kaldi ``text`` file, a JSONL (``target`` or ``txt``) or any input of
    :mod:`corpus_io.tables.inputs` (a Kaldi dir, a NeMo or Lhotse manifest), streamed.

    Strict like scp2jsonl: a Kaldi line with a key but no transcript, a duplicate key (both lines
    named, checked by 8-byte key hashes once the file is read) and a file without any utterance are
    :class:`DataError`; these surface when the iteration reaches them.
    """
    from corpus_io.tables import inputs, kaldi, manifest

    hashes = array("q")
    count = 0
    skipped = inputs.Skipped()  # lines without a transcript are left out; if all are, the error names one
    whole = os.path.isdir(path) or path.endswith(".gz")
    typed = inputs.resolve_input(path) if whole or _looks_like_jsonl(path) else None  # decided once
    if typed is not None and (whole or typed.kind not in ("funasr", "wenet")):
        for rec in inputs.iter_records(typed, skip=skipped):  # a Kaldi dir, NeMo, Lhotse: their texts
            count += 1
            yield str(rec.get("target", ""))
    elif _looks_like_jsonl(path):
        for line in manifest.iter_jsonl(path):
            text = line.record.get("target", line.record.get("txt"))
            if not isinstance(text, str):
                raise DataError(f"{line.where}: no 'target' or 'txt' string in this line. Each line of a "
                                f"JSONL transcript needs one.")
            if "key" in line.record:
                hashes.append(kaldi.key_hash(str(line.record["key"])))
            count += 1
            yield text
        manifest.raise_if_duplicate_keys([path], hashes)
    else:
        for row in kaldi.iter_table(path, allow_empty_value=True):
            if not row.value:
                raise DataError(f"{row.where}: key '{row.key}' has no transcript (the line is only a key). "
                                f"Each line must be '<key> <transcript>'; fill in the transcript or remove "
                                f"the line.")
            hashes.append(kaldi.key_hash(row.key))
            count += 1
            yield row.value
        kaldi.raise_if_duplicates(path, hashes)
    if not count:
        raise skipped.nothing_left(path, "there is no text to build a token list from", "++input")


def _looks_like_jsonl(path: str) -> bool:
    if path.endswith((".jsonl", ".json", ".list")):
        return True
    try:
        with open(path, "rb") as f:
            for raw in f:
                if raw.strip():
                    return raw.lstrip(b"\xef\xbb\xbf").lstrip().startswith(b"{")
    except OSError as exc:
        raise DataError(f"cannot open {path}: {exc.strerror}. Check ++input.") from None
    return False


def _bpe_remedy(message: str) -> str:
    """What to change after sentencepiece refused ``vocab_size`` (it says which way in its own words)."""
    import re

    # "Vocabulary size is smaller than required_chars. 12 vs 45." : the text has more distinct characters
    small = re.search(r"smaller than required_chars\. *(\d+) vs (\d+)", message)
    if small:
        return (f"The text has {small.group(2)} distinct characters, each needing a piece: raise ++vocab_size "
                f"to at least {int(small.group(2)) + 1}.")
    if "too high" in message or "too large" in message:
        return "Lower ++vocab_size or add more text."
    return "Check ++vocab_size against the amount of text (or add more text)."


def make_tokenizer(cfg: MakeTokenizerConfig) -> dict:
    """Write the token list (and for bpe the sentencepiece model); return a summary dict."""
    from corpus_io.storage.progress import progress

    require(cfg, "input", "output")
    conf = cfg.tokenizer
    outputs = [("++output", str(cfg.output))]
    if conf.type == "bpe":
        outputs.append(("the sentencepiece model beside ++output", str(Path(cfg.output).with_suffix(".model"))))
    for name, path in outputs:
        refuse_remote_output(path, name, "make-tokenizer")
    refuse_overwriting_inputs(outputs, [("++input", cfg.input)])
    if conf.type == "bpe":
        return _make_bpe(cfg)
    probe = Tokenizer([conf.blank, conf.unk], char_split(conf.latin_unit, conf.space) if conf.type == "char"
                      else word_split(), conf)
    counts: Counter = Counter()
    lines = 0
    for text in progress(iter_texts(cfg.input), desc="make-tokenizer", unit="lines"):
        counts.update(probe.tokenize(text))
        lines += 1
    kept = sorted(t for t, n in counts.items() if n >= cfg.min_count)
    size = write_token_list(cfg.output, kept, blank=conf.blank, unk=conf.unk)
    summary = {"lines": lines, "vocab_size": size, "below_min_count": len(counts) - len(kept),
               "output": str(cfg.output)}
    _print_summary(summary)
    return summary


def _make_bpe(cfg: MakeTokenizerConfig) -> dict:
    import sentencepiece as spm

    conf = cfg.tokenizer
    out = Path(cfg.output)
    model = out.with_suffix(".model")
    out.parent.mkdir(parents=True, exist_ok=True)
    model_prefix = temp_name(out.with_suffix(""))
    normalizer = Tokenizer([conf.blank, conf.unk], lambda text: [text], conf)
    lines = 0
    input_error: list[CorpusIOError] = []  # sentencepiece turns an exception of the iterator into RuntimeError

    def sentences() -> Iterator[str]:
        nonlocal lines
        try:
            for text in iter_texts(cfg.input):
                text = normalizer.normalize(text)
                if text:
                    lines += 1
                    yield text
        except CorpusIOError as exc:
            input_error.append(exc)
            raise

    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_prefix=str(model_prefix), vocab_size=cfg.vocab_size,
            model_type="bpe", character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
            input_sentence_size=10_000_000, shuffle_input_sentence=False, num_threads=1,
            hard_vocab_limit=False, minloglevel=2)
    except RuntimeError as exc:
        for suffix in (".model", ".vocab"):
            Path(f"{model_prefix}{suffix}").unlink(missing_ok=True)
        if input_error:
            raise input_error[0] from None
        raise ConfigError(f"sentencepiece could not train on {cfg.input} with vocab_size={cfg.vocab_size}: "
                          f"{exc}. {_bpe_remedy(str(exc))}") from None
    os.replace(f"{model_prefix}.model", model)
    Path(f"{model_prefix}.vocab").unlink(missing_ok=True)
    sp = _load_sentencepiece(str(model))
    size = write_token_list(out, sentencepiece_pieces(sp), blank=conf.blank, unk=conf.unk)
    summary = {"lines": lines, "vocab_size": size, "model": str(model), "output": str(out)}
    _print_summary(summary)
    return summary


def _print_summary(summary: dict) -> None:
    parts = "; ".join(f"{k} {v}" for k, v in summary.items())
    print(f"[make-tokenizer] {parts}", file=sys.stderr, flush=True)
