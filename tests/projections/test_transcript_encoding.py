"""How the SQL stores keep transcript messages: PostgreSQL a long one as a zstd frame of its JSON,
SQLite every one over a few dozen bytes deflated against its dictionary (`onward._storage.pack`),
a short one as JSON; rows written as JSON by earlier versions still read back.

The bytes are looked at in the tables themselves (PostgreSQL over its socket, the SQLite file),
where an analyst or a later version would find them.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import asyncpg
import msgspec
import pytest
import zstandard
from support.pg import SchemaFactory

from onward._storage import unpack
from onward._storage.packing import PACKED
from onward.eventlog.events import Message, ToolCall
from onward.eventlog.parts import assistant_message
from onward.projections import PostgresFrontierStore, SqliteFrontierStore
from onward.projections.base import FrontierStore, Snapshot
from onward.projections.transcript import (
    COMPRESS_OVER,
    TranscriptRow,
    decode_chunk,
    decode_message,
    encoded_chunks,
)
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, frontier

RESULT = '{"flight": "AF1234", "seat": "42A", "fare_eur": 119, "status": "confirmed"} ' * 20
"""About 1.5 KB of a tool result as JSON: repetitive, as results are."""


def rows_of(run_id: str) -> list[TranscriptRow]:
    return [
        TranscriptRow(
            tenant="acme", run_id=run_id, seq=1, message=Message(role="user", content="book it")
        ),
        TranscriptRow(
            tenant="acme", run_id=run_id, seq=2, message=Message(role="tool", content=RESULT)
        ),
    ]


async def write(store: FrontierStore, run_id: str) -> None:
    await store.write(
        CONSUMER, {}, [Snapshot.of(frontier(run_id, through=3))], [], messages=rows_of(run_id)
    )


def check_stored(bodies: dict[int, bytes], unpacked: Callable[[bytes], bytes]) -> None:
    short, long = bodies[1], bodies[2]
    assert msgspec.json.decode(short, type=Message) == Message(role="user", content="book it")
    json_body = msgspec.json.encode(Message(role="tool", content=RESULT))
    assert len(json_body) > COMPRESS_OVER
    assert unpacked(long) == json_body
    assert len(long) * 4 < len(json_body), (len(long), len(json_body))


LEGACY = Message(role="assistant", content="stored as JSON by an earlier version " * 20)


async def test_postgres_keeps_long_messages_compressed_and_reads_json_rows(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    schema = await new_pg_schema()
    run_id = new_run_id()
    store = await PostgresFrontierStore.open(database_url, schema=schema)
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        # One store a message, as a projector keeping up with slow steps writes them: each is
        # a row of its own (several in one store are one row, test_postgres_transcript_batches).
        for row in rows_of(run_id):
            snapshot = Snapshot.of(frontier(run_id, through=row.seq))
            await store.write(CONSUMER, {}, [snapshot], [], messages=[row])
        stored = await conn.fetch(
            "SELECT seq, message FROM onward_transcript WHERE run_id = $1 AND last_seq IS NULL",
            run_id,
        )
        check_stored(
            {r["seq"]: bytes(r["message"]) for r in stored}, zstandard.ZstdDecompressor().decompress
        )
        await conn.execute(
            "INSERT INTO onward_transcript (tenant, run_id, seq, message) VALUES ($1, $2, 3, $3)",
            "acme",
            run_id,
            msgspec.json.encode(LEGACY),
        )
        read = await store.transcript(run_id, tenant="acme", through=3)
        assert [r.message for r in read] == [*(r.message for r in rows_of(run_id)), LEGACY]
    finally:
        await conn.close()
        await store.close()


async def test_sqlite_keeps_messages_packed_and_reads_json_rows(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    run_id = new_run_id()
    async with SqliteFrontierStore(path) as store:
        await write(store, run_id)
    with closing(sqlite3.connect(path)) as conn:
        stored = conn.execute(
            "SELECT seq, message FROM onward_transcript WHERE run_id = ?", (run_id,)
        ).fetchall()
        bodies = {seq: bytes(body) for seq, body in stored}
        check_stored(bodies, unpack)
        assert bodies[2].startswith(PACKED)
        with conn:
            conn.execute(
                "INSERT INTO onward_transcript (tenant, run_id, seq, message) VALUES (?, ?, 3, ?)",
                ("acme", run_id, msgspec.json.encode(LEGACY)),
            )
    async with SqliteFrontierStore(path) as store:
        read = await store.transcript(run_id, tenant="acme", through=3)
    assert [r.message for r in read] == [*(r.message for r in rows_of(run_id)), LEGACY]


def test_a_model_answer_asking_for_one_call_is_stored_compressed() -> None:
    # About 150 bytes of JSON, one a step: compressed, it is a fifth shorter.
    asked = assistant_message(
        "", [ToolCall(call_id="call-1", tool="search_flights", args={"from": "LIS", "to": "CDG"})]
    )
    row = TranscriptRow(tenant="acme", run_id="r", seq=2, message=asked)
    json_body = msgspec.json.encode(asked)
    stored = row.encoded(compressed=True)
    assert stored[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert len(stored) * 5 <= len(json_body) * 4, (len(stored), len(json_body))
    assert decode_message(stored) == asked
    said = TranscriptRow(
        tenant="acme", run_id="r", seq=1, message=Message(role="user", content="go")
    )
    assert said.encoded(compressed=True) == msgspec.json.encode(said.message)


@pytest.mark.parametrize("count", [5, 300], ids=["compressed inline", "compressed apart"])
async def test_many_messages_are_stored_as_each_alone(count: int) -> None:
    """A projector's store compresses its messages together (many in a worker thread): each
    body is what the message alone encodes to, short ones JSON, incompressible ones JSON, the
    rest zstd frames, and every one reads back."""
    rng = random.Random(count)
    messages = []
    for n in range(count):
        content = [
            "ok",
            RESULT,
            bytes(rng.getrandbits(8) for _ in range(400)).hex(),
            "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(200)),
        ][n % 4]
        messages.append(
            TranscriptRow(
                tenant="acme", run_id="r", seq=n + 1, message=Message(role="tool", content=content)
            )
        )
    bodies = await encoded_chunks([[m] for m in messages])
    assert bodies == [m.encoded(compressed=True) for m in messages]
    assert [decode_message(b) for b in bodies] == [m.message for m in messages]
    assert {b[:1] for b in bodies[::4]} == {b"{"}
    assert all(b[:4] == b"\x28\xb5\x2f\xfd" for b in bodies[1::4])


async def test_a_chunk_of_several_messages_is_one_frame_that_reads_back_in_order() -> None:
    """Several messages of a run stored together are one zstd frame, shorter than their frames
    apart (the JSON they share compresses once), and read back with their seqs."""
    rng = random.Random(5)
    rows = [
        TranscriptRow(
            tenant="acme",
            run_id="r",
            seq=seq,
            message=Message(role="tool", content=bytes(rng.randbytes(300)).hex()),
        )
        for seq in (2, 5, 9)
    ]
    (body,) = await encoded_chunks([rows])
    assert body[:4] == b"\x28\xb5\x2f\xfd"
    assert decode_chunk(body) == [(r.seq, r.message) for r in rows]
    apart = await encoded_chunks([[r] for r in rows])
    assert len(body) < sum(map(len, apart))
