"""`onward db migrate` creates tables only where the user named; `onward db verify` nowhere.

Both work on the PostgreSQL database in ``DATABASE_URL`` and the schema in
``ONWARD_DATABASE_SCHEMA``; neither may leave an embedded SQLite file behind (the default
backend names one, ``onward.db``, in the working directory) nor touch another schema.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import asyncpg
import pytest
from support.pg import SchemaFactory
from typer.testing import CliRunner, Result

from onward.runtime.cli import app


def onward(database_url: str, schema: str, *args: str) -> Result:
    env = {
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": schema,
        "ONWARD_BACKEND": os.environ.get("ONWARD_BACKEND", "sqlite"),
    }
    return CliRunner().invoke(app, list(args), env=env)


def tables(database_url: str, schema: str) -> set[str]:
    async def read() -> set[str]:
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
            )
        finally:
            await conn.close()
        return {row["table_name"] for row in rows}

    return asyncio.run(read())


@pytest.fixture
async def empty_schemas(
    new_pg_schema: SchemaFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    """Two schemas with no tables: the one named, and a bystander. The test runs in an empty
    working directory (where the default backend would put ``onward.db``)."""
    monkeypatch.chdir(tmp_path)
    return await new_pg_schema(migrated=False), await new_pg_schema(migrated=False)


def test_verify_creates_nothing_in_an_empty_schema_nor_a_sqlite_file(
    database_url: str, empty_schemas: tuple[str, str]
) -> None:
    named, _ = empty_schemas
    result = onward(database_url, named, "db", "verify")
    assert result.exit_code == 2, result.output
    assert "onward db migrate" in result.stderr
    assert tables(database_url, named) == set()
    assert list(Path.cwd().iterdir()) == []


def test_migrate_creates_tables_in_the_named_schema_only(
    database_url: str, empty_schemas: tuple[str, str]
) -> None:
    named, bystander = empty_schemas
    result = onward(database_url, named, "db", "migrate")
    assert result.exit_code == 0, result.output
    assert "onward_schema_migrations" in tables(database_url, named)
    assert tables(database_url, bystander) == set()
    assert list(Path.cwd().iterdir()) == []
    before = tables(database_url, named)
    verified = onward(database_url, named, "db", "verify")
    assert verified.exit_code == 0, verified.output
    assert tables(database_url, named) == before
    as_json = json.loads(onward(database_url, named, "db", "verify", "--json").stdout)
    assert as_json["ok"] is True
    assert as_json["frontiers_build"] == 1
    again = json.loads(onward(database_url, named, "db", "migrate", "--json").stdout)
    assert again == {"applied": [], "current": True}
