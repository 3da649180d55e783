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
    for block in ("fbank_conf", "mfcc_conf"):  # dither is training's: cv, decode and CMVN see the features as served
        if getattr(conf, block, None) is not None:
            getattr(conf, block).dither = 0.0
    return conf


def loader_inputs(data_list: str, dataset_conf: Any) -> list[tuple[str, str]]:
    """``(name, path)`` of the lists a loader reads (``data_list`` or ``dataset_conf.sources``, with their index
    sidecars): what an output of compute-cmvn or decode must not replace."""
    from corpus_io.shards.index import list_and_sidecar

    return [*(list_and_sidecar("++data_list", data_list) if data_list else []), *source_inputs(dataset_conf)]


def source_inputs(dataset_conf: Any) -> list[tuple[str, str]]:
    """``(name, path)`` of the lists of ``dataset_conf.sources`` and their index sidecars."""
    from corpus_io.shards.index import list_and_sidecar

    return [named for i, source in enumerate(dataset_conf.sources or [], 1)
            for named in list_and_sidecar(f"dataset_conf.sources entry {i}", source.data_list)]


# Every finite float64 is an integer multiple of 2**-1074 (and its frexp mantissa, times 2**53, an integer): scaled
# by 2**_EXACT_BITS the statistics are Python ints, whose sums are exact, so they do not depend on the order in
# which utterances arrive (loader workers, batches, jobs). The file holds their correctly rounded float64 values.
_EXACT_BITS = 1074 + 53


def exact_sums(rows: Any) -> list[int]:
    """Column sums of a float64 matrix, exactly, as ints scaled by ``2**_EXACT_BITS``."""
    import numpy as np

    mantissa, exponent = np.frexp(np.asarray(rows, dtype=np.float64))
    ints = (mantissa * 2.0 ** 53).astype(np.int64).astype(object)
    shifted = np.left_shift(ints, (exponent.astype(np.int64) + 1074).astype(object))
    return [int(v) for v in shifted.sum(axis=0)]


def exact_to_floats(sums: list[int]) -> list[float]:
    return [v / (1 << _EXACT_BITS) for v in sums]  # int / int: correctly rounded


class ExactStats:
    """Per-utterance float64 sums of x and x^2 over its frames, added exactly (see :data:`_EXACT_BITS`)."""

    def __init__(self) -> None:
        self.sum_x: list[int] = []
        self.sum_x2: list[int] = []
        self.frames = 0
        self.utts = 0

    def add_batch(self, feats: Any, lengths: Any) -> None:
        import numpy as np

        feats = feats.detach().to("cpu").numpy()
        rows_x, rows_x2 = [], []
        for i, n in enumerate(lengths.tolist()):
            f = np.asarray(feats[i, :n], dtype=np.float64)  # the utterance's frames, no padding: batch-independent
            rows_x.append(f.sum(axis=0))
            rows_x2.append((f * f).sum(axis=0))
            self.frames += int(n)
            self.utts += 1
        if not rows_x:
            return
        for total, rows in ((self.sum_x, rows_x), (self.sum_x2, rows_x2)):
            sums = exact_sums(np.stack(rows))
            if not total:
                total.extend(sums)
            else:
                total[:] = [a + b for a, b in zip(total, sums)]

    def add(self, other: dict) -> None:
        for name in ("sum_x", "sum_x2"):
            mine, theirs = getattr(self, name), [int(v) for v in other[name]]
            if theirs:  # an empty job's part holds no sums
                setattr(self, name, [a + b for a, b in zip(mine, theirs)] if mine else theirs)
        self.frames += int(other["frames"])
        self.utts += int(other["utts"])

    def data(self) -> dict:
        return {"sum_x": [str(v) for v in self.sum_x], "sum_x2": [str(v) for v in self.sum_x2],
                "frames": self.frames, "utts": self.utts}

    def to_json(self) -> dict:
        return stats_to_json(exact_to_floats(self.sum_x), exact_to_floats(self.sum_x2), self.frames)


def _list_lines(path: str) -> list[str]:
    """The entries of a local data list (shard paths or raw JSON lines), as written."""
    from corpus_io.storage.files import iter_raw_lines

    return [raw.decode("utf-8").rstrip("\r\n") for _, raw in iter_raw_lines(path, what="data_list") if raw.strip()]


def _job_list(data_list: str, lines: list[str], directory: str) -> str:
    """A data list of this job's entries (with their index entries, for a shard list) in ``directory``."""
    from corpus_io.shards.index import load_index, write_list_and_index
    from corpus_io.storage.files import atomic_write

    sub = str(Path(directory) / "data.list")
    index = None if lines and lines[0].lstrip().startswith("{") else load_index(data_list, keys=True)
    if index:
        write_list_and_index(sub, [index.get(u) or {"path": u} for u in lines])
    else:
        with atomic_write(sub) as f:
            f.write("".join(line + "\n" for line in lines))
    return sub


def compute_cmvn(cfg: Any) -> dict:
    """Accumulate sum(x), sum(x^2) over every valid frame of ``cfg.data_list``; write ``cfg.output``.

    With ``++num_jobs=N`` (N > 1) this is one job (corpus_io.jobs.parts): it accumulates its range of the list's
    entries (shards, or raw lines) and records the exact sums in a part record; ``merge-jobs ++path=<output>``
    adds them and writes the file a one-job run writes, byte for byte (the sums are exact: see ExactStats)."""
    import tempfile

    from corpus_io.config import require
    from corpus_io.jobs import parts as jobs
    from corpus_io.storage.files import refuse_overwriting_inputs, refuse_remote_output
    from corpus_io.storage.progress import Summary

    require(cfg, "data_list", "output")
    refuse_remote_output(cfg.output, "++output", "compute-cmvn")  # before torch is imported or anything read
    refuse_overwriting_inputs([("++output", cfg.output)], loader_inputs(cfg.data_list, cfg.dataset_conf))
    job = jobs.job_of(cfg)
    place = jobs.Place(str(cfg.output), "compute-cmvn", False)
    if job.single and not place.records():
        stats, counts = _accumulate(cfg.data_list, cfg)
        return _finish(cfg.output, cfg.output_format, stats, counts)
    if cfg.max_utts:
        raise ConfigError("++max_utts stops after that many utterances in list order, which N jobs cannot split; "
                          "use it with ++num_jobs=1 only.")
    lines = _list_lines(cfg.data_list)
    conf = eval_dataset_conf(cfg.dataset_conf)
    fp = jobs.fingerprint(["compute-cmvn", jobs.files_digest([cfg.data_list]), cfg.output_format,
                           _conf_dict(conf)])
    done = jobs.begin(place, job, fp)
    if job.single:
        stats, counts = _accumulate(cfg.data_list, cfg)
        return _finish(cfg.output, cfg.output_format, stats, counts)
    if done is not None:
        print(f"compute-cmvn {job}: already complete ({done.where})", flush=True)
        return done.data
    lo, hi = job.span(len(lines))
    stats, counts = ExactStats(), {}
    if hi > lo:
        with tempfile.TemporaryDirectory(prefix="compute-cmvn-job-") as tmp:
            stats, counts = _accumulate(_job_list(cfg.data_list, lines[lo:hi], tmp), cfg)
    data = {**stats.data(), "counts": counts, "output_format": cfg.output_format}
    jobs.write_part(place, jobs.Part("compute-cmvn", place.tag, job.count, job.index, fp, [lo, hi], len(lines),
                                     data=data))
    Summary(what="utterances", kept=stats.utts, seconds=stats.frames * 0.01).print(f"compute-cmvn {job}")
    return data


def _conf_dict(conf: Any) -> Any:
    """The loader options that shape the features (not how many workers compute them)."""
    from corpus_io.config import to_dict

    return {k: v for k, v in to_dict(conf).items() if k not in ("num_workers", "prefetch")}


def check_part(part: Any) -> None:
    """merge-jobs: a compute-cmvn record's exact sums (integers as strings, one per feature dimension, x^2 >= 0), its
    frame and utterance counts, the loader's counts and the output format (:class:`corpus_io.jobs.parts.RecordProblem`
    on
    the first field that cannot be trusted)."""
    from corpus_io.jobs import parts as jobs

    data = part.data
    sums = {}
    for name in ("sum_x", "sum_x2"):
        values = jobs.of_type(data.get(name), f"data.{name}", list, "a list")
        for i, v in enumerate(values):
            if not isinstance(v, str) or not v.lstrip("-").isdigit() or (name == "sum_x2" and v.startswith("-")):
                raise jobs.bad(f"data.{name}[{i}]", v, "not an exact sum (an integer as a string"
                               + (", >= 0)" if name == "sum_x2" else ")"))
        sums[name] = values
    if len(sums["sum_x"]) != len(sums["sum_x2"]):
        raise jobs.bad("data.sum_x2", f"{len(sums['sum_x2'])} dimensions", f"but data.sum_x has {len(sums['sum_x'])}")
    frames = jobs.whole(data.get("frames"), "data.frames")
    utts = jobs.whole(data.get("utts"), "data.utts", 0, frames)
    if bool(sums["sum_x"]) != bool(utts):
        raise jobs.bad("data.utts", utts, f"but data.sum_x holds {len(sums['sum_x'])} dimensions")
    for reason, n in jobs.of_type(data.get("counts"), "data.counts", dict, "a JSON object").items():
        jobs.whole(n, f"data.counts[{reason!r}]")
    if data.get("output_format") not in ("json", "kaldi"):
        raise jobs.bad("data.output_format", data.get("output_format"), "not json or kaldi")


def merge_parts(place: Any, parts: list) -> dict:
    """``merge-jobs`` of compute-cmvn: the parts' exact sums added, the one-job CMVN file written."""
    from corpus_io.errors import DataError

    stats, counts = ExactStats(), {}
    for part in parts:
        data = part.payload()
        if stats.sum_x and data["sum_x"] and len(data["sum_x"]) != len(stats.sum_x):
            raise DataError(f"part record {part.where}: data.sum_x has {len(data['sum_x'])} dimensions, but the parts "
                            f"before it have {len(stats.sum_x)}: the record was changed after its job wrote it. "
                            f"Nothing was changed. Delete it and rerun job {part.job_index}, then merge.")
        stats.add(data)
        for reason, n in data["counts"].items():
            counts[reason] = counts.get(reason, 0) + n
    return _finish(place.path, parts[0].payload()["output_format"], stats, counts)


def _accumulate(data_list: str, cfg: Any) -> tuple[ExactStats, dict]:
    import torch

    from corpus_io.loader.dataset import build_dataloader
    from corpus_io.model.frontend import build_front_end, model_inputs
    from corpus_io.storage.progress import progress

    conf = eval_dataset_conf(cfg.dataset_conf)
    loader = build_dataloader(data_list, conf, None, train=False, rank=0, world_size=1)
    device = torch.device("cuda" if conf.feats_on == "model" and torch.cuda.is_available() else "cpu")
    front_end = build_front_end(conf, device)  # feats_on=model: the same features the trainer will compute
    stats = ExactStats()
    for batch in progress(loader, desc="compute-cmvn", unit="batch"):
        feats, lengths = model_inputs(front_end, batch, device, train=False)
        stats.add_batch(feats, lengths)
        if cfg.max_utts and stats.utts >= cfg.max_utts:
            break
    return stats, loader_counts(loader)


def _finish(output: str, output_format: str, stats: ExactStats, counts: dict) -> dict:
    from corpus_io.storage.files import atomic_write
    from corpus_io.storage.progress import Summary

    if not stats.frames:
        stats_to_json([], [], 0)
    obj = stats.to_json()
    if output_format == "kaldi":
        write_kaldi_stats(output, obj)
    else:
        with atomic_write(output) as f:
            json.dump(obj, f)
            f.write("\n")
    summary = Summary(what="utterances", kept=stats.utts, seconds=stats.frames * 0.01,
                      extra={"frames": stats.frames, "dim": obj["dim"]})
    for reason, n in counts.items():
        summary.skip(reason, n)
    print(f"compute-cmvn -> {output}")
    summary.print("compute-cmvn")
    return obj


def write_kaldi_stats(path: str, obj: dict) -> None:
    """Kaldi's global CMVN stats (as compute-cmvn-stats writes them): a binary double matrix, 2 x (dim+1)."""
    import kaldiio
    import numpy as np

    from corpus_io.storage.files import atomic_write

    stats = np.zeros((2, obj["dim"] + 1), dtype=np.float64)
    stats[0, :-1], stats[1, :-1], stats[0, -1] = obj["mean_stat"], obj["var_stat"], obj["frame_num"]
    with atomic_write(path, "wb") as f:
        kaldiio.save_mat(f, stats)


def loader_counts(loader: Any, *, epoch: bool = False) -> dict:
    """The loader's skip/filter counts (of the current epoch with ``epoch``; empty if it keeps none)."""
    name = "epoch_counts" if epoch and hasattr(loader, "epoch_counts") else "counts"
    counts = getattr(loader, name)() if hasattr(loader, name) else {}
    return {str(k): int(v) for k, v in dict(counts or {}).items() if isinstance(v, (int, float)) and v}
