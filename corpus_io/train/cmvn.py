"""Global CMVN: mean and inverse standard deviation of the feature frames of a training list.

``compute-cmvn`` writes JSON: ``{"dim", "frame_num", "mean_stat", "var_stat", "mean", "istd"}``
(``mean_stat``/``var_stat`` are WeNet's sums of x and x^2, so stats from several lists can be added).
The model applies ``(x - mean) * istd`` itself (see ``model.GlobalCMVN``).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

from corpus_io.errors import ConfigError

VAR_FLOOR = 1.0e-20


def stats_to_json(sum_x: list[float], sum_x2: list[float], frames: int) -> dict:
    if frames <= 0:
        raise ConfigError("compute-cmvn saw no feature frames: the data list is empty or every utterance "
                          "was filtered out. Check data_list and dataset_conf.filter_conf.")
    mean = [s / frames for s in sum_x]
    istd = [1.0 / math.sqrt(max(s2 / frames - m * m, VAR_FLOOR)) for s2, m in zip(sum_x2, mean)]
    return {"dim": len(mean), "frame_num": frames, "mean_stat": sum_x, "var_stat": sum_x2, "mean": mean, "istd": istd}


def load_cmvn(path: str, dim: int | None = None) -> tuple[list[float], list[float]]:
    """``(mean, istd)`` from a compute-cmvn JSON; checks the dimension against the features."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"cmvn_file {path} does not exist. Create it with: corpus-io compute-cmvn "
                          f"++data_list=<train data.list> ++output={path}")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
        if "mean" not in obj:
            obj = stats_to_json(obj["mean_stat"], obj["var_stat"], int(obj["frame_num"]))
        mean, istd = [float(v) for v in obj["mean"]], [float(v) for v in obj["istd"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cmvn_file {path} is not a compute-cmvn JSON ({exc}). Recreate it with "
                          f"corpus-io compute-cmvn.") from None
    if dim is not None and len(mean) != dim:
        raise ConfigError(f"cmvn_file {path} has dimension {len(mean)} but the features have {dim}. "
                          f"Recompute it with the same dataset_conf (fbank_conf.num_mel_bins / mfcc_conf.num_ceps).")
    return mean, istd


def eval_dataset_conf(dataset_conf: Any) -> Any:
    """A copy of ``dataset_conf`` without shuffling or augmentation (cmvn, cv and decode).

    It reads the one list it is given, once: a training mix (``sources``) or an epoch measured in
    hours (``epoch_hours``, an endless stream) would make cv score training data, or loop.
    """
    conf = copy.deepcopy(dataset_conf)
    conf.sources = []
    conf.epoch_hours = None
    conf.shuffle = False
    conf.speed_perturb = False
    conf.spec_aug = False
    conf.spec_sub = False
    conf.spec_trim = False
    if getattr(conf, "fbank_conf", None) is not None:
        conf.fbank_conf.dither = 0.0
    return conf


def compute_cmvn(cfg: Any) -> dict:
    """Accumulate sum(x), sum(x^2) over every valid frame of ``cfg.data_list``; write ``cfg.output``."""
    import torch

    from corpus_io.config import require
    from corpus_io.dataset import build_dataloader
    from corpus_io.files import atomic_write
    from corpus_io.progress import Summary, progress
    from corpus_io.train.frontend import build_front_end, model_inputs

    require(cfg, "data_list", "output")
    conf = eval_dataset_conf(cfg.dataset_conf)
    loader = build_dataloader(cfg.data_list, conf, None, train=False, rank=0, world_size=1)
    device = torch.device("cuda" if conf.feats_on == "model" and torch.cuda.is_available() else "cpu")
    front_end = build_front_end(conf, device)  # feats_on=model: the same features the trainer will compute
    sum_x = sum_x2 = None
    frames = utts = 0
    for batch in progress(loader, desc="compute-cmvn", unit="batch"):
        feats, lengths = model_inputs(front_end, batch, device, train=False)
        feats = feats.double()
        mask = (torch.arange(feats.shape[1], device=feats.device)[None, :] < lengths[:, None]).unsqueeze(-1)
        feats = feats * mask
        s, s2 = feats.sum(dim=(0, 1)), (feats * feats).sum(dim=(0, 1))
        sum_x = s if sum_x is None else sum_x + s
        sum_x2 = s2 if sum_x2 is None else sum_x2 + s2
        frames += int(lengths.sum())
        utts += len(batch["keys"])
        if cfg.max_utts and utts >= cfg.max_utts:
            break
    if sum_x is None:
        stats_to_json([], [], 0)
    obj = stats_to_json(sum_x.tolist(), sum_x2.tolist(), frames)
    with atomic_write(cfg.output) as f:
        json.dump(obj, f)
        f.write("\n")
    summary = Summary(what="utterances", kept=utts, seconds=frames * 0.01, extra={"frames": frames, "dim": obj["dim"]})
    for reason, n in loader_counts(loader).items():
        summary.skip(reason, n)
    print(f"compute-cmvn -> {cfg.output}")
    summary.print("compute-cmvn")
    return obj


def loader_counts(loader: Any, *, epoch: bool = False) -> dict:
    """The loader's skip/filter counts (of the current epoch with ``epoch``; empty if it keeps none)."""
    name = "epoch_counts" if epoch and hasattr(loader, "epoch_counts") else "counts"
    counts = getattr(loader, name)() if hasattr(loader, name) else {}
    return {str(k): int(v) for k, v in dict(counts or {}).items() if isinstance(v, (int, float)) and v}
