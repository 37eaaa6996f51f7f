"""Embedded fleets and the worker's pieces: `onward worker` processes on one SQLite file carry
interrupted runs on; requests round-trip; attempts are counted from the log.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.fleet import agents, script
from typer.testing import CliRunner

from onward.errors import InvalidInputError
from onward.eventlog import Message, ModelAnswered, RunClaimed, TurnSettled
from onward.runtime.backends import open_backends
from onward.runtime.cli import app
from onward.runtime.cli.worker import load_agents
from onward.runtime.ledger import Ledger
from onward.runtime.providers import ModelReply, ScriptedProvider
from onward.runtime.requests import (
    AnswerRequest,
    StartRun,
    TagRun,
    decode_request,
    encode_request,
)
from onward.runtime.settings import Settings
from onward.runtime.worker import attempts_since_progress

TESTS = Path(__file__).resolve().parents[1]
TENANT = "acme"


def test_requests_round_trip_as_tagged_json() -> None:
    for request in (
        StartRun(run_id="r", tenant="t", agent="booker", input={"a": 1}),
        AnswerRequest(run_id="r", tenant="t", request_id="p", approve=True, by="ann", value=2),
        TagRun(run_id="r", tenant="t", label="x"),
    ):
        assert decode_request(encode_request(request)) == request
    assert b'"type":"start"' in encode_request(StartRun(run_id="r", tenant="t", agent="a"))


def test_an_unknown_request_is_refused_with_the_path() -> None:
    with pytest.raises(InvalidInputError, match="type"):
        decode_request(b'{"type": "explode", "run_id": "r"}')


def test_attempts_count_claims_since_the_last_progress() -> None:
    def claimed(seq: int) -> RunClaimed:
        return RunClaimed(run_id="r", tenant="t", seq=seq, fence=seq, worker="w")

    answered = ModelAnswered(
        run_id="r", tenant="t", seq=2, fence=1, message=Message(role="assistant")
    )
    settled = TurnSettled(run_id="r", tenant="t", seq=5, fence=2, iteration=1, call_ids=[])
    assert attempts_since_progress([]) == 0
    assert attempts_since_progress([claimed(1), answered, claimed(3), claimed(4)]) == 2
    assert attempts_since_progress([claimed(3), settled]) == 0


def _settings(path: Path) -> Settings:
    return Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(path), "ONWARD_PARTITIONS": 4}
    )


async def _interrupted_runs(path: Path, count: int) -> list[str]:
    """Runs whose model fails at the second turn: running, with nobody holding them."""

    def flaky(messages: Sequence[Message]) -> ModelReply:
        if sum(1 for m in messages if m.role == "assistant") == 1:
            raise ConnectionError("the model went away")
        return script(messages)

    run_ids = []
    async with open_backends(_settings(path)) as backends:
        runner = backends.runner(ScriptedProvider(flaky))
        for i in range(count):
            name = "broken" if i == 0 else "booker"
            run_id = f"run-{i}"
            with pytest.raises((ConnectionError, RuntimeError)):
                await runner.run(agents[name], f"job {i}", tenant=TENANT, run_id=run_id)
            run_ids.append(run_id)
    return run_ids


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("count", [1, 2])
async def test_embedded_workers_carry_interrupted_runs_on(
    count: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fleet.db"
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("FLEET_LEDGER", str(ledger))
    run_ids = await _interrupted_runs(path, 12)
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(path),
        "ONWARD_PARTITIONS": "4",
        "FLEET_LEDGER": str(ledger),
        "FLEET_STEPS": "3",
    }
    argv = ["-m", "onward", "worker", "--agent", "support.fleet:agents"]
    argv += ["--provider", "support.fleet:provider", "--lease-ttl", "2", "--recheck", "0.3"]
    argv += ["--backoff", "0.1", "--max-attempts", "2"]
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable, *argv, "--name", f"e{n}", env=env, stderr=asyncio.subprocess.PIPE
        )
        for n in range(count)
    ]
    first_lines = []
    for worker in workers:  # signal handlers are in place once a worker says it is ready
        assert worker.stderr is not None
        first_lines.append(await asyncio.wait_for(worker.stderr.readline(), 60))
    try:
        assert all(b"ready" in line for line in first_lines), first_lines
        async with open_backends(_settings(path)) as backends:
            for _ in range(150):
                rows = {s.run_id: s for s in await backends.frontiers.runs(tenant=TENANT)}
                if all(rows[r].status in ("completed", "failed") for r in run_ids):
                    break
                await asyncio.sleep(0.2)
            statuses = {r: rows[r].status for r in run_ids}
            broken = await backends.frontiers.get("run-0")
            reader = backends.runner(ScriptedProvider(script))
            in_log = {r: (await reader.inspect(r, tenant=TENANT)).status for r in run_ids}
            leases = {r: await backends.leases.current(r) for r in run_ids}
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        outputs = [await asyncio.wait_for(w.communicate(), 30) for w in workers]
    assert [w.returncode for w in workers] == [0] * count, outputs
    expected = {r: "failed" if r == "run-0" else "completed" for r in run_ids}
    assert statuses == expected, (in_log, leases, outputs)
    assert broken is not None
    assert broken.frontier is not None
    assert "gave up" in (broken.frontier.error or "")
    keys = [(e["tool"], e["key"]) for e in Ledger(ledger).entries()]
    assert len(keys) == len(set(keys)) == 3 * (len(run_ids) - 1)


@pytest.mark.parametrize(
    ("agent", "said"),
    [
        ("nowhere.at_all:agent", "--agent: cannot import"),
        ("support.fleet:script", "raised TypeError"),
        ("support.fleet:TOOL_S", "not an Agent"),
    ],
)
def test_a_bad_agent_exits_2_in_one_line(agent: str, said: str, tmp_path: Path) -> None:
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "x.db")}
    args = ["worker", "--agent", agent, "--provider", "support.fleet:provider"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_agents_load_by_name_from_dicts_and_pairs() -> None:
    loaded = load_agents(["support.fleet:agents"])
    assert set(loaded) == set(agents)
    assert load_agents(["b=support.fleet:make_booker"]) == {"b": agents["booker"]}
    with pytest.raises(InvalidInputError, match="name themselves"):
        load_agents(["x=support.fleet:agents"])


def test_a_store_that_cannot_be_reached_exits_5_in_one_line() -> None:
    env = {
        "ONWARD_BACKEND": "kafka",
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
    }
    args = ["worker", "--agent", "support.fleet:agents", "--provider", "support.fleet:provider"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 5, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
