"""The stores a deployment's `Settings` name, opened together and closed in reverse order.

A command that touches runs needs the same stores whatever it does: the event log, the frontier
store, the lease store every worker of a run shares, and the blob store that holds bodies too
large for one log record. Which classes those are follows from ``ONWARD_BACKEND`` alone:

* ``sqlite``: `SqliteEventLog`, `SqliteFrontierStore`, `SqliteLeaseStore` and `SqliteBlobStore`,
  all in the one file ``ONWARD_SQLITE_PATH``.
* ``kafka``: `KafkaEventLog`; `PostgresBlobStore` in ``DATABASE_URL``; `PostgresFrontierStore`
  there too, or `RedisFrontierStore` with ``ONWARD_FRONTIER_STORE=redis``
  (`kafka_frontier_store`); `RedisLeaseStore` when ``REDIS_URL`` is set, else
  `PostgresLeaseStore`.
* ``postgres``: `PostgresEventLog`, `PostgresFrontierStore`, `PostgresLeaseStore`,
  `PostgresBlobStore`, `PostgresCompactionStore` and `PostgresSpendLedger`, all in
  ``DATABASE_URL`` under ``ONWARD_DATABASE_SCHEMA``: a deployment on PostgreSQL alone. Runs
  are folded inline by whoever appends, as on SQLite, so no projector process is needed.
* ``memory``: `MemoryEventLog` with its own leases, `MemoryFrontierStore`, `MemoryBlobStore`,
  for an application that keeps every run inside its own process (``in_process=True``);
  refused to everything else, since nothing would outlive the process and no other process
  could see a run.

Deciding that in one place keeps every caller on the same lease store and the same blob store,
which resume depends on: a worker on another lease store hands out fences the log has already
seen, and a worker without the blob store would feed the model a reference instead of a body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import KW_ONLY, dataclass

from onward.errors import ConfigurationError
from onward.eventlog.base import EventLog
from onward.eventlog.memory import MemoryEventLog
from onward.eventlog.postgres import PostgresEventLog
from onward.eventlog.sqlite import SqliteEventLog
from onward.projections.base import FrontierStore
from onward.projections.compaction import (
    CompactionStore,
    PostgresCompactionStore,
    embedded_compaction,
)
from onward.projections.memory import MemoryFrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore

from .blobs import BlobStore, MemoryBlobStore, PostgresBlobStore, SqliteBlobStore
from .leases.base import LeasePolicy, LeaseStore
from .leases.defaults import default_leases
from .leases.postgres import PostgresLeaseStore
from .leases.sqlite import SqliteLeaseStore
from .providers import Provider
from .runner import AgentRunner
from .settings import Settings
from .spend.base import SpendLedger
from .spend.memory import MemorySpendLedger
from .spend.postgres import PostgresSpendLedger
from .spend.sqlite import SqliteSpendLedger
from .writer import RunObserver


@dataclass(frozen=True, slots=True)
class Backends:
    """A deployment's stores, open for the length of an `open_backends` block.

    Attributes:
        settings: The settings the stores were opened from.
        log: The event log.
        frontiers: Frontier rows and projector positions.
        leases: Who holds which run; shared by every worker of the deployment.
        blobs: Bodies stored out of line (claim check).
        compaction: Truncation points, retained events and tag pins (`CompactionStore`): in
            the SQLite file, or beside the frontier rows in PostgreSQL; ``None`` in memory.
        spend: What each model call cost (`onward.runtime.spend`): in the SQLite file, in
            PostgreSQL with Kafka or PostgreSQL alone, in memory with memory.
    """

    settings: Settings
    log: EventLog
    frontiers: FrontierStore
    leases: LeaseStore
    blobs: BlobStore
    compaction: CompactionStore | None = None
    _: KW_ONLY
    spend: SpendLedger

    @property
    def embedded(self) -> bool:
        """Whether no projector keeps the frontier rows, so whoever appends folds them (SQLite,
        PostgreSQL, memory)."""
        return self.settings.backend != "kafka"

    def runner(
        self,
        provider: Provider,
        *,
        worker: str | None = None,
        observer: RunObserver | None = None,
        lease_policy: LeasePolicy | None = None,
        compaction: CompactionStore | None = None,
    ) -> AgentRunner:
        """An `AgentRunner` on these stores, checkpointing inline when embedded.

        Args:
            provider: The model.
            worker: The name other workers see in `ResumeConflictError`; the default names
                this host and process.
            observer: Sees each append and each tool return (a fleet worker's boundaries).
            lease_policy: The runs' lease ttl and renewal margin; if None, the settings'
                (``ONWARD_LEASE_TTL``).
            compaction: Where `tag` pins its targets and retained history is read; these
                stores' own by default.
        """
        return AgentRunner(
            provider=provider,
            log=self.log,
            frontiers=self.frontiers,
            checkpoint_inline=self.embedded,
            blobs=self.blobs,
            leases=self.leases,
            worker=worker,
            observer=observer,
            lease_policy=lease_policy or self.settings.lease_policy(),
            compaction=compaction or self.compaction,
            spend=self.spend,
            prices=self.settings.price_table(),
        )


def kafka_frontier_store(
    settings: Settings, *, projector: bool = False, pool_size: int | None = None
) -> FrontierStore:
    """The ``kafka`` backend's frontier store (``ONWARD_FRONTIER_STORE``), not opened yet.

    Args:
        settings: Which store, and where.
        projector: For the projector, every one of whose rows can be folded again from the
            log: the PostgreSQL store then commits without waiting for its WAL to reach disk.
        pool_size: Largest connection pool; the store's default if ``None``.
    """
    timeout_s = settings.backend_timeout
    if settings.frontier_store == "redis":
        # Imported here: redis-py (~9 MiB) loads only in a process configured for Redis.
        from onward.projections.redis import RedisFrontierStore  # noqa: PLC0415

        return RedisFrontierStore(
            settings.require_redis_url(),
            prefix=settings.redis_prefix,
            timeout_s=timeout_s,
            **({} if pool_size is None else {"max_connections": pool_size}),
        )
    return PostgresFrontierStore(
        settings.require_database_url(),
        schema=settings.database_schema,
        synchronous_commit=not projector,
        timeout_s=timeout_s,
        **({} if pool_size is None else {"max_size": pool_size}),
    )


async def _postgres_stores(
    stack: AsyncExitStack, settings: Settings
) -> tuple[BlobStore, CompactionStore, SpendLedger]:
    """The blob, compaction and spend stores on ``DATABASE_URL``, as the kafka and postgres
    backends keep them, closed with ``stack``."""
    database_url = settings.require_database_url()
    schema = settings.database_schema
    timeout_s = settings.backend_timeout
    blobs = await stack.enter_async_context(
        PostgresBlobStore(database_url, schema=schema, timeout_s=timeout_s)
    )
    compaction = await stack.enter_async_context(
        PostgresCompactionStore(database_url, schema=schema, timeout_s=timeout_s)
    )
    spend = await stack.enter_async_context(
        PostgresSpendLedger(database_url, schema=schema, timeout_s=timeout_s)
    )
    return blobs, compaction, spend


@asynccontextmanager
async def open_backends(
    settings: Settings, *, readonly: bool = False, in_process: bool = False
) -> AsyncIterator[Backends]:
    """Open the stores ``settings`` name; close them in reverse order when the block ends.

    With Kafka the events topic must already exist: whatever reads or carries on runs has no
    business creating one, and a mistyped ``ONWARD_KAFKA_TOPIC`` should fail here rather than
    show an empty new topic.

    Args:
        settings: Which stores, and where.
        readonly: For commands that only read (``inspect``, ``replay``): the SQLite file is
            opened read-only, not migrated and not changed in any way, and one that is missing
            or is not an Onward database is refused. The server stores are never migrated
            when opened, so nothing changes for them (but the first PostgreSQL log opened on
            a schema records its partition count).
        in_process: For an application that runs its agents in its own process: the memory
            backend is allowed (every run ends with the process).

    Raises:
        ConfigurationError: The memory backend (nothing would outlive the process), a missing
            ``DATABASE_URL`` for Kafka or PostgreSQL, a missing topic or a log with another
            partition count; read-only, a missing SQLite file or one that is not an Onward
            database.
        SchemaMismatchError: A database is not at this code's schema version.
        BackendUnavailableError: A server could not be reached.
    """
    if settings.backend == "memory" and not in_process:
        raise ConfigurationError(
            "ONWARD_BACKEND=memory keeps nothing past the process, so there is no run here to "
            "read or carry on; use sqlite (ONWARD_SQLITE_PATH) or kafka"
        )
    async with AsyncExitStack() as stack:
        log: EventLog
        frontiers: FrontierStore
        leases: LeaseStore
        blobs: BlobStore
        compaction: CompactionStore | None = None
        spend: SpendLedger
        if settings.backend == "memory":
            log = await stack.enter_async_context(MemoryEventLog(partitions=settings.partitions))
            frontiers = await stack.enter_async_context(MemoryFrontierStore())
            spend = await stack.enter_async_context(MemorySpendLedger())
            leases = default_leases(log)
            blobs = await stack.enter_async_context(MemoryBlobStore())
        elif settings.backend == "postgres":
            database_url = settings.require_database_url()
            schema = settings.database_schema
            timeout_s = settings.backend_timeout
            log = await stack.enter_async_context(
                PostgresEventLog(
                    database_url,
                    schema=schema,
                    partitions=settings.partitions,
                    timeout_s=timeout_s,
                )
            )
            frontiers = await stack.enter_async_context(kafka_frontier_store(settings))
            leases = await stack.enter_async_context(
                PostgresLeaseStore(database_url, schema=schema, timeout_s=timeout_s)
            )
            blobs, compaction, spend = await _postgres_stores(stack, settings)
        elif settings.backend == "sqlite":
            path = settings.sqlite_path
            sqlite_log = await stack.enter_async_context(
                SqliteEventLog(path, partitions=settings.partitions, readonly=readonly)
            )
            log = sqlite_log
            # One connection for all five: their writes share the log's group commits.
            frontiers = await stack.enter_async_context(
                SqliteFrontierStore(path, sharing=sqlite_log)
            )
            leases = await stack.enter_async_context(SqliteLeaseStore(path, sharing=sqlite_log))
            blobs = await stack.enter_async_context(SqliteBlobStore(path, sharing=sqlite_log))
            compaction = embedded_compaction(log)
            spend = await stack.enter_async_context(
                SqliteSpendLedger(path, readonly=readonly, sharing=sqlite_log)
            )
        else:
            # Imported here: aiokafka (~170 ms) loads only in a process on the kafka backend.
            from onward.eventlog.kafka import KafkaEventLog  # noqa: PLC0415

            database_url = settings.require_database_url()
            schema = settings.database_schema
            timeout_s = settings.backend_timeout
            log = await stack.enter_async_context(
                KafkaEventLog(
                    settings.kafka_connection(),
                    topic=settings.kafka_topic,
                    partitions=settings.partitions,
                    create_topic=False,
                )
            )
            frontiers = await stack.enter_async_context(kafka_frontier_store(settings))
            if settings.redis_url:
                from .leases.redis import RedisLeaseStore  # noqa: PLC0415  (as above)

                leases = await stack.enter_async_context(
                    RedisLeaseStore(
                        settings.require_redis_url(),
                        prefix=settings.redis_prefix,
                        timeout_s=timeout_s,
                    )
                )
            else:
                leases = await stack.enter_async_context(
                    PostgresLeaseStore(database_url, schema=schema, timeout_s=timeout_s)
                )
            blobs, compaction, spend = await _postgres_stores(stack, settings)
        yield Backends(settings, log, frontiers, leases, blobs, compaction, spend=spend)


__all__ = ["Backends", "kafka_frontier_store", "open_backends"]
