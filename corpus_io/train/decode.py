"""``corpus-io decode``: greedy CTC over a raw or shard list, a Kaldi ``text`` of hypotheses and a CER/WER report.

The model and tokenizer come from the checkpoint's resolved training config; feature extraction
(``feats_type``, ``feats_on``, ``fbank_conf``/``mfcc_conf``, ``resample_conf``) too, so decoding sees the same
features as training. The user's ``dataset_conf`` chooses the list format, batching and error policy;
shuffling and augmentation are always off.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from corpus_io.errors import ConfigError, DataError


def training_config(state: dict, where: str) -> Any:
    """The checkpoint's resolved ``TrainConfig``."""
    from omegaconf import OmegaConf

    from corpus_io.config import TrainConfig, validate

    text = state.get("config")
    if not text:
        raise ConfigError(f"checkpoint {where} holds no training config; decode needs a checkpoint written by "
                          f"corpus-io train (model.pt, model.pt.ep{{E}} or model.pt.avg{{N}}).")
    return validate(TrainConfig, OmegaConf.to_container(OmegaConf.create(text), resolve=True))


def decode_dataset_conf(user: Any, trained: Any) -> Any:
    from corpus_io.train.cmvn import eval_dataset_conf

    conf = eval_dataset_conf(user)
    conf.feats_type = trained.feats_type
    conf.feats_on = trained.feats_on
    conf.fbank_conf = trained.fbank_conf
    conf.mfcc_conf = trained.mfcc_conf
    conf.resample_conf = trained.resample_conf
    conf.fbank_conf.dither = 0.0
    return conf


def load_model(checkpoint: str, device: Any) -> tuple[Any, Any, Any]:
    """``(model in eval mode, tokenizer, training config)`` from a checkpoint."""
    from corpus_io.tokenizer import build_tokenizer
    from corpus_io.train.checkpoint import load_checkpoint
    from corpus_io.train.model import build_model, feature_dim

    state = load_checkpoint(checkpoint)
    tcfg = training_config(state, checkpoint)
    tokenizer = build_tokenizer(tcfg.tokenizer)
    # CMVN stats are buffers inside the checkpoint; the original cmvn_file is not needed.
    model = build_model(dict(tcfg.model), feature_dim(tcfg.dataset_conf), tokenizer.vocab_size, None)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise ConfigError(f"checkpoint {checkpoint} does not fit the model of its own config "
                          f"({str(exc).splitlines()[0]}). Was the token list changed after training?") from None
    return model.to(device).eval(), tokenizer, tcfg


def decode(cfg: Any) -> dict:
    """Decode ``cfg.data_list`` with ``cfg.checkpoint``; write ``text``, ``cer.txt``, ``wer.txt`` to output_dir."""
    import torch

    from corpus_io.config import require
    from corpus_io.dataset import build_dataloader
    from corpus_io.files import atomic_write, ensure_dir
    from corpus_io.progress import progress
    from corpus_io.train.cmvn import loader_counts
    from corpus_io.train.frontend import build_front_end, model_inputs
    from corpus_io.train.scoring import Scorer, token_list_covers
    from corpus_io.train.steps import greedy_ids

    require(cfg, "data_list", "checkpoint", "output_dir")
    use_cuda = torch.cuda.is_available() if cfg.device == "auto" else cfg.device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is visible; use ++device=auto or cpu.")
    device = torch.device("cuda" if use_cuda else "cpu")
    model, tokenizer, tcfg = load_model(cfg.checkpoint, device)
    conf = decode_dataset_conf(cfg.dataset_conf, tcfg.dataset_conf)
    loader = build_dataloader(cfg.data_list, conf, tokenizer, train=False, rank=0, world_size=1)
    front_end = build_front_end(conf, device)
    hyps: dict[str, str] = {}
    refs: dict[str, str] = {}
    repeats: dict[str, int] = {}
    audio = 0.0
    t0 = time.perf_counter()
    with torch.no_grad():
        for batch in progress(loader, desc="decode", unit="batch"):
            log_probs, lengths = model(*model_inputs(front_end, batch, device, train=False))
            for key, ids in zip(batch["keys"], greedy_ids(log_probs, lengths)):
                if key in hyps:  # scored once; a silent overwrite would hide an utterance from the count
                    repeats[key] = repeats.get(key, 1) + 1
                hyps[key] = tokenizer.decode(ids)
            target, tlen = batch["target"].tolist(), batch["target_lengths"].tolist()
            for i, (key, row, n) in enumerate(zip(batch["keys"], target, tlen)):
                refs[key] = _reference(batch, i, tokenizer, row[: int(n)])
            audio += float(batch.get("audio_seconds", 0.0))
    wall = time.perf_counter() - t0
    counts = loader_counts(loader)
    skipped = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"
    if not hyps:
        raise DataError(f"decode read 0 utterances from {cfg.data_list} (loader skips/filters: {skipped}); nothing "
                        f"was scored or written. Check the list, its paths or URLs and dataset_conf.on_error.")
    if repeats:
        first = next(iter(repeats))
        print(f"warning: {len(repeats)} keys were decoded more than once (e.g. '{first}' {repeats[first]} times); "
              f"each is scored once. Find them with verify-shards and give every utterance its own key.",
              file=sys.stderr, flush=True)
    out = Path(cfg.output_dir)
    ensure_dir(out, what="output_dir")
    with atomic_write(out / "text") as f:
        f.write("".join(f"{k} {hyps[k]}\n" for k in sorted(hyps)))
    with atomic_write(out / "ref") as f:
        f.write("".join(f"{k} {refs[k]}\n" for k in sorted(refs)))
    scorer = Scorer()
    covered = token_list_covers(tokenizer.symbols)
    for key in sorted(hyps):
        scorer.add(key, refs[key], hyps[key])
        scorer.count_oov(tokenizer.tokenize(refs[key]), covered)
    report = scorer.report()
    for name in ("cer.txt", "wer.txt"):
        with atomic_write(out / name) as f:
            f.write(report)
    print(f"decode: {len(hyps)} utterances ({audio / 3600:.3f} h) in {wall:.1f}s, loader skips/filters: {skipped}")
    print(scorer.summary().rstrip())
    print(f"decode: hypotheses -> {out / 'text'}, report -> {out / 'cer.txt'}")
    return {"utts": len(hyps), "cer": scorer.cer.rate, "wer": scorer.wer.rate, "rtf_wall": wall / max(audio, 1e-9)}


def _reference(batch: dict, i: int, tokenizer: Any, ids: list[int]) -> str:
    """The transcript as read (raw line or shard member), not rebuilt from token ids: a token missing from
    the token list would come back as ``<unk>`` and be scored as five characters. The detokenized target
    only for a batch without text (a custom loader)."""
    texts = batch.get("txt")
    if texts is not None and isinstance(texts[i], str):
        return texts[i]
    return tokenizer.decode(ids)
