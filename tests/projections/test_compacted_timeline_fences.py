"""The audit timeline after compaction reaches the verdicts every reader reaches.

A compacted run's timeline starts at its truncation point. Events a superseded writer slipped
in just before it (their seqs at or past the point, their offsets below it) must not become
the timeline's starting point: shown first, they would be taken as counted and the run's own
events at those seqs shown as refused duplicates.
"""

from __future__ import annotations

import time
from pathlib import Path

from support.compaction_world import sqlite_world

from onward.eventlog import (
    Message,
    ModelAnswered,
    RunClaimed,
    RunFinished,
    RunStarted,
    ToolCompleted,
    ToolDispatched,
    TurnSettled,
)
from onward.projections.compaction.history import compacted_timeline
from onward.runtime.compaction import CheckpointCompactor
from onward.testing.eventlog import Envelope

RUN = "run-z"
TENANT = "acme"


def env(seq: int, fence: int, at: int) -> Envelope:
    return Envelope(run_id=RUN, tenant=TENANT, seq=seq, fence=fence, at=at)


async def test_a_superseded_writers_events_below_the_point_are_not_taken_as_counted(
    tmp_path: Path,
) -> None:
    now = time.time_ns() // 1_000
    async with sqlite_world(tmp_path) as world:
        # w2 takes the run over at seq 3; w1, not knowing, writes seqs 3 and 4 under fence 1;
        # then w2 goes on at seq 4. The retention window holds the watermark at w1's first write.
        for event in [
            RunStarted(**env(1, 1, 1), agent="booker", revision="r1", input="go"),
            RunClaimed(**env(2, 1, 2), worker="w1"),
            RunClaimed(**env(3, 2, 3), worker="w2"),
            ToolDispatched(**env(3, 1, now), call_id="z", tool="book", idempotency_key="k"),
            ToolCompleted(**env(4, 1, now + 1), call_id="z", result="booked twice"),
            ModelAnswered(**env(4, 2, now + 2), message=Message(role="assistant", content="hi")),
            TurnSettled(**env(5, 2, now + 3), iteration=1, call_ids=[]),
        ]:
            await world.log.append([event])
        await world.fold()
        row = await world.frontiers.get(RUN)
        assert row is not None
        assert row.frontier is not None
        assert (row.frontier.iteration, row.frontier.refused) == (1, 2)

        compactor = CheckpointCompactor(world.log, world.frontiers, world.store, retention_mins=1.0)
        await compactor.compact(run_id=RUN)
        point = (await world.store.truncations([RUN]))[RUN]
        assert (point.before_seq, point.before_offset) == (4, 5)

        lines, span = await compacted_timeline(world.log, world.store, RUN, tenant=TENANT)
        assert span is not None
        shown = [
            (line.stored.event.seq, line.stored.event.fence, line.refused is None)
            for line in lines
            if line.stored is not None and not line.retained
        ]
        # The fold counted w2's seqs 4 and 5 and refused w1's: so must the timeline.
        assert (4, 1, True) not in shown
        assert [s for s in shown if s[1] == 2] == [(4, 2, True), (5, 2, True)]


async def test_a_superseded_writers_start_after_the_run_ended_is_refused_as_the_fold_refuses_it(
    tmp_path: Path,
) -> None:
    """w1 found the id free, stalled and lost its lease; w2 started the run and ended it; then
    w1's start and its call landed. The fold refuses both; the timeline showed them counted,
    a second run under the id, as if the old one had been collected and the id used again."""
    async with sqlite_world(tmp_path) as world:
        for event in [
            RunStarted(**env(1, 2, 1), agent="booker", revision="r1", input="w2"),
            RunFinished(**env(2, 2, 2), status="completed", output="ok"),
            RunStarted(**env(1, 1, 3), agent="booker", revision="r1", input="w1"),
            ToolDispatched(**env(2, 1, 4), call_id="z", tool="book", idempotency_key="k"),
        ]:
            await world.log.append([event])
        await world.fold()
        row = await world.frontiers.get(RUN)
        assert row is not None
        assert (row.summary.status, row.summary.last_seq) == ("completed", 2)

        lines, span = await compacted_timeline(world.log, world.store, RUN, tenant=TENANT)
        assert span is None
        shown = [(line.stored.event.fence, line.refused is None) for line in lines if line.stored]
        assert shown == [(2, True), (2, True), (1, False), (1, False)]
