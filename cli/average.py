from cli._app import command
from corpus_io.config import AverageConfig


@command("average", AverageConfig,
         "Average the best epoch checkpoints of a training output_dir (by cv loss or acc) into model.pt.avg{num}.")
def average(cfg: AverageConfig) -> None:
    from corpus_io.train.checkpoint import average as run

    run(cfg)


main = average.standalone
