"""`onward tag`: a label on one event of a run, written under the run's lease, and listed by
`inspect` and `replay`.

The embedded tests write a finished run into a SQLite file and drive the command line
in-process; one test does the same against Kafka, PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from support import cli_agent
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

from onward.eventlog import SqliteEventLog
from onward.eventlog.base import EventLog
from onward.eventlog.events import Tagged
from onward.projections.memory import MemoryFrontierStore
from onward.runtime import AgentRunner, LeaseStore, SqliteLeaseStore
from onward.runtime.cli import app

TENANT = "acme"


async def finish_run(log: EventLog, leases: LeaseStore) -> tuple[str, int]:
    """A booking run carried to its end; returns its id and the seq of its last boundary."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    runner = AgentRunner(
        provider=cli_agent.booking_model(),
        log=log,
        leases=leases,
        frontiers=MemoryFrontierStore(),  # the worker's own: commands read the log
    )
    await runner.run(cli_agent.booker(), "go", tenant=TENANT, run_id=run_id)
    return run_id, (await runner.inspect(run_id, tenant=TENANT)).resume_seq


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "onward.db"


def finished(db: Path) -> tuple[str, int]:
    async def go() -> tuple[str, int]:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            return await finish_run(log, leases)

    return asyncio.run(go())


def onward(db: Path, *args: str) -> Result:
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    return CliRunner().invoke(app, list(args), env=env)


def test_tag_labels_the_latest_boundary_and_inspect_and_replay_list_it(db: Path) -> None:
    run_id, boundary = finished(db)
    tagged = onward(db, "tag", run_id, "reviewed", "--tenant", TENANT)
    assert tagged.exit_code == 0, tagged.output
    assert f"tagged seq {boundary} of run {run_id} as 'reviewed'" in tagged.stdout
    first = onward(db, "tag", run_id, "started", "--tenant", TENANT, "--seq", "1")
    assert first.exit_code == 0, first.output

    shown = onward(db, "inspect", run_id, "--tenant", TENANT)
    assert shown.exit_code == 0, shown.output
    assert f"seq {boundary} reviewed; seq 1 started" in shown.stdout

    replayed = onward(db, "replay", run_id, "--tenant", TENANT)
    assert replayed.exit_code == 0, replayed.output
    assert f"tags: seq {boundary} reviewed; seq 1 started" in replayed.stdout
    as_json = onward(db, "replay", run_id, "--tenant", TENANT, "--json").stdout
    tags = [json.loads(line)["event"] for line in as_json.splitlines()]
    assert [(t["target_seq"], t["label"]) for t in tags if t["kind"] == "tagged"] == [
        (boundary, "reviewed"),
        (1, "started"),
    ]


def test_a_run_without_tags_says_so(db: Path) -> None:
    run_id, _ = finished(db)
    assert "tags: -" in onward(db, "replay", run_id, "--tenant", TENANT).stdout


@pytest.mark.parametrize(
    ("label", "options", "says"),
    [
        ("x", ["--seq", "99"], "has no event 99 to tag"),
        ("x", ["--seq", "0"], "has no event 0 to tag"),
        (" ", [], "non-empty label"),
    ],
)
def test_a_tag_the_run_cannot_take_exits_2_and_writes_nothing(
    db: Path, label: str, options: list[str], says: str
) -> None:
    run_id, _ = finished(db)
    result = onward(db, "tag", run_id, label, "--tenant", TENANT, *options)
    assert result.exit_code == 2, result.output
    assert says in result.stderr
    assert "tags: -" in onward(db, "replay", run_id, "--tenant", TENANT).stdout


def test_tagging_an_unknown_run_exits_1(db: Path) -> None:
    finished(db)
    result = onward(db, "tag", "run-nobody", "x", "--tenant", TENANT)
    assert result.exit_code == 1
    assert "no run 'run-nobody'" in result.stderr


def test_tagging_a_run_another_worker_holds_exits_3(db: Path) -> None:
    run_id, _ = finished(db)

    async def hold() -> None:
        async with SqliteLeaseStore(db) as leases:
            await leases.acquire(run_id, tenant=TENANT, holder="other-worker", ttl_s=300)

    asyncio.run(hold())
    result = onward(db, "tag", run_id, "x", "--tenant", TENANT)
    assert result.exit_code == 3, result.output
    assert "is held by 'other-worker' until " in result.stderr


@pytest.mark.kafka
async def test_tag_against_kafka_postgres_and_redis(kafka_servers: KafkaServers) -> None:
    async with kafka_servers.log() as log, kafka_servers.leases() as leases:
        run_id, boundary = await finish_run(log, leases)

        def cli(*args: str) -> Result:
            return CliRunner().invoke(app, list(args), env=kafka_servers.env())

        # Each command runs its own event loop, so it gets a thread of its own.
        tagged = await asyncio.to_thread(cli, "tag", run_id, "milestone", "--tenant", TENANT)
        assert tagged.exit_code == 0, tagged.output
        shown = await asyncio.to_thread(cli, "inspect", run_id, "--tenant", TENANT)
        assert f"seq {boundary} milestone" in shown.stdout
        replayed = await asyncio.to_thread(cli, "replay", run_id, "--tenant", TENANT)
        assert f"tags: seq {boundary} milestone" in replayed.stdout
        written = [s.event for s in await log.read_run(run_id) if isinstance(s.event, Tagged)]
        assert [(t.target_seq, t.label) for t in written] == [(boundary, "milestone")]
        assert written[0].fence > 1  # under a lease of its own, above the run's
