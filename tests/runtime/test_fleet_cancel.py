"""A cancel reaches a full worker: the run it cancels is what would free a slot.

A worker at its ``max_runs`` reads no requests (its partitions are paused), so a cancel queued
behind a start waiting for a slot would wait for a run that never ends by itself. Real Kafka,
PostgreSQL and Redis; the worker is built in the test's process with two slots.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from support.appapi import agents, provider, until
from support.deployment import kafka_settings
from support.fleet_checks import has_status, same_partition_runs, status_of, ticked
from support.servers import KafkaServers
from support.serving import serving

import onward
from onward.eventlog.base import partition_for
from onward.runtime.backends import open_backends
from onward.runtime.demo_ledger import Ledger
from onward.runtime.fleet import worker as worker_module
from onward.runtime.fleet.requests import CancelRun, Requests, StartRun
from onward.runtime.fleet.worker import Worker

pytestmark = pytest.mark.kafka
PARTITIONS = 2
TENANT = "acme"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Ledger(tmp_path / "ledger.jsonl")


def same_partition_as(run_id: str, prefix: str) -> str:
    """A run id starting with ``prefix`` whose requests share ``run_id``'s partition."""
    (found,) = same_partition_runs(run_id, prefix, 1, PARTITIONS)
    return found


async def test_a_full_worker_acts_on_cancels_queued_behind_a_start_waiting_for_a_slot(
    kafka_servers: KafkaServers, requests_topic: str, ledger: Ledger
) -> None:
    """Two runaway runs fill the worker; a start waits behind them, and behind the start, in
    its partition, a cancel of a run waiting on a person: it is acted on, and no commit
    passes the start. The cancel of a runaway then frees the slot the start takes."""
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    tag = uuid.uuid4().hex[:8]
    waiting_on_person = f"pay-{tag}"
    start_waiting = same_partition_as(waiting_on_person, f"work-{tag}")
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)

        def has(run_id: str, wanted: str) -> Callable[[], Awaitable[bool]]:
            return has_status(worker, run_id, wanted, tenant=TENANT)

        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
            Requests(
                kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
            ) as requests,
        ):
            await requests.submit(
                StartRun(run_id=waiting_on_person, tenant=TENANT, agent="payer", input="5")
            )
            await until(has(waiting_on_person, "waiting"), "the run waiting on a person")
            runaways = [f"loop-{tag}-{n}" for n in range(2)]
            for runaway in runaways:
                await requests.submit(StartRun(run_id=runaway, tenant=TENANT, agent="looper"))
            await until(lambda: ticked(ledger, 6), "the runaway runs going")
            where = TopicPartition(requests_topic, partition_for(start_waiting, PARTITIONS))
            held_up_at = await _end_offset(kafka_servers.bootstrap, where)
            await requests.submit(
                StartRun(run_id=start_waiting, tenant=TENANT, agent="stepper"),
                CancelRun(run_id=waiting_on_person, tenant=TENANT, by="ops"),
            )
            await until(has(waiting_on_person, "cancelled"), "the cancel behind the start")
            assert (
                await status_of(worker, start_waiting, TENANT) is None
            )  # still waiting for a slot
            committed = await _committed(
                kafka_servers.bootstrap, f"{requests_topic}.workers", where
            )
            assert committed is None or committed <= held_up_at  # the start stays owed

            await requests.submit(CancelRun(run_id=runaways[0], tenant=TENANT, by="ops"))
            await until(has(runaways[0], "cancelled"), "the cancel of a runaway")
            await until(has(start_waiting, "completed"), "the start it held up")
            await requests.submit(CancelRun(run_id=runaways[1], tenant=TENANT, by="ops"))
            await until(has(runaways[1], "cancelled"), "the cancel of the other")
        assert task.exception() is None
    ticks = sorted((e["key"], e["n"]) for e in ledger.entries() if e["tool"] == "tick")
    assert len(ticks) == len(set(ticks))  # every tick once
    assert [e["n"] for e in ledger.entries() if e["tool"] == "step"] == [1, 2, 3]
    assert ledger.count("pay") == 0
    assert worker.stats.statuses == {"waiting": 1, "cancelled": 3, "completed": 1}


@pytest.mark.parametrize("peek_records", [3, worker_module._PEEK_RECORDS])
async def test_a_full_worker_reaches_a_cancel_behind_many_starts_and_starts_them_all(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
    peek_records: int,
) -> None:
    """Eight starts wait for a slot, a cancel of a runaway behind them. A full worker's peek
    reads at most ``peek_records``: each reads on from where the one before stopped, so the
    cancel is reached even behind more than one peek reads. Then every one of the eight
    starts is acted on: the cancel's commit does not pass the starts the peek read over."""
    monkeypatch.setattr(worker_module, "_PEEK_RECORDS", peek_records)
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    tag = uuid.uuid4().hex[:8]
    runaways = [f"loop-{tag}-{n}" for n in range(2)]
    waiting = same_partition_runs(runaways[0], f"work-{tag}", 8, PARTITIONS)
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)

        def has(run_id: str, wanted: str) -> Callable[[], Awaitable[bool]]:
            return has_status(worker, run_id, wanted, tenant=TENANT)

        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
            Requests(
                kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
            ) as requests,
        ):
            for runaway in runaways:
                await requests.submit(StartRun(run_id=runaway, tenant=TENANT, agent="looper"))
            await until(lambda: ticked(ledger, 6), "the runaway runs going")
            await requests.submit(
                *(StartRun(run_id=run_id, tenant=TENANT, agent="stepper") for run_id in waiting),
                CancelRun(run_id=runaways[0], tenant=TENANT, by="ops"),
            )
            await until(has(runaways[0], "cancelled"), "the cancel behind eight starts")
            for run_id in waiting:
                await until(has(run_id, "completed"), f"the start of {run_id}")
            await requests.submit(CancelRun(run_id=runaways[1], tenant=TENANT, by="ops"))
            await until(has(runaways[1], "cancelled"), "the cancel of the other runaway")
        assert task.exception() is None
    assert worker.stats.statuses == {"cancelled": 2, "completed": 8}


async def test_a_cancel_that_finds_its_run_cancelled_already_is_no_warning(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`onward cancel --wait` asks the run's holder through the lease and sends the fleet a
    `CancelRun` too: whichever reaches the run second finds it cancelled, which is said as
    such, not warned about. A cancel of a run that completed is still a warning."""
    caplog.set_level(logging.INFO, logger="onward.worker")
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    tag = uuid.uuid4().hex[:8]
    runaway, finished = f"loop-{tag}", f"work-{tag}"
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)

        def said(text: str) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return any(text in r.getMessage() for r in caplog.records)

            return check

        async def has(run_id: str, wanted: str) -> bool:
            return (await worker.runner.inspect(run_id, tenant=TENANT)).status == wanted

        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
            Requests(
                kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
            ) as requests,
        ):
            await requests.submit(StartRun(run_id=runaway, tenant=TENANT, agent="looper"))
            await requests.submit(StartRun(run_id=finished, tenant=TENANT, agent="stepper"))
            await until(lambda: ticked(ledger, 3), "the runaway run going")
            assert await worker.runner.ask_to_cancel(runaway, tenant=TENANT, by="ops", why="x")
            await until(lambda: has(runaway, "cancelled"), "the holder ending the run it was asked")
            await until(lambda: has(finished, "completed"), "the other run's end")
            await requests.submit(
                CancelRun(run_id=runaway, tenant=TENANT, by="ops", why="x"),
                CancelRun(run_id=finished, tenant=TENANT, by="ops"),
            )
            await until(said(f"run {runaway}: cancelled already"), "the first cancel handled")
            await until(said(f"run {finished}: not cancelled here"), "the second handled")
        assert task.exception() is None
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m for m in warned if runaway in m] == []
    assert [m for m in warned if finished in m] == [
        f"run {finished}: not cancelled here: run {finished!r} has ended already (completed)"
    ]


async def test_an_app_cancels_its_start_no_worker_has_taken_yet(
    kafka_servers: KafkaServers, requests_topic: str, ledger: Ledger
) -> None:
    """A fleet app starts a run while no worker takes it yet (every worker full, or none up)
    and cancels it: `App.cancel` raised NothingToResumeError ("no such run") and the start,
    taken later, ran on for as long as it would. The cancel is sent behind its start, on the
    run's partition: the worker that takes the start ends the run cancelled."""
    settings = kafka_settings(
        kafka_servers, PARTITIONS, app_mode="fleet", requests_topic=requests_topic
    )
    run_id = f"loop-{uuid.uuid4().hex[:8]}"
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with onward.open(settings, tenant=TENANT) as app:
        stream = app.query("loop", {"agent": "looper", "run_id": run_id})
        reading = asyncio.create_task(stream.collect())

        async def sent() -> bool:
            return stream.sent

        try:
            await until(sent, "the start sent")
            await app.cancel(run_id, by="ops", why="not wanted after all")
            async with open_backends(kafka_settings(kafka_servers, PARTITIONS)) as backends:
                worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)
                async with serving(
                    worker, kafka_servers.bootstrap, requests_topic, signer=kafka_servers.signer()
                ) as task:
                    messages = await asyncio.wait_for(reading, 60)
                assert task.exception() is None
        finally:
            reading.cancel()
    assert (messages[-1].type, messages[-1].status) == ("error", "cancelled")
    assert "ops" in messages[-1].content


async def _end_offset(bootstrap: str, where: TopicPartition) -> int:
    """The offset the next record of the partition gets."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([where])
        return int(ends[where])
    finally:
        await consumer.stop()


async def _committed(bootstrap: str, group: str, where: TopicPartition) -> int | None:
    """The group's committed offset of the partition, if any."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        committed = await consumer.committed(where)
        return None if committed is None else int(committed)
    finally:
        await consumer.stop()
