from cli._app import command
from corpus_io.config import BenchLoaderConfig


@command("bench-loader", BenchLoaderConfig,
         "Iterate the training loader exactly as train builds it: utterances/s, audio-seconds/s, padding, "
         "drop counts; dump keys per rank and epoch; save or resume the loader state.")
def bench_loader(cfg: BenchLoaderConfig) -> None:
    from corpus_io.dataset import bench_loader as run

    run(cfg)


main = bench_loader.standalone
