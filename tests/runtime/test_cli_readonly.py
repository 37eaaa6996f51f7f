"""Read-only commands write nothing: `inspect` and `replay` leave the SQLite file as they found it.

Each test fingerprints the database file and which of its ``-wal``/``-shm`` files exist before
and after the command, and a file that is not an Onward database (another program's, or no
SQLite at all) is refused in one line with exit 2, unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import uuid
from contextlib import closing
from pathlib import Path

import pytest
from support import cli_agent
from typer.testing import CliRunner, Result

from onward.errors import BackendError, ConfigurationError
from onward.eventlog import SqliteEventLog
from onward.projections import SqliteFrontierStore
from onward.runtime import AgentRunner, SqliteLeaseStore
from onward.runtime.backends import open_backends
from onward.runtime.cli import app
from onward.runtime.settings import Settings

TENANT = "acme"
READERS = ["inspect", "replay"]


def onward(db: Path, *args: str) -> Result:
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    return CliRunner().invoke(app, list(args), env=env)


def fingerprint(db: Path) -> tuple[str | None, list[str]]:
    """The file's sha256 and which files sit beside it (``-wal``, ``-shm``, journals)."""
    digest = hashlib.sha256(db.read_bytes()).hexdigest() if db.exists() else None
    return digest, sorted(p.name for p in db.parent.iterdir())


def assert_refused_unchanged(db: Path, command: str, *, saying: str | None = None) -> None:
    """``command`` on ``db`` exits 2 and leaves the file as it was; with ``saying``, its error
    is that one line."""
    before = fingerprint(db)
    result = onward(db, command, "run-1", "--tenant", TENANT)
    assert result.exit_code == 2, result.output
    if saying is not None:
        assert saying in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert fingerprint(db) == before


async def write_finished_run(db: Path) -> str:
    """A finished run in ``db``, written by an embedded worker that then closed the file."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
        runner = AgentRunner(provider=cli_agent.booking_model(), log=log, leases=leases)
        await runner.run(cli_agent.booker(), "go", tenant=TENANT, run_id=run_id)
    return run_id


def finished_run(db: Path) -> str:
    return asyncio.run(write_finished_run(db))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    return folder / "onward.db"


@pytest.mark.parametrize("command", READERS)
def test_a_read_only_command_leaves_the_file_and_its_neighbours_unchanged(
    db: Path, command: str
) -> None:
    run_id = finished_run(db)
    before = fingerprint(db)
    result = onward(db, command, run_id, "--tenant", TENANT)
    assert result.exit_code == 0, result.output
    assert fingerprint(db) == before


@pytest.mark.parametrize("command", READERS)
def test_a_read_only_command_beside_a_live_writer_changes_nothing(db: Path, command: str) -> None:
    # A writer holding the file open keeps its -wal and -shm; the reader uses them as they are.
    run_id = finished_run(db)
    writer = sqlite3.connect(db)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("SELECT count(*) FROM onward_log").fetchone()
        before = fingerprint(db)
        assert f"{db.name}-wal" in before[1]
        result = onward(db, command, run_id, "--tenant", TENANT)
        assert result.exit_code == 0, result.output
        assert fingerprint(db) == before
    finally:
        writer.close()


@pytest.mark.parametrize("command", READERS)
def test_a_foreign_sqlite_file_is_refused_unchanged(db: Path, command: str) -> None:
    foreign = sqlite3.connect(db)
    foreign.execute("CREATE TABLE recipes (name text)")
    foreign.execute("INSERT INTO recipes VALUES ('soup')")
    foreign.commit()
    foreign.close()
    assert_refused_unchanged(db, command, saying="not an Onward database")


@pytest.mark.parametrize("command", READERS)
def test_a_file_that_is_no_sqlite_database_is_refused_unchanged(db: Path, command: str) -> None:
    db.write_bytes(b"not a database, just some bytes\n" * 200)
    assert_refused_unchanged(db, command, saying="not an Onward database")


@pytest.mark.parametrize("command", READERS)
def test_an_empty_file_is_refused_and_stays_empty(db: Path, command: str) -> None:
    db.touch()
    assert_refused_unchanged(db, command)


@pytest.mark.parametrize("command", READERS)
def test_a_missing_file_exits_2_and_is_not_created(db: Path, command: str) -> None:
    result = onward(db, command, "run-1", "--tenant", TENANT)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(db.parent.iterdir()) == []


@pytest.mark.parametrize("command", READERS)
def test_a_migrated_file_without_runs_says_no_such_run_and_stays_unchanged(
    db: Path, command: str
) -> None:
    async def migrate_only() -> None:
        async with SqliteFrontierStore(db):
            pass

    asyncio.run(migrate_only())
    before = fingerprint(db)
    result = onward(db, command, "run-1", "--tenant", TENANT)
    assert result.exit_code == 1, result.output
    assert fingerprint(db) == before


async def test_read_only_backends_read_and_refuse_to_write(db: Path) -> None:
    run_id = await write_finished_run(db)
    before = fingerprint(db)
    settings = Settings(ONWARD_BACKEND="sqlite", ONWARD_SQLITE_PATH=db)  # type: ignore[call-arg]
    async with open_backends(settings, readonly=True) as backends:
        frontier = await backends.runner(cli_agent.booking_model()).inspect(run_id, tenant=TENANT)
        assert frontier.status == "completed"
        with pytest.raises(BackendError, match="readonly"):
            await backends.blobs.put(b"x")
    assert fingerprint(db) == before


async def test_read_only_backends_refuse_a_foreign_file(db: Path) -> None:
    foreign = sqlite3.connect(db)
    foreign.execute("CREATE TABLE recipes (name text)")
    foreign.close()
    settings = Settings(ONWARD_BACKEND="sqlite", ONWARD_SQLITE_PATH=db)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="not an Onward database"):
        async with open_backends(settings, readonly=True):
            pass


async def test_backends_opened_to_write_refuse_a_foreign_file_unchanged(db: Path) -> None:
    """What `onward worker` and `onward.open` open: another program's file is not migrated."""
    with closing(sqlite3.connect(db)) as foreign:
        foreign.execute("CREATE TABLE recipes (name text)")
        foreign.commit()
    before = fingerprint(db)
    settings = Settings(ONWARD_BACKEND="sqlite", ONWARD_SQLITE_PATH=db)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="not an Onward database"):
        async with open_backends(settings):
            pass
    assert fingerprint(db) == before


WRITERS = {
    "run-resume": [
        *("run", "--resume", "run-1", "--tenant", TENANT),
        *("--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"),
    ],
    "approve": ["approve", "run-1", "p", "--tenant", TENANT, "--by", "ann"],
    "deny": ["deny", "run-1", "p", "--tenant", TENANT, "--by", "ann"],
    "resolve": [
        *("resolve", "run-1", "b", "--tenant", TENANT),
        *("--outcome", "never_ran", "--by", "ann", "--why", "checked"),
    ],
    "cancel": ["cancel", "run-1", "--tenant", TENANT, "--by", "ann"],
}


@pytest.mark.parametrize("command", list(WRITERS))
def test_a_command_about_a_run_refuses_a_foreign_file_instead_of_migrating_it(
    db: Path, command: str
) -> None:
    foreign = sqlite3.connect(db)
    foreign.execute("CREATE TABLE recipes (name text)")
    foreign.commit()
    foreign.close()
    before = fingerprint(db)
    result = onward(db, *WRITERS[command])
    assert result.exit_code == 2, result.output
    assert "not an Onward database" in result.stderr
    assert fingerprint(db) == before


def test_a_dry_run_of_compact_does_not_migrate_a_file_of_an_older_version(db: Path) -> None:
    """``--dry-run`` says "change nothing": the file is opened read-only, as ``inspect`` opens
    it, and a file of an older version is not upgraded by a look at what would be cut."""
    finished_run(db)
    older = sqlite3.connect(db)
    newest = older.execute("SELECT max(version) FROM onward_schema_migrations").fetchone()[0]
    older.execute("ALTER TABLE onward_run_truncation DROP COLUMN fence")
    older.execute("DELETE FROM onward_schema_migrations WHERE version = ?", (newest,))
    older.commit()
    older.close()
    before = fingerprint(db)
    result = onward(db, "compact", "--dry-run")
    assert "onward db migrate" in result.stderr, result.output
    assert fingerprint(db) == before
