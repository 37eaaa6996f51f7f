"""`onward quarantine list`, `release` and `dismiss`: records and runs set aside by the projector.

A record the projector cannot read (not JSON, an unknown kind, a newer format) never stops its
partition: the projector stores where it is and why in the quarantine table, marks the run's
frontier row, and skips the run until a person releases it here. Releasing marks the run's
entries released; the projector's next pass folds the run again from its first offset (in
embedded mode this command does it at once) and, if the record is still unreadable, holds the
run again, once, until the next release. A record that names no run (nothing of it could be
read) has no run to release: a person who has seen to it dismisses it by its position.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer
from rich.table import Table

from onward._storage import check_onward_sqlite
from onward.errors import ConfigurationError, InvalidInputError, NothingToResumeError
from onward.eventlog.base import EventLog
from onward.eventlog.postgres import PostgresEventLog
from onward.eventlog.sqlite import SqliteEventLog
from onward.projections.audit import shell_word
from onward.projections.base import (
    DEFAULT_CONSUMER,
    FrontierStore,
    QuarantineEntry,
    QuarantineState,
)
from onward.projections.compaction import CompactionStore, PostgresCompactionStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.backends import kafka_frontier_store
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.limits import check_name, check_stored_name
from onward.runtime.settings import Settings, load_settings

from ._common import (
    JsonResultOption,
    RunArgument,
    echo_json,
    frontier_server,
    opened,
    out,
    run_until_terminated,
)
from .summary import shown

_T = TypeVar("_T")

ByOption = Annotated[str, typer.Option("--by", help="Who releases the run; recorded with it.")]
PartitionOption = Annotated[
    int,
    typer.Option("--partition", min=0, max=2**31 - 1, help="The partition the record is in."),
]
OffsetOption = Annotated[
    int, typer.Option("--offset", min=0, max=2**63 - 1, help="The record's offset there.")
]
DismissedByOption = Annotated[
    str, typer.Option("--by", help="Who dismisses the record; recorded with it.")
]

_FOLDED_HERE = ("sqlite", "postgres")
"""The backends with no projector process: whoever appends folds, and so does a release."""


def _store(config: Settings, *, readonly: bool = False) -> FrontierStore:
    """The frontier store the configured projector writes its quarantine entries to."""
    if config.backend == "sqlite":
        if not config.sqlite_path.exists():
            raise ConfigurationError(
                f"ONWARD_SQLITE_PATH {str(config.sqlite_path)!r} does not exist; point it at "
                "the database the runs were written to"
            )
        check_onward_sqlite(config.sqlite_path)
        return SqliteFrontierStore(config.sqlite_path, migrate=False, readonly=readonly)
    if config.backend == "kafka":
        return kafka_frontier_store(config, pool_size=1)
    if config.backend == "postgres":
        # Folding a released run holds the fold lock on one connection and folds on another.
        return kafka_frontier_store(config, pool_size=2)
    raise ConfigurationError(
        "ONWARD_BACKEND=memory keeps nothing past the process, so nothing is quarantined; use "
        "sqlite (ONWARD_SQLITE_PATH) or kafka"
    )


def _with_store(
    config: Settings, work: Callable[[FrontierStore], Awaitable[_T]], *, readonly: bool = False
) -> _T:
    async def run() -> _T:
        store = _store(config, readonly=readonly)
        async with opened(frontier_server(config), store) as store:
            return await work(store)

    return run_until_terminated(run())


def _table(entries: list[QuarantineEntry]) -> Table:
    runs = len({e.run_id for e in entries if e.run_id is not None})  # a nameless one is no run's
    table = Table(
        title=f"{len(entries)} quarantined record(s) of {runs} run(s)", title_justify="left"
    )
    for column in ("run", "tenant", "partition", "offset", "kind", "state", "reason"):
        table.add_column(column, overflow="fold")
    for entry in entries:
        state: str = entry.state
        if entry.released_by is not None and entry.state != "held":
            state += f" by {entry.released_by}"
        table.add_row(
            shown(entry.run_id or "-"),
            shown(entry.tenant or "-"),
            str(entry.partition),
            str(entry.offset),
            shown(entry.kind or "-"),
            shown(state, style="red" if entry.state == "held" else ""),
            shown(entry.reason),
        )
    return table


def list_command(
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON lines, one object per record, instead of a table.")
    ] = False,
    everything: Annotated[
        bool, typer.Option("--all", help="Also the records of runs already folded again.")
    ] = False,
) -> None:
    """List the records the projector set aside: run, position, kind and why (never the bytes).

    Takes no lease and writes nothing (SQLite is opened read-only).

    Exit 0: listed (none is not an error). 2: bad configuration. 5: a store failed.
    """
    config = load_settings()
    states: set[QuarantineState] | None = None if everything else {"held", "released"}
    entries = _with_store(
        config, lambda store: store.quarantined(DEFAULT_CONSUMER, states=states), readonly=True
    )
    if as_json:
        for entry in entries:
            echo_json(dataclasses.asdict(entry))
        return
    if not entries:
        out.print("no quarantined records")
        return
    out.print(_table(entries))


def release_command(run_id: RunArgument, by: ByOption, as_json: JsonResultOption = False) -> None:
    """Release a quarantined run: the projector folds it again from its first offset.

    If a record of it is still unreadable (no newer Onward yet), the run is held again.
    Exit 0: released. 1: the run has no held record. 2: bad configuration. 5: a store failed.
    """
    check_stored_name("run_id", run_id)
    check_name("--by", by)
    config = load_settings()

    async def release(store: FrontierStore) -> tuple[int, str | None]:
        released = await store.release(DEFAULT_CONSUMER, run_id, by=by, at=time.time_ns() // 1_000)
        if not released or config.backend not in _FOLDED_HERE:
            return released, None
        # Embedded mode has no projector process: fold the run again here and now.
        async with _embedded_log(config) as log, _embedded_compaction(config) as compaction:
            await Checkpointer(store, log, compaction=compaction).catch_up()
        row = await store.get(run_id)
        return released, row.quarantined if row is not None else None

    released, still = _with_store(config, release)
    if not released:
        raise NothingToResumeError(
            f"run {run_id!r} has no quarantined record held; see onward quarantine list",
            run_id=run_id,
        )
    if as_json:
        folded = config.backend in _FOLDED_HERE
        echo_json({"run": run_id, "released": released, "by": by, "folded": folded, "held": still})
    elif config.backend not in _FOLDED_HERE:
        out.print(
            shown(
                f"released run {run_id} ({released} record(s), by {by}); the projector folds "
                "it again from its first offset on its next pass, and holds it again if a "
                "record is still unreadable"
            ),
            soft_wrap=True,
        )
    elif still is None:
        out.print(shown(f"released run {run_id} (by {by}) and folded it again"), soft_wrap=True)
    else:
        out.print(
            shown(f"released run {run_id} (by {by}); still unreadable, held again: {still}"),
            soft_wrap=True,
        )


def dismiss_command(
    partition: PartitionOption,
    offset: OffsetOption,
    by: DismissedByOption,
    as_json: JsonResultOption = False,
) -> None:
    """Dismiss a held record that names no run (nothing of it could be read): seen to.

    It leaves the default list (``--all`` shows it cleared, by whom). A record that names a run
    is released with ``onward quarantine release RUN``, which folds the run again.
    Exit 0: dismissed. 1: no such record held. 2: bad input or configuration, or the record
    names a run. 5: a store failed.
    """
    check_name("--by", by)
    config = load_settings()
    where = f"partition {partition} offset {offset}"

    async def dismiss(store: FrontierStore) -> QuarantineEntry | None:
        at = time.time_ns() // 1_000
        if await store.dismiss(DEFAULT_CONSUMER, partition, offset, by=by, at=at):
            return None
        found = [
            entry
            for entry in await store.quarantined(DEFAULT_CONSUMER)
            if (entry.partition, entry.offset) == (partition, offset)
        ]
        if not found:
            raise NothingToResumeError(
                f"no quarantined record at {where}; see onward quarantine list"
            )
        return found[0]

    entry = _with_store(config, dismiss)
    if entry is not None and entry.run_id is not None and entry.state != "held":
        # Released already: a release now would only answer that the run holds no record.
        raise NothingToResumeError(
            f"the record at {where} (run {entry.run_id!r}) is not held: {entry.state} by "
            f"{entry.released_by}",
            run_id=entry.run_id,
        )
    if entry is not None and entry.run_id is not None:
        raise InvalidInputError(
            f"the record at {where} names run {entry.run_id!r}: release the run with "
            f"onward quarantine release {shell_word(entry.run_id)} --by {shell_word(by)}, "
            "which folds it again",
            run_id=entry.run_id,
        )
    if entry is not None:
        raise NothingToResumeError(
            f"the record at {where} is not held: already dismissed by {entry.released_by}"
        )
    if as_json:
        echo_json({"partition": partition, "offset": offset, "dismissed": True, "by": by})
    else:
        out.print(shown(f"dismissed the record at {where} (by {by})"), soft_wrap=True)


def _embedded_log(config: Settings) -> EventLog:
    """The log of a backend with no projector process, unopened."""
    if config.backend == "postgres":
        return PostgresEventLog(
            config.require_database_url(),
            schema=config.database_schema,
            partitions=config.partitions,
            max_size=1,
            timeout_s=config.backend_timeout,
        )
    return SqliteEventLog(config.sqlite_path, partitions=config.partitions)


def _embedded_compaction(
    config: Settings,
) -> contextlib.AbstractAsyncContextManager[CompactionStore | None]:
    """Where the fold of a backend with no projector process keeps a frontier over the cap
    (and reads a run compaction cut), unopened: PostgreSQL's beside the rows; ``None`` for
    SQLite, whose log brings its own."""
    if config.backend == "postgres":
        return PostgresCompactionStore(
            config.require_database_url(),
            schema=config.database_schema,
            max_size=1,
            timeout_s=config.backend_timeout,
        )
    return contextlib.nullcontext(None)
