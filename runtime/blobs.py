"""Bodies stored out of line: the claim check for events too large for one log record.

An event whose body (a tool result, a model message, a run's input or output) is larger than
``threshold`` goes to the log with the body replaced by ``{"$blob": <sha256>, "size": n}``; the
body itself is stored once, content-addressed, in a `BlobStore` (PostgreSQL, SQLite, memory).
Readers put it back, checked against its digest. A reference that no longer resolves, or to
bytes that are not the body of its digest, raises `HistoryUnavailableError`: the run stops
rather than carry on with a hole in its conversation, or with a body it was never given.

Only the claim check makes references. A body that merely has their shape (a run input naming
another tenant's digest, a tool result from an API that answers ``{"$blob": ..., "size": ...}``)
is written wrapped (`escape_bodies`) and read back as the value it was: it is never fetched from
the blob store, which is shared by every tenant and keyed by content alone.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import msgspec

from onward._storage import BACKEND_TIMEOUT_S, PostgresStore, Resource, SqliteStore
from onward.errors import HistoryUnavailableError
from onward.eventlog.events import (
    ApprovalRequested,
    Event,
    ModelAnswered,
    RunFinished,
    RunStarted,
    ToolCall,
    ToolCompleted,
    ToolResolved,
)
from onward.eventlog.references import BLOB_REF, escaped, is_reference, unescaped

DEFAULT_THRESHOLD = 256 * 1024
_REF = BLOB_REF


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed bodies."""

    async def put(self, body: bytes) -> str:
        """Store a body (idempotently) and return its digest.

        Other bytes stored under its digest (altered or corrupted in the store) are replaced:
        kept, they would leave every reference to the body unreadable for ever, the one about
        to be written included.
        """
        ...

    async def get(self, digest: str) -> bytes:
        """The body with that digest.

        Raises:
            HistoryUnavailableError: Nothing is stored under it.
        """
        ...

    async def close(self) -> None: ...


def digest_of(body: bytes) -> str:
    """The address of a body."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _missing(digest: str) -> HistoryUnavailableError:
    return HistoryUnavailableError(
        f"body {digest} is not in the blob store: the run's history has a hole and it will not "
        "go on without it; restore the blob store or settle the run by hand"
    )


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _check_digest(digest: str) -> None:
    """Refuse, as missing, a reference whose digest is none `digest_of` makes: a record
    another writer made (or one damaged) may hold any JSON there, and a store's driver would
    fail on it with an error about a type or a character, not about the hole in the run.

    Raises:
        HistoryUnavailableError: ``digest`` is not a digest.
    """
    if not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
        raise _missing(digest)


class MemoryBlobStore(Resource):
    """Blobs in a dict, for unit tests."""

    def __init__(self) -> None:
        self._bodies: dict[str, bytes] = {}

    async def put(self, body: bytes) -> str:
        digest = digest_of(body)
        self._bodies[digest] = bytes(body)
        return digest

    async def get(self, digest: str) -> bytes:
        _check_digest(digest)
        try:
            return self._bodies[digest]
        except KeyError:
            raise _missing(digest) from None

    def forget(self, digest: str) -> None:
        """Drop a body, as an over-eager cleanup would."""
        self._bodies.pop(digest, None)


class SqliteBlobStore(SqliteStore):
    """Blobs in the embedded SQLite file.

    Args:
        path: The database file; created if missing.
        migrate: Apply the SQLite migrations when opened; with ``False`` the file must already
            be migrated.
    """

    what = "blob store"

    async def put(self, body: bytes) -> str:
        """`BlobStore.put`: bytes that are not the body under its digest are replaced."""
        digest = digest_of(body)
        conn = self._db.connection()

        def write() -> None:
            conn.execute(
                "INSERT INTO onward_blobs (digest, body) VALUES (?, ?) ON CONFLICT(digest) "
                "DO UPDATE SET body = excluded.body WHERE onward_blobs.body IS NOT excluded.body",
                (digest, body),
            )

        await self._db.write(write, "storing a blob")
        return digest

    async def get(self, digest: str) -> bytes:
        _check_digest(digest)

        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(
                "SELECT body FROM onward_blobs WHERE digest = ?", (digest,)
            ).fetchone()
            return bytes(row[0]) if row else None

        body = await self._db.read(read, "reading a blob")
        if body is None:
            raise _missing(digest)
        return body


class PostgresBlobStore(PostgresStore):
    """Blobs in PostgreSQL (``onward_blobs``).

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        schema: The PostgreSQL schema (search path) holding Onward's tables.
        min_size: Smallest pool size.
        max_size: Largest pool size.
        timeout_s: The longest one call may wait for PostgreSQL (`PostgresStore`).
    """

    what = "PostgreSQL blob store"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 4,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        super().__init__(
            dsn, schema=schema, min_size=min_size, max_size=max_size, timeout_s=timeout_s
        )

    async def put(self, body: bytes) -> str:
        """`BlobStore.put`: bytes that are not the body under its digest are replaced."""
        digest = digest_of(body)
        async with self._connection("storing a blob") as conn:
            await conn.execute(
                "INSERT INTO onward_blobs (digest, body) VALUES ($1, $2) ON CONFLICT (digest) "
                "DO UPDATE SET body = EXCLUDED.body "
                "WHERE onward_blobs.body IS DISTINCT FROM EXCLUDED.body",
                digest,
                body,
            )
        return digest

    async def get(self, digest: str) -> bytes:
        _check_digest(digest)
        async with self._connection("reading a blob") as conn:
            body = await conn.fetchval("SELECT body FROM onward_blobs WHERE digest = $1", digest)
        if body is None:
            raise _missing(digest)
        return bytes(body)


# The one field per kind that can be large enough to need a claim check.
_BODY_FIELDS: dict[type[Event], str] = {
    RunStarted: "input",
    ModelAnswered: "message",
    ToolCompleted: "result",
    ToolResolved: "result",
    ApprovalRequested: "details",
    RunFinished: "output",
}


class ClaimCheck:
    """Moves large bodies out of events before they are appended, and back when read."""

    def __init__(self, blobs: BlobStore, *, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.blobs = blobs
        self.threshold = threshold

    async def shrink(self, event: Event) -> Event:
        """The event with its body replaced by a reference, if the body is over the threshold.

        A model answer's framework ``response`` is a second body, moved out on its own.
        """
        if isinstance(event, ModelAnswered) and event.response is not None:
            response = msgspec.json.encode(event.response)
            if len(response) > self.threshold:
                moved = {_REF: await self.blobs.put(response), "size": len(response)}
                event = msgspec.structs.replace(event, response=moved)
        if isinstance(event, ModelAnswered) and event.tool_calls:
            event = await self._shrink_arguments(event)
        name = _BODY_FIELDS.get(type(event))
        if name is None:
            return event
        value = getattr(event, name)
        body = msgspec.json.encode(value)
        if len(body) <= self.threshold:
            return event
        digest = await self.blobs.put(body)
        reference: Any = {_REF: digest, "size": len(body)}
        if isinstance(event, ModelAnswered):
            reference = msgspec.structs.replace(event.message, content=[reference])
        return msgspec.structs.replace(event, **{name: reference})

    async def _shrink_arguments(self, event: ModelAnswered) -> ModelAnswered:
        """A model answer whose tool calls' arguments are, together, over the threshold (a
        large file to write, say) with each call's arguments moved out on their own: the
        calls' ids, tools and keys stay in line, for the frontier and resume to go by."""
        if len(msgspec.json.encode(event.tool_calls)) <= self.threshold:
            return event
        calls: list[ToolCall] = []
        for call in event.tool_calls:
            args = msgspec.json.encode(call.args)
            if call.args:
                moved = {_REF: await self.blobs.put(args), "size": len(args)}
                calls.append(msgspec.structs.replace(call, args=moved))
            else:
                calls.append(call)
        return msgspec.structs.replace(event, tool_calls=calls)

    async def arguments(self, args: dict[str, Any], *, run_id: str, seq: int) -> dict[str, Any]:
        """A call's arguments as the model gave them, from their reference if they were moved
        out of line (`shrink`), unwrapped if they only looked like one.

        Raises:
            HistoryUnavailableError: The arguments are not in the blob store.
        """
        if is_reference(args):
            # Moved out as written: a look-alike wrapped (`escape_bodies` runs before `shrink`).
            body = await self.body(args[_REF], run_id=run_id, seq=seq)
            args = msgspec.json.decode(body, type=dict[str, Any])
        return unescaped(args)  # type: ignore[no-any-return]

    async def restore(self, event: Event) -> Event:
        """The event with a referenced body put back (and a wrapped one unwrapped)."""
        name = _BODY_FIELDS.get(type(event))
        if name is None:
            return event
        value = getattr(event, name)
        if isinstance(event, ModelAnswered):
            if any(is_reference(c.args) for c in event.tool_calls):
                calls = [
                    msgspec.structs.replace(c, args=await self._get_arguments(c.args, event))
                    if is_reference(c.args)
                    else c
                    for c in event.tool_calls
                ]
                event = msgspec.structs.replace(event, tool_calls=calls)
            if is_reference(event.response):
                body = await self._get(event.response[_REF], event)
                event = msgspec.structs.replace(event, response=msgspec.json.decode(body))
            content = event.message.content
            if isinstance(content, list) and len(content) == 1 and is_reference(content[0]):
                message = msgspec.json.decode(await self._get(content[0][_REF], event))
                event = msgspec.structs.replace(
                    event, message=msgspec.convert(message, type(event.message))
                )
        elif is_reference(value):
            event = msgspec.structs.replace(
                event, **{name: msgspec.json.decode(await self._get(value[_REF], event))}
            )
        return unescape_bodies(event)

    async def _get_arguments(self, args: dict[str, Any], event: Event) -> dict[str, Any]:
        body = await self._get(args[_REF], event)
        return msgspec.json.decode(body, type=dict[str, Any])

    async def _get(self, digest: str, event: Event) -> bytes:
        return await self.body(digest, run_id=event.run_id, seq=event.seq)

    async def body(self, digest: str, *, run_id: str, seq: int) -> bytes:
        """The body a reference of event ``seq`` of a run points at, checked against its
        digest: bytes altered in the store would otherwise be given as the run's history.

        Raises:
            HistoryUnavailableError: Nothing is stored under it, or what is stored is not the
                body of that digest (naming the run and the seq).
        """
        try:
            body = await self.blobs.get(digest)
        except HistoryUnavailableError as exc:
            raise HistoryUnavailableError(
                f"run {run_id!r} seq {seq}: {exc}", run_id=run_id
            ) from exc
        if digest_of(body) != digest:
            raise HistoryUnavailableError(
                f"run {run_id!r} seq {seq}: body {digest} in the blob store is not the body of "
                "that digest (it was altered or corrupted there): the run will not go on with "
                "it; restore the blob store or settle the run by hand",
                run_id=run_id,
            )
        return body


class EndedRun(Protocol):
    """What `output_of` reads of a run's frontier row (a `Frontier`, kept a protocol here:
    blobs stand on the event log and storage, not on projections)."""

    @property
    def run_id(self) -> str: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def output(self) -> Any: ...

    @property
    def finished_seq(self) -> int: ...


def _finished_seq(frontier: EndedRun) -> int:
    """The seq of the event the output came with: the run's end, which a tag may follow; the
    run's last seq for a row stored before its end's seq was kept."""
    return frontier.finished_seq or frontier.last_seq


async def output_of(frontier: EndedRun, claim_check: ClaimCheck | None) -> Any:
    """The output a run ended with. Its frontier row keeps it as the log holds it
    (`RunFinished`): a reference when the claim check moved it out of line, put back here from
    the blob store; and wrapped when it only looked like one, in line or out of line, unwrapped
    here, never fetched.

    Raises:
        HistoryUnavailableError: It is out of line and not in the blob store, or there is no
            blob store to read it from.
    """
    output = frontier.output
    if not is_reference(output):
        return unescaped(output)
    run_id = frontier.run_id
    if claim_check is None:
        raise HistoryUnavailableError(
            f"run {run_id!r}: its output is in a blob store ({output[_REF]}) and this runner "
            "has none; configure blobs=",
            run_id=run_id,
        )
    # Moved out as written: a look-alike wrapped (`escape_bodies` runs first), as `restore` reads.
    return unescaped(
        msgspec.json.decode(
            await claim_check.body(output[_REF], run_id=run_id, seq=_finished_seq(frontier))
        )
    )


def _with_bodies(event: Event, change: Callable[[Any], Any]) -> Event:
    """The event with ``change`` applied to each body a reference could stand in for: the
    body field, and of a model answer its framework response, its one content part and each
    tool call's arguments."""
    if isinstance(event, ModelAnswered):
        calls = [
            c if (args := change(c.args)) is c.args else msgspec.structs.replace(c, args=args)
            for c in event.tool_calls
        ]
        if any(new is not old for new, old in zip(calls, event.tool_calls, strict=True)):
            event = msgspec.structs.replace(event, tool_calls=calls)
        if event.response is not None and (response := change(event.response)) is not (
            event.response
        ):
            event = msgspec.structs.replace(event, response=response)
        content = event.message.content
        if isinstance(content, list) and len(content) == 1:
            part = change(content[0])
            if part is not content[0]:
                message = msgspec.structs.replace(event.message, content=[part])
                event = msgspec.structs.replace(event, message=message)
        return event
    name = _BODY_FIELDS.get(type(event))
    if name is None:
        return event
    value = getattr(event, name)
    changed = change(value)
    return event if changed is value else msgspec.structs.replace(event, **{name: changed})


def escape_bodies(event: Event) -> Event:
    """The event with every body shaped like a reference wrapped, before it is written (and
    before the claim check makes the real references); the very same event if none is."""
    return _with_bodies(event, escaped)


def unescape_bodies(event: Event) -> Event:
    """The event with the wrapping of `escape_bodies` taken off, as it was given."""
    return _with_bodies(event, unescaped)
