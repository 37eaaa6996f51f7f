"""`PostgresFrontierStore`: frontier rows in PostgreSQL (asyncpg), one table per build.

A projection's rows live in a *build*: ``onward_frontiers_<n>`` and ``onward_tool_calls_<n>``,
with positions stored under ``<consumer>@<n>``. The views ``onward_frontiers`` and
``onward_tool_calls`` point at the active build. A rebuild fills a new build beside the live one
and repoints the views when it has caught up; the old tables stay until someone drops them.

The transcript (``onward_transcript``) is one table for every build. A store writes the messages
it folded for a run as one row (a chunk, keyed by its first seq); a rebuild appends what its
fold derives that no stored row holds yet, since a stored message came from the same counted
event and is kept.

A store either follows the active build (the default: what projectors and readers use) or is
pinned to one build (what a rebuild writes into). A following store notices a switch inside
its write transaction and raises :class:`BuildSwitched` instead of writing, so its projector can
seek to the new build's positions before folding on.

Writes are one transaction per batch: every touched run is upserted by a single
``INSERT ... SELECT FROM unnest(...)`` statement guarded by ``through_offset``, so the number of
round trips does not depend on the number of runs in the batch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import astuple
from importlib.resources import files
from typing import TYPE_CHECKING, Any, NamedTuple

from onward._storage import (
    BACKEND_TIMEOUT_S,
    PostgresStore,
    bound_lock_waits,
    migrate_postgres,
    translating,
    verify_postgres,
)
from onward.errors import BackendUnavailableError, InvalidInputError, SchemaMismatchError
from onward.eventlog.events import Message

from .base import (
    BuildSwitched,
    FrontierStoreBackend,
    FrontierWrite,
    QuarantineEntry,
    QuarantineState,
    RunSummary,
    Snapshot,
    StoredFrontier,
    check_runs_limit,
    decode_payload,
    released_mark,
)
from .builds import (
    BuildLayout,
    active_build,
    active_build_for_write,
    build_exists,
    ensure_active,
)
from .frontier import RunStatus, ToolCallRow
from .transcript import TranscriptRow, decode_chunk, decode_message, encoded_chunks

if TYPE_CHECKING:
    import asyncpg

PROJECTION = "frontiers"
PROJECTION_VERSION = 1

BUILT_IN_PROJECTIONS: frozenset[str] = frozenset({PROJECTION})
"""The keys of Onward's own projections in the build registry, refused as user projection
names: a user projection sharing one would retire the built-in build when rebuilt."""

_SUMMARY_COLUMNS = (
    "tenant, run_id, agent, revision, status, holder, iteration, input_tokens, output_tokens, "
    "last_seq, fence, last_boundary, resume_seq, waiting_on, refused, partition, "
    "through_offset, updated_at, user_id"
)
_CALL_COLUMNS = (
    "tenant, run_id, call_id, tool, idempotency_key, fence, dispatched_at, completed_at, "
    "outcome, latency_us, through_offset"
)


def _frontiers_ddl(build: int) -> str:
    template = (files("onward") / "schemas" / "sql" / "frontiers.build.sql").read_text()
    return template.replace("{build}", str(int(build)))


_VIEWS = ("onward_frontiers", "onward_tool_calls")
"""The views on the active build's frontier and tool_calls tables."""

FRONTIERS = BuildLayout(
    projection=PROJECTION,
    version=PROJECTION_VERSION,
    ddl=_frontiers_ddl,
    views=lambda build: {
        _VIEWS[0]: f"onward_frontiers_{build}",
        _VIEWS[1]: f"onward_tool_calls_{build}",
    },
)
"""The layout of the built-in frontiers projection (frontier and tool_calls tables)."""


@translating("migrating PostgreSQL")
async def migrate(
    conn: asyncpg.Connection, *, lock_timeout_s: float | None = BACKEND_TIMEOUT_S
) -> list[str]:
    """Apply pending migrations and make sure the frontiers projection has an active build.

    ``lock_timeout_s`` bounds the wait for another migration of the same schema
    (`migrate_postgres`).
    """
    applied = await migrate_postgres(conn, lock_timeout_s=lock_timeout_s)
    created = await _first_build(conn, lock_timeout_s)
    if created is not None:
        applied.append(f"frontiers build {created}")
    return applied


async def _first_build(conn: asyncpg.Connection, lock_timeout_s: float | None) -> int | None:
    """`ensure_active` of the frontiers, its wait for the build registry bounded as the
    migrations' waits are: `onward db migrate` bounds no statement, and a session left open
    holding the registry (a long write of a user projection, a person's ``BEGIN``) would keep
    it waiting in silence."""
    try:
        async with conn.transaction():
            if lock_timeout_s is not None:
                await bound_lock_waits(conn, lock_timeout_s)
            return await ensure_active(conn, FRONTIERS)
    except BackendUnavailableError as exc:
        import asyncpg  # noqa: PLC0415  (loaded already: ``conn`` is its)

        if not isinstance(exc.__cause__, asyncpg.LockNotAvailableError):
            raise
        within = "" if lock_timeout_s is None else f" within {lock_timeout_s:g} s"
        raise BackendUnavailableError(
            "creating the first frontiers build: the build registry (onward_projection_builds) "
            f"is held by another session, which did not commit or roll back{within}; the "
            "migrations are applied, and the same command may succeed once it has"
        ) from exc


def _summary(row: asyncpg.Record) -> RunSummary:
    return RunSummary(**{k: row[k] for k in RunSummary.__slots__})


def _stored(row: asyncpg.Record) -> StoredFrontier:
    payload = row["payload"]
    frontier = decode_payload(payload, run_id=row["run_id"]) if payload is not None else None
    return StoredFrontier.of(_summary(row), frontier, row["snapshot_error"], row["quarantined"])


_QUARANTINE_COLUMNS = (
    "run_id, tenant, partition, log_offset, kind, reason, state, quarantined_at, released_by, "
    "released_at"
)


def _active(parameter: int) -> str:
    """The active build as a one-row table ``b`` (none without an active build), to join what
    is read under it; the projection's name is the statement's parameter ``parameter``."""
    return (
        "(SELECT build FROM onward_projection_builds "
        f"WHERE projection = ${parameter} AND status = 'active') AS b"
    )


def _entry(row: asyncpg.Record, *, skip: tuple[str, ...] = ()) -> QuarantineEntry:
    values = {key: value for key, value in row.items() if key not in skip}
    values["offset"] = values.pop("log_offset")
    return QuarantineEntry(**values)


class PostgresFrontierStore(PostgresStore, FrontierStoreBackend):
    """A `FrontierStore` in PostgreSQL.

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        build: Pin the store to one build; ``None`` follows the active build.
        schema: The PostgreSQL schema (search path) holding Onward's tables; ``None`` for the
            server's default.
        min_size: Smallest pool size.
        max_size: Largest pool size.
        synchronous_commit: False lets a write commit without waiting for its WAL to reach
            disk (``SET LOCAL synchronous_commit = off``, for that transaction only). A crash
            of the server can then lose the last writes, each one's rows together with its
            positions, and the projector folds them again from the log. For projectors and
            rebuilds, whose rows can all be folded again; not for rows nothing can refold.
        timeout_s: The longest one call may wait for PostgreSQL (`PostgresStore`).
    """

    what = "PostgreSQL frontier store"

    def __init__(
        self,
        dsn: str,
        *,
        build: int | None = None,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        synchronous_commit: bool = True,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        super().__init__(
            dsn, schema=schema, min_size=min_size, max_size=max_size, timeout_s=timeout_s
        )
        self._pinned = build
        self._build: int | None = build
        # The build whose positions what a projector folds came from: a read (positions for
        # lag or health, quarantine) follows the active build, but only a write's switch, which
        # its projector follows by seeking to the new positions, moves this one.
        self._writes_to: int | None = build
        self._synchronous_commit = synchronous_commit

    @property
    def build(self) -> int:
        """The build this store reads and writes."""
        if self._build is None:
            raise InvalidInputError("the PostgreSQL frontier store is not started")
        return self._build

    async def _started(self) -> None:
        await self.verify()

    async def verify(self) -> None:
        async with self._connection("verifying schema") as conn:
            await verify_postgres(conn)
            if self._pinned is not None:
                if not await build_exists(conn, PROJECTION, self._pinned):
                    raise SchemaMismatchError(f"frontiers build {self._pinned} does not exist")
                return
            build = await active_build(conn, PROJECTION)
            if build is None:
                raise SchemaMismatchError(
                    "PostgreSQL has no active frontiers build; run `onward db migrate`"
                )
            self._build = self._writes_to = build

    def _tables(self) -> tuple[str, str]:
        build = self.build
        return f"onward_frontiers_{build}", f"onward_tool_calls_{build}"

    def _read_tables(self) -> tuple[str, str]:
        """What a read queries: a pinned store's build; for a following store the views, which
        a switch repoints in its own transaction, so a reader opened before a rebuild reads
        the build switched in, not the retired one nothing writes any more."""
        return _VIEWS if self._pinned is None else self._tables()

    def _consumer(self, consumer: str) -> str:
        return f"{consumer}@{self.build}"

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        frontiers, _ = self._read_tables()
        async with self._connection("loading frontiers") as conn:
            rows = await conn.fetch(
                f"SELECT {_SUMMARY_COLUMNS}, payload, snapshot_error, quarantined FROM {frontiers} "
                "WHERE run_id = ANY($1::text[])",
                list(run_ids),
            )
        return {row["run_id"]: _stored(row) for row in rows}

    async def _write(self, batch: FrontierWrite) -> None:
        consumer, positions, snapshots, calls = batch[:4]
        context = f"writing frontiers of consumer {consumer!r}"
        messages = await _stored_messages(batch.messages) if batch.messages else []
        async with self._connection(context, transaction=True) as conn:
            if not self._synchronous_commit:
                await conn.execute("SET LOCAL synchronous_commit = off")
            if self._pinned is None:
                current = await active_build_for_write(conn, PROJECTION)
                if current != self._writes_to:
                    self._build = self._writes_to = current
                    raise BuildSwitched(f"frontiers build is now {current}")
                self._build = current
            frontiers, tool_calls = self._tables()
            if batch.restarted:
                await _delete_restarted(conn, tool_calls, batch.restarted)
            if snapshots:
                await _stage_and_upsert(
                    conn, frontiers, _FRONTIER_NAMES, ("run_id",), map(_frontier_row, snapshots)
                )
            if calls:
                await _stage_and_upsert(
                    conn, tool_calls, _CALL_NAMES, ("run_id", "call_id"), map(_call_row, calls)
                )
            if batch.cleared or batch.quarantine:
                await self._quarantine(conn, frontiers, self._consumer(consumer), batch)
            if messages:
                await _append_messages(conn, messages)
            if positions:
                parts = sorted(positions)  # key order, as every write locks rows (`_in_key_order`)
                await conn.execute(
                    "INSERT INTO onward_projector_positions (consumer, partition, next_offset) "
                    "SELECT $1, p, o FROM unnest($2::int[], $3::bigint[]) AS t(p, o) "
                    "ON CONFLICT (consumer, partition) DO UPDATE "
                    "SET next_offset = excluded.next_offset, updated_at = now() "
                    "WHERE onward_projector_positions.next_offset < excluded.next_offset",
                    self._consumer(consumer),
                    parts,
                    [positions[p] for p in parts],
                )

    @staticmethod
    async def _quarantine(
        conn: asyncpg.Connection, frontiers: str, consumer: str, batch: FrontierWrite
    ) -> None:
        """Clear the released entries of runs folded again, then hold the new entries and mark
        their runs' rows; inside the write's transaction."""
        if batch.cleared:
            await conn.execute(
                "UPDATE onward_quarantine SET state = 'cleared' "
                "WHERE consumer = $1 AND run_id = ANY($2::text[]) AND state = 'released'",
                consumer,
                list(batch.cleared),
            )
            await conn.execute(
                f"UPDATE {frontiers} SET quarantined = NULL WHERE run_id = ANY($1::text[])",
                list(batch.cleared),
            )
        if not batch.quarantine:
            return
        # An entry already stored is held again only while held, or when this write folded
        # its run again (a release): a projector that folded the record before the release
        # and stores after it leaves the released or cleared entry as it is.
        cleared = list(batch.cleared)
        entries = sorted(batch.quarantine, key=lambda e: (e.partition, e.offset))
        await conn.executemany(
            f"INSERT INTO onward_quarantine (consumer, {_QUARANTINE_COLUMNS}) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) "
            "ON CONFLICT (consumer, partition, log_offset) DO UPDATE SET "
            "run_id = excluded.run_id, tenant = excluded.tenant, kind = excluded.kind, "
            "reason = excluded.reason, state = 'held', quarantined_at = excluded.quarantined_at "
            "WHERE onward_quarantine.state = 'held' OR onward_quarantine.run_id = ANY($12::text[])",
            [(consumer, *astuple(entry), cleared) for entry in entries],
        )
        marks = [
            (e.mark, e.run_id, consumer, e.partition, e.offset)
            for e in batch.quarantine
            if e.run_id is not None
        ]
        if marks:
            # One entry at a time, in order, the run's row marked only if its entry is held.
            await conn.executemany(
                f"UPDATE {frontiers} SET quarantined = $1 WHERE run_id = $2 AND EXISTS ("
                "SELECT 1 FROM onward_quarantine WHERE consumer = $3 AND partition = $4 "
                "AND log_offset = $5 AND state = 'held')",
                marks,
            )

    async def quarantined(
        self,
        consumer: str,
        *,
        run_id: str | None = None,
        states: Collection[QuarantineState] | None = None,
    ) -> list[QuarantineEntry]:
        wanted = (run_id, list(states) if states is not None else None)
        async with self._connection("listing quarantined records", run_id) as conn:
            if self._pinned is None:
                # The active build and its entries in one round trip (a join that yields one
                # row of nulls when the build has none).
                rows = await conn.fetch(
                    f"SELECT b.build, q.* FROM {_active(4)} LEFT JOIN LATERAL ("
                    f"SELECT {_QUARANTINE_COLUMNS} FROM onward_quarantine "
                    "WHERE consumer = $1 || '@' || b.build::text "
                    "AND ($2::text IS NULL OR run_id = $2) "
                    "AND ($3::text[] IS NULL OR state = ANY($3::text[]))"
                    ") q ON true ORDER BY q.partition, q.log_offset",
                    consumer,
                    *wanted,
                    PROJECTION,
                )
                if rows:
                    self._build = int(rows[0]["build"])
                    return [_entry(r, skip=("build",)) for r in rows if r["partition"] is not None]
            rows = await conn.fetch(
                f"SELECT {_QUARANTINE_COLUMNS} FROM onward_quarantine WHERE consumer = $1 "
                "AND ($2::text IS NULL OR run_id = $2) "
                "AND ($3::text[] IS NULL OR state = ANY($3::text[])) "
                "ORDER BY partition, log_offset",
                self._consumer(consumer),
                *wanted,
            )
        return [_entry(r) for r in rows]

    async def release(self, consumer: str, run_id: str, *, by: str, at: int) -> int:
        context = "releasing a quarantined run"
        async with self._connection(context, run_id, transaction=True) as conn:
            if self._pinned is None:
                build = await active_build(conn, PROJECTION)
                if build is not None:
                    self._build = build
            frontiers, _ = self._tables()
            # The row before the entries, in the order a write locks them: a projector storing
            # the run meanwhile would otherwise hold the row and wait for the entries.
            await conn.execute(f"SELECT FROM {frontiers} WHERE run_id = $1 FOR UPDATE", run_id)
            status = await conn.execute(
                "UPDATE onward_quarantine SET state = 'released', released_by = $3, "
                "released_at = $4 WHERE consumer = $1 AND run_id = $2 AND state = 'held'",
                self._consumer(consumer),
                run_id,
                by,
                at,
            )
            released = int(status.split()[-1])
            if released:
                await conn.execute(
                    f"UPDATE {frontiers} SET quarantined = $2 WHERE run_id = $1",
                    run_id,
                    released_mark(by),
                )
        return released

    async def dismiss(self, consumer: str, partition: int, offset: int, *, by: str, at: int) -> int:
        async with self._connection("dismissing a quarantined record", transaction=True) as conn:
            if self._pinned is None:
                build = await active_build(conn, PROJECTION)
                if build is not None:
                    self._build = build
            status = await conn.execute(
                "UPDATE onward_quarantine SET state = 'cleared', released_by = $4, "
                "released_at = $5 WHERE consumer = $1 AND partition = $2 AND log_offset = $3 "
                "AND run_id IS NULL AND state = 'held'",
                self._consumer(consumer),
                partition,
                offset,
                by,
                at,
            )
        return int(status.split()[-1])

    async def transcript(self, run_id: str, *, tenant: str, through: int) -> list[TranscriptRow]:
        async with self._connection("reading the transcript", run_id) as conn:
            rows = await conn.fetch(
                "SELECT seq, last_seq, message FROM onward_transcript "
                "WHERE tenant = $1 AND run_id = $2 AND seq <= $3 ORDER BY seq",
                tenant,
                run_id,
                through,
            )
        said: dict[int, Message] = {}
        for row in rows:
            if row["last_seq"] is None:
                said.setdefault(row["seq"], decode_message(row["message"]))
                continue
            for seq, message in decode_chunk(row["message"]):
                if seq <= through:
                    said.setdefault(seq, message)
        return [
            TranscriptRow(tenant=tenant, run_id=run_id, seq=seq, message=said[seq])
            for seq in sorted(said)
        ]

    async def positions(self, consumer: str) -> dict[int, int]:
        async with self._connection(f"reading the positions of consumer {consumer!r}") as conn:
            if self._pinned is None:
                # The active build and its positions in one round trip.
                rows = await conn.fetch(
                    f"SELECT b.build, p.partition, p.next_offset FROM {_active(2)} "
                    "LEFT JOIN onward_projector_positions p "
                    "ON p.consumer = $1 || '@' || b.build::text",
                    consumer,
                    PROJECTION,
                )
                if rows:
                    self._build = int(rows[0]["build"])
                    return {
                        int(r["partition"]): int(r["next_offset"])
                        for r in rows
                        if r["partition"] is not None
                    }
            rows = await conn.fetch(
                "SELECT partition, next_offset FROM onward_projector_positions WHERE consumer = $1",
                self._consumer(consumer),
            )
        return {int(r["partition"]): int(r["next_offset"]) for r in rows}

    async def tool_calls(self, run_id: str) -> list[ToolCallRow]:
        _, tool_calls = self._read_tables()
        async with self._connection("reading tool call rows", run_id) as conn:
            rows = await conn.fetch(
                f"SELECT {_CALL_COLUMNS} FROM {tool_calls} WHERE run_id = $1 "
                "ORDER BY dispatched_at NULLS LAST, call_id",
                run_id,
            )
        return [ToolCallRow(**dict(r)) for r in rows]

    async def runs(
        self,
        *,
        tenant: str | None = None,
        statuses: Collection[RunStatus] | None = None,
        user: str | None = None,
        agent: str | None = None,
        updated_before: int | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[RunSummary]:
        check_runs_limit(limit)
        frontiers, _ = self._read_tables()
        # Only the conditions given are in the statement, so the planner picks an index for
        # them (an `$1 IS NULL OR ...` form would have it plan for every case at once).
        conditions: list[str] = []
        args: list[Any] = []
        for condition, value in (
            ("tenant = ${}", tenant),
            ("status = ANY(${}::text[])", list(statuses) if statuses is not None else None),
            ("user_id = ${}", user),
            ("agent = ${}", agent),
            ("updated_at < ${}", updated_before),
            ("run_id > ${}", after),
        ):
            if value is not None:
                args.append(value)
                conditions.append(condition.format(len(args)))
        query = f"SELECT {_SUMMARY_COLUMNS} FROM {frontiers}"
        if conditions:
            query += " WHERE " + " AND ".join(conditions)
        query += " ORDER BY run_id"
        if limit is not None:
            args.append(limit)
            query += f" LIMIT ${len(args)}"
        async with self._connection("listing runs") as conn:
            rows = await conn.fetch(query, *args)
        return [_summary(r) for r in rows]


_FRONTIER_NAMES = (*_SUMMARY_COLUMNS.split(", "), "payload", "snapshot_error")
_CALL_NAMES = tuple(_CALL_COLUMNS.split(", "))


_FEW_ROWS = 16
"""Most rows upserted by statements of their own rather than staged by COPY."""

_NUMERIC_KEYS = frozenset({"seq"})


def _in_key_order(key: Sequence[str]) -> str:
    """An ``ORDER BY`` list sorting rows as Python sorts their keys (text by code point: the
    C collation, whatever the database's).

    Every write upserts a table's rows in key order, whichever path it takes, so two writers
    of the same rows (projectors overlapping in a rebalance, a rebuild's transcript beside the
    live one's) lock them in one order: in any other, each can hold a row the other waits for,
    and PostgreSQL fails one of them as deadlocked.
    """
    return ", ".join(k if k in _NUMERIC_KEYS else f'{k} COLLATE "C"' for k in key)


async def _stage_and_upsert(
    conn: asyncpg.Connection,
    table: str,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    rows: Iterable[tuple[Any, ...]],
) -> None:
    """Upsert rows, each kept only if it is folded further than the stored one.

    Many rows: binary COPY into a staging table, then one guarded ``INSERT ... SELECT ... ON
    CONFLICT``; about twice as fast as ``unnest`` of arrays, whose per-element type checks
    dominate large batches. A few rows (an inline fold's): one prepared guarded ``INSERT`` per
    row, sent together in one round trip, where staging would take three. Either way in key
    order (`_in_key_order`): the ``SELECT`` orders the staged rows, so only the few are sorted
    here (sorting a backlog's store in Python cost its projector a twentieth of its time).
    """
    names = ", ".join(columns)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    guard = (
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates} "
        f"WHERE {table}.through_offset < excluded.through_offset"
    )
    rows = list(rows)
    if len(rows) <= _FEW_ROWS:
        at = [columns.index(k) for k in key]
        rows.sort(key=lambda row: [row[i] for i in at])
        values = ", ".join(f"${n}" for n in range(1, len(columns) + 1))
        await conn.executemany(f"INSERT INTO {table} ({names}) VALUES ({values}) {guard}", rows)
        return
    stage = f"onward_stage_{table}"
    await conn.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table}) ON COMMIT DELETE ROWS"
    )
    await conn.copy_records_to_table(stage, records=rows, columns=columns)
    await conn.execute(
        f"INSERT INTO {table} ({names}) SELECT {names} FROM {stage} "
        f"ORDER BY {_in_key_order(key)} {guard}"
    )


TRANSCRIPT_CHUNK_MESSAGES = 256
"""At most this many messages in one transcript row: a backlog's store of a long run is split,
so no row grows without bound and a reader of an early seq decodes a bounded chunk."""


class _Chunk(NamedTuple):
    """Messages of one run stored as one transcript row, keyed by the first one's seq."""

    tenant: str
    run_id: str
    rows: list[TranscriptRow]
    body: bytes

    @property
    def stored(self) -> tuple[str, str, int, int | None, bytes]:
        last = self.rows[-1].seq if len(self.rows) > 1 else None
        return (self.tenant, self.run_id, self.rows[0].seq, last, self.body)


def _chunked(messages: Sequence[TranscriptRow]) -> list[list[TranscriptRow]]:
    """A store's messages by run, each run's in seq order (each seq once, the first given), in
    pieces of at most `TRANSCRIPT_CHUNK_MESSAGES`."""
    by_run: dict[tuple[str, str], dict[int, TranscriptRow]] = {}
    for message in messages:
        by_run.setdefault((message.tenant, message.run_id), {}).setdefault(message.seq, message)
    chunks: list[list[TranscriptRow]] = []
    for said in by_run.values():
        ordered = [said[seq] for seq in sorted(said)]
        chunks.extend(
            ordered[start : start + TRANSCRIPT_CHUNK_MESSAGES]
            for start in range(0, len(ordered), TRANSCRIPT_CHUNK_MESSAGES)
        )
    return chunks


async def _stored_messages(messages: Sequence[TranscriptRow]) -> list[_Chunk]:
    """A store's transcript rows, compressed before the write takes a connection."""
    chunks = _chunked(messages)
    bodies = await encoded_chunks(chunks)
    return [
        _Chunk(rows[0].tenant, rows[0].run_id, rows, body)
        for rows, body in zip(chunks, bodies, strict=True)
    ]


_STORED_OVERLAPS = """
SELECT b.n, t.seq, coalesce(t.last_seq, t.seq) AS last_seq
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
    WITH ORDINALITY AS b(tenant, run_id, first_seq, last_seq, n)
CROSS JOIN LATERAL (
    (SELECT seq, last_seq FROM onward_transcript s
     WHERE s.tenant = b.tenant AND s.run_id = b.run_id AND s.seq < b.first_seq
     ORDER BY s.seq DESC LIMIT 1)
    UNION ALL
    (SELECT seq, last_seq FROM onward_transcript s
     WHERE s.tenant = b.tenant AND s.run_id = b.run_id
       AND s.seq BETWEEN b.first_seq AND b.last_seq)
) AS t
WHERE coalesce(t.last_seq, t.seq) >= b.first_seq
"""
"""For each chunk about to be stored (``n`` counts from 1), the stored rows of its run whose
seqs overlap its own: the row before its first seq, and any starting within it. Two index
probes a chunk, whatever the run's length."""


async def _not_stored(conn: asyncpg.Connection, chunks: list[_Chunk]) -> list[_Chunk]:
    """The chunks without the messages their run's stored rows hold already.

    A stored row holds every message of its run from its seq through its last_seq: it was
    folded from every counted event in between. So a message whose seq falls in such a range
    is kept as it was stored (a rebuild deriving it again, a store written twice), and a chunk
    losing some is encoded again with the rest, here, on the rare path."""
    overlaps = await conn.fetch(
        _STORED_OVERLAPS,
        [c.tenant for c in chunks],
        [c.run_id for c in chunks],
        [c.rows[0].seq for c in chunks],
        [c.rows[-1].seq for c in chunks],
    )
    if not overlaps:
        return chunks
    held: dict[int, list[tuple[int, int]]] = {}
    for overlap in overlaps:
        held.setdefault(overlap["n"] - 1, []).append((overlap["seq"], overlap["last_seq"]))
    kept: list[_Chunk] = []
    for n, chunk in enumerate(chunks):
        ranges = held.get(n)
        if ranges is None:
            kept.append(chunk)
            continue
        rest = [r for r in chunk.rows if not any(lo <= r.seq <= hi for lo, hi in ranges)]
        if rest:
            (body,) = await encoded_chunks([rest])
            kept.append(_Chunk(chunk.tenant, chunk.run_id, rest, body))
    return kept


async def _append_messages(conn: asyncpg.Connection, chunks: list[_Chunk]) -> None:
    """Append transcript rows: many staged by binary COPY and inserted by one statement (a
    projector's backlog stores thousands at once), a few as arrays in one statement.

    The transcript is not per build: what another build (or an earlier store) stored is kept
    (`_not_stored`). Two writers storing the same run at once may both start a chunk at the
    same seq; both folded the same events from it, so the longer one is kept."""
    rows = [chunk.stored for chunk in await _not_stored(conn, chunks)]  # ordered by the SELECT
    if not rows:
        return
    in_key_order = f"ORDER BY {_in_key_order(_TRANSCRIPT_NAMES[:3])}"
    keep_longer = (
        "ON CONFLICT (tenant, run_id, seq) DO UPDATE "
        "SET last_seq = excluded.last_seq, message = excluded.message "
        "WHERE coalesce(onward_transcript.last_seq, onward_transcript.seq) "
        "< coalesce(excluded.last_seq, excluded.seq)"
    )
    names = ", ".join(_TRANSCRIPT_NAMES)
    if len(rows) <= _FEW_ROWS:
        await conn.execute(
            f"INSERT INTO onward_transcript ({names}) "
            "SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bytea[]) "
            f"AS t({names}) {in_key_order} {keep_longer}",
            *(list(column) for column in zip(*rows, strict=True)),
        )
        return
    stage = "onward_stage_transcript"
    await conn.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE onward_transcript) ON COMMIT DELETE ROWS"
    )
    await conn.copy_records_to_table(stage, records=rows, columns=_TRANSCRIPT_NAMES)
    await conn.execute(
        f"INSERT INTO onward_transcript ({names}) SELECT {names} FROM {stage} {in_key_order} "
        f"{keep_longer}"
    )


_TRANSCRIPT_NAMES = ("tenant", "run_id", "seq", "last_seq", "message")


async def _delete_restarted(
    conn: asyncpg.Connection, tool_calls: str, restarted: Collection[tuple[str, str, int]]
) -> None:
    """Delete the call rows of collected runs whose ids began again, and their transcript rows
    under each ``(tenant, run_id, last_seq)`` given, through that seq: a fold from before the
    collection (a rebuild read with the archive) stored the old run's, which the new run's
    would be laid over. The transcript is every build's: a live new run's rows among them
    (same tenant, seqs the old run had too) are stored again as the fold reaches their
    events, derived from the same ones."""
    tenants, run_ids, through = (list(column) for column in zip(*restarted, strict=True))
    await conn.execute(f"DELETE FROM {tool_calls} WHERE run_id = ANY($1::text[])", run_ids)
    # A row of several messages reaching past the seq: the messages past it are stored again.
    deleted = await conn.fetch(
        "DELETE FROM onward_transcript t "
        "USING unnest($1::text[], $2::text[], $3::bigint[]) AS r(tenant, run_id, through) "
        "WHERE t.tenant = r.tenant AND t.run_id = r.run_id AND t.seq <= r.through "
        "RETURNING t.tenant, t.run_id, t.last_seq, t.message, r.through",
        tenants,
        run_ids,
        through,
    )
    rests = [
        [
            TranscriptRow(tenant=row["tenant"], run_id=row["run_id"], seq=seq, message=message)
            for seq, message in decode_chunk(row["message"])
            if seq > row["through"]
        ]
        for row in deleted
        if row["last_seq"] is not None and row["last_seq"] > row["through"]
    ]
    if rests:
        bodies = await encoded_chunks(rests)
        await _append_messages(
            conn,
            [
                _Chunk(rest[0].tenant, rest[0].run_id, rest, body)
                for rest, body in zip(rests, bodies, strict=True)
            ],
        )


def _frontier_row(snapshot: Snapshot) -> tuple[Any, ...]:
    f = snapshot.frontier
    return (
        f.tenant,
        f.run_id,
        f.agent,
        f.revision,
        f.status,
        f.holder,
        f.iteration,
        f.input_tokens,
        f.output_tokens,
        f.last_seq,
        f.fence,
        f.last_boundary,
        f.resume_seq,
        f.waiting_on,
        f.refused,
        f.partition,
        f.through_offset,
        f.updated_at,
        f.user_id,
        snapshot.payload,
        snapshot.error,
    )


def _call_row(call: ToolCallRow) -> tuple[Any, ...]:
    return (
        call.tenant,
        call.run_id,
        call.call_id,
        call.tool,
        call.idempotency_key,
        call.fence,
        call.dispatched_at,
        call.completed_at,
        call.outcome,
        call.latency_us,
        call.through_offset,
    )
