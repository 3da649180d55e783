from cli._app import command
from corpus_io.config import ComputeCmvnConfig


@command("compute-cmvn", ComputeCmvnConfig,
         "Global CMVN (mean, istd) over the feature frames of a training list, as JSON for train's cmvn_file.")
def compute_cmvn(cfg: ComputeCmvnConfig) -> None:
    from corpus_io.train.cmvn import compute_cmvn as run

    run(cfg)


main = compute_cmvn.standalone
