"""The audit timeline of a compacted run whose log start moved past its truncation point.

A run compacted logically (a truncation point, no cut yet) keeps its later events in the log.
When the log's start then moves past the point by other means (Kafka retention, DeleteRecords
of an older deployment), the timeline starts where the log now starts: the events shown there
are the run's own, counted as every reader counts them, not refused as a gap after the point.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest
from support.compaction_world import World, sqlite_world, world_of
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

from onward.errors import LogTruncatedError
from onward.eventlog import Message, ModelAnswered, RunClaimed, RunStarted, TurnSettled
from onward.projections.compaction import LogCut
from onward.projections.compaction.history import compacted_timeline, read_whole_run
from onward.runtime.cli import app
from onward.runtime.compaction import CheckpointCompactor
from onward.testing.eventlog import Envelope

RUN = "run-r"
TENANT = "acme"


def env(seq: int, at: int) -> Envelope:
    return Envelope(run_id=RUN, tenant=TENANT, seq=seq, fence=1, at=at)


def answer(seq: int, at: int) -> ModelAnswered:
    return ModelAnswered(**env(seq, at), message=Message(role="assistant", content=f"a{seq}"))


async def _compacted_then_cut(world: World, *, agent: str = "booker") -> None:
    """Run ``RUN`` compacted logically to seq 4 (offset 3), then the log cut below offset 5
    by other means: seqs 4 and 5 are gone, 6 and 7 left."""
    now = time.time_ns() // 1_000
    # Old events, then recent ones the retention window keeps the point below.
    for event in [
        RunStarted(**env(1, 1), agent=agent, revision="r1" if agent else "", input="go"),
        RunClaimed(**env(2, 2), worker="w1"),
        answer(3, 3),
        TurnSettled(**env(4, now), iteration=1, call_ids=[]),
        answer(5, now + 1),
        TurnSettled(**env(6, now + 2), iteration=2, call_ids=[]),
        answer(7, now + 3),
    ]:
        await world.log.append([event])
    await world.fold()
    await CheckpointCompactor(world.log, world.frontiers, world.store, retention_mins=1.0).compact(
        run_id=RUN
    )
    point = (await world.store.truncations([RUN]))[RUN]
    assert (point.before_seq, point.before_offset) == (4, 3)
    assert point.whole == (not agent)
    # Retention removes the log up to offset 5 (seqs 4 and 5): seqs 6 and 7 are left.
    await world.log.truncate_before(0, 5)


async def test_events_past_a_moved_log_start_are_counted_not_refused(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    async with world_of(clustered, tmp_path) as world:
        await _compacted_then_cut(world)
        lines, span = await compacted_timeline(world.log, world.store, RUN, tenant=TENANT)
        assert span is not None
        shown = [
            (line.stored.event.seq, line.refused is None)
            for line in lines
            if line.stored is not None and not line.retained
        ]
        assert shown == [(6, True), (7, True)]


def test_replay_names_the_events_cut_past_the_point(tmp_path: Path) -> None:
    async def written() -> None:
        async with sqlite_world(tmp_path) as world:
            await _compacted_then_cut(world)

    asyncio.run(written())
    result = _replayed(tmp_path)
    assert result.exit_code == 0, result.output
    assert "the events from seq 4 before seq 6 (offset 5) were cut from the log" in " ".join(
        result.stderr.split()
    )
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(s["seq"], s["refused"]) for s in shown if not s["retained"]] == [
        (6, False),
        (7, False),
    ]


async def test_a_run_never_compacted_read_from_below_a_moved_log_start_is_refused(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    """No truncation point, and the log's start moved past the run's first events by other
    means: reading the run from its first offset is a hole, with a compaction store as
    without one, never the events left passed off as all of them."""
    async with world_of(clustered, tmp_path) as world:
        now = time.time_ns() // 1_000
        await world.log.append(
            [RunStarted(**env(1, now), agent="booker", revision="r1", input="go")]
        )
        for seq in range(2, 6):
            await world.log.append([answer(seq, now + seq)])
        first = (await world.log.read_run(RUN))[0].position.offset
        await world.log.truncate_before(0, first + 3)

        with pytest.raises(LogTruncatedError):
            await read_whole_run(world.log, None, RUN, start=first)
        with pytest.raises(LogTruncatedError):
            await read_whole_run(world.log, world.store, RUN, start=first)


async def test_a_run_never_compacted_read_from_below_a_compaction_cut_is_read_whole(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    """A cut of compaction's below the run's first event: the run has no point (no event of
    it was below the cut), and the log from its start holds all of it."""
    async with world_of(clustered, tmp_path) as world:
        now = time.time_ns() // 1_000
        other = Envelope(run_id="run-other", tenant=TENANT, seq=1, fence=1, at=now)
        (cut_at,) = await world.log.append(
            [RunStarted(**other, agent="booker", revision="r1", input="go")]
        )
        await world.log.append(
            [RunStarted(**env(1, now), agent="booker", revision="r1", input="go")]
        )
        await world.log.append([answer(2, now + 2)])
        end = cut_at.offset + 1
        await world.store.record_cut(
            LogCut(partition=0, start=0, end=end, events=end, archive=None, at=now)
        )
        await world.log.truncate_before(0, end)

        whole = await read_whole_run(world.log, world.store, RUN, start=0)
        assert [e.event.seq for e in whole] == [1, 2]


def test_replay_names_the_tail_cut_past_the_point_when_nothing_of_it_is_left(
    tmp_path: Path,
) -> None:
    """The log's start moved past the run's every event after its truncation point: the
    timeline holds only what compaction retained, and replay says the events from the point
    on were cut, never shows the retained ones as if they were the run's whole history."""

    async def written() -> None:
        async with sqlite_world(tmp_path) as world:
            await _compacted_then_cut(world)
            await world.log.truncate_before(0, 7)

    asyncio.run(written())
    result = _replayed(tmp_path)
    assert result.exit_code == 0, result.output
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(s["retained"] for s in shown)
    said = " ".join(result.stderr.split())
    assert "its events from seq 4 to 7 were cut from the log" in said, said


async def test_a_run_read_whole_past_a_moved_log_start_is_refused_not_read_with_a_hole(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    """A run read from its first event (no agent of Onward's own: a LangGraph thread) keeps
    every event below its point; the log's start then moved past the point by other means.
    Reading it whole gave seqs 1 to 3 then 6 and 7, 4 and 5 missing without a word, to a
    reader that folds or executes the run from its first event."""
    async with world_of(clustered, tmp_path) as world:
        await _compacted_then_cut(world, agent="")
        with pytest.raises(LogTruncatedError, match="seq 4"):
            await read_whole_run(world.log, world.store, RUN)


def test_replay_without_the_run_s_row_says_its_tail_may_have_been_cut(tmp_path: Path) -> None:
    """As above, but the run's frontier row, which says whether the run had events past its
    point, is missing (a frontier store restored from an older copy): replay showed the one
    retained event as the run's whole history without a word; it says the tail may be cut."""

    async def written() -> None:
        async with sqlite_world(tmp_path) as world:
            await _compacted_then_cut(world)
            await world.log.truncate_before(0, 7)

    asyncio.run(written())
    with sqlite3.connect(tmp_path / "onward.db") as db:
        db.execute("DELETE FROM onward_frontiers WHERE run_id = ?", (RUN,))
    result = _replayed(tmp_path)
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "its events from seq 4 on, if it had any, were cut from the log" in said, said


def _replayed(tmp_path: Path) -> Result:
    """``onward replay`` of the run, as JSON lines, on the embedded database in ``tmp_path``."""
    sqlite = {
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(tmp_path / "onward.db"),
        "ONWARD_PARTITIONS": "1",
    }
    return CliRunner().invoke(app, ["replay", RUN, "--tenant", TENANT, "--json"], env=sqlite)
