"""Configuration from the environment, checked when the process starts.

A bad value is a `ConfigurationError` naming the variable at start, not a failure at first use.
"""

from __future__ import annotations

import difflib
import re
import typing
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from onward._storage import BACKEND_TIMEOUT_S, masked_url
from onward.errors import ConfigurationError

from .environment import (
    Environment,
    parse_environment,
    refuse_memory_backend,
    with_checkpointer_backend,
)
from .leases.base import DEFAULT_LEASE_TTL_S, MAX_LEASE_TTL_S, LeasePolicy
from .redaction import parse_secret_keys
from .signing import DEFAULT_MAX_AGE_S, RequestSigner
from .spend.base import PriceTable

if TYPE_CHECKING:
    from onward._storage import KafkaConnection

SCHEMA_CACHE_PREFIX = "onward:mcp:schema:"
"""Where the MCP schema cache keeps a run's tool listings by default: this prefix, the run id
(`schema_cache_prefix` of the default ``ONWARD_REDIS_PREFIX``)."""


def schema_cache_prefix(redis_prefix: str) -> str:
    """The MCP schema cache's prefix when ``MCP_SCHEMA_CACHE_PREFIX`` is not set: under
    ``ONWARD_REDIS_PREFIX``, apart from the keys of leases and frontiers."""
    return f"{redis_prefix}mcp:schema:"


_REDIS_KEY_NAMES = (
    "lease:",
    "fence:",
    "frontier:",
    "calls:",
    "transcript:",
    "positions:",
    "quarantine:",
    "runs-of:",
    "runs-by-status:",
)
"""How the keys of leases and frontiers begin after ``ONWARD_REDIS_PREFIX``, a name of the
caller's after each (`RedisLeaseStore`, `RedisFrontierStore`)."""

_REDIS_KEYS = ("runs", "runs-by-status-built", "runs-by-status-cursor", "frontier-format")
"""The keys of the frontier store under ``ONWARD_REDIS_PREFIX`` that are whole as they are."""

MIN_SCHEMA_CACHE_TTL = timedelta(milliseconds=1)
"""The shortest MCP schema cache TTL: Redis keeps one to the millisecond."""

MAX_SCHEMA_CACHE_TTL_HOURS = 24 * 999_999_999
"""The longest MCP schema cache TTL, in hours: the most a `timedelta` holds (a longer one,
``inf`` included, fails the cache's first use with an OverflowError)."""


def check_schema_cache_ttl_hours(hours: float) -> float:
    """``hours`` if it is at least a millisecond, the least Redis keeps a TTL to: a shorter
    one was refused only at the cache's first use (below a microsecond, naming no variable)
    or sent as ``PEXPIRE 0``, which deletes every entry as it is written."""
    if timedelta(hours=hours) < MIN_SCHEMA_CACHE_TTL:
        raise ValueError(f"must be at least a millisecond, got {hours:g} hours")
    return hours


def schema_prefix_clash(prefix: str, schema_prefix: str) -> str | None:
    """Why the MCP schema cache's keys (``schema_prefix`` and a run id, any text) can be keys
    of leases or frontiers under ``prefix``, or ``None`` when none can: a run named
    ``lease:<run>`` would have another run's lease for its cache entry, and collecting it
    would delete the lease while held."""
    rest = schema_prefix[len(prefix) :]
    clashes = prefix.startswith(schema_prefix) or (
        schema_prefix.startswith(prefix)
        and (
            any(name.startswith(rest) or rest.startswith(name) for name in _REDIS_KEY_NAMES)
            or any(key.startswith(rest) for key in _REDIS_KEYS)
        )
    )
    if not clashes:
        return None
    return (
        f"MCP_SCHEMA_CACHE_PREFIX {schema_prefix!r} puts the schema cache's keys among those of "
        f"leases and frontiers under ONWARD_REDIS_PREFIX {prefix!r} (a run named 'lease:<run>' "
        "would have another run's lease for its cache entry); choose one apart, as "
        f"{prefix + 'mcp:schema:'!r}"
    )


class SecretUrl(SecretStr):
    """A server URL whose password is never shown: ``repr``, ``str`` and ``model_dump`` show it
    with ``***`` for the password (``redis://onward:***@cache:6379/0``), so settings can be
    printed and logged; `get_secret_value` gives the URL itself, for the client only."""

    def _display(self) -> str:
        return masked_url(self.get_secret_value())


_KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
"""The topic names Kafka takes."""


def _port_problem(url: str) -> str | None:
    """Why the port of ``url`` is unusable, or None: said here rather than by the driver, which
    would blame whatever called it."""
    try:
        urlsplit(url).port  # noqa: B018 - parsing the port is the check
    except ValueError:
        return f"{masked_url(url)} has a port that is not a number from 0 to 65535"
    return None


_REDIS_DATABASE = re.compile(r"/?|/[0-9]+")
"""The path of a ``redis://`` or ``rediss://`` URL: none, or the database's number."""


def _redis_database_problem(url: str) -> str | None:
    """Why the path of a TCP Redis ``url`` names no database, or None: redis-py reads ``/abc``
    as database 0 and ``/1/2`` as 12, so a typo would move the keys, said nowhere."""
    if url.startswith("unix://"):
        return None  # its database is the ?db= parameter, which redis-py checks
    if _REDIS_DATABASE.fullmatch(urlsplit(url).path):
        return None
    # The path is not quoted alone: a password with an unencoded "/" ends up in it.
    return (
        f"{masked_url(url)}: what follows the host names no database; give the database's "
        "number (redis://host:6379/0), or nothing for database 0"
    )


def _postgres_problem(url: str) -> str | None:
    """Why ``url`` cannot name the PostgreSQL database, or None."""
    if not url.startswith(("postgresql://", "postgres://")):
        return f"{masked_url(url)} must start with postgresql://"
    return _port_problem(url)


def _one_line(exc: ValidationError) -> str:
    """Every problem of ``exc`` in one line, each naming its environment variable and field.

    pydantic names a problem by what it was given: the variable (``ONWARD_BACKEND``) when it
    came from the environment, the field (``backend``) when from Python; both are named, so the
    line is the same whichever way the value came.
    """
    aliases = {
        name: str(field.validation_alias)
        for name, field in Settings.model_fields.items()
        if field.validation_alias
    }
    fields = {alias: name for name, alias in aliases.items()}
    problems = []
    for problem in exc.errors():
        where = ".".join(str(part) for part in problem["loc"])
        field = fields.get(where, where)
        if field in aliases:
            where = f"{aliases[field]} ({field})"
        message = str(problem["msg"]).removeprefix("Value error, ")
        problems.append(f"{where or 'settings'}: {message}")
    return "invalid configuration: " + "; ".join(problems)


class Settings(BaseSettings):
    """Where Onward's log and stores live.

    Attributes:
        backend: ``sqlite`` (embedded, the default), ``kafka`` (Kafka + PostgreSQL),
            ``postgres`` (PostgreSQL alone: the log in tables beside every other store) or
            ``memory``.
        kafka_bootstrap_servers: ``host:port[,...]`` of the Kafka brokers.
        kafka_topic: The events topic.
        kafka_client_id: Shown in broker logs (``KAFKA_CLIENT_ID``, ``onward`` by default).
        kafka_compression_type: How producers compress record batches
            (``KAFKA_COMPRESSION_TYPE``): ``zstd`` by default, ``lz4``, ``gzip``, ``snappy``
            or ``none``.
        kafka_security_protocol: ``PLAINTEXT`` (the default), ``SSL``, ``SASL_PLAINTEXT`` or
            ``SASL_SSL`` (``KAFKA_SECURITY_PROTOCOL``); the other ``KAFKA_SASL_*`` and
            ``KAFKA_SSL_*`` variables keep the names of Kafka's own clients' properties, and
            the passwords are `SecretStr`. Checked with the ``kafka`` backend, which uses
            them (`kafka_connection`).
        partitions: Partition count of the events topic (fixed once created).
        database_url: PostgreSQL URL for frontiers and projector positions; its password is
            never shown (`SecretUrl`): `require_database_url` gives the URL itself. Checked
            only with the ``kafka`` and ``postgres`` backends, which use it: a
            ``DATABASE_URL`` of another program (``sqlite:///app.db``) does not stop the
            embedded backend.
        database_schema: PostgreSQL schema holding Onward's tables (default: the search path).
        redis_url: Redis URL for leases and caches, shown without its password as
            ``database_url`` is (`require_redis_url`); an empty ``REDIS_URL`` is no Redis.
        redis_prefix: Put before every Redis key, so several deployments can share one Redis.
        frontier_store: Where the ``kafka`` backend's projector keeps frontier rows and its
            positions (``ONWARD_FRONTIER_STORE``): ``postgres`` (the default, ``DATABASE_URL``)
            or ``redis`` (`RedisFrontierStore` in ``REDIS_URL``, under ``redis_prefix``). The
            embedded backends keep theirs beside their log, so ``redis`` needs ``kafka``.
        sqlite_path: The embedded database file.
        schema_cache_prefix: Where the MCP schema cache keeps its entries
            (``MCP_SCHEMA_CACHE_PREFIX``), for garbage collection; unset, ``redis_prefix``
            followed by ``mcp:schema:``.
        schema_cache_enabled: Whether the MCP schema cache is on (``MCP_SCHEMA_CACHE_ENABLED``;
            unset: on when ``REDIS_URL`` is set). `onward.integrations.mcp.MCPSettings` is
            built from these settings.
        schema_cache_ttl_hours: How long a run's cached MCP schemas live after they were last
            written or read (``MCP_SCHEMA_CACHE_TTL_HOURS``).
        backend_timeout: Seconds one call to Kafka, PostgreSQL or Redis may wait before it
            fails with a retryable `BackendUnavailableError` (``BACKEND_TIMEOUT_S``, 30, by
            default): a run stops instead of hanging on a silent server.
        app_mode: Where `onward.open` runs an application's runs: ``in_process`` (its own
            process drives them, on any backend) or ``fleet`` (Kafka: it submits requests to
            ``onward worker`` processes and follows the runs from the log).
        requests_topic: The fleet's requests topic.
        redact_keys: Dict key names whose values are masked on top of the default ones
            (``ONWARD_REDACT_KEYS``, comma-separated; ``*_pin`` for any key ending in ``_pin``).
            Every `Redactor` built without ``secret_keys`` reads the variable itself; it is
            checked here so that a bad name fails at start.
        model_prices: Micros per input and output token, per model (``ONWARD_MODEL_PRICES``:
            ``MODEL=INPUT/OUTPUT`` pairs, comma-separated, ``gpt-4o=2.5/10``), for the cost of
            each model call (`price_table`); a model not named costs 0.
        request_key: The key that signs the fleet's requests (``ONWARD_REQUEST_KEY``, at least
            32 characters; several, comma-separated, while rotating: the first signs). The
            applications that submit and the workers that act share it
            (`onward.runtime.signing`).
        request_max_age: Seconds after it was signed that a request is still acted on
            (``ONWARD_REQUEST_MAX_AGE``; `DEFAULT_MAX_AGE_S` says why a day, at most that):
            an older one is set aside, as a captured request sent again would be.
        accept_unsigned_requests: Workers act on requests without a signature
            (``ONWARD_ACCEPT_UNSIGNED_REQUESTS``): anyone who can write the requests topic
            may then start, answer and tag any tenant's runs.
        lease_ttl: Seconds a run's lease lasts unless renewed (``ONWARD_LEASE_TTL``;
            `DEFAULT_LEASE_TTL_S` says why a minute): how long a run whose holder was lost stays
            held. ``onward worker``, ``onward start``, ``onward run --resume`` and every runner
            `Backends.runner` makes use it; ``--lease-ttl`` on a command overrides it.
        environment: ``dev`` (the default) or ``prod`` (``ENVIRONMENT``): production refuses
            the memory backend and ``Redactor(enabled=False)`` (`onward.runtime.environment`).
        checkpointer_backend: ``CHECKPOINTER_BACKEND``, another name for ``ONWARD_BACKEND``:
            ``session_service`` is ``kafka``; ``postgres``, ``memory`` and Onward's own names
            are themselves. Set with ``ONWARD_BACKEND`` to another backend, it is refused.

    Raises:
        ConfigurationError: A value is unusable, built from Python or read from the
            environment alike; the message is the one line the command line prints.
    """

    model_config = SettingsConfigDict(
        extra="ignore", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )

    backend: Literal["kafka", "sqlite", "postgres", "memory"] = Field(
        default="sqlite", validation_alias="ONWARD_BACKEND"
    )
    kafka_bootstrap_servers: str = Field(
        default="127.0.0.1:9092", validation_alias="KAFKA_BOOTSTRAP_SERVERS"
    )
    kafka_topic: str = Field(default="onward.events", validation_alias="ONWARD_KAFKA_TOPIC")
    kafka_client_id: str = Field(default="onward", min_length=1, validation_alias="KAFKA_CLIENT_ID")
    kafka_compression_type: Literal["zstd", "lz4", "gzip", "snappy", "none"] = Field(
        default="zstd", validation_alias="KAFKA_COMPRESSION_TYPE"
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", validation_alias="KAFKA_SECURITY_PROTOCOL"
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, validation_alias="KAFKA_SASL_MECHANISM"
    )
    kafka_sasl_username: str | None = Field(default=None, validation_alias="KAFKA_SASL_USERNAME")
    kafka_sasl_password: SecretStr | None = Field(
        default=None, validation_alias="KAFKA_SASL_PASSWORD"
    )
    kafka_ssl_ca_location: str | None = Field(
        default=None, validation_alias="KAFKA_SSL_CA_LOCATION"
    )
    kafka_ssl_certificate_location: str | None = Field(
        default=None, validation_alias="KAFKA_SSL_CERTIFICATE_LOCATION"
    )
    kafka_ssl_key_location: str | None = Field(
        default=None, validation_alias="KAFKA_SSL_KEY_LOCATION"
    )
    kafka_ssl_key_password: SecretStr | None = Field(
        default=None, validation_alias="KAFKA_SSL_KEY_PASSWORD"
    )
    partitions: int = Field(default=12, ge=1, le=10_000, validation_alias="ONWARD_PARTITIONS")
    database_url: SecretUrl | None = Field(default=None, validation_alias="DATABASE_URL")
    database_schema: str | None = Field(default=None, validation_alias="ONWARD_DATABASE_SCHEMA")
    redis_url: SecretUrl | None = Field(default=None, validation_alias="REDIS_URL")
    redis_prefix: str = Field(default="onward:", validation_alias="ONWARD_REDIS_PREFIX")
    frontier_store: Literal["postgres", "redis"] = Field(
        default="postgres", validation_alias="ONWARD_FRONTIER_STORE"
    )
    sqlite_path: Path = Field(default=Path("onward.db"), validation_alias="ONWARD_SQLITE_PATH")
    schema_cache_prefix: str = Field(
        default=SCHEMA_CACHE_PREFIX, min_length=1, validation_alias="MCP_SCHEMA_CACHE_PREFIX"
    )
    schema_cache_enabled: bool | None = Field(
        default=None, validation_alias="MCP_SCHEMA_CACHE_ENABLED"
    )
    schema_cache_ttl_hours: float = Field(
        default=24.0,
        gt=0,
        le=MAX_SCHEMA_CACHE_TTL_HOURS,
        validation_alias="MCP_SCHEMA_CACHE_TTL_HOURS",
    )
    backend_timeout: float = Field(
        default=BACKEND_TIMEOUT_S, gt=0, le=3600, validation_alias="ONWARD_BACKEND_TIMEOUT"
    )
    app_mode: Literal["in_process", "fleet"] = Field(
        default="in_process", validation_alias="ONWARD_APP_MODE"
    )
    requests_topic: str = Field(
        default="onward.requests", min_length=1, validation_alias="ONWARD_REQUESTS_TOPIC"
    )
    request_key: SecretStr | None = Field(default=None, validation_alias="ONWARD_REQUEST_KEY")
    request_max_age: float = Field(
        default=DEFAULT_MAX_AGE_S, gt=0, le=86_400, validation_alias="ONWARD_REQUEST_MAX_AGE"
    )
    accept_unsigned_requests: bool = Field(
        default=False, validation_alias="ONWARD_ACCEPT_UNSIGNED_REQUESTS"
    )
    redact_keys: str = Field(default="", validation_alias="ONWARD_REDACT_KEYS")
    model_prices: str = Field(default="", validation_alias="ONWARD_MODEL_PRICES")
    lease_ttl: float = Field(
        default=DEFAULT_LEASE_TTL_S, gt=0, le=MAX_LEASE_TTL_S, validation_alias="ONWARD_LEASE_TTL"
    )
    environment: Environment = Field(default="dev", validation_alias="ENVIRONMENT")
    checkpointer_backend: str | None = Field(default=None, validation_alias="CHECKPOINTER_BACKEND")

    @model_validator(mode="wrap")
    @classmethod
    def _configuration_error(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Every way of building settings fails with Onward's own error, never pydantic's."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise ConfigurationError(_one_line(exc)) from exc

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_fields(cls, data: Any) -> Any:
        """Refuse a field name that is not one (``Settings(kafak_topic=...)``): the value would
        be dropped and the default used, events going to another topic. Only lower-case names
        are looked at: those are what Python code passes; upper-case ones are environment
        variables, and a dict of the environment holds many that are not Onward's."""
        if not isinstance(data, dict):
            return data
        known = {*cls.model_fields, *(str(f.validation_alias) for f in cls.model_fields.values())}
        unknown = [k for k in data if isinstance(k, str) and k.islower() and k not in known]
        if unknown:
            fields = list(cls.model_fields)
            named = []
            for name in unknown:
                close = difflib.get_close_matches(name, fields, n=1)
                guess = f" (did you mean {close[0]!r}?)" if close else ""
                named.append(f"{name!r} is not a setting{guess}")
            raise ValueError("; ".join(named))
        return data

    @model_validator(mode="before")
    @classmethod
    def _checkpointer_backend(cls, data: Any) -> Any:
        backends = typing.get_args(cls.model_fields["backend"].annotation)
        return with_checkpointer_backend(data, backends)

    @field_validator("environment", mode="before")
    @classmethod
    def _environment(cls, value: Any) -> Any:
        return parse_environment(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _fit_for_environment(self) -> Settings:
        refuse_memory_backend(self.environment, self.backend)
        return self

    @model_validator(mode="after")
    def _schema_prefix_apart(self) -> Settings:
        if "schema_cache_prefix" not in self.model_fields_set:
            # Under ONWARD_REDIS_PREFIX like every other key: deployments kept apart by it
            # would otherwise share one run id's cache entry, and collect each other's.
            object.__setattr__(self, "schema_cache_prefix", schema_cache_prefix(self.redis_prefix))
        clash = schema_prefix_clash(self.redis_prefix, self.schema_cache_prefix)
        if self.redis_url is not None and clash is not None:
            raise ConfigurationError(clash)
        return self

    @field_validator(
        "kafka_sasl_mechanism",
        "kafka_sasl_username",
        "kafka_sasl_password",
        "kafka_ssl_ca_location",
        "kafka_ssl_certificate_location",
        "kafka_ssl_key_location",
        "kafka_ssl_key_password",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # ``KAFKA_SASL_MECHANISM=`` in an env file means "not set", as it does for Kafka's clients.
        return None if value == "" else value

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism", mode="before")
    @classmethod
    def _upper_case(cls, value: Any) -> Any:
        # Kafka's clients take ``sasl_ssl`` as well as ``SASL_SSL``.
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _kafka_connection_usable(self) -> Settings:
        # Only the kafka backend connects; the connection's own checks (credentials complete,
        # TLS files readable) run here so a bad one fails at start, naming the variable.
        if self.backend == "kafka":
            try:
                self.kafka_connection()
            except ConfigurationError as exc:
                raise ConfigurationError(f"invalid configuration: {exc}") from None
        return self

    @model_validator(mode="after")
    def _kafka_topics_usable(self) -> Settings:
        # Kafka refuses any other name, and a refused one read as a topic with no partitions.
        if self.backend == "kafka":
            for variable, topic in (
                ("ONWARD_KAFKA_TOPIC", self.kafka_topic),
                ("ONWARD_REQUESTS_TOPIC", self.requests_topic),
            ):
                if not _KAFKA_TOPIC.fullmatch(topic) or topic in (".", ".."):
                    raise ConfigurationError(
                        f"invalid configuration: {variable} {topic[:60]!r} is no Kafka topic "
                        "name: 1 to 249 of letters, digits, '.', '_' and '-'"
                    )
        return self

    @model_validator(mode="after")
    def _frontier_store_usable(self) -> Settings:
        if self.frontier_store != "redis":
            return self
        if self.backend != "kafka":
            raise ConfigurationError(
                f"invalid configuration: ONWARD_FRONTIER_STORE=redis needs ONWARD_BACKEND=kafka; "
                f"the {self.backend} backend keeps its frontiers beside its log"
            )
        if not self.redis_url:
            raise ConfigurationError(
                "invalid configuration: ONWARD_FRONTIER_STORE=redis needs REDIS_URL"
            )
        return self

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretUrl | None, info: ValidationInfo) -> SecretUrl | None:
        # Only the kafka and postgres backends use it; a web developer's
        # DATABASE_URL=sqlite:///app.db must not stop the embedded one (`require_database_url`
        # checks it on use).
        backend = info.data.get("backend")
        if value is None or backend not in ("kafka", "postgres"):
            return value
        problem = _postgres_problem(value.get_secret_value())
        if problem:
            raise ValueError(f"{problem} (the {backend} backend keeps its stores in PostgreSQL)")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretUrl | None) -> SecretUrl | None:
        if value is None or not value.get_secret_value():
            return None
        url = value.get_secret_value()
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{masked_url(url)} must start with redis://, rediss:// or unix://")
        problem = _port_problem(url) or _redis_database_problem(url)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("sqlite_path", mode="before")
    @classmethod
    def _sqlite_path(cls, value: Any, info: ValidationInfo) -> Any:
        # An empty path is the working directory, refused at first use as "no such database
        # file" without naming the variable; only the sqlite backend uses it.
        if info.data.get("backend") == "sqlite" and isinstance(value, str) and not value.strip():
            raise ValueError("is empty; name the database file, or unset it for onward.db")
        return value

    @field_validator("lease_ttl")
    @classmethod
    def _lease_ttl(cls, value: float) -> float:
        # A lease is kept to the microsecond: a shorter ttl is none, which the lease policy
        # would refuse only at first use, without naming the variable.
        if not timedelta(seconds=value):
            raise ValueError(f"must be at least a microsecond, got {value:g}")
        return value

    @field_validator("schema_cache_ttl_hours")
    @classmethod
    def _schema_cache_ttl_hours(cls, value: float) -> float:
        return check_schema_cache_ttl_hours(value)

    @field_validator("redact_keys")
    @classmethod
    def _redact_keys(cls, value: str) -> str:
        parse_secret_keys(value)
        return value

    @field_validator("model_prices")
    @classmethod
    def _model_prices(cls, value: str) -> str:
        try:
            PriceTable.parse(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc).removeprefix("ONWARD_MODEL_PRICES: ")) from None
        return value

    def price_table(self) -> PriceTable:
        """The prices of ``model_prices``."""
        return PriceTable.parse(self.model_prices)

    def request_signer(self) -> RequestSigner | None:
        """The signer ``request_key`` makes, or ``None`` when it is not set.

        Raises:
            ConfigurationError: A key shorter than the shortest accepted.
        """
        if self.request_key is None:
            return None
        return RequestSigner(self.request_key.get_secret_value(), max_age_s=self.request_max_age)

    def kafka_connection(self, client_id: str | None = None) -> KafkaConnection:
        """How every Kafka client of this deployment connects: the bootstrap servers, the
        client id (``client_id`` in place of ``KAFKA_CLIENT_ID``), ``backend_timeout`` as the
        request timeout, TLS and SASL.

        Raises:
            ConfigurationError: The security settings are incomplete or name unreadable files
                (one line naming the variable; never the passwords).
        """
        from onward._storage import KafkaConnection  # noqa: PLC0415  (loads aiokafka)

        return KafkaConnection(
            self.kafka_bootstrap_servers,
            client_id=client_id or self.kafka_client_id,
            request_timeout_s=self.backend_timeout,
            security_protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=_secret(self.kafka_sasl_password),
            ssl_ca_location=self.kafka_ssl_ca_location,
            ssl_certificate_location=self.kafka_ssl_certificate_location,
            ssl_key_location=self.kafka_ssl_key_location,
            ssl_key_password=_secret(self.kafka_ssl_key_password),
            compression_type=self.kafka_compression_type,
        )

    def lease_policy(self) -> LeasePolicy:
        """The lease policy of ``lease_ttl``."""
        return LeasePolicy(ttl=timedelta(seconds=self.lease_ttl))

    def require_database_url(self) -> str:
        """The PostgreSQL URL, password included (for the driver only), or a clear error saying
        which variable to set."""
        if not self.database_url:
            embedded = (
                f" (ONWARD_BACKEND is {self.backend}: its file, {self.sqlite_path}, is migrated "
                "when first opened and needs no command)"
                if self.backend == "sqlite"
                else ""
            )
            raise ConfigurationError(
                f"DATABASE_URL is not set; it must name a PostgreSQL database{embedded}"
            )
        url = self.database_url.get_secret_value()
        problem = _postgres_problem(url)
        if problem:
            raise ConfigurationError(f"DATABASE_URL: {problem}")
        return url

    def require_redis_url(self) -> str:
        """The Redis URL, password included (for the client only), or a clear error saying
        which variable to set."""
        if not self.redis_url:
            raise ConfigurationError("REDIS_URL is not set; it must name a Redis server")
        return self.redis_url.get_secret_value()


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def load_settings() -> Settings:
    """Read the environment.

    Raises:
        ConfigurationError: A value is unusable (`Settings` says which, in one line).
    """
    return Settings()
