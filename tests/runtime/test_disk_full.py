"""A worker that cannot write lets go: its run resumes within seconds once the disk has room.

The embedded file fills up for real: ``PRAGMA max_page_count`` on the event log's connection
makes SQLite answer the next append that needs a page with ``SQLITE_FULL``, as a full disk
does. On a full disk the lease release fails too (it writes to the same file); an ``UPDATE``
that needs no new page does not fail under ``max_page_count``, so the lease store's connection
is made to refuse writes with ``PRAGMA query_only``, a real SQLite refusal of the same kind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from onward._storage import SqliteStore
from onward.errors import BackendError, ResumeConflictError
from onward.eventlog import (
    Event,
    ModelAnswered,
    RunFinished,
    RunStarted,
    SqliteEventLog,
    ToolCall,
)
from onward.runtime import Agent, AgentRunner, ScriptedProvider, SqliteLeaseStore, reply, tool
from onward.runtime.leases import Leaseholder

TENANT = "acme"
EFFECTS: list[str] = []
"""Idempotency keys of every booking that took effect."""


@tool
async def book(seat: str, *, idempotency_key: str) -> str:
    """Book a seat: a side effect that must not happen twice."""
    EFFECTS.append(idempotency_key)
    return f"booked {seat}"


AGENT = Agent(name="booker", instructions="book", tools=[book])
BIG = random.Random(0).randbytes(14_000).hex()  # even packed, it needs pages of its own


def model() -> ScriptedProvider:
    return ScriptedProvider(
        [reply(BIG, ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("done")]
    )


async def on_thread(store: SqliteStore, statement: str) -> None:
    """Run one PRAGMA on the store's own connection, on its own thread."""
    conn = store._db.connection()
    await store._db.call(lambda: conn.execute(statement).fetchall(), statement)


class FillsTheDisk:
    """Fills the file once the run has started: every later write needing room fails."""

    def __init__(self, log: SqliteEventLog, leases: SqliteLeaseStore) -> None:
        self.log = log
        self.leases = leases

    async def appended(self, events: Sequence[Event]) -> None:
        if any(isinstance(e, RunStarted) for e in events):
            await on_thread(self.log, "PRAGMA max_page_count = 1")  # the current size, at least
            await on_thread(self.leases, "PRAGMA query_only = ON")

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        return None


async def free_the_space(log: SqliteEventLog, leases: SqliteLeaseStore) -> None:
    await on_thread(log, "PRAGMA max_page_count = 1073741823")
    await on_thread(leases, "PRAGMA query_only = OFF")


async def resume_when_free(db: Path, run_id: str, *, within_s: float) -> float:
    """Resume as another worker, retrying while the run is held; return how long it took."""
    started = time.monotonic()
    async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
        runner = AgentRunner(provider=model(), log=log, leases=leases, worker="w2")
        while True:
            try:
                result = await runner.resume(AGENT, run_id, tenant=TENANT)
            except ResumeConflictError:
                if time.monotonic() - started > within_s:
                    raise
                await asyncio.sleep(0.1)
                continue
            assert result.status == "completed"
            return time.monotonic() - started


def intact(db: Path) -> bool:
    conn = sqlite3.connect(db)
    try:
        return bool(conn.execute("PRAGMA integrity_check").fetchone() == ("ok",))
    finally:
        conn.close()


def filling_runner(log: SqliteEventLog, leases: SqliteLeaseStore) -> AgentRunner:
    """Worker ``w1`` on a disk that fills up once its run has started."""
    return AgentRunner(
        provider=model(),
        log=log,
        leases=leases,
        worker="w1",
        observer=FillsTheDisk(log, leases),
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "onward.db"


async def test_a_worker_on_a_full_disk_lets_go_once_there_is_room(db: Path) -> None:
    EFFECTS.clear()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
        runner = filling_runner(log, leases)
        with pytest.raises(BackendError, match="database or disk is full"):
            await runner.run(AGENT, "go", tenant=TENANT, run_id=run_id)
        assert intact(db)
        # The release failed like the append; the lease (five minutes) is still there.
        assert await leases.current(run_id) is not None
        await free_the_space(log, leases)
        took = await resume_when_free(db, run_id, within_s=5)
    assert took < 5
    assert len(EFFECTS) == 1
    assert intact(db)


async def test_a_full_disk_loses_nothing_already_written(db: Path) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
        runner = filling_runner(log, leases)
        with pytest.raises(BackendError):
            await runner.run(AGENT, "go", tenant=TENANT, run_id=run_id)
        stored = [s.event for s in await log.read_run(run_id)]
    assert [type(e) for e in stored] == [RunStarted]
    assert not any(isinstance(e, ModelAnswered) for e in stored)


class RefusesTheReleaseAtTheEnd:
    """Makes the lease store refuse writes once the run's end is appended: the release fails."""

    def __init__(self, leases: SqliteLeaseStore) -> None:
        self.leases = leases

    async def appended(self, events: Sequence[Event]) -> None:
        if any(isinstance(e, RunFinished) for e in events):
            await on_thread(self.leases, "PRAGMA query_only = ON")

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        return None


async def test_a_run_that_ended_is_returned_when_its_lease_cannot_be_released_yet(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The end is durable before the lease is handed back: a refused release is retried in
    the background and logged, and `run` returns the run's end rather than raise (its caller
    would retry a run that exists, and a worker count a start that completed as refused)."""
    EFFECTS.clear()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
        runner = AgentRunner(
            provider=model(),
            log=log,
            leases=leases,
            worker="w1",
            observer=RefusesTheReleaseAtTheEnd(leases),
        )
        with caplog.at_level(logging.WARNING, logger="onward.runner"):
            result = await runner.run(AGENT, "go", tenant=TENANT, run_id=run_id)
        assert result.status == "completed"
        assert len(EFFECTS) == 1
        assert f"run {run_id}: its lease is released in the background" in caplog.text
        assert "readonly" in caplog.text
        assert await leases.current(run_id) is not None
        await on_thread(leases, "PRAGMA query_only = OFF")
        for _ in range(100):
            if await leases.current(run_id) is None:
                break
            await asyncio.sleep(0.05)
        assert await leases.current(run_id) is None


async def test_a_release_the_store_refuses_is_retried_until_it_takes(db: Path) -> None:
    async with SqliteLeaseStore(db) as leases:
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        held = Leaseholder(leases, run_id, tenant=TENANT, holder="w1")
        with pytest.raises(BackendError, match="readonly"):
            async with held:
                await on_thread(leases, "PRAGMA query_only = ON")
        assert held.releasing is not None
        assert await leases.current(run_id) is not None
        await asyncio.sleep(0.8)
        assert not held.releasing.done()
        await on_thread(leases, "PRAGMA query_only = OFF")
        await asyncio.wait_for(held.releasing, 2)
        assert await leases.current(run_id) is None


async def test_a_background_release_stops_when_the_store_is_closed(db: Path) -> None:
    leases = await SqliteLeaseStore.open(db)
    held = Leaseholder(leases, f"run-{uuid.uuid4().hex[:8]}", tenant=TENANT, holder="w1")
    with pytest.raises(BackendError):
        async with held:
            await on_thread(leases, "PRAGMA query_only = ON")
    await leases.close()
    assert held.releasing is not None
    await asyncio.wait_for(held.releasing, 2)


def _private_mount() -> list[str] | None:
    """How to run a command in a mount namespace of its own, where it may mount a tmpfs."""
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        probe = [*prefix, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt || exit 1"]
        try:
            done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return None


def test_on_a_really_full_disk_the_release_retries_and_the_run_resumes_in_seconds(
    tmp_path: Path,
) -> None:
    # The same story on a real filesystem that fills up: a 2 MiB tmpfs, mounted in a private
    # mount namespace (needs root or unprivileged user namespaces), so nothing outlives the test.
    prefix = _private_mount()
    if prefix is None:
        pytest.skip("cannot mount a tmpfs in a private mount namespace here")
    mount = tmp_path / "small"
    mount.mkdir()
    tests = Path(__file__).resolve().parents[1]
    script = (
        f'mount -t tmpfs -o size=2m tmpfs "{mount}" && '
        f'exec "{sys.executable}" -m support.disk_full_child "{mount}"'
    )
    done = subprocess.run(
        [*prefix, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env={**os.environ, "PYTHONPATH": str(tests)},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "database or disk is full" in report["failed"]
    assert report["held_after_failure"]  # the release failed like the append
    assert report["status"] == "completed"
    assert report["resumed_after_s"] < 5
