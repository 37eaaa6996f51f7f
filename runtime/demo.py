"""The booking demo: a run killed right after its booking took effect, resumed with one seat.

The agent asks, in one turn, to search for a flight and to book a seat. The booking tool writes to
the demo's own ledger (a file), which is also what its status check reads. A child process runs
the agent and is killed with SIGKILL right after the booking was made and before its result was
written to the log. A new process resumes: the search is replayed from its recorded result, the
booking is undecided until the booking tool's status check answers that it went through, and
the run finishes with exactly one booking in the ledger.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from onward.errors import ResumeConflictError
from onward.eventlog import SqliteEventLog
from onward.eventlog.events import Event, ToolCall
from onward.projections.sqlite import SqliteFrontierStore

from .agent import Agent
from .blobs import SqliteBlobStore
from .checkpoint import CheckpointPolicy
from .demo_ledger import Ledger
from .leases.base import LeasePolicy
from .providers import ScriptedProvider, reply
from .runner import AgentRunner, RunResult
from .tools import Reconciled, Tool, tool

TENANT = "demo"
RUN_ID = "run-booking-1"
DEMO_LEASE_S = 2.0
"""worker-1's lease ttl: short, so the demo waits two seconds for it to lapse, not five minutes."""


def booking_tools(ledger: Ledger) -> list[Tool]:
    """The demo's two tools: a harmless search and a booking with a status check."""

    @tool(retry_safe=True)
    async def search_flights(destination: str, *, idempotency_key: str) -> list[dict[str, str]]:
        """Flights to a destination."""
        return [{"flight": "ON123", "to": destination, "departs": "09:40"}]

    async def booking_status(key: str) -> Reconciled | None:
        entry = ledger.find("book_seat", key)
        if entry is None:
            return Reconciled("never_ran")
        return Reconciled("completed", {"confirmation": entry["confirmation"]})

    @tool(reconcile=booking_status)
    async def book_seat(flight: str, seat: str, *, idempotency_key: str) -> dict[str, str]:
        """Book a seat; charges the customer."""
        await asyncio.sleep(0.2)  # the airline is slower than the search
        confirmation = f"CONF-{idempotency_key[-6:].upper()}"
        ledger.record(
            "book_seat", idempotency_key, flight=flight, seat=seat, confirmation=confirmation
        )
        return {"confirmation": confirmation}

    return [search_flights, book_seat]


def booking_agent(ledger: Ledger) -> Agent:
    """The demo agent."""
    return Agent(
        name="booker",
        instructions="Book the flight the customer asks for. Never book twice.",
        tools=booking_tools(ledger),
        model="scripted",
    )


def booking_provider() -> ScriptedProvider:
    """A model that searches and books in one turn, then confirms."""
    return ScriptedProvider(
        [
            reply(
                "Searching and booking.",
                ToolCall(call_id="search", tool="search_flights", args={"destination": "Lisbon"}),
                ToolCall(call_id="book", tool="book_seat", args={"flight": "ON123", "seat": "14C"}),
            ),
            reply("You are booked on ON123, seat 14C."),
        ]
    )


class _KillAfterBooking:
    """Kills this process right after the booking tool returned, before its result is logged."""

    async def appended(self, events: Sequence[Event]) -> None:
        return None

    async def before_model_call(self) -> None:
        return None

    async def tool_returned(self, call_id: str) -> None:
        if call_id == "book":
            os.kill(os.getpid(), signal.SIGKILL)


@asynccontextmanager
async def _runner(workdir: Path, **kw: Any) -> AsyncIterator[AgentRunner]:
    """A runner on the demo's SQLite file in ``workdir``; its stores close when the block ends."""
    db = workdir / "onward.db"
    async with (
        SqliteEventLog(db) as log,
        SqliteFrontierStore(db) as store,
        SqliteBlobStore(db) as blobs,
    ):
        yield AgentRunner(
            provider=booking_provider(),
            log=log,
            frontiers=store,
            checkpoint_inline=True,
            checkpoints=CheckpointPolicy(),
            blobs=blobs,
            **kw,
        )


async def _child(workdir: Path) -> None:
    ledger = Ledger(workdir / "ledger.jsonl")
    async with _runner(
        workdir,
        observer=_KillAfterBooking(),
        worker="worker-1",
        lease_policy=LeasePolicy(ttl=timedelta(seconds=DEMO_LEASE_S)),
    ) as runner:
        await runner.run(
            booking_agent(ledger),
            "Book me on the morning flight to Lisbon",
            tenant=TENANT,
            run_id=RUN_ID,
        )


async def _resume(workdir: Path, console: Console) -> RunResult:
    ledger = Ledger(workdir / "ledger.jsonl")
    async with _runner(workdir, worker="worker-2") as runner:
        while True:
            try:
                return await runner.resume(booking_agent(ledger), RUN_ID, tenant=TENANT)
            except ResumeConflictError as held:
                # The dead worker's lease lapses on the store's clock (this machine's); until
                # then it holds, so wait until then and ask again.
                left = DEMO_LEASE_S if held.expires_at is None else held.expires_at - time.time()
                left = min(max(left, 0.05), DEMO_LEASE_S)
                console.print(
                    f"   held by {held.holder} until its lease lapses, in {left:.1f} s; waiting"
                )
                await asyncio.sleep(left + 0.05)


def run_demo(
    workdir: Path | None = None,
    console: Console | None = None,
    *,
    run_loop: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run,
) -> int | None:
    """Run the whole demo; return the number of bookings in the ledger (1 when all is well), or
    ``None`` when worker-1 ended otherwise than killed after the booking (its run was started
    already, or it failed): the rest of the story would not be true, so it is not told.

    ``run_loop`` runs the resume's event loop: `onward demo` passes one that turns SIGTERM into
    a cancel of the resume (a Python handler raising inside the loop ended whichever task ran,
    a lease's renewal, and the signal was lost).
    """
    console = console or Console()
    own_dir = workdir is None
    directory = Path(tempfile.mkdtemp(prefix="onward-demo-")) if workdir is None else workdir
    directory.mkdir(parents=True, exist_ok=True)
    console.rule("Onward demo: a booking that must not happen twice")
    console.print(f"embedded store: {directory / 'onward.db'}")
    console.print(
        "1. worker-1 starts the run in a child process; the model asks to search and book"
    )
    child = subprocess.run(
        [sys.executable, "-m", "onward", "demo", "--child", str(directory)], check=False
    )
    ledger = Ledger(directory / "ledger.jsonl")
    if child.returncode != -signal.SIGKILL:
        console.print(
            f"[red]2. worker-1 ended with exit {child.returncode} instead of being killed after "
            "the booking (its error is above); the demo stops[/red]"
        )
        return None
    console.print(
        f"2. worker-1 was killed with SIGKILL (exit {child.returncode}) right after the airline "
        f"booked the seat; bookings in the airline's ledger: {len(ledger.entries())}"
    )
    console.print(
        "3. worker-2, a new process, resumes the run from the log once worker-1's lease lapses"
    )
    result = run_loop(_resume(directory, console))
    table = Table(title="what resume decided, call by call")
    table.add_column("call")
    table.add_column("the log said")
    table.add_column("resume did")
    for planned in result.plan.calls if result.plan else ():
        call = planned.call
        if call.call_id in result.reconciled:
            said = "dispatched, no result: indeterminate"
            did = f"asked {call.tool}'s status check, which answered completed: replayed"
        else:
            said = planned.reason
            did = "replayed the recorded result" if call.outcome else planned.disposition.value
        table.add_row(f"{call.call_id} ({call.tool})", said, did)
    console.print(table)
    console.print(f"4. the run is {result.status}: {result.output}")
    bookings = len(ledger.entries())
    colour = "green" if bookings == 1 else "red"
    console.print(f"[{colour}]bookings in the airline's ledger: {bookings}[/{colour}]")
    if own_dir:
        console.print(f"(files kept in {directory})")
    database = shlex.quote(str(directory / "onward.db"))
    console.print(f"5. look at what it did (run {RUN_ID}, tenant {TENANT}):")
    for command in ("inspect", "replay"):
        console.print(
            f"   ONWARD_SQLITE_PATH={database} onward {command} {RUN_ID} --tenant {TENANT}",
            soft_wrap=True,
            highlight=False,
        )
    return bookings


def run_child(workdir: Path) -> None:
    """The child half of the demo (killed on purpose)."""
    asyncio.run(_child(workdir))
