"""A tag below a run's truncation point is refused: compaction removed the event, so nothing
could retain it. Through `AgentRunner.tag` and `onward tag --seq N`, on the embedded SQLite
deployment and on Kafka + PostgreSQL + Redis; the refusal writes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from support.compaction_world import (
    TENANT,
    Script,
    World,
    kafka_stores,
    sqlite_world,
)
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

from onward.errors import InvalidInputError
from onward.eventlog import Tagged, TurnSettled
from onward.runtime import AgentRunner
from onward.runtime.cli import app
from onward.runtime.compaction import CheckpointCompactor

DONE = "done"
LIVE = "long"


async def compacted(world: World) -> tuple[int, int]:
    """A finished run and a live one, the live one's first boundary tagged, compacted (cut
    without an archive) keeping one untagged boundary. Returns the live run's truncation point
    and the tagged seq."""
    await world.finished_run(DONE, turns=2)
    await world.live_run(LIVE, turns=8, done=5)
    settled = [
        s.event.seq for s in await world.log.read_run(LIVE) if isinstance(s.event, TurnSettled)
    ]
    tagged = await world.runner(Script(0)).tag(LIVE, "first", tenant=TENANT, seq=settled[0])
    await world.fold()
    compactor = CheckpointCompactor(
        world.log, world.frontiers, world.store, no_archive=True, max_checkpoints=1
    )
    await compactor.compact()
    await world.fold()
    points = await world.store.truncations([DONE, LIVE])
    assert set(points) == {DONE, LIVE}
    assert points[LIVE].before_seq > tagged + 1  # something untagged below the cut
    # The tagged event, the Tagged event itself, and the last untagged resume point.
    kept = {r.seq: r.kept_as for r in await world.store.retained(LIVE)}
    tag_event = points[LIVE].before_seq - 1
    assert kept == {tagged: "tag", tag_event: "tag", settled[-1]: "checkpoint"}
    return points[LIVE].before_seq, tagged


async def tags_below_the_cut_are_refused(
    world: World, tagger: AgentRunner, cli: Callable[..., Result]
) -> None:
    cut, tagged = await compacted(world)
    done_cut = (await world.store.truncations([DONE]))[DONE].before_seq
    written = {run_id: len(await world.log.read_run(run_id)) for run_id in (DONE, LIVE)}
    retained = (await world.store.retained_seqs([LIVE]))[LIVE]
    below = max(seq for seq in range(1, cut) if seq not in retained)
    assert below != tagged

    with pytest.raises(InvalidInputError) as refused:
        await tagger.tag(LIVE, "late", tenant=TENANT, seq=below)
    says = str(refused.value)
    assert repr(LIVE) in says
    assert f"event {below} " in says
    assert f"truncation point {cut}" in says
    # A finished run's point is past its last event: its whole history was compacted.
    with pytest.raises(InvalidInputError, match=f"truncation point {done_cut}"):
        await tagger.tag(DONE, "late", tenant=TENANT, seq=1)

    result = await asyncio.to_thread(cli, "tag", LIVE, "late", "--tenant", TENANT, "--seq", "1")
    assert result.exit_code == 2, result.output
    assert f"run {LIVE!r}: event 1 is below its truncation point {cut}" in result.stderr
    assert "could never be retained" in result.stderr

    # Nothing was written by any refusal.
    await world.fold()
    assert {r: len(await world.log.read_run(r)) for r in (DONE, LIVE)} == written
    rows = await world.frontiers.load([DONE, LIVE])
    live = rows[LIVE].frontier
    done = rows[DONE].frontier
    assert live is not None
    assert done is not None
    assert [(t.seq, t.label) for t in live.tags] == [(tagged, "first")]
    assert done.tags == ()

    # A retained event takes another tag; a retained resume point becomes a tagged one, so
    # no later pass drops it with the resume points it no longer keeps.
    before = {r.seq: r.kept_as for r in await world.store.retained(LIVE)}
    (checkpoint,) = [seq for seq, kept_as in before.items() if kept_as == "checkpoint"]
    assert await tagger.tag(LIVE, "again", tenant=TENANT, seq=tagged) == tagged
    assert await tagger.tag(LIVE, "kept", tenant=TENANT, seq=checkpoint) == checkpoint
    appended = [s.event for s in await world.log.read_run(LIVE)][-2:]
    assert [(e.target_seq, e.label) for e in appended if isinstance(e, Tagged)] == [
        (tagged, "again"),
        (checkpoint, "kept"),
    ]
    assert {r.seq: r.kept_as for r in await world.store.retained(LIVE)} == {
        **before,
        checkpoint: "tag",
    }


async def test_sqlite_refuses_a_tag_below_the_cut(tmp_path: Path) -> None:
    env = {
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(tmp_path / "onward.db"),
        "ONWARD_PARTITIONS": "1",
    }

    def cli(*args: str) -> Result:
        return CliRunner().invoke(app, list(args), env=env)

    async with sqlite_world(tmp_path) as world:
        # No compaction store named: the SQLite log brings its own.
        await tags_below_the_cut_are_refused(world, world.runner(Script(0)), cli)


@pytest.mark.kafka
async def test_kafka_postgres_refuses_a_tag_below_the_cut(kafka_servers: KafkaServers) -> None:
    env = kafka_servers.env(partitions=1)

    def cli(*args: str) -> Result:
        return CliRunner().invoke(app, list(args), env=env)

    async with kafka_stores(kafka_servers) as world:
        tagger = AgentRunner(
            provider=Script(0),
            log=world.log,
            frontiers=world.frontiers,
            leases=world.leases,
            compaction=world.store,
        )
        await tags_below_the_cut_are_refused(world, tagger, cli)
