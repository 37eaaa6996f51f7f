"""The bottom layer: Kafka clients, PostgreSQL and Redis pools, the SQLite thread, migrations,
driver errors.

Every store of `onward.eventlog`, `onward.projections` and `onward.runtime` opens its database
through this package and derives its lifecycle from :class:`Resource`. It imports nothing of
Onward's but `onward.errors`. `RedisStore` is imported on first use: redis-py costs a process
that never opens Redis (a projector, a Kafka worker) ~60 ms and ~9 MiB. So are the Kafka
clients' helpers and `DRIVER_ERRORS`: aiokafka costs a process that never opens Kafka (any
command on SQLite) ~170 ms. asyncpg is imported when a PostgreSQL pool is first opened.
"""

from typing import TYPE_CHECKING

from onward._lazy import lazy_exports as _lazy_exports

from .locks import bound_lock_waits
from .logs import DRIVER_LOGGERS, masked_http_logs, one_line_driver_logs
from .migrations import (
    Dialect,
    Migration,
    check_onward_sqlite,
    expected_version,
    migrate_postgres,
    migrate_sqlite,
    migrate_sqlite_file,
    migrations,
    open_sqlite,
    refuse_foreign_sqlite,
    schema_version_postgres,
    verify_postgres,
    verify_sqlite,
)
from .packing import pack, unpack
from .postgres import (
    APPLICATION_NAME,
    application_name,
    connected,
    open_pool,
    pooled,
    quoted_identifier,
)
from .sqlite import (
    IN_CHUNK,
    FileLock,
    SqliteThread,
    connect,
    connect_readonly,
    select_in,
    split_statements,
    transaction,
)
from .stores import (
    BACKEND_TIMEOUT_S,
    AdvisoryLock,
    AsyncResource,
    PostgresStore,
    Resource,
    SqliteStore,
)
from .translate import classify, server_driver_errors, translate, translated, translating
from .urls import masked_url, warn_unchecked_server, without_passwords

if TYPE_CHECKING:
    from .kafka import (
        COMPRESSION_TYPES,
        SASL_MECHANISMS,
        SECURITY_PROTOCOLS,
        KafkaConnection,
        checked_topic,
        drop_connections,
        kafka_connection,
        stop_or_drop,
    )
    from .redis import RedisStore
    from .translate import DRIVER_ERRORS

__all__ = [
    "APPLICATION_NAME",
    "BACKEND_TIMEOUT_S",
    "COMPRESSION_TYPES",
    "DRIVER_ERRORS",
    "DRIVER_LOGGERS",
    "IN_CHUNK",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "AdvisoryLock",
    "AsyncResource",
    "Dialect",
    "FileLock",
    "KafkaConnection",
    "Migration",
    "PostgresStore",
    "RedisStore",
    "Resource",
    "SqliteStore",
    "SqliteThread",
    "application_name",
    "bound_lock_waits",
    "check_onward_sqlite",
    "checked_topic",
    "classify",
    "connect",
    "connect_readonly",
    "connected",
    "drop_connections",
    "expected_version",
    "kafka_connection",
    "masked_http_logs",
    "masked_url",
    "migrate_postgres",
    "migrate_sqlite",
    "migrate_sqlite_file",
    "migrations",
    "one_line_driver_logs",
    "open_pool",
    "open_sqlite",
    "pack",
    "pooled",
    "quoted_identifier",
    "refuse_foreign_sqlite",
    "schema_version_postgres",
    "select_in",
    "server_driver_errors",
    "split_statements",
    "stop_or_drop",
    "transaction",
    "translate",
    "translated",
    "translating",
    "unpack",
    "verify_postgres",
    "verify_sqlite",
    "warn_unchecked_server",
    "without_passwords",
]


# `RedisStore` loads redis-py, the Kafka helpers and `DRIVER_ERRORS` aiokafka: imported on
# first access.
__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "RedisStore": (".redis", "RedisStore"),
        "DRIVER_ERRORS": (".translate", "DRIVER_ERRORS"),
        **{
            name: (".kafka", name)
            for name in (
                "COMPRESSION_TYPES",
                "SASL_MECHANISMS",
                "SECURITY_PROTOCOLS",
                "KafkaConnection",
                "checked_topic",
                "drop_connections",
                "kafka_connection",
                "stop_or_drop",
            )
        },
    },
)
