"""`onward schema`: the JSON Schema of the events, as committed in schemas/events.schema.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from onward.errors import InvalidInputError
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
        return
    try:
        output.write_bytes(text)
    except OSError as exc:
        # A local file, not a server: the boundary would take an OSError for one that is down.
        raise InvalidInputError(
            f"--output: cannot write {str(output)!r}: {exc.strerror or exc}"
        ) from exc
