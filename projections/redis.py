"""`RedisFrontierStore`: frontier rows, call rows, transcripts and projector positions in Redis.

For a deployment that already runs Redis and wants its frontiers there: one key per run, a
run's row one round trip away, no SQL. It holds every run in memory until garbage collection
removes finished runs' keys (`onward gc`, `RedisFrontierSweeper`), and it has no SQL sinks
(`SqlProjectionSink`) and no ad-hoc queries: listing runs filters one index of run ids, that
of the statuses asked for (or of the tenant, whichever holds fewer runs), so a fleet asking
for its running runs reads those, not every finished run kept until garbage collection.

A write is one Lua script (``schemas/redis/frontier_write.lua``), which Redis runs atomically:
rows, call rows, quarantine entries, transcript rows and the consumer's positions change
together, as the PostgreSQL store's transaction changes them, and every row is guarded by
``through_offset`` (positions by the next offset), so a batch folded twice changes nothing.
A Lua script is not rolled back if it fails halfway, so everything that could fail is done
before the call: the batch is read whole and every value is checked against
``max_value_bytes``; the script only compares and stores strings.

Exactly once then rests on Redis keeping what it acknowledged. Run it with AOF
(``appendonly yes``): a restart that loses the last writes loses each one's positions with its
rows, and the projector folds them again from the log. A projector need not see the restart
for that (one between two of its calls fails none of them): the store remembers the highest
position it saw stored per partition, and the script refuses a batch, writing nothing, when
Redis now holds a lower one, so the projector seeks back to what Redis holds instead of laying
its positions over the rows Redis forgot. Never let it evict
(``maxmemory-policy noeviction``): an evicted row is a run whose frontier is gone while the
positions say it was stored. One script touches many runs' keys, so a single node, not Redis
Cluster.

Keys, under the store's prefix:

* ``frontier:<run>``: a hash (``through``, ``summary``, ``tenant``, ``status``, ``payload``,
  ``error``, ``quarantined``), the run's one key. ``tenant`` and ``status`` are the summary's,
  kept beside it so the write script moves the run between indexes in the step that changes
  them (a row written before they were kept says them only in its summary).
* ``runs``, ``runs-of:<tenant>`` and ``runs-by-status:<status>``: sorted sets of run ids (all
  scores 0, read by ``ZRANGEBYLEX``), the keysets that `RedisFrontierStore.runs` pages through.
  A run is in the index of its stored summary's tenant and status, garbage collection removes
  it from all three.
* ``runs-by-status-built``: set once every run is in its status's index. A store first written
  by this code sets it with its first write. Runs a store held before the status index was
  kept are indexed by the first listing by status, which first finishes the index, one
  bounded script step (``schemas/redis/frontier_index.lua``, `LIST_CHUNK` runs) at a time from
  the cursor ``runs-by-status-cursor``, several workers sharing the work; the write script
  indexes whatever it writes meanwhile, so once a step reaches the last run the index is
  whole. Every writer must run this code by then: an older one stores rows without indexing
  them, and a listing by status would miss them.
* ``calls:<run>``: a hash of the run's call rows (``c:<call>``) and their offsets (``t:<call>``).
* ``transcript:<len(tenant)>:<tenant>:<run>``: a hash from seq to message.
* ``positions:<consumer>``: a hash from partition to next offset.
* ``quarantine:<consumer>``: a set of ``<partition>:<offset>``, each a hash
  ``quarantine:<consumer>:<partition>:<offset>`` (``entry``, ``state``, ``run_id``, ...).
* ``frontier-format``: the frontier row format the keys were written in.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Collection, Mapping, Sequence
from importlib.resources import files
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from onward._storage import BACKEND_TIMEOUT_S, RedisStore, translated
from onward.errors import (
    BackendUnavailableError,
    InvalidInputError,
    PayloadTooLargeError,
    SchemaMismatchError,
)

from .base import (
    FrontierStoreBackend,
    FrontierWrite,
    QuarantineEntry,
    QuarantineState,
    RunSummary,
    StoredFrontier,
    check_runs_limit,
    decode_payload,
    released_mark,
)
from .frontier import TERMINAL_STATUSES, RunStatus, ToolCallRow
from .transcript import TranscriptRow, decode_message

STORE_FORMAT = 1
"""The layout of the keys this code writes (``frontier-format``); a newer one is refused."""

DEFAULT_MAX_VALUE_BYTES = 8 * 1024 * 1024
"""Largest single value (a frontier payload, a call row, a transcript message) a write sends:
8 MiB, well above the frontier snapshot cap (`DEFAULT_MAX_BYTES`), well below Redis's own
512 MB bound on a string."""

LIST_CHUNK = 256
"""Run ids `RedisFrontierStore.runs` reads from an index per round trip while it filters."""

QUARANTINE_CHUNK = 1024
"""Quarantine entries a listing looks at in Redis per round trip, keeping those asked for."""

_ENTRY_SUFFIX = re.compile(r":-?[0-9]+:-?[0-9]+\Z")
"""How a quarantine entry's key ends (``:<partition>:<offset>``) after its consumer's set's."""

_summary_decoder = msgspec.json.Decoder(RunSummary)
_call_decoder = msgspec.json.Decoder(ToolCallRow)


class _HeldEntry(msgspec.Struct, frozen=True, kw_only=True):
    """The parts of a quarantine entry set when it is held; the state and who released it
    are fields of their own, which the release script sets."""

    run_id: str | None
    tenant: str | None
    partition: int
    offset: int
    kind: str | None
    reason: str
    quarantined_at: int


_held_decoder = msgspec.json.Decoder(_HeldEntry)


def _script_source(name: str) -> str:
    return (files("onward") / "schemas" / "redis" / f"{name}.lua").read_text()


def _transcript_key(prefix: str, tenant: str, run_id: str) -> str:
    """The hash of one run's transcript; the tenant's length keeps ``a:b`` + ``c`` apart from
    ``a`` + ``b:c``."""
    return f"{prefix}transcript:{len(tenant)}:{tenant}:{run_id}"


def _check_consumer(consumer: str) -> None:
    """Refuse a consumer named ``<c>:<partition>:<offset>``: its quarantine set would be the
    key of consumer ``c``'s entry hash, and a script meeting the other type fails halfway,
    its earlier writes kept. No other consumer's keys can meet another's."""
    if _ENTRY_SUFFIX.search(consumer):
        raise InvalidInputError(
            f"the Redis frontier store cannot take consumer {consumer!r}: a name ending in "
            "':<number>:<number>' is that of another consumer's quarantine entry"
        )


def _text(value: str | None) -> str:
    return "" if value is None else value


def _str(value: bytes | str) -> str:
    """A value Redis answered (the client decodes answers, though its types do not say so)."""
    return value.decode() if isinstance(value, bytes) else value


class RedisFrontierStore(RedisStore, FrontierStoreBackend):
    """A `FrontierStore` in Redis.

    Args:
        url: ``redis://host:port/db`` (or ``rediss://``).
        prefix: Put before every key (``ONWARD_REDIS_PREFIX``).
        max_value_bytes: Largest single value a write sends; a larger one fails the write
            with `PayloadTooLargeError` before anything reaches Redis. Keep it above the
            snapshot cap, or a projector meets a frontier it can neither store nor skip.
        max_connections: Largest connection pool.
        timeout_s: The longest one call may wait for Redis.
    """

    what = "Redis frontier store"
    _write_script: AsyncScript
    _release_script: AsyncScript
    _dismiss_script: AsyncScript
    _gc_script: AsyncScript
    _index_script: AsyncScript
    _quarantined_script: AsyncScript

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "onward:",
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_connections: int = 64,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        super().__init__(url, prefix=prefix, max_connections=max_connections, timeout_s=timeout_s)
        self.max_value_bytes = max_value_bytes
        # Per consumer and partition, the highest position seen stored (read or written): a
        # write finding a lower one stored finds writes Redis acknowledged and then lost.
        self._seen: dict[str, dict[int, int]] = {}
        # Whether every run is known to be in the index of its status (it stays so).
        self._status_indexed = False

    def _started(self, client: aioredis.Redis) -> None:
        self._write_script = client.register_script(_script_source("frontier_write"))
        self._release_script = client.register_script(_script_source("frontier_release"))
        self._dismiss_script = client.register_script(_script_source("frontier_dismiss"))
        self._gc_script = client.register_script(_script_source("frontier_gc"))
        self._index_script = client.register_script(_script_source("frontier_index"))
        self._quarantined_script = client.register_script(_script_source("frontier_quarantined"))

    async def _connect(self) -> None:
        """Connect, then refuse keys of a newer layout at start rather than at first use."""
        await super()._connect()
        await self.verify()

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    async def verify(self) -> None:
        """Refuse keys written in a newer layout than this code reads."""
        client = self._live_client()
        key = f"{self.prefix}frontier-format"
        doing = "reading the Redis frontier format"
        with translated(doing), self._naming(key, doing):
            async with asyncio.timeout(self._timeout_s):
                found = await client.get(key)
        if found is None:
            return
        try:
            layout = int(found)
        except ValueError:
            # Not a format this code or any Onward wrote: said by key, not as a bare ValueError.
            raise SchemaMismatchError(
                f"the Redis key {self.prefix}frontier-format holds {found!r}, not a frontier "
                "format (a number): another program wrote it under the prefix "
                f"{self.prefix!r}; give Onward a prefix of its own (ONWARD_REDIS_PREFIX)"
            ) from None
        if layout > STORE_FORMAT:
            raise SchemaMismatchError(
                f"the Redis frontier keys under {self.prefix!r} are in format {layout}, newer "
                f"than this code reads ({STORE_FORMAT}); upgrade Onward"
            )

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        client = self._live_client()
        with translated(f"loading the frontiers of {len(ids)} runs"):
            async with asyncio.timeout(self._timeout_s), client.pipeline(False) as pipe:
                for run_id in ids:
                    pipe.hmget(
                        self._key("frontier", run_id), "summary", "payload", "error", "quarantined"
                    )
                answers = await pipe.execute()
        found: dict[str, StoredFrontier] = {}
        for run_id, (summary, payload, error, quarantined) in zip(ids, answers, strict=True):
            if summary is None:
                continue
            frontier = None if payload is None else decode_payload(payload.encode(), run_id=run_id)
            found[run_id] = StoredFrontier.of(
                _summary_decoder.decode(summary), frontier, error, quarantined
            )
        return found

    def _checked(self, what: str, value: bytes, run_id: str | None) -> bytes:
        """``value``, or `PayloadTooLargeError` if it is over ``max_value_bytes``."""
        if len(value) > self.max_value_bytes:
            raise PayloadTooLargeError(
                f"{what} of {len(value)} bytes is over the Redis frontier store's "
                f"max_value_bytes of {self.max_value_bytes}; nothing of the batch was written",
                run_id=run_id,
                size=len(value),
                limit=self.max_value_bytes,
            )
        return value

    def _arguments(self, batch: FrontierWrite) -> list[Any]:
        """The write script's arguments: the whole batch read and checked, so nothing can fail
        once the script has started writing."""
        rows: list[Any] = []
        for snap in batch.snapshots:
            f = snap.frontier
            payload = b"" if snap.payload is None else snap.payload
            rows += [
                f.run_id,
                f.tenant,
                f.status,
                f.through_offset,
                msgspec.json.encode(RunSummary.of(f)),
                self._checked(f"the frontier of run {f.run_id!r}", payload, f.run_id),
                _text(snap.error),
            ]
        calls: list[Any] = []
        for call in batch.calls:
            row = msgspec.json.encode(call)
            what = f"the call row {call.call_id!r}"
            calls += [call.run_id, call.call_id, call.through_offset]
            calls.append(self._checked(what, row, call.run_id))
        cleared = list(batch.cleared)
        held: list[Any] = []
        for entry in batch.quarantine:
            stored = _HeldEntry(
                run_id=entry.run_id,
                tenant=entry.tenant,
                partition=entry.partition,
                offset=entry.offset,
                kind=entry.kind,
                reason=entry.reason,
                quarantined_at=entry.quarantined_at,
            )
            held += [f"{entry.partition}:{entry.offset}", _text(entry.run_id)]
            held += [msgspec.json.encode(stored), entry.mark]
        said: list[Any] = []
        for message in batch.messages:
            body = self._checked(
                f"the transcript message at seq {message.seq}", message.encoded(), message.run_id
            )
            said += [_transcript_key(self.prefix, message.tenant, message.run_id), message.seq]
            said.append(body)
        restarted: list[Any] = []
        for tenant, run_id, through in batch.restarted:
            restarted += [self._key("calls", run_id), _transcript_key(self.prefix, tenant, run_id)]
            restarted.append(through)
        positions: list[Any] = []
        seen = self._seen.get(batch.consumer, {})
        for partition, offset in batch.positions.items():
            positions += [partition, offset, seen.get(partition, "")]
        counts = [
            len(batch.snapshots),
            len(batch.calls),
            len(cleared),
            len(batch.quarantine),
            len(batch.messages),
            len(positions) // 3,
            len(restarted) // 3,
        ]
        head = [self.prefix, batch.consumer, STORE_FORMAT, *counts]
        return [*head, *restarted, *rows, *calls, *cleared, *held, *said, *positions]

    async def _write(self, batch: FrontierWrite) -> None:
        """Run the write script; refused (Redis holds a position below one seen stored), forget
        the positions seen and raise, so the projector seeks to what Redis holds now."""
        self._live_client()
        _check_consumer(batch.consumer)
        arguments = self._arguments(batch)
        with translated(f"writing frontiers of consumer {batch.consumer!r}"):
            async with asyncio.timeout(self._timeout_s):
                answer = await self.run_script(
                    self._write_script, [], arguments, what="frontier_write.lua"
                )
        if answer != 1:
            partition, stored = int(answer[0]), _str(answer[1]) or "none"
            seen = self._seen.pop(batch.consumer, {}).get(partition)
            raise BackendUnavailableError(
                f"Redis lost writes it acknowledged: consumer {batch.consumer!r} has position "
                f"{stored} stored in partition {partition}, below the {seen} stored before (a "
                "restart without persistence, or an AOF that lost its last writes); nothing of "
                "the batch was written: fold again from the positions Redis holds"
            )
        self._saw(batch.consumer, batch.positions)

    def _saw(self, consumer: str, positions: Mapping[int, int]) -> None:
        """Remember ``positions`` as stored for ``consumer``, where above those seen."""
        seen = self._seen.setdefault(consumer, {})
        for partition, offset in positions.items():
            seen[partition] = max(offset, seen.get(partition, offset))

    async def quarantined(
        self,
        consumer: str,
        *,
        run_id: str | None = None,
        states: Collection[QuarantineState] | None = None,
    ) -> list[QuarantineEntry]:
        client = self._live_client()
        _check_consumer(consumer)
        held_under = self._key("quarantine", consumer)
        wanted = [] if states is None else sorted(set(states))
        if states is not None and not wanted:
            return []
        chosen = [run_id or "", "1" if states is None else "0", *wanted]
        with translated("listing quarantined records", run_id=run_id):
            async with asyncio.timeout(self._timeout_s):
                # Chosen in Redis, a bounded step at a time: only those asked for cross over.
                found: set[str] = set()
                cursor = "0"
                while True:
                    step = [self.prefix, consumer, cursor, QUARANTINE_CHUNK, *chosen]
                    answer = await self.run_script(
                        self._quarantined_script, [], step, what="frontier_quarantined.lua"
                    )
                    cursor = _str(answer[0])
                    found.update(map(_str, answer[1:]))
                    if cursor == "0":
                        break
                positions = sorted(found)
                async with client.pipeline(False) as pipe:
                    for position in positions:
                        pipe.hgetall(f"{held_under}:{position}")
                    answers = await pipe.execute()
        entries = [_entry(fields) for fields in answers if fields]
        return sorted(
            (
                e
                for e in entries
                if (run_id is None or e.run_id == run_id) and (states is None or e.state in states)
            ),
            key=lambda e: (e.partition, e.offset),
        )

    async def release(self, consumer: str, run_id: str, *, by: str, at: int) -> int:
        self._live_client()
        _check_consumer(consumer)
        arguments = [self.prefix, consumer, run_id, by, at, released_mark(by)]
        with translated("releasing a quarantined run", run_id=run_id):
            async with asyncio.timeout(self._timeout_s):
                return int(
                    await self.run_script(
                        self._release_script,
                        [],
                        arguments,
                        what="frontier_release.lua",
                        run_id=run_id,
                    )
                )

    async def dismiss(self, consumer: str, partition: int, offset: int, *, by: str, at: int) -> int:
        self._live_client()
        _check_consumer(consumer)
        arguments = [self.prefix, consumer, f"{partition}:{offset}", by, at]
        with translated("dismissing a quarantined record"):
            async with asyncio.timeout(self._timeout_s):
                return int(
                    await self.run_script(
                        self._dismiss_script, [], arguments, what="frontier_dismiss.lua"
                    )
                )

    async def transcript(self, run_id: str, *, tenant: str, through: int) -> list[TranscriptRow]:
        client = self._live_client()
        key = _transcript_key(self.prefix, tenant, run_id)
        doing = "reading the transcript"
        with translated(doing, run_id=run_id), self._naming(key, doing, run_id):
            async with asyncio.timeout(self._timeout_s):
                stored = await client.hgetall(key)
        rows = sorted((int(seq), _str(body)) for seq, body in stored.items())
        return [
            TranscriptRow(
                tenant=tenant, run_id=run_id, seq=seq, message=decode_message(body.encode())
            )
            for seq, body in rows
            if seq <= through
        ]

    async def positions(self, consumer: str) -> dict[int, int]:
        client = self._live_client()
        _check_consumer(consumer)  # a projector reads its positions first: refused at start
        key = self._key("positions", consumer)
        doing = f"reading the positions of consumer {consumer!r}"
        with translated(doing), self._naming(key, doing):
            async with asyncio.timeout(self._timeout_s):
                stored = await client.hgetall(key)
        found = {int(partition): int(offset) for partition, offset in stored.items()}
        self._saw(consumer, found)
        return found

    async def tool_calls(self, run_id: str) -> list[ToolCallRow]:
        client = self._live_client()
        key = self._key("calls", run_id)
        doing = "reading tool call rows"
        with translated(doing, run_id=run_id), self._naming(key, doing, run_id):
            async with asyncio.timeout(self._timeout_s):
                stored = await client.hgetall(key)
        rows = [_call_decoder.decode(v) for k, v in stored.items() if _str(k).startswith("c:")]
        return sorted(rows, key=lambda r: (r.dispatched_at is None, r.dispatched_at, r.call_id))

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
        """Pages in id order through the indexes of the statuses, or the tenant's index, or
        every run's (`_indexes`), reading `LIST_CHUNK` summaries a round trip and keeping those
        that pass the filters, the stored tenant and status among them."""
        check_runs_limit(limit)
        client = self._live_client()
        kept: list[RunSummary] = []
        with translated("listing runs"):
            indexes = await self._indexes(client, tenant, statuses)
            after_id = after
            while indexes and (limit is None or len(kept) < limit):
                async with asyncio.timeout(self._timeout_s):
                    ids = await _next_ids(client, indexes, after_id)
                    if not ids:
                        break
                    summaries = await self._summaries(client, ids)
                kept += [
                    s
                    for s in summaries
                    if (tenant is None or s.tenant == tenant)
                    and (statuses is None or s.status in statuses)
                    and (user is None or s.user_id == user)
                    and (agent is None or s.agent == agent)
                    and (updated_before is None or s.updated_at < updated_before)
                ]
                after_id = ids[-1]
        return kept[:limit]

    async def _indexes(
        self, client: aioredis.Redis, tenant: str | None, statuses: Collection[RunStatus] | None
    ) -> list[str]:
        """The indexes holding every run a listing may keep: those of ``statuses`` (indexed
        first, if the store holds runs from before the status index), or the tenant's when it
        holds fewer runs, or every run's."""
        if statuses is not None and not statuses:
            return []
        scope = self._key("runs-of", tenant) if tenant is not None else f"{self.prefix}runs"
        if statuses is None:
            return [scope]
        await self._index_by_status()
        by_status = [self._key("runs-by-status", s) for s in sorted(statuses)]
        if tenant is None:
            return by_status
        async with asyncio.timeout(self._timeout_s), client.pipeline(False) as pipe:
            for index in (scope, *by_status):
                pipe.zcard(index)
            in_scope, *in_statuses = await pipe.execute()
        return [scope] if in_scope < sum(in_statuses) else by_status

    async def _index_by_status(self) -> None:
        """Index by status the runs written before the store kept that index, a bounded step
        at a time (``schemas/redis/frontier_index.lua``); at once if it is done. Sent as
        `run_script` sends the other scripts, so a key of another type is named as there."""
        while not self._status_indexed:
            async with asyncio.timeout(self._timeout_s):
                done = await self.run_script(
                    self._index_script, [], [self.prefix, LIST_CHUNK], what="frontier_index.lua"
                )
            self._status_indexed = int(done) == 1

    async def summaries(self, run_ids: Collection[str]) -> dict[str, RunSummary]:
        """The stored summaries of those of ``run_ids`` that have a frontier, by run id."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        client = self._live_client()
        with translated(f"reading the summaries of {len(ids)} runs"):
            async with asyncio.timeout(self._timeout_s):
                found = await self._summaries(client, ids)
        return {summary.run_id: summary for summary in found}

    async def set_aside(self, run_ids: Collection[str]) -> set[str]:
        """Those of ``run_ids`` whose row is marked set aside in quarantine (held, or released
        and not folded again yet)."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return set()
        client = self._live_client()
        with translated(f"reading the quarantine marks of {len(ids)} runs"):
            async with asyncio.timeout(self._timeout_s), client.pipeline(False) as pipe:
                for run_id in ids:
                    pipe.hexists(self._key("frontier", run_id), "quarantined")
                answers = await pipe.execute()
        return {run_id for run_id, marked in zip(ids, answers, strict=True) if marked}

    async def sweep_finished(
        self,
        expired: Sequence[tuple[str, str]],
        calls: Sequence[tuple[str, str]],
        *,
        delete: bool,
        before: int | None = None,
        swept: set[str] | None = None,
    ) -> tuple[int, int, int]:
        """Count or delete what finished runs keep here: every key of the ``expired`` runs
        (frontier, transcript, call rows, and their place in the run indexes), the call rows
        alone of the ``calls`` runs, each given as ``(run_id, tenant)``.

        One script per run (``schemas/redis/frontier_gc.lua``) checks, in the step that
        deletes, that the run's stored summary says it finished (with ``before``, that its
        row was last touched before it: an event folded since the caller decided makes the run
        not old) and its row is not set aside in quarantine: any other run keeps everything.
        Returns how many frontiers, transcript rows and call rows there were; ``swept``, when
        given, gets the runs that passed the check (the caller keeps its own rows of the
        others).
        """
        client = self._live_client()
        found = [0, 0, 0]
        if not expired and not calls:
            return (0, 0, 0)
        finished = sorted(TERMINAL_STATUSES)
        ids: list[str] = []
        sent: list[list[str]] = []
        with translated("deleting the keys of finished runs" if delete else "counting them"):
            async with (
                self._writing(client),
                asyncio.timeout(self._timeout_s),
                client.pipeline() as pipe,
            ):
                for scope, runs in (("expired", expired), ("calls", calls)):
                    for run_id, tenant in runs:
                        keys = [
                            self._key("frontier", run_id),
                            self._key("calls", run_id),
                            _transcript_key(self.prefix, tenant, run_id),
                            f"{self.prefix}runs",
                            self._key("runs-of", tenant),
                            *(self._key("runs-by-status", s) for s in finished),
                        ]
                        cutoff = "" if before is None else str(int(before))
                        args = [run_id, "1" if delete else "0", scope, cutoff, *finished]
                        await self._gc_script(keys=keys, args=args, client=pipe)
                        ids.append(run_id)
                        sent.append(keys)
                answers = await pipe.execute(raise_on_error=False)
                self._raise_first_error(answers, "frontier_gc.lua", sent, ids)
        for run_id, (*there, passed) in zip(ids, answers, strict=True):
            for n, count in enumerate(there):
                found[n] += int(count)
            if swept is not None and int(passed):
                swept.add(run_id)
        return (found[0], found[1], found[2])

    async def _summaries(self, client: aioredis.Redis, run_ids: Sequence[str]) -> list[RunSummary]:
        async with client.pipeline(False) as pipe:
            for run_id in run_ids:
                pipe.hget(self._key("frontier", run_id), "summary")
            answers = await pipe.execute()
        return [_summary_decoder.decode(a) for a in answers if a is not None]


async def _next_ids(client: aioredis.Redis, indexes: Sequence[str], after: str | None) -> list[str]:
    """The next run ids after ``after`` in id order across ``indexes``: up to `LIST_CHUNK` of
    each, then only those below where a full chunk stopped, as any index may hold more there."""
    start = "-" if after is None else f"({after}"
    async with client.pipeline(False) as pipe:
        for index in indexes:
            pipe.zrangebylex(index, start, "+", start=0, num=LIST_CHUNK)
        chunks = [[_str(i) for i in chunk] for chunk in await pipe.execute()]
    if len(chunks) == 1:
        return chunks[0]
    ids = sorted({i for chunk in chunks for i in chunk})
    full = [chunk[-1] for chunk in chunks if len(chunk) == LIST_CHUNK]
    return [i for i in ids if i <= min(full)] if full else ids


def _entry(fields: dict[str, str]) -> QuarantineEntry:
    held = _held_decoder.decode(fields["entry"])
    released_at = fields.get("released_at")
    return QuarantineEntry(
        run_id=held.run_id,
        tenant=held.tenant,
        partition=held.partition,
        offset=held.offset,
        kind=held.kind,
        reason=held.reason,
        state=fields["state"],  # type: ignore[arg-type]
        quarantined_at=held.quarantined_at,
        released_by=fields.get("released_by"),
        released_at=None if released_at is None else int(released_at),
    )


__all__ = ["DEFAULT_MAX_VALUE_BYTES", "RedisFrontierStore"]
