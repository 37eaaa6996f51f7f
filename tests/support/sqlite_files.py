"""What a SQLite file holds, for tests that search it for text that must not be there."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from onward._storage import unpack


def stored_bytes(path: Path) -> bytes:
    """Every byte of a SQLite database, its -wal and -shm files included, followed by every log
    record and transcript message unpacked: packed rows are deflated, so a search of the raw
    bytes alone would miss text they hold."""
    raw = b"".join(file.read_bytes() for file in path.parent.glob(f"{path.name}*"))
    with closing(sqlite3.connect(path)) as conn:
        rows = [
            *conn.execute("SELECT record FROM onward_log"),
            *conn.execute("SELECT message FROM onward_transcript"),
        ]
    return raw + b"".join(unpack(bytes(row[0])) for row in rows)
