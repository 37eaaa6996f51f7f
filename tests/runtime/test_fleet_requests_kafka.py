"""What a Kafka worker does with the records of its requests topic when things are not simple:
a record anyone on the topic could write, a cancel a full worker read ahead for, a cancel
behind its own run's start, and a start that meets a store outage. Real Kafka, PostgreSQL and
Redis; the worker is built in the test's own process.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from aiokafka import AIOKafkaProducer
from support.appapi import agents, provider, until
from support.deployment import kafka_settings
from support.fleet_checks import (
    SlowListings,
    has_status,
    same_partition_runs,
    status_of,
    ticked,
)
from support.proxy import TcpProxy
from support.servers import REQUEST_KEY, KafkaServers
from support.serving import serving

from onward.errors import NothingToResumeError
from onward.eventlog.base import partition_for
from onward.runtime.backends import open_backends
from onward.runtime.demo_ledger import Ledger
from onward.runtime.fleet import worker as worker_module
from onward.runtime.fleet.requests import CancelRun, Requests, StartRun, encode_request
from onward.runtime.fleet.worker import Worker
from onward.runtime.settings import SecretUrl
from onward.runtime.signing import SIGNATURE_HEADER, RequestSigner

pytestmark = pytest.mark.kafka
PARTITIONS = 2
TENANT = "acme"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Ledger(tmp_path / "ledger.jsonl")


async def test_a_signature_header_with_no_value_is_set_aside_not_fatal(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Anyone who can write the topic can write a record whose ``onward-signature`` header
    has a null value (Kafka headers may). It is set aside like any record whose signature
    does not check: the worker goes on serving, and a good start after it on the same
    partition runs."""
    caplog.set_level(logging.WARNING, logger="onward.worker")
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    good = f"work-{uuid.uuid4().hex[:8]}"
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)

        def has(run_id: str, wanted: str) -> Callable[[], Awaitable[bool]]:
            return has_status(worker, run_id, wanted, tenant=TENANT, serving=lambda: task)

        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
            Requests(
                kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
            ) as requests,
        ):
            forged = StartRun(run_id=f"forged-{good}", tenant=TENANT, agent="stepper")
            producer = AIOKafkaProducer(bootstrap_servers=kafka_servers.bootstrap)
            await producer.start()
            try:
                await producer.send_and_wait(
                    requests_topic,
                    encode_request(forged),
                    key=forged.run_id.encode(),
                    partition=partition_for(good, PARTITIONS),
                    headers=[(SIGNATURE_HEADER, None)],
                )
            finally:
                await producer.stop()
            await requests.submit(StartRun(run_id=good, tenant=TENANT, agent="stepper"))
            await until(has(good, "completed"), "the good start after the forged record")
            await asyncio.sleep(0)
        assert task.exception() is None
        assert worker.stats.set_aside == 1
        with pytest.raises(NothingToResumeError):
            await worker.runner.inspect(forged.run_id, tenant=TENANT)


def same_partition_as(run_id: str, prefix: str) -> str:
    """A run id starting with ``prefix`` whose requests share ``run_id``'s partition."""
    (found,) = same_partition_runs(run_id, prefix, 1, PARTITIONS)
    return found


async def test_a_cancel_read_ahead_by_a_full_worker_is_not_taken_again_while_in_flight(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full worker reads ahead for cancels past a start waiting for a slot. One of them is
    of a run another holds: it stays in flight, asked again after each backoff. Slots free,
    the worker reads on from the waiting start, and reads that cancel again: it is not taken
    a second time (one task acts on it, and nothing finds the run cancelled already)."""
    caplog.set_level(logging.INFO, logger="onward.worker")
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    tag = uuid.uuid4().hex[:8]
    held = f"pay-{tag}"
    start_waiting = same_partition_as(held, f"work-{tag}")
    runaways = [f"loop-{tag}-{n}" for n in range(2)]
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)
        most_tasks_of_held = 0

        def has(run_id: str, wanted: str) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                nonlocal most_tasks_of_held
                tasks = sum(1 for t in worker._runs.values() if t.get_name() == f"run {held}")
                most_tasks_of_held = max(most_tasks_of_held, tasks)
                try:
                    return (await worker.runner.inspect(run_id, tenant=TENANT)).status == wanted
                except NothingToResumeError:
                    return False

            return check

        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
            Requests(
                kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
            ) as requests,
        ):
            await requests.submit(StartRun(run_id=held, tenant=TENANT, agent="payer", input="5"))
            await until(has(held, "waiting"), "the run waiting on a person")
            await until(lambda: _nothing_in_flight(worker), "the payer's task ending")
            lease = await backends.leases.acquire(
                held, tenant=TENANT, holder="someone-else", ttl_s=120
            )
            for runaway in runaways:
                await requests.submit(StartRun(run_id=runaway, tenant=TENANT, agent="looper"))
            await until(lambda: ticked(ledger, 6), "the runaway runs going")
            conflicts = worker.stats.conflicts
            await requests.submit(
                StartRun(run_id=start_waiting, tenant=TENANT, agent="stepper"),
                CancelRun(run_id=held, tenant=TENANT, by="ops"),
            )
            await until(
                lambda: _more_conflicts(worker, conflicts), "the cancel of the held run in flight"
            )
            for runaway in runaways:
                await requests.submit(CancelRun(run_id=runaway, tenant=TENANT, by="ops"))
            for runaway in runaways:
                await until(has(runaway, "cancelled"), f"the cancel of {runaway}")
            await until(has(start_waiting, "completed"), "the start that waited")
            for _ in range(20):  # the held run's cancel asked again a few times meanwhile
                await has(held, "waiting")()
                await asyncio.sleep(0.05)
            await backends.leases.release(lease)
            await until(has(held, "cancelled"), "the cancel of the held run")
            await until(lambda: _nothing_in_flight(worker), "every task of the worker ending")
        assert task.exception() is None
    assert most_tasks_of_held == 1
    assert f"run {held}: cancelled already" not in caplog.text
    assert f"run {held}: not cancelled here" not in caplog.text


async def _nothing_in_flight(worker: Worker) -> bool:
    return worker.in_flight == 0


async def _more_conflicts(worker: Worker, than: int) -> bool:
    return worker.stats.conflicts > than


async def test_a_start_that_meets_a_lease_store_outage_is_not_dropped(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's way to Redis (its leases) is cut when a start arrives: the start cannot
    be acted on now, which is no reason to refuse it for good. Once Redis answers again the
    run starts and completes; the start is not dropped (nor committed) meanwhile."""
    caplog.set_level(logging.WARNING, logger="onward.worker")
    signer = kafka_servers.signer()
    run_id = f"work-{uuid.uuid4().hex[:8]}"
    parts = urlsplit(kafka_servers.redis_url)
    assert parts.hostname is not None
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with TcpProxy(parts.hostname, parts.port or 6379) as proxy:
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        proxied = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
        settings = kafka_settings(
            kafka_servers, PARTITIONS, requests_topic=requests_topic
        ).model_copy(update={"redis_url": SecretUrl(proxied)})
        async with open_backends(settings) as backends:
            worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)

            async def completed() -> bool:
                try:
                    return (await worker.runner.inspect(run_id, tenant=TENANT)).status == (
                        "completed"
                    )
                except NothingToResumeError:
                    return False

            async with (
                serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
                Requests(
                    kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
                ) as requests,
            ):
                await proxy.cut()
                await requests.submit(StartRun(run_id=run_id, tenant=TENANT, agent="stepper"))
                # The worker reads the start while Redis is cut, and tries it again.
                tried = f"StartRun of run {run_id} not acted on yet"

                async def tried_twice() -> bool:
                    return caplog.text.count(tried) >= 2

                await until(tried_twice, "two tries of the start while Redis is cut")
                await proxy.restore()
                deadline = asyncio.get_running_loop().time() + 30
                while not await completed():
                    assert asyncio.get_running_loop().time() < deadline, caplog.text
                    await asyncio.sleep(0.2)
            assert task.exception() is None
    assert "StartRun refused for good" not in caplog.text


async def test_a_start_that_expired_while_a_store_did_not_answer_is_set_aside(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis (the leases) is cut for longer than the max age when a start arrives: the
    application's stream has told its user to send the start again meanwhile, so starting it
    once Redis answers would do the work twice. Its age is checked again before each try: the
    start is set aside as expired, and nothing of it is written."""
    caplog.set_level(logging.WARNING, logger="onward.worker")
    signer = RequestSigner(REQUEST_KEY, max_age_s=2)
    run_id = f"late-{uuid.uuid4().hex[:8]}"
    parts = urlsplit(kafka_servers.redis_url)
    assert parts.hostname is not None
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with TcpProxy(parts.hostname, parts.port or 6379) as proxy:
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        proxied = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
        settings = kafka_settings(
            kafka_servers, PARTITIONS, requests_topic=requests_topic
        ).model_copy(update={"redis_url": SecretUrl(proxied)})
        async with open_backends(settings) as backends:
            worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)
            async with (
                serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
                Requests(
                    kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
                ) as requests,
            ):
                await proxy.cut()
                await requests.submit(StartRun(run_id=run_id, tenant=TENANT, agent="stepper"))
                # Read and tried while Redis is cut, until past its max age.
                deadline = asyncio.get_running_loop().time() + 30
                while not worker.stats.set_aside:
                    assert asyncio.get_running_loop().time() < deadline, caplog.text
                    await asyncio.sleep(0.05)
                await proxy.restore()
                while worker.in_flight:
                    assert asyncio.get_running_loop().time() < deadline, caplog.text
                    await asyncio.sleep(0.2)
                await asyncio.sleep(1)
                written = await backends.log.read_run(run_id)
            assert task.exception() is None
    assert written == []
    assert worker.stats.set_aside == 1
    assert "set aside: request not acted on: expired" in caplog.text


async def test_a_full_worker_does_not_act_on_a_cancel_before_its_run_s_start(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run's requests are acted on in the order they were stored. A start waits for a slot
    behind a full worker, and its run's cancel behind it: the cancel is not acted on before
    the start (it would find no run, and the start would run uncancelled after it). Once a
    slot frees, the run starts and the cancel ends it."""
    caplog.set_level(logging.INFO, logger="onward.worker")
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    tag = uuid.uuid4().hex[:8]
    runaways = [f"loop-{tag}-{n}" for n in range(2)]
    unwanted = f"unwanted-{tag}"
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
                StartRun(run_id=unwanted, tenant=TENANT, agent="looper"),
                CancelRun(run_id=unwanted, tenant=TENANT, by="ops", why="not wanted after all"),
            )
            await asyncio.sleep(3)  # a few peeks for cancels while the worker is full
            await requests.submit(CancelRun(run_id=runaways[0], tenant=TENANT, by="ops"))
            await until(has(runaways[0], "cancelled"), "the cancel of a runaway")
            await until(lambda: _started(worker, unwanted), "the unwanted run's start")
            await until(has(unwanted, "cancelled"), "the unwanted run's cancel")
            await requests.submit(CancelRun(run_id=runaways[1], tenant=TENANT, by="ops"))
            await until(has(runaways[1], "cancelled"), "the cancel of the other runaway")
        assert task.exception() is None
    assert f"run {unwanted!r}" not in caplog.text  # no cancel of it refused


async def _started(worker: Worker, run_id: str) -> bool:
    return await status_of(worker, run_id, TENANT) is not None


async def test_a_worker_left_out_of_its_group_while_blocked_goes_on_serving(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's event loop is blocked past its session timeout (a long pause, a frozen
    machine) just as a request is acted on: the group leaves it out, and its next commit is
    refused (the generation it commits for is gone). That is no reason to stop serving: it
    rejoins, and what it could not commit is delivered again to whoever owns it, found done."""
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    tag = uuid.uuid4().hex[:8]
    first, second = f"work-{tag}-1", f"work-{tag}-2"
    blocked = False
    done = worker_module._Offsets.done

    def done_after_a_pause(self: Any, tp: Any, offset: int, acted: bool) -> None:
        nonlocal blocked
        done(self, tp, offset, acted)
        if not blocked:
            blocked = True
            time.sleep(9)  # the whole event loop: no heartbeat past the 6 s session

    monkeypatch.setattr(worker_module._Offsets, "done", done_after_a_pause)
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)

        def has(run_id: str, wanted: str) -> Callable[[], Awaitable[bool]]:
            return has_status(worker, run_id, wanted, tenant=TENANT, serving=lambda: task)

        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
            Requests(
                kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
            ) as requests,
        ):
            await requests.submit(StartRun(run_id=first, tenant=TENANT, agent="stepper"))
            await until(has(first, "completed"), "the first start")
            assert blocked
            await requests.submit(StartRun(run_id=second, tenant=TENANT, agent="stepper"))
            await until(has(second, "completed"), "a start after the worker rejoined")
        assert task.exception() is None


async def test_a_slow_recovery_pass_is_not_overlapped_by_the_next(
    kafka_servers: KafkaServers, requests_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that takes longer than ``recheck_s`` is not joined by the next one, each listing
    the runs and checking their leases again; the next starts once it ended."""
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, recheck_s=0.05)
        listings = SlowListings(worker, monkeypatch, delay_s=1.0)
        async with serving(worker, kafka_servers.bootstrap, requests_topic, accept_unsigned=True):

            async def a_third_pass() -> bool:
                # Three, not two: a rebalance's pass and a periodic one may start together.
                return listings.started >= 3

            await until(a_third_pass, "a pass after the first ones ended")
    assert listings.most_at_once <= 2, "more than a rebalance's pass and a periodic one at once"


async def test_a_start_under_another_tenant_s_run_id_is_refused_saying_it_exists(
    kafka_servers: KafkaServers,
    requests_topic: str,
    ledger: Ledger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two tenants start one run id: the second start was dropped as "started before", with
    no refusal said or kept, so its stream waited out the request's max age and was then told
    to send it again, which would not help. It is refused for good at once, in the words every
    tenant gets ("already exists"), naming nothing of the run, and only its tenant's streams
    end with it (the run's own are not)."""
    caplog.set_level(logging.WARNING, logger="onward.worker")
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    taken = f"taken-{uuid.uuid4().hex[:8]}"
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, max_runs=2, backoff_s=0.1)
        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=signer) as task,
            Requests(
                kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
            ) as requests,
        ):
            await requests.submit(StartRun(run_id=taken, tenant="evil", agent="stepper"))
            await until(
                has_status(worker, taken, "completed", tenant="evil", serving=lambda: task),
                "the first tenant's run",
            )
            await requests.submit(StartRun(run_id=taken, tenant=TENANT, agent="stepper"))
            deadline = time.monotonic() + 20
            while worker.refused_start(taken, tenant=TENANT) is None:
                assert time.monotonic() < deadline, "the second tenant's start was dropped"
                await asyncio.sleep(0.05)
        assert task.exception() is None
    cause = worker.refused_start(taken, tenant=TENANT)
    assert cause is not None
    assert "already exists" in cause
    assert "evil" not in cause
    assert worker.refused_start(taken, tenant="evil") is None
    assert "StartRun refused for good" in caplog.text
