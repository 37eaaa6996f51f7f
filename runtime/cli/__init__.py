"""The `onward` command line: the command tree, one module per area.

``runs`` (inspect, run --resume, approve, deny, resolve, replay), ``projections`` (projector,
projections rebuild), ``db`` (migrate, verify), ``schema`` and ``demo``; ``_common`` holds the
consoles, the exit codes and the boundary every command runs inside.
"""

from __future__ import annotations

from collections.abc import Callable

import typer

from . import db, demo, projections, runs, schema
from ._common import boundary


def _group(name: str, help: str) -> typer.Typer:
    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


def _add(group: typer.Typer, name: str, command: Callable[..., None]) -> None:
    path = f"onward {name}" if group is app else f"onward {group.info.name} {name}"
    group.command(name)(boundary(command, name=path))


app = _group("onward", "Onward: an event-sourced durable runtime for agent runs.")
db_app = _group("db", "The PostgreSQL schema: migrate and verify.")
projections_app = _group("projections", "Projections of the event log.")
app.add_typer(db_app)
app.add_typer(projections_app)

_add(app, "inspect", runs.inspect_command)
_add(app, "run", runs.run_command)
_add(app, "approve", runs.approve_command)
_add(app, "deny", runs.deny_command)
_add(app, "resolve", runs.resolve_command)
_add(app, "replay", runs.replay_command)
_add(app, "projector", projections.projector_command)
_add(projections_app, "rebuild", projections.rebuild_command)
_add(db_app, "migrate", db.migrate_command)
_add(db_app, "verify", db.verify_command)
_add(app, "schema", schema.schema_command)
_add(app, "demo", demo.demo_command)


@app.callback()
def _root() -> None:
    """Onward: an event-sourced durable runtime for agent runs."""


def main() -> None:
    """Entry point of the `onward` console script."""
    app()


__all__ = ["app", "main"]
