import os
import sys

from cli._app import command
from corpus_io.config import TrainConfig


@command("train", TrainConfig,
         "Train a CTC model (Conformer by default) from a shard or raw list; one process or under torchrun: "
         "torchrun --nproc_per_node=N --no-python corpus-io train ++train_data_set_list=... ++output_dir=...")
def train(cfg: TrainConfig) -> None:
    from corpus_io.train.trainer import train as run

    run(cfg)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The run is complete: checkpoints, logs and TensorBoard are closed and the process group is
        # destroyed. Skip the interpreter's teardown, where the C++ threads of gloo and of the TCPStore can
        # abort a rank ("terminate called without an active exception", exit -6; pytorch#190489, #179291)
        # and turn a finished run into a failed one.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


main = train.standalone
