from cli._app import command
from corpus_io.config import VerifyShardsConfig


@command("verify-shards", VerifyShardsConfig,
         "Check every shard of a data.list: sha256 and size against index.jsonl, member grouping, counts, "
         "audio decoding and UTF-8 transcripts. Exits non-zero naming the shard and member.")
def verify_shards(cfg: VerifyShardsConfig) -> None:
    from corpus_io.shards.verify import verify_shards as run

    run(cfg)


main = verify_shards.standalone
