"""``corpus-io``: the Typer app built from the command table (:data:`corpus_io.commands.COMMANDS`), and the
standalone console scripts (``pack-shards``, ``make-datalist``; see ``[project.scripts]``).

Typer workaround: an app holding a single command runs it as the root command, with no name and a
different usage line. So a standalone script does not build a one-command app; it runs the full app
with its own name put in front of the arguments (``pack-shards ARGS`` is ``corpus-io pack-shards ARGS``).
"""

from __future__ import annotations

import sys
from typing import Callable

from cli._app import build_app
from corpus_io.commands import COMMANDS

app = build_app(COMMANDS)


def main() -> None:
    app(prog_name="corpus-io")


def standalone(name: str) -> Callable[[], None]:
    """The console-script entry point of subcommand ``name``."""
    def run() -> None:
        app(args=[name, *sys.argv[1:]], prog_name="corpus-io")

    return run


pack_shards = standalone("pack-shards")
make_datalist = standalone("make-datalist")

if __name__ == "__main__":
    main()
