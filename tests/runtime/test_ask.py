"""`ask`: a tool's code asks a person, the run waits, the answer comes back as ``ask``'s value.

End to end on embedded SQLite (runner and application API), then across a SIGKILL between the
question and its answer: the run is answered and resumed by another process, on SQLite and on
Kafka + PostgreSQL, and the answer reaches the tool's code once, its side effect made once.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pydantic import BaseModel
from support.ask_world import refund_agent, refund_provider
from support.crash_world import TENANT, open_world, until_lapsed
from support.deployment import kafka_settings
from support.processes import reaped, spawn_support
from support.readme import run_example
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

import onward
from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog import (
    ApprovalRequested,
    Asked,
    SqliteEventLog,
    ToolCall,
    ToolCompleted,
    codec,
    kind_of,
)
from onward.runtime.agent import Agent
from onward.runtime.ask import ask, ask_request, check_answer, json_schema_of
from onward.runtime.cli import app as cli
from onward.runtime.demo_ledger import Ledger
from onward.runtime.observability import COUNTS
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import Settings
from onward.runtime.tools import tool
from onward.testing.eventlog import Envelope

FIRST = ask_request("r", 0)
SECOND = ask_request("r", 1)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.jsonl")


def entries(ledger: Ledger, kind: str) -> list[dict[str, Any]]:
    return [e for e in ledger.entries() if e["tool"] == kind]


async def test_the_answer_is_asks_return_value_and_the_code_after_it_runs_once(
    tmp_path: Path, ledger: Ledger
) -> None:
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        agent = refund_agent(ledger)
        asked_before = COUNTS.tool_calls["asked"]
        waiting = await runner.run(agent, "refund A-1", tenant=TENANT, run_id="q")
        assert (waiting.status, waiting.waiting_on) == ("waiting", FIRST)
        assert COUNTS.tool_calls["asked"] == asked_before + 1
        frontier = await runner.inspect("q", tenant=TENANT)
        assert frontier.answer_schema == '{"type": "integer"}'
        (call,) = frontier.calls
        assert (call.outcome, call.asked_seq) == (None, frontier.resume_seq)
        assert entries(ledger, "answered") == []

        await runner.approve("q", FIRST, tenant=TENANT, by="ann", value=40)
        done = await runner.resume(agent, "q", tenant=TENANT)
        assert (done.status, done.output) == ("completed", "done")
        assert done.plan is not None
        assert [c.call_id for c in done.plan.to_dispatch] == ["r"]
        assert [(e["amount"]) for e in entries(ledger, "answered")] == [40]
        assert [(e["amount"]) for e in entries(ledger, "refund")] == [40]
        # The code before the question ran again to reach the answer; nothing after it did.
        assert len(entries(ledger, "started")) == 2
        asked = [s.event for s in await log.read_run("q") if isinstance(s.event, ApprovalRequested)]
        assert [(a.request_id, a.prompt) for a in asked] == [(FIRST, "refund how much for A-1?")]
        assert asked[0].asked == Asked(
            call_id="r", index=0, schema='{"type": "integer"}', suspended=["r"]
        )


async def test_questions_are_answered_in_the_order_the_code_asks_them(
    tmp_path: Path, ledger: Ledger
) -> None:
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        agent = refund_agent(ledger)
        await runner.run(agent, "refund A-1", tenant=TENANT, run_id="q")
        await runner.approve("q", FIRST, tenant=TENANT, by="ann", value=500)
        second = await runner.resume(agent, "q", tenant=TENANT)
        assert (second.status, second.waiting_on) == ("waiting", SECOND)
        schema = (await runner.inspect("q", tenant=TENANT)).answer_schema
        assert schema is not None
        assert json.loads(schema)["required"] == ["by", "ticket"]

        with pytest.raises(InvalidInputError, match=r"does not fit its schema \(ticket: "):
            await runner.approve(
                "q", SECOND, tenant=TENANT, by="ann", value={"by": "bob", "ticket": "x"}
            )
        still = await runner.inspect("q", tenant=TENANT)
        assert (still.status, still.waiting_on) == ("waiting", SECOND)

        await runner.approve("q", SECOND, tenant=TENANT, by="ann", value={"by": "bob", "ticket": 7})
        done = await runner.resume(agent, "q", tenant=TENANT)
        assert done.status == "completed"
    # The model instance the schema named reached the code; each answer reached it once.
    assert [(e["by"], e["ticket"]) for e in entries(ledger, "signed")] == [("bob", 7)]
    assert [e["amount"] for e in entries(ledger, "answered")] == [500, 500]
    assert [e["amount"] for e in entries(ledger, "refund")] == [500]
    assert len(entries(ledger, "started")) == 3


async def test_a_bad_answer_is_refused_and_the_run_keeps_waiting(
    tmp_path: Path, ledger: Ledger
) -> None:
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        await runner.run(refund_agent(ledger), "refund A-1", tenant=TENANT, run_id="q")
        before = await runner.inspect("q", tenant=TENANT)
        with pytest.raises(InvalidInputError, match=r"not of type 'integer'.*still waits"):
            await runner.approve("q", FIRST, tenant=TENANT, by="ann", value="forty")
        after = await runner.inspect("q", tenant=TENANT)
        assert (after.status, after.waiting_on, after.last_seq) == (
            "waiting",
            FIRST,
            before.last_seq,
        )


async def test_the_application_streams_the_question_and_respond_answers_it(
    tmp_path: Path, ledger: Ledger
) -> None:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    agent = refund_agent(ledger)
    seen: list[onward.RunMessage] = []
    async with onward.open(settings, agents=agent, provider=refund_provider()) as app:
        async for message in app.query("refund A-1", {"run_id": "q"}):
            seen.append(message)
            if message.is_hil_request:
                assert message.content == "refund how much for A-1?"
                assert message.request_id == FIRST
                assert message.tool_name == "refund"
                assert message.metadata["question"] == "refund how much for A-1?"
                assert message.metadata["schema"] == {"type": "integer"}
                with pytest.raises(InvalidInputError, match="does not fit its schema"):
                    await message.respond("lots")
                await message.respond(60, by="ann")
    assert [m.type for m in seen if m.type != "checkpoint"] == [
        "text",
        "approval_request",
        "progress",
        "text",
        "result",
    ]
    assert seen[-1].output == "done"
    assert [e["amount"] for e in entries(ledger, "refund")] == [60]


@pytest.mark.kafka
async def test_the_application_on_kafka_streams_the_question_and_respond_answers_it(
    kafka_servers: KafkaServers, ledger: Ledger
) -> None:
    async with kafka_servers.log(partitions=3):
        pass  # the events topic, created once, as a deployment creates it
    settings = kafka_settings(kafka_servers, 3)
    agent = refund_agent(ledger)
    asked: list[onward.RunMessage] = []
    async with onward.open(settings, agents=agent, provider=refund_provider()) as app:
        async for message in app.query("refund A-1", {"run_id": "q"}):
            if message.is_hil_request:
                asked.append(message)
                assert ledger.count("answered") == 0
                with pytest.raises(InvalidInputError, match="does not fit its schema"):
                    await message.respond({"amount": 60})
                await message.respond(60, by="ann")
            last = message
    assert [(m.content, m.request_id) for m in asked] == [("refund how much for A-1?", FIRST)]
    assert (last.type, last.output) == ("result", "done")
    assert [e["amount"] for e in entries(ledger, "answered")] == [60]
    assert [e["amount"] for e in entries(ledger, "refund")] == [60]


async def test_onward_approve_refuses_a_bad_answer_with_exit_2_and_takes_a_good_one(
    tmp_path: Path, ledger: Ledger
) -> None:
    db = tmp_path / "onward.db"
    agent = refund_agent(ledger)
    async with SqliteEventLog(db) as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        await runner.run(agent, "refund A-1", tenant=TENANT, run_id="q")

    def approve(value: str) -> Result:
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        argv = ["approve", "q", FIRST, "--tenant", TENANT, "--by", "ann", "--value", value]
        return CliRunner().invoke(cli, argv, env=env)

    refused = await asyncio.to_thread(approve, '"forty"')
    assert refused.exit_code == 2, refused.output
    assert "does not fit its schema" in refused.stderr
    approved = await asyncio.to_thread(approve, "40")
    assert approved.exit_code == 0, approved.output
    async with SqliteEventLog(db) as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    assert [e["amount"] for e in entries(ledger, "refund")] == [40]


async def test_onward_cancel_does_not_call_a_call_stopped_at_its_question_undecided(
    tmp_path: Path, ledger: Ledger
) -> None:
    """Its code did nothing after the question: an operator told it "may have run" would go
    and look for a refund that was never made."""
    db = tmp_path / "onward.db"
    async with SqliteEventLog(db) as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        await runner.run(refund_agent(ledger), "refund A-1", tenant=TENANT, run_id="q")

    def cancel() -> Result:
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        argv = ["cancel", "q", "--tenant", TENANT, "--by", "ops", "--json"]
        return CliRunner().invoke(cli, argv, env=env)

    cancelled = await asyncio.to_thread(cancel)
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout)["undecided_calls"] == []
    assert "may have run" not in cancelled.stderr
    assert entries(ledger, "refund") == []


async def test_onward_resolve_refuses_a_call_stopped_at_its_question(
    tmp_path: Path, ledger: Ledger
) -> None:
    """Settled as completed, the refund would never be made and the answer reach no code;
    the call waits on a question, answered with onward approve or deny."""
    db = tmp_path / "onward.db"
    agent = refund_agent(ledger)
    async with SqliteEventLog(db) as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        await runner.run(agent, "refund A-1", tenant=TENANT, run_id="q")

    def resolve() -> Result:
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        argv = ["resolve", "q", "r", "--tenant", TENANT, "--outcome", "completed"]
        argv += ["--by", "ops", "--why", "looked", "--result", '"done"']
        return CliRunner().invoke(cli, argv, env=env)

    refused = await asyncio.to_thread(resolve)
    assert refused.exit_code == 2, refused.output
    assert FIRST in refused.stderr, refused.stderr
    assert "onward approve" in refused.stderr, refused.stderr
    async with SqliteEventLog(db) as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        frontier = await runner.inspect("q", tenant=TENANT)
        assert [c.outcome for c in frontier.calls] == [None]
        await runner.approve("q", FIRST, tenant=TENANT, by="ann", value=40)
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    assert [e["amount"] for e in entries(ledger, "refund")] == [40]


async def test_a_denied_question_ends_the_run_and_its_code_goes_no_further(
    tmp_path: Path, ledger: Ledger
) -> None:
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=refund_provider(), log=log, worker="w")
        await runner.run(refund_agent(ledger), "refund A-1", tenant=TENANT, run_id="q")
        await runner.deny("q", FIRST, tenant=TENANT, by="ann")
        assert (await runner.inspect("q", tenant=TENANT)).status == "cancelled"
    assert entries(ledger, "answered") == []


async def test_calls_that_ask_at_once_are_all_stopped_and_asked_one_at_a_time(
    tmp_path: Path,
) -> None:
    effects: list[tuple[str, Any]] = []

    @tool
    async def pick(what: str, *, idempotency_key: str) -> Any:
        schema = {"type": "string", "enum": ["red", "blue"]} if what == "colour" else None
        answer = ask(f"which {what}?", schema=schema)
        effects.append((what, answer))
        return answer

    agent = Agent(name="picker", instructions="", tools=[pick])
    provider = ScriptedProvider(
        [
            reply(
                "",
                ToolCall(call_id="a", tool="pick", args={"what": "colour"}),
                ToolCall(call_id="b", tool="pick", args={"what": "size"}),
            ),
            reply("done"),
        ]
    )
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        first = await runner.run(agent, "go", tenant=TENANT, run_id="q")
        assert first.waiting_on == ask_request("a", 0)
        frontier = await runner.inspect("q", tenant=TENANT)
        assert [c.asked_seq for c in frontier.calls] == [frontier.resume_seq] * 2
        with pytest.raises(InvalidInputError, match="is not one of"):
            await runner.approve("q", ask_request("a", 0), tenant=TENANT, by="ann", value="green")
        await runner.approve("q", ask_request("a", 0), tenant=TENANT, by="ann", value="red")
        second = await runner.resume(agent, "q", tenant=TENANT)
        assert second.waiting_on == ask_request("b", 0)
        await runner.approve("q", ask_request("b", 0), tenant=TENANT, by="ann", value={"cm": 3})
        done = await runner.resume(agent, "q", tenant=TENANT)
        assert done.status == "completed"
        assert done.plan is not None
        assert [c.call_id for c in done.plan.completed] == ["a"]
        assert [c.call_id for c in done.plan.to_dispatch] == ["b"]
    assert effects == [("colour", "red"), ("size", {"cm": 3})]


async def test_a_tool_that_swallows_the_stop_still_stops_at_its_question(tmp_path: Path) -> None:
    effects: list[str] = []

    @tool
    async def careless(*, idempotency_key: str) -> str:
        try:
            answer = ask("go?")
        except BaseException:  # what a careless tool does
            answer = "guessed"
        effects.append(str(answer))
        return str(answer)

    agent = Agent(name="careless", instructions="", tools=[careless])
    provider = ScriptedProvider([reply("", ToolCall(call_id="r", tool="careless")), reply("done")])
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        waiting = await runner.run(agent, "go", tenant=TENANT, run_id="q")
        assert (waiting.status, waiting.waiting_on) == ("waiting", FIRST)
        assert "tool.completed" not in [kind_of(type(s.event)) for s in await log.read_run("q")]
        await runner.approve("q", FIRST, tenant=TENANT, by="ann", value="yes")
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    assert effects == ["guessed", "yes"]


async def test_a_tool_that_swallows_a_stop_and_asks_on_is_asked_in_order(tmp_path: Path) -> None:
    """Asked its second question first, the call would go on past its first with a guess
    once the second is answered, and make its effect with it."""
    effects: list[tuple[str, str]] = []

    @tool
    async def careless(*, idempotency_key: str) -> str:
        try:
            first = ask("first?")
        except BaseException:  # what a careless tool does
            first = "guessed"
        second = ask("second?")
        effects.append((str(first), str(second)))
        return "done"

    agent = Agent(name="careless", instructions="", tools=[careless])
    provider = ScriptedProvider([reply("", ToolCall(call_id="r", tool="careless")), reply("done")])
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        assert (await runner.run(agent, "go", tenant=TENANT, run_id="q")).waiting_on == FIRST
        await runner.approve("q", FIRST, tenant=TENANT, by="ann", value="a")
        assert (await runner.resume(agent, "q", tenant=TENANT)).waiting_on == SECOND
        await runner.approve("q", SECOND, tenant=TENANT, by="ann", value="b")
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    assert effects == [("a", "b")]


def test_the_readme_example_refuses_a_bad_answer_and_refunds_once(tmp_path: Path) -> None:
    printed = [run_example("Asking a person from a tool", tmp_path)[1] for _ in range(2)]
    assert printed[0] == printed[1]
    assert printed[0].splitlines() == [
        "asked: refund how much for A-1? {'type': 'integer'}",
        "refused: not an integer; the run still waits",
        "result: done [30]",
    ]


async def test_a_schema_that_names_a_secret_survives_the_redactor(tmp_path: Path) -> None:
    """The redactor masks every value under a key naming a secret; a schema is recorded as
    text, so one describing a ``password`` field still checks answers."""

    class Login(BaseModel):
        user: str
        password: str

    got: list[Login] = []

    @tool
    async def log_in(*, idempotency_key: str) -> str:
        got.append(ask("log in as?", schema=Login))
        return "in"

    agent = Agent(name="login", instructions="", tools=[log_in])
    provider = ScriptedProvider([reply("", ToolCall(call_id="r", tool="log_in")), reply("done")])
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        await runner.run(agent, "go", tenant=TENANT, run_id="q")
        schema = (await runner.inspect("q", tenant=TENANT)).answer_schema
        assert schema is not None
        assert json.loads(schema)["properties"]["password"]["type"] == "string"
        with pytest.raises(InvalidInputError, match="'password' is a required property"):
            await runner.approve("q", FIRST, tenant=TENANT, by="ann", value={"user": "ann"})
        answer = {"user": "ann", "password": "hunter2"}
        await runner.approve("q", FIRST, tenant=TENANT, by="ann", value=answer)
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    # The answer itself is a value in the log like any other: its secret was masked there.
    assert [(g.user, g.password) for g in got] == [("ann", "[REDACTED]")]


def test_ask_outside_a_tool_and_a_bad_schema_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="from the code of a tool"):
        ask("anyone?")
    with pytest.raises(ConfigurationError, match="not a valid JSON Schema"):
        json_schema_of({"type": 12})


async def test_a_schema_whose_reference_resolves_nowhere_is_refused_where_it_is_asked(
    tmp_path: Path,
) -> None:
    """A valid JSON Schema may point at nothing: recorded, no answer could ever be checked
    against it and the run would wait for good. It is refused in the tool's code instead."""
    reached: list[Any] = []

    @tool
    async def pick(*, idempotency_key: str) -> Any:
        reached.append(ask("which?", schema={"$ref": "#/$defs/colour"}))
        return reached[-1]

    agent = Agent(name="picker", instructions="", tools=[pick])
    provider = ScriptedProvider([reply("", ToolCall(call_id="r", tool="pick")), reply("done")])
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        done = await runner.run(agent, "go", tenant=TENANT, run_id="q")
        assert (done.status, done.waiting_on) == ("completed", None)
        events = [s.event for s in await log.read_run("q")]
        assert not [e for e in events if isinstance(e, ApprovalRequested)]
        (completed,) = [e for e in events if isinstance(e, ToolCompleted)]
    assert completed.error is not None
    assert completed.error.type == "ConfigurationError"
    assert "'#/$defs/colour' does not resolve" in completed.error.message
    assert reached == []
    remote = "https://example.com/s.json"
    with pytest.raises(ConfigurationError, match=rf"'{re.escape(remote)}' does not resolve"):
        json_schema_of({"properties": {"a": {"$ref": remote}}})
    # References that resolve (within the schema, a type's own, a meta-schema) are taken.
    json_schema_of({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"})
    json_schema_of({"$ref": "https://json-schema.org/draft/2020-12/schema"})


def test_a_schema_whose_references_loop_without_reading_the_answer_is_refused() -> None:
    """A reference that comes back to itself before reading any part of the answer sends
    every check of an answer round for good (`RecursionError`): refused where it is asked, as
    a reference to nothing is; one recorded by another writer refuses each answer plainly."""
    looping = [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"properties": {"x": {"allOf": [{"$ref": "#/properties/x"}]}}},
        {"$defs": {"a": {"not": {"anyOf": [{"$ref": "#/$defs/a"}]}}}, "$ref": "#/$defs/a"},
    ]
    for schema in looping:
        with pytest.raises(ConfigurationError, match="comes back to itself"):
            json_schema_of(schema)
    # A schema that refers to itself for a part of the answer (a tree) is taken.
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    json_schema_of(tree)
    check_answer(json.dumps(tree), {"kids": [{"kids": []}]}, run_id="q", request_id=FIRST)
    with pytest.raises(InvalidInputError, match="no answer can be checked against"):
        check_answer(json.dumps(looping[0]), 5, run_id="q", request_id=FIRST)


def test_the_question_round_trips_and_older_records_read_without_it() -> None:
    env = Envelope(run_id="r", tenant="t", seq=3, fence=1, at=1)
    event = ApprovalRequested(
        **env,
        request_id=FIRST,
        prompt="how much?",
        asked=Asked(call_id="r", index=0, schema='{"type": "integer"}', suspended=["r", "s"]),
    )
    assert codec.decode(codec.encode(event)) == event
    older = msgspec.json.encode({"kind": "approval.requested", **env, "request_id": "a1"})
    assert codec.decode(older) == ApprovalRequested(**env, request_id="a1")


async def kill_between_question_and_answer(tmp_path: Path, backend: dict[str, str]) -> None:
    """A child process runs the run to its question and is killed there; this process answers
    it and resumes the run."""
    config = {
        **backend,
        "ledger": str(tmp_path / "ledger.jsonl"),
        "run_id": f"ask-{uuid.uuid4().hex[:8]}",
    }
    async with reaped() as children:
        child = await spawn_support("ask_child", json.dumps(config), stdout=asyncio.subprocess.PIPE)
        children.append(child)
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        assert json.loads(line) == {"status": "waiting", "waiting_on": FIRST}
        child.send_signal(signal.SIGKILL)
        await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL
    ledger = Ledger(config["ledger"])
    assert entries(ledger, "answered") == []
    async with open_world(config) as world:
        runner = AgentRunner(
            provider=refund_provider(),
            log=world.log,
            leases=world.leases,
            blobs=world.blobs,
            frontiers=world.frontiers,
            worker="parent",
        )
        await until_lapsed(runner.leases, config["run_id"])
        await runner.approve(config["run_id"], FIRST, tenant=TENANT, by="ann", value=30)
        agent = refund_agent(ledger)
        done = await runner.resume(agent, config["run_id"], tenant=TENANT)
        assert (done.status, done.output) == ("completed", "done")
        # Resuming again finds nothing to do: the answer is not given to the code again.
        again = await runner.resume(agent, config["run_id"], tenant=TENANT)
        assert again.status == "completed"
    assert [e["amount"] for e in entries(ledger, "answered")] == [30]
    assert [e["amount"] for e in entries(ledger, "refund")] == [30]
    assert len({e["key"] for e in entries(ledger, "started")}) == 1


async def test_the_answer_reaches_the_code_once_after_a_sigkill_on_sqlite(tmp_path: Path) -> None:
    backend = {"backend": "sqlite", "db": str(tmp_path / "onward.db")}
    await kill_between_question_and_answer(tmp_path, backend)


@pytest.mark.kafka
async def test_the_answer_reaches_the_code_once_after_a_sigkill_on_kafka_and_postgres(
    tmp_path: Path,
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
) -> None:
    backend = {
        "backend": "kafka",
        "bootstrap": kafka_bootstrap,
        "topic": kafka_topic,
        "database_url": database_url,
        "schema": pg_schema,
    }
    await kill_between_question_and_answer(tmp_path, backend)
