"""`KafkaConnection`: the one place Kafka settings become aiokafka clients.

Every producer, consumer and admin client of Onward is made by `KafkaConnection.producer`,
`KafkaConnection.consumer` or `KafkaConnection.admin`, so the bootstrap servers, the client id,
the request timeout and the security settings (TLS, SASL) are applied the same way everywhere.
The settings keep the names Kafka's own non-Java clients use (``security.protocol`` is
``KAFKA_SECURITY_PROTOCOL``), and every error names the variable to change.

aiokafka says only "Unable to bootstrap" whatever went wrong; `KafkaConnection.start` starts a
client and, when the bootstrap fails, connects once more by hand to learn why: a refused
password, a broker certificate the CA did not sign, a plaintext client at a TLS port, a
client without SASL at a SASL port (or the reverse) and another kind of server at a
bootstrap address are deployment facts (`ConfigurationError`), anything else stays an outage
(a host name that does not resolve is said so).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal, Protocol, get_args

import aiokafka.errors as kafka_errors
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.conn import AIOKafkaConnection, create_conn, get_ip_port_afi
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.admin import SaslHandShakeRequest

from onward.errors import ConfigurationError, InvalidInputError

from .locks import _clock
from .logs import masked_sasl_logs
from .stores import BACKEND_TIMEOUT_S
from .urls import masked_url
from .waits import outlast

log = logging.getLogger("onward.storage")

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
CompressionType = Literal["zstd", "lz4", "gzip", "snappy", "none"]

SECURITY_PROTOCOLS: tuple[str, ...] = get_args(SecurityProtocol)
SASL_MECHANISMS: tuple[str, ...] = get_args(SaslMechanism)
COMPRESSION_TYPES: tuple[str, ...] = get_args(CompressionType)

_PROBE_S = 3.0
"""Most a diagnosis of a failed bootstrap may take, per broker address (capped by the
request timeout): it runs only after the bootstrap already failed."""

_SAY_AFTER_S = 2.0
"""How long a start waits on one bootstrap address before the wait is said in the log: a
server that takes the connection and never answers (a hung broker, or Redis at the address)
would otherwise keep it silent for the whole request timeout."""

_WATCH_EVERY_S = 0.25
"""How often a start's bootstrap is looked at, to tell which address it waits on."""

_GROUP_MARGIN_MS = 5_000
"""How much longer than the rebalance timeout a group member's requests may wait: the broker
holds a JoinGroup until every member joined or the rebalance timeout passed."""


class _Startable(Protocol):
    async def start(self) -> None: ...


async def _stop(client: _Startable) -> None:
    """Stop a producer or consumer (``stop``) or an admin client (``close``); both idempotent."""
    stop = getattr(client, "stop", None) or getattr(client, "close", None)
    if stop is not None:
        with contextlib.suppress(kafka_errors.KafkaError, OSError):
            await stop()


def _client_of(client_owner: Any) -> Any:
    """The aiokafka client of a producer (``client``), consumer or admin (``_client``)."""
    return getattr(client_owner, "client", None) or getattr(client_owner, "_client", None)


def drop_connections(client_owner: Any) -> None:
    """Close the sockets of a client whose stop gave up on a broker that does not answer.

    aiokafka keeps them open while its stop waits, a producer's sender would open new ones to
    retry its batch, and the client's metadata task (its stop cut off before it got there)
    would go on refreshing the metadata every few minutes for as long as the event loop lives,
    opening a connection each time. A consumer's stop cut off while it waited for its group
    coordination likewise leaves its fetcher fetching and its heartbeat task (aiokafka stops
    that only after the coordination ended) keeping it in its group once the broker answers
    again. Stopping them all and closing the sockets leaves nothing behind.
    """
    client = _client_of(client_owner)
    coordinator = getattr(client_owner, "_coordinator", None)
    fetcher = getattr(client_owner, "_fetcher", None)
    for task in (
        getattr(getattr(client_owner, "_sender", None), "sender_task", None),
        getattr(coordinator, "_coordination_task", None),
        getattr(coordinator, "_heartbeat_task", None),
        getattr(coordinator, "_commit_refresh_task", None),
        getattr(fetcher, "_fetch_task", None),
        *getattr(fetcher, "_pending_tasks", ()),
        getattr(client, "_sync_task", None),
    ):
        if isinstance(task, asyncio.Future):
            task.cancel()
    # Whatever waits on the metadata refresh just cancelled (a produce request about to retry)
    # is told it will not come, so it ends rather than wait for ever.
    refresh = getattr(client, "_md_update_fut", None)
    if isinstance(refresh, asyncio.Future) and not refresh.done():
        refresh.set_exception(kafka_errors.KafkaConnectionError("the Kafka client was closed"))
        refresh.exception()  # told to its waiters; nobody else is to be warned about it
    for connection in list(getattr(client, "_conns", {}).values()):
        connection.close()


def _bootstrap_connection(starting: asyncio.Future[None]) -> Any:
    """The connection a client's start is bootstrapping through, or None: the local of
    aiokafka's ``AIOKafkaClient.bootstrap`` the start is suspended in, which nothing else holds
    (aiokafka closes it on every failure but a cancellation)."""
    get_coro = getattr(starting, "get_coro", None)
    awaited: Any = get_coro() if get_coro is not None else None
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None)
        if frame is not None and frame.f_code is AIOKafkaClient.bootstrap.__code__:
            return frame.f_locals.get("bootstrap_conn")
        awaited = getattr(awaited, "cr_await", None)
    return None


def _bootstrap_wait(starting: asyncio.Future[None]) -> tuple[str, int, bool] | None:
    """The address a client's start is bootstrapping through, and whether it is connected
    there (its request sent, no answer yet) rather than still connecting; None when the start
    is not in aiokafka's ``AIOKafkaClient.bootstrap``."""
    get_coro = getattr(starting, "get_coro", None)
    awaited: Any = get_coro() if get_coro is not None else None
    address: tuple[str, int, bool] | None = None
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None)
        if frame is not None and frame.f_code is AIOKafkaClient.bootstrap.__code__:
            host, port = frame.f_locals.get("host"), frame.f_locals.get("port")
            if not isinstance(host, str) or not isinstance(port, int):
                return None
            address = (host, port, True)
        elif (
            address is not None
            and frame is not None
            and frame.f_code is AIOKafkaConnection.connect.__code__
        ):
            connected = getattr(frame.f_locals.get("self"), "_writer", None) is not None
            return (address[0], address[1], connected)
        awaited = getattr(awaited, "cr_await", None)
    return address


async def start_unbroken(
    client: _Startable,
    timeout_s: float,
    *,
    watch: Callable[[asyncio.Future[None]], Awaitable[None]] | None = None,
) -> None:
    """Start ``client``; a cancellation meanwhile (or several) cancels the start at once, closes
    the connection it was bootstrapping through, lets the start end (within ``timeout_s``) and
    is raised after. ``watch``, when given, runs beside the start with it, and is cancelled
    when the start ends.

    aiokafka's bootstrap closes its first connection on every failure but a cancellation, and
    nothing else holds that connection: cancelled while it waited for the cluster's metadata,
    its socket and reader task lived as long as the event loop, whatever stopped the client.
    Waiting for the start to fail by itself instead took the whole request timeout (30 s by
    default, a pod's whole grace period) for a broker that does not answer. ``timeout_s`` is
    the client's request timeout (or about it); the client's own is used when it is longer.
    """
    timeout_s = max(timeout_s, _request_timeout_s(client))
    starting = asyncio.ensure_future(client.start())
    watching = asyncio.ensure_future(watch(starting)) if watch is not None else None
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        if not starting.done():
            bootstrapping = _bootstrap_connection(starting)
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await outlast(starting, timeout_s)
            if bootstrapping is not None:
                bootstrapping.close()
        if starting.done() and not starting.cancelled():
            starting.exception()  # superseded by the cancellation
        raise
    finally:
        if watching is not None:
            watching.cancel()


def _request_timeout_s(client_owner: Any) -> float:
    """The request timeout ``client_owner`` was built with, in seconds (0 when not known)."""
    client = _client_of(client_owner)
    timeout_ms = getattr(client, "_request_timeout_ms", None)
    return timeout_ms / 1000 if isinstance(timeout_ms, (int, float)) else 0.0


@contextlib.contextmanager
def _bootstrapped_within(client_owner: Any, timeout_ms: int) -> Iterator[None]:
    """While it starts, ``client_owner``'s requests wait at most ``timeout_ms``, then again
    the request timeout it was built with.

    A group member is built with a longer one (the broker holds its JoinGroup for the
    rebalance timeout, `KafkaConnection.consumer`), and its start would wait that long for a
    broker that does not answer, cancelled or not: a worker or projector told to stop while
    it connected outlived ``ONWARD_BACKEND_TIMEOUT``. A start talks to the bootstrap servers
    only; the group's connections are made after it (on `subscribe`), with the longer one.
    """
    client: Any = _client_of(client_owner)
    built = getattr(client, "_request_timeout_ms", None)
    if not isinstance(built, int) or built <= timeout_ms:
        yield
        return
    client._request_timeout_ms = timeout_ms
    try:
        yield
    finally:
        client._request_timeout_ms = built


async def stop_or_drop(client: Any, timeout_s: float) -> None:
    """Stop a producer, consumer or admin client within ``timeout_s``; if the stop does not
    finish in time (a broker that does not answer) or is cancelled, drop its connections and
    tasks (`drop_connections`) so nothing of it is left running."""
    try:
        async with asyncio.timeout(timeout_s):
            await _stop(client)
    except TimeoutError:
        drop_connections(client)
    except BaseException:
        drop_connections(client)
        raise


def _server_problem(server: str) -> str | None:
    """Why one ``host[:port]`` (``[v6]:port``) of the bootstrap list is unusable, or None: said
    here, naming the variable, rather than by the client's parser as the agent's failure. The
    entry is shown without a password (`masked_url`): a connection string pasted where
    host:port belongs (``SASL_SSL://user:password@host:port``) is one reason it is refused."""
    shown = masked_url(server)
    if not server:
        return "an empty entry between commas"
    if "://" in server:
        # Kafka's listener syntax (PLAINTEXT://host:port) or a typed scheme: the client would
        # take it for a host name and report the brokers as unreachable, which no retry cures.
        scheme = server.partition("://")[0]
        return (
            f"{shown!r} has a scheme ({scheme}://), which the clients take for part of the "
            "host (KAFKA_SECURITY_PROTOCOL says how to connect)"
        )
    if server.startswith("["):
        host, bracket, rest = server[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            return f"{shown!r} is not [IPv6 address]:port"
        port = rest[1:] if rest else None
    elif ":" in server:
        host, _, port = server.rpartition(":")
        if _is_ipv6_address(server):
            port = None  # a bare IPv6 address: the default port
        elif not host or ":" in host:
            # The client reads host:port from the last colon: "host:9092:x" failed in its
            # parser, as if the agent had raised it.
            return (
                f"{shown!r} is neither host:port nor an IPv6 address ([address]:port)"
                if host
                else f"{shown!r} has no host"
            )
    else:
        port = None  # a host: the default port
    if port is None or (port.isascii() and port.isdigit() and int(port) <= 65535):
        return None
    return f"{shown!r} has a port that is not a number from 0 to 65535"


def _is_ipv6_address(text: str) -> bool:
    """Whether ``text`` is an IPv6 address, as the client tells one from ``host:port``."""
    try:
        socket.inet_pton(socket.AF_INET6, text)
    except (OSError, ValueError):
        return False
    return True


@dataclasses.dataclass(frozen=True, repr=False)
class KafkaConnection:
    """Where the Kafka brokers are and how to reach them; makes every client Onward uses.

    Built by `onward.runtime.settings.Settings.kafka_connection` from the ``KAFKA_*``
    variables, or directly. The passwords are kept out of ``repr``, ``str`` and every error.

    Args:
        bootstrap_servers: ``host:port[,host:port...]`` (``KAFKA_BOOTSTRAP_SERVERS``).
        client_id: Shown in broker logs (``KAFKA_CLIENT_ID``); clients add their role.
        request_timeout_s: How long one request may wait for a broker before it fails; every
            client made here gets it (``ONWARD_BACKEND_TIMEOUT``).
        security_protocol: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``
            (``KAFKA_SECURITY_PROTOCOL``).
        sasl_mechanism: ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``
            (``KAFKA_SASL_MECHANISM``); required with the ``SASL_*`` protocols.
        sasl_username: ``KAFKA_SASL_USERNAME``.
        sasl_password: ``KAFKA_SASL_PASSWORD``; never shown.
        ssl_ca_location: PEM file of the CA that signed the brokers' certificates
            (``KAFKA_SSL_CA_LOCATION``); the system's CAs when unset.
        ssl_certificate_location: PEM client certificate, for brokers that require one
            (``KAFKA_SSL_CERTIFICATE_LOCATION``).
        ssl_key_location: PEM private key of that certificate (``KAFKA_SSL_KEY_LOCATION``).
        ssl_key_password: Password of that key (``KAFKA_SSL_KEY_PASSWORD``); never shown.
        compression_type: How producers compress record batches (``KAFKA_COMPRESSION_TYPE``):
            ``zstd`` (the default), ``lz4``, ``gzip``, ``snappy`` or ``none``. The broker keeps
            a batch as the producer compressed it (a topic's ``compression.type=producer``,
            Kafka's default), so the log's bytes on disk and on the wire shrink alike; every
            consumer, kcat included, decompresses on its own.

    Raises:
        ConfigurationError: A setting is unusable (a SASL protocol without credentials, TLS
            files that are missing or unreadable); the message names the variable.
    """

    bootstrap_servers: str
    client_id: str = "onward"
    request_timeout_s: float = BACKEND_TIMEOUT_S
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = dataclasses.field(default=None, compare=False)
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = dataclasses.field(default=None, compare=False)
    compression_type: str = "zstd"
    ssl_context: ssl.SSLContext | None = dataclasses.field(init=False, default=None, compare=False)
    """Built once from the ``ssl_*`` files when the protocol uses TLS; shared by every client."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not self.bootstrap_servers.strip():
            raise ConfigurationError("KAFKA_BOOTSTRAP_SERVERS is empty")
        for server in self.bootstrap_servers.strip().split(","):
            problem = _server_problem(server.strip())
            if problem:
                raise ConfigurationError(
                    f"KAFKA_BOOTSTRAP_SERVERS: {problem}; give host:port[,host:port...]"
                )
        if not self.client_id:
            raise ConfigurationError("KAFKA_CLIENT_ID is empty")
        if not self.request_timeout_s > 0:
            raise ConfigurationError(
                f"the Kafka request timeout must be positive, got {self.request_timeout_s}"
            )
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ConfigurationError(
                f"KAFKA_SECURITY_PROTOCOL is {self.security_protocol!r}; it must be one of "
                + ", ".join(SECURITY_PROTOCOLS)
            )
        if self.compression_type not in COMPRESSION_TYPES:
            raise ConfigurationError(
                f"KAFKA_COMPRESSION_TYPE is {self.compression_type!r}; it must be one of "
                + ", ".join(COMPRESSION_TYPES)
            )
        self._check_sasl()
        self._check_ssl()
        if self.uses_sasl:
            masked_sasl_logs()  # every client of this connection logs its SASL request at DEBUG
        if self.uses_tls:
            object.__setattr__(self, "ssl_context", self._build_ssl_context())

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol.endswith("SSL")

    def _check_sasl(self) -> None:
        given = {
            "KAFKA_SASL_MECHANISM": self.sasl_mechanism,
            "KAFKA_SASL_USERNAME": self.sasl_username,
            "KAFKA_SASL_PASSWORD": self.sasl_password,
        }
        if not self.uses_sasl:
            stray = [name for name, value in given.items() if value]
            if stray:
                raise ConfigurationError(
                    f"{', '.join(stray)} set but KAFKA_SECURITY_PROTOCOL is "
                    f"{self.security_protocol}, which does not use SASL (SASL_SSL or "
                    "SASL_PLAINTEXT does)"
                )
            return
        missing = [name for name, value in given.items() if not value]
        if missing:
            raise ConfigurationError(
                f"KAFKA_SECURITY_PROTOCOL is {self.security_protocol}, which needs "
                f"{', '.join(missing)}"
            )
        if self.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigurationError(
                f"KAFKA_SASL_MECHANISM is {self.sasl_mechanism!r}; it must be one of "
                + ", ".join(SASL_MECHANISMS)
            )

    def _ssl_files(self) -> dict[str, str | None]:
        return {
            "KAFKA_SSL_CA_LOCATION": self.ssl_ca_location,
            "KAFKA_SSL_CERTIFICATE_LOCATION": self.ssl_certificate_location,
            "KAFKA_SSL_KEY_LOCATION": self.ssl_key_location,
        }

    def _check_ssl(self) -> None:
        given = {**self._ssl_files(), "KAFKA_SSL_KEY_PASSWORD": self.ssl_key_password}
        if not self.uses_tls:
            stray = [name for name, value in given.items() if value]
            if stray:
                raise ConfigurationError(
                    f"{', '.join(stray)} set but KAFKA_SECURITY_PROTOCOL is "
                    f"{self.security_protocol}, which does not use TLS (SSL or SASL_SSL does)"
                )
            return
        if self.ssl_key_location and not self.ssl_certificate_location:
            raise ConfigurationError(
                "KAFKA_SSL_KEY_LOCATION is set without KAFKA_SSL_CERTIFICATE_LOCATION"
            )
        if self.ssl_key_password and not (self.ssl_key_location or self.ssl_certificate_location):
            raise ConfigurationError("KAFKA_SSL_KEY_PASSWORD is set without KAFKA_SSL_KEY_LOCATION")
        for name, location in self._ssl_files().items():
            if not location:
                continue
            try:
                with open(location, "rb") as file:
                    file.read(1)
            except OSError as exc:
                raise ConfigurationError(
                    f"{name}: cannot read {location}: {exc.strerror or exc}"
                ) from None

    def _build_ssl_context(self) -> ssl.SSLContext:
        try:
            context: ssl.SSLContext = create_ssl_context(cafile=self.ssl_ca_location)
        except ssl.SSLError as exc:
            raise ConfigurationError(
                f"KAFKA_SSL_CA_LOCATION: {self.ssl_ca_location} holds no usable PEM "
                f"certificate ({exc.reason or exc})"
            ) from None
        if self.ssl_certificate_location:
            try:
                context.load_cert_chain(
                    self.ssl_certificate_location,
                    self.ssl_key_location,
                    # Never None: OpenSSL would then ask for an encrypted key's password on the
                    # terminal (waiting for ever) or, without one, fail with a bare OSError.
                    password=self.ssl_key_password or "",
                )
            except ssl.SSLError as exc:
                names = "KAFKA_SSL_CERTIFICATE_LOCATION, KAFKA_SSL_KEY_LOCATION"
                if self.ssl_key_password:
                    names += " or KAFKA_SSL_KEY_PASSWORD"
                    why = "wrong key, key password or PEM"
                else:
                    why = "wrong key or PEM, or an encrypted key without KAFKA_SSL_KEY_PASSWORD"
                raise ConfigurationError(
                    f"{names}: the client certificate and key cannot be loaded "
                    f"({exc.reason or why})"
                ) from None
        return context

    def __repr__(self) -> str:
        shown = [
            f"bootstrap_servers={self.bootstrap_servers!r}",
            f"client_id={self.client_id!r}",
            f"request_timeout_s={self.request_timeout_s!r}",
            f"security_protocol={self.security_protocol!r}",
            f"compression_type={self.compression_type!r}",
        ]
        if self.uses_sasl:
            shown += [
                f"sasl_mechanism={self.sasl_mechanism!r}",
                f"sasl_username={self.sasl_username!r}",
                "sasl_password='**********'",
            ]
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            if getattr(self, name):
                shown.append(f"{name}={getattr(self, name)!r}")
        if self.ssl_key_password:
            shown.append("ssl_key_password='**********'")
        return f"KafkaConnection({', '.join(shown)})"

    __str__ = __repr__

    @property
    def request_timeout_ms(self) -> int:
        return max(1, int(self.request_timeout_s * 1000))

    def _options(self, role: str | None, options: dict[str, Any]) -> dict[str, Any]:
        """What every client gets, under ``options`` (which win where they say otherwise)."""
        made: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": f"{self.client_id}-{role}" if role else self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
            "security_protocol": self.security_protocol,
        }
        if self.ssl_context is not None:
            made["ssl_context"] = self.ssl_context
        if self.uses_sasl:
            made.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        made.update(options)
        return made

    def producer(self, *, role: str | None = "producer", **options: Any) -> AIOKafkaProducer:
        """An `AIOKafkaProducer` (not started) with this connection's settings and
        ``options``; its client id is ``client_id-role``; it compresses by
        ``compression_type`` unless ``options`` say otherwise."""
        compression = None if self.compression_type == "none" else self.compression_type
        return AIOKafkaProducer(**self._options(role, {"compression_type": compression, **options}))

    def consumer(
        self, *topics: str, role: str | None = "consumer", **options: Any
    ) -> AIOKafkaConsumer:
        """An `AIOKafkaConsumer` (not started) with this connection's settings and ``options``.

        A group member's requests may wait at least the rebalance timeout (plus a margin):
        the broker holds its JoinGroup that long while the group re-forms, and failing it
        sooner would only make the member join again.
        """
        made = self._options(role, options)
        if made.get("group_id") is not None and "request_timeout_ms" not in options:
            rebalance = options.get("rebalance_timeout_ms") or options.get(
                "session_timeout_ms", 10_000
            )
            made["request_timeout_ms"] = max(
                made["request_timeout_ms"], int(rebalance) + _GROUP_MARGIN_MS
            )
        return AIOKafkaConsumer(*topics, **made)

    def admin(self, *, role: str | None = "admin", **options: Any) -> AIOKafkaAdminClient:
        """An `AIOKafkaAdminClient` (not started) with this connection's settings and
        ``options``."""
        return AIOKafkaAdminClient(**self._options(role, options))

    async def start(self, client: _Startable) -> None:
        """Start ``client``; when it cannot bootstrap, say why if a setting is the reason.

        Raises:
            ConfigurationError: The brokers refused the SASL credentials, their certificate
                is not signed by the configured CA, they expect TLS from a plaintext
                client, or another kind of server answers at a bootstrap address: one line
                naming the variable.
            KafkaError: Any other failure, as the client raised it, with the host names
                that do not resolve said (an outage: the caller translates it to
                `BackendUnavailableError`).

        Whatever ends the start early, a failure or a cancellation (a startup cut short, a
        timeout around it), ``client`` is stopped (`stop_or_drop`) before it propagates: the
        caller never got a started client to close, and one that connected would otherwise
        keep its connections and background tasks for as long as the event loop lives.
        """
        try:
            with _bootstrapped_within(client, self.request_timeout_ms):
                await self._start(client)
        except BaseException:
            await stop_or_drop(client, self.request_timeout_s)
            raise

    async def _start(self, client: _Startable) -> None:
        began = time.monotonic()
        built_s = _request_timeout_s(client)
        wait_s = min(built_s, self.request_timeout_s) if built_s else self.request_timeout_s

        async def watch(starting: asyncio.Future[None]) -> None:
            await self._say_waits(starting, wait_s)

        try:
            await start_unbroken(client, self.request_timeout_s, watch=watch)
        except kafka_errors.KafkaConnectionError as exc:
            if time.monotonic() - began >= self.request_timeout_s:
                # The brokers let a whole request timeout pass without a word: no setting is to
                # blame (a refused password, an unknown CA or a TLS mismatch fails at once), and
                # a diagnosis would wait as long again (ONWARD_BACKEND_TIMEOUT is the bound).
                raise
            problem = await self.diagnose()
            if problem is not None:
                raise ConfigurationError(problem) from exc
            probe_s = min(_PROBE_S, self.request_timeout_s)
            unresolved = await _unresolved_hosts(self.bootstrap_servers, probe_s)
            if not unresolved:
                raise
            # Still an outage (a DNS server can be away for a while), but a typo must show.
            names = ", ".join(repr(host) for host in unresolved)
            said = exc.args[0] if exc.args else "Unable to bootstrap"
            raise kafka_errors.KafkaConnectionError(
                f"{said}: {names} {'does' if len(unresolved) == 1 else 'do'} not resolve (check "
                "KAFKA_BOOTSTRAP_SERVERS for a typo)"
            ) from exc

    async def _say_waits(self, starting: asyncio.Future[None], wait_s: float) -> None:
        """Say once per bootstrap address that a start has waited on it `_SAY_AFTER_S`: which
        address, whether connected (a silent server cannot be told from a hung broker, but it
        must not be waited on in silence) and when the wait gives up.

        The address is read from aiokafka's private coroutine frames: when none is ever found
        there (an aiokafka whose bootstrap looks otherwise), the wait is still said once, naming
        the bootstrap list instead of one address."""
        began = time.monotonic()
        first_seen: dict[tuple[str, int], float] = {}
        said: set[tuple[str, int]] = set()
        said_unseen = False
        while not starting.done():
            await asyncio.sleep(_WATCH_EVERY_S)
            waiting = _bootstrap_wait(starting)
            if waiting is None:
                if not first_seen and not said_unseen and time.monotonic() - began >= _SAY_AFTER_S:
                    said_unseen = True
                    self._say_unseen_wait(time.monotonic() - began, wait_s)
                continue
            host, port, connected = waiting
            # The first address is tried as the start begins; a later one when it is seen.
            seen = first_seen.setdefault((host, port), time.monotonic() if first_seen else began)
            waited = time.monotonic() - seen
            if (host, port) in said or waited < _SAY_AFTER_S:
                continue
            said.add((host, port))
            state = (
                "connected, no answer yet to its first Kafka request"
                if connected
                else "the connection is not yet taken"
            )
            log.warning(
                "waiting for Kafka at %s:%s (KAFKA_BOOTSTRAP_SERVERS): %s; waits until %s (the "
                "request timeout, ONWARD_BACKEND_TIMEOUT: %g s), then gives up on it",
                host,
                port,
                state,
                _clock(time.time() - waited + wait_s),
                wait_s,
            )

    def _say_unseen_wait(self, waited_s: float, wait_s: float) -> None:
        """Say that a start has waited ``waited_s`` on the bootstrap list, not knowing on which
        address: each is waited on up to ``wait_s`` in turn."""
        addresses = max(len(_addresses(self.bootstrap_servers)), 1)
        log.warning(
            "waiting for Kafka at %s (KAFKA_BOOTSTRAP_SERVERS): no answer yet to the client's "
            "start (which address it waits on is not known: this aiokafka's bootstrap could not "
            "be looked into); waits until %s (the request timeout, ONWARD_BACKEND_TIMEOUT: %g s "
            "per address), then gives up",
            self.bootstrap_servers.strip(),
            _clock(time.time() - waited_s + wait_s * addresses),
            wait_s,
        )

    async def diagnose(self) -> str | None:
        """Why this connection's settings cannot reach the brokers, or ``None`` when the
        settings are not the reason (a broker down, a network cut).

        Connects to every bootstrap address once, at the same time and in bounded time, doing
        what a client does (TLS, the version lookup, the SASL exchange), and names the setting
        that made it fail.
        """
        timeout_s = min(_PROBE_S, self.request_timeout_s)
        problems = await asyncio.gather(
            *(
                self._diagnose_address(host, port, timeout_s)
                for host, port in _addresses(self.bootstrap_servers)
            )
        )
        return next((problem for problem in problems if problem is not None), None)

    async def _diagnose_address(self, host: str, port: int, timeout_s: float) -> str | None:
        where = f"{host}:{port}"
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host,
                    port,
                    client_id=self.client_id,
                    request_timeout_ms=int(timeout_s * 1000),
                    ssl_context=self.ssl_context,
                    security_protocol=self.security_protocol,
                    sasl_mechanism=self.sasl_mechanism or "PLAIN",
                    sasl_plain_username=self.sasl_username,
                    sasl_plain_password=self.sasl_password,
                ),
                timeout_s,
            )
        except kafka_errors.IllegalSaslStateError:
            # The broker's answer to a SASL handshake on a listener without SASL.
            return (
                f"KAFKA_SECURITY_PROTOCOL is {self.security_protocol} but Kafka at {where} "
                f"does not take SASL ({'SSL' if self.uses_tls else 'PLAINTEXT'}, without the "
                "KAFKA_SASL_* settings)"
            )
        except (
            kafka_errors.SaslAuthenticationFailed,
            kafka_errors.AuthenticationFailedError,
        ):
            return (
                f"Kafka at {where} refused KAFKA_SASL_USERNAME {self.sasl_username!r} with "
                f"KAFKA_SASL_PASSWORD over {self.sasl_mechanism} (an unknown user or a wrong "
                "password)"
            )
        except (
            kafka_errors.UnsupportedSaslMechanismError,
            kafka_errors.AuthenticationMethodNotSupported,
        ):
            return f"Kafka at {where} does not accept KAFKA_SASL_MECHANISM {self.sasl_mechanism}"
        except ssl.SSLCertVerificationError as exc:
            return (
                f"Kafka at {where}: the broker's certificate does not verify against "
                f"KAFKA_SSL_CA_LOCATION ({self.ssl_ca_location or 'the system CAs'}): "
                f"{exc.verify_message or exc.reason}"
            )
        except (OSError, TimeoutError, kafka_errors.KafkaError):
            return await self._failed_connection(host, port, timeout_s)
        try:
            return None if self.uses_sasl else await self._sasl_required(conn, where, timeout_s)
        finally:
            conn.close()

    async def _sasl_required(self, conn: Any, where: str, timeout_s: float) -> str | None:
        """Whether the listener behind ``conn`` (connected without SASL) takes only SASL.

        Such a listener answers the version lookup and then drops the connection at the first
        other request, which the client reports as an unreachable broker; asked for a SASL
        handshake, it lists its mechanisms, where a listener without SASL lists none.
        """
        try:
            answer = await asyncio.wait_for(conn.send(SaslHandShakeRequest("PLAIN")), timeout_s)
        except (OSError, TimeoutError, kafka_errors.KafkaError):
            return None
        mechanisms = [str(name) for name in getattr(answer, "enabled_mechanisms", None) or ()]
        if not mechanisms:
            return None
        # Only the mechanisms Onward speaks can be set; a broker may offer others (GSSAPI).
        usable = [name for name in mechanisms if name in SASL_MECHANISMS] or mechanisms
        return (
            f"KAFKA_SECURITY_PROTOCOL is {self.security_protocol} but Kafka at {where} takes "
            f"only SASL ({'SASL_SSL' if self.uses_tls else 'SASL_PLAINTEXT'}, with "
            f"KAFKA_SASL_MECHANISM {' or '.join(usable)} and KAFKA_SASL_USERNAME and "
            "KAFKA_SASL_PASSWORD)"
        )

    async def _failed_connection(self, host: str, port: int, timeout_s: float) -> str | None:
        """Why a connection to ``host:port`` failed, when a setting is the reason: TLS where the
        protocol says plaintext (or the reverse), or another kind of server at the address
        (which takes no TLS either: asked in plaintext, it says what it is)."""
        mismatch = await self._protocol_mismatch(host, port, timeout_s)
        if (mismatch is None) == self.uses_tls:
            return mismatch  # TLS answered (Kafka or not), or nothing did: no more to tell
        if await _kafka_answer(host, port, timeout_s) == "other":
            return (
                f"KAFKA_BOOTSTRAP_SERVERS: {host}:{port} does not answer as Kafka (another kind "
                "of server listens there: check the host and the port)"
            )
        return mismatch

    async def _protocol_mismatch(self, host: str, port: int, timeout_s: float) -> str | None:
        """Whether ``host:port`` speaks TLS where the protocol says plaintext, or the reverse."""
        answer = await _tls_answer(host, port, timeout_s)
        said = f"KAFKA_SECURITY_PROTOCOL is {self.security_protocol} but Kafka at {host}:{port}"
        if answer == "tls" and not self.uses_tls:
            return f"{said} expects TLS ({'SASL_SSL' if self.uses_sasl else 'SSL or SASL_SSL'})"
        if answer == "plain" and self.uses_tls:
            return f"{said} does not speak TLS (a PLAINTEXT or SASL_PLAINTEXT listener)"
        return None


def kafka_connection(
    servers: str | KafkaConnection,
    *,
    client_id: str | None = None,
    request_timeout_s: float | None = None,
) -> KafkaConnection:
    """``servers`` as a `KafkaConnection`: a bootstrap string gets a plaintext one; a connection
    is kept, with ``client_id`` and ``request_timeout_s`` put in where they are given.

    Lets every Kafka class take either, so ``KafkaEventLog("127.0.0.1:9092")`` still works and
    a secured deployment passes `Settings.kafka_connection()` in its place.
    """
    if not isinstance(servers, str | KafkaConnection):
        raise InvalidInputError(
            "bootstrap_servers must be a 'host:port[,host:port...]' string or a "
            f"KafkaConnection, got {type(servers).__name__}"
        )
    if isinstance(servers, KafkaConnection):
        changes: dict[str, Any] = {}
        if client_id is not None and client_id != servers.client_id:
            changes["client_id"] = client_id
        if request_timeout_s is not None and request_timeout_s != servers.request_timeout_s:
            changes["request_timeout_s"] = request_timeout_s
        return dataclasses.replace(servers, **changes) if changes else servers
    return KafkaConnection(
        servers,
        client_id=client_id or "onward",
        request_timeout_s=BACKEND_TIMEOUT_S if request_timeout_s is None else request_timeout_s,
    )


def checked_topic(topic: object, argument: str = "topic") -> str:
    """``topic``, refused when a log is built if it is no string or empty, rather than by the
    broker when the log is first opened. A name with characters Kafka does not take is left to
    the broker, whose refusal (``INVALID_TOPIC``) is reported as it said it.

    Raises:
        InvalidInputError: ``topic`` is no string or is empty; the message names ``argument``.
    """
    if not isinstance(topic, str):
        raise InvalidInputError(
            f"{argument} must be a Kafka topic name (a string), got {type(topic).__name__} "
            f"{topic!r}"
        )
    if not topic:
        raise InvalidInputError(
            f"{argument} is empty; give a Kafka topic name: 1 to 249 of letters, digits, '.', "
            "'_' and '-'"
        )
    return topic


def _addresses(bootstrap_servers: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs of a bootstrap list, read as the client reads them (port 9092
    where none is given, a bare IPv6 address such as ``::1`` taken whole), so a diagnosis
    probes the addresses the client could not reach."""
    found = []
    for listed in bootstrap_servers.split(","):
        server = listed.strip()
        if server:
            host, port, _ = get_ip_port_afi(server)
            found.append((host, port))
    return found


async def _tls_answer(host: str, port: int, timeout_s: float) -> Literal["tls", "plain"] | None:
    """How ``host:port`` answers a TLS ClientHello: ``"tls"`` (a handshake, any certificate),
    ``"plain"`` (it took the connection and dropped the hello) or ``None`` (no connection, or
    no answer in ``timeout_s``: nothing to tell from).

    A plaintext Kafka listener reads the hello as a malformed request and closes the
    connection, so only a TLS listener completes the handshake.
    """
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return None
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), timeout_s)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, server_hostname=host), timeout_s
        )
    except TimeoutError:
        return None
    except (ssl.SSLError, ConnectionError):
        return "plain"
    except OSError:
        return None
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), timeout_s)
    return "tls"


async def _unresolved_hosts(bootstrap_servers: str, timeout_s: float) -> list[str]:
    """The host names of a bootstrap list that do not resolve (an IP address always does)."""

    async def unresolved(host: str, port: int) -> bool:
        try:
            await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, port), timeout_s)
        except socket.gaierror:
            return True
        except (OSError, TimeoutError):
            return False  # no answer from the resolver is not an answer that the name is unknown
        return False

    hosts = dict.fromkeys(_addresses(bootstrap_servers))
    found = await asyncio.gather(*(unresolved(host, port) for host, port in hosts))
    return list(dict.fromkeys(host for (host, _), gone in zip(hosts, found, strict=True) if gone))


_PROBE_CORRELATION_ID = 0x4F4E5744
"""The correlation id of `_kafka_answer`'s request, which a Kafka answer repeats."""

_PROBE_ANSWER_MAX = 1 << 20
"""Most bytes a broker's ApiVersions answer takes (a few hundred); a larger length is no
Kafka answer (the first bytes of another protocol's reply)."""


async def _kafka_answer(host: str, port: int, timeout_s: float) -> Literal["kafka", "other"] | None:
    """How ``host:port`` (plaintext) answers an ApiVersions v0 request: ``"kafka"`` (an answer
    that repeats the request's correlation id), ``"other"`` (bytes that are no Kafka answer) or
    ``None`` (no connection, no answer, or the connection closed: nothing to tell from, as
    from a broker starting or stopping).

    Every Kafka broker since 0.10 answers version 0 of the request, whatever it speaks after;
    a server of another protocol that answers at all (PostgreSQL, HTTP) answers with an error
    of its own. A silent one (Redis, which waits for a line break) cannot be told from a
    broker that does not answer.
    """
    client_id = b"onward-probe"
    header = struct.pack(">hhih", 18, 0, _PROBE_CORRELATION_ID, len(client_id)) + client_id
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(struct.pack(">i", len(header)) + header)
        length = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout_s))[0]
        if not 4 <= length <= _PROBE_ANSWER_MAX:
            return "other"
        answer = await asyncio.wait_for(reader.readexactly(length), timeout_s)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), timeout_s)
    correlation_id = struct.unpack(">i", answer[:4])[0]
    return "kafka" if correlation_id == _PROBE_CORRELATION_ID else "other"
