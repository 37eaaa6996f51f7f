"""Embedded fleets and the worker's pieces: `onward worker` processes on one SQLite file carry
interrupted runs on; requests round-trip; attempts are counted from the log.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support import cli_agent
from support.fleet import agents, script
from support.fleet_checks import SlowListings
from support.processes import kill_running, ready_workers, reaped
from typer.testing import CliRunner

from onward.errors import InvalidInputError
from onward.eventlog import Message, ModelAnswered, RunClaimed, ToolResolved, TurnSettled
from onward.runtime.backends import Backends, open_backends
from onward.runtime.cli import app
from onward.runtime.cli.worker import load_agents
from onward.runtime.demo_ledger import Ledger
from onward.runtime.dispatch import NOT_CALLED
from onward.runtime.fleet.requests import (
    AnswerRequest,
    CancelRun,
    ResumeRun,
    StartRun,
    TagRun,
    decode_request,
    encode_request,
)
from onward.runtime.fleet.worker import Worker, attempts_since_progress
from onward.runtime.manager import ExecutionManager
from onward.runtime.providers import ModelReply, ScriptedProvider
from onward.runtime.settings import Settings
from onward.testing.leases import until

TESTS = Path(__file__).resolve().parents[1]
TENANT = "acme"


def test_requests_round_trip_as_tagged_json() -> None:
    for request in (
        StartRun(run_id="r", tenant="t", agent="booker", input={"a": 1}),
        AnswerRequest(run_id="r", tenant="t", request_id="p", approve=True, by="ann", value=2),
        TagRun(run_id="r", tenant="t", label="x"),
        CancelRun(run_id="r", tenant="t", by="ops", why="not wanted"),
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


def test_a_call_settled_as_never_run_only_to_be_made_again_is_no_progress() -> None:
    """Its status check, or the holder that did not call it, says a call never ran: it is
    made again, nothing moved on. A person's settlement is progress, whatever it says."""

    def claimed(seq: int) -> RunClaimed:
        return RunClaimed(run_id="r", tenant="t", seq=seq, fence=seq, worker="w")

    def never_ran(seq: int, by: str, why: str = "") -> ToolResolved:
        return ToolResolved(
            run_id="r",
            tenant="t",
            seq=seq,
            fence=seq,
            call_id="c",
            outcome="never_ran",
            by=by,
            why=why,
        )

    checked = never_ran(2, "reconcile")
    not_called = never_ran(2, "w", NOT_CALLED)
    assert attempts_since_progress([claimed(1), checked, claimed(3)]) == 2
    assert attempts_since_progress([claimed(1), not_called, claimed(3)]) == 2
    assert attempts_since_progress([claimed(1), never_ran(2, "ann"), claimed(3)]) == 1


def _settings(path: Path) -> Settings:
    return Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(path), "ONWARD_PARTITIONS": 4}
    )


async def _interrupted_runs(path: Path, names: Sequence[str]) -> list[str]:
    """Runs of these agents whose model fails at the second turn: running, nobody holding them."""

    def flaky(messages: Sequence[Message]) -> ModelReply:
        if sum(1 for m in messages if m.role == "assistant") == 1:
            raise ConnectionError("the model went away")
        return script(messages)

    run_ids = []
    async with open_backends(_settings(path)) as backends:
        runner = backends.runner(ScriptedProvider(flaky))
        for i, name in enumerate(names):
            run_id = f"run-{i}"
            with pytest.raises((ConnectionError, RuntimeError)):
                await runner.run(agents[name], f"job {i}", tenant=TENANT, run_id=run_id)
            run_ids.append(run_id)
    return run_ids


async def _start_workers(
    path: Path, ledger: Path, count: int, *, steps: int, tool_s: float = 0.05
) -> list[asyncio.subprocess.Process]:
    """``count`` `onward worker` processes on one SQLite file, each ready (signals handled)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(path),
        "ONWARD_PARTITIONS": "4",
        "FLEET_LEDGER": str(ledger),
        "FLEET_STEPS": str(steps),
        "FLEET_TOOL_S": str(tool_s),
    }
    argv = ["-m", "onward", "worker", "--agent", "support.fleet:agents"]
    argv += ["--provider", "support.fleet:provider", "--lease-ttl", "2", "--recheck", "0.3"]
    argv += ["--backoff", "0.1", "--max-attempts", "2"]
    return await ready_workers(argv, [f"e{n}" for n in range(count)], env)


async def _stop(workers: Sequence[asyncio.subprocess.Process]) -> list[tuple[bytes, bytes]]:
    """SIGTERM each worker still running and collect what it said; one that does not end in
    time is killed, with those after it, rather than left serving after the test."""
    try:
        for worker in workers:
            if worker.returncode is None:
                worker.send_signal(signal.SIGTERM)
        return [await asyncio.wait_for(w.communicate(), 30) for w in workers]
    finally:
        await kill_running(workers)


async def _until_one_is_held(
    backends: Backends, run_ids: Sequence[str], holder: str, ledger: Path, effects: int
) -> None:
    """Poll until ``effects`` side effects are in the ledger and a run is leased by the worker
    named ``holder``."""
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        if len(Ledger(ledger).entries()) >= effects:
            leases = [await backends.leases.current(r) for r in run_ids]
            if any(lease is not None and lease.holder == holder for lease in leases):
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no run was leased by {holder} after {effects} side effects in 60 s")


async def _until_runs_rest(backends: Backends, run_ids: Sequence[str], within: float) -> None:
    """Poll until every run completed, failed, or waits on a person (or ``within`` passes)."""
    deadline = asyncio.get_running_loop().time() + within
    manager = ExecutionManager(backends.frontiers, backends.leases)
    while asyncio.get_running_loop().time() < deadline:
        rows = {s.run_id: s for s in await backends.frontiers.runs(tenant=TENANT)}
        pending = await manager.list_pending(tenant=TENANT)
        for_person = {p.summary.run_id for p in pending if p.attention == "needs_person"}
        if all(r in rows for r in run_ids) and all(
            rows[r].status in ("completed", "failed") or r in for_person for r in run_ids
        ):
            return
        await asyncio.sleep(0.2)


@pytest.mark.timeout(60)
async def test_lapsed_runs_found_without_a_slot_take_slots_as_they_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One look at the frontiers finds four lapsed runs and one slot: the other three wait,
    the worker owes them (no new requests), and each takes the next free slot without another
    look."""
    path = tmp_path / "fleet.db"
    monkeypatch.setenv("FLEET_LEDGER", str(tmp_path / "ledger.jsonl"))
    run_ids = await _interrupted_runs(path, ["booker"] * 4)
    async with open_backends(_settings(path)) as backends:
        looks = 0
        runs = backends.frontiers.runs

        async def counted(**kwargs: Any) -> Any:
            nonlocal looks
            looks += 1
            return await runs(**kwargs)

        monkeypatch.setattr(backends.frontiers, "runs", counted)
        worker = Worker(backends, ScriptedProvider(script), agents, max_runs=1)
        launched = await worker.recover(range(4))
        assert launched == 1
        assert worker.owes_lapsed_runs
        while launched < 4:
            if worker.free:
                launched += await worker.launch_lapsed()
            else:
                await worker.wait_for_slot(0.5)
        await worker.drained()
        assert looks == 1
        rows = {s.run_id: s.status for s in await backends.frontiers.runs(tenant=TENANT)}
        assert rows == dict.fromkeys(run_ids, "completed")
        assert worker.stats.recovered == 4


async def test_a_start_for_an_agent_the_worker_lacks_ends_the_run_failed_saying_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker given a start for an agent it does not carry cannot leave it for another (on a
    topic, its partition is read by this worker alone): the run ends failed at once, its error
    naming the agent asked for and those the worker carries, so whoever follows it reads why
    instead of waiting. Nothing of the agent ran: no revision, no claim, no model call."""
    async with open_backends(_settings(tmp_path / "fleet.db")) as backends:
        worker = Worker(backends, ScriptedProvider(script), {"booker": agents["booker"]}, name="w1")
        request = StartRun(
            run_id="r", tenant=TENANT, agent="charger", input="go", options={"user": "ann"}
        )
        with caplog.at_level("WARNING", logger="onward.worker"):
            assert await worker.handle(request)
            assert await worker.handle(request)  # again (a request read twice): left as it is
        assert (worker.stats.started, worker.stats.failures) == (0, 2)
        runner = backends.runner(ScriptedProvider(script))
        ended = await runner.inspect("r", tenant=TENANT)
        records = await backends.log.read_run("r")
    assert (ended.status, ended.agent, ended.revision, ended.user_id) == (
        "failed",
        "charger",
        "",
        "ann",
    )
    assert ended.error is not None
    assert "no agent 'charger' on worker w1 (it carries booker)" in ended.error
    assert [type(r.event).__name__ for r in records] == ["RunStarted", "RunFinished"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run r:")]
    assert "every worker serving one requests topic carries every agent" in said[0]
    assert "not ended failed" in said[-1]


async def test_a_start_the_worker_cannot_make_ends_the_run_failed_saying_why(
    tmp_path: Path,
) -> None:
    """A budget on a model the worker has no price for: refused before anything is written,
    and recorded as a run that failed at its start with the cause, so whoever follows it (a
    fleet's application reads only the log) reads why instead of waiting for it."""
    async with open_backends(_settings(tmp_path / "fleet.db")) as backends:
        worker = Worker(backends, ScriptedProvider(script), {"booker": agents["booker"]}, name="w1")
        request = StartRun(
            run_id="r", tenant=TENANT, agent="booker", input="go", options={"budget_micros": 10}
        )
        assert await worker.handle(request)
        ended = await worker.runner.inspect("r", tenant=TENANT)
    assert (ended.status, ended.revision) == ("failed", "")
    assert ended.error is not None
    assert "worker w1 could not start it: a budget needs the price of model" in ended.error
    assert worker.stats.failures == 1


def test_inspect_shows_that_a_run_failed_at_its_start_never_ran(tmp_path: Path) -> None:
    async def failed_at_start() -> None:
        async with open_backends(_settings(tmp_path / "fleet.db")) as backends:
            worker = Worker(backends, ScriptedProvider(script), {"booker": agents["booker"]})
            await worker.handle(StartRun(run_id="r", tenant=TENANT, agent="charger"))

    asyncio.run(failed_at_start())
    env = {
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(tmp_path / "fleet.db"),
        "ONWARD_PARTITIONS": "4",
    }
    inspected = CliRunner().invoke(app, ["inspect", "r", "--tenant", TENANT], env=env)
    assert inspected.exit_code == 0, inspected.output
    assert "revision      - (none ran)" in inspected.output
    assert "status        failed" in inspected.output


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("count", [1, 2])
async def test_embedded_workers_carry_interrupted_runs_on(
    count: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fleet.db"
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("FLEET_LEDGER", str(ledger))
    run_ids = await _interrupted_runs(path, ["broken"] + ["booker"] * 11)
    workers = await _start_workers(path, ledger, count, steps=3)
    try:
        async with open_backends(_settings(path)) as backends:
            await _until_runs_rest(backends, run_ids, within=120)
            rows = {s.run_id: s for s in await backends.frontiers.runs(tenant=TENANT)}
            statuses = {r: rows[r].status for r in run_ids}
            broken = await backends.frontiers.get("run-0")
            reader = backends.runner(ScriptedProvider(script))
            in_log = {r: (await reader.inspect(r, tenant=TENANT)).status for r in run_ids}
            leases = {r: await backends.leases.current(r) for r in run_ids}
    finally:
        outputs = await _stop(workers)
    assert [w.returncode for w in workers] == [0] * count, outputs
    expected = {r: "failed" if r == "run-0" else "completed" for r in run_ids}
    assert statuses == expected, (in_log, leases, outputs)
    assert broken is not None
    assert broken.frontier is not None
    assert "gave up" in (broken.frontier.error or "")
    keys = [(e["tool"], e["key"]) for e in Ledger(ledger).entries()]
    assert len(keys) == len(set(keys)) == 3 * (len(run_ids) - 1)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_killed_embedded_worker_s_runs_are_carried_on_by_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers on one SQLite file, one SIGKILLed mid-load: the other carries its runs on;
    nothing happens twice; a call the kill left undecided leaves its run for a person."""
    path = tmp_path / "fleet.db"
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("FLEET_LEDGER", str(ledger))
    steps = 6
    run_ids = await _interrupted_runs(path, ["booker", "booker", "charger"] * 10)
    workers = await _start_workers(path, ledger, 2, steps=steps, tool_s=0.3)
    try:
        expected_effects = steps * len(run_ids)
        async with open_backends(_settings(path)) as backends:
            # Killed mid-load, and holding a run then: a kill between two of its runs would
            # leave the other worker nothing to carry on.
            await _until_one_is_held(backends, run_ids, "e0", ledger, expected_effects // 3)
            victim = workers[0]
            victim.send_signal(signal.SIGKILL)
            await victim.wait()
            await _until_runs_rest(backends, run_ids, within=150)
            rows = {s.run_id: s for s in await backends.frontiers.runs(tenant=TENANT)}
            manager = ExecutionManager(backends.frontiers, backends.leases)
            pending = await manager.list_pending(tenant=TENANT)
    finally:
        outputs = await _stop(workers)
    assert workers[1].returncode == 0, outputs[1]
    left = {p.summary.run_id for p in pending if p.attention == "needs_person"}
    statuses = {r: rows[r].status for r in run_ids if r not in left}
    assert statuses == dict.fromkeys(statuses, "completed"), (statuses, outputs)
    assert all(rows[r].agent == "charger" for r in left), left  # booker settles its own calls
    keys = [(e["tool"], e["key"]) for e in Ledger(ledger).entries()]
    assert len(keys) == len(set(keys)), "a side effect happened twice"
    # Each run was claimed by its first runner, then by a worker: a third claim is a carry-on.
    assert any(rows[r].fence > 2 for r in run_ids), "no run of the dead worker was carried on"


@pytest.mark.parametrize(
    ("agent", "said"),
    [
        ("nowhere.at_all:agent", "--agent: cannot import"),
        ("support.fleet:script", "raised TypeError"),
        ("support.fleet:DEFAULT_STEPS", "not an Agent"),
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
    handlers = [signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 5, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # The command ran in this process: it leaves its signal handlers as it found them.
    assert [signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)] == handlers


@pytest.mark.timeout(90)
def _embedded_env(path: Path) -> dict[str, str]:
    """The environment of an `onward` process on the SQLite file ``path``."""
    return {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(path),
        "ONWARD_PARTITIONS": "4",
    }


async def _ready_worker(
    env: dict[str, str], agent: str, provider: str
) -> asyncio.subprocess.Process:
    """An `onward worker` of ``support.cli_agent``'s agent and provider, once it says ready."""
    argv = ["-m", "onward", "worker", "--agent", f"support.cli_agent:{agent}"]
    argv += ["--provider", f"support.cli_agent:{provider}", "--recheck", "0.3"]
    worker = await asyncio.create_subprocess_exec(
        sys.executable, *argv, env=env, stderr=asyncio.subprocess.PIPE
    )
    assert worker.stderr is not None
    try:
        assert b"ready" in await asyncio.wait_for(worker.stderr.readline(), 60)
    except BaseException:
        await kill_running([worker])
        raise
    return worker


async def _status_once_settled(path: Path, run_id: str, within_s: float = 30) -> str | None:
    """The run's status from its row, polled until it is completed (or ``within_s`` passes)."""
    status = None
    async with open_backends(_settings(path)) as backends:
        for _ in range(int(within_s * 10)):
            row = await backends.frontiers.get(run_id)
            status = row.summary.status if row is not None else None
            if status == "completed":
                break
            await asyncio.sleep(0.1)
    return status


async def test_a_run_approved_with_the_cli_is_carried_on_by_a_running_embedded_worker(
    tmp_path: Path,
) -> None:
    """`onward approve` in one process, `onward worker` in another, one SQLite file: the
    answer is folded into the run's row at once, so `list_pending` no longer shows it waiting
    and the worker, which finds runs by their rows, carries it on to the end."""
    path = tmp_path / "fleet.db"
    async with open_backends(_settings(path)) as backends:
        runner = backends.runner(cli_agent.paying_model())
        waiting = await runner.run(cli_agent.payer(), "go", tenant=TENANT, run_id="pay-1")
        assert waiting.status == "waiting"
    env = _embedded_env(path)
    worker = await _ready_worker(env, "payer", "paying_model")
    try:
        approve = ["-m", "onward", "approve", "pay-1", "p", "--tenant", TENANT, "--by", "ann"]
        async with reaped() as children:
            approved = await asyncio.create_subprocess_exec(
                sys.executable, *approve, env=env, stderr=asyncio.subprocess.PIPE
            )
            children.append(approved)
            _, said = await asyncio.wait_for(approved.communicate(), 60)
        assert approved.returncode == 0, said
        async with open_backends(_settings(path)) as backends:
            manager = ExecutionManager(backends.frontiers, backends.leases)
            pending = await manager.list_pending(tenant=TENANT)
            assert [p.attention for p in pending] in ([], ["interrupted"], ["held"])
        assert await _status_once_settled(path, "pay-1") == "completed"
    finally:
        await _stop([worker])


async def test_a_run_whose_first_model_call_failed_is_found_and_carried_on_by_a_worker(
    tmp_path: Path,
) -> None:
    """A run that never reached its first boundary (the model failed on its first call) has a
    row at once, so a running `onward worker`, which finds runs by their rows, carries it on;
    before, the row came only at the first model answer and the run was never found."""
    path = tmp_path / "fleet.db"

    def down(messages: Sequence[Message]) -> ModelReply:
        raise ConnectionError("the model is down")

    async with open_backends(_settings(path)) as backends:
        runner = backends.runner(ScriptedProvider(down))
        with pytest.raises(ConnectionError):
            await runner.run(cli_agent.booker(), "book 3A", tenant=TENANT, run_id="first-1")
        row = await backends.frontiers.get("first-1")
        assert row is not None
        assert row.summary.status == "running"
    worker = await _ready_worker(_embedded_env(path), "booker", "booking_model")
    try:
        assert await _status_once_settled(path, "first-1") == "completed"
    finally:
        await _stop([worker])


@pytest.mark.timeout(60)
async def test_a_run_stopped_for_a_cancel_is_not_counted_as_a_failed_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run carried on while it is being cancelled stops at its first model call; with one
    attempt allowed, counting that stop as a failed attempt would end it ``failed`` before
    the cancel could write its end."""
    path = tmp_path / "fleet.db"
    monkeypatch.setenv("FLEET_LEDGER", str(tmp_path / "ledger.jsonl"))
    [run_id] = await _interrupted_runs(path, ["booker"])
    async with open_backends(_settings(path)) as backends:
        worker = Worker(backends, ScriptedProvider(script), agents, max_attempts=1)
        async with worker.stopping_run(run_id):
            worker.submit(ResumeRun(run_id=run_id, tenant=TENANT))
            await worker.others_stopped(run_id)
        frontier = await worker.runner.inspect(run_id, tenant=TENANT)
        assert (frontier.status, frontier.attempts) == ("running", 1)  # claimed, then stopped
        assert (worker.stats.stopped, worker.stats.gave_up) == (1, 0)
        worker.submit(CancelRun(run_id=run_id, tenant=TENANT, by="ops"))
        await worker.drained()
        ended = await worker.runner.inspect(run_id, tenant=TENANT)
        assert (ended.status, worker.stats.statuses) == ("cancelled", {"cancelled": 1})


@pytest.mark.timeout(60)
async def test_a_slow_recovery_pass_is_not_overlapped_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that takes longer than ``recheck_s`` (a slow store, very many runs) is not joined
    by the next one, each listing the runs and checking their leases again; the next starts
    once it ended, and stopping does not wait for a pass."""
    async with open_backends(_settings(tmp_path / "fleet.db")) as backends:
        worker = Worker(backends, ScriptedProvider(script), agents, recheck_s=0.05)
        listings = SlowListings(worker, monkeypatch, delay_s=0.4)
        stop = asyncio.Event()
        serving = asyncio.create_task(worker.serve_embedded(stop))
        await until(lambda: listings.started >= 2, within_s=10, what="a pass after the first")
        stop.set()
        await asyncio.wait_for(serving, 5)
    assert listings.most_at_once == 1


async def test_stopping_just_as_a_recovery_pass_is_started_leaves_no_pass_unawaited(
    tmp_path: Path,
) -> None:
    """Stop can come right after a serve loop started a pass (a tick, a rebalance): the pass,
    cancelled before it ran, is closed, not left to warn that it was never awaited."""
    async with open_backends(_settings(tmp_path / "fleet.db")) as backends:
        worker = Worker(backends, ScriptedProvider(script), agents)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            worker._recheck({0, 1, 2, 3}, adopt=True)
            worker.drain()
            await worker.drained()
            await asyncio.sleep(0.1)
            del worker
            gc.collect()
    assert [str(w.message) for w in said] == []


async def test_stopping_at_once_as_work_is_launched_leaves_no_work_unawaited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second SIGTERM (`stop_now`) can come right after a request was taken or a lapsed run
    launched: their work, cancelled before it ran, is closed, not left to warn that it was
    never awaited; the request is left for the next owner."""
    path = tmp_path / "fleet.db"
    monkeypatch.setenv("FLEET_LEDGER", str(tmp_path / "ledger.jsonl"))
    [run_id] = await _interrupted_runs(path, ["booker"])
    async with open_backends(_settings(path)) as backends:
        worker = Worker(backends, ScriptedProvider(script), agents)
        acted: list[bool] = []
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            worker._recovery._lapsed = {run_id: TENANT}
            assert await worker.launch_lapsed() == 1
            worker.submit(StartRun(run_id="new-1", tenant=TENANT, agent="booker"), acted.append)
            worker.stop_now()
            await worker.drained()
            await asyncio.sleep(0.1)
            del worker
            gc.collect()
    assert [str(w.message) for w in said] == []
    assert acted == [False]


async def test_a_run_a_second_task_acts_on_is_carried_after_the_first_task_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tasks of a worker act on one run (a tag, then a resume waiting out its backoff,
    holding no lease yet); once the first ends, the worker still carries the run, and a
    recovery pass does not launch a third task on it."""
    path = tmp_path / "fleet.db"
    monkeypatch.setenv("FLEET_LEDGER", str(tmp_path / "ledger.jsonl"))
    [run_id] = await _interrupted_runs(path, ["booker"])
    async with open_backends(_settings(path)) as backends:
        worker = Worker(backends, ScriptedProvider(script), agents)
        first_done, second_go = asyncio.Event(), asyncio.Event()

        async def first() -> bool:
            first_done.set()
            return True

        async def second() -> bool:
            await second_go.wait()
            return True

        worker.launch(run_id, first)
        worker.launch(run_id, second)
        await first_done.wait()
        await until(lambda: worker.in_flight == 1, within_s=5, what="the first task's end seen")
        assert worker.carrying(run_id)
        assert await worker.recover({0, 1, 2, 3}) == 0
        second_go.set()
        await worker.drained()


async def test_a_worker_says_ready_and_stopped_in_one_line_each_whatever_the_width(
    tmp_path: Path,
) -> None:
    """A worker's stderr is read by line (a pod's log, journald): its stopped line, and a ready
    line with a long name, were wrapped at 80 columns when stderr was not a terminal, the end
    of each a line of its own that says nothing alone."""
    name = "worker-of-a-long-deployment-name-" + "x" * 40
    env = _embedded_env(tmp_path / "onward.db")
    env.pop("COLUMNS", None)
    argv = ["-m", "onward", "worker", "--agent", "support.cli_agent:booker", "--name", name]
    argv += ["--provider", "support.cli_agent:booking_model"]
    async with reaped() as children:
        worker = await asyncio.create_subprocess_exec(
            sys.executable, *argv, env=env, stderr=asyncio.subprocess.PIPE
        )
        children.append(worker)
        assert worker.stderr is not None
        first = await asyncio.wait_for(worker.stderr.readline(), 60)
        worker.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(worker.communicate(), 30)
    assert first.decode().rstrip("\n") == f"worker {name} ready (sqlite)"
    lines = rest.decode().splitlines()
    assert lines[-1].startswith(f"worker {name} stopped: 0 started"), lines
    assert lines[-1].endswith("paused 0 times"), lines
    assert worker.returncode == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [("recheck_s", 0.0), ("recheck_s", -1.0), ("recheck_s", float("nan")), ("backoff_s", -0.5)],
)
async def test_a_worker_refuses_a_recheck_or_backoff_that_would_never_wait(
    tmp_path: Path, option: str, value: float
) -> None:
    """A recheck of zero or less (or NaN) would rescan every owned partition back to back for
    as long as the worker serves, and a negative backoff is no wait either: the worker refuses
    them when it is made, naming the option, instead of spinning once it serves."""
    async with open_backends(_settings(tmp_path / "fleet.db")) as backends:
        options: dict[str, Any] = {option: value}
        with pytest.raises(InvalidInputError, match=rf"^{option} must be"):
            Worker(backends, ScriptedProvider(script), agents, **options)


@pytest.mark.parametrize("topic", ["", 9092])
async def test_a_worker_refuses_an_empty_requests_topic_before_it_connects(
    tmp_path: Path, topic: Any
) -> None:
    """`Worker.serve_kafka` checks its topic as `Requests` and `KafkaEventLog` do, naming the
    argument, before it reaches for a broker: nothing listens at the address given here, so a
    check made any later would fail on the connection instead."""
    async with open_backends(_settings(tmp_path / "fleet.db")) as backends:
        worker = Worker(backends, ScriptedProvider(script), agents)
        with pytest.raises(InvalidInputError, match=r"^topic (must be|is empty)"):
            await worker.serve_kafka(
                asyncio.Event(),
                bootstrap_servers="127.0.0.1:1",
                topic=topic,
                accept_unsigned=True,
            )
