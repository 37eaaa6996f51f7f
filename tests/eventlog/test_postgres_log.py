"""What the PostgreSQL log adds to the conformance suite: the partition count it was created
with, a schema that was never migrated, appenders in several processes sharing a partition, and
records stored packed."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from support.processes import reaped, spawn_support
from support.proxy import TcpProxy
from typer.testing import CliRunner

from onward._storage.packing import PACKED
from onward.errors import BackendUnavailableError, ConfigurationError, SchemaMismatchError
from onward.eventlog import PostgresEventLog, codec
from onward.eventlog.base import TRUNCATION_STEP, PartitionBounds
from onward.runtime.cli import app
from onward.testing.eventlog import new_run_id, seqs, step_events

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
    async with (
        PostgresEventLog(database_url, schema=pg_schema, partitions=4) as log,
        reaped() as children,
    ):
        for _ in range(PROCESSES):
            children.append(
                await spawn_support(
                    "pg_appenders",
                    database_url,
                    pg_schema,
                    str(partition),
                    str(APPENDS_PER_PROCESS),
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        outputs = await asyncio.wait_for(
            asyncio.gather(*(child.communicate() for child in children)), 90
        )
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
    rows = await stored_records(database_url, pg_schema)
    encoded = [codec.encode(e) for e in events]
    assert not rows[3].startswith(PACKED)
    packed = [n for n, row in enumerate(rows) if row.startswith(PACKED)]
    assert packed == [0, 1, 2, 4, 5]
    assert sum(len(rows[n]) for n in packed) < 0.5 * sum(len(encoded[n]) for n in packed)


async def stored_records(database_url: str, schema: str) -> list[bytes]:
    """The log's rows as stored, in offset order (one partition's, in these tests)."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        return [
            bytes(r["record"])
            for r in await conn.fetch("SELECT record FROM onward_log ORDER BY log_offset")
        ]
    finally:
        await conn.close()


async def forget_packing(database_url: str, schema: str) -> None:
    """Make the log on ``schema`` one created before records were packed: no meta row says so."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        await conn.execute("DELETE FROM onward_log_meta WHERE key = 'records'")
    finally:
        await conn.close()


def pack_records_command(database_url: str, schema: str) -> tuple[int, str]:
    env = {
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": schema,
        "ONWARD_BACKEND": "postgres",
    }
    result = CliRunner().invoke(app, ["db", "pack-records"], env=env)
    return result.exit_code, result.output


async def test_a_log_created_before_packing_stays_plain_until_packing_is_turned_on(
    database_url: str, pg_schema: str
) -> None:
    """A process of an earlier version reads a packed record as unreadable: a log it may still
    read is written plain until `onward db pack-records` says every reader can read packed
    ones; then every log opened after it packs, and every row, either kind, reads back."""
    run_id = new_run_id()
    events = step_events(run_id, 6, body="the same words again " * 40)
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as log:
        assert log.packs_records
    await forget_packing(database_url, pg_schema)
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as before:
        assert not before.packs_records
        await before.append(events[:2])
        assert await asyncio.to_thread(pack_records_command, database_url, pg_schema) == (
            0,
            "records are packed from now on (processes running now pack once they restart)\n",
        )
        await before.append(events[2:4])  # opened before the switch: still plain
        async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as after:
            assert after.packs_records
            await after.append(events[4:])
            assert [s.event for s in await after.read_run(run_id)] == events
        assert [s.event for s in await before.read_run(run_id)] == events
    rows = await stored_records(database_url, pg_schema)
    assert [row.startswith(PACKED) for row in rows] == [False] * 4 + [True] * 2
    assert await asyncio.to_thread(pack_records_command, database_url, pg_schema) == (
        0,
        "records were packed already\n",
    )


async def test_packing_turned_on_in_the_library_writes_packed_at_once(
    database_url: str, pg_schema: str
) -> None:
    run_id = new_run_id()
    events = step_events(run_id, 4, body="the same words again " * 40)
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4):
        pass
    await forget_packing(database_url, pg_schema)
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as log:
        await log.append(events[:2])
        assert await log.pack_records() is True
        assert await log.pack_records() is False
        await log.append(events[2:])
        assert [s.event for s in await log.read_run(run_id)] == events
    rows = await stored_records(database_url, pg_schema)
    assert [row.startswith(PACKED) for row in rows] == [False, False, True, True]


def test_packing_a_schema_no_log_was_opened_on_is_refused_and_creates_nothing(
    database_url: str, pg_schema: str
) -> None:
    code, output = pack_records_command(database_url, pg_schema)
    assert code == 2
    assert "no event log on this schema yet" in output

    async def meta() -> list[str]:
        conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            return [r["key"] for r in await conn.fetch("SELECT key FROM onward_log_meta")]
        finally:
            await conn.close()

    assert asyncio.run(meta()) == []


async def test_a_long_cut_deletes_in_steps_each_in_a_transaction_of_its_own(
    database_url: str, pg_schema: str
) -> None:
    """A cut of a long backlog in one statement held the partition's appenders for all of it
    and, past the statement timeout, failed on every try: compaction never cut the partition.
    A trigger counts the rows each DELETE statement took and its transaction."""
    backlog = 2 * TRUNCATION_STEP + 123
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=2) as log:
        await log.append(step_events(new_run_id(), 1))
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(f'SET search_path TO "{pg_schema}"')
            record = await conn.fetchval("SELECT record FROM onward_log LIMIT 1")
            await conn.execute("DELETE FROM onward_log")
            await conn.execute(
                "INSERT INTO onward_log SELECT 0, g, 'r' || g, $1 FROM generate_series(0, $2) g",
                record,
                backlog - 1,
            )
            await conn.execute(
                "UPDATE onward_log_partition SET start_offset = 0, "
                "next_offset = CASE partition WHEN 0 THEN $1 ELSE 0 END",
                backlog,
            )
            await conn.execute(
                "CREATE TABLE cut_steps (tx bigint, rows bigint, last bigint);"
                "CREATE FUNCTION count_cut() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "INSERT INTO cut_steps SELECT txid_current(), count(*), max(log_offset) FROM old; "
                "RETURN NULL; END $$;"
                "CREATE TRIGGER count_cut AFTER DELETE ON onward_log "
                "REFERENCING OLD TABLE AS old FOR EACH STATEMENT EXECUTE FUNCTION count_cut()"
            )
            await log.truncate_before(0, backlog - 3)
            steps = await conn.fetch("SELECT tx, rows, last FROM cut_steps ORDER BY last")
            left = await conn.fetchval("SELECT min(log_offset) FROM onward_log")
        finally:
            await conn.close()
        assert [step["rows"] for step in steps] == [TRUNCATION_STEP, TRUNCATION_STEP, 120]
        assert len({step["tx"] for step in steps}) == 3
        assert left == backlog - 3
        assert await log.bounds(0) == PartitionBounds(backlog - 3, backlog)
        assert len(await log.read_records(0, backlog - 3)) == 3


async def test_an_append_cut_off_from_the_server_does_not_land_after_it_was_read_missing(
    database_url: str, pg_schema: str
) -> None:
    """An append waiting for its partition (another appender holds it) when the network goes
    silent: the client gives up, and its cancel cannot reach the server either. The server
    must give the statement up too, or it commits once the partition is free: after the
    append failed and after a read said the batch was not there (a writer told to retry
    would then write it twice)."""
    parts = urlsplit(database_url)
    assert parts.hostname is not None
    assert parts.port is not None
    run_id = new_run_id()
    async with (
        PostgresEventLog(database_url, schema=pg_schema, partitions=1) as log,
        TcpProxy(parts.hostname, parts.port) as proxy,
    ):
        await log.append(step_events(run_id, 1))
        credentials = parts.netloc.rsplit("@", 1)[0]
        proxied = urlunsplit(parts._replace(netloc=f"{credentials}@{proxy.host}:{proxy.port}"))
        async with PostgresEventLog(proxied, schema=pg_schema, partitions=1, timeout_s=1.0) as cut:
            holder = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
            try:
                async with holder.transaction():
                    await holder.execute(
                        "SELECT 1 FROM onward_log_partition WHERE partition = 0 FOR UPDATE"
                    )
                    appending = asyncio.create_task(cut.append(step_events(run_id, 1, first_seq=2)))
                    await asyncio.sleep(0.3)  # the append waits for the partition's row
                    await proxy.cut(silent=True)
                    with pytest.raises(BackendUnavailableError):
                        await asyncio.wait_for(appending, 30)
                    assert seqs(await log.read_run(run_id)) == [1]
            finally:
                await holder.close()
            await asyncio.sleep(0.5)  # the partition is free: a statement still running lands
            assert seqs(await log.read_run(run_id)) == [1], "the failed append landed later"
            await proxy.restore()
