"""PostgreSQL appends a large batch of transcript rows (a projector's backlog) by staging them,
and a few by one statement: either way each row is stored once, and a row already stored under
its key (a rebuild deriving it again, a store written twice) is kept as it was."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from support.pg import SchemaFactory

from onward.eventlog.events import Message
from onward.projections import PostgresFrontierStore
from onward.projections import postgres as postgres_module
from onward.projections.base import Snapshot
from onward.projections.postgres import TRANSCRIPT_CHUNK_MESSAGES
from onward.projections.transcript import TranscriptRow
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, frontier


def said(run_id: str, seq: int, text: str) -> TranscriptRow:
    return TranscriptRow(
        tenant="acme", run_id=run_id, seq=seq, message=Message(role="tool", content=text * 40)
    )


@pytest.mark.parametrize("count", [3, 400], ids=["a few", "a backlog"])
async def test_transcript_rows_are_stored_once_and_kept(
    database_url: str, new_pg_schema: SchemaFactory, count: int
) -> None:
    store = await PostgresFrontierStore.open(database_url, schema=await new_pg_schema())
    try:
        run_id = new_run_id()
        first = [said(run_id, seq, f"first {seq} ") for seq in range(1, count + 1)]
        snapshot = Snapshot.of(frontier(run_id, through=count))
        await store.write(CONSUMER, {0: count}, [snapshot], [], messages=first)
        again = [said(run_id, seq, f"again {seq} ") for seq in range(1, count + 2)]
        more = Snapshot.of(frontier(run_id, through=count + 1))
        await store.write(CONSUMER, {0: count + 1}, [more], [], messages=again)
        stored = await store.transcript(run_id, tenant="acme", through=count + 1)
        assert stored == [*first, again[-1]]
    finally:
        await store.close()


async def _rows(database_url: str, schema: str, run_id: str) -> list[tuple[int, int | None]]:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        found = await conn.fetch(
            "SELECT seq, last_seq FROM onward_transcript WHERE run_id = $1 ORDER BY seq", run_id
        )
    finally:
        await conn.close()
    return [(r["seq"], r["last_seq"]) for r in found]


async def _store(
    store: PostgresFrontierStore, rows: list[TranscriptRow], through: int, offset: int
) -> None:
    snapshots = [Snapshot.of(frontier(r, through=through)) for r in {m.run_id for m in rows}]
    await store.write(CONSUMER, {0: offset}, snapshots, [], messages=rows)


async def test_a_store_keeps_each_runs_messages_as_one_row_and_reads_each_back(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    """The messages one store folded for a run are one row (a chunk keyed by its first seq);
    a long run's backlog is cut into chunks of at most TRANSCRIPT_CHUNK_MESSAGES; a reader gets
    every message in seq order, and only those through the seq it asks for."""
    schema = await new_pg_schema()
    store = await PostgresFrontierStore.open(database_url, schema=schema)
    try:
        one, other = new_run_id(), new_run_id()
        size = TRANSCRIPT_CHUNK_MESSAGES
        seqs = [2 * n for n in range(1, size + 6)]  # events between messages say nothing
        mine = [said(one, seq, f"m{seq} ") for seq in seqs]
        theirs = [said(other, seq, f"t{seq} ") for seq in (1, 3)]
        interleaved = [*theirs[:1], *mine[:7], *theirs[1:], *mine[7:]]
        await _store(store, interleaved, seqs[-1], 1)
        assert await _rows(database_url, schema, one) == [
            (seqs[0], seqs[size - 1]),
            (seqs[size], seqs[-1]),
        ]
        assert await _rows(database_url, schema, other) == [(1, 3)]
        assert await store.transcript(one, tenant="acme", through=seqs[-1]) == mine
        assert await store.transcript(other, tenant="acme", through=3) == theirs
        middle = seqs[size + 2]
        assert await store.transcript(one, tenant="acme", through=middle) == mine[: size + 3]
        assert await store.transcript(one, tenant="acme", through=seqs[5] + 1) == mine[:6]
    finally:
        await store.close()


async def test_messages_stored_by_earlier_rows_are_kept_whatever_the_new_chunks_cover(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    """A rebuild (or a store written twice) chunks a run's messages otherwise than the rows
    already stored: what they hold is kept as it was, only the rest is added, and nothing is
    read twice."""
    schema = await new_pg_schema()
    store = await PostgresFrontierStore.open(database_url, schema=schema)
    try:
        run_id = new_run_id()
        live = [said(run_id, seq, f"live {seq} ") for seq in range(1, 11)]
        await _store(store, live[:4], 4, 4)
        await _store(store, live[4:5], 5, 5)
        await _store(store, live[5:10], 10, 10)
        rebuilt = [said(run_id, seq, f"rebuilt {seq} ") for seq in range(1, 14)]
        await _store(store, rebuilt[2:8], 8, 8)  # inside what is stored: nothing added
        assert await _rows(database_url, schema, run_id) == [(1, 4), (5, None), (6, 10)]
        await _store(store, rebuilt[:13], 13, 13)  # past it: only 11-13 added
        assert await _rows(database_url, schema, run_id) == [
            (1, 4),
            (5, None),
            (6, 10),
            (11, 13),
        ]
        assert await store.transcript(run_id, tenant="acme", through=13) == [
            *live,
            *rebuilt[10:],
        ]
    finally:
        await store.close()


async def test_rows_of_one_message_from_earlier_versions_read_beside_chunks(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    """Rows written before chunks (one message, no last_seq) read back with the chunks after
    them, and a chunk overlapping them (two builds) gives each message once."""
    schema = await new_pg_schema()
    store = await PostgresFrontierStore.open(database_url, schema=schema)
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        run_id = new_run_id()
        old = [said(run_id, seq, f"old {seq} ") for seq in (1, 2)]
        for row in old:
            await conn.execute(
                "INSERT INTO onward_transcript (tenant, run_id, seq, message) "
                "VALUES ($1, $2, $3, $4)",
                "acme",
                run_id,
                row.seq,
                row.encoded(compressed=True),
            )
        new = [said(run_id, seq, f"new {seq} ") for seq in (2, 3, 4)]
        await _store(store, new, 4, 4)
        assert await _rows(database_url, schema, run_id) == [(1, None), (2, None), (3, 4)]
        assert await store.transcript(run_id, tenant="acme", through=4) == [*old, *new[1:]]
    finally:
        await conn.close()
        await store.close()


async def test_two_writers_starting_a_chunk_at_the_same_seq_keep_the_longer(
    database_url: str, new_pg_schema: SchemaFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stores of one run at once (members of a group around a rebalance) both look before
    either has written, so neither trims its chunk: the one reaching further is kept, since
    both were folded from the same events from that seq on."""
    schema = await new_pg_schema()
    store = await PostgresFrontierStore.open(database_url, schema=schema)

    async def looked_before_the_other_wrote(conn: object, chunks: list[Any]) -> list[Any]:
        return chunks

    monkeypatch.setattr(postgres_module, "_not_stored", looked_before_the_other_wrote)
    try:
        run_id = new_run_id()
        rows = [said(run_id, seq, f"m{seq} ") for seq in range(5, 10)]
        await _store(store, rows[:3], 7, 7)
        await _store(store, rows, 9, 9)
        await _store(store, rows[:2], 9, 9)
        assert await _rows(database_url, schema, run_id) == [(5, 9)]
        assert await store.transcript(run_id, tenant="acme", through=9) == rows
    finally:
        await store.close()
