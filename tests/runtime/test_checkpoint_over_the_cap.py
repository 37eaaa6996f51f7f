"""An inline checkpoint over the snapshot cap keeps the frontier uncapped beside the row.

The row then holds only the reason; the frontier itself goes to the compaction store, so the
next fold of the run and the next resume go on from it, on PostgreSQL alone as on SQLite.
Without it, every resume of the run read its whole history from the log. A frontier kept for a
row write that then failed is not folded on from: the messages it holds were never stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from onward.errors import BackendUnavailableError
from onward.eventlog import Message, ToolCall
from onward.projections.base import Snapshot
from onward.runtime import Agent, ModelReply, reply, tool
from onward.runtime.backends import Backends, open_backends
from onward.runtime.limits import MAX_LABEL_LENGTH
from onward.runtime.settings import SecretUrl, Settings

TENANT = "acme"
CAP = 4_000


class CrashError(Exception):
    """Stands in for the process dying."""


@pytest.fixture(params=["postgres", "sqlite"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "sqlite":
        return Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db", partitions=1)
    database_url: str = request.getfixturevalue("database_url")
    return Settings(
        backend="postgres",
        database_url=SecretUrl(database_url),
        database_schema=request.getfixturevalue("pg_schema"),
        partitions=1,
    )


@pytest_asyncio.fixture
async def backends(settings: Settings) -> AsyncIterator[Backends]:
    async with open_backends(settings) as opened:
        yield opened


@tool(retry_safe=True)
async def look(blob: str, *, idempotency_key: str) -> int:
    return len(blob)


AGENT = Agent(name="looker", instructions="look", tools=[look])


class BigCalls:
    """Asks for one call a step, the last with arguments over the cap, then answers."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.calls = 0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        if self.calls > self.steps:
            return reply("done")
        size = 2 * CAP if self.calls == self.steps else 10
        return reply("", ToolCall(call_id=f"c{self.calls}", tool="look", args={"blob": "z" * size}))


class DiesAfterTheBigCall:
    """The process dies once the big call returned, before its outcome is written: the run's
    last checkpoint is the model's answer asking for it, over the cap."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.returned = 0

    async def appended(self, events: Sequence[Any]) -> None:
        return None

    async def tool_returned(self, call_id: str) -> None:
        self.returned += 1
        if self.returned == self.steps:
            raise CrashError

    async def before_model_call(self) -> None:
        return None


async def test_a_frontier_over_the_cap_is_folded_and_resumed_from_its_kept_copy(
    backends: Backends,
) -> None:
    steps = 3
    runner = backends.runner(BigCalls(steps), observer=DiesAfterTheBigCall(steps))
    assert runner.checkpointer is not None
    runner.checkpointer.projection.max_bytes = CAP
    with pytest.raises(CrashError):
        await runner.run(AGENT, "go", tenant=TENANT, run_id="big")
    assert runner.checkpointer.last_error is not None
    assert "cap" in runner.checkpointer.last_error
    row = await backends.frontiers.get("big")
    assert row is not None
    assert row.frontier is None  # the row keeps the reason only
    assert backends.compaction is not None
    kept = (await backends.compaction.snapshots(["big"])).get("big")
    assert kept is not None, "the frontier over the cap is kept beside the row"
    assert kept.iteration == steps

    # The resume, in a process of its own, reads the run's log only past the kept frontier,
    # and its folds go on from the kept frontier too.
    starts: list[int | None] = []
    read_run = backends.log.read_run

    async def watched(run_id: str, *args: Any, **kwargs: Any) -> Any:
        if run_id == "big":
            starts.append(kwargs.get("start"))
        return await read_run(run_id, *args, **kwargs)

    backends.log.read_run = watched  # type: ignore[method-assign]
    resumer = backends.runner(BigCalls(0))
    assert resumer.checkpointer is not None
    resumer.checkpointer.projection.max_bytes = CAP
    result = await resumer.resume(AGENT, "big", tenant=TENANT)
    assert result.status == "completed"
    assert all(start is not None and start > kept.through_offset for start in starts), starts
    assert resumer.checkpointer.projection.stats.refolded_from_log == 0


class FailsAWrite:
    """Fails the frontier store's write once, the first that ``fails`` picks."""

    def __init__(
        self, backends: Backends, fails: Callable[[Sequence[Snapshot], Any], bool]
    ) -> None:
        self.failed = 0
        store = backends.frontiers
        write = store.write

        async def failing(
            consumer: str, positions: Any, snapshots: Sequence[Snapshot], *args: Any, **kwargs: Any
        ) -> None:
            if not self.failed and fails(snapshots, kwargs.get("messages")):
                self.failed += 1
                raise BackendUnavailableError("the store went away")
            await write(consumer, positions, snapshots, *args, **kwargs)

        store.write = failing  # type: ignore[method-assign]


async def over_the_cap(backends: Backends) -> None:
    """Run ``r`` dies after its first call returned; tags then keep its frontier over the cap."""
    runner = backends.runner(BigCalls(1), observer=DiesAfterTheBigCall(1))
    assert runner.checkpointer is not None
    runner.checkpointer.projection.max_bytes = CAP
    with pytest.raises(CrashError):
        await runner.run(AGENT, "go", tenant=TENANT, run_id="r")
    for n in range(CAP // MAX_LABEL_LENGTH + 2):
        await runner.tag("r", f"{n:03d}" + "t" * (MAX_LABEL_LENGTH - 3), tenant=TENANT)
    row = await backends.frontiers.get("r")
    assert row is not None
    assert row.frontier is None


async def resumed_to_its_end(backends: Backends) -> None:
    resumer = backends.runner(BigCalls(0))
    assert resumer.checkpointer is not None
    resumer.checkpointer.projection.max_bytes = CAP
    result = await resumer.resume(AGENT, "r", tenant=TENANT)
    assert result.status == "completed"
    assert resumer.checkpointer.last_error is not None


async def test_a_fold_after_a_failed_write_stores_the_messages_the_kept_frontier_holds(
    backends: Backends,
) -> None:
    """The frontier over the cap is kept before the row write, which fails: the next fold
    does not go on from it (it would never store the messages that write had), but folds
    the run again."""
    await over_the_cap(backends)
    fails = FailsAWrite(backends, lambda _, said: any(m.run_id == "r" for m in said or ()))
    await resumed_to_its_end(backends)
    assert fails.failed == 1

    assert backends.compaction is not None
    kept = (await backends.compaction.snapshots(["r"])).get("r")
    assert kept is not None
    assert kept.status == "completed"
    said = await backends.frontiers.transcript("r", tenant=TENANT, through=kept.last_seq)
    assert len(said) == kept.messages
    again = await backends.runner(BigCalls(0)).resume(AGENT, "r", tenant=TENANT)
    assert again.status == "completed"


async def test_a_run_whose_last_row_write_failed_reads_whole(backends: Backends) -> None:
    """The run's last fold fails after its frontier was kept: that frontier is ahead of the
    stored transcript, so a resume reads the run from the log rather than find a hole."""
    await over_the_cap(backends)
    fails = FailsAWrite(
        backends, lambda snapshots, _: any(s.frontier.status == "completed" for s in snapshots)
    )
    await resumed_to_its_end(backends)
    assert fails.failed == 1

    again = await backends.runner(BigCalls(0)).resume(AGENT, "r", tenant=TENANT)
    assert again.status == "completed"
