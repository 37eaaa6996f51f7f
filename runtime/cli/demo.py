"""`onward demo`: a booking run killed mid-way and resumed elsewhere, one booking, never two."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def demo_command(
    child: Annotated[Path | None, typer.Option(hidden=True)] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Keep the demo's files here (default: a temp dir).")
    ] = None,
) -> None:
    """Kill a booking run mid-way and resume it elsewhere: one booking, never two.

    Exit 0: one booking. 1: the demo did not end with exactly one booking.
    """
    from onward.runtime import demo as booking  # noqa: PLC0415 - its tools load only for the demo

    if child is not None:
        booking.run_child(child)
        return
    bookings = booking.run_demo(directory, Console())
    if bookings != 1:
        raise typer.Exit(1)
