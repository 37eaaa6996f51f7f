"""The disk under an embedded worker's SQLite file fills up, then space is freed.

The database sits on a small tmpfs of its own (``mount -t tmpfs``, which needs root or
CAP_SYS_ADMIN); a filler file takes the rest of it. Where mounting is not allowed, the same
fault comes from ``PRAGMA max_page_count`` on the log's connection: SQLite then answers
``SQLITE_FULL`` ("database or disk is full") exactly as on a full disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest
from support.fault_runs import (
    drive_all,
    new_run_ids,
    step_agent,
    step_provider,
    through_fault,
)

from onward.eventlog import SqliteEventLog
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import LeasePolicy
from onward.runtime.runner import AgentRunner

pytestmark = pytest.mark.faults
RUNS = 20
STEPS = 4
PAYLOAD = 20_000
"""Characters per tool result: every step grows the file, so a full disk is felt at once."""
DISK_MIB = 32
DISK = f"{DISK_MIB}m"
"""Room for every run's steps before the fault: a disk the runs fill themselves leaves no fault
to time."""
FullDisk = tuple[Path, Callable[[SqliteEventLog], Awaitable[None]], Callable[[], None], str]
"""The database's path, what fills its disk, what frees it, and how it is done."""


def mount_tmpfs(where: Path) -> str | None:
    """Mount a small tmpfs at ``where``; ``None`` if done, else why not.

    A mount that answers 0 but is not in effect here is refused too: the filler would otherwise
    fill the disk ``where`` is on, the machine's own.
    """
    where.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0700", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.strip() or f"exit {done.returncode}"
    disk = os.statvfs(where)
    if not os.path.ismount(where) or disk.f_blocks * disk.f_frsize > 2 * DISK_MIB << 20:
        unmount(where)
        return f"mount answered 0 but {where} is not a {DISK} disk of its own"
    return None


def unmount(disk: Path) -> None:
    subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30, check=False)


def fill(disk: Path) -> int:
    """Grow the filler file until the disk says ENOSPC; the bytes written.

    The filler was created with the mount, so a disk already full still takes it. Unbuffered:
    a buffered file keeps what a short last write left over and fails again with ENOSPC when
    closed.
    """
    written = 0
    block = b"\0" * 65536
    with (disk / "filler").open("ab", buffering=0) as out:
        try:
            while True:
                written += out.write(block) or 0
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return written


@contextlib.asynccontextmanager
async def full_disk(tmp_path: Path) -> AsyncIterator[FullDisk]:
    """Yield (database, fill, free, how): a tmpfs when mounting works, else a page cap."""
    disk = tmp_path / "disk"
    refused = await asyncio.to_thread(mount_tmpfs, disk)
    if refused is None:
        (disk / "filler").touch()

        async def fill_disk(log: SqliteEventLog) -> None:
            await asyncio.to_thread(fill, disk)

        def free_disk() -> None:
            (disk / "filler").unlink()

        try:
            yield disk / "onward.db", fill_disk, free_disk, f"tmpfs {DISK}"
        finally:
            await asyncio.to_thread(unmount, disk)
        return

    capped: list[sqlite3.Connection] = []

    async def cap(log: SqliteEventLog) -> None:
        conn = log._db.connection()  # the log's own connection, on its own thread
        capped.append(conn)

        def set_cap() -> None:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages + 2}")

        await log._db.call(set_cap, "capping the database")

    def uncap() -> None:
        for conn in capped:
            conn.execute("PRAGMA max_page_count = 1073741823")

    yield disk / "onward.db", cap, uncap, f"PRAGMA max_page_count (mount refused: {refused})"


@pytest.mark.timeout(300)
async def test_sqlite_disk_full_under_an_embedded_worker(
    tmp_path: Path, rng: random.Random
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = step_agent(ledger, tool_s=0.3, payload=PAYLOAD)
    run_ids = new_run_ids(rng, RUNS)
    began = time.time()
    async with full_disk(tmp_path) as (db, make_full, free, how):
        async with SqliteEventLog(db) as log:
            runner = AgentRunner(
                provider=step_provider(STEPS),
                log=log,
                lease_policy=LeasePolicy(ttl=timedelta(seconds=5)),
            )
            intact = None

            async def fill_then_free() -> None:
                nonlocal intact
                await make_full(log)
                await asyncio.sleep(3.0)
                with contextlib.closing(sqlite3.connect(db)) as check:
                    intact = check.execute("PRAGMA integrity_check").fetchone()[0]
                await asyncio.to_thread(free)

            async with runner:
                driving = drive_all(lambda: runner, agent, run_ids)
                window = await through_fault(
                    driving, ledger, RUNS, fill_then_free, began=began, within_s=240
                )
        with contextlib.closing(sqlite3.connect(db)) as check:
            intact_after = check.execute("PRAGMA integrity_check").fetchone()[0]
    outcomes = window.outcomes
    full = [
        (kind, error)
        for o in outcomes
        for kind, error in zip(o.failures, o.errors, strict=False)
        if "full" in error
    ]
    print(f"a full disk, as a run saw it: {full[0] if full else None}")
    window.assert_all_completed(
        "sqlite: disk full, then space freed",
        ledger,
        steps=STEPS,
        notes=f"({how}; 'disk is full' errors {len(full)})",
    )
    assert full, "no run saw the full disk"
    assert {kind for kind, _ in full} == {"BackendError"}, full[:3]
    assert (intact, intact_after) == ("ok", "ok")
