"""A checkpoint that fails never fails the run, and `Checkpointer.last_error` names the run it
is about.

A fold can fail with an error no store translated (a bug, a driver's own exception): the run
still carries on, and what it raises at the end is its own error, not the fold's, whether the
fold was awaited or folded beside the run's next step. When the folds of several runs are
merged into one pass, a frontier over the cap is reported under its own run only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio
from support.held_writes import HeldWrites, postgres_backends, settling_of

from onward.eventlog import Message, ModelAnswered, RunStarted, SqliteEventLog, ToolCall
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime import Agent, ModelReply, reply, tool
from onward.runtime.backends import Backends
from onward.runtime.checkpoint import Checkpointer
from onward.testing.eventlog import Envelope

TENANT = "acme"


class FoldBugError(Exception):
    """Stands in for an error raised in a fold that no store translated."""


@pytest_asyncio.fixture
async def backends(database_url: str, pg_schema: str) -> AsyncIterator[Backends]:
    async with postgres_backends(database_url, pg_schema) as opened:
        yield opened


@tool(retry_safe=True)
async def look(*, idempotency_key: str) -> str:
    return "nothing yet"


AGENT = Agent(name="looker", instructions="look", tools=[look])


class ModelDownError(Exception):
    pass


async def test_a_failed_background_fold_does_not_replace_the_runs_own_error(
    backends: Backends,
) -> None:
    """The model fails right after a step whose checkpoint is still being folded, and the
    fold then fails too: the run raises the model's error."""
    fails = HeldWrites(backends, fail=FoldBugError("the fold went wrong"))

    class FailsAtTheSecondCall:
        calls = 0

        async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
            self.calls += 1
            if self.calls == 1:
                fails.armed = True  # the step's checkpoints fail from here on
                return reply("", ToolCall(call_id="c1", tool="look"))
            raise ModelDownError

    runner = backends.runner(FailsAtTheSecondCall())
    settling = settling_of(runner)
    running = asyncio.create_task(runner.run(AGENT, "go", tenant=TENANT, run_id="dies"))
    await asyncio.wait_for(fails.waiting.wait(), 10)
    await asyncio.wait_for(settling.wait(), 10)  # the model has failed; the holder waits
    fails.go.set()
    with pytest.raises(ModelDownError):
        await asyncio.wait_for(running, 10)
    assert runner.checkpointer is not None
    assert runner.checkpointer.last_error is not None
    assert "FoldBugError" in runner.checkpointer.last_error
    assert await backends.leases.current("dies") is None


async def test_a_failed_fold_does_not_fail_a_run_that_completed(backends: Backends) -> None:
    """Every fold of the run fails, those awaited (its start and end) too: the run completes."""
    fails = HeldWrites(backends, fail=FoldBugError("the fold went wrong"))
    fails.armed = True
    fails.go.set()

    class LooksOnce:
        calls = 0

        async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
            self.calls += 1
            if self.calls == 1:
                return reply("", ToolCall(call_id="c1", tool="look"))
            return reply("done")

    runner = backends.runner(LooksOnce())
    result = await asyncio.wait_for(runner.run(AGENT, "go", tenant=TENANT, run_id="ends"), 30)
    assert result.status == "completed"
    assert runner.checkpointer is not None
    assert runner.checkpointer.last_error is not None
    assert "FoldBugError" in runner.checkpointer.last_error


async def test_a_frontier_over_the_cap_is_reported_under_its_own_run_in_a_merged_fold(
    tmp_path: Path,
) -> None:
    """Two runs' step checkpoints are folded in one pass, the first over the cap: only the
    first's checkpoint says so; the second's was written whole."""
    db = tmp_path / "onward.db"
    async with SqliteEventLog(db, partitions=1) as log, SqliteFrontierStore(db) as store:
        checkpointer = Checkpointer(store, log, max_bytes=4_000, steps_beside=True)
        for run_id in ("big", "small"):
            started = RunStarted(
                **Envelope(run_id=run_id, tenant=TENANT, seq=1, fence=1, at=1),
                agent="looker",
                revision="r1",
            )
            await checkpointer.after_append([started], await log.append([started]))
        reported: dict[str, str | None] = {}
        checkpoint = checkpointer._checkpoint

        async def noted(ticket: int, run_id: str) -> None:
            await checkpoint(ticket, run_id)
            reported[run_id] = checkpointer.last_error

        checkpointer._checkpoint = noted  # type: ignore[method-assign]
        for run_id, size in (("big", 8_000), ("small", 10)):
            call = ToolCall(call_id="c1", tool="look", args={"blob": "z" * size})
            answered = ModelAnswered(
                **Envelope(run_id=run_id, tenant=TENANT, seq=2, fence=1, at=2),
                message=Message(role="assistant"),
                tool_calls=[call],
            )
            await checkpointer.after_append([answered], await log.append([answered]), step=1)
        await checkpointer.settled()
        big, small = await store.get("big"), await store.get("small")
        assert big is not None
        assert small is not None
        assert big.frontier is None  # over the cap: the row keeps the reason
        assert small.frontier is not None
        assert reported["big"] is not None
        assert "'big'" in reported["big"]
        assert reported["small"] is None, reported["small"]
