"""`onward db migrate` into an ``ONWARD_DATABASE_SCHEMA`` that does not exist yet.

With the right to create it, the schema is created (its name taken as written) and migrated;
without it, one line says what a superuser runs, exit 2, and nothing is created. Where the
role lacks the right is a database made for the test on the shared server (the test role may
create databases, not roles), dropped after it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio
from typer.testing import CliRunner, Result

from onward.runtime.cli import app


def onward(database_url: str, schema: str, *args: str) -> Result:
    env = {"DATABASE_URL": database_url, "ONWARD_DATABASE_SCHEMA": schema}
    return CliRunner().invoke(app, ["db", *args], env=env)


async def _execute(database_url: str, *statements: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


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


def schema_exists(database_url: str, schema: str) -> bool:
    async def read() -> bool:
        conn = await asyncpg.connect(database_url)
        try:
            found = await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema)
        finally:
            await conn.close()
        return found is not None

    return asyncio.run(read())


@pytest.fixture
def missing_schema(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A schema name nobody made yet (dropped after the test, if it was made here)."""
    monkeypatch.chdir(tmp_path)
    name = f"onward_new_{uuid.uuid4().hex[:10]}"
    yield name
    asyncio.run(_execute(database_url, f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


@pytest_asyncio.fixture
async def restricted_url(database_url: str) -> AsyncIterator[str]:
    """``DATABASE_URL``'s role in a database of this test where it may not create schemas.

    The role may create databases but not roles, so the database is what is made: the role
    owns it, and its right to create in it is revoked (an owner's rights can be).
    """
    name = f"onward_nocreate_{uuid.uuid4().hex[:10]}"
    await _execute(database_url, f"CREATE DATABASE {name}")
    url = urlunsplit(urlsplit(database_url)._replace(path=f"/{name}"))
    try:
        await _execute(url, f"REVOKE CREATE ON DATABASE {name} FROM CURRENT_USER, PUBLIC")
        yield url
    finally:
        await _execute(database_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_migrate_creates_the_named_schema_and_migrates_into_it(
    database_url: str, missing_schema: str
) -> None:
    result = onward(database_url, missing_schema, "migrate", "--json")
    assert result.exit_code == 0, result.output
    applied = json.loads(result.stdout)["applied"]
    assert applied[0] == f'schema "{missing_schema}"'
    assert "onward_schema_migrations" in tables(database_url, missing_schema)
    verified = onward(database_url, missing_schema, "verify")
    assert verified.exit_code == 0, verified.output
    again = json.loads(onward(database_url, missing_schema, "migrate", "--json").stdout)
    assert again == {"applied": [], "current": True}


def test_a_name_taken_as_written_is_the_schema_the_stores_use(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unquoted, PostgreSQL folds "Onward_New_..." to lower case: the schema created (quoted)
    # would not be the one the connections' search path names.
    monkeypatch.chdir(tmp_path)
    name = f"Onward_New_{uuid.uuid4().hex[:10]}"
    try:
        result = onward(database_url, name, "migrate")
        assert result.exit_code == 0, result.output
        assert "onward_schema_migrations" in tables(database_url, name)
        verified = onward(database_url, name, "verify")
        assert verified.exit_code == 0, verified.output
    finally:
        asyncio.run(_execute(database_url, f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    assert not schema_exists(database_url, name.lower())


def test_without_the_right_to_create_it_says_what_to_run(
    restricted_url: str, missing_schema: str
) -> None:
    role = urlsplit(restricted_url).username
    result = onward(restricted_url, missing_schema, "migrate")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f'ConfigurationError: ONWARD_DATABASE_SCHEMA: schema "{missing_schema}" does not exist '
        f'and role "{role}" may not create it; as a superuser run: CREATE SCHEMA '
        f'"{missing_schema}" AUTHORIZATION "{role}";'
    ]
    assert not schema_exists(restricted_url, missing_schema)
    # What it says to run is what it takes (run here by the owner, who may grant itself the
    # right for that one statement): then the role migrates into the schema made for it.
    database = urlsplit(restricted_url).path.lstrip("/")
    asyncio.run(
        _execute(
            restricted_url,
            f"GRANT CREATE ON DATABASE {database} TO CURRENT_USER",
            f'CREATE SCHEMA "{missing_schema}" AUTHORIZATION "{role}"',
            f"REVOKE CREATE ON DATABASE {database} FROM CURRENT_USER",
        )
    )
    migrated = onward(restricted_url, missing_schema, "migrate")
    assert migrated.exit_code == 0, migrated.output
    assert "onward_schema_migrations" in tables(restricted_url, missing_schema)


async def test_a_schema_another_migration_creates_at_the_same_moment_is_migrated_into(
    database_url: str, missing_schema: str
) -> None:
    # Two migrations at once both find the schema missing; PostgreSQL makes the second's
    # CREATE SCHEMA IF NOT EXISTS wait for the first's and then fail with a unique violation.
    # The other one's is held open here until this one waits behind it.
    other = await asyncpg.connect(database_url)
    watcher = await asyncpg.connect(database_url)  # outside the transaction, which sees no news
    try:
        creating = other.transaction()
        await creating.start()
        await other.execute(f'CREATE SCHEMA "{missing_schema}"')
        env = {**os.environ, "DATABASE_URL": database_url, "ONWARD_DATABASE_SCHEMA": missing_schema}
        child = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "onward", "db", "migrate"),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            for _ in range(400):
                waiting = await watcher.fetchval(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query = $1",
                    f'CREATE SCHEMA IF NOT EXISTS "{missing_schema}"',
                )
                if waiting or child.returncode is not None:
                    break
                await asyncio.sleep(0.05)
            assert waiting, "`onward db migrate` never waited for the other CREATE SCHEMA"
            await creating.commit()
            _, stderr = await asyncio.wait_for(child.communicate(), 30)
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        assert child.returncode == 0, stderr.decode()
        migrated = await other.fetchval(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = $1 "
            "AND table_name = 'onward_schema_migrations'",
            missing_schema,
        )
        assert migrated
    finally:
        await watcher.close()
        await other.close()
