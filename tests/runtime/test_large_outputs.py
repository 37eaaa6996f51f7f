"""A run's output too large for one log record: out of line with a blob store, like every other
body, and given back whole to whoever reads the run's end (its result, its frontier row, the
application's stream, ``onward inspect``)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
import pytest_asyncio
from typer.testing import CliRunner

import onward
from onward.errors import HistoryUnavailableError
from onward.eventlog import (
    KafkaEventLog,
    MemoryEventLog,
    Message,
    ModelAnswered,
    RunFinished,
    RunStarted,
    SqliteEventLog,
)
from onward.eventlog.base import EventLog
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.blobs import MemoryBlobStore, PostgresBlobStore, SqliteBlobStore
from onward.runtime.cli import app, frontier_main
from onward.runtime.leases import PostgresLeaseStore, SqliteLeaseStore
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import Settings

TENANT = "acme"
AGENT = Agent(name="writer", instructions="write")
ESSAY = "word " * 400_000  # 2 MB of text: over any log record, taken by a blob store


async def records(log: EventLog, run_id: str) -> list[bytes]:
    return [msgspec.json.encode(s.event) for s in await log.read_run(run_id)]


async def test_a_final_answer_over_a_records_size_completes_with_its_output() -> None:
    log, blobs, store = MemoryEventLog(), MemoryBlobStore(), MemoryFrontierStore()
    options: dict[str, Any] = {"log": log, "blobs": blobs, "frontiers": store}
    provider = ScriptedProvider([reply(ESSAY)])

    result = await AgentRunner(provider=provider, checkpoint_inline=True, **options).run(
        AGENT, "write an essay", tenant=TENANT, run_id="r"
    )

    assert (result.status, result.error) == ("completed", None)
    assert result.output == ESSAY
    assert max(len(r) for r in await records(log, "r")) < 10_000
    again = await AgentRunner(provider=ScriptedProvider([]), **options).resume(
        AGENT, "r", tenant=TENANT
    )
    assert (again.status, again.output) == ("completed", ESSAY)
    assert provider.calls == 1


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
async def test_the_stream_ends_with_the_whole_output(
    tmp_path: Path, backend: Literal["sqlite", "memory"]
) -> None:
    """The stream's result message carries the output, read from the log as it goes and from
    the run's row once the log no longer holds the run's end; the run's state has it too."""
    settings = Settings(backend=backend, sqlite_path=tmp_path / "onward.db")
    provider = ScriptedProvider([reply(ESSAY)])
    async with onward.open(settings, agents={"writer": AGENT}, provider=provider) as app:
        ran = await app.query("write an essay", {"agent": "writer"}).collect()
        run_id = ran[-1].run_id
        log = app.backends.log
        partition = (await log.read_run(run_id))[0].position.partition
        await log.truncate_before(partition, (await log.bounds(partition)).end)
        state = await app.get_session_state(run_id)
        again = await app.resume(run_id, timeout=5).collect()

    assert state is not None
    assert (state.status, state.output) == ("completed", ESSAY)
    assert [(m.type, m.status) for m in ran[-1:]] == [("result", "completed")]
    assert (ran[-1].output, ran[-1].content) == (ESSAY, ESSAY)
    assert [(m.type, m.output, m.content) for m in again] == [("result", ESSAY, ESSAY)]


def test_inspect_shows_the_output_not_its_reference(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"

    async def ran() -> None:
        async with (
            SqliteEventLog(db) as log,
            SqliteFrontierStore(db) as frontiers,
            SqliteBlobStore(db) as blobs,
            SqliteLeaseStore(db) as leases,
        ):
            runner = AgentRunner(
                provider=ScriptedProvider([reply(ESSAY)]),
                log=log,
                frontiers=frontiers,
                blobs=blobs,
                leases=leases,
                checkpoint_inline=True,
            )
            await runner.run(AGENT, "write an essay", tenant=TENANT, run_id="r")

    asyncio.run(ran())
    environment = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    shown = CliRunner().invoke(app, ["inspect", "r", "--tenant", TENANT, "--json"], env=environment)
    table = CliRunner().invoke(app, ["inspect", "r", "--tenant", TENANT], env=environment)

    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["output"] == ESSAY
    assert table.exit_code == 0, table.output
    assert "word word" in table.output
    assert "$blob" not in table.output


@pytest_asyncio.fixture
async def on_kafka(
    kafka_bootstrap: str, kafka_topic: str, database_url: str, pg_schema: str
) -> AsyncIterator[dict[str, Any]]:
    """A Kafka log, with frontier rows, blobs and leases in PostgreSQL."""
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=2) as log,
        PostgresFrontierStore(database_url, schema=pg_schema) as frontiers,
        PostgresBlobStore(database_url, schema=pg_schema) as blobs,
        PostgresLeaseStore(database_url, schema=pg_schema) as leases,
    ):
        yield {"log": log, "frontiers": frontiers, "blobs": blobs, "leases": leases}


@pytest.mark.kafka
async def test_on_kafka_a_final_answer_over_a_records_size_completes_with_its_output(
    on_kafka: dict[str, Any],
) -> None:
    provider = ScriptedProvider([reply(ESSAY)])
    result = await AgentRunner(provider=provider, **on_kafka).run(
        AGENT, "write an essay", tenant=TENANT, run_id="r"
    )
    log = on_kafka["log"]
    await LogProjector(log, FrontierProjection(on_kafka["frontiers"], log)).catch_up()
    again = await AgentRunner(provider=ScriptedProvider([]), **on_kafka).resume(
        AGENT, "r", tenant=TENANT
    )

    assert (result.status, result.output) == ("completed", ESSAY)
    assert (again.status, again.output) == ("completed", ESSAY)
    assert max(len(r) for r in await records(log, "r")) < 10_000
    assert provider.calls == 1


async def test_an_output_written_in_line_reads_as_before() -> None:
    """A log written before outputs went out of line (nothing wrapped, nothing moved): its
    output is given back as it was."""
    log = MemoryEventLog()
    old = {"answer": 42, "parts": ["a", {"size": 3}]}
    envelope: dict[str, Any] = {"run_id": "r", "tenant": TENANT, "fence": 1}
    await log.append(
        [
            RunStarted(**envelope, seq=1, agent=AGENT.name, revision=AGENT.revision, input="go"),
            ModelAnswered(**envelope, seq=2, message=Message(role="assistant", content="done")),
            RunFinished(**envelope, seq=3, status="completed", output=old),
        ]
    )

    again = await AgentRunner(
        provider=ScriptedProvider([]), log=log, blobs=MemoryBlobStore()
    ).resume(AGENT, "r", tenant=TENANT)

    assert (again.status, again.output) == ("completed", old)


async def test_an_output_lost_from_the_blob_store_is_named_at_the_seq_of_the_runs_end() -> None:
    """A run tagged after it ended: the output that can no longer be read is said to be the
    one its ``run.finished`` event refers to, not the seq of the tag written after it."""
    log, blobs, store = MemoryEventLog(), MemoryBlobStore(), MemoryFrontierStore()
    options: dict[str, Any] = {"log": log, "blobs": blobs, "frontiers": store}
    runner = AgentRunner(provider=ScriptedProvider([reply(ESSAY)]), **options)
    await runner.run(AGENT, "write an essay", tenant=TENANT, run_id="r")
    [finished] = [s.event for s in await log.read_run("r") if isinstance(s.event, RunFinished)]
    tagged = await runner.tag("r", "kept", tenant=TENANT, seq=finished.seq, by="ann")
    blobs.forget((await runner.inspect("r", tenant=TENANT)).output["$blob"])

    with pytest.raises(HistoryUnavailableError) as lost:
        await AgentRunner(provider=ScriptedProvider([]), **options).resume(
            AGENT, "r", tenant=TENANT
        )

    assert tagged == finished.seq
    assert f"run 'r' seq {finished.seq}:" in str(lost.value)


def sqlite_runner(db: Path) -> AbstractAsyncContextManager[AgentRunner]:
    """A runner on every store of one SQLite file, blobs included, as a product opens it."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[AgentRunner]:
        async with (
            SqliteEventLog(db) as log,
            SqliteFrontierStore(db) as frontiers,
            SqliteBlobStore(db) as blobs,
            SqliteLeaseStore(db) as leases,
        ):
            yield AgentRunner(
                provider=ScriptedProvider([reply(ESSAY)]),
                log=log,
                frontiers=frontiers,
                blobs=blobs,
                leases=leases,
                checkpoint_inline=True,
            )

    return opened()


def output_lost(db: Path) -> str:
    """Run ``r`` to its end with a large output, then lose that output from the blob store,
    as an over-eager cleanup would; returns its digest."""

    async def ran() -> str:
        async with sqlite_runner(db) as runner:
            await runner.run(AGENT, "write an essay", tenant=TENANT, run_id="r")
            return str((await runner.inspect("r", tenant=TENANT)).output["$blob"])

    digest = asyncio.run(ran())
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM onward_blobs WHERE digest = ?", (digest,))
    return digest


def test_inspect_of_a_run_whose_output_is_lost_shows_the_run_and_names_what_is_missing(
    tmp_path: Path,
) -> None:
    """The blob store lost the output of an ended run: `inspect` still shows where the run
    stands, says on stderr which body is missing, and exits 4 (not all of it could be read)."""
    db = tmp_path / "onward.db"
    digest = output_lost(db)
    environment = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    shown = CliRunner().invoke(app, ["inspect", "r", "--tenant", TENANT, "--json"], env=environment)
    table = CliRunner().invoke(app, ["inspect", "r", "--tenant", TENANT], env=environment)

    for result in (shown, table):
        assert result.exit_code == 4, result.output
        assert "HistoryUnavailableError" in result.stderr
        assert digest in result.stderr
        assert "$blob" not in result.stdout
    facts = json.loads(shown.stdout)
    assert (facts["run"], facts["status"], facts["output"]) == ("r", "completed", None)
    assert "completed" in table.stdout


def test_a_products_inspect_of_a_run_whose_output_is_lost_shows_the_run_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "product.db"
    digest = output_lost(db)

    assert frontier_main(["r", "--tenant", TENANT, "--json"], runner=lambda: sqlite_runner(db)) == 4
    said = capsys.readouterr()
    assert json.loads(said.out)["status"] == "completed"
    assert "HistoryUnavailableError" in said.err
    assert digest in said.err
