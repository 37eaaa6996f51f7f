"""The storage layer's SQLite pieces: statement splitting and the migration ledger."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from onward._storage import connect, migrate_sqlite, migrations, split_statements

SCRIPT = """
-- A comment with a ; in it.
CREATE TABLE notes (body TEXT NOT NULL DEFAULT 'a; b');
CREATE TABLE log (body TEXT NOT NULL);
CREATE TRIGGER notes_logged AFTER INSERT ON notes
BEGIN
    INSERT INTO log (body) VALUES ('noted; ' || new.body);
    INSERT INTO log (body) VALUES ('twice');
END;
INSERT INTO notes DEFAULT VALUES;
-- A trailing comment, no statement.
"""


def test_a_semicolon_in_a_literal_a_comment_or_a_trigger_body_does_not_end_a_statement() -> None:
    statements = split_statements(SCRIPT)
    assert len(statements) == 4
    assert statements[0].startswith("-- A comment with a ; in it.\nCREATE TABLE notes")
    assert "END;" in statements[2]
    with closing(sqlite3.connect(":memory:")) as conn:
        for statement in statements:
            conn.execute(statement)
        assert conn.execute("SELECT body FROM notes").fetchall() == [("a; b",)]
        assert conn.execute("SELECT body FROM log ORDER BY rowid").fetchall() == [
            ("noted; a; b",),
            ("twice",),
        ]


def test_a_statement_without_a_final_semicolon_is_kept() -> None:
    assert split_statements("SELECT 1; SELECT 2") == ["SELECT 1;", "SELECT 2;"]


def test_a_script_ending_inside_a_statement_is_refused() -> None:
    with pytest.raises(ValueError, match="ends inside a statement"):
        split_statements("CREATE TRIGGER t AFTER INSERT ON x BEGIN SELECT 1;")


def test_migrating_twice_applies_nothing_the_second_time(tmp_path: Path) -> None:
    with closing(connect(tmp_path / "onward.db")) as conn:
        first = migrate_sqlite(conn)
        # Every migration, counted by file: numbers may have gaps (parallel work reserves them).
        assert len(first) == len(migrations("sqlite"))
        assert migrate_sqlite(conn) == []
