"""langgraph#8796 as a test: a paused writer comes back after another took its thread over.

Worker A (a real subprocess) writes a thread, is stopped with SIGSTOP past its lease's ttl,
worker B takes the thread over and writes, A is thawed and writes again. A is told
(`FencedError`), whatever A got into the log after B's claim is refused by every reader, the
thread does not fork, and ``get_tuple`` returns B's state.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from support.servers import KafkaServers

from onward.errors import FencedError, ResumeConflictError
from onward.eventlog import Event, EventLog, Position, Refusal, RunClaimed
from onward.integrations.langgraph import OnwardSaver, ThreadState
from onward.runtime.leases import LeasePolicy
from onward.testing.eventlog import WrappedEventLog
from onward.testing.leases import GatedRenewals, until_lapsed

from .graphs import config, steps_graph
from .worlds import TENANT, World, kafka_spec, kafka_world, sqlite_spec, sqlite_world

TESTS = Path(__file__).resolve().parents[2]
TTL_S = 1.5


@asynccontextmanager
async def worker_a(
    spec: dict[str, str], thread_id: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "integrations.langgraph.fence_child",
        json.dumps(spec),
        thread_id,
        str(TTL_S),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )
    try:
        assert await _line(child) == "ready"
        yield child
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
        await child.wait()


async def _line(child: asyncio.subprocess.Process) -> str:
    assert child.stdout is not None
    return (await asyncio.wait_for(child.stdout.readline(), 30)).decode().strip()


async def _send(child: asyncio.subprocess.Process, command: str) -> None:
    assert child.stdin is not None
    child.stdin.write(f"{command}\n".encode())
    await child.stdin.drain()


async def _step(child: asyncio.subprocess.Process) -> str:
    await _send(child, "step")
    return await _line(child)


def _assert_no_fork(state: ThreadState) -> None:
    saved = state.checkpoints[""]
    parents = [e.parent_checkpoint_id for e in saved.values()]
    assert len(parents) == len(set(parents)), "two checkpoints share a parent: the thread forked"


async def _scenario(world: World, spec: dict[str, str]) -> None:
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with worker_a(spec, thread_id) as a:
        assert await _step(a) == "ok"
        await _send(a, "pause")
        assert await _line(a) == "in-node"  # A is in the middle of its second graph run
        a.send_signal(signal.SIGSTOP)
        await until_lapsed(world.leases, thread_id, ttl_s=TTL_S)  # by the store's clock

        async with world.saver(holder="worker-b", ttl_s=30) as saver_b:
            graph_b = steps_graph("B", saver_b)
            await graph_b.ainvoke({"steps": []}, config(thread_id))
            claim_b = (await saver_b.aread_thread(thread_id)).fence

            a.send_signal(signal.SIGCONT)
            assert await _line(a) == "fenced"  # its run's next write is refused
            # A new invocation reads the thread first; B holds it, so A waits its turn.
            assert await _step(a) == "error ResumeConflictError"

            await graph_b.ainvoke({"steps": []}, config(thread_id))
            # B's own view (read-your-writes) and a fresh reader's agree.
            mine = await graph_b.aget_state(config(thread_id))
            assert mine.values["steps"] == ["A", "B", "B"]

    async with world.saver(holder="reader") as reader:
        state = await reader.aread_thread(thread_id)
        latest = await reader.aget_tuple(config(thread_id))
        assert latest is not None
        assert latest.checkpoint["channel_values"]["steps"] == ["A", "B", "B"]
        _assert_no_fork(state)
        await _assert_late_writes_refused(world, state, thread_id, claim_b)


async def _assert_late_writes_refused(
    world: World, state: ThreadState, thread_id: str, claim: int
) -> None:
    """Exactly what a lower fence appended after the claim under ``claim`` is refused."""
    stored = await world.log.read_run(thread_id)
    claimed_at = next(
        s.position.offset
        for s in stored
        if isinstance(s.event, RunClaimed) and s.event.fence == claim
    )
    late = [s.position for s in stored if s.position.offset > claimed_at and s.event.fence < claim]
    assert [r.stored.position for r in state.refused] == late
    assert all(r.reason is Refusal.SUPERSEDED_FENCE for r in state.refused)


@pytest.mark.slow
async def test_paused_writer_is_fenced_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    async with sqlite_world(path) as world:
        await _scenario(world, sqlite_spec(path))


@pytest.mark.kafka
@pytest.mark.slow
async def test_paused_writer_is_fenced_on_kafka_postgres_redis(
    kafka_servers: KafkaServers,
) -> None:
    async with kafka_world(*kafka_servers) as world:
        await _scenario(world, kafka_spec(*kafka_servers))


class HeldAppends(WrappedEventLog):
    """A log whose appends wait while ``sending`` is clear: a write already on its way (its
    lease checked, still within its ttl) that lands late.

    Attributes:
        waiting: Set once an append is waiting.
    """

    def __init__(self, inner: EventLog, sending: asyncio.Event) -> None:
        super().__init__(inner)
        self.sending = sending
        self.waiting = asyncio.Event()

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if not self.sending.is_set():
            self.waiting.set()
            await self.sending.wait()
        return await super().append(events)


async def _takeover_unnoticed(world: World) -> None:
    """A's write lands after B's claim (A has not heard yet): refused, and A is told after.

    A checks its lease (still within its ttl) and sends a write that is held up in flight
    until its lease has lapsed and B has claimed the thread: the one way a lower fence still
    reaches the log once a holder stops itself at the first write past its ttl."""
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    # A's renewals (and the confirmation after each append) wait while the gate is shut: a
    # writer whose process was paused, whose writes go on but cannot hear the store.
    thawed = asyncio.Event()
    thawed.set()
    sending = asyncio.Event()
    sending.set()
    log_a = HeldAppends(world.log, sending)
    saver_a = OnwardSaver(
        log_a,
        GatedRenewals(world.leases, thawed),
        tenant=TENANT,
        holder="worker-a",
        policy=LeasePolicy(ttl=timedelta(seconds=TTL_S)),
    )
    async with saver_a:
        graph_a = steps_graph("A", saver_a)
        await graph_a.ainvoke({"steps": []}, config(thread_id))
        thawed.clear()
        sending.clear()
        stale = asyncio.create_task(graph_a.ainvoke({"steps": []}, config(thread_id)))
        await asyncio.wait_for(log_a.waiting.wait(), 10)  # A's write is on its way
        await until_lapsed(world.leases, thread_id, ttl_s=TTL_S)  # by the store's clock

        async with world.saver(holder="worker-b", ttl_s=30) as saver_b:
            graph_b = steps_graph("B", saver_b)
            await graph_b.ainvoke({"steps": []}, config(thread_id))
            claim_b = (await saver_b.aread_thread(thread_id)).fence

            sending.set()  # A's write lands, after B's claim
            while not (await saver_b.aread_thread(thread_id)).refused:  # noqa: ASYNC110 - the log is what we watch
                await asyncio.sleep(0.05)
            thawed.set()
            with pytest.raises(FencedError):
                await stale
            assert not saver_a.holds(thread_id)
            # The fenced run cannot claim the thread back and carry on from its stale state...
            head = await saver_b.aget_tuple(config(thread_id))
            assert head is not None
            with pytest.raises(FencedError):
                await saver_a.aput_writes(head.config, [("steps", ["A"])], "late-task")
            # ...while a new invocation, which reads the thread first, just waits its turn.
            assert await saver_a.aget_tuple(config(thread_id)) == head
            with pytest.raises(ResumeConflictError):
                await saver_a.aput_writes(head.config, [("steps", ["A"])], "late-task")

            state = await saver_b.aread_thread(thread_id)
            assert state.refused
            await _assert_late_writes_refused(world, state, thread_id, claim_b)
            _assert_no_fork(state)
            for reader in (saver_b, saver_a):  # the writer, and the fenced one reading afresh
                latest = await reader.aget_tuple(config(thread_id))
                assert latest is not None
                assert latest.checkpoint["channel_values"]["steps"] == ["A", "B"]


async def test_write_after_takeover_is_refused_on_sqlite(tmp_path: Path) -> None:
    async with sqlite_world(tmp_path / "onward.db") as world:
        await _takeover_unnoticed(world)


@pytest.mark.kafka
async def test_write_after_takeover_is_refused_on_kafka_postgres_redis(
    kafka_servers: KafkaServers,
) -> None:
    async with kafka_world(*kafka_servers) as world:
        await _takeover_unnoticed(world)
