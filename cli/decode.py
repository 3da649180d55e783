from cli._app import command
from corpus_io.config import DecodeConfig


@command("decode", DecodeConfig,
         "Greedy CTC decoding of a raw or shard list with a checkpoint; writes a Kaldi text and a CER/WER report.")
def decode(cfg: DecodeConfig) -> None:
    from corpus_io.train.decode import decode as run

    run(cfg)


main = decode.standalone
