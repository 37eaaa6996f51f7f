"""Random but realistic run histories, and the direct fold the projector must agree with."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ScriptFacts:
    """What a run's script wrote, counted from its batches by rules of its own (not
    `fold_run`): the oracle a wrong fold rule cannot also bend."""

    events: int
    """Every event written, refused ones included."""
    turns: int
    """Turns settled: the iteration the run ends on."""
    input_tokens: int
    refused: int
    """Events written under a fence lower than one the run already had (a zombie's)."""
    finished: bool


def script_facts(steps: Sequence[list[Event]]) -> dict[str, ScriptFacts]:
    """Each run's `ScriptFacts`, from the steps a `RunScript` or `workload` made."""
    counts: dict[str, list[int]] = {}
    highest: dict[str, int] = {}
    finished: set[str] = set()
    for step in steps:
        for event in step:
            tally = counts.setdefault(event.run_id, [0, 0, 0, 0])
            tally[0] += 1
            if event.fence < highest.get(event.run_id, 0):
                tally[3] += 1
                continue
            highest[event.run_id] = event.fence
            if isinstance(event, TurnSettled):
                tally[1] += 1
            elif isinstance(event, ModelAnswered):
                tally[2] += event.usage.input_tokens
            elif isinstance(event, RunFinished) and event.status == "completed":
                finished.add(event.run_id)
    return {
        run_id: ScriptFacts(events, turns, tokens, refused, run_id in finished)
        for run_id, (events, turns, tokens, refused) in counts.items()
    }


@dataclass(frozen=True)
class Tally:
    """How the stored frontiers compare with what the scripts wrote."""

    runs: int
    folded: int
    """Events the stored rows account for: each counted event is one seq, plus the refused."""
    duplicates: int
    """Runs whose row counts more than the script wrote (an event folded twice)."""
    lost: int
    """Runs with no row, or a row counting less than the script wrote (an event never folded)."""
    waiting: int
    """Runs the script finished that the row does not show completed."""
    wrong: list[str]
    """One line per run that differs, for the failure message."""


async def tally_against_scripts(store: FrontierStore, steps: Sequence[list[Event]]) -> Tally:
    """Measure the stored frontiers against `script_facts`: folded, duplicated, lost, waiting."""
    facts = script_facts(steps)
    loaded = await store.load(list(facts))
    folded = duplicates = lost = waiting = 0
    wrong: list[str] = []
    for run_id, fact in facts.items():
        row = loaded.get(run_id)
        got = None if row is None else row.frontier
        if got is None:
            lost += 1
            wrong.append(f"{run_id}: no frontier stored ({row})")
            continue
        counted = (got.last_seq + got.refused, got.iteration, got.input_tokens, got.refused)
        want = (fact.events, fact.turns, fact.input_tokens, fact.refused)
        folded += counted[0]
        if counted != want:
            wrong.append(f"{run_id}: (events, turns, tokens, refused) {counted}, wrote {want}")
        if any(g > w for g, w in zip(counted, want, strict=True)):
            duplicates += 1
        elif counted != want:
            lost += 1
        if fact.finished and got.status != "completed":
            waiting += 1
            wrong.append(f"{run_id}: {got.status}, the script finished it")
    return Tally(len(facts), folded, duplicates, lost, waiting, wrong)


async def assert_stored_is_what_the_scripts_wrote(
    store: FrontierStore, steps: Sequence[list[Event]]
) -> Tally:
    """Every run's row counts exactly what its script wrote: every event once (seqs plus
    refused), its settled turns, its tokens, its zombie's refused writes, and completed."""
    tally = await tally_against_scripts(store, steps)
    assert tally.wrong == [], tally.wrong[:5]
    assert tally.folded == sum(len(step) for step in steps)
    return tally
