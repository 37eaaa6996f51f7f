"""The `onward` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import typer

from onward.eventlog.events import AnyEvent

app = typer.Typer(
    name="onward",
    help="Onward: an event-sourced durable runtime for agent runs.",
    no_args_is_help=True,
    add_completion=False,
)


def event_schema() -> bytes:
    """The JSON Schema of every event kind, formatted for review in diffs."""
    schema = msgspec.json.schema(AnyEvent)
    return msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"


@app.command()
def schema(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here instead of standard output."),
    ] = None,
) -> None:
    """Print the JSON Schema of the events (committed as schemas/events.schema.json)."""
    text = event_schema()
    if output is None:
        typer.echo(text.decode(), nl=False)
    else:
        output.write_bytes(text)


@app.callback()
def _root() -> None:
    """Onward: an event-sourced durable runtime for agent runs."""


def main() -> None:
    """Entry point of the `onward` console script."""
    app()
