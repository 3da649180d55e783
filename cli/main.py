"""``corpus-io``: the typer app with every subcommand (each lives in its own module here)."""

from cli import (  # noqa: F401  (importing registers the subcommands)
    bench_loader,
    jsonl2scp,
    make_tokenizer,
    prepare,
    scp2jsonl,
)
from cli._app import app


def main() -> None:
    app(prog_name="corpus-io")


if __name__ == "__main__":
    main()
