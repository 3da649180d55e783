"""``corpus-io``: the typer app with every subcommand (each lives in its own module here)."""

from cli import (  # noqa: F401  (importing registers the subcommands)
    add_field,
    average,
    bench_loader,
    compute_cmvn,
    decode,
    jsonl2scp,
    make_datalist,
    make_tokenizer,
    pack_shards,
    prepare,
    scp2jsonl,
    stats,
    train,
    verify_shards,
)
from cli._app import app


def main() -> None:
    app(prog_name="corpus-io")


if __name__ == "__main__":
    main()
