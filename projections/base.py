"""The `FrontierStore` protocol, the rows it keeps, and the snapshot cap.

A store keeps, per run, the frontier's encoded payload plus the scalar columns queries need;
per projector, the next log offset of every partition it has folded. Both change in one
transaction (:meth:`FrontierStore.write`), which is what makes a projector exactly-once: after a
crash it resumes from the offsets stored with the rows, and the upsert is guarded by
``through_offset`` so a batch folded twice (an overlap after a rebalance) changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import msgspec

from onward._storage import AsyncResource, Resource
from onward.errors import CheckpointFormatError, InvalidInputError
from onward.eventlog.base import LogRecord

from .frontier import FRONTIER_FORMAT, Frontier, RunStatus, ToolCallRow
from .transcript import TranscriptRow

DEFAULT_CONSUMER = "frontiers"
"""The consumer name the frontier projector stores its positions under."""

DEFAULT_MAX_BYTES = 1024 * 1024
"""Largest frontier payload a store keeps (1 MiB). Larger ones are refused, never trimmed."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Frontier)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A frontier ready to store: its encoded payload, or why there is none.

    Attributes:
        frontier: The folded frontier (its scalar fields are stored even when the payload is not).
        payload: msgspec JSON of the frontier; ``None`` when it was over the cap.
        error: Why the payload was refused; ``None`` when it was stored.
    """

    frontier: Frontier
    payload: bytes | None
    error: str | None

    @classmethod
    def of(cls, frontier: Frontier, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Snapshot:
        """Encode a frontier, refusing it (not trimming it) if it is over ``max_bytes``."""
        payload = _encoder.encode(frontier)
        if len(payload) > max_bytes:
            return cls(
                frontier,
                None,
                f"frontier of {len(payload)} bytes at offset {frontier.through_offset} is over "
                f"the {max_bytes}-byte cap; resume folds this run from the log",
            )
        return cls(frontier, payload, None)


def encode_frontier(frontier: Frontier) -> bytes:
    """A frontier's payload, uncapped (what `Snapshot` stores when it fits)."""
    return _encoder.encode(frontier)


def decode_payload(payload: bytes, *, run_id: str) -> Frontier:
    """Decode a stored frontier payload, refusing one written by a newer Onward.

    Raises:
        CheckpointFormatError: The payload's format is newer than `FRONTIER_FORMAT`: the run
            is left where it is, for a worker on the newer version (exit 4 on the command
            line, as for a newer event; not a schema to migrate).
    """
    frontier = _decoder.decode(payload)
    if frontier.format > FRONTIER_FORMAT:
        raise CheckpointFormatError(
            f"run {run_id!r}: frontier payload format {frontier.format} is newer than this code "
            f"reads ({FRONTIER_FORMAT}); upgrade Onward before reading or resuming this run",
            run_id=run_id,
            field="$.format",
        )
    return frontier


class BuildSwitched(Exception):  # noqa: N818 - a signal to the projector, not an error
    """The store's active build changed under a write; nothing was written.

    The projector seeks every partition to the store's positions (now the new build's) and
    folds on from there.
    """


@dataclass(frozen=True, slots=True)
class StoredFrontier:
    """What a store holds for one run.

    ``frontier`` is ``None`` when the last snapshot was refused for size, or while the run is
    quarantined; then ``summary`` still carries the scalar fields and ``snapshot_error`` or
    ``quarantined`` says why, and a reader folds the run from the log instead.
    """

    summary: RunSummary
    frontier: Frontier | None
    snapshot_error: str | None
    quarantined: str | None = None
    """Why the run is set aside (a record of it cannot be read), until a person releases it
    and the projector folds it again; ``None`` for a readable run. See `QuarantineEntry`.
    While it is set, ``frontier`` is ``None``: the row is not the run's whole story (its
    events after the record were not folded), so a reader folds the run from the log, which
    refuses it while the record cannot be read."""
    set_aside: Frontier | None = None
    """While the run is set aside: its frontier as folded up to the unreadable record, whose
    ``first_offset`` says where a release folds the run again from. Never a resume point."""

    @classmethod
    def of(
        cls,
        summary: RunSummary,
        frontier: Frontier | None,
        snapshot_error: str | None,
        quarantined: str | None,
    ) -> StoredFrontier:
        """What a store returns for a row: no frontier while the run is set aside."""
        if quarantined is None:
            return cls(summary, frontier, snapshot_error)
        return cls(summary, None, snapshot_error, quarantined, frontier)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The scalar columns of a frontier row: what listing and status queries read."""

    tenant: str
    run_id: str
    agent: str
    revision: str
    status: RunStatus
    holder: str | None
    iteration: int
    input_tokens: int
    output_tokens: int
    last_seq: int
    fence: int
    last_boundary: str | None
    resume_seq: int
    waiting_on: str | None
    refused: int
    partition: int
    through_offset: int
    updated_at: int
    user_id: str | None = None

    @classmethod
    def of(cls, f: Frontier) -> RunSummary:
        """The scalar fields of a frontier."""
        return cls(
            tenant=f.tenant,
            run_id=f.run_id,
            agent=f.agent,
            revision=f.revision,
            status=f.status,
            holder=f.holder,
            iteration=f.iteration,
            input_tokens=f.input_tokens,
            output_tokens=f.output_tokens,
            last_seq=f.last_seq,
            fence=f.fence,
            last_boundary=f.last_boundary,
            resume_seq=f.resume_seq,
            waiting_on=f.waiting_on,
            refused=f.refused,
            partition=f.partition,
            through_offset=f.through_offset,
            updated_at=f.updated_at,
            user_id=f.user_id,
        )


QuarantineState = Literal["held", "released", "cleared"]
"""Where a quarantined record stands: ``held`` (its run is set aside), ``released`` (a person
released the run; the projector has not folded it again yet), ``cleared`` (folded again; or,
for an entry that names no run, dismissed by a person: :meth:`FrontierStore.dismiss`)."""


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """A record the projector could not read, and what it did about it. Never the bytes.

    The projector writes one in the same transaction as the positions that move past the
    record, marks the run's frontier row (`StoredFrontier.quarantined`), and folds nothing more
    into that run until a person releases it (:meth:`FrontierStore.release`). The next pass of
    the projector then folds the released run again from its first offset: if the record is
    still unreadable the entry is ``held`` again, once, and waits for the next release.

    Attributes:
        run_id: The run the record was filed under; ``None`` when nothing names one.
        tenant: The tenant the record names, when that much could be read.
        partition: Where the record sits.
        offset: Where the record sits.
        kind: The kind its header or its ``kind`` field names, when readable.
        reason: Why it cannot be read (the decode error: run, seq, field or format).
        state: ``held``, ``released`` or ``cleared``.
        quarantined_at: When it was (last) set aside, microseconds since the epoch.
        released_by: Who released the run last (or dismissed an entry that names no run).
        released_at: When, microseconds since the epoch.
    """

    run_id: str | None
    tenant: str | None
    partition: int
    offset: int
    kind: str | None
    reason: str
    state: QuarantineState = "held"
    quarantined_at: int = 0
    released_by: str | None = None
    released_at: int | None = None

    @property
    def mark(self) -> str:
        """What the run's frontier row says while it is held."""
        return f"record at partition {self.partition} offset {self.offset}: {self.reason}"


def released_mark(by: str) -> str:
    """What a released run's frontier row says until the projector has folded it again."""
    return f"released by {by}; the projector folds the run again on its next pass"


class ProjectionSink(Protocol):
    """What a projector folds into: stored positions, and an atomic fold-and-advance."""

    async def positions(self) -> dict[int, int]:
        """The next offset per partition stored so far."""
        ...

    async def apply(
        self,
        records: Mapping[int, Sequence[LogRecord]],
        next_offsets: Mapping[int, int],
    ) -> None:
        """Fold a batch; its rows and the partitions' next offsets are stored together,
        atomically, now or at a later :meth:`flush`. An unreadable record never stops it.

        Raises:
            BuildSwitched: The sink's active build changed; nothing folded since the last
                store was kept, and the caller seeks to :meth:`positions`.
        """
        ...

    async def flush(self) -> None:
        """Store whatever was folded and not stored yet.

        Raises:
            BuildSwitched: As for :meth:`apply`.
        """
        ...

    def forget(self, partitions: Collection[int]) -> None:
        """Drop anything cached about runs of these partitions (they were revoked)."""
        ...


@runtime_checkable
class FrontierStore(AsyncResource, Protocol):
    """Frontier rows, `tool_calls` rows and projector positions, written together."""

    async def verify(self) -> None:
        """Check the schema is the version this code expects.

        Raises:
            SchemaMismatchError: Tables are missing or of another version; run `onward db migrate`.
        """
        ...

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        """The stored rows of the given runs (runs with no row are absent)."""
        ...

    async def get(self, run_id: str) -> StoredFrontier | None:
        """The stored row of one run."""
        ...

    async def write(
        self,
        consumer: str,
        positions: Mapping[int, int],
        snapshots: Sequence[Snapshot],
        calls: Sequence[ToolCallRow],
        *,
        quarantine: Sequence[QuarantineEntry] = (),
        cleared: Collection[str] = (),
        messages: Sequence[TranscriptRow] = (),
        restarted: Collection[tuple[str, str, int]] = (),
    ) -> None:
        """In one transaction: first delete the call rows of the ``restarted`` runs, given as
        ``(tenant, run_id, last_seq)``, and their transcript rows under that tenant through that
        seq (a run id used again once its run was collected: a fold from before the collection
        stored the old run's rows, which are not the new run's); then upsert rows whose
        ``through_offset`` is newer than the stored one,
        upsert call rows likewise, append the ``messages`` not stored yet (a transcript row
        already stored under its run and seq is kept as it is), and move ``consumer``'s next
        offsets forward (never back).

        With them, also: mark the ``released`` entries of the ``cleared`` runs ``cleared`` and
        clear their rows' marks (the projector folded them again), then store the
        ``quarantine`` entries as ``held`` and mark their runs' existing rows with
        `QuarantineEntry.mark`. One already stored at that position is held again only while
        it is held, or when its run is among the ``cleared`` (a release folded again, the
        record still unreadable): a projector that folded the record before a release and
        stores after it leaves the released or cleared entry, and the run's row, as they are.
        """
        ...

    async def quarantined(
        self,
        consumer: str,
        *,
        run_id: str | None = None,
        states: Collection[QuarantineState] | None = None,
    ) -> list[QuarantineEntry]:
        """A consumer's quarantine entries, optionally of one run and some states, by position."""
        ...

    async def release(self, consumer: str, run_id: str, *, by: str, at: int) -> int:
        """A person releases a run: in one transaction its ``held`` entries become ``released``
        (by ``by``, at ``at`` microseconds) and its frontier row's mark says so
        (:func:`released_mark`). The run stays set aside until the projector's next pass folds
        it again from its first offset (``write(..., cleared=...)`` then clears the mark).
        Returns how many entries it released: 0 when the run has none held.
        """
        ...

    async def dismiss(self, consumer: str, partition: int, offset: int, *, by: str, at: int) -> int:
        """A person dismisses the ``held`` entry at a position that names no run (nothing of
        the record could be read, so no release can name it): it becomes ``cleared``, by
        ``by`` at ``at`` microseconds, and leaves the listing of what is held. An entry that
        names a run is left as it is: its run is released (:meth:`release`), which folds it
        again. Returns 1 when it dismissed the entry, 0 when there is none such held there.
        """
        ...

    async def transcript(self, run_id: str, *, tenant: str, through: int) -> list[TranscriptRow]:
        """The transcript rows of one run with seq at most ``through``, by seq.

        The transcript is one table whatever the build: a rebuild appends the same rows
        (derived from the same counted events) and finds them stored.
        """
        ...

    async def positions(self, consumer: str) -> dict[int, int]:
        """The next offset per partition stored for a consumer."""
        ...

    async def tool_calls(self, run_id: str) -> list[ToolCallRow]:
        """The audit rows of one run's calls, by dispatch order."""
        ...

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
        """Summaries of runs by run id, optionally of one tenant, some statuses, one user and
        one agent, and only those last updated before ``updated_before`` (microseconds since
        the epoch).

        A page at a time: ``after`` keeps the runs whose id sorts after it (the last id of the
        page before: a keyset cursor, so a run written between two pages is neither repeated
        nor skipped for the others), ``limit`` keeps that many at most.
        """
        ...


def check_runs_limit(limit: int | None) -> None:
    """Refuse a negative `FrontierStore.runs` limit: each store took it its own way (SQLite
    listed every run, the memory store all but the last, PostgreSQL failed)."""
    if limit is not None and limit < 0:
        raise InvalidInputError(f"a page's limit is a number of runs, 0 or more; got {limit}")


async def runs_in_pages(
    frontiers: FrontierStore, *, size: int, **wanted: Any
) -> AsyncIterator[list[RunSummary]]:
    """`FrontierStore.runs` matching ``wanted``, ``size`` at most at a time, by run id: a pass
    over very many runs (recovery, pending runs, a GC sweep) holds one page, and since each
    page is read after the last one's id, none is skipped or listed twice as runs change."""
    after: str | None = None
    while True:
        page = await frontiers.runs(**wanted, after=after, limit=size)
        yield page
        if len(page) < size:
            return
        after = page[-1].run_id


class FrontierWrite(NamedTuple):
    """What one :meth:`FrontierStore.write` stores, in one transaction."""

    consumer: str
    positions: Mapping[int, int]
    snapshots: Sequence[Snapshot]
    calls: Sequence[ToolCallRow]
    quarantine: Sequence[QuarantineEntry] = ()
    """Records set aside by this batch, stored ``held``; their runs' rows are marked."""
    cleared: Collection[str] = ()
    """Released runs folded again by this batch: their ``released`` entries become ``cleared``."""
    messages: Sequence[TranscriptRow] = ()
    restarted: Collection[tuple[str, str, int]] = ()
    """``(tenant, run_id, last_seq)`` of the collected runs whose ids began again: the run's call
    rows, and its transcript rows under that tenant through that seq, are deleted first."""


class FrontierStoreBackend(Resource):
    """What the frontier store backends share: :meth:`write` hands its arguments to
    :meth:`_write` as one `FrontierWrite`, and :meth:`get` is a :meth:`load` of one run.
    """

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        raise NotImplementedError

    async def get(self, run_id: str) -> StoredFrontier | None:
        return (await self.load([run_id])).get(run_id)

    async def write(
        self,
        consumer: str,
        positions: Mapping[int, int],
        snapshots: Sequence[Snapshot],
        calls: Sequence[ToolCallRow],
        *,
        quarantine: Sequence[QuarantineEntry] = (),
        cleared: Collection[str] = (),
        messages: Sequence[TranscriptRow] = (),
        restarted: Collection[tuple[str, str, int]] = (),
    ) -> None:
        await self._write(
            FrontierWrite(
                consumer, positions, snapshots, calls, quarantine, cleared, messages, restarted
            )
        )

    async def _write(self, batch: FrontierWrite) -> None:
        raise NotImplementedError
