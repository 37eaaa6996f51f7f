"""`onward demo`: a booking run killed mid-way and resumed elsewhere, one booking, never two."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from onward.errors import InvalidInputError

from ._common import TerminatedError, run_until_terminated


def demo_command(
    child: Annotated[Path | None, typer.Option(hidden=True)] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Keep the demo's files here (default: a temp dir).")
    ] = None,
) -> None:
    """Kill a booking run mid-way and resume it elsewhere: one booking, never two.

    Exit 0: one booking. 1: the demo did not end with exactly one booking, or its first
    worker ended otherwise than killed after booking.
    """
    from onward.runtime import demo as booking  # noqa: PLC0415 - its tools load only for the demo

    if child is not None:
        booking.run_child(child)
        return
    if directory is not None:
        _check_dir(directory)
    with _terminable():
        bookings = booking.run_demo(directory, Console(), run_loop=run_until_terminated)
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
    if not held:
        try:
            # Made exclusively, the ledger claims the directory: of two demos started into it
            # together, the second finds it there, as it would an earlier demo's.
            (directory / "ledger.jsonl").open("x").close()
        except FileExistsError:
            held = ["ledger.jsonl"]
    if held:
        raise InvalidInputError(
            f"--dir: {str(directory)!r} holds {' and '.join(held)} already (an earlier demo's?); "
            "give a new or empty directory"
        )


@contextlib.contextmanager
def _terminable() -> Iterator[None]:
    """SIGTERM stops the demo as Ctrl-C does, in one line and exit 143 (`TerminatedError`),
    its child killed on the way out (``subprocess.run`` kills it on an exception); without a
    handler the demo died of the signal unsaid, its child left running on its own."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only (a command run by a test)
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise TerminatedError

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if previous is not None:  # None: set outside Python, and cannot be put back
            signal.signal(signal.SIGTERM, previous)
