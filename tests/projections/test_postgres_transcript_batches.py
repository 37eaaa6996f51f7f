"""PostgreSQL appends a large batch of transcript rows (a projector's backlog) by staging them,
and a few by one statement: either way each row is stored once, and a row already stored under
its key (a rebuild deriving it again, a store written twice) is kept as it was."""

from __future__ import annotations

import pytest
from support.pg import SchemaFactory

from onward.eventlog.events import Message
from onward.projections import PostgresFrontierStore
from onward.projections.base import Snapshot
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
