"""What the PostgreSQL log adds to the conformance suite: the partition count it was created
with, a schema that was never migrated, appenders in several processes sharing a partition, and
records stored packed."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from support.processes import spawn_support

from onward._storage.packing import PACKED
from onward.errors import ConfigurationError, SchemaMismatchError
from onward.eventlog import PostgresEventLog, codec
from onward.testing.eventlog import new_run_id, step_events

PROCESSES = 4
APPENDS_PER_PROCESS = 120


async def test_reopening_with_another_partition_count_is_refused(
    database_url: str, pg_schema: str
) -> None:
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as log:
        await log.append(step_events(new_run_id(), 2))
    with pytest.raises(ConfigurationError, match="created with 4 partitions"):
        await PostgresEventLog.open(database_url, schema=pg_schema, partitions=6)
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as log:
        assert sum([(await log.bounds(p)).end for p in range(4)]) == 2


async def test_logs_opened_at_once_on_a_new_schema_agree_on_one_count(
    database_url: str, pg_schema: str
) -> None:
    opened = await asyncio.gather(
        *(PostgresEventLog.open(database_url, schema=pg_schema, partitions=4) for _ in range(5)),
        return_exceptions=True,
    )
    try:
        assert [type(o).__name__ for o in opened] == ["PostgresEventLog"] * 5
    finally:
        for log in opened:
            if isinstance(log, PostgresEventLog):
                await log.close()


async def test_an_unmigrated_schema_is_refused(database_url: str, empty_pg_schema: str) -> None:
    with pytest.raises(SchemaMismatchError, match="onward db migrate"):
        await PostgresEventLog.open(database_url, schema=empty_pg_schema, partitions=4)


async def test_appenders_in_several_processes_leave_dense_offsets_and_whole_batches(
    database_url: str, pg_schema: str
) -> None:
    """Several processes, each with several appends in flight, append to one partition: the
    partition's offsets run from 0 without a gap, every batch sits at consecutive offsets
    where its append said, and each run reads back in seq order."""
    partition = 2
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as log:
        children = [
            await spawn_support(
                "pg_appenders",
                database_url,
                pg_schema,
                str(partition),
                str(APPENDS_PER_PROCESS),
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(PROCESSES)
        ]
        outputs = await asyncio.gather(*(child.communicate() for child in children))
        assert [child.returncode for child in children] == [0] * PROCESSES
        said = [line.split() for out, _ in outputs for line in out.decode().splitlines()]
        assert len(said) == PROCESSES * APPENDS_PER_PROCESS
        total = sum(int(count) for *_, count in said)

        bounds = await log.bounds(partition)
        stored = await log.read_partition(partition, 0)
        assert (bounds.start, bounds.end) == (0, total)
        assert [s.position.offset for s in stored] == list(range(total))
        for run_id, first_seq, first_offset, count in said:
            batch = stored[int(first_offset) : int(first_offset) + int(count)]
            assert [(s.event.run_id, s.event.seq) for s in batch] == [
                (run_id, seq) for seq in range(int(first_seq), int(first_seq) + int(count))
            ]
        for run_id in {line[0] for line in said}:
            seqs = [s.event.seq for s in await log.read_run(run_id)]
            assert seqs == list(range(1, len(seqs) + 1))


async def test_records_are_stored_packed_and_rows_written_before_packing_still_read(
    database_url: str, pg_schema: str
) -> None:
    run_id = new_run_id()
    events = step_events(run_id, 6, body="the same words again " * 40)
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as log:
        await log.append(events[:3])
        # A record as a log written before packing holds it: the codec's bytes, unpacked.
        await log.write_raw(run_id, codec.encode(events[3]))
        await log.append(events[4:])
        stored = await log.read_run(run_id)
    assert [s.event for s in stored] == events
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        rows = [
            bytes(r["record"])
            for r in await conn.fetch("SELECT record FROM onward_log ORDER BY log_offset")
        ]
    finally:
        await conn.close()
    encoded = [codec.encode(e) for e in events]
    assert not rows[3].startswith(PACKED)
    packed = [n for n, row in enumerate(rows) if row.startswith(PACKED)]
    assert packed == [0, 1, 2, 4, 5]
    assert sum(len(rows[n]) for n in packed) < 0.5 * sum(len(encoded[n]) for n in packed)
