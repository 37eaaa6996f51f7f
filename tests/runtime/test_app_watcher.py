"""A fleet application's streams are watched for by one look at the log per poll
(`LogWatcher`), not each by its own: quiet streams read their run seldom, and the watcher wakes
each one within a poll of an append to its run.

PostgreSQL alone: the application in fleet mode, a worker serving the requests table in the
same process (it drives the runs; the application only reads the log), and a model that takes
seconds to answer, as a real one does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pytest
from support.deployment import postgres_fleet_settings
from support.servers import REQUEST_KEY

import onward
from onward.errors import BackendUnavailableError, ConfigurationError, RunTimeoutError
from onward.eventlog import MemoryEventLog, Message, RunFinished, RunStarted, Tagged
from onward.eventlog.base import Appended, EventLogBackend, partition_for
from onward.runtime.agent import Agent
from onward.runtime.application.stream import DEAF_MOST_S, SAY_UNHELD_AFTER_S
from onward.runtime.application.watcher import RETRY_S, WATCHED_NAP_S, LogWatcher
from onward.runtime.backends import open_backends
from onward.runtime.fleet.requests_postgres import PostgresRequests
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, reply
from onward.runtime.signing import RequestSigner
from onward.testing.leases import until

RUNS = 8
MODEL_S = 8.0
QUIET = (2.5, MODEL_S - 0.5)
"""The stretch after every run has started and before any model answers: nothing is appended."""

SLOW = Agent(name="slow", instructions="take your time")


class SlowModel:
    """Answers after ``MODEL_S`` seconds."""

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        await asyncio.sleep(MODEL_S)
        return reply("done")


@pytest.mark.timeout(120)
async def test_quiet_streams_of_a_fleet_app_look_seldom_and_are_woken_by_an_append(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = postgres_fleet_settings(database_url, pg_schema)
    in_process = settings.model_copy(update={"app_mode": "in_process"})
    stop = asyncio.Event()
    async with (
        open_backends(in_process) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
        onward.open(settings) as app,
    ):
        reads: dict[str, list[float]] = {}
        read_run = app.backends.log.read_run

        async def counted(run_id: str, **bounds: Any) -> Any:
            reads.setdefault(run_id, []).append(time.monotonic())
            return await read_run(run_id, **bounds)

        monkeypatch.setattr(app.backends.log, "read_run", counted)
        worker = Worker(backends, SlowModel(), {"slow": SLOW}, name="w", recheck_s=60)
        signer = RequestSigner(REQUEST_KEY)
        serving = asyncio.create_task(worker.serve_postgres(stop, requests=table, signer=signer))
        try:
            began = time.monotonic()
            run_ids = [f"slow-{n}" for n in range(RUNS)]
            streams = [
                app.query("go", {"agent": "slow", "run_id": run_id}, timeout=60)
                for run_id in run_ids
            ]

            async def result_at(stream: onward.RunStream) -> float:
                async for message in stream:
                    if message.type == "result":
                        return time.time()
                raise AssertionError(f"{stream.run_id} ended without a result")

            arrived = await asyncio.gather(*(result_at(stream) for stream in streams))
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
        ended = [[s.event for s in await backends.log.read_run(run_id)][-1] for run_id in run_ids]
    for run_id in run_ids:
        quiet = [t - began for t in reads[run_id] if QUIET[0] <= t - began < QUIET[1]]
        # Polling on its own it would read about every half second: ten times here.
        assert len(quiet) <= (QUIET[1] - QUIET[0]) // WATCHED_NAP_S + 1, (run_id, quiet)
    for run_id, event, at in zip(run_ids, ended, arrived, strict=True):
        assert isinstance(event, RunFinished), (run_id, event)
        # Woken by the watcher: a stream left to its own next look could wait WATCHED_NAP_S.
        assert at - event.at / 1e6 < 1.0, (run_id, at - event.at / 1e6)


class Unanswered(MemoryEventLog):
    """A log whose partition ends cannot be read while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__(partitions=4)
        self.down = True
        self.refused = asyncio.Event()

    async def ends(self, partitions: Collection[int]) -> dict[int, int]:
        if self.down:
            self.refused.set()
            raise BackendUnavailableError("the log did not answer")
        return await super().ends(partitions)


@pytest.mark.timeout(60)
async def test_closing_a_fleet_app_ends_its_waiting_streams_at_once_saying_it_closed(
    database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream napping while the watcher answers (no worker takes its start) ends as its
    app closes, not a `WATCHED_NAP_S` later, and says the app was closed rather than that it
    was never opened."""
    settings = postgres_fleet_settings(database_url, pg_schema)
    with caplog.at_level(logging.INFO, logger="onward.app"):
        async with onward.open(settings) as app:
            stream = app.query("go", {"agent": "slow", "run_id": "left"})
            reading = asyncio.create_task(anext(stream))
            # Said unheld, the stream naps on the watcher at once (no await in between).
            await until(
                lambda: any("nobody holds it" in r.getMessage() for r in caplog.records),
                within_s=SAY_UNHELD_AFTER_S + 5,
                what="the stream saying nobody holds its run",
            )
            assert not reading.done()
            closing = time.monotonic()
    with pytest.raises(ConfigurationError) as closed:
        await asyncio.wait_for(reading, WATCHED_NAP_S + 5)
    assert time.monotonic() - closing < 1.5
    assert "the app was closed" in str(closed.value)
    assert "not open" not in str(closed.value)


class Watched:
    """What the watcher needs of a stream."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.ended = False
        self.woken = asyncio.Event()
        self.vaguely = False

    def wake(self, *, vaguely: bool = False) -> None:
        self.vaguely = vaguely
        self.woken.set()


def answering(watcher: LogWatcher) -> bool:
    """Whether its last look was answered, read anew each time (not narrowed by a check)."""
    return watcher.answering


async def test_a_watcher_the_log_does_not_answer_says_so_once_and_wakes_every_stream_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = Unanswered()
    stream = Watched("r1")
    watcher = LogWatcher(log, interval_s=0.01, streams=lambda: [stream])  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING, logger="onward.app"):
        watcher.watch()
        await asyncio.wait_for(log.refused.wait(), 5)  # its first look failed
        assert not answering(watcher)  # streams look for themselves meanwhile
        log.down = False
        await asyncio.wait_for(stream.woken.wait(), 5)  # what moved meanwhile is unknown
        assert answering(watcher)
        stream.woken.clear()
        await log.append(
            [
                RunStarted(
                    run_id="r1", tenant="acme", seq=1, fence=1, agent="a", revision="r1", input="go"
                )
            ]
        )
        await asyncio.wait_for(stream.woken.wait(), 5)
        log.down = True
        await until(lambda: not answering(watcher), within_s=5, what="the watcher unanswered")
        stream.ended = True  # no live stream left: the watcher stops looking
        log.down = False
        await asyncio.sleep(RETRY_S + 0.2)
        assert not answering(watcher)  # it would answer again if it still looked
        await watcher.close()
    said = [r.getMessage() for r in caplog.records if "watching the log" in r.getMessage()]
    assert said == [
        "watching the log for 1 streams failed, each looks for itself until it answers "
        "again: the log did not answer"
    ]


async def test_the_watcher_wakes_the_streams_of_the_runs_appended_to_not_their_neighbours() -> None:
    log = MemoryEventLog(partitions=1)  # every run in one partition
    mine, neighbour = Watched("mine"), Watched("neighbour")
    watcher = LogWatcher(log, interval_s=0.01, streams=lambda: [mine, neighbour])  # type: ignore[list-item]
    watcher.watch()
    try:
        await asyncio.wait_for(mine.woken.wait(), 5)  # its first look: which runs is unknown
        await asyncio.wait_for(neighbour.woken.wait(), 5)
        mine.woken.clear()
        neighbour.woken.clear()
        for seq in range(1, 4):
            await log.append([_started("neighbour") if seq == 1 else _noted("neighbour", seq)])
            await asyncio.wait_for(neighbour.woken.wait(), 5)
            neighbour.woken.clear()
            assert not mine.woken.is_set()
        assert not neighbour.vaguely  # the log said which run was appended to
        await log.append([_started("mine")])
        await asyncio.wait_for(mine.woken.wait(), 5)
    finally:
        await watcher.close()


def _started(run_id: str) -> RunStarted:
    return RunStarted(
        run_id=run_id, tenant="acme", seq=1, fence=1, agent="a", revision="r1", input="go"
    )


def _noted(run_id: str, seq: int) -> Tagged:
    return Tagged(run_id=run_id, tenant="acme", seq=seq, fence=1, target_seq=1, label=f"n{seq}")


@pytest.mark.timeout(60)
async def test_a_stream_woken_vaguely_for_nothing_backs_its_wakes_off(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the log cannot say which runs were appended to (more than the watcher looks
    through), every stream of the partition is woken; one whose run had nothing new heeds the
    next such wake later and later, reading its run no more often than polling would."""
    async with onward.open(postgres_fleet_settings(database_url, pg_schema)) as app:
        log = app.backends.log
        assert isinstance(log, EventLogBackend)
        runs_appended = log.runs_appended

        async def unknown_runs(since: Mapping[int, int], **most: int) -> dict[int, Appended]:
            moved = await runs_appended(since, **most)
            return {p: Appended(appended.end, None) for p, appended in moved.items()}

        monkeypatch.setattr(log, "runs_appended", unknown_runs)
        reads: list[float] = []
        read_run = log.read_run

        async def counted(run_id: str, **bounds: Any) -> Any:
            if run_id == "quiet":
                reads.append(time.monotonic())
            return await read_run(run_id, **bounds)

        monkeypatch.setattr(log, "read_run", counted)
        busy = next(
            f"busy-{n}"
            for n in range(1000)
            if partition_for(f"busy-{n}", log.partitions) == partition_for("quiet", log.partitions)
        )
        waiting = asyncio.create_task(
            app.query("go", {"agent": "nobody", "run_id": "quiet"}, timeout=4).collect()
        )
        began = time.monotonic()
        await log.append([_started(busy)])
        seq = 1
        while time.monotonic() - began < 3.5:
            seq += 1
            await log.append([_noted(busy, seq)])
            await asyncio.sleep(0.02)
        with pytest.raises(RunTimeoutError):
            await waiting
    late = [t for t in reads if t - began >= 1.5]
    # Heeding every wake it would read 20 times a second; polling, about twice.
    assert len(late) <= 2 * 2 + 2, [round(t - began, 2) for t in reads]


class Failing(MemoryEventLog):
    """A log whose partition ends fail, while ``failing``, with an error no Onward error wraps
    (a driver's own that escaped translation, or a bug)."""

    def __init__(self) -> None:
        super().__init__(partitions=4)
        self.failing = False

    async def ends(self, partitions: Collection[int]) -> dict[int, int]:
        if self.failing:
            raise ConnectionResetError("the driver's own error")
        return await super().ends(partitions)


async def test_a_watcher_failing_with_an_unexpected_error_stops_answering_and_looks_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Streams nap up to `WATCHED_NAP_S` while the watcher answers: a watcher that died of an
    error other than the log's own, still said to answer, would leave them that slow for good."""
    log = Failing()
    stream = Watched("r1")
    watcher = LogWatcher(log, interval_s=0.01, streams=lambda: [stream])  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING, logger="onward.app"):
        watcher.watch()
        try:
            await asyncio.wait_for(stream.woken.wait(), 5)
            assert answering(watcher)
            log.failing = True
            # Not answering: streams look for themselves meanwhile.
            await until(lambda: not answering(watcher), within_s=5, what="the watcher unanswered")
            stream.woken.clear()
            log.failing = False
            await log.append([_started("r1")])
            await asyncio.wait_for(stream.woken.wait(), RETRY_S + 5)  # it went on looking
            assert answering(watcher)
        finally:
            await watcher.close()
    said = [r for r in caplog.records if "watching the log" in r.getMessage()]
    assert len(said) == 1
    assert said[0].exc_info is not None  # an error nobody expected: with its traceback


@pytest.mark.timeout(60)
async def test_a_wake_for_its_own_run_is_heeded_at_once_while_vague_wakes_are_backed_off(
    database_url: str, pg_schema: str
) -> None:
    """A stream backing off vague wakes (a busy partition's other runs) still reads its run
    as soon as it is woken for that run: the backing off is for wakes that may bring nothing,
    and one for its own run brings something."""
    async with onward.open(postgres_fleet_settings(database_url, pg_schema)) as app:
        stream = app.query("go", {"agent": "nobody", "run_id": "mine"})
        napping = asyncio.create_task(app.nap(stream, 10.0, heed_after_s=DEAF_MOST_S))
        await asyncio.sleep(0.05)
        woken = time.monotonic()
        stream.wake()  # its own run was appended to
        await asyncio.wait_for(napping, 10)
    assert time.monotonic() - woken < DEAF_MOST_S / 2
