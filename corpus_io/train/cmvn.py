"""Global CMVN: mean and inverse standard deviation of the feature frames of a training list.

``compute-cmvn`` writes JSON: ``{"dim", "frame_num", "mean_stat", "var_stat", "mean", "istd"}``
(``mean_stat``/``var_stat`` are WeNet's sums of x and x^2, so stats from several lists can be added),
or with ``++output_format=kaldi`` Kaldi's global stats matrix (what ``compute-cmvn-stats`` writes: a
binary double matrix, 2 x (dim+1), row 0 the sums of x then the frame count, row 1 the sums of x^2).

``cmvn_file`` may be any of (recognised by content, not name):

* that JSON (WeNet's ``global_cmvn`` JSON too);
* a Kaldi ``cmvn.ark``: the stats matrix, binary or text, bare or as the first entry of an ark (kaldiio);
* FunASR's ``am.mvn`` (Kaldi nnet1 text): ``<AddShift>`` holds ``-mean``, ``<Rescale>`` holds ``istd``.

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


def _from_json(text: str) -> tuple[list[float], list[float]]:
    obj = json.loads(text)
    if "mean" not in obj:
        obj = stats_to_json(obj["mean_stat"], obj["var_stat"], int(obj["frame_num"]))
    return [float(v) for v in obj["mean"]], [float(v) for v in obj["istd"]]


def _nnet1_vector(lines: list[str], i: int, component: str, path: str) -> list[float]:
    """The values of ``<LearnRateCoef> c [ v1 v2 ... ]`` on the line after ``component`` (FunASR's layout)."""
    parts = lines[i + 1].split() if i + 1 < len(lines) else []
    if len(parts) < 4 or parts[0] != "<LearnRateCoef>" or parts[2] != "[" or parts[-1] != "]":
        raise ConfigError(f"cmvn_file {path} line {i + 2}: expected '<LearnRateCoef> 0 [ v1 v2 ... ]' after "
                          f"{component} (FunASR's am.mvn layout). Fix or regenerate the file.")
    return [float(v) for v in parts[3:-1]]


def _from_am_mvn(text: str, path: str) -> tuple[list[float], list[float]]:
    """FunASR applies ``(x + shift) * rescale``: the mean is ``-shift`` and the istd is ``rescale``."""
    lines = text.splitlines()
    shift = rescale = None
    for i, line in enumerate(lines):
        head = line.split()[:1]
        if head == ["<AddShift>"]:
            shift = _nnet1_vector(lines, i, "<AddShift>", path)
        elif head == ["<Rescale>"]:
            rescale = _nnet1_vector(lines, i, "<Rescale>", path)
    if shift is None or rescale is None or len(shift) != len(rescale):
        raise ConfigError(f"cmvn_file {path} is an nnet1 file (<Nnet>) but lacks an <AddShift> and a <Rescale> "
                          f"of the same size, as FunASR's am.mvn has. Use FunASR's am.mvn as shipped.")
    return [-v for v in shift], rescale


def _from_kaldi_stats(path: str) -> tuple[list[float], list[float]]:
    import kaldiio
    import numpy as np

    try:
        stats = kaldiio.load_mat(path)
    except Exception:  # noqa: BLE001 - not a bare matrix: an ark holding it ("global" -> matrix)
        with kaldiio.ReadHelper(f"ark:{path}") as reader:
            stats = next((mat for _, mat in reader), None)
    stats = np.asarray(stats, dtype=np.float64)
    if stats.ndim != 2 or stats.shape[0] < 2 or stats.shape[1] < 2:
        raise ValueError(f"a matrix of shape {stats.shape}, not Kaldi's 2 x (dim+1) CMVN stats")
    frames = stats[0, -1]
    if frames < 1:
        raise ValueError(f"a frame count of {frames} in the last column of row 0")
    obj = stats_to_json(stats[0, :-1].tolist(), stats[1, :-1].tolist(), int(round(frames)))
    return obj["mean"], obj["istd"]


def load_cmvn(path: str, dim: int | None = None) -> tuple[list[float], list[float]]:
    """``(mean, istd)`` from a compute-cmvn/WeNet JSON, a Kaldi cmvn.ark or FunASR's am.mvn (see the module
    docstring); checks the dimension against the features."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"cmvn_file {path} does not exist. Create it with: corpus-io compute-cmvn "
                          f"++data_list=<train data.list> ++output={path}")
    head = p.read_bytes()[:64].lstrip()
    try:
        if head.startswith(b"{"):
            kind = "a JSON CMVN file"
            mean, istd = _from_json(p.read_text(encoding="utf-8"))
        elif head.startswith(b"<Nnet>"):
            kind = "FunASR am.mvn"
            mean, istd = _from_am_mvn(p.read_text(encoding="utf-8"), path)
        else:
            kind = "Kaldi CMVN stats (cmvn.ark)"
            mean, istd = _from_kaldi_stats(path)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - json, kaldiio and float() raise many types on a bad file
        raise ConfigError(f"cmvn_file {path} looks like {kind} but cannot be read ({exc}). Pass a compute-cmvn "
                          f"JSON or Kaldi cmvn.ark, WeNet's global_cmvn, or FunASR's am.mvn; or recreate it with "
                          f"corpus-io compute-cmvn.") from None
    bad = next(((name, i, v) for name, values in (("mean", mean), ("istd", istd)) for i, v in enumerate(values)
                if not math.isfinite(v)), None)
    if bad is not None:
        name, i, v = bad
        raise ConfigError(f"cmvn_file {path} holds a non-finite {name} ({v} at dimension {i}); training on it would "
                          f"give a loss of nan. Recompute it with corpus-io compute-cmvn on the training list (an "
                          f"empty or corrupt list, or a hand-edited file, gives such values).")
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


def loader_inputs(data_list: str, dataset_conf: Any) -> list[tuple[str, str]]:
    """``(name, path)`` of the lists a loader reads (``data_list`` or ``dataset_conf.sources``, with their index
    sidecars): what an output of compute-cmvn or decode must not replace."""
    from corpus_io.shards.index import list_and_sidecar

    named = list_and_sidecar("++data_list", data_list) if data_list else []
    for i, source in enumerate(dataset_conf.sources or [], 1):
        named += list_and_sidecar(f"dataset_conf.sources entry {i}", source.data_list)
    return named


def compute_cmvn(cfg: Any) -> dict:
    """Accumulate sum(x), sum(x^2) over every valid frame of ``cfg.data_list``; write ``cfg.output``."""
    from corpus_io.config import require
    from corpus_io.files import atomic_write, refuse_overwriting_inputs, refuse_remote_output

    require(cfg, "data_list", "output")
    refuse_remote_output(cfg.output, "++output", "compute-cmvn")  # before torch is imported or anything read
    refuse_overwriting_inputs([("++output", cfg.output)], loader_inputs(cfg.data_list, cfg.dataset_conf))
    import torch

    from corpus_io.dataset import build_dataloader
    from corpus_io.progress import Summary, progress
    from corpus_io.train.frontend import build_front_end, model_inputs
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
    if cfg.output_format == "kaldi":
        write_kaldi_stats(cfg.output, obj)
    else:
        with atomic_write(cfg.output) as f:
            json.dump(obj, f)
            f.write("\n")
    summary = Summary(what="utterances", kept=utts, seconds=frames * 0.01, extra={"frames": frames, "dim": obj["dim"]})
    for reason, n in loader_counts(loader).items():
        summary.skip(reason, n)
    print(f"compute-cmvn -> {cfg.output}")
    summary.print("compute-cmvn")
    return obj


def write_kaldi_stats(path: str, obj: dict) -> None:
    """Kaldi's global CMVN stats (as compute-cmvn-stats writes them): a binary double matrix, 2 x (dim+1)."""
    import kaldiio
    import numpy as np

    from corpus_io.files import atomic_write

    stats = np.zeros((2, obj["dim"] + 1), dtype=np.float64)
    stats[0, :-1], stats[1, :-1], stats[0, -1] = obj["mean_stat"], obj["var_stat"], obj["frame_num"]
    with atomic_write(path, "wb") as f:
        kaldiio.save_mat(f, stats)


def loader_counts(loader: Any, *, epoch: bool = False) -> dict:
    """The loader's skip/filter counts (of the current epoch with ``epoch``; empty if it keeps none)."""
    name = "epoch_counts" if epoch and hasattr(loader, "epoch_counts") else "counts"
    counts = getattr(loader, name)() if hasattr(loader, name) else {}
    return {str(k): int(v) for k, v in dict(counts or {}).items() if isinstance(v, (int, float)) and v}
