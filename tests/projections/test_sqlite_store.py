"""`SqliteFrontierStore`: the conformance suite, plus what only the embedded file has."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import msgspec
import pytest

from onward.errors import BackendError, InvalidInputError, SchemaMismatchError
from onward.eventlog import SqliteEventLog
from onward.projections.base import FrontierStore, Snapshot
from onward.projections.frontier import Frontier, ToolCallRow, fold_all
from onward.projections.sqlite import LOAD_CHUNK, SqliteFrontierStore
from onward.testing import FrontierStoreConformance
from onward.testing.eventlog import TENANT, new_run_id, seqs, step_events
from onward.testing.frontiers import CONSUMER, call_row, frontier


class TestSqliteFrontierStore(FrontierStoreConformance):
    path: Path

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path: Path) -> None:
        """pytest's own directory, so a run leaves no file behind in /tmp."""
        self.path = tmp_path / "frontiers.db"

    async def open_store(self) -> FrontierStore:
        return await SqliteFrontierStore.open(self.path)


READ_IN_CHILD = """
import asyncio, sys
from onward.projections.sqlite import SqliteFrontierStore

async def main():
    async with SqliteFrontierStore(sys.argv[1], migrate=False) as store:
        row = await store.get(sys.argv[2])
        calls = await store.tool_calls(sys.argv[2])
        positions = await store.positions(sys.argv[3])
        print(row.frontier.iteration, row.summary.status, calls[0].outcome, positions[1])

asyncio.run(main())
"""


def _ledger(path: Path) -> list[int]:
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT version FROM onward_schema_migrations ORDER BY version")
        return [int(version) for (version,) in rows]


async def test_the_store_and_the_event_log_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    run_id = new_run_id()
    async with SqliteEventLog(path, partitions=4) as log, SqliteFrontierStore(path) as store:
        await log.append(step_events(run_id, 4))
        stored = await log.read_run(run_id)
        folded = fold_all(Frontier.empty(run_id, TENANT), stored)
        last = stored[-1].position
        await store.write(CONSUMER, {last.partition: last.offset + 1}, [Snapshot.of(folded)], [])
    async with SqliteEventLog(path, partitions=4) as log, SqliteFrontierStore(path) as store:
        assert seqs(await log.read_run(run_id)) == [1, 2, 3, 4]
        row = await store.get(run_id)
        assert row is not None
        assert row.frontier == folded


async def test_a_file_from_a_newer_onward_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "frontiers.db"
    run_id = new_run_id()
    async with SqliteFrontierStore(path) as store:
        await store.write(CONSUMER, {1: 8}, [Snapshot.of(frontier(run_id, through=7))], [])
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO onward_schema_migrations (version, name) VALUES (9999, 'later')")
        conn.commit()
    before = _ledger(path)
    with pytest.raises(SchemaMismatchError, match="upgrade Onward"):
        await SqliteFrontierStore.open(path)
    assert _ledger(path) == before
    assert before[-1] == 9999
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT run_id, through_offset FROM onward_frontiers").fetchall()
        positions = conn.execute("SELECT * FROM onward_projector_positions").fetchall()
    assert rows == [(run_id, 7)]
    assert positions == [(CONSUMER, 1, 8)]


async def test_without_migrate_a_fresh_file_is_refused_naming_the_command(
    tmp_path: Path,
) -> None:
    path = tmp_path / "frontiers.db"
    with pytest.raises(SchemaMismatchError, match="onward db migrate"):
        await SqliteFrontierStore.open(path, migrate=False)
    with closing(sqlite3.connect(path)) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == []


async def test_written_rows_survive_reopening_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "frontiers.db"
    run_id = new_run_id()
    async with SqliteFrontierStore(path) as store:
        await store.write(
            CONSUMER,
            {1: 6},
            [Snapshot.of(frontier(run_id, through=5, status="waiting", iteration=3))],
            [call_row(run_id, "c1", through=5, outcome="completed")],
        )
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", READ_IN_CHILD, str(path), run_id, CONSUMER],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["3", "waiting", "completed", "6"]


BadWrite = Callable[[str], tuple[dict[int, int], list[ToolCallRow]]]


def _call_without_tool(run_id: str) -> tuple[dict[int, int], list[ToolCallRow]]:
    """Positions and call rows whose second call row breaks NOT NULL (the calls statement)."""
    bad = msgspec.structs.replace(call_row(run_id, "c2", through=9, outcome=None), tool=None)
    return {1: 10}, [call_row(run_id, "c1", through=9, outcome="completed"), bad]


def _position_without_partition(run_id: str) -> tuple[dict[int, int], list[ToolCallRow]]:
    """Positions whose second one breaks NOT NULL: the last statement of the write fails."""
    positions: dict[int, int] = {1: 10, None: 10}  # type: ignore[dict-item]
    return positions, [call_row(run_id, "c1", through=9, outcome="completed")]


@pytest.mark.parametrize("bad_write", [_call_without_tool, _position_without_partition])
async def test_a_write_that_fails_midway_stores_none_of_it(
    tmp_path: Path, bad_write: BadWrite
) -> None:
    run_id = new_run_id()
    async with SqliteFrontierStore(tmp_path / "frontiers.db") as store:
        before = frontier(run_id, through=3, iteration=1)
        await store.write(CONSUMER, {1: 4}, [Snapshot.of(before)], [])
        positions, calls = bad_write(run_id)
        newer = Snapshot.of(frontier(run_id, through=9, iteration=7))
        with pytest.raises(BackendError, match="NOT NULL"):
            await store.write(CONSUMER, positions, [newer], calls)
        row = await store.get(run_id)
        assert row is not None
        assert row.frontier == before
        assert await store.tool_calls(run_id) == []
        assert await store.positions(CONSUMER) == {1: 4}


async def test_a_failed_write_leaves_the_store_usable(tmp_path: Path) -> None:
    run_id = new_run_id()
    async with SqliteFrontierStore(tmp_path / "frontiers.db") as store:
        positions, calls = _call_without_tool(run_id)
        with pytest.raises(BackendError):
            await store.write(CONSUMER, positions, [], calls)
        written = frontier(run_id, through=4)
        await store.write(CONSUMER, {1: 5}, [Snapshot.of(written)], [])
        row = await store.get(run_id)
        assert row is not None
        assert row.frontier == written


async def test_load_reads_many_runs_in_one_query_per_chunk(tmp_path: Path) -> None:
    runs = [new_run_id() for _ in range(2 * LOAD_CHUNK + 100)]
    async with SqliteFrontierStore(tmp_path / "frontiers.db") as store:
        await store.write(
            CONSUMER, {}, [Snapshot.of(frontier(r, through=i)) for i, r in enumerate(runs)], []
        )
        statements: list[str] = []
        # Reads go through the store's reading connection.
        await store._db.read(lambda conn: conn.set_trace_callback(statements.append), "tracing")
        try:
            loaded = await store.load([*runs, new_run_id()])
        finally:
            await store._db.read(lambda conn: conn.set_trace_callback(None), "tracing")
    assert [loaded[r].summary.through_offset for r in runs] == list(range(len(runs)))
    assert sum(s.lstrip().upper().startswith("SELECT") for s in statements) == 3


async def test_using_a_store_that_is_not_open_is_a_clear_error(tmp_path: Path) -> None:
    store = SqliteFrontierStore(tmp_path / "frontiers.db")
    with pytest.raises(InvalidInputError, match="not open"):
        await store.get(new_run_id())


async def test_close_is_idempotent_and_closed_store_refuses_use(tmp_path: Path) -> None:
    store = await SqliteFrontierStore.open(tmp_path / "frontiers.db")
    await store.close()
    await store.close()
    with pytest.raises(InvalidInputError, match="not open"):
        await store.positions(CONSUMER)


async def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "frontiers.db"
    async with SqliteFrontierStore(path):
        pass
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_call_rows_come_back_by_dispatch_time_then_undispatched_by_id(
    tmp_path: Path,
) -> None:
    run_id = new_run_id()
    base = call_row(run_id, "c", through=1, outcome=None)
    dispatched = {"c4": 100, "c3": 50, "c1": None, "c5": 100, "c0": None}
    written = [
        msgspec.structs.replace(base, call_id=call_id, dispatched_at=at)
        for call_id, at in dispatched.items()
    ]
    async with SqliteFrontierStore(tmp_path / "frontiers.db") as store:
        await store.write(CONSUMER, {}, [], written)
        rows = await store.tool_calls(run_id)
    assert [r.call_id for r in rows] == ["c3", "c4", "c5", "c0", "c1"]
