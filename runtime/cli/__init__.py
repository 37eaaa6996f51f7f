"""The `onward` command line: the command tree, one module per area.

``listing`` (runs), ``runs`` (inspect, start, run --resume, approve, deny, resolve, cancel, tag,
replay), ``compact``, ``gc``, ``projections`` (projector, projections rebuild), ``quarantine``
(list, release), ``worker``, ``db`` (migrate, verify), ``schema`` and ``demo``; ``_common`` holds
the consoles, the exit codes and the boundary every command runs inside. ``embedding``:
`frontier_main` and `resume_main`, ``inspect`` and ``run --resume`` on a product's own stores.

A command's module is imported only when that command is looked up: ``onward projector`` runs
without loading the worker, the fleet, the integrations or the tables of ``onward runs``, which
a process that folds the log for days would carry for nothing. ``--help`` reads the commands'
docstrings from their modules' source, importing none.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Sequence
from difflib import get_close_matches
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer._click.exceptions import UsageError
from typer.core import TyperCommand, TyperGroup

from ._common import EXIT_OK, EXIT_USAGE, boundary, debugging, error, help_paragraphs

if TYPE_CHECKING:
    # The click that typer's groups are typed with (typer 0.29 carries its own copy).
    from typer._click import Command, Context, HelpFormatter

    from .embedding import frontier_main, resume_main

_COMMANDS: dict[str, dict[str, str]] = {
    "onward": {
        "runs": ".listing:runs_command",
        "inspect": ".runs:inspect_command",
        "start": ".runs:start_command",
        "run": ".runs:run_command",
        "approve": ".runs:approve_command",
        "deny": ".runs:deny_command",
        "resolve": ".runs:resolve_command",
        "cancel": ".runs:cancel_command",
        "tag": ".runs:tag_command",
        "replay": ".runs:replay_command",
        "compact": ".compact:compact_command",
        "gc": ".gc:gc_command",
        "projector": ".projections:projector_command",
        "worker": ".worker:worker_command",
        "schema": ".schema:schema_command",
        "demo": ".demo:demo_command",
    },
    "db": {
        "migrate": ".db:migrate_command",
        "verify": ".db:verify_command",
        "pack-records": ".db:pack_records_command",
    },
    "projections": {"rebuild": ".projections:rebuild_command"},
    "quarantine": {
        "list": ".quarantine:list_command",
        "release": ".quarantine:release_command",
        "dismiss": ".quarantine:dismiss_command",
    },
}
"""Each group's commands, in the order ``--help`` lists them: name -> ``.module:function``."""


class _LazyGroup(TyperGroup):
    """A group that imports a command's module when the command is looked up, not before."""

    _listing = False
    """Whether the group's ``--help`` is being written: it lists commands it does not run."""

    def _lazy(self) -> dict[str, str]:
        return _COMMANDS.get(self.name or "", {})

    def list_commands(self, ctx: Context) -> list[str]:
        return [*self._lazy(), *(name for name in self.commands if name not in self._lazy())]

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Typer's, listing each command not imported yet as its source defines it (`_listed`):
        ``onward --help`` would otherwise import every command's module, the runner, the
        fleet and the metrics among them, to show one line of each."""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        lazy = self._lazy()
        if cmd_name in lazy and cmd_name not in self.commands:
            listed = _listed(lazy[cmd_name], cmd_name) if self._listing else None
            if listed is not None:
                return listed
            group = "" if self.name == "onward" else f" {self.name}"
            self.add_command(_command(lazy[cmd_name], f"onward{group} {cmd_name}"), cmd_name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        """Typer's, but "did you mean" picks from every command's name, which the table holds:
        typer's picks from the loaded commands, and loading them all for a typo would import
        every command's module (the worker, the fleet, the runner)."""
        try:
            return self._click_resolve_command(ctx, args)
        except UsageError as exc:
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if self.suggest_commands and matches:
                suggestions = ", ".join(f"{match!r}" for match in matches)
                exc.message = f"{exc.message.rstrip('.')}. Did you mean {suggestions}?"
            raise


def _command(where: str, path: str) -> Command:
    """The click command of the function ``where`` names, inside the exit-code boundary."""
    module, function = where.split(":")
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    function_ = getattr(import_module(module, __name__), function)
    paragraphs = help_paragraphs(function_.__doc__)
    single.command(
        path.rsplit(" ", 1)[-1],
        help="\n\n".join(paragraphs) or None,
        short_help=paragraphs[0] if paragraphs else None,
    )(boundary(function_, name=path))
    return typer.main.get_command(single)


@functools.cache
def _docstrings(module: str) -> dict[str, str | None]:
    """The docstring of each function ``module`` (relative to this package) defines, read from
    its source without importing it; empty when it has no source file to read."""
    spec = find_spec(module, __name__)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return {}
    try:
        source = Path(spec.origin).read_text(encoding="utf-8")
    except OSError:
        return {}
    return {
        node.name: ast.get_docstring(node, clean=False)
        for node in ast.parse(source, spec.origin).body
        if isinstance(node, ast.FunctionDef)
    }


def _listed(where: str, name: str) -> Command | None:
    """The command ``where`` names as its group's ``--help`` lists it, with the help `_command`
    gives it but no callback, read from the source; ``None`` when the source does not say, and
    the command is imported to be listed."""
    module, function = where.split(":")
    docstrings = _docstrings(module)
    if function not in docstrings:
        return None
    paragraphs = help_paragraphs(docstrings[function])
    return TyperCommand(
        name,
        help="\n\n".join(paragraphs) or None,
        short_help=paragraphs[0] if paragraphs else None,
    )


class _Root(_LazyGroup):
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


app = _group("onward", "Onward: an event-sourced durable runtime for agent runs.", cls=_Root)
db_app = _group(
    "db", "The PostgreSQL schema: migrate, verify, pack the log's records.", cls=_LazyGroup
)
projections_app = _group("projections", "Projections of the event log.", cls=_LazyGroup)
quarantine_app = _group(
    "quarantine", "Runs the projector set aside: a record cannot be read.", cls=_LazyGroup
)
app.add_typer(db_app)
app.add_typer(projections_app)
app.add_typer(quarantine_app)


def _version(shown: bool) -> None:
    """``--version``: print the installed version and stop, before any command is looked at."""
    if shown:
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415  (slow)

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


def __getattr__(name: str) -> object:
    """`frontier_main` and `resume_main` load the runner: imported on first access (PEP 562)."""
    if name not in ("frontier_main", "resume_main"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(".embedding", __name__), name)
    globals()[name] = value
    return value
