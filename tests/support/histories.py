"""Random but realistic run histories, and the direct fold the projector must agree with."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence

from onward.eventlog import (
    ApprovalGranted,
    ApprovalRequested,
    Event,
    Message,
    ModelAnswered,
    RunClaimed,
    RunFinished,
    RunStarted,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    TurnSettled,
    Usage,
)
from onward.eventlog.base import EventLog, StoredEvent
from onward.projections.base import FrontierStore
from onward.projections.frontier import Frontier, ToolCallRow, fold_run
from onward.testing.eventlog import Envelope


class RunScript:
    """Builds one run's steps: each step is the batch the runner would append at once."""

    def __init__(self, rng: random.Random, *, tenant: str = "acme", zombie: bool = False) -> None:
        self.rng = rng
        # From the seeded source, not uuid4: the seed must replay which partition each run
        # lands in, and so every batch and interleaving built on it.
        self.run_id = f"run-{rng.getrandbits(48):012x}"
        self.tenant = tenant
        self.seq = 0
        self.fence = 1
        self.zombie = zombie
        self.at = 1_000_000

    def _env(self, *, fence: int | None = None, seq: int | None = None) -> Envelope:
        if seq is None:
            self.seq += 1
            seq = self.seq
        self.at += self.rng.randint(100, 5_000)
        return Envelope(
            run_id=self.run_id,
            tenant=self.tenant,
            seq=seq,
            fence=self.fence if fence is None else fence,
            at=self.at,
        )

    def steps(self) -> list[list[Event]]:
        """The run's batches, in order."""
        rng = self.rng
        steps: list[list[Event]] = [
            [RunStarted(**self._env(), agent="booker", revision="r1", input="go")]
        ]
        iterations = rng.randint(1, 6)
        for iteration in range(1, iterations + 1):
            calls = [
                ToolCall(
                    call_id=f"c{iteration}-{n}",
                    tool=rng.choice(["search", "book", "pay"]),
                    args={"q": "x" * rng.randint(0, 200)},
                    idempotency_key=f"{self.run_id}:c{iteration}-{n}",
                )
                for n in range(rng.randint(0, 3))
            ]
            steps.append(
                [
                    ModelAnswered(
                        **self._env(),
                        message=Message(role="assistant", content=f"step {iteration}"),
                        tool_calls=calls,
                        usage=Usage(input_tokens=rng.randint(1, 99), output_tokens=7),
                    )
                ]
            )
            for call in calls:
                steps.append(
                    [
                        ToolDispatched(
                            **self._env(),
                            call_id=call.call_id,
                            tool=call.tool,
                            idempotency_key=call.idempotency_key,
                        )
                    ]
                )
                steps.append(
                    [ToolCompleted(**self._env(), call_id=call.call_id, result={"ok": iteration})]
                )
            steps.append(
                [
                    TurnSettled(
                        **self._env(), iteration=iteration, call_ids=[c.call_id for c in calls]
                    )
                ]
            )
            if rng.random() < 0.15:
                steps.append([ApprovalRequested(**self._env(), request_id=f"a{iteration}")])
                steps.append([ApprovalGranted(**self._env(), request_id=f"a{iteration}", by="ann")])
            if self.zombie and iteration == 1:
                steps.extend(self._takeover())
        steps.append([RunFinished(**self._env(), status="completed", output="done")])
        return steps

    def _takeover(self) -> list[list[Event]]:
        """A new holder claims the run; the old one, not knowing, writes on under its old fence."""
        old = self.fence
        self.fence += 1
        claim: list[Event] = [RunClaimed(**self._env(), worker="worker-b")]
        zombie_seq = self.seq + 1
        zombie: list[Event] = [
            ToolDispatched(
                **self._env(fence=old, seq=zombie_seq),
                call_id="zombie-call",
                tool="pay",
                idempotency_key="zombie",
            )
        ]
        return [claim, zombie]


def workload(rng: random.Random, runs: int, *, zombies: float = 0.1) -> list[list[Event]]:
    """Steps of many runs, interleaved the way concurrent runs append."""
    scripts = [RunScript(rng, zombie=rng.random() < zombies).steps() for _ in range(runs)]
    return interleaved(rng, scripts)


def interleaved(rng: random.Random, scripts: Sequence[list[list[Event]]]) -> list[list[Event]]:
    """The steps of every script, each script's in order, the scripts taken at random."""
    order: list[list[Event]] = []
    cursors = [0] * len(scripts)
    live = list(range(len(scripts)))
    while live:
        index = rng.choice(live)
        order.append(scripts[index][cursors[index]])
        cursors[index] += 1
        if cursors[index] == len(scripts[index]):
            live.remove(index)
    return order


async def append_all(log: EventLog, steps: Sequence[list[Event]], *, concurrency: int = 32) -> None:
    """Append steps, several runs at once, each run's steps in order."""
    by_run: dict[str, list[list[Event]]] = {}
    for step in steps:
        by_run.setdefault(step[0].run_id, []).append(step)
    queue = list(by_run.values())

    async def writer() -> None:
        while queue:
            for step in queue.pop():
                await log.append(step)

    await asyncio.gather(*(writer() for _ in range(concurrency)))


async def direct_fold(
    log: EventLog, run_ids: Sequence[str]
) -> tuple[dict[str, Frontier], dict[tuple[str, str], ToolCallRow]]:
    """What every run's frontier and call rows must be, folded straight from the log.

    Reads each partition once, whole, and folds each wanted run's events in log order.
    """
    wanted = set(run_ids)
    by_run: dict[str, list[StoredEvent]] = {}
    for partition in range(log.partitions):
        bounds = await log.bounds(partition)
        for stored in await log.read_partition(partition, bounds.start):
            if stored.event.run_id in wanted:
                by_run.setdefault(stored.event.run_id, []).append(stored)
    return fold_each(by_run, run_ids)


def fold_each(
    by_run: Mapping[str, list[StoredEvent]], run_ids: Sequence[str]
) -> tuple[dict[str, Frontier], dict[tuple[str, str], ToolCallRow]]:
    """Each run's frontier folded from its events, and the call rows of them all."""
    frontiers: dict[str, Frontier] = {}
    calls: dict[tuple[str, str], ToolCallRow] = {}
    for run_id in run_ids:
        events = by_run[run_id]
        frontiers[run_id] = fold_run(Frontier.empty(run_id, events[0].event.tenant), events, calls)
    return frontiers, calls


async def assert_stored_is_the_direct_fold(
    store: FrontierStore, log: EventLog, run_ids: Sequence[str]
) -> None:
    """``store`` holds for ``run_ids`` exactly the frontiers and call rows the log folds to."""
    expected, expected_calls = await direct_fold(log, run_ids)
    loaded = await store.load(run_ids)
    assert {r: row.frontier for r, row in loaded.items()} == expected
    stored_calls = {
        (row.run_id, row.call_id): row for r in run_ids for row in await store.tool_calls(r)
    }
    assert stored_calls == expected_calls


def run_ids_of(steps: Sequence[list[Event]]) -> list[str]:
    """Every run id in a workload, once, in first-seen order."""
    return list(dict.fromkeys(step[0].run_id for step in steps))
