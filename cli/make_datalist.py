from cli._app import command
from corpus_io.config import MakeDatalistConfig


@command("make-datalist", MakeDatalistConfig,
         "Write a WeNet data.list: raw (utterance lines from a jsonl) or shard (tar URLs from dirs, globs, "
         "brace patterns or lists, merged, with an optional prefix rewrite and the index sidecar).")
def make_datalist(cfg: MakeDatalistConfig) -> None:
    from corpus_io.shards.datalist import make_datalist as run

    run(cfg)


main = make_datalist.standalone
