"""A pass after a cut counts a run's events the way the fold did, not from its first record.

A cut at a watermark can leave a superseded writer's refused events as a run's first records
in the log (the writer lost its lease, carried on, and its events landed past the watermark).
The next pass must not take them as counted: it would map the run's seqs to that writer's
offsets, retain its events in place of the run's own, and skip the real ones.
"""

from __future__ import annotations

import time
from pathlib import Path

from support.compaction_world import sqlite_world

from onward.eventlog import (
    Message,
    ModelAnswered,
    RunClaimed,
    RunStarted,
    Tagged,
    ToolCompleted,
    ToolDispatched,
    TurnSettled,
)
from onward.eventlog.base import SequenceGuard
from onward.projections.compaction.history import compacted_timeline, read_whole_run
from onward.runtime.compaction import CheckpointCompactor
from onward.testing.eventlog import Envelope

RUN = "run-s"
TENANT = "acme"


def env(seq: int, fence: int, at: int) -> Envelope:
    return Envelope(run_id=RUN, tenant=TENANT, seq=seq, fence=fence, at=at)


async def test_a_whole_run_keeps_its_own_events_not_a_superseded_writers(tmp_path: Path) -> None:
    now = time.time_ns() // 1_000
    async with sqlite_world(tmp_path) as world:
        # A run executed again from its first event (pydantic-ai): compaction keeps all of it.
        # w2 takes it over at seq 3; w1, not knowing, writes seqs 3 and 4 under fence 1; then
        # w2 goes on at seq 4. The retention window holds the first pass at w1's first write.
        for event in [
            RunStarted(
                **env(1, 1, 1), agent="booker", revision="r1", input="go", options={"replays": True}
            ),
            RunClaimed(**env(2, 1, 2), worker="w1"),
            RunClaimed(**env(3, 2, 3), worker="w2"),
            ToolDispatched(**env(3, 1, now), call_id="z", tool="book", idempotency_key="k"),
            ToolCompleted(**env(4, 1, now + 1), call_id="z", result="booked twice"),
            ModelAnswered(**env(4, 2, now + 2), message=Message(role="assistant", content="hi")),
            TurnSettled(**env(5, 2, now + 3), iteration=1, call_ids=[]),
        ]:
            await world.log.append([event])
        await world.fold()
        before = SequenceGuard().admit_all(await world.log.read_run(RUN))
        assert [(s.event.seq, s.event.fence) for s in before] == [
            (1, 1),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 2),
        ]

        first = CheckpointCompactor(
            world.log, world.frontiers, world.store, no_archive=True, retention_mins=1.0
        )
        assert (await first.compact()).partitions[0].watermark == 3
        point = (await world.store.truncations([RUN]))[RUN]
        assert (point.whole, point.before_seq, point.before_offset) == (True, 4, 5)

        # The log now starts with w1's refused events; the next pass cuts the rest.
        second = CheckpointCompactor(world.log, world.frontiers, world.store, no_archive=True)
        assert (await second.compact()).partitions[0].watermark == 7
        point = (await world.store.truncations([RUN]))[RUN]
        assert (point.before_seq, point.before_offset) == (6, 7)

        after = SequenceGuard().admit_all(await read_whole_run(world.log, world.store, RUN))
        assert [(s.event.seq, s.event.fence) for s in after] == [
            (s.event.seq, s.event.fence) for s in before
        ]
        assert [s.position.offset for s in after] == [s.position.offset for s in before]


async def test_a_tag_on_a_seq_a_superseded_writer_reused_keeps_the_tagged_event(
    tmp_path: Path,
) -> None:
    now = time.time_ns() // 1_000
    async with sqlite_world(tmp_path) as world:
        for event in [
            RunStarted(**env(1, 1, 1), agent="booker", revision="r1", input="go"),
            RunClaimed(**env(2, 1, 2), worker="w1"),
            RunClaimed(**env(3, 2, 3), worker="w2"),
            ToolDispatched(**env(3, 1, now), call_id="z", tool="book", idempotency_key="k"),
            ToolCompleted(**env(4, 1, now + 1), call_id="z", result="booked twice"),
            ModelAnswered(**env(4, 2, now + 2), message=Message(role="assistant", content="hi")),
            Tagged(**env(5, 2, now + 3), target_seq=4, label="answer"),
            TurnSettled(**env(6, 2, now + 4), iteration=1, call_ids=[]),
        ]:
            await world.log.append([event])
        await world.fold()
        await world.store.pin(RUN, TENANT, 4)

        first = CheckpointCompactor(
            world.log, world.frontiers, world.store, no_archive=True, retention_mins=1.0
        )
        assert (await first.compact()).partitions[0].watermark == 3
        second = CheckpointCompactor(world.log, world.frontiers, world.store, no_archive=True)
        await second.compact()

        kept = {e.seq: e.stored() for e in await world.store.retained(RUN)}
        # The tag points at w2's answer (fence 2, offset 5), not w1's refused ToolCompleted.
        assert isinstance(kept[4].event, ModelAnswered)
        assert (kept[4].event.fence, kept[4].position.offset) == (2, 5)


async def test_a_superseded_writers_event_first_past_a_point_with_no_event_after_is_refused(
    tmp_path: Path,
) -> None:
    async with sqlite_world(tmp_path) as world:
        for event in [
            RunStarted(
                **env(1, 1, 1), agent="booker", revision="r1", input="go", options={"replays": True}
            ),
            RunClaimed(**env(2, 1, 2), worker="w1"),
            RunClaimed(**env(3, 2, 3), worker="w2"),
            ModelAnswered(**env(4, 2, 4), message=Message(role="assistant", content="hi")),
            TurnSettled(**env(5, 2, 5), iteration=1, call_ids=[]),
        ]:
            await world.log.append([event])
        await world.fold()
        compactor = CheckpointCompactor(world.log, world.frontiers, world.store, no_archive=True)
        await compactor.compact()
        # Every event of the run was below the watermark: the point is the watermark itself.
        point = (await world.store.truncations([RUN]))[RUN]
        assert (point.before_seq, point.before_offset, point.fence) == (6, 5, 2)

        # w1, paused since w2 took over, writes seq 6 under fence 1; then w2 writes seq 6.
        for event in [
            ToolDispatched(**env(6, 1, 6), call_id="z", tool="book", idempotency_key="k"),
            ModelAnswered(**env(6, 2, 7), message=Message(role="assistant", content="again")),
            TurnSettled(**env(7, 2, 8), iteration=2, call_ids=[]),
        ]:
            await world.log.append([event])
        await world.fold()
        lines, _ = await compacted_timeline(world.log, world.store, RUN, tenant=TENANT)
        shown = [
            (line.stored.event.seq, line.stored.event.fence, line.refused is None)
            for line in lines
            if line.stored is not None and not line.retained
        ]
        # The fold refused w1's seq 6 and counted w2's: so must the audit timeline.
        assert shown == [(6, 1, False), (6, 2, True), (7, 2, True)]

        await compactor.compact()
        after = SequenceGuard().admit_all(await read_whole_run(world.log, world.store, RUN))
        assert [(s.event.seq, s.event.fence, s.position.offset) for s in after] == [
            (1, 1, 0),
            (2, 1, 1),
            (3, 2, 2),
            (4, 2, 3),
            (5, 2, 4),
            (6, 2, 6),
            (7, 2, 7),
        ]
