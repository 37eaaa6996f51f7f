"""User projections: your own fold of the log into your own PostgreSQL table.

Implement :class:`Projection` (a name, a version, the DDL of one table, and a fold of a batch
of events into SQL) and run it with :class:`SqlProjectionSink` under a `KafkaProjector`, or
rebuild it with :func:`onward.projections.rebuild.rebuild`. Its table lives in numbered builds
(``<name>_<build>``) with a view named ``<name>`` on the active one, like the built-in frontiers.

Exactly once without asking anything of your fold: inside the transaction that runs your
``apply``, the sink locks the stored positions of the batch's partitions and drops every event
below them, so a batch delivered twice (after a crash or a rebalance) reaches ``apply`` once.
"""

from __future__ import annotations

import logging
import pkgutil
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from onward._storage import BACKEND_TIMEOUT_S, PostgresStore, classify, server_driver_errors
from onward._storage.postgres import connection_gone
from onward.errors import BackendUnavailableError, InvalidInputError, SchemaMismatchError
from onward.eventlog.base import LogRecord, StoredEvent
from onward.eventlog.events import kind_of

from .base import BuildSwitched
from .builds import (
    BuildLayout,
    active_build,
    active_build_for_write,
    build_exists,
    ensure_active_in_steps,
)
from .postgres import BUILT_IN_PROJECTIONS

if TYPE_CHECKING:
    import asyncpg

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
log = logging.getLogger("onward.projector")


@runtime_checkable
class Projection(Protocol):
    """A user projection of the event log into one PostgreSQL table.

    Attributes:
        name: Lower-case identifier; also the name of the view on the active build. Names
            starting with ``onward`` and those of Onward's own projections (``frontiers``) are
            refused, and so is, as it is first created, one named as a build of a projection
            already there (``kinds_7`` beside ``kinds``), or the other way around.
        version: Bump it when the fold changes; rebuild to apply it to history.
    """

    name: str
    version: int

    def ddl(self, table: str) -> str:
        """The statements that create the projection's table, named ``table``."""
        ...

    async def apply(
        self, conn: asyncpg.Connection, table: str, events: Sequence[StoredEvent]
    ) -> None:
        """Fold a batch of events (each partition in offset order) into ``table``.

        Runs inside the sink's transaction; never commit or roll back here.
        """
        ...


def layout_of(projection: Projection) -> BuildLayout:
    """The build layout of a user projection: table ``<name>_<build>``, view ``<name>``."""
    if not _NAME.fullmatch(projection.name) or projection.name.startswith("onward"):
        raise InvalidInputError(
            f"projection name {projection.name!r} must be a lower-case identifier (letters, "
            "digits, underscores) not starting with 'onward'"
        )
    name = projection.name
    if name in BUILT_IN_PROJECTIONS:
        raise InvalidInputError(
            f"projection name {name!r} is reserved: Onward's own {name} projection is kept "
            "under it, and a rebuild would retire that build; choose another name"
        )
    return BuildLayout(
        projection=name,
        version=projection.version,
        ddl=lambda build: projection.ddl(f"{name}_{build}"),
        views=lambda build: {name: f"{name}_{build}"},
        collides=lambda other: _named_as_a_build(name, other) or _named_as_a_build(other, name),
    )


def _named_as_a_build(name: str, of: str) -> bool:
    """Whether ``name`` is the name of a build of the user projection ``of`` (``of_<n>``)."""
    build = name.removeprefix(f"{of}_")
    numbered = build != name and build.isdigit() and not build.startswith("0")
    return numbered and of not in BUILT_IN_PROJECTIONS


@dataclass(slots=True)
class SinkStats:
    """Counters a sink exposes."""

    batches: int = 0
    events: int = 0
    skipped: int = 0
    unreadable: int = 0
    """Records that could not be decoded: passed over (each logged once), never applied."""


class SqlProjectionSink(PostgresStore):
    """Runs a user :class:`Projection` in PostgreSQL, exactly once per event.

    Args:
        dsn: PostgreSQL URL.
        projection: The projection.
        build: Pin to one build (rebuilds do); ``None`` follows the active build.
        schema: PostgreSQL schema of Onward's tables.
        timeout_s: The longest a connection attempt or one statement may take
            (`PostgresStore`).
    """

    def __init__(
        self,
        dsn: str,
        projection: Projection,
        *,
        build: int | None = None,
        schema: str | None = None,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        self.projection = projection
        self.layout = layout_of(projection)
        self.stats = SinkStats()
        super().__init__(dsn, schema=schema, max_size=4, timeout_s=timeout_s)
        self._pinned = build
        self._build = build
        # The build whose positions what is folded came from: only a write's switch (which
        # its projector follows by seeking anew) moves it, never a read of positions (lag,
        # health), so a switch is always seen, and followed, by the next write.
        self._writes_to = build

    @property
    def consumer(self) -> str:
        """The name its positions are stored under: ``<projection>@<build>``."""
        if self._build is None:
            raise InvalidInputError(f"projection {self.projection.name!r} is not started")
        return f"{self.projection.name}@{self._build}"

    @property
    def table(self) -> str:
        """The table of the build this sink writes."""
        return f"{self.projection.name}_{self._build}"

    async def _started(self) -> None:
        """Create the first build if there is none, or check the pinned one exists."""
        if self._pinned is None:
            await ensure_active_in_steps(self._live_pool(), self.layout, self._timeout_s)
        await self._run(self._resolve_build, f"opening projection {self.projection.name!r}")

    async def _resolve_build(self, conn: asyncpg.Connection) -> None:
        if self._pinned is None:
            self._build = self._writes_to = await active_build(conn, self.projection.name)
        elif not await build_exists(conn, self.projection.name, self._pinned):
            raise SchemaMismatchError(f"{self.projection.name} build {self._pinned} does not exist")

    def _not_open(self) -> InvalidInputError:
        return InvalidInputError(f"projection {self.projection.name!r} is not started")

    async def positions(self) -> dict[int, int]:
        async with self._connection(f"reading positions of {self.projection.name!r}") as conn:
            if self._pinned is None:
                self._build = await active_build(conn, self.projection.name)
            rows = await conn.fetch(
                "SELECT partition, next_offset FROM onward_projector_positions WHERE consumer = $1",
                self.consumer,
            )
        return {int(r["partition"]): int(r["next_offset"]) for r in rows}

    async def apply(
        self, records: Mapping[int, Sequence[LogRecord]], next_offsets: Mapping[int, int]
    ) -> None:
        """Fold the part of a batch not folded before, and move the positions, atomically.

        A record that cannot be decoded is passed over (logged, counted in
        ``stats.unreadable``): a user projection sees events only, and one bad record never
        stops it. The frontiers projection keeps such records in its quarantine table.
        """
        context = f"applying a batch to projection {self.projection.name!r}"
        async with self._connection(context, transaction=True) as conn:
            if self._pinned is None:
                current = await active_build_for_write(conn, self.projection.name)
                if current != self._writes_to:
                    self._build = self._writes_to = current
                    raise BuildSwitched(f"{self.projection.name} build is now {current}")
                self._build = current
            parts = sorted(next_offsets)
            consumer = self.consumer
            await conn.execute(
                "INSERT INTO onward_projector_positions (consumer, partition, next_offset) "
                "SELECT $1, p, 0 FROM unnest($2::int[]) AS t(p) ON CONFLICT DO NOTHING",
                consumer,
                parts,
            )
            stored = {
                int(r["partition"]): int(r["next_offset"])
                for r in await conn.fetch(
                    "SELECT partition, next_offset FROM onward_projector_positions "
                    "WHERE consumer = $1 AND partition = ANY($2::int[]) "
                    "ORDER BY partition FOR UPDATE",
                    consumer,
                    parts,
                )
            }
            fresh: list[StoredEvent] = []
            unreadable = 0
            for partition in sorted(records):
                for record in records[partition]:
                    if record.position.offset < stored.get(partition, 0):
                        continue
                    if isinstance(record, StoredEvent):
                        fresh.append(record)
                    else:
                        unreadable += 1
                        log.warning(
                            "projection %r passes over the unreadable record at partition %d "
                            "offset %d: %s",
                            self.projection.name,
                            partition,
                            record.position.offset,
                            record.reason,
                        )
            if fresh:
                conn.reset_session()  # your SQL may change the session: reset it on release
                await self._apply_fresh(conn, fresh)
            await conn.execute(
                "UPDATE onward_projector_positions AS p SET next_offset = t.o, updated_at = now() "
                "FROM unnest($2::int[], $3::bigint[]) AS t(part, o) "
                "WHERE p.consumer = $1 AND p.partition = t.part AND p.next_offset < t.o",
                consumer,
                parts,
                [next_offsets[p] for p in parts],
            )
        total = sum(len(e) for e in records.values())
        self.stats.batches += 1
        self.stats.events += len(fresh)
        self.stats.unreadable += unreadable
        self.stats.skipped += total - len(fresh) - unreadable

    async def _apply_fresh(self, conn: asyncpg.Connection, fresh: list[StoredEvent]) -> None:
        """Run the projection's ``apply`` on the batch; if it fails (not the store: a lost
        connection or a timeout is raised as it is, to be retried), find the event it fails on,
        folding the batch again one event at a time, and raise an error naming it. The batch's
        transaction is rolled back either way."""
        try:
            async with conn.transaction():  # a savepoint: the search below starts from here
                await self.projection.apply(conn, self.table, fresh)
        except Exception as exc:
            if _not_the_projections(exc, conn):
                raise
            culprit = await self._first_failing(conn, fresh)
            where = (
                f"the event at partition {culprit.position.partition} offset "
                f"{culprit.position.offset} (run {culprit.event.run_id!r}, "
                f"{kind_of(type(culprit.event))}, seq {culprit.event.seq})"
                if culprit is not None
                else f"a batch of {len(fresh)} events from partition "
                f"{fresh[0].position.partition} offset {fresh[0].position.offset}"
            )
            raise InvalidInputError(
                f"projection {self.projection.name!r} failed on {where}: "
                f"{type(exc).__name__}: {exc}; nothing of the batch was stored"
            ) from exc

    async def _first_failing(
        self, conn: asyncpg.Connection, fresh: list[StoredEvent]
    ) -> StoredEvent | None:
        """The first event the projection fails on when given the batch one at a time."""
        try:
            for stored in fresh:
                try:
                    async with conn.transaction():
                        await self.projection.apply(conn, self.table, [stored])
                except Exception as exc:  # noqa: BLE001 - the projection's code may raise anything
                    if _not_the_projections(exc, conn):
                        return None
                    return stored
        except Exception:  # noqa: BLE001 - best effort: the batch's own error is raised
            return None
        return None

    async def flush(self) -> None:
        """Nothing to do: every batch is stored as it is applied."""

    def forget(self, partitions: Collection[int]) -> None:
        """Nothing is cached between batches."""


def _not_the_projections(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """Whether a failure inside a projection's ``apply`` is the store's (a lost connection, a
    timeout: retried as they are), not the projection's own."""
    if isinstance(exc, BackendUnavailableError) or connection_gone(conn):
        return True
    if isinstance(exc, server_driver_errors()):
        kind = classify(type(exc))
        return kind is not None and issubclass(kind, BackendUnavailableError)
    return False


def load_projection(spec: str) -> Projection:
    """Import a projection from ``package.module:attribute`` (an instance or a class)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidInputError(f"projection {spec!r} must look like package.module:attribute")
    try:
        found: object = pkgutil.resolve_name(spec)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidInputError(f"cannot import projection {spec!r}: {exc}") from exc
    return as_projection(found, spec)


def as_projection(found: object, spec: str) -> Projection:
    """The projection ``spec`` named, given what it resolved to: an instance or a class."""
    projection = found() if isinstance(found, type) else found
    if not isinstance(projection, Projection):
        raise InvalidInputError(f"{spec!r} is not a Projection (name, version, ddl, apply)")
    return projection
