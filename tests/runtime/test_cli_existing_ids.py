"""Commands that name an existing run take its exact id, tenant, user and agent.

Names are held to their bounds when a run is created (`check_name`: printable, at most 200
characters), but the log refuses only NUL: a producer writing to it directly (another Kafka
client keyed by run id) can store a run named with a control character or a longer id. Such a
run is still inspected, resolved, cancelled, released from quarantine and found by the filters
of ``onward runs``; only what no stored name holds (NUL, a lone surrogate, nothing) is refused,
exit 2, naming the option, with nothing written. Embedded SQLite, and Kafka + PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support.poison import unknown_kind
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

from onward.eventlog import (
    Event,
    KafkaEventLog,
    Message,
    ModelAnswered,
    RunStarted,
    SqliteEventLog,
    ToolCall,
    ToolDispatched,
)
from onward.eventlog.base import EventLog
from onward.projections.base import DEFAULT_CONSUMER, FrontierStore
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.cli import app
from onward.testing.eventlog import Envelope
from onward.testing.frontiers import poison

RUN = "run\x1b[2J" + "x" * 200
"""A run id no name check passes: an escape sequence, and longer than a name may be."""
TENANT = "ac\x07me"
USER = "ann\nroot"
AGENT = "book\x7fer"
CALL = "c1\x1b[8m"
"""A call id the producer's model gave, which no name check passes either."""


class Deployment:
    """Where the foreign producer's runs are: the environment `onward` reads, and its stores."""

    def __init__(self, clustered: KafkaServers | None, tmp_path: Path) -> None:
        self.servers = clustered
        self.db = tmp_path / "onward.db"

    @property
    def env(self) -> dict[str, str]:
        if self.servers is None:
            return {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(self.db)}
        return self.servers.env()

    def onward(self, *args: str) -> Result:
        return CliRunner().invoke(app, list(args), env={**self.env, "COLUMNS": "300"})

    def log(self) -> EventLog:
        if self.servers is None:
            return SqliteEventLog(self.db)
        return KafkaEventLog(self.servers.bootstrap, topic=self.servers.topic, partitions=3)

    def frontiers(self) -> FrontierStore:
        if self.servers is None:
            return SqliteFrontierStore(self.db)
        return PostgresFrontierStore(self.servers.database_url, schema=self.servers.schema)

    def produce(self, events: list[Event], *, unreadable_after: bool = False) -> None:
        """Append ``events`` as another producer would, then fold them as the deployment's
        projector does; with ``unreadable_after``, a record no Onward reads follows them."""

        async def go() -> None:
            async with self.log() as log, self.frontiers() as store:
                await log.append(events)
                if unreadable_after:
                    if isinstance(log, SqliteEventLog):
                        log.write_raw(RUN, unknown_kind(RUN, len(events) + 1))
                    else:  # the Kafka projector's quarantine, as it writes it
                        entry = poison(RUN, offset=99)
                        await store.write(DEFAULT_CONSUMER, {}, [], [], quarantine=[entry])
                if isinstance(log, SqliteEventLog):
                    await Checkpointer(store, log).catch_up()
                else:
                    await LogProjector(log, FrontierProjection(store, log)).catch_up()

        asyncio.run(go())

    def size(self) -> int:
        """How many records the log holds, all partitions."""

        async def go() -> int:
            async with self.log() as log:
                return sum([(await log.bounds(p)).end for p in range(log.partitions)])

        return asyncio.run(go())


@pytest.fixture
def deployment(clustered: KafkaServers | None, tmp_path: Path) -> Deployment:
    return Deployment(clustered, tmp_path)


def env(seq: int) -> Envelope:
    return Envelope(run_id=RUN, tenant=TENANT, seq=seq, fence=1, at=seq)


def started() -> RunStarted:
    return RunStarted(**env(1), agent=AGENT, revision="r1", input="hi", options={"user": USER})


def undecided() -> list[Event]:
    """A run whose call `CALL` was dispatched and never settled: a person must resolve it."""
    call = ToolCall(call_id=CALL, tool="book")
    answered = ModelAnswered(
        **env(2), message=Message(role="assistant", content=""), tool_calls=[call]
    )
    dispatched = ToolDispatched(**env(3), call_id=CALL, tool="book", idempotency_key="k")
    return [started(), answered, dispatched]


def facts(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_inspect_and_the_filters_of_runs_find_the_run(deployment: Deployment) -> None:
    deployment.produce([started()])
    (shown,) = facts(deployment.onward("inspect", RUN, "--tenant", TENANT, "--json"))
    assert (shown["run"], shown["tenant"], shown["agent"]) == (RUN, TENANT, AGENT)
    filters = ["--tenant", TENANT, "--user", USER, "--agent", AGENT]
    listed = facts(deployment.onward("runs", *filters, "--json"))
    assert [line["run"] for line in listed] == [RUN]


def test_resolve_then_cancel_settle_the_run(deployment: Deployment) -> None:
    deployment.produce(undecided())
    who = ["--tenant", TENANT, "--by", "ops"]
    resolved = deployment.onward(
        "resolve", RUN, CALL, *who, "--outcome", "never_ran", "--why", "checked"
    )
    assert resolved.exit_code == 0, resolved.output
    cancelled = deployment.onward("cancel", RUN, *who, "--json")
    (ended,) = facts(cancelled)
    assert (ended["run"], ended["status"], ended["undecided_calls"]) == (RUN, "cancelled", [])
    (shown,) = facts(deployment.onward("inspect", RUN, "--tenant", TENANT, "--json"))
    assert shown["status"] == "cancelled"


def test_quarantine_release_releases_the_run(deployment: Deployment) -> None:
    deployment.produce([started()], unreadable_after=True)
    (entry,) = facts(deployment.onward("quarantine", "list", "--json"))
    assert (entry["run_id"], entry["state"]) == (RUN, "held")
    (released,) = facts(deployment.onward("quarantine", "release", RUN, "--by", "ops", "--json"))
    assert (released["run"], released["released"]) == (RUN, 1)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["inspect", "run\x00x", "--tenant", "acme"], "run_id holds a NUL character at position 3"),
        (["inspect", RUN, "--tenant", ""], "tenant must not be empty"),
        (["cancel", "run\x00x", "--by", "ops"], "run_id holds a NUL character at position 3"),
        (["tag", RUN, "ok", "--tenant", "a\x00"], "tenant holds a NUL character at position 1"),
        (
            ["resolve", "\ud800", "c1", "--outcome", "never_ran", "--by", "ops", "--why", "x"],
            "run_id holds '\\ud800' at position 0, a lone surrogate",
        ),
        (
            ["quarantine", "release", "run\x00x", "--by", "ops"],
            "run_id holds a NUL character at position 3",
        ),
        (["quarantine", "release", "", "--by", "ops"], "run_id must not be empty"),
        (["runs", "--tenant", ""], "--tenant must not be empty"),
        (["runs", "--user", "ann\x00"], "--user holds a NUL character at position 3"),
        (["runs", "--agent", "\udc80"], "--agent holds '\\udc80' at position 0"),
    ],
)
def test_what_no_stored_name_holds_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path, args: list[str], said: str
) -> None:
    deployment = Deployment(None, tmp_path)
    deployment.produce([started()], unreadable_after=True)
    before = deployment.size()
    result = deployment.onward(*args)
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert deployment.size() == before
    (entry,) = facts(deployment.onward("quarantine", "list", "--json"))
    assert entry["state"] == "held"
