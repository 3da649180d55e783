"""The plumbing of the CLI: a Typer app built from the command table, ``--help`` key tables, and
error reporting (one paragraph, no traceback, for anything the user can fix).

The table itself is :data:`corpus_io.commands.COMMANDS`; :mod:`cli.main` builds the app from it.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import typer

from corpus_io.commands import leave_process_group
from corpus_io.config import compose, describe
from corpus_io.errors import CorpusIOError
from corpus_io.extras import missing_extra_message

if TYPE_CHECKING:
    from corpus_io.commands import Command

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
    except RuntimeError as exc:
        if not str(exc).startswith("Symlink loop"):  # pathlib's resolve() on a symlink that points at itself
            raise
        print(f"error: {exc}: a symbolic link points at itself (or round a loop). Point it at a directory "
              f"or give another path.", file=sys.stderr)
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


def build_app(commands: Iterable[Command]) -> typer.Typer:
    """A Typer app with one subcommand per table row; each composes its config and calls its ``run``."""
    app = typer.Typer(
        name="corpus-io",
        help="Prepare speech corpora of any size and stream them into training. "
             "Every subcommand takes Hydra overrides: key=value, +key=value, ++key=value.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
    )
    for cmd in commands:
        app.command(cmd.name, help=cmd.help, epilog=keys_table(cmd.schema), context_settings=_CONTEXT)(
            _invoker(cmd))
    return app


def _invoker(cmd: Command) -> Callable[..., None]:
    config_name = cmd.name.replace("-", "_")

    def invoke(
        ctx: typer.Context,
        config_path: Optional[str] = typer.Option(None, "--config-path", help="directory of your own YAML"),
        config_name_opt: Optional[str] = typer.Option(None, "--config-name", help="YAML file in --config-path"),
    ) -> None:
        def job() -> None:
            cfg = compose(cmd.schema, config_name_opt or config_name, list(ctx.args), config_path=config_path)
            if getattr(cfg, "executor", "local") == "dask":  # submit all num_jobs jobs, then merge (executors.py)
                _target("corpus_io.jobs.executors:run_on_dask")(cmd.name, list(ctx.args), cfg)
                return
            _target(cmd.run)(cfg)  # imported after the config is checked: a config error costs no torch import
            leave_process_group()  # under torchrun: the process group down, then out without the teardown

        run_with_errors(job)

    invoke.__doc__ = cmd.help
    return invoke


def _target(spec: str) -> Callable[[Any], Any]:
    """The function ``"module:function"`` names, imported now (inside run_with_errors, so a missing
    extra is reported with its install line, corpus_io.extras.install_line)."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)
