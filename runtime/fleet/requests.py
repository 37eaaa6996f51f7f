"""What a fleet of `onward worker` processes is asked to do, and the client that asks.

Requests are msgspec tagged Structs, JSON on the wire, keyed by run id on a Kafka topic
(``onward.requests`` by default) with as many partitions as the events topic. A request for
run R goes to partition ``partition_for(R, partitions)``, the function the event log places R
with, so the worker that owns requests partition p owns every run of event-log partition p.
Ownership only routes work: leases stay the arbiter of who may write to a run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from onward._storage import Resource, translate
from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    OnwardError,
    PayloadTooLargeError,
    ProducerFatalError,
)
from onward.eventlog.base import partition_for
from onward.eventlog.codec import unencodable
from onward.runtime.limits import (
    MAX_NOTE_LENGTH,
    check_depth,
    check_label,
    check_name,
    check_note,
    check_stored_name,
)
from onward.runtime.options import checked_options
from onward.runtime.redaction import Redactor

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

    from onward._storage import KafkaConnection
from onward.runtime.signing import SIGNATURE_HEADER, RequestSigner

DEFAULT_REQUESTS_TOPIC = "onward.requests"

REQUESTS_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
"""How long the broker keeps a request (``retention.ms`` of a topic `ensure_requests_topic`
creates): 7 days. A request is acted on within seconds; what it carries (a run's input, a
person's answer) is kept for good in the event log, so the requests topic need not keep it."""

MAX_REQUEST_BYTES = 1_048_576
"""Largest request record the producer sends (its ``max_request_size``, aiokafka's default,
under the broker's default ``message.max.bytes``); a batch holding a larger one sends nothing."""


class StartRun(msgspec.Struct, frozen=True, kw_only=True, tag="start"):
    """Start run ``run_id`` of agent ``agent`` (a name the workers know) with ``input``;
    ``options`` are recorded in its `RunStarted` (`onward.runtime.options.Options.recorded`)."""

    run_id: str
    tenant: str
    agent: str
    input: Any = None
    options: dict[str, Any] = {}


class ResumeRun(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="resume"):
    """Carry run ``run_id`` on from the log (after a person answered or settled a call).
    ``agent``: the run's, when the sender knows it: a PostgreSQL fleet hands the request to a
    worker that carries it (one that does not could not carry the run on)."""

    run_id: str
    tenant: str
    agent: str | None = None


class AnswerRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="answer"):
    """Answer the person's request ``request_id`` of a waiting run; an approval carries it on.
    ``agent``: as for `ResumeRun`."""

    run_id: str
    tenant: str
    request_id: str
    approve: bool
    by: str
    value: Any = None
    agent: str | None = None


class TagRun(msgspec.Struct, frozen=True, kw_only=True, tag="tag"):
    """Put ``label`` on one of the run's events (by default its latest boundary)."""

    run_id: str
    tenant: str
    label: str
    seq: int | None = None
    by: str = "tagger"


class CancelRun(msgspec.Struct, frozen=True, kw_only=True, tag="cancel"):
    """End the run ``cancelled`` as person ``by`` (``why`` recorded with it); one its owner is
    driving stops at its next boundary first (`AgentRunner.cancel`)."""

    run_id: str
    tenant: str
    by: str
    why: str = ""


Request = StartRun | ResumeRun | AnswerRequest | TagRun | CancelRun

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Request)


def encode_request(request: Request) -> bytes:
    """The wire form of a request: JSON with a ``type`` tag."""
    return _encoder.encode(request)


def decode_request(data: bytes | None) -> Request:
    """A request from its wire form, checked as every entry point checks what it is given.

    Anyone who can produce to the topic can write any bytes there; whatever they are, this
    either returns a request a worker may act on or raises `InvalidInputError`, so a worker
    sets the record aside rather than crash on it (and crash every worker that takes the
    partition after it).

    Raises:
        InvalidInputError: Not a request this code knows: no value (a tombstone), not JSON,
            JSON nested too deep to read, or a field out of bounds (`check_request`); the
            reason is one line, naming the path to the bad value where there is one.
    """
    if data is None:
        raise InvalidInputError("unreadable request: the record has no value (a tombstone)")
    try:
        request = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"unreadable request: {exc}") from exc
    except RecursionError as exc:
        raise InvalidInputError("unreadable request: JSON nested deeper than can be read") from exc
    except (TypeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidInputError(f"unreadable request: {type(exc).__name__} decoding it") from exc
    check_request(request)
    return request


def check_request(request: Request) -> None:
    """Refuse a request whose names or values are out of bounds (`onward.runtime.limits`), or
    a start whose options `Options` does not take (`checked_options`).

    Raises:
        InvalidInputError: The first field out of bounds, named with its request's type.
    """
    what = type(request).__name__
    # A start names a new run; every other request an existing one, as it was stored.
    named = check_name if isinstance(request, StartRun) else check_stored_name
    run_id = named(f"{what}.run_id", request.run_id)
    named(f"{what}.tenant", request.tenant, run_id=run_id)
    agent = getattr(request, "agent", None)
    if isinstance(request, StartRun) or agent is not None:
        named(f"{what}.agent", agent, run_id=run_id)
    if isinstance(request, StartRun):
        check_depth(f"{what}.input", request.input, run_id=run_id)
        _check_encodable(f"{what}.input", request.input, run_id)
        checked_options(request.options)
    elif isinstance(request, AnswerRequest):
        check_stored_name(f"{what}.request_id", request.request_id, run_id=run_id)
        check_name(f"{what}.by", request.by, run_id=run_id)
        check_depth(f"{what}.value", request.value, run_id=run_id)
        _check_encodable(f"{what}.value", request.value, run_id)
    elif isinstance(request, TagRun):
        check_label(f"{what}.label", request.label, run_id=run_id)
        check_name(f"{what}.by", request.by, run_id=run_id)
    elif isinstance(request, CancelRun):
        check_name(f"{what}.by", request.by, run_id=run_id)
        if request.why != "":  # any other value, None too, is refused
            check_note(f"{what}.why", request.why, run_id=run_id)


def _check_encodable(field: str, value: Any, run_id: str) -> None:
    """Refuse a value JSON would change (``nan`` becomes ``null``) or cannot hold."""
    fault = unencodable(value)
    if fault is not None:
        raise InvalidInputError(f"{field} cannot be sent: {fault}", run_id=run_id)


class PreparedRequest(msgspec.Struct, frozen=True):
    """A request as it is sent: its run, key and wire value (values masked), and signature."""

    run_id: str
    kind: str
    key: bytes
    value: bytes
    signature: bytes | None


def prepare_requests(
    requests: Sequence[Request], redactor: Redactor, signer: RequestSigner | None
) -> list[PreparedRequest]:
    """Check every request, then mask and sign each, as every transport sends them.

    A start's input and options, an answer's value and a cancel's reason are masked: the
    requests transport keeps what it was sent for days, and would otherwise hold what the
    event log only ever holds masked.

    Raises:
        InvalidInputError: A request a worker would refuse (`check_request`), named with its
            field; nothing is prepared.
    """
    for request in requests:
        check_request(request)
    prepared = []
    for request in requests:
        key, value = request.run_id.encode(), encode_request(_masked(request, redactor))
        signature = signer.sign(key, value) if signer is not None else None
        kind = type(request).__struct_config__.tag
        prepared.append(PreparedRequest(request.run_id, str(kind), key, value, signature))
    return prepared


def _masked(request: Request, redactor: Redactor) -> Request:
    """The request with the values it carries masked, a cancel's reason too (names are left
    as they are)."""
    redact = redactor.redact
    if isinstance(request, StartRun):
        return msgspec.structs.replace(
            request, input=redact(request.input), options=redact(request.options)
        )
    if isinstance(request, AnswerRequest):
        return msgspec.structs.replace(request, value=redact(request.value))
    if isinstance(request, CancelRun) and request.why:
        # Cut after masking, as a mask may be longer than what it hides: a worker refuses a
        # note over the limit.
        why = redactor.redact_text(request.why)[:MAX_NOTE_LENGTH]
        return request if why == request.why else msgspec.structs.replace(request, why=why)
    return request


class RequestSender(Protocol):
    """Where an application sends requests to the fleet: the Kafka topic (`Requests`) or the
    PostgreSQL table (`onward.runtime.fleet.requests_postgres.PostgresRequests`)."""

    async def submit(self, *requests: Request) -> None:
        """Send requests; durable when this returns."""
        ...

    async def submit_many(self, requests: Sequence[Request]) -> None:
        """Send many requests at once; durable when this returns."""
        ...


async def ensure_requests_topic(
    bootstrap_servers: str | KafkaConnection, topic: str, partitions: int
) -> None:
    """Create the requests topic with ``partitions`` partitions unless it exists; check it.

    A topic it creates keeps records for `REQUESTS_RETENTION_MS` (7 days); an existing topic's
    retention is left as its operator set it.

    Raises:
        ConfigurationError: The topic exists with another partition count, so routing would no
            longer follow the event log, or the broker refused to create it (saying why).
        BackendUnavailableError: The topic was created but is still not listed 10 s later.
    """
    # Imported here, as in every Kafka path of this module: an application on SQLite or
    # PostgreSQL imports the requests' types but never loads aiokafka (~170 ms).
    from aiokafka.admin import NewTopic  # noqa: PLC0415
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError  # noqa: PLC0415

    from onward._storage import kafka_connection  # noqa: PLC0415
    from onward.eventlog.kafka import topic_partition_count, topic_refusal  # noqa: PLC0415

    connection = kafka_connection(bootstrap_servers)
    admin = connection.admin(role="requests-admin")
    try:
        await connection.start(admin)
        found = await topic_partition_count(admin, topic)
        if not found:
            with contextlib.suppress(TopicAlreadyExistsError):
                created = await admin.create_topics(
                    [
                        NewTopic(
                            topic,
                            partitions,
                            1,
                            topic_configs={"retention.ms": str(REQUESTS_RETENTION_MS)},
                        )
                    ]
                )
                refused = topic_refusal(created)
                if refused is not None:
                    raise ConfigurationError(
                        f"Kafka refused to create requests topic {topic!r} with {partitions} "
                        f"partitions: {refused}; change the setting it names or create the "
                        "topic yourself"
                    )
            for _ in range(100):
                found = await topic_partition_count(admin, topic)
                if found:
                    break
                await asyncio.sleep(0.1)
    except KafkaError as exc:
        raise translate(exc, context=f"creating {topic}") from exc
    finally:
        await admin.close()
    if found is None:
        raise BackendUnavailableError(
            f"requests topic {topic!r} was created but is not listed 10s later; start again "
            "once the cluster answers"
        )
    if found != partitions:
        raise ConfigurationError(
            f"requests topic {topic!r} has {found} partitions, the events topic {partitions}; "
            "they must match so that a run's requests reach the worker that owns its partition"
        )


class Requests(Resource):
    """Submits requests to the fleet: ``async with Requests(bootstrap, partitions=12) as r``.

    Args:
        bootstrap_servers: ``host:port[,...]``, or a `KafkaConnection` (TLS, SASL; from
            `Settings.kafka_connection`).
        topic: The requests topic.
        partitions: The events topic's partition count; the requests topic is created with it.
        signer: Signs each request (`onward.runtime.signing`); workers set aside requests
            that are unsigned unless they were started to accept them.
        redactor: Masks the values a request carries before it is sent (the default
            `Redactor`; ``Redactor(enabled=False)`` only where the topic is trusted).
    """

    def __init__(
        self,
        bootstrap_servers: str | KafkaConnection,
        topic: str = DEFAULT_REQUESTS_TOPIC,
        *,
        partitions: int,
        signer: RequestSigner | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        from onward._storage import checked_topic, kafka_connection  # noqa: PLC0415  (loads aiokafka)

        self.topic = checked_topic(topic)
        self.partitions = partitions
        self.signer = signer
        self._redactor = redactor or Redactor()
        self._connection = kafka_connection(bootstrap_servers)
        self._producer: AIOKafkaProducer | None = None
        self._opened = False
        self._replacing = asyncio.Lock()

    @property
    def is_open(self) -> bool:
        return self._opened

    async def _connect(self) -> None:
        await ensure_requests_topic(self._connection, self.topic, self.partitions)
        self._producer = await self._new_producer()
        self._opened = True

    async def _new_producer(self) -> AIOKafkaProducer:
        from aiokafka.errors import KafkaError  # noqa: PLC0415  (loaded by `ensure_requests_topic`)

        producer = self._connection.producer(
            role="requests",
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            max_request_size=MAX_REQUEST_BYTES,
        )
        try:
            await self._connection.start(producer)  # stopped there if it fails or is cancelled
        except KafkaError as exc:
            raise translate(exc, context=f"connecting to {self.topic}") from exc
        return producer

    async def _replace(self, broken: AIOKafkaProducer | None) -> AIOKafkaProducer:
        """The producer to send with: ``broken`` (its idempotent session unusable, or
        ``None`` after a replacement that could not start one) stopped and replaced, unless a
        concurrent submit already did.

        Raises:
            BackendUnavailableError: No producer could be started; the next submit tries again.
        """
        from onward._storage import stop_or_drop  # noqa: PLC0415  (loaded already: `__init__`)

        async with self._replacing:
            current = self._producer
            if current is not broken and current is not None:
                return current
            self._producer = None
            if current is not None:
                await stop_or_drop(current, self._connection.request_timeout_s)
            producer = await self._new_producer()
            if not self._opened:  # closed meanwhile: nothing may be left running
                await stop_or_drop(producer, self._connection.request_timeout_s)
                raise ConfigurationError("Requests was closed while its producer was replaced")
            self._producer = producer
            return producer

    async def close(self) -> None:
        """Stop the producer, after it sent what it holds. Idempotent.

        A broker that does not answer delays this by the request timeout at most (the
        idempotent producer would retry its batch for ever); what it had not acknowledged may
        have landed.
        """
        from onward._storage import stop_or_drop  # noqa: PLC0415  (loaded already: `__init__`)

        self._opened = False
        producer, self._producer = self._producer, None
        if producer is not None:
            await stop_or_drop(producer, self._connection.request_timeout_s)

    async def submit(self, *requests: Request) -> None:
        """Send requests, each to its run's partition; durable when this returns."""
        await self.submit_many(requests)

    async def submit_many(self, requests: Sequence[Request]) -> None:
        """Send many requests at once; durable when this returns.

        A start's input and options and an answer's value are masked (`Redactor`) before they
        are sent: the broker keeps the topic's records, and they would otherwise hold what the
        event log only ever holds masked.

        Raises:
            InvalidInputError: A request a worker would refuse (`check_request`), named with its
                field; nothing was sent.
            PayloadTooLargeError: A request over `MAX_REQUEST_BYTES`, named with its run;
                nothing was sent. Or one the topic refused (its own ``max.message.bytes``),
                named with its run and with the runs whose requests were sent all the same.
            BackendUnavailableError: Kafka did not acknowledge them all within the request
                timeout (``ONWARD_BACKEND_TIMEOUT``); those not acknowledged may still land.
            ProducerFatalError: The producer's idempotent session broke; it was replaced, so
                the next submit goes out on a sound one (those not acknowledged may have landed).
        """
        prepared = prepare_requests(requests, self._redactor, self.signer)
        if not self._opened:
            raise ConfigurationError("Requests is not open; use it as an async context manager")
        records = [(request, _headers(request)) for request in prepared]
        for request, headers in records:
            _check_size(request, headers)
        producer = self._producer
        if producer is None:  # the last replacement could not start one: try again
            producer = await self._replace(None)
        try:
            await self._send(producer, prepared, records)
        except ProducerFatalError:
            # Replaced before the caller hears of it, so a retry goes out on a sound session.
            with contextlib.suppress(OnwardError):
                await self._replace(producer)
            raise

    async def _send(
        self,
        producer: AIOKafkaProducer,
        prepared: Sequence[PreparedRequest],
        records: Sequence[tuple[PreparedRequest, list[tuple[str, bytes]] | None]],
    ) -> None:
        from aiokafka.errors import KafkaError  # noqa: PLC0415  (loaded already: ``producer``)

        timeout_s = self._connection.request_timeout_s
        sent: list[asyncio.Future[Any]] = []
        try:
            # The idempotent producer retries a batch until the broker takes it, however long
            # that is: the caller waits no longer than the request timeout.
            async with asyncio.timeout(timeout_s):
                for request, headers in records:
                    sent.append(
                        await producer.send(
                            self.topic,
                            request.value,
                            key=request.key,
                            partition=partition_for(request.run_id, self.partitions),
                            headers=headers,
                        )
                    )
                outcomes = await asyncio.gather(*sent, return_exceptions=True)
        except TimeoutError:
            for delivery in sent:  # its outcome, whenever it comes, is no longer awaited
                delivery.add_done_callback(_outcome_dropped)
            raise BackendUnavailableError(
                f"submitting to {self.topic}: Kafka did not acknowledge within {timeout_s:g}s "
                "(the requests may still land)"
            ) from None
        except KafkaError as exc:
            raise translate(exc, context=f"submitting to {self.topic}") from exc
        _refused_in_part(self.topic, prepared, outcomes)


def _refused_in_part(
    topic: str, prepared: Sequence[PreparedRequest], outcomes: Sequence[object]
) -> None:
    """Raise the first refusal of a batch the broker took in part (one partition's records
    refused, another's stored: a topic's own ``max.message.bytes`` under the producer's limit),
    naming the runs whose requests were sent, which a retry of the whole batch would repeat."""
    refused = [(r, o) for r, o in zip(prepared, outcomes, strict=True) if isinstance(o, Exception)]
    if not refused:
        return
    request, exc = refused[0]
    sent = [
        r.run_id for r, o in zip(prepared, outcomes, strict=True) if not isinstance(o, Exception)
    ]
    others = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
    said = ", ".join(repr(run_id) for run_id in sent)
    context = (
        f"submitting to {topic}: Kafka refused the {request.kind} request of run "
        f"{request.run_id!r}{others}; "
        + (f"it sent those of runs {said}" if sent else "it sent none of the batch")
    )
    raise translate(exc, context=context, run_id=request.run_id) from exc


def _headers(request: PreparedRequest) -> list[tuple[str, bytes]] | None:
    """The record headers a request is sent with: its signature, if signed."""
    if request.signature is None:
        return None
    return [(SIGNATURE_HEADER, request.signature)]


def _check_size(request: PreparedRequest, headers: list[tuple[str, bytes]] | None) -> None:
    """Refuse a request the producer would: checked for every request of a batch before any
    is sent, as the producer refuses one only after those before it went out."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder  # noqa: PLC0415

    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(
        request.key, request.value, headers or []
    )
    if size > MAX_REQUEST_BYTES:
        raise PayloadTooLargeError(
            f"run {request.run_id!r}: the {request.kind} request is {size} bytes as a Kafka "
            f"record, over the {MAX_REQUEST_BYTES} a request may be; nothing was sent (pass a "
            "large input by reference)",
            run_id=request.run_id,
            size=size,
            limit=MAX_REQUEST_BYTES,
        )


def _outcome_dropped(delivery: asyncio.Future[Any]) -> None:
    """Take a given-up delivery's outcome, so asyncio does not warn that nobody read it."""
    if not delivery.cancelled():
        delivery.exception()


__all__ = [
    "DEFAULT_REQUESTS_TOPIC",
    "MAX_REQUEST_BYTES",
    "REQUESTS_RETENTION_MS",
    "AnswerRequest",
    "CancelRun",
    "PreparedRequest",
    "Request",
    "RequestSender",
    "Requests",
    "ResumeRun",
    "StartRun",
    "TagRun",
    "check_request",
    "decode_request",
    "encode_request",
    "ensure_requests_topic",
    "prepare_requests",
]
