from cli._app import command
from corpus_io.config import TrainConfig


@command("train", TrainConfig,
         "Train a CTC model (Conformer by default) from a shard or raw list; one process or under torchrun: "
         "torchrun --nproc_per_node=N --no-python corpus-io train ++train_data_set_list=... ++output_dir=...")
def train(cfg: TrainConfig) -> None:
    from corpus_io.train.trainer import train as run

    run(cfg)


main = train.standalone
