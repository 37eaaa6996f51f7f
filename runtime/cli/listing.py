"""`onward runs`: the runs the frontier store knows, filtered and a page at a time.

The filters are the store's query (`FrontierStore.runs`), not a scan here: a store of millions
of finished runs answers ``--status waiting`` from its (status, run id) index. Pages are keyed
by run id (the last id shown is the cursor), so a run written while an operator pages through
is never shown twice and never makes another run be skipped.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, cast, get_args

import typer
from rich.table import Table

from onward._storage import check_onward_sqlite
from onward.errors import ConfigurationError, InvalidInputError
from onward.projections.audit import shell_word
from onward.projections.base import FrontierStore, RunSummary
from onward.projections.frontier import RunStatus
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.limits import check_stored_name
from onward.runtime.settings import Settings, load_settings
from onward.runtime.spend.base import Spend, SpendLedger
from onward.runtime.spend.postgres import PostgresSpendLedger
from onward.runtime.spend.sqlite import SqliteSpendLedger

from ._common import echo_json, err, frontier_server, opened, out, run_until_terminated
from .summary import shown, utc_time

RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
"""The statuses ``--status`` takes: a frontier's."""

DEFAULT_LIMIT = 100
"""Runs on one page unless ``--limit`` says otherwise."""
MAX_LIMIT = 10_000

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str, option: str) -> float:
    """Seconds in ``30s``, ``15m``, ``2h`` or ``7d``.

    Raises:
        InvalidInputError: Anything else (exit 2), naming ``option``.
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise InvalidInputError(
            f"{option}: {text!r} is not a duration; give a number and a unit, s, m, h or d "
            "(30s, 15m, 2h, 7d)"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def check_statuses(given: list[str]) -> list[RunStatus]:
    """The statuses of ``--status``, refusing one a frontier never has (exit 2)."""
    for status in given:
        if status not in RUN_STATUSES:
            raise InvalidInputError(
                f"--status: {status!r} is not a run status; one of {', '.join(RUN_STATUSES)}"
            )
    return [cast(RunStatus, status) for status in RUN_STATUSES if status in given]


def check_cursor(after: str) -> str:
    """``--after`` if it is a cursor a store can compare, else `InvalidInputError` (exit 2).

    A cursor is the last run id of a page, and a producer on the log may have written a run
    id no name check would pass (a control character, more than a name's length; the log
    refuses only NUL): refused as a name, the runs after it could not be listed. It is held
    to what a stored run id can be (`check_stored_name`).
    """
    if not after:
        raise InvalidInputError("--after must not be empty; give the cursor a page ended with")
    return check_stored_name("--after", after)


def frontier_store(config: Settings) -> FrontierStore:
    """The configured backend's frontier store, read-only: listing needs nothing else, so it
    works while the event log's servers are away.

    Raises:
        ConfigurationError: The memory backend (no run outlives its process), a SQLite file
            that is missing or is not an Onward database, or no ``DATABASE_URL`` for Kafka.
    """
    if config.backend in ("kafka", "postgres"):
        from onward.runtime.backends import kafka_frontier_store  # noqa: PLC0415 - loads the runner

        return kafka_frontier_store(config)
    if config.backend == "sqlite":
        path = config.sqlite_path
        if not path.exists():
            raise ConfigurationError(
                f"ONWARD_SQLITE_PATH {str(path)!r} does not exist; point it at the database "
                "the runs were written to"
            )
        check_onward_sqlite(path)
        return SqliteFrontierStore(path, readonly=True)
    raise ConfigurationError(
        "ONWARD_BACKEND=memory keeps nothing past the process, so there is no run here to "
        "list; use sqlite (ONWARD_SQLITE_PATH) or kafka"
    )


def spend_ledger(config: Settings) -> SpendLedger:
    """The configured backend's spend ledger, read-only, beside `frontier_store` (which has
    already refused what it refuses): one query a page, for the SPEND column."""
    if config.backend == "sqlite":
        return SqliteSpendLedger(config.sqlite_path, readonly=True)
    return PostgresSpendLedger(
        config.require_database_url(),
        schema=config.database_schema,
        timeout_s=config.backend_timeout,
    )


def age_text(seconds: float) -> str:
    """A short age: ``42s``, ``15m``, ``3h``, ``2d``."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def _when(at_us: int) -> str | None:
    """A run's last update in UTC to the second; ``None`` when no date holds it (`utc_time`)."""
    when = utc_time(at_us)
    return None if when is None else when.strftime("%Y-%m-%dT%H:%M:%SZ")


def run_line(summary: RunSummary, *, now_us: int, spend: Spend | None = None) -> dict[str, Any]:
    """One run as ``--json`` prints it; ``spend_micros`` is 0 for a run with nothing recorded."""
    return {
        "run": summary.run_id,
        "tenant": summary.tenant,
        "agent": summary.agent,
        "status": summary.status,
        "user": summary.user_id,
        "waiting_on": summary.waiting_on,
        "holder": summary.holder,
        "iteration": summary.iteration,
        "last_seq": summary.last_seq,
        "updated_at": _when(summary.updated_at),
        "age_s": round(max(now_us - summary.updated_at, 0) / 1e6, 3),
        "spend_micros": (spend or Spend()).micros,
    }


def runs_table(
    rows: list[RunSummary], *, now_us: int, spend: dict[str, Spend] | None = None
) -> Table:
    """The default output: one row per run; SPEND in micros, as the spend ledger has it."""
    spend = spend or {}
    table = Table(box=None, pad_edge=False)
    for column in ("RUN", "TENANT", "AGENT", "STATUS", "AGE"):
        table.add_column(column, overflow="fold")
    # The long ids fold, not the times and figures, so 80 columns still read well.
    table.add_column("LAST UPDATE", no_wrap=True)
    table.add_column("SPEND", justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            shown(row.run_id),
            shown(row.tenant),
            shown(row.agent or "-"),
            row.status,
            age_text(max(now_us - row.updated_at, 0) / 1e6),
            _when(row.updated_at) or "-",
            str(spend.get(row.run_id, Spend()).micros),
        )
    return table


def runs_command(
    *,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help=f"Only runs in this status ({', '.join(RUN_STATUSES)}); may be repeated.",
        ),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="Only this tenant's runs.")
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", help="Only runs started for this person.")
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", metavar="NAME", help="Only this agent's runs.")
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Only runs last updated longer ago than this: 30s, 15m, 2h, 7d.",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", help="Most runs on one page.")
    ] = DEFAULT_LIMIT,
    after: Annotated[
        str | None,
        typer.Option(
            "--after",
            metavar="CURSOR",
            help="The page after this cursor (the one the last page ended with).",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='JSON lines: one object per run, then {"next": CURSOR} if more runs follow.',
        ),
    ] = False,
) -> None:
    """List runs from the frontier store, by run id: run, tenant, agent, status, age (since
    the run's last update), last update and spend (micros, from the spend ledger). Takes no
    lease, writes nothing.

    A page holds --limit runs; when more follow, the next page is the same command with
    --after CURSOR (said on stderr, or as a last {"next": CURSOR} line with --json).

    Exit 0: listed (none may match). 2: bad command line (an unknown status, a duration
    without a unit), or the SQLite file is missing or is not an Onward database. 5: a store
    failed.
    """
    statuses = check_statuses(status) if status else None
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInputError(f"--limit must be from 1 to {MAX_LIMIT}, got {limit}")
    for option, given in (("--tenant", tenant), ("--user", user), ("--agent", agent)):
        if given is not None:
            check_stored_name(option, given)
    if after is not None:
        check_cursor(after)
    now_us = time.time_ns() // 1000
    updated_before = None
    if older_than is not None:
        # Longer ago than the epoch matches no run: the store is asked for none before 0.
        seconds = parse_duration(older_than, "--older-than")
        updated_before = int(max(now_us - seconds * 1e6, 0))

    config = load_settings()

    async def work() -> tuple[list[RunSummary], dict[str, Spend]]:
        async with opened(frontier_server(config), frontier_store(config)) as store:
            rows = await store.runs(
                tenant=tenant,
                statuses=statuses,
                user=user,
                agent=agent,
                updated_before=updated_before,
                after=after,
                limit=limit + 1,
            )
        if not rows:
            return rows, {}
        ledger_server = (
            "the sqlite spend ledger" if config.backend == "sqlite" else "PostgreSQL (DATABASE_URL)"
        )
        async with opened(ledger_server, spend_ledger(config)) as ledger:
            return rows, await ledger.run_totals([row.run_id for row in rows[:limit]])

    rows, spend = run_until_terminated(work())
    page, more = rows[:limit], len(rows) > limit
    cursor = page[-1].run_id if more else None
    if as_json:
        for row in page:
            echo_json(run_line(row, now_us=now_us, spend=spend.get(row.run_id)))
        if cursor is not None:
            echo_json({"next": cursor})
        return
    out.print(runs_table(page, now_us=now_us, spend=spend))
    if cursor is not None:
        err.print(
            shown(f"more runs follow; the next page: add --after {shell_word(cursor)}"),
            soft_wrap=True,
        )
