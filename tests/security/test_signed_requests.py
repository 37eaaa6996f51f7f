"""Requests are signed, and a worker acts only on those whose signature checks (security
review #3). Real Kafka, PostgreSQL and Redis; the worker runs in this process."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
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
from onward.eventlog import (
    ApprovalGranted,
    ApprovalRequested,
    RunFinished,
    RunStarted,
    Tagged,
    ToolCall,
)
from onward.eventlog.base import partition_for
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import (
    AnswerRequest,
    CancelRun,
    PreparedRequest,
    Request,
    Requests,
    ResumeRun,
    StartRun,
    TagRun,
    encode_request,
    prepare_requests,
)
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.redaction import Redactor
from onward.runtime.settings import Settings
from onward.runtime.signing import DEFAULT_MAX_AGE_S, SIGNATURE_HEADER, RequestSigner
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


async def produce_captured(bootstrap: str, topic: str, captured: PreparedRequest) -> None:
    """Write again, as anyone who can reach the broker could, a request record as it was sent
    (its value and signature read off the topic)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        assert captured.signature is not None
        await producer.send_and_wait(
            topic,
            captured.value,
            key=captured.key,
            partition=partition_for(captured.run_id, PARTITIONS),
            headers=[(SIGNATURE_HEADER, captured.signature)],
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


async def test_a_captured_start_sent_again_after_the_max_age_is_set_aside(
    kafka_servers: KafkaServers,
    requests_topic: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signed start captured off the topic and written again days later was acted on: a
    replay (once the run is collected, nothing tells it from a new start) spends model calls
    and pays again. Now a request signed longer than ONWARD_REQUEST_MAX_AGE (a day) ago is
    set aside, saying so, and the partition goes on: the same start sent afresh is acted on."""
    paid.clear()
    run_id = f"replay-{uuid.uuid4().hex[:8]}"
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    start = StartRun(run_id=run_id, tenant=TENANT, agent="payer")
    three_days_ago = time.time() - 3 * 86_400
    with monkeypatch.context() as then:
        then.setattr(time, "time", lambda: three_days_ago)
        signer = settings.request_signer()
        assert signer is not None
        (captured,) = prepare_requests([start], Redactor(), signer)
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), {"payer": AGENT}, backoff_s=0.1)
        async with serving_requests(
            worker, kafka_servers.bootstrap, requests_topic, signer=settings.request_signer()
        ) as serving:
            with caplog.at_level(logging.WARNING, logger="onward.worker"):
                await produce_captured(kafka_servers.bootstrap, requests_topic, captured)

                async def handled() -> bool:
                    return await _set_aside(worker, 1) or await _has(backends, run_id, RunStarted)

                await until(handled, "the replayed start handled")
            assert await kinds(backends, run_id) == []
            assert re.search(r"expired: signed 2592\d\ds ago", caplog.text)
            assert "ONWARD_REQUEST_MAX_AGE" in caplog.text
            async with Requests(
                kafka_servers.bootstrap,
                requests_topic,
                partitions=PARTITIONS,
                signer=settings.request_signer(),
            ) as requests:
                await requests.submit(start)
            await until(lambda: _has(backends, run_id, ApprovalRequested), "the fresh start")
        assert serving.exception() is None
    assert worker.stats.set_aside == 1


async def test_a_start_sent_again_within_the_max_age_does_not_run_twice(
    kafka_servers: KafkaServers, requests_topic: str
) -> None:
    """Within the window a replayed start finds its run: nothing is started or paid again,
    and the requests after it are acted on."""
    paid.clear()
    run_id = f"again-{uuid.uuid4().hex[:8]}"
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    signer = settings.request_signer()
    assert signer is not None
    (captured,) = prepare_requests(
        [StartRun(run_id=run_id, tenant=TENANT, agent="payer")], Redactor(), signer
    )
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
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
            await produce_captured(kafka_servers.bootstrap, requests_topic, captured)
            await until(lambda: _has(backends, run_id, ApprovalRequested), "the approval request")
            (asked,) = [
                s.event
                for s in await backends.log.read_run(run_id)
                if isinstance(s.event, ApprovalRequested)
            ]
            await requests.submit(
                AnswerRequest(
                    run_id=run_id, tenant=TENANT, request_id=asked.request_id, approve=True, by="x"
                )
            )
            await until(lambda: _has(backends, run_id, RunFinished), "the run's end")
            await produce_captured(kafka_servers.bootstrap, requests_topic, captured)
            await requests.submit(TagRun(run_id=run_id, tenant=TENANT, label="after"))
            await until(lambda: _has(backends, run_id, Tagged), "the tag after the replay")
            await asyncio.sleep(1)
            found = await kinds(backends, run_id)
        assert serving.exception() is None
    assert found.count(RunStarted) == 1
    assert found.count(ApprovalRequested) == 1
    assert paid == [10_000]
    assert worker.stats.set_aside == 0


KEY = "k" * 40


def _undated(key: str, record_key: bytes, value: bytes) -> bytes:
    """A signature as Onward made them before requests carried their signing time."""
    message = b"v1:" + len(record_key).to_bytes(4, "big") + record_key + value
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest().encode()


def test_a_request_signed_too_long_ago_or_ahead_is_refused_saying_why() -> None:
    now = time.time()
    signed = RequestSigner(KEY, clock=lambda: now).sign(b"r1", b"{}")
    headers = [(SIGNATURE_HEADER, signed)]

    def checked_at(at: float, max_age_s: float = 60) -> str | None:
        return RequestSigner(KEY, max_age_s=max_age_s, clock=lambda: at).refusal(
            b"r1", b"{}", headers
        )

    assert checked_at(now) is None
    assert checked_at(now + 59) is None
    assert "expired: signed 61s ago" in (checked_at(now + 61) or "")
    assert checked_at(now + 7200, max_age_s=86_400) is None
    assert checked_at(now - 60) is None  # the sender's clock a minute ahead
    assert "in the future" in (checked_at(now - 3600) or "")


@pytest.mark.parametrize(
    "request_",
    [
        StartRun(run_id="r1", tenant=TENANT, agent="payer"),
        AnswerRequest(run_id="r1", tenant=TENANT, request_id="q1", approve=True, by="ann"),
        TagRun(run_id="r1", tenant=TENANT, label="seen"),
        CancelRun(run_id="r1", tenant=TENANT, by="ann"),
        ResumeRun(run_id="r1", tenant=TENANT),
    ],
    ids=lambda r: type(r).__name__,
)
def test_every_kind_of_request_expires(request_: Request) -> None:
    """Every request a sender prepares carries the time it was signed: none can be sent
    again once older than the fleet's max age."""
    now = time.time()
    (prepared,) = prepare_requests([request_], Redactor(), RequestSigner(KEY, clock=lambda: now))
    assert prepared.signature is not None
    headers = [(SIGNATURE_HEADER, prepared.signature)]
    fresh = RequestSigner(KEY, clock=lambda: now + 60)
    assert fresh.refusal(prepared.key, prepared.value, headers) is None
    late = RequestSigner(KEY, clock=lambda: now + DEFAULT_MAX_AGE_S + 1)
    assert "expired" in (late.refusal(prepared.key, prepared.value, headers) or "")


def test_the_signing_time_is_signed_and_an_undated_signature_is_refused() -> None:
    """The time a request was signed cannot be moved forward to make an old one pass, and a
    signature of the old format (no time at all) is refused as what a replay looks like."""
    signer = RequestSigner(KEY)
    signed = signer.sign(b"r1", b"{}")
    issued, mac = signed.split(b",", 1)
    moved = b"t=%d,%s" % (int(issued.removeprefix(b"t=")) + 3_600_000, mac)
    refused = signer.refusal(b"r1", b"{}", [(SIGNATURE_HEADER, moved)])
    assert refused == "its signature does not check with any key of ONWARD_REQUEST_KEY"
    undated = signer.refusal(b"r1", b"{}", [(SIGNATURE_HEADER, _undated(KEY, b"r1", b"{}"))])
    assert undated is not None
    assert "carries no signing time" in undated
    forged = signer.refusal(b"r1", b"{}", [(SIGNATURE_HEADER, _undated("x" * 40, b"r1", b"{}"))])
    assert forged is not None
    assert "does not check" in forged
    assert signer.refusal(b"r2", b"{}", [(SIGNATURE_HEADER, signed)]) is not None
    assert signer.refusal(b"r1", b"{ }", [(SIGNATURE_HEADER, signed)]) is not None


def test_the_max_age_is_a_setting_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_REQUEST_KEY", KEY)
    monkeypatch.setenv("ONWARD_REQUEST_MAX_AGE", "90")
    signer = Settings().request_signer()
    assert signer is not None
    assert signer.max_age_s == 90
    monkeypatch.setenv("ONWARD_REQUEST_MAX_AGE", "0")
    with pytest.raises(ConfigurationError, match="ONWARD_REQUEST_MAX_AGE"):
        Settings()
