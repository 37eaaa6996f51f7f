"""Requests are signed, and a worker acts only on those whose signature checks (security
review #3). Real Kafka, PostgreSQL and Redis; the worker runs in this process."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from support.deployment import kafka_settings
from support.servers import KafkaServers
from support.serving import serving as serving_requests

import onward
from onward.errors import ConfigurationError
from onward.eventlog import ApprovalGranted, ApprovalRequested, RunFinished, ToolCall
from onward.eventlog.base import partition_for
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import AnswerRequest, Requests, StartRun, encode_request
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.signing import SIGNATURE_HEADER, RequestSigner
from onward.runtime.tools import tool

pytestmark = pytest.mark.kafka
PARTITIONS = 2
TENANT = "acme"
paid: list[int] = []


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str, approval: Any = None) -> str:
    paid.append(amount)
    return f"paid {amount}"


AGENT = Agent(name="payer", instructions="pay", tools=[pay])


def provider() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="p", tool="pay", args={"amount": 10_000})), reply("paid")]
    )


async def produce(
    bootstrap: str, topic: str, request: AnswerRequest, headers: list[tuple[str, bytes]]
) -> None:
    """Write a request record as anyone who can reach the broker could."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            topic,
            encode_request(request),
            key=request.run_id.encode(),
            partition=partition_for(request.run_id, PARTITIONS),
            headers=headers,
        )
    finally:
        await producer.stop()


async def until(check: Callable[[], Any], what: str, within: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def kinds(backends: Backends, run_id: str) -> list[type]:
    return [type(s.event) for s in await backends.log.read_run(run_id)]


async def test_only_requests_signed_with_the_fleets_key_are_acted_on(
    kafka_servers: KafkaServers, requests_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Security review #3: anyone who reached the brokers could approve any pending payment
    with an AnswerRequest naming its tenant; now an unsigned or wrongly signed answer is set
    aside with the reason, and the signed one is acted on."""
    paid.clear()
    run_id = f"pay-{uuid.uuid4().hex[:8]}"
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = kafka_servers.signer()
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), {"payer": AGENT}, backoff_s=0.1)
        async with (
            serving_requests(
                worker, kafka_servers.bootstrap, requests_topic, signer=signer
            ) as serving,
            Requests(
                kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS, signer=signer
            ) as requests,
        ):
            await requests.submit(StartRun(run_id=run_id, tenant=TENANT, agent="payer"))
            await until(lambda: _has(backends, run_id, ApprovalRequested), "the approval request")
            (asked,) = [
                s.event
                for s in await backends.log.read_run(run_id)
                if isinstance(s.event, ApprovalRequested)
            ]
            answer = AnswerRequest(
                run_id=run_id, tenant=TENANT, request_id=asked.request_id, approve=True, by="x"
            )
            wrong = RequestSigner("another-key-" + "w" * 32)
            key, value = run_id.encode(), encode_request(answer)
            with caplog.at_level(logging.WARNING, logger="onward.worker"):
                await produce(kafka_servers.bootstrap, requests_topic, answer, [])
                await produce(
                    kafka_servers.bootstrap,
                    requests_topic,
                    answer,
                    [(SIGNATURE_HEADER, wrong.sign(key, value))],
                )
                await until(lambda: _set_aside(worker, 2), "both forged answers set aside")
            assert ApprovalGranted not in await kinds(backends, run_id)
            assert paid == []
            assert "unsigned" in caplog.text
            assert "does not check" in caplog.text

            await requests.submit(answer)
            await until(lambda: _has(backends, run_id, RunFinished), "the run's end")
        assert serving.exception() is None
        assert paid == [10_000]
        assert worker.stats.set_aside == 2


async def _has(backends: Backends, run_id: str, kind: type) -> bool:
    return kind in await kinds(backends, run_id)


async def _set_aside(worker: Worker, count: int) -> bool:
    return worker.stats.set_aside >= count


async def test_a_worker_without_a_key_refuses_to_serve(
    kafka_servers: KafkaServers, requests_topic: str
) -> None:
    """Security review #3: the safe default is to check signatures; taking unsigned requests
    is an option named for what it gives up."""
    settings = kafka_settings(kafka_servers, PARTITIONS, request_key=None)
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), {"payer": AGENT})
        with pytest.raises(ConfigurationError, match="ONWARD_REQUEST_KEY"):
            await worker.serve_kafka(
                asyncio.Event(), bootstrap_servers=kafka_servers.bootstrap, topic=requests_topic
            )
    fleet = kafka_settings(kafka_servers, PARTITIONS, request_key=None, app_mode="fleet")
    with pytest.raises(ConfigurationError, match="ONWARD_REQUEST_KEY"):
        onward.open(fleet)


def test_a_short_key_is_refused_without_showing_it() -> None:
    """Security review #3: a key too short to resist guessing is a configuration error that
    names the setting, never the key."""
    with pytest.raises(ConfigurationError, match="key 2 has 5 characters") as refused:
        RequestSigner("k" * 40 + ",short")
    assert "short" not in str(refused.value)
    assert "kkkk" not in repr(RequestSigner("k" * 40))
