"""One entry point for every decoding method: :class:`Search` turns a batch of CTC log-probabilities
(and, for attention rescoring, the encoder output) into n-best lists.

``greedy`` (the best path), ``ctc_prefix_beam`` (:mod:`corpus_io.decoding.beam`), ``ctc_beam_lm`` (the
same search with an n-gram fused, :mod:`corpus_io.decoding.lm`) and ``attention_rescoring``
(:mod:`corpus_io.decoding.rescoring`); hotwords (:mod:`corpus_io.decoding.hotwords`) with any beam method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from corpus_io.decoding.beam import Hyp, best_path_ids, ctc_prefix_beam_search, ctc_scores
from corpus_io.errors import ConfigError

NEEDS_ENCODER = ("attention_rescoring",)


def describe(conf: Any, lm_unit: str | None = None) -> str:
    """The method and the options it uses, for the report; ``lm_unit``: the unit ``auto`` chose (token | word)."""
    m = conf.method
    parts = [f"method={m}"]
    if m != "greedy":
        parts += [f"beam={conf.beam}", f"token_beam={conf.token_beam or conf.beam}"]
    if m == "ctc_beam_lm":
        unit = f"{lm_unit}({conf.lm_unit})" if lm_unit and lm_unit != conf.lm_unit else conf.lm_unit
        parts += [f"lm={conf.lm}", f"lm_unit={unit}", f"lm_weight={conf.lm_weight}",
                  f"word_score={conf.word_score}"]
        parts.append("lexicon=true" if conf.lexicon else f"unk_score={conf.unk_score}")
    if m == "attention_rescoring":
        parts.append(f"ctc_weight={conf.ctc_weight}")
    if conf.hotwords and m != "greedy":
        parts += [f"hotwords={conf.hotwords}", f"hotword_weight={conf.hotword_weight}"]
    return " ".join(parts)


def check_options(conf: Any) -> None:
    """Refuse ``decoding`` options that do not go together: one the method would ignore, or an LM the method
    needs and lacks (cheap checks, made before a model is loaded)."""
    if conf.hotwords and conf.method == "greedy":
        raise ConfigError("decoding.hotwords needs a beam search: set decoding.method=ctc_prefix_beam, ctc_beam_lm "
                          "or attention_rescoring.")
    if conf.method == "ctc_beam_lm" and not conf.lm:
        raise ConfigError("decoding.method=ctc_beam_lm needs decoding.lm=<ARPA file>; write one from the "
                          "training text with: corpus-io make-lm ++input=train.jsonl ++output=lm.arpa "
                          "(and the model's tokenizer block).")
    if conf.method == "ctc_beam_lm" and not Path(conf.lm).is_file():
        raise ConfigError(f"decoding.lm={conf.lm} does not exist; write it with corpus-io make-lm.")
    if conf.lm and conf.method != "ctc_beam_lm":
        raise ConfigError(f"decoding.lm={conf.lm} is given, but decoding.method={conf.method} uses no LM: only "
                          f"ctc_beam_lm fuses one, so the LM would be ignored. To decode with it, set "
                          f"++decoding.method=ctc_beam_lm (and tune its weight with corpus-io tune-lm); to decode "
                          f"without it, leave decoding.lm out.")
    given = [f"decoding.{k}={v}" for k, v in (("unk_score", conf.unk_score), ("lexicon", "true")) if
             (conf.unk_score != 0 if k == "unk_score" else conf.lexicon)]
    if given and conf.method != "ctc_beam_lm":
        raise ConfigError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} given, but decoding.method="
                          f"{conf.method} uses no LM: only ctc_beam_lm scores words against an LM's vocabulary, so "
                          f"{'it' if len(given) == 1 else 'they'} would be ignored. Set ++decoding.method=ctc_beam_lm "
                          f"++decoding.lm=<ARPA file>, or leave {' and '.join(g.split('=')[0] for g in given)} out.")
    if conf.lexicon and conf.unk_score != 0:
        raise ConfigError(f"decoding.unk_score={conf.unk_score} is given with decoding.lexicon=true, which limits "
                          f"the words to the LM's vocabulary: no word is unknown, so the score would be ignored. "
                          f"Leave one of them out (tune-lm tunes unk_score without the lexicon).")


class Search:
    """``search(log_probs, lengths, encoder=None) -> n-best lists`` for the configured method."""

    def __init__(self, conf: Any, tokenizer: Any, model: Any = None, device: Any = "cpu") -> None:
        self.conf = conf
        self.model = model
        self.context = None
        self.hotwords: list[str] = []
        self.lm = None
        check_options(conf)
        if conf.hotwords and conf.method != "greedy":
            from corpus_io.decoding.hotwords import build_context

            self.context, self.hotwords = build_context(conf.hotwords, tokenizer, conf.hotword_weight, device)
        if conf.method == "ctc_beam_lm":
            from corpus_io.decoding.lm import lm_fusion

            self.lm = lm_fusion(conf, tokenizer, device)
        self.description = describe(conf, self.lm.unit if self.lm is not None else None)
        if conf.method == "attention_rescoring" and not hasattr(model, "attention_scores"):
            raise ConfigError(f"decoding.method=attention_rescoring needs a model with an attention decoder "
                              f"(model=conformer_ctc_att); this checkpoint's model is {type(model).__name__}. "
                              f"Use ctc_prefix_beam or train with model=conformer_ctc_att.")

    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor,
                 encoder: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[list[Hyp]]:
        conf = self.conf
        if conf.method == "greedy":
            ids = best_path_ids(log_probs, lengths)
            scores = ctc_scores(log_probs, lengths, list(range(len(ids))), ids).tolist()
            return [[Hyp(i, sc, sc)] for i, sc in zip(ids, scores)]
        nbest = ctc_prefix_beam_search(log_probs, lengths, beam=conf.beam, token_beam=conf.token_beam or None,
                                       context=self.context, lm=self.lm)
        if conf.method == "attention_rescoring":
            from corpus_io.decoding.rescoring import attention_rescoring

            if encoder is None:
                raise ConfigError("attention_rescoring needs the encoder output (model.encode).")
            return attention_rescoring(self.model, encoder, nbest, conf.ctc_weight)
        return nbest

    def unbiased(self, log_probs: torch.Tensor, lengths: torch.Tensor,
                 encoder: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[list[Hyp]]:
        """The same search without the hotwords (the report's recall "before")."""
        context, self.context = self.context, None
        try:
            return self(log_probs, lengths, encoder)
        finally:
            self.context = context


__all__ = ["Hyp", "Search", "best_path_ids", "check_options", "ctc_scores", "describe", "NEEDS_ENCODER"]
