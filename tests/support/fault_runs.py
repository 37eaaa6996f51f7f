"""Runs driven through a fault, the side-effect ledger that judges them, and the report row.

Each run asks for ``steps`` tool calls, one per model turn, then finishes. The tool is not
retry-safe: it records its effect in the ledger (with the wall-clock time) and its status check
answers from the same ledger, so a resume that cannot tell whether a call ran asks the tool
instead of calling it again. A driver carries each run to its end the way an operator's retry
loop would: a retryable failure (`BackendError`, `FencedError`, `ResumeConflictError`) is
followed, after a pause, by a resume; `IndeterminateToolCallError` stops the run, waiting on a
person with the error as its reason.

The verdict: every run completed or waiting on a person with a reason, every expected effect
on record (nothing lost), none twice; the time to recover is from the moment the fault was
lifted to the first side effect after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from onward.errors import (
    BackendError,
    FencedError,
    IndeterminateToolCallError,
    InvalidInputError,
    NothingToResumeError,
    OnwardError,
    ResumeConflictError,
)
from onward.eventlog import KafkaEventLog, ToolCall
from onward.eventlog.base import EventLog
from onward.projections.base import FrontierStore
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.postgres import PROJECTION, PostgresFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import LeasePolicy, LeaseStore
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Reconciled, idempotency_key, tool
from support.histories import assert_stored_is_the_direct_fold

TENANT = "acme"
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / ".cache" / "faults" / "results.json"


def step_agent(ledger: Ledger, *, tool_s: float = 0.2, payload: int = 0) -> Agent:
    """An agent whose one tool records a side effect per call, and can say whether it did.

    Args:
        tool_s: How long each call takes after its effect.
        payload: Characters of padding in each result, so every step grows the log.
    """

    def result(n: int) -> dict[str, Any]:
        return {"n": n, "pad": "x" * payload}

    async def status(key: str) -> Reconciled:
        found = ledger.find("step", key)
        return Reconciled("completed", result(found["n"])) if found else Reconciled("never_ran")

    @tool(reconcile=status)
    async def step(n: int, *, idempotency_key: str) -> dict[str, Any]:
        ledger.record("step", idempotency_key, n=n, at=time.time())
        await asyncio.sleep(tool_s)
        return result(n)

    return Agent(name="stepper", instructions="take every step", tools=[step])


def step_provider(steps: int) -> ScriptedProvider:
    """One tool call per turn, ``steps`` turns, then a final answer."""
    turns = [
        reply(f"step {i}", ToolCall(call_id=f"s{i}", tool="step", args={"n": i}))
        for i in range(steps)
    ]
    return ScriptedProvider([*turns, reply("all steps taken")])


def new_run_ids(rng: random.Random, runs: int) -> list[str]:
    """``runs`` fresh run ids, from the test's seeded source (so the seed replays their
    partitions)."""
    return [f"run-{rng.getrandbits(48):012x}" for _ in range(runs)]


def step_runner(
    log: EventLog,
    leases: LeaseStore,
    frontiers: FrontierStore,
    steps: int,
    policy: LeasePolicy,
    **options: Any,
) -> AgentRunner:
    """A runner of ``steps``-step runs that resumes from ``frontiers`` (row, then the log's
    tail), as a deployment's workers do."""
    return AgentRunner(
        provider=step_provider(steps),
        log=log,
        leases=leases,
        frontiers=frontiers,
        lease_policy=policy,
        **options,
    )


class Folding:
    """A `KafkaProjector` folding the log into the PostgreSQL frontier store while the runs go,
    as a deployment's projector does; started again should it fail (its supervisor would).

    Use ``async with``; `caught_up` waits until every partition's end is stored.
    """

    def __init__(self, bootstrap: str, log: KafkaEventLog, store: PostgresFrontierStore) -> None:
        self.bootstrap = bootstrap
        self.log = log
        self.store = store
        self.group = f"faults-{uuid.uuid4().hex[:8]}"
        self.restarts: list[str] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Folding:
        self._task = asyncio.create_task(self._supervise())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 60)

    async def _supervise(self) -> None:
        while not self._stop.is_set():
            projector = KafkaProjector(
                self.bootstrap,
                FrontierProjection(self.store, self.log),
                topic=self.log.topic,
                partitions=self.log.partitions,
                group_id=self.group,
                session_timeout_ms=6000,
            )
            try:
                await projector.start()
                await projector.run(self._stop)
            except OnwardError as exc:
                self.restarts.append(type(exc).__name__)
                await asyncio.sleep(1.0)
            finally:
                await projector.close()

    async def caught_up(self, *, within_s: float = 120.0) -> None:
        """Wait until the store holds every partition's end; fail if the projector died."""
        deadline = time.monotonic() + within_s
        while True:
            assert self._task is not None
            assert not self._task.done(), self._task
            ends: list[int] = []
            # Either store may still be coming back from the fault: ask again until the deadline.
            with contextlib.suppress(BackendError):
                ends = [(await self.log.bounds(p)).end for p in range(self.log.partitions)]
                stored = await self.store.positions(PROJECTION)
                if all(stored.get(p, 0) >= end for p, end in enumerate(ends)):
                    return
            assert time.monotonic() < deadline, f"not folded within {within_s:.0f}s: {ends}"
            await asyncio.sleep(0.2)


def expected_keys(run_ids: list[str], steps: int) -> set[str]:
    return {idempotency_key(run_id, f"s{i}") for run_id in run_ids for i in range(steps)}


@dataclass
class Outcome:
    """How one run ended, and what it went through on the way."""

    run_id: str
    status: str | None = None
    waiting_on: str | None = None
    reason: str | None = None
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """Completed, or waiting on a person with a reason."""
        return self.status == "completed" or (
            self.status == "waiting" and bool(self.waiting_on or self.reason)
        )


RETRIED = (BackendError, FencedError, ResumeConflictError)


async def drive(
    runner: Callable[[], AgentRunner],
    agent: Agent,
    run_id: str,
    *,
    within_s: float = 240.0,
    pause_s: float = 0.5,
) -> Outcome:
    """Start the run and carry it to its end through failures, as an operator's retry loop would.

    Args:
        runner: Gives the runner for the next attempt (the same one, or a fresh worker's).
        within_s: Give up (the run counts as lost) after this long.
    """
    outcome = Outcome(run_id)
    started = False
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        outcome.attempts += 1
        try:
            if started:
                result = await runner().resume(agent, run_id, tenant=TENANT)
            else:
                started = True
                result = await runner().run(agent, "go", tenant=TENANT, run_id=run_id)
        except InvalidInputError as exc:
            if "already exists" not in str(exc):
                raise
            outcome.failures.append("InvalidInputError(exists)")
            continue
        except NothingToResumeError:
            outcome.failures.append("NothingToResumeError")
            started = False
            continue
        except IndeterminateToolCallError as exc:
            outcome.status, outcome.reason = "waiting", str(exc)
            return outcome
        except RETRIED as exc:
            outcome.failures.append(type(exc).__name__)
            outcome.errors.append(str(exc))
            await asyncio.sleep(pause_s)
            continue
        outcome.status, outcome.waiting_on = result.status, result.waiting_on
        if result.status in ("completed", "waiting", "failed"):
            return outcome
    outcome.reason = f"not settled within {within_s:.0f}s"
    return outcome


async def drive_all(
    runner: Callable[[], AgentRunner], agent: Agent, run_ids: list[str], **options: Any
) -> list[Outcome]:
    """Drive every run at once."""
    return list(await asyncio.gather(*(drive(runner, agent, r, **options) for r in run_ids)))


@dataclass
class Verdict:
    """One row of the fault table."""

    fault: str
    runs: int
    side_effects: int
    duplicates: int
    lost: int
    waiting: int
    recover_s: float | None
    total_s: float
    retries: int
    notes: str = ""

    def line(self) -> str:
        recover = "-" if self.recover_s is None else f"{self.recover_s:.2f}"
        return (
            f"{self.fault:<44} runs={self.runs:<3} effects={self.side_effects:<4} "
            f"dup={self.duplicates} lost={self.lost} waiting={self.waiting} "
            f"recover_s={recover} total_s={self.total_s:.1f} retries={self.retries} {self.notes}"
        )


def judge(
    fault: str,
    ledger: Ledger,
    outcomes: list[Outcome],
    *,
    steps: int,
    lifted_at: float | None,
    began_at: float,
    down_at: float | None = None,
    notes: str = "",
) -> Verdict:
    """Count effects, duplicates and lost runs; time the recovery; record and print the row.

    With ``down_at`` (when the fault began) the row also says how many effects happened while
    the fault lasted: a tool runs only after its dispatch is durable, so these are at most the
    calls whose dispatch was acknowledged just before the fault.

    A run is lost when it neither completed nor waits on a person with a reason, or when it
    completed without every one of its effects on record.
    """
    entries = [e for e in ledger.entries() if e["tool"] == "step"]
    per_key = Counter(e["key"] for e in entries)
    duplicates = sum(n - 1 for n in per_key.values() if n > 1)
    completed = [o.run_id for o in outcomes if o.status == "completed"]
    missing = expected_keys(completed, steps) - set(per_key)
    lost = sum(1 for o in outcomes if not o.settled) + len(
        {r for r in completed if expected_keys([r], steps) & missing}
    )
    if down_at is not None and lifted_at is not None:
        during = sum(1 for e in entries if down_at <= e["at"] < lifted_at)
        notes = f"{notes} effects during the fault {during}".strip()
    seen = Counter(f for o in outcomes for f in o.failures)
    if seen:
        notes = f"{notes} failures {dict(sorted(seen.items()))}".strip()
    after = sorted(e["at"] for e in entries if lifted_at is not None and e["at"] >= lifted_at)
    recover_s = after[0] - lifted_at if after and lifted_at is not None else None
    verdict = Verdict(
        fault=fault,
        runs=len(outcomes),
        side_effects=len(entries),
        duplicates=duplicates,
        lost=lost,
        waiting=sum(1 for o in outcomes if o.status == "waiting"),
        recover_s=recover_s,
        total_s=time.time() - began_at,
        retries=sum(len(o.failures) for o in outcomes),
        notes=notes,
    )
    record(verdict)
    return verdict


def record(verdict: Verdict) -> None:
    """Print the row and keep it in ``.cache/faults/results.json`` (one entry per fault)."""
    print(f"\nFAULT {verdict.line()}", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    rows: dict[str, Any] = {}
    if RESULTS.exists():
        try:
            rows = json.loads(RESULTS.read_text())
        except json.JSONDecodeError:
            rows = {}
    rows[verdict.fault] = {**asdict(verdict), "recorded_at": time.time()}
    RESULTS.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")


def assert_sound(verdict: Verdict, outcomes: list[Outcome]) -> None:
    """Nothing lost, nothing twice, every run settled."""
    unsettled = [o for o in outcomes if not o.settled]
    assert verdict.duplicates == 0, verdict.line()
    assert unsettled == [], unsettled[:3]
    assert verdict.lost == 0, verdict.line()


@dataclass
class Window:
    """When the runs began, when the fault came and was lifted, and how every run ended."""

    began: float
    down: float
    lifted: float
    outcomes: list[Outcome]
    projector_restarts: list[str] = field(default_factory=list)

    def assert_all_completed(
        self,
        fault: str,
        ledger: Ledger,
        *,
        steps: int,
        notes: str = "",
        down: bool = True,
        lifted: bool = True,
    ) -> Verdict:
        """`judge` these outcomes, timed from this window (``down``/``lifted``: use that time),
        then assert they are sound and every run completed; return the verdict."""
        verdict = judge(
            fault,
            ledger,
            self.outcomes,
            steps=steps,
            lifted_at=self.lifted if lifted else None,
            began_at=self.began,
            down_at=self.down if down else None,
            notes=notes,
        )
        assert_sound(verdict, self.outcomes)
        assert all(o.status == "completed" for o in self.outcomes), self.outcomes
        return verdict


async def through_fault(
    driving: Coroutine[Any, Any, list[Outcome]],
    ledger: Ledger,
    first: int,
    fault: Callable[[], Awaitable[object]],
    *,
    began: float,
    within_s: float,
) -> Window:
    """Drive the runs in the background and, once ``first`` effects are on record, the fault.

    The fault is down when ``fault()`` is called and lifted when it returns; then every run's
    outcome is awaited for up to ``within_s``.
    """
    task = asyncio.create_task(driving)
    try:
        await until(lambda: len(ledger.entries()) >= first, "the first steps")
        down = time.time()
        await fault()
        lifted = time.time()
        outcomes = await asyncio.wait_for(task, within_s)
    finally:
        task.cancel()
    return Window(began, down, lifted, outcomes)


async def kafka_runs_through(
    bootstrap: str,
    ledger: Ledger,
    fault: Callable[[], Awaitable[object]],
    *,
    leases: LeaseStore,
    database_url: str,
    schema: str,
    rng: random.Random,
    runs: int,
    steps: int,
    within_s: float,
) -> Window:
    """``runs`` runs of ``steps`` steps on a topic of ``bootstrap`` through ``fault`` (once
    every run has taken a step), set up as in production: ``leases`` (Redis or PostgreSQL),
    frontiers in PostgreSQL (``schema``, migrated) folded by a projector all along.

    Once every run has ended, the projector must have folded the whole log, and the stored
    frontiers must be the fold straight from the log; the window's ``projector_restarts`` says
    how often the projector failed and was started again.
    """
    agent = step_agent(ledger, tool_s=0.3)
    run_ids = new_run_ids(rng, runs)
    began = time.time()
    async with (
        KafkaEventLog(bootstrap, topic="onward.faults", partitions=4) as log,
        PostgresFrontierStore(database_url, schema=schema) as frontiers,
    ):
        async with Folding(bootstrap, log, frontiers) as folding:
            runner = step_runner(
                log, leases, frontiers, steps, LeasePolicy(ttl=timedelta(seconds=10))
            )
            driving = drive_all(lambda: runner, agent, run_ids)
            window = await through_fault(
                driving, ledger, runs, fault, began=began, within_s=within_s
            )
            await folding.caught_up()
        await assert_stored_is_the_direct_fold(frontiers, log, run_ids)
    window.projector_restarts = folding.restarts
    return window


async def until(check: Callable[[], bool], what: str, *, within_s: float = 60.0) -> None:
    """Wait until ``check()`` holds; fail saying ``what`` did not happen."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {within_s:.0f}s"
        await asyncio.sleep(0.1)


def table() -> str:
    """The recorded rows as a table, in the order they were recorded."""
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    header = (
        "| fault | runs | side effects | duplicates | lost | waiting | recover s | total s "
        "| retries | notes |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in sorted(rows.values(), key=lambda r: float(r["recorded_at"])):
        recover = "-" if row["recover_s"] is None else f"{row['recover_s']:.2f}"
        lines.append(
            f"| {row['fault']} | {row['runs']} | {row['side_effects']} | {row['duplicates']} "
            f"| {row['lost']} | {row['waiting']} | {recover} | {row['total_s']:.1f} "
            f"| {row['retries']} | {row['notes']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(f"{RESULTS.relative_to(REPO)}:\n{table()}")
