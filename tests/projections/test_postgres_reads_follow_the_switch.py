"""A PostgreSQL frontier store that follows the active build reads the build switched in.

A long-lived reader (a `RunManager` in an application server, a worker's recovery) opens its
store once. After a rebuild switches builds, the old build's tables are no longer written: a
reader still reading them would show every run as it stood at the switch, for good.
"""

from __future__ import annotations

import asyncpg

from onward.projections.base import Snapshot
from onward.projections.builds import create_build, switch_build
from onward.projections.postgres import FRONTIERS, PostgresFrontierStore
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, call_row, frontier


async def test_rows_loaded_listed_and_audited_after_a_switch_are_the_new_builds(
    database_url: str, pg_schema: str
) -> None:
    run_id = new_run_id()
    async with (
        PostgresFrontierStore(database_url, schema=pg_schema) as reader,
        PostgresFrontierStore(database_url, schema=pg_schema) as live,
    ):
        await live.write(
            CONSUMER,
            {1: 11},
            [Snapshot.of(frontier(run_id, through=10, status="running"))],
            [call_row(run_id, "c1", through=10, outcome=None)],
        )
        before = await reader.get(run_id)
        assert before is not None
        assert before.summary.status == "running"

        # A rebuild fills a new build, further on than the old one, and switches it in.
        conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            build = await create_build(conn, FRONTIERS)
        finally:
            await conn.close()
        async with PostgresFrontierStore(database_url, schema=pg_schema, build=build) as rebuilt:
            await rebuilt.write(
                CONSUMER,
                {1: 21},
                [Snapshot.of(frontier(run_id, through=20, status="completed"))],
                [call_row(run_id, "c1", through=20, outcome="completed")],
            )
        conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            await switch_build(conn, FRONTIERS, build)
        finally:
            await conn.close()

        row = await reader.get(run_id)
        assert row is not None
        assert row.summary.status == "completed"
        assert [s.status for s in await reader.runs(tenant="acme")] == ["completed"]
        assert [c.outcome for c in await reader.tool_calls(run_id)] == ["completed"]
