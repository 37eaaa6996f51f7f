"""Onward on a Kafka listener that takes only SASL over TLS, as a managed Kafka has.

The test broker has a SASL_SSL client listener (``KAFKA_SASL_SSL_BOOTSTRAP_SERVERS``, a
certificate signed by ``ONWARD_TEST_TLS_CA``, PLAIN and SCRAM-SHA-256/512 for the user
``ONWARD_TEST_KAFKA_SASL_USERNAME``) beside its plaintext one; topics made through either are
the same topics. The event log's conformance suite, a projector and a fleet of `onward worker`
processes run over it, and each setting that is wrong in a way an operator gets wrong (the
password, the user, the CA, the protocol) stops a command with exit 2 and one line naming the
variable, before anything is written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.deployment import process_env, worker_argv
from support.histories import append_all, assert_stored_is_the_direct_fold, run_ids_of, workload
from support.kafka import delete_topic
from support.processes import TESTS, spawn_onward, stop_children
from support.servers import KafkaServers

from onward._storage import KafkaConnection
from onward.errors import ConfigurationError
from onward.eventlog import KafkaEventLog, Position, partition_for
from onward.eventlog.base import EventLog
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.runtime.fleet.requests import Requests, StartRun
from onward.runtime.settings import Settings
from onward.testing import PersistentEventLogConformance
from onward.testing.eventlog import step_events

pytestmark = pytest.mark.kafka

SECURED = (
    "KAFKA_SASL_SSL_BOOTSTRAP_SERVERS",
    "ONWARD_TEST_TLS_CA",
    "ONWARD_TEST_KAFKA_SASL_USERNAME",
    "ONWARD_TEST_KAFKA_SASL_PASSWORD",
)
PARTITIONS = 3
AGENT = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]


@dataclass(frozen=True)
class SecuredKafka:
    """The broker's SASL_SSL listener and the credentials it takes."""

    bootstrap: str
    ca: str
    username: str
    password: str

    def env(self, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """The ``KAFKA_*`` variables of a deployment on this listener."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFKA_SASL_MECHANISM": mechanism,
            "KAFKA_SASL_USERNAME": self.username,
            "KAFKA_SASL_PASSWORD": self.password,
            "KAFKA_SSL_CA_LOCATION": self.ca,
        }

    def connection(self, mechanism: str = "SCRAM-SHA-512") -> KafkaConnection:
        """What `Settings.kafka_connection` makes of `env`."""
        return Settings(backend="kafka", **_fields(self.env(mechanism))).kafka_connection()


def _fields(env: dict[str, str]) -> dict[str, Any]:
    """Settings fields by name from ``KAFKA_*`` variables (each field is its variable, lower)."""
    return {name.lower(): value for name, value in env.items()}


@pytest.fixture(scope="session")
def secured_kafka() -> SecuredKafka:
    """The SASL_SSL listener `scripts/services.sh` starts; missing is a failure, not a skip."""
    missing = [name for name in SECURED if not os.environ.get(name)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not set: the secured listener is part of the test servers "
            '(eval "$(bash scripts/services.sh up)")'
        )
    return SecuredKafka(*(os.environ[name] for name in SECURED))


class TestSaslSslEventLog(PersistentEventLogConformance):
    """The event log's whole contract, over SCRAM-SHA-512 and TLS."""

    connection: KafkaConnection
    topic: str

    @pytest.fixture(autouse=True)
    def _fresh_topic(self, secured_kafka: SecuredKafka, kafka_topic: str) -> None:
        self.connection = secured_kafka.connection()
        self.topic = kafka_topic

    async def open_log(self) -> EventLog:
        return await KafkaEventLog.open(
            self.connection, topic=self.topic, partitions=self.partitions
        )

    async def reopen(self, log: EventLog) -> EventLog:
        return await KafkaEventLog.open(
            self.connection, topic=self.topic, partitions=self.partitions, create_topic=False
        )

    async def write_raw(self, log: EventLog, run_id: str, record: bytes) -> Position:
        producer = self.connection.producer(acks="all")
        await self.connection.start(producer)
        try:
            partition = partition_for(run_id, self.partitions)
            metadata = await producer.send_and_wait(
                self.topic, record, key=run_id.encode(), partition=partition
            )
        finally:
            await producer.stop()
        return Position(partition, metadata.offset)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_a_run_goes_through_and_back_with_each_mechanism(
    secured_kafka: SecuredKafka, kafka_topic: str, mechanism: str
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:10]}"
    events = step_events(run_id, 4)
    async with KafkaEventLog(
        secured_kafka.connection(mechanism), topic=kafka_topic, partitions=PARTITIONS
    ) as log:
        await log.append(events)
        read = await log.read_run(run_id)
    assert [stored.event for stored in read] == events


async def test_a_projector_folds_the_secured_log_into_postgresql(
    secured_kafka: SecuredKafka,
    kafka_servers: KafkaServers,
    rng: random.Random,
) -> None:
    connection = secured_kafka.connection()
    steps = workload(rng, 30)
    async with (
        KafkaEventLog(connection, topic=kafka_servers.topic, partitions=PARTITIONS) as log,
        kafka_servers.frontiers() as store,
    ):
        await append_all(log, steps)
        projector = KafkaProjector(
            connection,
            FrontierProjection(store, log),
            topic=kafka_servers.topic,
            partitions=PARTITIONS,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        await projector.start()
        try:
            ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                stored = await projector.projection.positions()
                if all(stored.get(p, 0) >= end for p, end in ends.items()):
                    break
                assert asyncio.get_running_loop().time() < deadline, f"stuck at {stored}"
                await projector.step(timeout_ms=200)
        finally:
            await projector.close()
        await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))


@pytest.mark.timeout(180)
async def test_a_fleet_carries_runs_over_sasl_ssl(
    secured_kafka: SecuredKafka, kafka_servers: KafkaServers, tmp_path: Path
) -> None:
    """`onward projector` and two `onward worker` processes, configured by the ``KAFKA_*``
    variables alone, start runs submitted through the requests topic and finish them."""
    requests_topic = f"{kafka_servers.topic}.requests"
    env = process_env(
        kafka_servers,
        PARTITIONS,
        **secured_kafka.env(),
        FLEET_LEDGER=str(tmp_path / "ledger.jsonl"),
        FLEET_STEPS="2",
        FLEET_TOOL_S="0.01",
    )
    connection = secured_kafka.connection()
    children: dict[str, asyncio.subprocess.Process] = {}
    try:
        async with (
            KafkaEventLog(connection, topic=kafka_servers.topic, partitions=PARTITIONS),
            kafka_servers.frontiers() as frontiers,
        ):
            children["projector"] = await spawn_onward(
                tmp_path / "projector.log", env, "projector", "--session-timeout-ms", "6000"
            )
            for name in ("w0", "w1"):
                argv = worker_argv("support.fleet", requests_topic, name)
                children[name] = await spawn_onward(tmp_path / f"{name}.log", env, *argv)
            run_ids = [f"run-{uuid.uuid4().hex[:10]}" for _ in range(8)]
            async with Requests(
                connection,
                requests_topic,
                partitions=PARTITIONS,
                signer=kafka_servers.signer(),
            ) as requests:
                await requests.submit_many(
                    [
                        StartRun(run_id=r, tenant="acme", agent="booker", input=f"job {i}")
                        for i, r in enumerate(run_ids)
                    ]
                )

            async def statuses() -> Counter[str]:
                return Counter(s.status for s in await frontiers.runs(tenant="acme"))

            deadline = asyncio.get_running_loop().time() + 120
            while (await statuses())["completed"] < len(run_ids):
                exited = {n: c.returncode for n, c in children.items() if c.returncode is not None}
                logs = {n: (tmp_path / f"{n}.log").read_text()[-1500:] for n in children}
                assert not exited, f"exited: {exited}: {logs}"
                assert asyncio.get_running_loop().time() < deadline, f"{await statuses()}: {logs}"
                await asyncio.sleep(0.25)
            assert await statuses() == Counter(completed=len(run_ids))
            rows = {s.run_id for s in await frontiers.runs(tenant="acme")}
            assert rows == set(run_ids)
    finally:
        await stop_children(children.values(), within_s=30)
        await delete_topic(kafka_servers.bootstrap, requests_topic)


@pytest.fixture(scope="module")
def foreign_ca(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA that signed nothing the test servers present."""
    where = tmp_path_factory.mktemp("foreign-ca")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=Not the Onward test CA"),
            *("-keyout", str(where / "ca.key"), "-out", str(where / "ca.pem")),
        ],
        check=True,
        capture_output=True,
    )
    return str(where / "ca.pem")


@dataclass(frozen=True)
class Deployment:
    """A secured deployment's environment and its events topic, for commands run against it."""

    env: dict[str, str]
    topic: str
    connection: KafkaConnection

    def onward(self, *argv: str, **changes: str | None) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **{k: v for k, v in changes.items() if v is not None}}
        for name in (k for k, v in changes.items() if v is None):
            env.pop(name, None)
        return subprocess.run(
            [sys.executable, "-m", "onward", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    async def ends(self) -> dict[int, int]:
        async with KafkaEventLog(
            self.connection, topic=self.topic, partitions=PARTITIONS, create_topic=False
        ) as log:
            return {p: (await log.bounds(p)).end for p in range(PARTITIONS)}


@pytest_asyncio.fixture
async def deployment(
    secured_kafka: SecuredKafka, kafka_servers: KafkaServers
) -> AsyncIterator[Deployment]:
    connection = secured_kafka.connection()
    async with KafkaEventLog(connection, topic=kafka_servers.topic, partitions=PARTITIONS):
        pass  # the events topic exists, as in a deployment
    yield Deployment(
        {
            **os.environ,
            "PYTHONPATH": str(TESTS),
            **kafka_servers.env(partitions=PARTITIONS),
            **secured_kafka.env(),
        },
        kafka_servers.topic,
        connection,
    )


WRONG_PASSWORD = "not-the-sasl-password"
BAD_SETTINGS: dict[str, tuple[dict[str, str | None], list[str]]] = {
    # case: (the variables changed (None: unset), what the one line must name)
    "wrong-password": (
        {"KAFKA_SASL_PASSWORD": WRONG_PASSWORD},
        ["KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "SCRAM-SHA-512"],
    ),
    "unknown-user": (
        {"KAFKA_SASL_USERNAME": "onward-nobody", "KAFKA_SASL_PASSWORD": WRONG_PASSWORD},
        ["KAFKA_SASL_USERNAME", "onward-nobody", "KAFKA_SASL_PASSWORD"],
    ),
    "unknown-ca": ({"KAFKA_SSL_CA_LOCATION": "FOREIGN_CA"}, ["KAFKA_SSL_CA_LOCATION"]),
    "plaintext-at-the-tls-port": (
        {
            "KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
            "KAFKA_SASL_MECHANISM": None,
            "KAFKA_SASL_USERNAME": None,
            "KAFKA_SASL_PASSWORD": None,
            "KAFKA_SSL_CA_LOCATION": None,
        },
        ["KAFKA_SECURITY_PROTOCOL", "PLAINTEXT", "TLS"],
    ),
    # The listener drops a client without SASL after its version lookup: not an outage.
    "tls-without-sasl": (
        {
            "KAFKA_SECURITY_PROTOCOL": "SSL",
            "KAFKA_SASL_MECHANISM": None,
            "KAFKA_SASL_USERNAME": None,
            "KAFKA_SASL_PASSWORD": None,
        },
        ["KAFKA_SECURITY_PROTOCOL", "SSL", "SASL_SSL", "KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"],
    ),
    # The password is not what is wrong: the listener has no SASL.
    "sasl-at-the-plaintext-port": (
        {
            "KAFKA_BOOTSTRAP_SERVERS": "PLAINTEXT_LISTENER",
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SSL_CA_LOCATION": None,
        },
        ["KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT", "does not take SASL"],
    ),
}


async def test_a_run_starts_with_the_right_settings(deployment: Deployment) -> None:
    # What the bad settings below must not do: this command appends to the events topic.
    before = await deployment.ends()
    result = deployment.onward("start", "book 3A", "--tenant", "acme", *AGENT)
    assert result.returncode == 0, result.stderr
    assert sum((await deployment.ends()).values()) > sum(before.values())


@pytest.mark.parametrize("case", sorted(BAD_SETTINGS))
async def test_a_wrong_setting_is_named_in_one_line_and_nothing_is_written(
    deployment: Deployment,
    secured_kafka: SecuredKafka,
    kafka_servers: KafkaServers,
    foreign_ca: str,
    case: str,
) -> None:
    changed, named = BAD_SETTINGS[case]
    stand_ins = {"FOREIGN_CA": foreign_ca, "PLAINTEXT_LISTENER": kafka_servers.bootstrap}
    changes = {k: (stand_ins.get(v, v) if v else v) for k, v in changed.items()}
    before = await deployment.ends()
    result = deployment.onward("start", "book 3A", "--tenant", "acme", *AGENT, **changes)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in named:
        assert name in lines[0], lines[0]
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    assert secured_kafka.password not in output
    assert WRONG_PASSWORD not in output
    assert await deployment.ends() == before


async def test_errors_from_the_broker_never_carry_the_password(
    secured_kafka: SecuredKafka,
) -> None:
    env = {**secured_kafka.env(), "KAFKA_SASL_PASSWORD": WRONG_PASSWORD}
    connection = Settings(backend="kafka", **_fields(env)).kafka_connection()
    admin = connection.admin()
    with pytest.raises(ConfigurationError) as refused:
        await connection.start(admin)
    assert "KAFKA_SASL_PASSWORD" in str(refused.value)
    assert WRONG_PASSWORD not in str(refused.value)
    assert WRONG_PASSWORD not in repr(refused.value)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_debug_logs_of_the_sasl_exchange_never_carry_the_password(
    secured_kafka: SecuredKafka, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    """aiokafka logs every request it sends at DEBUG, the SASL one with its bytes (over PLAIN,
    the password as it is; over SCRAM, the proof of it): a deployment debugging its connection
    must find neither in its logs, whether the broker took the password or refused it."""
    caplog.set_level(logging.DEBUG)
    # Its own level too: a command run in this process before may have quietened "aiokafka".
    caplog.set_level(logging.DEBUG, logger="aiokafka.conn")
    taken = secured_kafka.connection(mechanism)
    admin = taken.admin()
    await taken.start(admin)
    await admin.close()
    env = {**secured_kafka.env(mechanism), "KAFKA_SASL_PASSWORD": WRONG_PASSWORD}
    refused = Settings(backend="kafka", **_fields(env)).kafka_connection()
    with pytest.raises(ConfigurationError, match="KAFKA_SASL_PASSWORD"):
        await refused.start(refused.admin())
    requests = [line for line in caplog.text.splitlines() if "SaslAuthenticateRequest" in line]
    assert requests  # the exchange is still logged, its bytes hidden
    assert all("sasl_auth_bytes=***" in line for line in requests), requests
    assert secured_kafka.password not in caplog.text
    assert WRONG_PASSWORD not in caplog.text
