"""`PostgresRequests`: the fleet's requests in a PostgreSQL table, for a deployment on PostgreSQL
alone (``ONWARD_BACKEND=postgres``), where the Kafka backend has its requests topic.

An application inserts a row per request (`submit`), checked, masked and signed exactly as it
would send it to the topic, and notifies the workers (``pg_notify``). A worker claims rows for a
while (`claim`), renews the claims while it acts on them, and deletes each once acted on
(`finish`) or hands it back (`release`, when it drains first). A claim whose worker died lapses
and the next worker takes the row, as the next owner of a partition reads past its last
committed offset: acting on a request twice is harmless (the run exists, the answer is recorded,
the tag is there), which is what makes that safe.

A run's requests are taken in the order they were inserted: a row is claimed only once no older
row of the same run is left unclaimed, and no start of the run is left at all (claimed is not
enough: until the start is acted on and deleted the run may not exist, and a request acted on
before it, by another worker or after the start's claim lapsed, would be refused for good), so
a start is always acted on before the answer or cancel that follows it. Taken rows are acted on
side by side, as the topic's are, so a cancel is not held up behind a run its worker is still
driving. A full worker takes cancels alone, as a full Kafka worker peeks for them: past what
waits before them, but never past their run's start.

A start is stored with the name of its agent, and a worker claims only the starts of agents it
carries: workers carrying different agents can serve one table, each taking its own agents'
runs (on a topic a partition's requests reach one worker, which ends a start for an agent it
lacks failed at once, so there every worker of a group carries every agent). A start for an
agent no worker carries waits in the table until one does (which sets it aside if it was
signed longer than ``ONWARD_REQUEST_MAX_AGE`` ago, as any request), or until it is cancelled.
Answers and resumes that name their run's agent (an application's do) are routed the same way,
so the worker that takes one can carry the run on; other requests go to any worker. A row stored
for no agent (before migration 0019, or by a sender of then) whose body names one the worker
that took it lacks is stored for that agent and handed back (`PostgresRequests.route`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING

import msgspec

from onward._storage import BACKEND_TIMEOUT_S, PostgresStore, connected
from onward.errors import InvalidInputError, ResumeConflictError
from onward.runtime.leases.base import CancelAsked
from onward.runtime.options import checked_options
from onward.runtime.redaction import Redactor
from onward.runtime.runner import AgentRunner
from onward.runtime.signing import SIGNATURE_HEADER, RequestSigner

from .requests import (
    CancelRun,
    Request,
    StartRun,
    check_request,
    decode_request,
    prepare_requests,
)

if TYPE_CHECKING:
    pass

_log = logging.getLogger("onward.worker")

CLAIM_S = 30.0
"""How long a worker's claim on a request lasts unrenewed: once it lapses (the worker died),
another worker takes the request."""

_INSERT = (
    "INSERT INTO onward_requests (run_id, kind, body, signature, agent) VALUES ($1, $2, $3, $4, $5)"
)
_CLAIM = """
WITH taken AS (
    SELECT r.id FROM onward_requests r
    WHERE (r.claimed_until IS NULL OR r.claimed_until <= now())
      AND ($3 = false OR r.kind = 'cancel')
      AND ($5::text[] IS NULL OR r.agent IS NULL OR r.agent = ANY($5::text[]))
      AND NOT EXISTS (
          SELECT 1 FROM onward_requests o
          WHERE o.run_id = r.run_id AND o.id < r.id
            AND (o.kind = 'start'
                 OR (NOT $3 AND (o.claimed_until IS NULL OR o.claimed_until <= now()))))
    ORDER BY r.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE onward_requests r
SET claimed_by = $1, claimed_until = now() + make_interval(secs => $4::float8)
FROM taken WHERE r.id = taken.id
RETURNING r.id, r.run_id, r.kind, r.body, r.signature, r.agent
"""
_RENEW = (
    "UPDATE onward_requests SET claimed_until = now() + make_interval(secs => $3::float8) "
    "WHERE id = ANY($2::bigint[]) AND claimed_by = $1"
)
_FINISH = "DELETE FROM onward_requests WHERE id = ANY($2::bigint[]) AND claimed_by = $1"
_RELEASE = (
    "UPDATE onward_requests SET claimed_by = NULL, claimed_until = NULL "
    "WHERE id = ANY($2::bigint[]) AND claimed_by = $1"
)
_ROUTE = (
    "UPDATE onward_requests SET agent = $3, claimed_by = NULL, claimed_until = NULL "
    "WHERE id = $2 AND claimed_by = $1 AND agent IS NULL"
)
_WAITING = "SELECT count(*) FROM onward_requests"
_STORED_FOR = "SELECT EXISTS (SELECT 1 FROM onward_requests WHERE run_id = $1)"
_FIRST_START = (
    "SELECT id, body, signature, claimed_by, claimed_until > now() AS claimed "
    "FROM onward_requests WHERE run_id = $1 AND kind = 'start' ORDER BY id LIMIT 1 FOR UPDATE"
)
_DELETE = "DELETE FROM onward_requests WHERE id = $1"
_CHANNEL_BYTES = 64
"""PostgreSQL's NAMEDATALEN: a notification channel is shorter."""


class ClaimedRequest(msgspec.Struct, frozen=True):
    """A request row a worker claimed: its id, run, kind, wire value, signature and the agent
    it was stored for (a start's, or the run's for an answer or resume that names it)."""

    id: int
    run_id: str
    kind: str
    value: bytes
    signature: bytes | None
    agent: str | None = None

    def request(self, carried: Collection[str] | None = None) -> Request:
        """The request the row holds, checked as a worker checks what it is given.

        Args:
            carried: The agents of the worker that claimed it: a row stored for no agent
                (before migration 0019, or by a sender of then) whose body names one of
                them is acted on; ``None`` acts on none such.

        Raises:
            InvalidInputError: Not a request this code knows (`decode_request`), or one whose
                kind, run or agent is not the row's.
        """
        request = decode_request(self.value)
        if type(request).__struct_config__.tag != self.kind:
            raise InvalidInputError(f"stored as {self.kind!r} but holds another request")
        if request.run_id != self.run_id:
            raise InvalidInputError(f"stored for run {self.run_id!r} but names another run")
        # The column is not signed: a row routed to a worker for another agent than its
        # (signed) body names is set aside, not acted on; so is one whose column is empty
        # (any worker takes it) claimed by a worker without the agent (it would end the run
        # failed; a worker routes such a row first: `elsewhere`). One that carries it acts
        # on it: starts stored before the column was.
        named = getattr(request, "agent", None)
        if self.agent is None and named is not None and named not in (carried or ()):
            raise InvalidInputError(f"stored for no agent but names agent {named!r}")
        if self.agent is not None and named != self.agent:
            raise InvalidInputError(f"stored for agent {self.agent!r} but names another agent")
        return request

    def elsewhere(self, carried: Collection[str]) -> str | None:
        """The agent to route a row stored for no agent to (`PostgresRequests.route`): the one
        its body names, when ``carried`` lacks it. A worker without that agent would end a
        start failed, or set the row aside and lose it to a worker that carries the agent."""
        if self.agent is not None:
            return None
        try:
            named = getattr(decode_request(self.value), "agent", None)
        except InvalidInputError:
            return None
        return named if named is not None and named not in carried else None


class PostgresRequests(PostgresStore):
    """The fleet's requests in ``onward_requests``: ``async with PostgresRequests(url) as r``.

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        schema: The schema holding Onward's tables (``ONWARD_DATABASE_SCHEMA``).
        signer: Signs each request (`onward.runtime.signing`); workers set aside requests
            that are unsigned unless they were started to accept them.
        redactor: Masks the values a request carries before it is stored (the default
            `Redactor`; ``Redactor(enabled=False)`` only where the table is trusted).
        timeout_s: The longest a connection attempt or a statement may take.
    """

    what = "PostgreSQL requests table"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        signer: RequestSigner | None = None,
        redactor: Redactor | None = None,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        super().__init__(dsn, schema=schema, max_size=4, timeout_s=timeout_s)
        self.signer = signer
        self._redactor = redactor or Redactor()

    @property
    def channel(self) -> str:
        """The notification channel workers of this schema listen on: named after the schema,
        or after its digest where the name would be too long for a channel (PostgreSQL
        refuses a ``pg_notify`` channel of `_CHANNEL_BYTES` or more)."""
        if not self._schema:
            return "onward_requests"
        channel = f"onward_requests:{self._schema}"
        if len(channel.encode()) < _CHANNEL_BYTES:
            return channel
        return f"onward_requests:{hashlib.sha256(self._schema.encode()).hexdigest()[:32]}"

    # -- the application's side ---------------------------------------------------------------

    async def submit(self, *requests: Request) -> None:
        """Store requests for the workers; durable when this returns."""
        await self.submit_many(requests)

    async def submit_many(self, requests: Sequence[Request]) -> None:
        """Store many requests in one transaction; durable when this returns.

        Raises:
            InvalidInputError: A request a worker would refuse (`check_request`), named with its
                field; nothing was stored.
        """
        prepared = prepare_requests(requests, self._redactor, self.signer)
        if not prepared:
            return
        rows = [
            (p.run_id, p.kind, p.value, p.signature, getattr(r, "agent", None))
            for p, r in zip(prepared, requests, strict=True)
        ]
        async with self._connection("submitting requests", transaction=True) as conn:
            await conn.executemany(_INSERT, rows)
            await conn.execute("SELECT pg_notify($1, '')", self.channel)

    # -- the workers' side --------------------------------------------------------------------

    async def claim(
        self,
        worker: str,
        limit: int,
        *,
        cancels_only: bool = False,
        claim_s: float = CLAIM_S,
        agents: Collection[str] | None = None,
    ) -> list[ClaimedRequest]:
        """Claim up to ``limit`` requests for ``claim_s`` seconds, oldest first: each the oldest
        unclaimed request of its run, with no start of its run still stored before it (with
        ``cancels_only``, cancels alone, past whatever but a start waits before them). With
        ``agents``, only requests stored for one of those agents (starts, and the answers and
        resumes an application sends naming the run's agent) or for none (cancels, tags,
        requests of senders that name no agent)."""
        if limit <= 0:
            return []
        names = None if agents is None else sorted(agents)
        async with self._connection("claiming requests") as conn:
            rows = await conn.fetch(_CLAIM, worker, limit, cancels_only, claim_s, names)
        claimed = [
            ClaimedRequest(
                int(row["id"]),
                row["run_id"],
                row["kind"],
                bytes(row["body"]),
                None if row["signature"] is None else bytes(row["signature"]),
                row["agent"],
            )
            for row in rows
        ]
        claimed.sort(key=lambda r: r.id)
        return claimed

    async def renew(self, worker: str, ids: Collection[int], claim_s: float = CLAIM_S) -> None:
        """Extend ``worker``'s claims on ``ids`` by ``claim_s`` from now."""
        await self._by_ids(_RENEW, "renewing request claims", worker, ids, claim_s)

    async def finish(self, worker: str, ids: Collection[int]) -> None:
        """Delete requests ``worker`` acted on (or set aside)."""
        await self._by_ids(_FINISH, "deleting requests acted on", worker, ids)

    async def release(self, worker: str, ids: Collection[int]) -> None:
        """Hand requests back unacted, for the next worker to take at once."""
        await self._by_ids(_RELEASE, "releasing request claims", worker, ids)

    async def route(self, worker: str, request_id: int, agent: str) -> None:
        """Store ``worker``'s claimed row, stored for no agent, for ``agent`` (the one its
        signed body names) and hand it back: a worker that carries ``agent`` takes it."""
        async with self._connection("routing a request to its agent") as conn:
            await conn.execute(_ROUTE, worker, request_id, agent)

    async def _by_ids(
        self, statement: str, context: str, worker: str, ids: Collection[int], *extra: object
    ) -> None:
        if not ids:
            return
        async with self._connection(context) as conn:
            await conn.execute(statement, worker, list(ids), *extra)

    async def withdraw_start(
        self, run_id: str, *, tenant: str, ended: Callable[[StartRun], Awaitable[object]]
    ) -> bool:
        """Take back the run's start while no worker has taken it (one waiting for a worker
        that carries its agent, say): ``ended(start)`` records the run as the caller wants it
        ended (`AgentRunner.end_at_start`) while the row stays locked, and the row is deleted
        once that returned. A crash between the two leaves the start for a worker, which finds
        the run exists and drops it. False when the run has no start waiting, or none of
        ``tenant``'s whose signature checks (a worker sets such a row aside itself); a start
        however old is taken back, as that only ends its run cancelled.

        Raises:
            ResumeConflictError: A worker has claimed the start and is starting the run now;
                the run exists in a moment, and can then be cancelled as any run.
        """
        async with self._connection("withdrawing a start", transaction=True) as conn:
            row = await conn.fetchrow(_FIRST_START, run_id)
            if row is None:
                return False
            body, signature = bytes(row["body"]), row["signature"]
            headers = [] if signature is None else [(SIGNATURE_HEADER, bytes(signature))]
            if self.signer is not None and self.signer.refusal(
                run_id.encode(), body, headers, check_age=False
            ):
                return False
            try:
                start = decode_request(body)
            except InvalidInputError:
                return False
            if not isinstance(start, StartRun) or (start.run_id, start.tenant) != (run_id, tenant):
                return False
            if row["claimed"]:
                raise ResumeConflictError(
                    f"run {run_id!r} is being started by {row['claimed_by']}; cancel it once it "
                    "has started",
                    run_id=run_id,
                    holder=row["claimed_by"],
                )
            await ended(start)
            await conn.execute(_DELETE, row["id"])
        return True

    async def waiting(self) -> int:
        """Requests stored and not yet acted on (claimed or not)."""
        async with self._connection("counting requests") as conn:
            return int(await conn.fetchval(_WAITING))

    async def stored_for(self, run_id: str) -> bool:
        """Whether a request of the run is still stored (waiting, or being acted on): a worker
        deletes one only once what it wrote of it is durable in the log, or once it set the
        request aside or refused it (nothing of it written)."""
        async with self._connection("looking for a run's requests") as conn:
            return bool(await conn.fetchval(_STORED_FOR, run_id))

    @contextlib.asynccontextmanager
    async def listening(self) -> AsyncIterator[asyncio.Event]:
        """An event set whenever requests are submitted, for as long as the block runs.

        It holds a connection of its own (a pooled one must not ``LISTEN``). If that
        connection is lost the event is set once and a warning logged; a worker then finds
        new requests by polling alone.
        """
        woken = asyncio.Event()

        def notified(*_: object) -> None:
            woken.set()

        def lost(*_: object) -> None:
            _log.warning("the connection listening for requests was lost; finding them by polling")
            woken.set()

        import asyncpg  # noqa: PLC0415  (loaded by `connected`)

        async with connected(self._dsn, schema=self._schema, timeout_s=self._timeout_s) as conn:
            await conn.add_listener(self.channel, notified)
            conn.add_termination_listener(lost)
            try:
                yield woken
            finally:
                conn.remove_termination_listener(lost)
                with contextlib.suppress(asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
                    await conn.remove_listener(self.channel, notified)


async def cancel_waiting_start(
    requests: PostgresRequests, runner: AgentRunner, cancel: CancelRun
) -> bool:
    """Cancel a run whose start still waits in the table (no worker carrying its agent has
    taken it): the start is taken back and the run recorded as ended cancelled by
    ``cancel.by`` (`AgentRunner.end_at_start`); whether there was such a start.

    Raises:
        InvalidInputError: ``by`` or ``why`` out of bounds (`check_request`); nothing done.
        ResumeConflictError: A worker is starting the run this moment; cancel it once started.
    """
    check_request(cancel)

    async def cancelled(start: StartRun) -> None:
        await runner.end_at_start(
            start.agent,
            start.input,
            tenant=start.tenant,
            run_id=start.run_id,
            options=checked_options(start.options),
            status="cancelled",
            error=CancelAsked(cancel.by, cancel.why).error,
        )

    return await requests.withdraw_start(cancel.run_id, tenant=cancel.tenant, ended=cancelled)


__all__ = ["CLAIM_S", "ClaimedRequest", "PostgresRequests", "cancel_waiting_start"]
