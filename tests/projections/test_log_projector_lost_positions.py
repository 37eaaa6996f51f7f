"""A `LogProjector` (the embedded fold) whose store holds no position for a cut partition.

Compaction cuts a partition only below every live projector's stored position, so a frontier
store with none there while the partition no longer starts at 0 lost its positions (a
frontier file deleted or replaced, another store) and never folded what was cut. Folding from
the partition's start would fold runs from the middle of their history and store rows that are
not theirs (refused events, a finished run seen as never started): it refuses instead, as
`KafkaProjector` does (see test_projector_lost_positions.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onward.errors import LogTruncatedError
from onward.eventlog import SqliteEventLog
from onward.projections.base import DEFAULT_CONSUMER
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer
from onward.testing.eventlog import new_run_id, step_events


async def test_the_embedded_fold_refuses_a_cut_partition_its_store_has_no_position_for(
    tmp_path: Path,
) -> None:
    run_id = new_run_id()
    async with SqliteEventLog(tmp_path / "log.db", partitions=1) as log:
        await log.append(step_events(run_id, 8))
        async with SqliteFrontierStore(tmp_path / "first.db") as first:
            await Checkpointer(first, log).catch_up()
            row = await first.get(run_id)
            assert row is not None
            assert row.frontier is not None
        # Compaction cuts below the stored position; the frontier file is then lost.
        await log.truncate_before(0, 3)
        async with SqliteFrontierStore(tmp_path / "fresh.db") as store:
            with pytest.raises(LogTruncatedError) as refused:
                await Checkpointer(store, log).catch_up()
            stored = await store.get(run_id)
            assert stored is None, (
                f"a frontier folded from the middle of the run was stored: {stored}"
            )
            assert await store.positions(DEFAULT_CONSUMER) == {}
    assert (refused.value.partition, refused.value.start) == (0, 3)
    assert "no position" in str(refused.value)
    assert "--archive" in str(refused.value)


async def test_a_projector_with_a_position_at_or_above_the_start_folds_on(tmp_path: Path) -> None:
    run_id = new_run_id()
    async with (
        SqliteEventLog(tmp_path / "onward.db", partitions=2) as log,
        SqliteFrontierStore(tmp_path / "onward.db") as store,
    ):
        events = step_events(run_id, 8)
        await log.append(events[:5])
        checkpointer = Checkpointer(store, log)
        await checkpointer.catch_up()
        await log.truncate_before(next(iter(await store.positions(DEFAULT_CONSUMER))), 3)
        await log.append(events[5:])
        await Checkpointer(store, log).catch_up()
        row = await store.get(run_id)
        assert row is not None
        assert row.frontier is not None
        assert row.frontier.last_seq == 8
        assert row.frontier.refused == 0


async def test_a_rebuild_folds_from_the_log_start_when_told_to(tmp_path: Path) -> None:
    """What `onward projections rebuild` does, having checked the cut is archived or absent."""
    run_id = new_run_id()
    async with (
        SqliteEventLog(tmp_path / "log.db", partitions=1) as log,
        SqliteFrontierStore(tmp_path / "fresh.db") as store,
    ):
        await log.append(step_events(run_id, 8))
        await log.truncate_before(0, 3)
        projector = LogProjector(log, FrontierProjection(store, log), from_log_start=True)
        assert await projector.catch_up() == 5
        assert await store.positions(DEFAULT_CONSUMER) == {0: 8}
