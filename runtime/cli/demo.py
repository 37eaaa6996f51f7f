"""`onward demo`: a booking run killed mid-way and resumed elsewhere, one booking, never two."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from onward.errors import InvalidInputError


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
    if directory is not None:
        _check_dir(directory)
    bookings = booking.run_demo(directory, Console())
    if bookings != 1:
        raise typer.Exit(1)


def _check_dir(directory: Path) -> None:
    """Make ``--dir`` if need be, and refuse one holding an ``onward.db`` or ``ledger.jsonl``:
    an earlier demo's (its run exists, so the child would start nothing and the demo would show
    the old booking as its own) or another program's, which the demo must not write to.

    Raises:
        InvalidInputError: The directory cannot be made, or holds one of those files (exit 2).
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(
            f"--dir: cannot make {str(directory)!r}: {exc.strerror or exc}"
        ) from exc
    held = [name for name in ("onward.db", "ledger.jsonl") if (directory / name).exists()]
    if held:
        raise InvalidInputError(
            f"--dir: {str(directory)!r} holds {' and '.join(held)} already (an earlier demo's?); "
            "give a new or empty directory"
        )
