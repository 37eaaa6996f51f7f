"""Compaction of a run carried into another before it said anything of its own.

A run carried on from another run starts with no message of its own (its conversation is the
old run's transcript). Carried on again before it adds one (it asked a person for approval,
was granted it, and was due), its row counts no message: the run it was carried into reads
its history from its first event in the log (`Resumer.inherited`), so compaction must keep
that history, as it does for a live run whose row counts no message.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from support.compaction_world import TENANT, Script, sqlite_world

from onward.eventlog import (
    ApprovalGranted,
    ApprovalRequested,
    HistoryHandle,
    RunClaimed,
    RunContinued,
    RunStarted,
)
from onward.projections.frontier import Frontier
from onward.runtime.compaction import CheckpointCompactor
from onward.testing.eventlog import Envelope


def env(seq: int) -> Envelope:
    return Envelope(run_id="b", tenant=TENANT, seq=seq, fence=1, at=seq)


async def test_a_silent_continued_run_keeps_what_its_successor_reads(tmp_path: Path) -> None:
    async with sqlite_world(tmp_path) as world:
        for event in [
            RunStarted(**env(1), agent="booker", revision="r1", continuation_of="a"),
            RunClaimed(**env(2), worker="w1"),
            ApprovalRequested(**env(3), request_id="r1", prompt="book?"),
            ApprovalGranted(**env(4), request_id="r1", by="person"),
            RunContinued(**env(5), new_run_id="c"),
        ]:
            await world.log.append([event])
        await world.fold()
        row = await world.frontiers.get("b")
        assert row is not None
        assert row.frontier is not None
        assert (row.frontier.status, row.frontier.messages) == ("continued", 0)

        report = await CheckpointCompactor(
            world.log, world.frontiers, world.store, no_archive=True
        ).compact()
        assert report.events_cut == 5

        successor = msgspec.structs.replace(
            Frontier.empty("c", TENANT),
            continuation_of="b",
            history=(HistoryHandle(run_id="b", through_seq=5, messages=0),),
        )
        resumer = world.runner(Script(0)).resumer
        assert await resumer.inherited(successor) == []
