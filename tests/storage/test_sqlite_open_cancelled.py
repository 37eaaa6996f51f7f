"""A SQLite store whose opening is cancelled (a startup cut short, a timeout around it) leaves
no connection open behind it: the connection its thread was still opening when the caller
stopped waiting is closed once it is made, not left to the garbage collector."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from onward._storage.sqlite import SqliteThread, connect


async def test_a_connection_opened_after_its_open_was_cancelled_is_closed(tmp_path: Path) -> None:
    db = SqliteThread(tmp_path / "cancelled.db", "store")
    opening_started = threading.Event()
    release = threading.Event()
    opened: list[sqlite3.Connection] = []

    def slow_open() -> sqlite3.Connection:
        opening_started.set()
        release.wait(10)  # still opening when the caller gives up
        conn = connect(tmp_path / "cancelled.db")
        opened.append(conn)
        return conn

    opening = asyncio.create_task(db.open(slow_open))
    assert await asyncio.to_thread(opening_started.wait, 5), "the open never reached its thread"
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    release.set()
    for _ in range(100):
        if opened:
            break
        await asyncio.sleep(0.05)
    [conn] = opened
    for _ in range(100):
        try:
            conn.execute("SELECT 1")
        except sqlite3.ProgrammingError:
            break  # closed
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the connection opened for a cancelled open was left open")
    assert not db.is_open
