"""`KafkaConnection` and the ``KAFKA_*`` settings, without a broker: what each client is given,
which setting each refusal names, and that the passwords are never shown; and that the check
for another kind of server at a bootstrap address takes the real broker for Kafka.

The same settings against the real SASL_SSL listener: ``test_secured_kafka.py``.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from onward._storage import KafkaConnection, kafka_connection
from onward._storage import kafka as kafka_storage
from onward._storage.kafka import _addresses, _kafka_answer
from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog import KafkaEventLog, MemoryEventLog
from onward.projections import FrontierProjection, MemoryFrontierStore
from onward.projections.kafka import KafkaProjector
from onward.runtime.fleet.requests import Requests
from onward.runtime.settings import Settings

SASL_PASSWORD = "sasl-secret-1f3a"
KEY_PASSWORD = "key-secret-9c2e"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA file, and a client certificate with its key encrypted by `KEY_PASSWORD`."""
    where = tmp_path_factory.mktemp("pki")

    def openssl(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True)

    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test CA"),
        *("-keyout", str(where / "ca.key"), "-out", str(where / "ca.pem")),
    )
    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-days", "1", "-subj", "/CN=client"),
        *("-passout", f"pass:{KEY_PASSWORD}"),
        *("-keyout", str(where / "client.key"), "-out", str(where / "client.pem")),
    )
    (where / "not-pem.txt").write_text("not a certificate\n")
    return {name: str(where / name) for name in ("ca.pem", "client.pem", "client.key")} | {
        "not-pem": str(where / "not-pem.txt")
    }


def sasl_ssl(pki: dict[str, str], **changes: Any) -> KafkaConnection:
    fields: dict[str, Any] = {
        "bootstrap_servers": "broker-1:9096,broker-2:9096",
        "client_id": "billing",
        "request_timeout_s": 7.0,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "onward",
        "sasl_password": SASL_PASSWORD,
        "ssl_ca_location": pki["ca.pem"],
        "ssl_certificate_location": pki["client.pem"],
        "ssl_key_location": pki["client.key"],
        "ssl_key_password": KEY_PASSWORD,
    }
    return KafkaConnection(**(fields | changes))


def kafka_environment(pki: dict[str, str]) -> dict[str, str]:
    return {
        "ONWARD_BACKEND": "kafka",
        "KAFKA_BOOTSTRAP_SERVERS": "broker-1:9096",
        "KAFKA_CLIENT_ID": "billing",
        "KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "KAFKA_SASL_USERNAME": "onward",
        "KAFKA_SASL_PASSWORD": SASL_PASSWORD,
        "KAFKA_SSL_CA_LOCATION": pki["ca.pem"],
        "KAFKA_SSL_CERTIFICATE_LOCATION": pki["client.pem"],
        "KAFKA_SSL_KEY_LOCATION": pki["client.key"],
        "KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD,
        "ONWARD_BACKEND_TIMEOUT": "7",
    }


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, pki: dict[str, str]) -> dict[str, str]:
    env = kafka_environment(pki)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_settings_read_every_kafka_variable(environment: dict[str, str]) -> None:
    connection = Settings().kafka_connection()
    assert connection.bootstrap_servers == "broker-1:9096"
    assert connection.client_id == "billing"
    assert connection.request_timeout_s == 7.0
    assert connection.security_protocol == "SASL_SSL"  # upper-cased, as Kafka's clients take it
    assert connection.sasl_mechanism == "SCRAM-SHA-256"
    assert connection.sasl_username == "onward"
    assert connection.sasl_password == SASL_PASSWORD
    assert connection.ssl_ca_location == environment["KAFKA_SSL_CA_LOCATION"]
    assert connection.ssl_key_password == KEY_PASSWORD
    assert connection.ssl_context is not None
    assert Settings().kafka_connection(client_id="onward-gc").client_id == "onward-gc"


def test_the_passwords_are_never_shown(environment: dict[str, str], pki: dict[str, str]) -> None:
    settings = Settings()
    connection = settings.kafka_connection()
    shown = [
        repr(settings),
        str(settings),
        str(settings.model_dump()),
        settings.model_dump_json(),
        repr(connection),
        str(connection),
    ]
    for text in shown:
        assert SASL_PASSWORD not in text
        assert KEY_PASSWORD not in text
    assert "sasl_username='onward'" in repr(connection)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"KAFKA_SASL_USERNAME": None}, "KAFKA_SASL_USERNAME"),
        ({"KAFKA_SASL_MECHANISM": ""}, "KAFKA_SASL_MECHANISM"),
        ({"KAFKA_SASL_MECHANISM": "GSSAPI"}, "KAFKA_SASL_MECHANISM"),
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "KAFKA_SECURITY_PROTOCOL"),
        ({"KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}, "KAFKA_SASL_PASSWORD"),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "KAFKA_SSL_CA_LOCATION"),
        ({"KAFKA_SSL_CA_LOCATION": "/nowhere/ca.pem"}, "KAFKA_SSL_CA_LOCATION"),
        ({"KAFKA_SSL_CA_LOCATION": "not-pem"}, "KAFKA_SSL_CA_LOCATION"),
        ({"KAFKA_SSL_KEY_LOCATION": "/nowhere/client.key"}, "KAFKA_SSL_KEY_LOCATION"),
        ({"KAFKA_SSL_KEY_PASSWORD": "not-the-key-password"}, "KAFKA_SSL_KEY_PASSWORD"),
        # The key is encrypted: without its password, it is not asked for on a terminal.
        ({"KAFKA_SSL_KEY_PASSWORD": None}, "KAFKA_SSL_KEY_PASSWORD"),
        ({"KAFKA_SSL_CERTIFICATE_LOCATION": None}, "KAFKA_SSL_CERTIFICATE_LOCATION"),
    ],
)
def test_a_bad_setting_is_named_in_one_line_without_the_passwords(
    monkeypatch: pytest.MonkeyPatch,
    pki: dict[str, str],
    changes: dict[str, str | None],
    named: str,
) -> None:
    env = kafka_environment(pki)
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = pki.get(value, value)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as refused:
        Settings()
    message = str(refused.value)
    assert named in message
    assert "\n" not in message
    for secret in (SASL_PASSWORD, KEY_PASSWORD, "not-the-key-password"):
        assert secret not in message
        assert secret not in repr(refused.value)


def test_the_embedded_backend_does_not_check_kafka_security(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another program's KAFKA_* variables must not stop a sqlite deployment.
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    assert Settings(backend="sqlite").kafka_security_protocol == "SASL_SSL"
    with pytest.raises(ConfigurationError, match="KAFKA_SASL_MECHANISM"):
        Settings(backend="sqlite").kafka_connection()


async def test_every_client_gets_the_servers_the_timeout_and_the_security(
    pki: dict[str, str],
) -> None:
    connection = sasl_ssl(pki)
    producer = connection.producer(acks="all")
    consumer = connection.consumer(role="reader", group_id=None)
    admin = connection.admin()
    try:
        for client, client_id in (
            (producer.client, "billing-producer"),
            (consumer._client, "billing-reader"),
            (admin._client, "billing-admin"),
        ):
            assert client._bootstrap_servers == "broker-1:9096,broker-2:9096"
            assert client._client_id == client_id
            assert client._request_timeout_ms == 7_000
            assert client._security_protocol == "SASL_SSL"
            assert client._ssl_context is connection.ssl_context
            assert client._sasl_mechanism == "SCRAM-SHA-512"
            assert client._sasl_plain_username == "onward"
            assert client._sasl_plain_password == SASL_PASSWORD
    finally:
        await producer.stop()
        await consumer.stop()
        await admin.close()


async def test_a_group_member_waits_out_a_rebalance_before_its_requests_time_out(
    pki: dict[str, str],
) -> None:
    # The broker holds a JoinGroup for up to the rebalance timeout; timing it out sooner would
    # only make the member join again.
    quick = sasl_ssl(pki, request_timeout_s=1.0)
    member = quick.consumer(group_id="g", session_timeout_ms=10_000)
    reader = quick.consumer(group_id=None)
    try:
        assert member._client._request_timeout_ms == 15_000
        assert reader._client._request_timeout_ms == 1_000
    finally:
        await member.stop()
        await reader.stop()


async def test_a_bootstrap_string_still_makes_a_plaintext_log(pki: dict[str, str]) -> None:
    log = KafkaEventLog("127.0.0.1:9092", client_id="mine", request_timeout_s=3)
    assert log.connection == KafkaConnection("127.0.0.1:9092", "mine", 3.0)
    secured = sasl_ssl(pki)
    assert KafkaEventLog(secured).connection is secured
    assert KafkaEventLog(secured, request_timeout_s=2).connection.request_timeout_s == 2
    assert kafka_connection(secured, client_id="other").sasl_password == SASL_PASSWORD


def test_an_empty_bootstrap_list_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="KAFKA_BOOTSTRAP_SERVERS is empty"):
        KafkaEventLog("")


@pytest.mark.parametrize("servers", [9092, b"127.0.0.1:9092", ["127.0.0.1:9092"]])
def test_bootstrap_servers_of_another_type_are_refused_naming_the_argument(servers: Any) -> None:
    """A port number, bytes or a list in the place of the bootstrap string is refused when the
    log is built, naming the argument, not with an AttributeError from deep in the checks."""
    with pytest.raises(InvalidInputError, match=r"bootstrap_servers .* got (int|bytes|list)"):
        KafkaEventLog(servers)


@pytest.mark.parametrize("topic", ["", 5, None])
def test_an_empty_topic_or_one_of_another_type_is_refused_when_the_log_is_built(
    topic: Any,
) -> None:
    """An empty topic, or a value of another type, is refused by the constructor, naming the
    argument, instead of only when the log is opened."""
    with pytest.raises(InvalidInputError, match=r"^topic (must be|is empty)"):
        KafkaEventLog("127.0.0.1:9092", topic=topic)


@pytest.mark.parametrize("topic", ["", 9092, None])
def test_a_projector_or_requests_with_an_empty_topic_or_another_type_is_refused_when_built(
    topic: Any,
) -> None:
    """`KafkaProjector` and `Requests` refuse an empty topic, or a port number in its place, in
    their constructors naming the argument, as `KafkaEventLog` does, instead of failing late
    when the consumer subscribes or the first request is sent."""
    with pytest.raises(InvalidInputError, match=r"^topic (must be|is empty)"):
        KafkaProjector(
            "127.0.0.1:9092",
            FrontierProjection(MemoryFrontierStore(), MemoryEventLog()),
            topic=topic,
        )
    with pytest.raises(InvalidInputError, match=r"^topic (must be|is empty)"):
        Requests("127.0.0.1:9092", topic, partitions=1)


@pytest.mark.parametrize(
    ("servers", "shown"),
    [
        (f"SASL_SSL://onward:{SASL_PASSWORD}@broker:9094", "SASL_SSL:***@broker:9094"),
        (f"kafka://onward:{SASL_PASSWORD}@broker:9094", "kafka://onward:***@broker:9094"),
        (f"onward:{SASL_PASSWORD}@broker:9094", "onward:***@broker:9094"),
        (f"onward:{SASL_PASSWORD}@broker", "onward:***@broker"),
        (f"b-1:9094,onward:p%40{SASL_PASSWORD}@b-2:9094", "onward:***@b-2:9094"),
    ],
)
def test_a_bootstrap_server_given_with_a_password_is_refused_without_it(
    servers: str, shown: str
) -> None:
    """A connection string pasted where host:port belongs (a managed Kafka's
    ``SASL_SSL://user:password@host:port``) was refused quoting the entry whole, password and
    all, on stderr and in the logs: the entry is named with its password hidden (and the user
    too after a scheme no URL has, ``SASL_SSL``, as `masked_url` reads it)."""
    with pytest.raises(ConfigurationError, match="KAFKA_BOOTSTRAP_SERVERS") as refused:
        KafkaConnection(servers)
    assert shown in str(refused.value)
    assert SASL_PASSWORD not in str(refused.value)


def test_files_are_checked_when_the_connection_is_made(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    with pytest.raises(ConfigurationError, match=f"KAFKA_SSL_CA_LOCATION: cannot read {missing}"):
        KafkaConnection("b:9093", security_protocol="SSL", ssl_ca_location=str(missing))


def test_a_diagnosis_probes_the_addresses_the_client_reads_from_the_bootstrap_list() -> None:
    listed = "::1, [::1]:9093,broker:9095 , broker,[fe80::1]"
    assert _addresses(listed) == [
        ("::1", 9092),
        ("::1", 9093),
        ("broker", 9095),
        ("broker", 9092),
        ("fe80::1", 9092),
    ]


@pytest.mark.parametrize("servers", ["::1", "fe80::1:9092", "[::1]:9093", "broker", "b-1:9096"])
def test_a_bare_ipv6_address_or_a_host_is_a_bootstrap_server(servers: str) -> None:
    """Refusing a server with two colons that is not host:port ("host:9092:x") leaves an
    IPv6 address alone, which the client reads with the default port."""
    assert KafkaConnection(servers).bootstrap_servers == servers


async def test_a_bootstrap_name_that_does_not_resolve_is_said_so() -> None:
    """A typo in a host name failed as "Unable to bootstrap" (retry), as a broker that is down
    does; it stays an outage (DNS can be down for a while) but says the name does not
    resolve, so the typo is seen."""
    connection = KafkaConnection("nonexistent.invalid:9092", request_timeout_s=3)
    with pytest.raises(KafkaConnectionError) as failed:
        await connection.start(connection.admin())
    assert "KAFKA_BOOTSTRAP_SERVERS" in str(failed.value)
    assert "'nonexistent.invalid' does not resolve" in str(failed.value)


async def _said_starting_against_a_silent_server(
    caplog: pytest.LogCaptureFixture, timeout_s: float, *, queue_full: bool = False
) -> tuple[str, float]:
    """Start a client against an address that takes the connection and never answers, until
    the start fails; the one line said about it within 4 s, and the second the
    start failed. The line must say until when (the start's second plus ``timeout_s``, to the
    second the clock shows) and which setting bounds it.

    ``queue_full``: the listener's queue of connections not yet accepted is full (one already
    waits there, and it never accepts), so Linux drops the client's SYN and its TCP connect
    itself hangs, as at an address whose firewall drops packets."""
    with socket.socket() as silent, socket.socket() as queued:
        silent.bind(("127.0.0.1", 0))
        silent.listen(0 if queue_full else 8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        if queue_full:
            queued.connect(silent.getsockname())
        connection = KafkaConnection(address, request_timeout_s=timeout_s)
        began = time.time()
        with caplog.at_level(logging.WARNING, "onward"), pytest.raises(KafkaConnectionError):
            await connection.start(connection.admin())
        failed = time.time()
    said = [r for r in caplog.records if r.name.startswith("onward") and address in r.message]
    assert len(said) == 1, caplog.text
    assert said[0].created - began < 4, f"said after {said[0].created - began:.1f} s"
    message = said[0].getMessage()
    assert f"Kafka at {address} (KAFKA_BOOTSTRAP_SERVERS)" in message
    assert "ONWARD_BACKEND_TIMEOUT" in message
    deadlines = {time.strftime("%H:%M:%S UTC", time.gmtime(began + timeout_s + d)) for d in (0, 1)}
    assert any(f"until {deadline} " in message for deadline in deadlines), message
    return message, failed - began


async def test_a_bootstrap_without_an_answer_says_early_what_it_waits_on_and_until_when(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bootstrap address that takes the connection and never answers (Redis, a hung broker)
    kept the start silent for the whole request timeout (30 s by default), then said "retry":
    within a few seconds it says it is connected there and waits for the answer to its first
    Kafka request, until when and which setting bounds it; it still fails at the timeout."""
    timeout_s = 6
    message, failed_after_s = await _said_starting_against_a_silent_server(caplog, timeout_s)
    assert failed_after_s >= timeout_s - 0.5
    assert "connected, no answer yet to its first Kafka request" in message


async def test_a_bootstrap_whose_connect_hangs_says_the_connection_is_not_yet_taken(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An address where the TCP connect itself hangs (a full accept queue here; a firewall
    that drops packets in a deployment) is told apart from one connected and silent: the line
    says the connection is not yet taken, and the start still fails at the timeout."""
    timeout_s = 4
    message, failed_after_s = await _said_starting_against_a_silent_server(
        caplog, timeout_s, queue_full=True
    )
    assert failed_after_s >= timeout_s - 0.5
    assert "the connection is not yet taken" in message, message


async def test_a_bootstrap_wait_is_said_even_when_aiokafka_hides_the_address(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The address a start waits on is read from aiokafka's private coroutine frames: on an
    aiokafka whose bootstrap is no longer found there, the start was silent for the whole
    request timeout again. It still says, within a few seconds, that it waits for Kafka at
    the configured bootstrap servers, that which address is not known, and until when."""
    # What a newer aiokafka's bootstrap would look like to the frame inspection.
    monkeypatch.setattr(kafka_storage, "_bootstrap_wait", lambda starting: None)
    message, _ = await _said_starting_against_a_silent_server(caplog, 6)
    assert "which address it waits on is not known" in message


@pytest.mark.kafka
async def test_a_kafka_broker_passes_the_check_for_another_kind_of_server(
    kafka_bootstrap: str,
) -> None:
    """The check that finds another kind of server at a bootstrap address (exit 2, which
    stops a supervisor's retries) takes a real broker for Kafka."""
    host, port = _addresses(kafka_bootstrap)[0]
    assert await _kafka_answer(host, port, 3) == "kafka"
