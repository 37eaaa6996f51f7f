"""The `onward` command line: the command tree, one module per area.

``listing`` (runs), ``runs`` (inspect, start, run --resume, approve, deny, resolve, tag,
replay), ``compact``, ``gc``, ``projections`` (projector, projections rebuild), ``quarantine``
(list, release), ``worker``, ``db`` (migrate, verify), ``schema`` and ``demo``; ``_common`` holds
the consoles, the exit codes and the boundary every command runs inside. ``embedding``:
`frontier_main` and `resume_main`, ``inspect`` and ``run --resume`` on a product's own stores.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from . import compact, db, demo, gc, listing, projections, quarantine, runs, schema, worker
from ._common import EXIT_OK, EXIT_USAGE, boundary, debugging, error
from .embedding import frontier_main, resume_main


class _Root(TyperGroup):
    """The root command: a usage error is one line on stderr, like every other failure."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        run = (args, prog_name, complete_var, False, windows_expand_args)
        if not standalone_mode:
            return super().main(*run, **extra)
        try:
            code = super().main(*run, **extra)
        except typer.TyperException as exc:
            # A group given no command has printed its help already (typer checks by name too).
            if type(exc).__name__ != "NoArgsIsHelpError":
                ctx = getattr(exc, "ctx", None)
                message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
                where = f"; see {ctx.command_path} --help" if ctx is not None else ""
                error(message.rstrip(".") + where)
            sys.exit(getattr(exc, "exit_code", EXIT_USAGE))
        sys.exit(code if isinstance(code, int) else 0)


def _group(name: str, help: str, **options: Any) -> typer.Typer:
    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        **options,
    )


def _add(group: typer.Typer, name: str, command: Callable[..., None]) -> None:
    path = f"onward {name}" if group is app else f"onward {group.info.name} {name}"
    group.command(name)(boundary(command, name=path))


app = _group("onward", "Onward: an event-sourced durable runtime for agent runs.", cls=_Root)
db_app = _group("db", "The PostgreSQL schema: migrate and verify.")
projections_app = _group("projections", "Projections of the event log.")
quarantine_app = _group("quarantine", "Runs the projector set aside: a record cannot be read.")
app.add_typer(db_app)
app.add_typer(projections_app)
app.add_typer(quarantine_app)

_add(app, "runs", listing.runs_command)
_add(app, "inspect", runs.inspect_command)
_add(app, "start", runs.start_command)
_add(app, "run", runs.run_command)
_add(app, "approve", runs.approve_command)
_add(app, "deny", runs.deny_command)
_add(app, "resolve", runs.resolve_command)
_add(app, "tag", runs.tag_command)
_add(app, "replay", runs.replay_command)
_add(app, "compact", compact.compact_command)
_add(app, "gc", gc.gc_command)
_add(app, "projector", projections.projector_command)
_add(app, "worker", worker.worker_command)
_add(projections_app, "rebuild", projections.rebuild_command)
_add(quarantine_app, "list", quarantine.list_command)
_add(quarantine_app, "release", quarantine.release_command)
_add(db_app, "migrate", db.migrate_command)
_add(db_app, "verify", db.verify_command)
_add(app, "schema", schema.schema_command)
_add(app, "demo", demo.demo_command)


def _version(shown: bool) -> None:
    """``--version``: print the installed version and stop, before any command is looked at."""
    if shown:
        try:
            installed = version("onward")
        except PackageNotFoundError:  # run from a source tree that was never installed
            installed = "unknown (not installed)"
        typer.echo(f"onward {installed}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", help="Print the traceback of an error raised by the agent's or model's code."
        ),
    ] = False,
) -> None:
    """Onward: an event-sourced durable runtime for agent runs."""
    debugging.on = debug


def main() -> None:
    """Entry point of the `onward` console script."""
    app()


__all__ = ["app", "frontier_main", "main", "resume_main"]
