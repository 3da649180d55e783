from cli._app import command
from corpus_io.config import Scp2JsonlConfig


@command("scp2jsonl", Scp2JsonlConfig,
         "Join Kaldi tables (wav.scp, text, ...) into a FunASR JSONL. Audio lengths come from file headers.")
def scp2jsonl(cfg: Scp2JsonlConfig) -> None:
    from corpus_io.manifest import scp2jsonl as run

    run(cfg)


main = scp2jsonl.standalone
