from cli._app import command
from corpus_io.config import PackShardsConfig


@command("pack-shards", PackShardsConfig,
         "Pack a jsonl, a WeNet raw list or a Kaldi dir into WeNet/WebDataset tar shards with data.list "
         "and index.jsonl. Parallel, resumable, deterministic.")
def pack_shards(cfg: PackShardsConfig) -> None:
    from corpus_io.shards.pack import pack_shards as run

    run(cfg)


main = pack_shards.standalone
