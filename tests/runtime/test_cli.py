"""The run commands of `onward`: inspect, run --resume, approve, deny, resolve, replay.

Each test prepares a run in an embedded SQLite file the way a worker leaves it (finished,
waiting on a person, or killed at a point), then drives the command line in-process and checks
its exit code and what it says. One test runs against Kafka, PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support import cli_agent
from support.crashes import Crash, CrashAt
from support.processes import TESTS, kill_if_running
from support.runners import log_runner
from support.servers import KafkaServers
from support.shell import pasted
from typer.testing import CliRunner, Result

from onward.eventlog import (
    EVENT_FORMAT,
    Event,
    RunClaimed,
    RunFinished,
    RunStarted,
    SqliteEventLog,
    ToolDispatched,
)
from onward.eventlog.base import EventLog, partition_for
from onward.eventlog.schema import event_schema
from onward.runtime import (
    Agent,
    LeaseStore,
    Provider,
    RunLease,
    SqliteLeaseStore,
)
from onward.runtime.cli import app
from onward.runtime.continuation import ContinuationPolicy
from onward.runtime.leases.presence import HOLDERS_DIR_ENV
from onward.testing.eventlog import Envelope

TENANT = "acme"
AGENT = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]
PAYING = ["--agent", "support.cli_agent:payer", "--provider", "support.cli_agent:paying_model"]


async def start_on(
    log: EventLog,
    leases: LeaseStore,
    run_id: str,
    *,
    agent: Agent,
    provider: Provider,
    crash_at: str | None,
    tenant: str = TENANT,
) -> None:
    """Run an agent as worker w1 until it finishes, waits, or 'dies' at ``crash_at``."""
    observer = CrashAt(crash_at) if crash_at else None
    # The command under test reads the run from the log, as this worker does.
    runner = log_runner(provider, log, leases, worker="w1", observer=observer)
    with contextlib.suppress(Crash):
        await runner.run(agent, "go", tenant=tenant, run_id=run_id)


def start(
    db: Path,
    *,
    agent: Agent | None = None,
    provider: Provider | None = None,
    crash_at: str | None = None,
) -> str:
    """A run in the SQLite file ``db``, left as ``start_on`` leaves it; returns its id."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            await start_on(
                log,
                leases,
                run_id,
                agent=agent or cli_agent.booker(),
                provider=provider or cli_agent.booking_model(),
                crash_at=crash_at,
            )

    asyncio.run(go())
    return run_id


def waiting_run(db: Path) -> str:
    """A run waiting on a person to approve its payment ``p``."""
    return start(db, agent=cli_agent.payer(), provider=cli_agent.paying_model())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "onward.db"


def onward(db: Path, *args: str) -> Result:
    """Invoke the command line against the SQLite file ``db``."""
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    return CliRunner().invoke(app, list(args), env=env)


def test_inspect_shows_a_run_waiting_on_a_person(db: Path) -> None:
    run_id = waiting_run(db)
    result = onward(db, "inspect", run_id, "--tenant", TENANT)
    assert result.exit_code == 0, result.output
    assert "waiting" in result.stdout
    assert "nothing until a person answers p" in result.stdout


def test_inspect_of_an_unknown_run_exits_1(db: Path) -> None:
    waiting_run(db)
    result = onward(db, "inspect", "run-nobody", "--tenant", TENANT)
    assert result.exit_code == 1
    assert "no run 'run-nobody'" in result.stderr


def test_inspect_of_another_tenants_run_exits_1(db: Path) -> None:
    run_id = waiting_run(db)
    assert onward(db, "inspect", run_id, "--tenant", "other").exit_code == 1


def test_inspect_of_a_run_with_a_newer_event_format_exits_4(db: Path) -> None:
    run_id = start(db, crash_at="turn.settled")
    newer = {
        "kind": "run.claimed",
        "run_id": run_id,
        "tenant": TENANT,
        "seq": 3,
        "fence": 9,
        "worker": "x",
        "format": EVENT_FORMAT + 1,
    }
    SqliteEventLog(db).write_raw(run_id, json.dumps(newer).encode())
    result = onward(db, "inspect", run_id, "--tenant", TENANT)
    assert result.exit_code == 4
    assert "CheckpointFormatError" in result.stderr


def test_inspect_of_a_database_that_does_not_exist_exits_2(db: Path) -> None:
    result = onward(db, "inspect", "run-1", "--tenant", TENANT)
    assert result.exit_code == 2
    assert "does not exist" in result.stderr
    assert not db.exists()


def test_the_command_list_gives_each_command_s_summary_unbroken() -> None:
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    lines = {line.split()[1]: line for line in shown.stdout.splitlines() if line.startswith("│ ")}
    # One line each at this width: the docstrings' line breaks fall mid-sentence.
    assert "age (since the run's last update), last update" in lines["runs"]
    assert "it ends or waits on a person" in lines["start"]
    assert {"runs", "inspect", "worker", "projector", "db", "quarantine"} <= lines.keys()
    # A command's own help: each paragraph is one line for the terminal to wrap.
    shown = CliRunner().invoke(app, ["worker", "--help"], env={"COLUMNS": "300"})
    assert "its next boundary and release it, exit 0. A second one" in shown.stdout


def test_db_migrate_on_the_embedded_default_says_its_file_needs_no_command(db: Path) -> None:
    env = {"ONWARD_SQLITE_PATH": str(db), "ONWARD_BACKEND": None, "DATABASE_URL": None}
    result = CliRunner().invoke(app, ["db", "migrate"], env=env)
    assert result.exit_code == 2
    assert result.stderr == (
        "ConfigurationError: DATABASE_URL is not set; it must name a PostgreSQL database "
        f"(ONWARD_BACKEND is sqlite: its file, {db}, is migrated when first opened and needs "
        "no command)\n"
    )
    assert not db.exists()


OLDER_SQLITE_FILE = TESTS / "fixtures" / "upgrade" / "sqlite_schema_5.db"


def test_db_migrate_brings_a_file_an_older_onward_wrote_up_to_date(db: Path) -> None:
    """The read-only commands refuse a file an older Onward wrote (commit f183a21, schema
    version 5, one completed run ``run-done`` of tenant ``acme``) and say to run `onward db
    migrate`: that command migrates it, and the run is then read as it was written."""
    shutil.copyfile(OLDER_SQLITE_FILE, db)
    refused = onward(db, "runs")
    assert refused.exit_code == 2, refused.output
    assert "schema version 5" in refused.stderr
    assert "run `onward db migrate`" in refused.stderr
    env = {"ONWARD_SQLITE_PATH": str(db), "ONWARD_BACKEND": "sqlite", "DATABASE_URL": None}
    migrated = CliRunner().invoke(app, ["db", "migrate"], env=env)
    assert migrated.exit_code == 0, migrated.output
    assert "applied 0006_transcript" in migrated.stdout
    shown = onward(db, "inspect", "run-done", "--tenant", "acme")
    assert shown.exit_code == 0, shown.output
    assert "completed" in shown.stdout
    assert "booked" in shown.stdout
    again = CliRunner().invoke(app, ["db", "migrate"], env=env)
    assert again.exit_code == 0, again.output
    assert again.stdout == "schema is current\n"


def test_db_migrate_refuses_an_embedded_file_that_is_no_database(db: Path) -> None:
    """A mistyped ONWARD_SQLITE_PATH naming some other file gets the same one-line refusal
    (exit 2) as the commands about runs, not a driver error, and the file is left as it was."""
    db.write_text("not a database")
    env = {"ONWARD_SQLITE_PATH": str(db), "ONWARD_BACKEND": "sqlite", "DATABASE_URL": None}
    result = CliRunner().invoke(app, ["db", "migrate"], env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"ConfigurationError: {db}: not an Onward database (file is not a database)\n"
    )
    assert db.read_text() == "not a database"


def test_inspect_refuses_the_memory_backend() -> None:
    env = {"ONWARD_BACKEND": "memory"}
    result = CliRunner().invoke(app, ["inspect", "run-1", "--tenant", TENANT], env=env)
    assert result.exit_code == 2
    assert "memory" in result.stderr


def test_resume_carries_an_interrupted_run_to_completion(db: Path) -> None:
    run_id = start(db, crash_at="model.call")
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *AGENT)
    assert result.exit_code == 0, result.output
    assert "carried on by" in result.stdout
    assert "under fence 2" in result.stdout
    assert "status completed" in result.stdout
    assert cli_agent.effects("book", run_id, "b") == 1
    progress = [line.split("] ", 1)[1] for line in result.stderr.splitlines()]
    assert progress == [
        "resume.planned: replayed none, dispatched none, undecided none",
        "turn 1: book returned",
        "run.finished: completed: booked",
    ]


def test_resume_with_an_undecidable_call_exits_4_naming_it(db: Path) -> None:
    run_id = start(db, crash_at="tool.returned")
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *AGENT)
    assert result.exit_code == 4, result.output
    assert "IndeterminateToolCallError" in result.stderr
    assert f"onward resolve {run_id} b --tenant {TENANT} --outcome never_ran" in result.stderr
    assert cli_agent.effects("book", run_id, "b") == 1


def test_resume_while_another_worker_holds_the_lease_exits_3_naming_it_and_when_it_lapses(
    db: Path,
) -> None:
    run_id = start(db, crash_at="turn.settled")

    async def hold() -> RunLease:
        async with SqliteLeaseStore(db) as leases:
            return await leases.acquire(run_id, tenant=TENANT, holder="other-worker", ttl_s=300)

    lease = asyncio.run(hold())
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *AGENT)
    assert result.exit_code == 3, result.output
    lapses = datetime.fromtimestamp(lease.expires_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"is held by 'other-worker' until {lapses} (in 5 min" in result.stderr


def test_resume_with_a_changed_agent_exits_4(db: Path) -> None:
    run_id = start(db, crash_at="turn.settled")
    changed = ["--agent", "support.cli_agent:changed_booker"]
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *changed, *AGENT[2:])
    assert result.exit_code == 4, result.output
    assert "RevisionMismatchError" in result.stderr


def test_resume_of_an_unknown_run_exits_1(db: Path) -> None:
    start(db)
    result = onward(db, "run", "--resume", "run-nobody", "--tenant", TENANT, *AGENT)
    assert result.exit_code == 1


def test_approve_then_resume_completes_the_run(db: Path) -> None:
    run_id = waiting_run(db)
    approved = onward(db, "approve", run_id, "p", "--tenant", TENANT, "--by", "ann")
    assert approved.exit_code == 0, approved.output
    model = ["--agent", "support.cli_agent:payer", "--provider", "support.cli_agent:paying_model"]
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *model)
    assert result.exit_code == 0, result.output
    assert "status completed" in result.stdout
    assert cli_agent.effects("pay", run_id, "p") == 1


def test_approving_twice_exits_2(db: Path) -> None:
    run_id = waiting_run(db)
    assert onward(db, "approve", run_id, "p", "--tenant", TENANT, "--by", "ann").exit_code == 0
    again = onward(db, "approve", run_id, "p", "--tenant", TENANT, "--by", "bob")
    assert again.exit_code == 2
    assert "not waiting on 'p'" in again.stderr


def test_approve_with_a_value_that_is_not_json_exits_2(db: Path) -> None:
    run_id = waiting_run(db)
    result = onward(db, "approve", run_id, "p", "--tenant", TENANT, "--by", "ann", "--value", "{no")
    assert result.exit_code == 2
    assert "not JSON" in result.stderr


def test_deny_ends_the_run_cancelled(db: Path) -> None:
    run_id = waiting_run(db)
    denied = onward(db, "deny", run_id, "p", "--tenant", TENANT, "--by", "ann")
    assert denied.exit_code == 0, denied.output
    shown = onward(db, "inspect", run_id, "--tenant", TENANT)
    assert "cancelled" in shown.stdout
    assert "nothing: the run is cancelled" in shown.stdout


def events_in(db: Path, run_id: str) -> list[Event]:
    """The run's events as the SQLite file ``db`` holds them."""

    async def read() -> list[Event]:
        async with SqliteEventLog(db) as log:
            return [stored.event for stored in await log.read_run(run_id)]

    return asyncio.run(read())


def test_cancel_ends_a_run_left_dead_and_names_the_call_it_left_undecided(db: Path) -> None:
    run_id = start(db, crash_at="tool.returned")
    args = ["--tenant", TENANT, "--by", "ops", "--why", "the customer withdrew"]
    cancelled = onward(db, "cancel", run_id, *args)
    assert cancelled.exit_code == 0, cancelled.output
    assert f"cancelled run {run_id} (by ops)" in cancelled.stdout
    assert "call b (book) was dispatched and never settled: it may have run" in cancelled.stderr
    shown = json.loads(onward(db, "inspect", run_id, "--tenant", TENANT, "--json").stdout)
    assert (shown["status"], shown["error"]) == (
        "cancelled",
        "cancelled by ops: the customer withdrew",
    )
    resumed = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *AGENT)
    assert resumed.exit_code == 0, resumed.output
    assert "status cancelled" in resumed.stdout
    assert cli_agent.effects("book", run_id, "b") == 1  # never made again


def test_cancelling_a_run_that_has_ended_exits_2_and_writes_nothing(db: Path) -> None:
    run_id = waiting_run(db)
    first = onward(db, "cancel", run_id, "--tenant", TENANT, "--by", "ann", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {
        "run": run_id,
        "tenant": TENANT,
        "status": "cancelled",
        "by": "ann",
        "why": "",
        "undecided_calls": [],
    }
    before = events_in(db, run_id)
    again = onward(db, "cancel", run_id, "--tenant", TENANT, "--by", "ann")
    assert again.exit_code == 2, again.output
    assert f"run '{run_id}' has ended already (cancelled)" in again.stderr
    assert events_in(db, run_id) == before


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--why", "gone\x1b[2J", "why holds the control character '\\x1b'"),
        ("--by", "", "by must not be empty"),
        ("--by", "a\x00b", "by holds the control character '\\x00'"),
    ],
)
def test_cancel_with_a_bad_note_exits_2_naming_it_and_writes_nothing(
    db: Path, option: str, value: str, named: str
) -> None:
    run_id = waiting_run(db)
    before = events_in(db, run_id)
    args = {"--by": "ann", "--why": "x"} | {option: value}
    result = onward(
        db, "cancel", run_id, "--tenant", TENANT, *(a for kv in args.items() for a in kv)
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"InvalidInputError: {named}"), result.stderr
    assert events_in(db, run_id) == before


def test_cancel_of_an_unknown_run_exits_1(db: Path) -> None:
    waiting_run(db)
    result = onward(db, "cancel", "nope", "--tenant", TENANT, "--by", "ann")
    assert result.exit_code == 1, result.output


def test_resolve_settles_an_undecided_call_and_resume_completes(db: Path) -> None:
    run_id = start(db, crash_at="tool.returned")
    settled = onward(
        db,
        "resolve",
        run_id,
        "b",
        "--tenant",
        TENANT,
        "--outcome",
        "completed",
        "--result",
        '{"seat": "3A"}',
        "--by",
        "ops",
        "--why",
        "the airline has the booking",
    )
    assert settled.exit_code == 0, settled.output
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *AGENT)
    assert result.exit_code == 0, result.output
    assert "status completed" in result.stdout
    assert cli_agent.effects("book", run_id, "b") == 1


def test_resolve_of_a_call_that_is_not_undecided_exits_2(db: Path) -> None:
    run_id = start(db, crash_at="tool.returned")
    args = ["--tenant", TENANT, "--outcome", "never_ran", "--by", "ops", "--why", "checked"]
    result = onward(db, "resolve", run_id, "nope", *args)
    assert result.exit_code == 2
    assert "no undecided call 'nope'" in result.stderr


def superseded_history(db: Path) -> str:
    """A run taken over by w2 while w1, not knowing, wrote on under the old fence."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    def env(seq: int, fence: int) -> Envelope:
        return Envelope(run_id=run_id, tenant=TENANT, seq=seq, fence=fence, at=seq)

    history: list[Event] = [
        RunStarted(**env(1, 1), agent="booker", revision="r1"),
        RunClaimed(**env(2, 2), worker="w2"),
        ToolDispatched(**env(3, 1), call_id="z", tool="book", idempotency_key="k"),
        RunFinished(**env(3, 2), status="completed", output="ok"),
    ]

    async def write() -> None:
        async with SqliteEventLog(db) as log:
            for event in history:
                await log.append([event])

    asyncio.run(write())
    return run_id


def test_replay_marks_refused_events_in_the_table(db: Path) -> None:
    run_id = superseded_history(db)
    result = onward(db, "replay", run_id, "--tenant", TENANT)
    assert result.exit_code == 0, result.output
    assert "4 events, 1 refused" in result.stdout
    assert result.stdout.count("REFUSED") == 1
    assert "superseded_fence" in result.stdout


def test_replay_as_json_lines_marks_refused_events(db: Path) -> None:
    run_id = superseded_history(db)
    result = onward(db, "replay", run_id, "--tenant", TENANT, "--json")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["seq"], e["fence"], e["refused"]) for e in lines] == [
        (1, 1, False),
        (2, 2, False),
        (3, 1, True),
        (3, 2, False),
    ]
    assert lines[2]["reason"] == "superseded_fence"
    assert lines[2]["kind"] == "tool.dispatched"
    assert [e["offset"] for e in lines] == sorted(e["offset"] for e in lines)


def test_replay_of_an_unknown_run_exits_1(db: Path) -> None:
    superseded_history(db)
    assert onward(db, "replay", "run-nobody", "--tenant", TENANT).exit_code == 1


@pytest.mark.parametrize(
    "spec",
    [
        "no-colon",
        "support.cli_agent:missing",
        "support.nowhere:booker",
        "support.cli_agent:not_an_agent",
        "support.cli_agent:booking_model",
    ],
)
def test_a_bad_agent_spec_exits_2(db: Path, spec: str) -> None:
    result = onward(
        db,
        "run",
        "--resume",
        "run-1",
        "--tenant",
        TENANT,
        "--agent",
        spec,
        "--provider",
        "support.cli_agent:booking_model",
    )
    assert result.exit_code == 2
    assert "--agent" in result.stderr
    assert not db.exists()


@pytest.fixture
def mine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's own in the working directory, named as its file (``mine.py``):
    `onward` does not search the working directory for a bare module name."""
    name = f"mine_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from support.cli_agent import booker


            class Broken:
                async def complete(self, agent, messages):
                    raise RuntimeError("the model's client has a bug")
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    return f"{name}.py"


def test_the_model_code_failing_exits_5_in_one_line(db: Path, mine: str) -> None:
    run_id = start(db, crash_at="turn.settled")
    agent = ["--agent", f"{mine}:booker", "--provider", f"{mine}:Broken"]
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *agent)
    assert result.exit_code == 5, result.output
    assert "the model's client has a bug" in result.stderr
    assert "Traceback" not in result.output
    said = [line for line in result.stderr.splitlines() if not line.startswith("[")]
    assert len(said) == 1, result.stderr


def test_resume_of_a_run_whose_log_was_truncated_exits_4_without_calling_the_model(
    db: Path, mine: str
) -> None:
    run_id = start(db, crash_at="turn.settled")  # the next step is a model call

    async def truncate() -> None:
        async with SqliteEventLog(db) as log:
            partition = partition_for(run_id, log.partitions)
            await log.truncate_before(partition, (await log.bounds(partition)).end - 1)

    asyncio.run(truncate())
    agent = ["--agent", f"{mine}:booker", "--provider", f"{mine}:Broken"]  # Broken: exit 5
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *agent)
    assert result.exit_code == 4, result.output
    assert "HistoryUnavailableError" in result.stderr
    assert run_id in result.stderr


async def crashed_on_kafka(deployment: KafkaServers, crash_at: str) -> str:
    """A booking run on the deployment whose worker 'died' at ``crash_at``; returns its id."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with deployment.log() as log, deployment.leases() as leases:
        agent, model = cli_agent.booker(), cli_agent.booking_model()
        await start_on(log, leases, run_id, agent=agent, provider=model, crash_at=crash_at)
    return run_id


async def onward_on(deployment: KafkaServers, *args: str) -> Result:
    """The command line against the deployment, in a thread: it runs its own event loop."""
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=deployment.env())


@pytest.mark.kafka
async def test_resume_against_kafka_postgres_and_redis(kafka_servers: KafkaServers) -> None:
    run_id = await crashed_on_kafka(kafka_servers, "turn.settled")
    result = await onward_on(kafka_servers, "run", "--resume", run_id, "--tenant", TENANT, *AGENT)
    assert result.exit_code == 0, result.output
    assert "under fence 2" in result.stdout
    assert "status completed" in result.stdout
    assert cli_agent.effects("book", run_id, "b") == 1


@pytest.mark.kafka
async def test_resume_on_kafka_of_a_run_whose_partition_was_truncated_exits_4(
    kafka_servers: KafkaServers, mine: str
) -> None:
    run_id = await crashed_on_kafka(kafka_servers, "turn.settled")  # next: a model call
    async with kafka_servers.log() as log:
        partition = partition_for(run_id, log.partitions)
        await log.truncate_before(partition, (await log.bounds(partition)).end - 1)
    agent = ["--agent", f"{mine}:booker", "--provider", f"{mine}:Broken"]  # Broken: exit 5
    result = await onward_on(kafka_servers, "run", "--resume", run_id, "--tenant", TENANT, *agent)
    assert result.exit_code == 4, result.output
    assert "HistoryUnavailableError" in result.stderr
    assert run_id in result.stderr


def test_the_kafka_backend_without_a_database_url_exits_2() -> None:
    env = {"ONWARD_BACKEND": "kafka", "DATABASE_URL": None}
    result = CliRunner().invoke(app, ["inspect", "run-1", "--tenant", TENANT], env=env)
    assert result.exit_code == 2
    assert "DATABASE_URL" in result.stderr


def test_schema_command_prints_the_schema() -> None:
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    assert result.output.encode() == event_schema()
    assert "tool.dispatched" in result.output


def test_a_command_without_tenant_acts_for_the_default_tenant(db: Path) -> None:
    """Like the application, the command line's tenant is ``default`` unless one is named;
    another tenant's run is still no such run."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            await start_on(
                log,
                leases,
                run_id,
                agent=cli_agent.payer(),
                provider=cli_agent.paying_model(),
                crash_at=None,
                tenant="default",
            )

    asyncio.run(go())
    shown = onward(db, "inspect", run_id)
    assert shown.exit_code == 0, shown.output
    assert "waiting" in shown.stdout
    assert onward(db, "approve", run_id, "p", "--by", "ann").exit_code == 0
    assert onward(db, "inspect", run_id, "--tenant", "acme").exit_code == 1


def resume_in_a_process(
    db: Path, entered: Path, run_id: str, model: list[str], *options: str
) -> subprocess.Popen[str]:
    """`onward run --resume` in a process of its own, once its tool or model marks ``entered``
    (a file): the moment to signal it."""
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(db),
        "CLI_AGENT_ENTERED": str(entered),
    }
    command = [sys.executable, "-m", "onward", "run", "--resume", run_id, "--tenant", TENANT]
    resuming = subprocess.Popen(
        [*command, *model, *options],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    try:
        while not entered.exists():
            assert resuming.poll() is None, resuming.communicate()
            assert time.monotonic() < deadline, f"{' '.join(model)} was never entered"
            time.sleep(0.05)
    except BaseException:
        kill_if_running(resuming)  # it would go on with the run after the test
        raise
    return resuming


def test_sigterm_to_run_resume_mid_tool_hands_the_lease_back(db: Path, tmp_path: Path) -> None:
    """SIGTERM (what timeout, systemd, Docker and Kubernetes send) stops `onward run --resume`
    as Ctrl-C does: exit 143, and the run's lease is handed back at once instead of locking
    the run for the lease's ttl (five minutes)."""
    run_id = start(
        db, agent=cli_agent.slow_booker(), provider=cli_agent.booking_model(), crash_at="model.call"
    )
    model = ["--agent", "support.cli_agent:slow_booker"]
    model += ["--provider", "support.cli_agent:booking_model"]
    resuming = resume_in_a_process(db, tmp_path / "entered", run_id, model)
    try:
        resuming.send_signal(signal.SIGTERM)
        _, said = resuming.communicate(timeout=30)
    finally:
        kill_if_running(resuming)  # one the signal did not end would outlive the test
    assert resuming.returncode == 143, said
    assert "terminated" in said

    async def lease() -> object:
        async with SqliteLeaseStore(db) as leases:
            return await leases.current(run_id)

    assert asyncio.run(lease()) is None


# A killed `onward run --resume` does not lock its run for the lease's ttl: on the same host
# the next one proves the holder gone (its presence lock is free) and carries the run on at
# once; a holder it cannot prove gone (another host's) is refused with when its lease lapses,
# and --wait waits that out. Each holder is a real `onward run --resume` process, SIGKILLed
# while it waits on the model.

TAKEN_WITHIN_S = 2.0
"""The issue's bound for carrying on a run whose holder on this host was killed."""

SHORT_TTL_S = 3.0
"""The killed holder's lease, when no process of this host can prove it gone."""


@pytest.fixture
def holders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's presence lock files in a directory of its own (children inherit it)."""
    folder = tmp_path / "holders"
    monkeypatch.setenv(HOLDERS_DIR_ENV, str(folder))
    return folder


def killed_while_asking_the_model(db: Path, tmp_path: Path, run_id: str, *options: str) -> None:
    """Run `onward run --resume` in a process of its own until it waits on the model, then
    SIGKILL it: the run is left held by a process that can never hand it back."""
    model = ["--agent", "support.cli_agent:booker"]
    model += ["--provider", "support.cli_agent:stalling_model"]
    holding = resume_in_a_process(db, tmp_path / "entered", run_id, model, *options)
    try:
        holding.send_signal(signal.SIGKILL)
        holding.communicate(timeout=30)
    finally:
        kill_if_running(holding)


@pytest.mark.usefixtures("holders")
def test_a_run_whose_holder_on_this_host_was_killed_is_carried_on_at_once(
    db: Path, tmp_path: Path
) -> None:
    run_id = start(db, crash_at="model.call")
    killed_while_asking_the_model(db, tmp_path, run_id)
    started = time.monotonic()
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *AGENT)
    took = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert "status completed" in result.stdout
    assert took < TAKEN_WITHIN_S, f"carried on after {took:.1f} s"
    assert cli_agent.effects("book", run_id, "b") == 1


@pytest.mark.usefixtures("holders")
def test_another_hosts_killed_holder_is_refused_until_its_lease_lapses_and_waited_for(
    db: Path, tmp_path: Path
) -> None:
    run_id = start(db, crash_at="model.call")
    killed_while_asking_the_model(
        db, tmp_path, run_id, "--worker", "elsewhere-1", "--lease-ttl", str(SHORT_TTL_S)
    )
    refused = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *AGENT)
    assert refused.exit_code == 3, refused.output
    assert "is held by 'elsewhere-1' until " in refused.stderr
    assert " s, unless its holder renews it)" in refused.stderr

    waited = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *AGENT, "--wait")
    assert waited.exit_code == 0, waited.output
    assert "waiting: run" in waited.stderr
    assert "held by 'elsewhere-1' until " in waited.stderr
    assert "status completed" in waited.stdout
    assert cli_agent.effects("book", run_id, "b") == 1


def test_a_lease_ttl_that_is_not_positive_is_refused(db: Path) -> None:
    run_id = start(db, crash_at="model.call")
    result = onward(db, "run", "--resume", run_id, *AGENT, "--lease-ttl", "0")
    assert result.exit_code == 2
    assert "--lease-ttl must be positive seconds, got 0.0" in result.stderr


@pytest.mark.parametrize("ttl", ["86401", "1e12", "1e15", "1e-9"])
@pytest.mark.parametrize("command", ["start", "resume"])
def test_a_lease_ttl_no_lease_may_have_is_refused_naming_the_option(
    db: Path, command: str, ttl: str
) -> None:
    """Held to what ONWARD_LEASE_TTL and the worker's --lease-ttl take (a day at most): a
    longer one locks the run for that long if its host is lost; one past any date failed
    blaming the agent's code, and one under a microsecond named no option."""
    if command == "start":
        args = ["start", "go", "--tenant", TENANT, *AGENT]
    else:
        args = ["run", "--resume", start(db, crash_at="model.call"), "--tenant", TENANT, *AGENT]
    result = onward(db, *args, "--lease-ttl", ttl)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "--lease-ttl" in result.stderr, result.stderr
    assert "agent's or the model's code" not in result.stderr, result.stderr
    assert "started run" not in result.stdout, result.stdout


@pytest.mark.parametrize("command", ["start", "resume"])
def test_a_worker_name_that_would_drive_a_terminal_is_refused(db: Path, command: str) -> None:
    """The name is the lease's holder, which inspect, runs and every refusal print."""
    if command == "start":
        args = ["start", "go", "--tenant", TENANT, *AGENT]
    else:
        args = ["run", "--resume", start(db, crash_at="model.call"), "--tenant", TENANT, *AGENT]
    result = onward(db, *args, "--worker", "w\x1b]0;owned\x07")
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "--worker" in result.stderr, result.stderr
    assert "\x1b" not in result.stderr, result.stderr


def started_with(db: Path, run_id: str) -> object:
    """The input a run's first event records, as `onward replay --json` shows it."""
    first = json.loads(onward(db, "replay", run_id, "--json").stdout.splitlines()[0])
    assert first["kind"] == "run.started"
    return first["event"]["input"]


def test_the_commands_said_for_a_run_id_a_terminal_must_not_get_raw_give_it_back(
    db: Path,
) -> None:
    """A run id holding a right-to-left override (or a C1 control) is shown escaped, yet the
    commands printed to carry the run on or settle its calls, pasted into a shell, name it."""
    run_id = "s\u202e1\x85'"
    started = onward(db, "start", "book 3A", "--run-id", run_id, *AGENT)
    assert started.exit_code == 0, started.output
    line = started.stdout.splitlines()[0]
    assert "\u202e" not in line
    assert "\x85" not in line
    assert pasted(line.split("if this stops: ", 1)[1])[:4] == ["onward", "run", "--resume", run_id]

    undecided = f"{run_id}-2"

    async def crashed() -> None:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            await start_on(
                log,
                leases,
                undecided,
                agent=cli_agent.booker(),
                provider=cli_agent.booking_model(),
                crash_at="tool.returned",
            )

    asyncio.run(crashed())
    resumed = onward(db, "run", "--resume", undecided, "--tenant", TENANT, *AGENT)
    assert resumed.exit_code == 4, resumed.output
    [command, *_] = [c for c in resumed.stderr.splitlines() if "onward resolve " in c]
    assert pasted(command.split("onward resolve ", 1)[1])[0] == undecided


def test_start_makes_the_database_runs_the_agent_and_prints_how_to_carry_it_on(db: Path) -> None:
    result = onward(db, "start", "book 3A", "--run-id", "s-1", *AGENT)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        "started run s-1 (tenant default); if this stops: onward run --resume s-1 --tenant "
        "default --agent support.cli_agent:booker --provider support.cli_agent:booking_model"
    )
    assert "status completed, iteration 2" in result.stdout
    assert "output: booked" in result.stdout
    assert cli_agent.effects("book", "s-1", "b") == 1
    assert started_with(db, "s-1") == "book 3A"

    again = onward(db, "start", "book 3A", "--run-id", "s-1", *AGENT)
    assert again.exit_code == 2, again.output
    assert "already exists" in again.stderr
    assert cli_agent.effects("book", "s-1", "b") == 1


@pytest.mark.parametrize("refused", [["--run-id", "s-1"], ["--tenant", ""]])
def test_a_start_refused_does_not_say_it_started_the_run(db: Path, refused: list[str]) -> None:
    """The line naming the run and how to carry it on comes once the run is started: a start
    refused (its id taken, a tenant no run can have) printed it, for a run it never started."""
    assert onward(db, "start", "book 3A", "--run-id", "s-1", *AGENT).exit_code == 0
    again = onward(db, "start", "book 3A", *refused, *AGENT)
    assert again.exit_code == 2, again.output
    assert again.stdout == "", again.stdout
    assert len(again.stderr.strip().splitlines()) == 1, again.stderr


def test_start_reads_its_prompt_from_a_file_and_picks_a_fresh_id(db: Path, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("book 3A " * 1_000)
    first = onward(db, "start", f"@{prompt}", *AGENT)
    second = onward(db, "start", f"@{prompt}", *AGENT)
    assert (first.exit_code, second.exit_code) == (0, 0), first.output + second.output
    ids = [r.stdout.split()[2] for r in (first, second)]
    assert ids[0] != ids[1]
    assert started_with(db, ids[0]) == "book 3A " * 1_000


@pytest.mark.parametrize("given", ["literal", "file", "stdin"])
def test_start_with_a_blank_prompt_is_refused_and_starts_nothing(
    db: Path, tmp_path: Path, given: str
) -> None:
    """``onward start "$PROMPT"`` with the variable unset, an empty file or ``echo "$X" |``
    started a run on no input: the model was asked (and paid) about nothing."""
    empty = tmp_path / "prompt.txt"
    empty.write_text("")
    prompt = {"literal": "", "file": f"@{empty}", "stdin": "-"}[given]
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    result = CliRunner().invoke(app, ["start", prompt, *AGENT], env=env, input="\n")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("InvalidInputError: PROMPT is empty"), result.stderr
    assert not db.exists()


def test_start_whose_model_fails_keeps_the_run_to_carry_on(db: Path, mine: str) -> None:
    broken = ["--agent", f"{mine}:booker", "--provider", f"{mine}:Broken"]
    failed = onward(db, "start", "book 3A", "--run-id", "s-2", *broken)
    assert failed.exit_code == 5, failed.output
    assert "the model's client has a bug" in failed.stderr
    carried = onward(db, "run", "--resume", "s-2", *AGENT)
    assert carried.exit_code == 0, carried.output
    assert "status completed" in carried.stdout


def one_object(result: Result) -> dict[str, object]:
    """The single JSON object a command's ``--json`` prints, and nothing else on stdout."""
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    decoded = json.loads(line)
    assert isinstance(decoded, dict)
    return decoded


def test_every_command_that_changes_a_run_prints_its_result_as_json(db: Path) -> None:
    started = one_object(onward(db, "start", "pay 10", "--run-id", "j-1", "--json", *PAYING))
    assert started["run"] == "j-1"
    assert started["status"] == "waiting"
    assert started["waiting_on"] == "p"
    approved = one_object(onward(db, "approve", "j-1", "p", "--by", "ann", "--json"))
    assert approved == {
        "run": "j-1",
        "tenant": "default",
        "request": "p",
        "answer": "approved",
        "by": "ann",
    }
    carried = one_object(onward(db, "run", "--resume", "j-1", "--json", *PAYING))
    assert (carried["status"], carried["output"], carried["fence"]) == ("completed", "paid", 3)
    assert carried["plan"]
    tagged = one_object(onward(db, "tag", "j-1", "done", "--json"))
    assert (tagged["label"], tagged["by"]) == ("done", "tagger")
    assert isinstance(tagged["seq"], int)

    run_id = start(db, crash_at="tool.returned")
    settled = one_object(
        onward(
            db,
            "resolve",
            run_id,
            "b",
            "--tenant",
            TENANT,
            "--outcome",
            "never_ran",
            "--by",
            "ops",
            "--why",
            "the airline has no booking",
            "--json",
        )
    )
    assert settled["outcome"] == "never_ran"

    denied_id = waiting_run(db)
    denied = one_object(
        onward(db, "deny", denied_id, "p", "--tenant", TENANT, "--by", "bo", "--json")
    )
    assert denied["answer"] == "denied"


def test_debug_prints_the_traceback_of_the_users_own_code(db: Path, mine: str) -> None:
    run_id = start(db, crash_at="turn.settled")
    agent = ["--agent", f"{mine}:booker", "--provider", f"{mine}:Broken"]
    plain = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *agent)
    assert "Traceback" not in plain.stderr
    debugged = onward(db, "--debug", "run", "--resume", run_id, "--tenant", TENANT, *agent)
    assert debugged.exit_code == 5, debugged.output
    assert "Traceback (most recent call last):" in debugged.stderr
    assert f'{mine.removesuffix(".py")}.py", line 7, in complete' in debugged.stderr
    assert debugged.stderr.rstrip().endswith("the model's client has a bug")


def carried_on_twice(db: Path) -> tuple[str, str]:
    """An approved payment carried on into a new run twice (the last run completed): the first
    run's id and the last's."""
    run_id = waiting_run(db)
    approved = onward(db, "approve", run_id, "p", "--tenant", TENANT, "--by", "ann")
    assert approved.exit_code == 0, approved.output

    async def carry_on() -> str:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            runner = log_runner(
                cli_agent.paying_model(),
                log,
                leases,
                worker="w1",
                continuation=ContinuationPolicy(max_steps=2),
            )
            done = await runner.resume(cli_agent.payer(), run_id, tenant=TENANT)
            assert done.run_id != run_id
            return done.run_id

    return run_id, asyncio.run(carry_on())


def test_resume_of_a_run_carried_on_into_a_held_run_names_that_run(db: Path) -> None:
    """A run carried on into another that another worker holds: the resume says which run it
    went on as, where the user would otherwise be left with a bare ``status continued``."""
    run_id, new_id = carried_on_twice(db)

    async def hold() -> None:
        async with SqliteLeaseStore(db) as leases:
            await leases.acquire(new_id, tenant=TENANT, holder="other-worker", ttl_s=300)

    asyncio.run(hold())
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *PAYING)
    assert result.exit_code == 0, result.output
    assert f"status continued as {new_id}," in result.stdout


def test_resume_of_a_run_carried_on_names_the_run_it_went_on_as(db: Path) -> None:
    """Resuming a run that was carried on goes on along its chain; what it says of the last
    run (completed) is said of that run, by its id, not of the run named."""
    run_id, new_id = carried_on_twice(db)
    result = onward(db, "run", "--resume", run_id, "--tenant", TENANT, *PAYING)
    assert result.exit_code == 0, result.output
    assert f"run {run_id} went on as {new_id}" in result.stdout
    assert "status completed" in result.stdout
