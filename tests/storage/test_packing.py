"""Packed rows in the SQLite file: deflated against a fixed dictionary, read back exactly, and
rows that are not packed (older files, foreign writers) read as they are."""

from __future__ import annotations

import random
import sqlite3
from contextlib import closing
from pathlib import Path

from onward._storage import pack, unpack
from onward._storage.packing import PACKED, SMALLEST
from onward.eventlog import SqliteEventLog, codec
from onward.testing.eventlog import new_run_id, step_events


def test_a_packed_row_reads_back_exactly_and_is_shorter(rng: random.Random) -> None:
    result = rng.randbytes(500).hex()
    row = (
        b'{"kind":"tool.completed","run_id":"run-1","tenant":"t","seq":4,"fence":1,'
        b'"at":1796174225941567,"format":1,"call_id":"call-1","result":"'
        + result.encode()
        + b'","error":null}'
    )
    packed = pack(row)
    assert packed.startswith(PACKED)
    assert len(packed) < 0.65 * len(row)
    assert unpack(packed) == row


def test_rows_not_worth_packing_are_stored_as_they_are(rng: random.Random) -> None:
    short = b'{"kind":"x"}'
    assert len(short) < SMALLEST
    assert pack(short) == short
    noise = rng.randbytes(400)  # deflate cannot shorten it
    assert pack(noise) == noise


def test_rows_that_are_not_packed_read_as_they_are(rng: random.Random) -> None:
    assert unpack(b'{"kind":"run.started"}') == b'{"kind":"run.started"}'
    # Marked, but no deflate stream a packer wrote: a first block of the reserved type 3.
    foreign = PACKED + bytes([0b111]) + rng.randbytes(99)
    assert unpack(foreign) == foreign
    row = b'{"kind":"tool.completed","result":' + b'"seat 3A booked, ' * 20 + b'"}'
    packed = pack(row)
    assert packed.startswith(PACKED)
    # A whole stream with bytes after it, or one cut short, is not what `pack` writes either
    # (100 random bytes after the mark decode as a short valid stream about once in a hundred).
    assert unpack(packed + b"\x00trailing") == packed + b"\x00trailing"
    assert unpack(packed[:-3]) == packed[:-3]


async def test_the_log_stores_records_packed_and_reads_unpacked_ones_too(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    run_id = new_run_id()
    events = step_events(run_id, 6, body="the same words again " * 40)
    async with SqliteEventLog(path, partitions=4) as log:
        await log.append(events[:3])
        # A record as a file written before packing holds it: the codec's bytes, unpacked.
        log.write_raw(run_id, codec.encode(events[3]))
        await log.append(events[4:])
        stored = await log.read_run(run_id)
    assert [s.event for s in stored] == events
    with closing(sqlite3.connect(path)) as conn:
        rows = [bytes(r[0]) for r in conn.execute("SELECT record FROM onward_log ORDER BY offset")]
    assert sum(row.startswith(PACKED) for row in rows) >= 4
    assert not rows[3].startswith(PACKED)
