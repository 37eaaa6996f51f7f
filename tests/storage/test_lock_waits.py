"""A lock every process sees (the inline fold's), held by a process that was paused: the wait
says what it waits on, who holds it and until when, then ends, and a run goes on without the
checkpoints it could not fold.

The holder is a real process (`support.lock_child`) stopped with SIGSTOP while it holds the
lock through the same store call a worker's fold uses; SQLite's lock file and PostgreSQL's
advisory lock, and a whole run through `AgentRunner` on each embedded deployment.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from support.histories import assert_stored_is_the_direct_fold
from support.processes import spawn_support

from onward._storage import PostgresStore, SqliteStore
from onward._storage.locks import STUCK_WAIT_S
from onward.errors import BackendUnavailableError
from onward.eventlog import Message, PostgresEventLog, SqliteEventLog, ToolCall
from onward.eventlog.base import EventLog
from onward.projections.base import FrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime import Agent, ModelReply, reply, tool
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.leases import PostgresLeaseStore, SqliteLeaseStore
from onward.runtime.leases.base import LeaseStore
from onward.runtime.observability.metrics import COUNTS
from onward.runtime.runner import AgentRunner

TENANT = "acme"
STILL = (
    r"a wait of 2\.5 s for it gave up at \d\d:\d\d:\d\d UTC, and until it is taken again it is "
    r"waited for 1 s at most"
)


@asynccontextmanager
async def paused_holder(*args: str) -> AsyncIterator[int]:
    """A child process holding the fold lock of the store ``args`` name, stopped; its pid.
    Killed on the way out, which lets the lock go."""
    child = await spawn_support("lock_child", *args, stdout=asyncio.subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line.strip() == b"held", line
        child.send_signal(signal.SIGSTOP)
        yield child.pid
    finally:
        child.kill()
        await child.wait()


async def _refused(
    store: SqliteStore | PostgresStore, caplog: pytest.LogCaptureFixture
) -> tuple[str, list[str], float]:
    """Wait for ``store``'s fold lock while a paused process holds it: the error it ended
    with, the lines it said while it waited, and how long it took."""
    caplog.clear()
    began = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="onward.locks"),
        pytest.raises(BackendUnavailableError) as refused,
    ):
        async with store.exclusive("fold"):
            raise AssertionError("the lock was taken while a paused process held it")
    said = [r.getMessage() for r in caplog.records if r.name == "onward.locks"]
    return str(refused.value), said, time.monotonic() - began


async def refused_wait(
    store: SqliteStore | PostgresStore, caplog: pytest.LogCaptureFixture
) -> tuple[str, str]:
    """The first wait: the error it ended with and the one line it said while it waited."""
    refused, [said], took = await _refused(store, caplog)
    assert 2.5 <= took < 5  # the store's timeout: 2.5 s
    return refused, said


async def refused_again(
    store: SqliteStore | PostgresStore, caplog: pytest.LogCaptureFixture
) -> str:
    """A wait after one gave up: the error it ended with, within about a second
    (`STUCK_WAIT_S`), having said nothing while it waited."""
    refused, said, took = await _refused(store, caplog)
    assert STUCK_WAIT_S <= took < STUCK_WAIT_S + 1
    assert not said
    return refused


async def test_a_file_lock_held_by_a_paused_process_is_waited_for_aloud_then_given_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "onward.db"
    async with SqliteStore(db, lock_timeout_s=2.5) as store:
        async with paused_holder("sqlite", str(db)) as pid:
            refused, said = await refused_wait(store, caplog)
            again = await refused_again(store, caplog)
        # The holder is named as it wrote itself into the lock file: pid, host, since when.
        held_by = rf"held by pid {pid} on \S+ since \d\d:\d\d:\d\d UTC"
        lock = re.escape(f"the fold lock of {db}")
        assert re.search(rf"^{lock} was not free within 2\.5 s \({held_by}\)", refused), refused
        assert re.search(rf"^waiting for {lock}, {held_by}, until \d\d:\d\d:\d\d UTC", said)
        assert re.search(rf"^{lock} is still not free \({held_by}\): {STILL}", again), again
        async with asyncio.timeout(1), store.exclusive("fold"):
            pass  # the holder is gone: taken at once
        async with paused_holder("sqlite", str(db)):
            # Taken again since: a new wait lasts the whole timeout once more.
            refused, _ = await refused_wait(store, caplog)
        assert "was not free within 2.5 s" in refused


async def test_an_advisory_lock_held_by_a_paused_process_is_waited_for_aloud_then_given_up(
    database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with PostgresStore(database_url, schema=pg_schema, timeout_s=2.5) as store:
        async with paused_holder("postgres", database_url, pg_schema):
            refused, said = await refused_wait(store, caplog)
            again = await refused_again(store, caplog)
        # The holder is named as the server knows it: its backend and application name.
        held_by = rf"held by backend pid \d+ \(onward:{pg_schema} from 127\.0\.0\.1\)"
        lock = f"the fold lock of PostgreSQL schema {pg_schema}"
        assert re.search(rf"^{lock} was not free within 2\.5 s \({held_by}\)", refused), refused
        assert re.search(rf"^waiting for {lock}, {held_by}, until \d\d:\d\d:\d\d UTC", said)
        assert re.search(rf"^{lock} is still not free \({held_by}\): {STILL}", again), again
        async with asyncio.timeout(2), store.exclusive("fold"):
            pass  # the holder's connection closed with it: taken at once


@tool
async def look(query: str, *, idempotency_key: str) -> str:
    """Records each call, so a test sees that none ran twice."""
    LOOKED.append(idempotency_key)
    return f"found {query}"


LOOKED: list[str] = []
AGENT = Agent(name="looker", instructions="look", tools=[look])


class ThreeLooks:
    """A model that asks for three lookups, one at a time, then answers."""

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        done = sum(1 for m in messages if m.role == "tool")
        if done < 3:
            return reply("", ToolCall(call_id=f"c{done}", tool="look", args={"query": f"q{done}"}))
        return reply("three found")


async def run_beside_a_paused_fold(
    log: EventLog,
    frontiers: FrontierStore,
    leases: LeaseStore,
    holder: tuple[str, ...],
    caplog: pytest.LogCaptureFixture,
) -> tuple[str, list[str]]:
    """One run through `AgentRunner` while a paused process holds the fold lock; its status
    and the checkpoints the runner said it could not write."""
    LOOKED.clear()
    not_written = COUNTS.checkpoints_not_written
    runner = AgentRunner(
        provider=ThreeLooks(), log=log, frontiers=frontiers, leases=leases, checkpoint_inline=True
    )
    async with paused_holder(*holder):
        result = await asyncio.wait_for(
            runner.run(AGENT, {"ask": "look"}, tenant=TENANT, run_id="r-paused-fold"), 120
        )
    # Each checkpoint it gave up is counted for the metrics (onward_checkpoints_not_written).
    assert COUNTS.checkpoints_not_written - not_written == _checkpoints_not_written(caplog)
    return result.status, sorted(set(LOOKED))


@pytest.mark.timeout(180)
async def test_a_run_on_sqlite_goes_on_while_a_paused_process_holds_the_fold_lock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "onward.db"
    with caplog.at_level(logging.WARNING):
        async with (
            SqliteEventLog(db) as log,
            SqliteFrontierStore(db, lock_timeout_s=3) as frontiers,
            SqliteLeaseStore(db) as leases,
        ):
            status, looked = await run_beside_a_paused_fold(
                log, frontiers, leases, ("sqlite", str(db)), caplog
            )
            assert status == "completed"
            assert len(looked) == len(LOOKED) == 3  # each lookup once
            assert _checkpoints_not_written(caplog) > 1
            assert _whole_waits(caplog) == 1  # the later ones a second each, not 3 s each
            await Checkpointer(frontiers, log).catch_up()  # the holder is gone: folds at once
            await assert_stored_is_the_direct_fold(frontiers, log, ["r-paused-fold"])
            [row] = (await frontiers.load(["r-paused-fold"])).values()
            assert row.frontier is not None
            assert row.frontier.status == "completed"


@pytest.mark.timeout(180)
async def test_a_run_on_postgres_alone_goes_on_while_a_paused_process_holds_the_fold_lock(
    database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        async with (
            PostgresEventLog(database_url, schema=pg_schema, partitions=2) as log,
            PostgresFrontierStore(database_url, schema=pg_schema, timeout_s=3) as frontiers,
            PostgresLeaseStore(database_url, schema=pg_schema) as leases,
        ):
            status, looked = await run_beside_a_paused_fold(
                log, frontiers, leases, ("postgres", database_url, pg_schema), caplog
            )
            assert status == "completed"
            assert len(looked) == len(LOOKED) == 3
            assert _checkpoints_not_written(caplog) > 1
            assert _whole_waits(caplog) == 1  # the later ones a second each, not 3 s each
            await Checkpointer(frontiers, log).catch_up()
            await assert_stored_is_the_direct_fold(frontiers, log, ["r-paused-fold"])
            [row] = (await frontiers.load(["r-paused-fold"])).values()
            assert row.frontier is not None
            assert row.frontier.status == "completed"


def _whole_waits(caplog: pytest.LogCaptureFixture) -> int:
    """How many skipped checkpoints waited for the fold lock for the whole timeout."""
    return _checkpoints_not_written(caplog, saying="was not free within 3 s")


def _checkpoints_not_written(caplog: pytest.LogCaptureFixture, saying: str = "") -> int:
    """How many checkpoints the runner said it skipped because the fold lock was not free
    (those whose reason says ``saying``)."""
    return sum(
        1
        for r in caplog.records
        if r.name == "onward.checkpoint"
        and "checkpoint not written, the run carries on" in r.getMessage()
        and "fold lock" in r.getMessage()
        and saying in r.getMessage()
    )
