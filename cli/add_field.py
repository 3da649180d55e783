from cli._app import command
from corpus_io.config import AddFieldConfig


@command("add-field", AddFieldConfig,
         "Add a field to packed shards without rewriting them: shard-NNNNNN.<field>.tar (fbank/mfcc computed "
         "with the loader's dataset_conf, or ++from_scp=feats.scp) or .<field>.jsonl.gz (++from_jsonl), plus a "
         "meta companion, recorded in index.jsonl. Parallel, resumable.")
def add_field(cfg: AddFieldConfig) -> None:
    from corpus_io.shards.fields import add_field as run

    run(cfg)


main = add_field.standalone
