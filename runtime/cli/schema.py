"""`onward schema`: the JSON Schema of the events, as committed in schemas/events.schema.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from onward.eventlog.schema import event_schema

from ._common import echo


def schema_command(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here instead of standard output."),
    ] = None,
) -> None:
    """Print the JSON Schema of the events (committed as schemas/events.schema.json)."""
    text = event_schema()
    if output is None:
        echo(text.decode(), nl=False)
    else:
        output.write_bytes(text)
