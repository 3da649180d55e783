"""Shared plumbing for subcommands: Hydra overrides, ``--help`` key tables, error reporting.

A subcommand module declares its schema and one call into ``corpus_io``; this
module turns that into a typer command and a standalone console script.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from typing import Any, Callable, Optional

import typer

from corpus_io.config import compose, describe
from corpus_io.errors import CorpusIOError
from corpus_io.extras import missing_extra_message

app = typer.Typer(
    name="corpus-io",
    help="Prepare speech corpora of any size and stream them into training. "
         "Every subcommand takes Hydra overrides: key=value, +key=value, ++key=value.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

# subcommand name -> its config schema (the help and the config test walk it)
COMMANDS: dict[str, type] = {}

_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}


def keys_table(schema: type) -> str:
    rows = describe(schema)
    width = max(len(key) for key, _, _ in rows)  # every key fits: the columns stay aligned
    lines = ["\b", "Config keys (override with ++key=value):"]
    for key, default, text in rows:
        lines.append(f"  {key:<{width}}  = {default:<12} {text}")
    return "\n".join(lines)


def run_with_errors(fn: Callable[[], Any]) -> None:
    """Run ``fn``; a user error becomes one paragraph on stderr and a non-zero exit.

    A stuck run can be asked where it is: ``kill -USR1 <pid>`` prints every thread's stack to stderr
    (DataLoader workers forked from it inherit this).
    """
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        fn()
    except CorpusIOError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except ImportError as exc:
        message = missing_extra_message(exc)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as exc:
        # a path the job could not read or write (no such directory, no permission, disk full): the
        # user's to fix, so one paragraph; CORPUS_IO_DEBUG=1 shows where it happened
        if os.environ.get("CORPUS_IO_DEBUG") == "1":
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}. Check the path, its permissions and free space "
              f"(CORPUS_IO_DEBUG=1 shows the traceback).", file=sys.stderr)
        raise SystemExit(2) from None


def command(name: str, schema: type, help: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Register ``fn(cfg)`` as subcommand ``name`` taking Hydra overrides for ``schema``."""
    config_name = name.replace("-", "_")
    COMMANDS[name] = schema

    def decorate(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def invoke(
            ctx: typer.Context,
            config_path: Optional[str] = typer.Option(None, "--config-path", help="directory of your own YAML"),
            config_name_opt: Optional[str] = typer.Option(None, "--config-name", help="YAML file in --config-path"),
        ) -> None:
            overrides = list(ctx.args)
            chosen = config_name_opt or config_name
            if config_path and not config_name_opt:
                chosen = config_name
            run_with_errors(lambda: fn(compose(schema, chosen, overrides, config_path=config_path)))

        invoke.__doc__ = help
        app.command(name, help=help, epilog=keys_table(schema), context_settings=_CONTEXT)(invoke)
        fn.standalone = _standalone(name)  # type: ignore[attr-defined]
        return fn

    return decorate


def _standalone(name: str) -> Callable[[], None]:
    def main() -> None:
        from cli.main import app as full_app

        full_app(args=[name, *sys.argv[1:]], prog_name="corpus-io")

    return main
