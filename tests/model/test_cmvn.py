"""CMVN files in every format users bring (compute-cmvn JSON, WeNet JSON, Kaldi cmvn.ark, FunASR am.mvn),
from stats computed on the real fixture corpus."""

from __future__ import annotations

import json

import kaldiio
import numpy as np
import pytest
import torch

from corpus_io.errors import ConfigError
from corpus_io.model.cmvn import load_cmvn
from corpus_io.model.model import GlobalCMVN
from tests.conftest import run_cli
from tests.loader_data import make_raw


@pytest.fixture(scope="module")
def stats(tmp_path_factory):
    """compute-cmvn JSON and Kaldi stats of the real fixture corpus, written by the CLI."""
    out = tmp_path_factory.mktemp("cmvn")
    raw, _ = make_raw(out)
    common = [f"++data_list={raw}", "++dataset_conf.data_type=raw", "++dataset_conf.num_workers=0"]
    for fmt, name in (("json", "cmvn.json"), ("kaldi", "cmvn.ark")):
        result = run_cli("corpus-io", "compute-cmvn", *common, f"++output={out / name}", f"++output_format={fmt}")
        assert result.returncode == 0, result.stderr
    return out, json.loads((out / "cmvn.json").read_text())


def test_compute_cmvn_kaldi_format_is_kaldis_binary_stats_matrix(stats):
    out, obj = stats
    assert (out / "cmvn.ark").read_bytes()[:4] == b"\0BDM"  # binary double matrix, as compute-cmvn-stats writes
    mat = kaldiio.load_mat(str(out / "cmvn.ark"))
    assert mat.shape == (2, obj["dim"] + 1)
    assert mat[0, -1] == obj["frame_num"] and mat[1, -1] == 0
    np.testing.assert_allclose(mat[0, :-1], obj["mean_stat"], rtol=1e-12)
    np.testing.assert_allclose(mat[1, :-1], obj["var_stat"], rtol=1e-12)


def test_kaldi_cmvn_ark_bare_keyed_or_text_gives_the_json_mean_and_istd(stats, tmp_path):
    out, obj = stats
    mat = kaldiio.load_mat(str(out / "cmvn.ark"))
    kaldiio.save_ark(str(tmp_path / "keyed.ark"), {"global": mat})
    kaldiio.save_ark(str(tmp_path / "text.ark"), {"global": mat}, text=True)
    for path in (out / "cmvn.ark", tmp_path / "keyed.ark", tmp_path / "text.ark"):
        mean, istd = load_cmvn(str(path), obj["dim"])
        np.testing.assert_allclose(mean, obj["mean"], rtol=1e-6)
        np.testing.assert_allclose(istd, obj["istd"], rtol=1e-6)


def _am_mvn(mean: list[float], istd: list[float]) -> str:
    """FunASR's am.mvn layout (Kaldi nnet1 text): the model adds <AddShift> then multiplies by <Rescale>."""
    dim = len(mean)

    def vec(values):
        return "<LearnRateCoef> 0 [ " + " ".join(f"{v:.6f}" for v in values) + " ]"

    return "\n".join(["<Nnet>", f"<Splice> {dim} {dim}", "[ 0 ]", f"<AddShift> {dim} {dim}", vec([-m for m in mean]),
                      f"<Rescale> {dim} {dim}", vec(istd), "</Nnet>", ""])


def test_funasr_am_mvn_normalises_features_as_funasr_does(stats, tmp_path):
    _, obj = stats
    path = tmp_path / "am.mvn"
    path.write_text(_am_mvn(obj["mean"], obj["istd"]), encoding="utf-8")
    mean, istd = load_cmvn(str(path), obj["dim"])
    np.testing.assert_allclose(mean, obj["mean"], atol=1e-6)
    np.testing.assert_allclose(istd, obj["istd"], atol=1e-6)
    feats = torch.randn(7, obj["dim"]) * 3 + torch.tensor(obj["mean"])
    shift = torch.tensor([-m for m in mean])
    funasr = (feats + shift) * torch.tensor(istd)  # FunASR's apply_cmvn: inputs += means; inputs *= vars
    torch.testing.assert_close(GlobalCMVN(obj["dim"], str(path))(feats), funasr)


def test_wenet_json_with_sums_only_loads(stats, tmp_path):
    _, obj = stats
    wenet = {k: obj[k] for k in ("mean_stat", "var_stat", "frame_num")}
    (tmp_path / "global_cmvn").write_text(json.dumps(wenet))
    mean, istd = load_cmvn(str(tmp_path / "global_cmvn"), obj["dim"])
    np.testing.assert_allclose(mean, obj["mean"])
    np.testing.assert_allclose(istd, obj["istd"])


def test_an_unreadable_or_mismatched_cmvn_file_names_the_file_and_the_formats(stats, tmp_path):
    _, obj = stats
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="junk.bin.*Kaldi CMVN stats.*FunASR's am.mvn"):
        load_cmvn(str(junk))
    broken = tmp_path / "broken.mvn"
    broken.write_text("<Nnet>\n<AddShift> 2 2\n[ 1 2 ]\n</Nnet>\n")
    with pytest.raises(ConfigError, match="broken.mvn line 3"):
        load_cmvn(str(broken))
    with pytest.raises(ConfigError, match="dimension 80 but the features have 40"):
        load_cmvn(str(stats[0] / "cmvn.ark"), 40)



# --------------------------------------------------------------------------- compute-cmvn as jobs


@pytest.mark.parametrize("kind, output_format", [("raw", "json"), ("shard", "kaldi")])
def test_compute_cmvn_n_jobs_merge_to_the_bytes_of_one_job(corpus, tmp_path, kind, output_format):
    from corpus_io.config import ComputeCmvnConfig, DatasetConf, MergeJobsConfig
    from corpus_io.jobs.parts import merge_jobs
    from corpus_io.model.cmvn import compute_cmvn

    data_list = corpus["raw"] if kind == "raw" else corpus["shards"]  # 24 lines, or 3 shards (N=7: empty jobs)

    def run(out, n, j):
        compute_cmvn(ComputeCmvnConfig(data_list=str(data_list), output=str(out), output_format=output_format,
                                       dataset_conf=DatasetConf(data_type=kind, num_workers=0, batch_size=5),
                                       num_jobs=n, job_index=j))

    run(tmp_path / "one", 1, 1)
    reference = (tmp_path / "one").read_bytes()
    for n in (2, 3, 7):
        out = tmp_path / f"n{n}"
        for j in range(1, n + 1):
            run(out, n, j)
        assert not out.exists(), "a job of N > 1 wrote the CMVN file"
        merge_jobs(MergeJobsConfig(path=str(out)))
        assert out.read_bytes() == reference, n


def test_exact_sums_do_not_depend_on_the_order_of_the_rows():
    from corpus_io.model.cmvn import exact_sums, exact_to_floats

    rows = np.random.default_rng(0).normal(size=(500, 3)) * np.array([1e-3, 1.0, 1e6])
    forward = exact_sums(rows)
    assert exact_sums(rows[::-1]) == forward
    assert [sum(exact_sums(rows[i:i + 7])[c] for i in range(0, 500, 7)) for c in range(3)] == forward
    assert exact_to_floats(forward) == [float(sum(__import__("fractions").Fraction(v) for v in rows[:, c]))
                                        for c in range(3)]
