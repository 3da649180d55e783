from cli._app import command
from corpus_io.config import Jsonl2ScpConfig


@command("jsonl2scp", Jsonl2ScpConfig, "Split a JSONL back into Kaldi tables, one per field.")
def jsonl2scp(cfg: Jsonl2ScpConfig) -> None:
    from corpus_io.manifest import jsonl2scp as run

    run(cfg)


main = jsonl2scp.standalone
