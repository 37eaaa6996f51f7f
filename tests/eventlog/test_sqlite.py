"""What only the SQLite backend has: a file other processes share, and its settings."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from onward.errors import BackendError, ConfigurationError, InvalidInputError
from onward.eventlog import SqliteEventLog
from onward.testing.eventlog import new_run_id, seqs, step_events

READ_IN_CHILD = """
import asyncio, sys
from onward.eventlog import SqliteEventLog

async def main():
    async with SqliteEventLog(sys.argv[1], partitions=4) as log:
        stored = await log.read_run(sys.argv[2])
        print(",".join(str(s.event.seq) for s in stored))

asyncio.run(main())
"""


async def test_another_process_reads_what_this_one_appended(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    run_id = new_run_id()
    async with SqliteEventLog(path, partitions=4) as log:
        await log.append(step_events(run_id, 5))
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", READ_IN_CHILD, str(path), run_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "1,2,3,4,5"


async def test_reopening_with_another_partition_count_is_refused_and_data_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    run_id = new_run_id()
    async with SqliteEventLog(path, partitions=4) as log:
        await log.append(step_events(run_id, 3))
    with pytest.raises(ConfigurationError, match="created with 4 partitions"):
        await SqliteEventLog.open(path, partitions=8)
    async with SqliteEventLog(path, partitions=4) as log:
        assert seqs(await log.read_run(run_id)) == [1, 2, 3]


async def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with SqliteEventLog(path):
        pass
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()


async def test_using_a_log_that_was_never_opened_is_a_clear_error(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "events.db")
    with pytest.raises(InvalidInputError, match="not open"):
        await log.append(step_events(new_run_id(), 1))


async def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    content = b"these are somebody's notes, not an event log\n" * 200
    path.write_bytes(content)
    with pytest.raises(BackendError, match=r"notes\.txt"):
        await SqliteEventLog.open(path)
    assert path.read_bytes() == content
