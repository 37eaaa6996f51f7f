"""`Worker`: one member of a fleet that carries runs on with no one watching.

Routing: with Kafka, workers form a consumer group on the requests topic
(`onward.runtime.fleet.requests`), partitioned like the event log, so the worker that owns
requests partition p owns the runs of event-log partition p. Ownership only routes work: every
write is made under the run's lease (how each request is acted on:
:mod:`onward.runtime.fleet.requests_handling`).

Recovery (:mod:`onward.runtime.fleet.recovery`): when partitions are assigned and every
``recheck_s`` after, the worker carries on the runs of its partitions whose lease lapsed, and
every ``recheck_s`` those of any partition that were quiet for a lease ttl (a dead worker's
runs move once their leases lapse, not once its partitions do), with bounded attempts; a run
whose plan is not safe is left for a person.

Backpressure: at most ``max_runs`` runs in flight; while full, the worker pauses its partitions,
reading ahead only for cancels (`Worker._cancels_while_full`). Request offsets are committed only
once the request was acted on, so a worker killed mid-request leaves it to the next owner.

Cancelling (`CancelRun`): the run's tasks here stop at their next boundary, as when draining,
and the run is then ended ``cancelled`` under its lease (`RequestHandler`).

Draining: `drain` stops taking requests and makes every run in flight stop at its next boundary
(before its next model call); their leases are released, so the next owner of the partition
carries them on. `stop_now` cancels what is still in flight (a call cut off mid-way is
indeterminate for the next owner, never repeated).

Toolsets (``Agent.toolsets``, MCP servers): each run is driven with a view of them for that run
(`onward.runtime.toolsets`), given its run id, tenant and the deployment's settings, so with
``REDIS_URL`` set a resume builds its tools from the schemas cached for the run and lists no
server (warm restart). The toolsets' connections are shared by the runs and closed once drained.

PostgreSQL workers (`serve_postgres`) take requests from the ``onward_requests`` table
(`onward.runtime.fleet.requests_postgres`) instead of a topic: each owns every partition, claims
requests for a while and deletes each once acted on, so a worker killed mid-request leaves it to
the next worker once its claim lapses; while full it claims cancels alone.

Embedded (SQLite) workers have no requests: each owns every partition and only carries on runs
(`serve_embedded`); start runs with `AgentRunner.run` or `Worker.handle`. Several workers on one
file share its lease table, which decides who carries a run on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import logging
import math
import time
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from onward._storage import translate
from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    OnwardError,
)
from onward.eventlog.events import Event, RunStarted
from onward.projections.audit import printable
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends
from onward.runtime.leases.base import LeasePolicy
from onward.runtime.limits import NEEDS_PERSON
from onward.runtime.manager import needs_person
from onward.runtime.providers import Provider
from onward.runtime.signing import SIGNATURE_HEADER, RequestSigner
from onward.runtime.toolsets import agent_for_run, close_toolsets

from .member import WorkerStats
from .recovery import Recovery, attempts_since_progress, described, one_line
from .requests import (
    DEFAULT_REQUESTS_TOPIC,
    CancelRun,
    Request,
    StartRun,
    decode_request,
    ensure_requests_topic,
)
from .requests_handling import RequestHandler
from .requests_postgres import CLAIM_S, ClaimedRequest, PostgresRequests

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from onward._storage import KafkaConnection

_log = logging.getLogger("onward.worker")

_REFUSALS_KEPT = 1024
"""Refused starts remembered for the streams that wait on them (oldest forgotten first)."""

DEFAULT_GROUP = "onward-workers"
_LEAVE_S = 10.0
"""The longest a commit of offsets, or leaving the group, is waited for: the client itself waits
for the group's coordinator for as long as the broker is away."""
_PEEK_S = 1.0
"""How often a full worker reads ahead for cancels (`Worker._cancels_while_full`)."""
_PEEK_RECORDS = 500


_driving: contextvars.ContextVar[str | None] = contextvars.ContextVar("driving", default=None)
"""The run the current task of a worker acts on (set by `Worker.launch`)."""
_driving_now: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "driving_now", default=None
)
"""The run of its chain the current task drives now (`Worker.for_run`): it may have been
carried on into another than the one it acts on."""


class _Stopped(Exception):  # noqa: N818 - a signal between the observer and the worker
    """The worker is draining, or the run is being cancelled: the run stops at this boundary
    and its lease is released."""


class _Boundaries:
    """The runner's observer: stops runs before their next model call once draining."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    async def appended(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, RunStarted):
                self._worker._started((event.run_id, event.tenant, event.agent))
        for listener in self._worker.append_listeners:
            listener(events)

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        worker = self._worker
        if worker.stopping(_driving.get()) or worker.stopping(_driving_now.get()):
            raise _Stopped


class Worker:
    """Carries runs on for one fleet member; see the module docstring for the whole story.

    Args:
        backends: The deployment's stores (`open_backends`).
        provider: The model.
        agents: The agents this worker runs, by name: the name their runs record (an agent
            given under another name than its `Agent.name`, as ``--agent b=module:attr`` does,
            runs under the name given).
        name: This worker's name in leases and `RunClaimed`; default host and process.
        max_runs: Most runs in flight at once; beyond, partitions are paused.
        max_attempts: Claims without progress before a run ends ``failed``.
        backoff_s: Wait before a retry, doubled per attempt.
        lease_policy: The runs' lease ttl; a dead worker's runs move once it lapses.
        recheck_s: How often owned partitions are looked at again for lapsed runs.
    """

    def __init__(
        self,
        backends: Backends,
        provider: Provider,
        agents: Mapping[str, Agent],
        *,
        name: str | None = None,
        max_runs: int = 16,
        max_attempts: int = 3,
        backoff_s: float = 1.0,
        lease_policy: LeasePolicy | None = None,
        recheck_s: float = 5.0,
    ) -> None:
        if max_runs < 1 or max_attempts < 1:
            raise InvalidInputError("max_runs and max_attempts must be at least 1")
        # A zero or negative recheck would rescan every owned partition back to back, without
        # a pause, for as long as the worker serves; NaN would never wait at all either.
        if not math.isfinite(recheck_s) or recheck_s <= 0:
            raise InvalidInputError(
                f"recheck_s must be a positive number of seconds, got {recheck_s}"
            )
        if not math.isfinite(backoff_s) or backoff_s < 0:
            raise InvalidInputError(f"backoff_s must be 0 or more seconds, got {backoff_s}")
        self.backends = backends
        # A run records its agent's `Agent.name`, and recovery, answers and the requests table
        # find the run's agent by it: under another key, the run would find no agent here.
        self.agents = {
            key: agent if agent.name == key else dataclasses.replace(agent, name=key)
            for key, agent in agents.items()
        }
        self.max_runs = max_runs
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.recheck_s = recheck_s
        self.runner = backends.runner(
            provider, worker=name, observer=_Boundaries(self), lease_policy=lease_policy
        )
        for agent in self.agents.values():
            self.runner.check_call_bounds(agent)  # refused at start, not on every run
        self.name = self.runner.worker
        self.stats = WorkerStats()
        self._refused_starts: dict[tuple[str, str], str] = {}
        """Why a start was refused for good, by run id and tenant (`refused_start`): another
        tenant's start of the id neither clears nor replaces it."""
        self._signer: RequestSigner | None = None
        self._accept_unsigned = False
        self.owned: set[int] = set()
        self.joined = False
        """In its consumer group with an assignment (possibly empty); not while rebalancing."""
        self._runs: dict[str, asyncio.Task[bool]] = {}
        self._draining = asyncio.Event()
        self._stop_asked: Counter[str] = Counter()
        self._stoppers: set[asyncio.Task[Any]] = set()
        self._slot = asyncio.Event()
        self._scans: set[asyncio.Task[None]] = set()
        self._pass: asyncio.Task[None] | None = None
        """The last recovery pass started (`_scan`)."""
        self._starting: dict[_StartKey, _Once] = {}
        """Starts not begun yet, by run id, tenant and agent: another tenant's start of the same
        id, or its tenant's for another agent, is not begun by the `RunStarted` of the one that
        took the id."""
        self._recovery = Recovery(self)
        self._requests = RequestHandler(self, self._recovery)
        self.append_listeners: list[Callable[[Sequence[Event]], None]] = []
        """Called with each batch this worker's runs append, once it is durable (and, where the
        worker folds its appends, folded if the row must show it at once: `shown_at_once`): an
        application in process wakes the streams of that run with it."""

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def stopping(self, run_id: str | None) -> bool:
        """Whether the run's tasks here stop at their next boundary: the worker is draining, or
        the run is being cancelled (`stopping_run`)."""
        return self.draining or (run_id is not None and run_id in self._stop_asked)

    @contextlib.asynccontextmanager
    async def stopping_run(self, run_id: str) -> AsyncIterator[None]:
        """While inside, the run's other tasks here stop at their next boundary (their leases
        released, as when draining) and recovery leaves the run alone: a cancel is written."""
        me = asyncio.current_task()
        stoppers = {me} if me is not None else set()
        self._stop_asked[run_id] += 1
        self._stoppers |= stoppers
        try:
            yield
        finally:
            self._stoppers -= stoppers
            self._stop_asked[run_id] -= 1
            if not self._stop_asked[run_id]:
                del self._stop_asked[run_id]

    async def others_stopped(self, run_id: str) -> None:
        """Until no task of this worker acts on the run but those stopping it (the caller's
        own, and a second cancel of the same run, which would otherwise wait on each other)."""
        name = f"run {run_id}"
        while others := [
            t for t in self._runs.values() if t.get_name() == name and t not in self._stoppers
        ]:
            await asyncio.wait(others)

    @property
    def in_flight(self) -> int:
        return len(self._runs)

    @property
    def free(self) -> int:
        """Runs that may still be started before the worker is full."""
        return 0 if self.draining else self.max_runs - len(self._runs)

    # -- acting on requests ------------------------------------------------------------------

    def submit(
        self,
        request: Request,
        done: Callable[[bool], None] | None = None,
        *,
        expired: Callable[[], bool] | None = None,
    ) -> None:
        """Act on a request in the background; ``done(acted)`` says whether it was acted on
        (False: left for the next owner, e.g. deferred when the worker began to drain). A start
        is acted on once its `RunStarted` is durable: from then on the run is recovery's.
        ``expired`` checks the request's age again before each retry (`handle`).
        """
        once = _Once(done)
        if isinstance(request, StartRun):
            key = once.key = _start_key(request)
            self._starting[key] = once
            # A start sent again (the run's id tried once more) is told by its own outcome,
            # not by the refusal of the one before.
            self._refused_starts.pop((request.run_id, request.tenant), None)
        self.launch(request.run_id, functools.partial(self.handle, request, expired=expired), once)

    def _started(self, key: _StartKey) -> None:
        once = self._starting.pop(key, None)
        if once is not None:
            once(True)

    async def handle(self, request: Request, *, expired: Callable[[], bool] | None = None) -> bool:
        """Act on one request; True once acted on (or refused for good), False to leave it.

        A store that does not answer is no refusal: the request is tried again after a backoff
        (doubled, at most 8 times `backoff_s`) until it is acted on or the worker drains. Before
        each retry, and each ask again while another holds its run (`RequestHandler.act`),
        ``expired`` (said so and counted when True) checks its age again: an outage or a wait
        longer than ONWARD_REQUEST_MAX_AGE has its sender told to send it again, and acting on
        it too would do the work twice. A start whose run began is carried on whatever its age.
        """
        # A start handed here directly, not through `submit`, is told begun by its `RunStarted`
        # (`_started`) as a submitted one is: its refusal is said as such only until then.
        own: tuple[_StartKey, _Once] | None = None
        if isinstance(request, StartRun) and _start_key(request) not in self._starting:
            own = (_start_key(request), _Once(None))
            self._starting[own[0]] = own[1]
        try:
            return await self._handle(request, expired)
        finally:
            if own is not None and self._starting.get(own[0]) is own[1]:
                del self._starting[own[0]]

    async def _handle(self, request: Request, expired: Callable[[], bool] | None) -> bool:
        attempt = 0
        too_old = None if expired is None else lambda: self._not_begun(request) and expired()
        while True:
            if attempt and too_old is not None and too_old():
                return True  # set aside: its sender was told to send it again
            try:
                return await self._requests.act(request, expired=too_old)
            except BackendUnavailableError as exc:
                wait = self.backoff_s * min(2**attempt, 8)
                attempt += 1
                _log.warning(
                    "%s of run %s not acted on yet: %s; trying again in %.1fs",
                    type(request).__name__,
                    printable(request.run_id),
                    one_line(str(exc)),
                    wait,
                )
                if not await self.sleep(wait):
                    return False  # left for the next owner
            except _Stopped:
                self.stats.stopped += 1
                return True  # the run exists and its lease is released: recovery carries it on
            except OnwardError as exc:
                return self._refused(request, exc)

    def _not_begun(self, request: Request) -> bool:
        """Whether nothing of the request took effect that setting it aside would leave
        half-done: a start whose `RunStarted` is durable is its run's (`_started`)."""
        return not isinstance(request, StartRun) or _start_key(request) in self._starting

    def _refused(self, request: Request, exc: OnwardError) -> bool:
        self.stats.failures += 1
        # Only a start nothing of which is in the log is refused: one whose `RunStarted` is
        # durable failed after, and its run is recovery's (its streams follow it on). Its log
        # line must not say "refused for good", the words a waiting stream points readers to.
        if isinstance(request, StartRun) and not self._not_begun(request):
            _log.warning(
                "run %s: began, then failed: %s; it is carried on as a lapsed run",
                printable(request.run_id),
                one_line(str(exc)),
            )
            return True
        _log.warning("%s refused for good: %s", type(request).__name__, one_line(str(exc)))
        if isinstance(request, StartRun):
            self._refused_starts[(request.run_id, request.tenant)] = described(exc)
            while len(self._refused_starts) > _REFUSALS_KEPT:
                del self._refused_starts[next(iter(self._refused_starts))]
        return True

    def refused_start(self, run_id: str, *, tenant: str) -> str | None:
        """Why this worker refused ``tenant``'s start of ``run_id`` for good, if it did: for
        the application's streams of it (each of them: one run may have several), which would
        otherwise wait for a run that never comes. Kept until that tenant's next start of it.
        The tenant is required: a start refused because another tenant's run has the id is
        neither that run's streams' to end with nor its tenant's to read."""
        return self._refused_starts.get((run_id, tenant))

    async def recover(self, partitions: Collection[int], *, adopt: bool = False) -> int:
        """Carry on the lapsed runs of ``partitions`` (as many as there are free slots) and,
        with ``adopt``, the quiet lapsed runs of every other partition.

        Returns how many were launched; the rest are looked at again on the next pass.
        """
        return await self._recovery.recover(partitions, adopt=adopt)

    @property
    def owes_lapsed_runs(self) -> bool:
        """The last look found lapsed runs it had no slot for; they go before new requests."""
        return self._recovery.owed

    async def launch_lapsed(self) -> int:
        """Give free slots to the lapsed runs the last look found; how many were launched."""
        return await self._recovery.launch_lapsed()

    def for_run(self, agent: Agent, run_id: str, tenant: str) -> AbstractAsyncContextManager[Agent]:
        """``agent`` with its toolsets' tools for ``run_id`` (`agent_for_run`), using the
        schema cache the deployment's settings name. While inside, the task drives ``run_id``
        too: a task carried on into another run of its chain stops at its next boundary for a
        cancel of the run it goes on as, as for one of the run it was launched for."""
        return _driven(
            run_id, agent_for_run(agent, run_id, tenant=tenant, settings=self.backends.settings)
        )

    # -- tasks, slots and draining -----------------------------------------------------------

    def carrying(self, run_id: str) -> bool:
        """Whether a task of this worker is acting on the run now: any of them, not only the
        one keyed by the run's id (a second task's key is its own, and outlives the first)."""
        if run_id in self._runs:
            return True
        name = f"run {run_id}"
        return any(task.get_name() == name for task in self._runs.values())

    def launch(
        self,
        run_id: str,
        work: Callable[[], Awaitable[bool]],
        done: Callable[[bool], None] | None = None,
    ) -> None:
        """Run ``work()`` in a slot; ``done(acted)`` is told whether it was acted on. The call
        is made in the task, so a task cancelled before it ran (`stop_now` right after) leaves
        no coroutine never awaited."""

        async def guarded() -> bool:
            _driving.set(run_id)
            try:
                return await work()
            except _Stopped:
                self.stats.stopped += 1
                return True
            except OnwardError as exc:
                self.stats.failures += 1
                _log.warning("run %s: %s", printable(run_id), one_line(str(exc)))
                return True

        task = asyncio.create_task(guarded(), name=f"run {run_id}")
        key = run_id if run_id not in self._runs else f"{run_id}#{id(task)}"
        self._runs[key] = task
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, len(self._runs))

        def finished(t: asyncio.Task[bool]) -> None:
            self._runs.pop(key, None)
            start = done.key if isinstance(done, _Once) else None
            if start is not None and self._starting.get(start) is done:
                del self._starting[start]
            self._slot.set()
            # Cancelled (a second SIGTERM): left for the next owner. An unexpected error is
            # logged; the run, if it exists, is a recovery candidate like any other.
            acted = not t.cancelled()
            error = t.exception() if acted else None
            if error is not None:
                # Its type and a masked line of its message: a repr would print the values
                # the error holds (a tool's arguments, a run's input) into the worker's log.
                _log.error("run %s: %s", printable(run_id), described(error))
            elif acted:
                acted = t.result()
            if done is not None:
                done(acted)

        task.add_done_callback(finished)

    def count(self, status: str) -> None:
        """Count a run's status after this worker drove it."""
        if status in ("completed", "failed", "cancelled", "continued"):
            self.stats.finished += 1
        self.stats.statuses[status] = self.stats.statuses.get(status, 0) + 1

    async def sleep(self, seconds: float) -> bool:
        """Sleep, unless the worker starts draining first (then False)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._draining.wait(), seconds)
        return not self.draining

    async def wait_for_slot(self, seconds: float) -> None:
        """Until a run finishes or ``seconds`` pass."""
        self._slot.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._slot.wait(), seconds)

    def drain(self) -> None:
        """Take nothing new; runs in flight stop at their next boundary."""
        self._draining.set()

    def stop_now(self) -> None:
        """Cancel whatever is still in flight (a second SIGTERM)."""
        self._draining.set()
        for task in list(self._runs.values()):
            task.cancel()

    async def drained(self) -> None:
        """Until no run is in flight; then the agents' toolsets close their connections."""
        while self._runs:
            await asyncio.gather(*self._runs.values(), return_exceptions=True)
        for scan in list(self._scans):
            scan.cancel()
        await close_toolsets(self.agents.values())

    def _scan(self, partitions: Collection[int], *, adopt: bool = False) -> None:
        """Look for lapsed runs in the background (`Recovery.recover`)."""
        self._pass = self._in_background(
            functools.partial(self._recovery.recover, partitions, adopt=adopt),
            "looking for runs to carry on",
        )

    def _recheck(self, partitions: Collection[int], *, adopt: bool = False) -> None:
        """`_scan` every ``recheck_s``, unless the last pass is still going: a pass slower
        than that (a slow store, very many runs) would be joined by another listing the same
        runs and checking their leases again, and then by more."""
        if self._pass is None or self._pass.done():
            self._scan(partitions, adopt=adopt)

    def _launch_lapsed(self) -> None:
        """Give free slots to lapsed runs the last look found, in the background."""
        self._in_background(self.launch_lapsed, "carrying on lapsed runs")

    def _in_background(self, work: Callable[[], Awaitable[int]], what: str) -> asyncio.Task[None]:
        """Run ``work()`` in a task; the call is made in the task, so a task cancelled before
        it ran (stop right after a pass was started) leaves no coroutine never awaited."""

        async def guarded() -> None:
            try:
                await work()
            except OnwardError as exc:
                _log.warning("%s failed: %s", what, one_line(str(exc)))

        task = asyncio.create_task(guarded())
        self._scans.add(task)
        task.add_done_callback(self._scans.discard)
        return task

    # -- serving -----------------------------------------------------------------------------

    async def serve_embedded(self, stop: asyncio.Event) -> None:
        """Carry on lapsed runs of every partition until ``stop``, then drain."""
        self.owned = set(range(self.backends.log.partitions))
        while not stop.is_set():
            self._recheck(self.owned)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.recheck_s)
        self.drain()
        await self.drained()

    async def serve_kafka(
        self,
        stop: asyncio.Event,
        *,
        bootstrap_servers: str | KafkaConnection,
        topic: str = DEFAULT_REQUESTS_TOPIC,
        group_id: str = DEFAULT_GROUP,
        session_timeout_ms: int = 10_000,
        on_ready: Callable[[], None] | None = None,
        signer: RequestSigner | None = None,
        accept_unsigned: bool = False,
    ) -> None:
        """Consume requests and carry on runs of the owned partitions until ``stop``; drain.

        Args:
            bootstrap_servers: ``host:port[,...]``, or a `KafkaConnection` (TLS, SASL; from
                `Settings.kafka_connection`).
            signer: Checks each request's signature (`onward.runtime.signing`): one that is
                missing or does not check is set aside with the reason.
            accept_unsigned: Act on requests that carry no signature: anyone who can write
                the topic may then start, answer and tag runs. Only for a topic nobody else
                can write (or while rolling keys out: signed requests are still checked).

        Raises:
            ConfigurationError: Neither a signer nor ``accept_unsigned``.
            InvalidInputError: ``topic`` is no string or is empty.
        """
        # Imported here, as in every Kafka path of this module: a worker on SQLite or
        # PostgreSQL never loads aiokafka (~170 ms).
        from aiokafka.errors import KafkaError  # noqa: PLC0415

        from onward._storage import checked_topic, kafka_connection  # noqa: PLC0415

        topic = checked_topic(topic)
        _require_signer(signer, accept_unsigned, "topic")
        self._signer, self._accept_unsigned = signer, accept_unsigned
        connection = kafka_connection(bootstrap_servers)
        consumer = connection.consumer(
            role=self.name,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.max_runs,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=min(1_000, max(100, session_timeout_ms // 3)),
        )
        offsets = _Offsets()

        async def join() -> None:
            await ensure_requests_topic(connection, topic, self.backends.log.partitions)
            await connection.start(consumer)

        try:
            if not await _unless_stopped(join(), stop):
                # Told to stop while it connected: a stop, not the failure of a broker that
                # had not answered yet (nothing was taken, so nothing is left to drain).
                _log.info("stopped before joining %s", group_id)
                with contextlib.suppress(KafkaError):
                    await consumer.stop()  # not started, or stopped by its start already
                self.drain()
                await self.drained()
                return
            consumer.subscribe([topic], listener=_owner_class()(self, consumer, offsets))
        except KafkaError as exc:
            with contextlib.suppress(KafkaError):
                await consumer.stop()
            raise translate(exc, context=f"joining {group_id} on {topic}") from exc
        except BaseException:
            # The requests topic refused (another partition count) or a cancel: the consumer
            # built for the group is closed all the same, not reported unclosed once collected.
            with contextlib.suppress(KafkaError):
                await consumer.stop()
            raise
        try:
            try:
                if on_ready is not None:
                    on_ready()  # one that raises still leaves the group (``finally``)
                await self._consume(consumer, offsets, stop)
            except Exception:
                # Serving failed: the runs in flight still stop at their next boundary and
                # hand their leases back before the error ends the worker, as on SIGTERM.
                await self._drain_consumer(consumer, offsets)
                raise
            await self._drain_consumer(consumer, offsets)
        except KafkaError as exc:
            raise translate(exc, context=f"consuming {topic}") from exc
        finally:
            left = await _leave(consumer)
            if left is None:
                _log.info("left the group %s", group_id)
            else:
                _log.warning(
                    "leaving the group %s %s; the group drops this worker after its session "
                    "timeout (%.0fs)",
                    group_id,
                    left,
                    session_timeout_ms / 1000,
                )

    async def _drain_consumer(self, consumer: AIOKafkaConsumer, offsets: _Offsets) -> None:
        """Take nothing new, wait for the runs in flight to stop, commit what was acted on."""
        from aiokafka.errors import KafkaError  # noqa: PLC0415  (loaded already: ``consumer``)

        self.drain()
        with contextlib.suppress(KafkaError):
            consumer.pause(*consumer.assignment())
        _log.info("draining: %d runs in flight", self.in_flight)
        await self.drained()
        _log.info("drained; committing and leaving the group")
        try:
            # Bounded: a group in the middle of a rebalance may not take commits; what is
            # not committed is delivered again to the next owner, which finds it done.
            await asyncio.wait_for(offsets.commit(consumer), _LEAVE_S)
        except (TimeoutError, KafkaError) as exc:
            _log.warning("committing before leaving failed: %r", exc)

    async def _consume(
        self, consumer: AIOKafkaConsumer, offsets: _Offsets, stop: asyncio.Event
    ) -> None:
        from aiokafka.errors import CommitFailedError  # noqa: PLC0415  (loaded: ``consumer``)

        next_scan = time.monotonic() + self.recheck_s
        next_peek = time.monotonic() + _PEEK_S
        paused = False
        while not stop.is_set():
            free = self.free
            assigned = consumer.assignment()
            if free <= 0 and not paused:
                consumer.pause(*assigned)
                paused = True
                self.stats.pauses += 1
            elif free > 0 and paused:
                consumer.resume(*assigned)
                paused = False
                offsets.peeked_nowhere()  # read on from what waited, the peeked records again
            if paused or self.owes_lapsed_runs:
                # Runs carried on from a dead worker take the free slots before new requests.
                if not paused and not self._scans:
                    self._launch_lapsed()
                await self.wait_for_slot(0.2)
                if paused and time.monotonic() >= next_peek:
                    next_peek = time.monotonic() + _PEEK_S
                    await self._cancels_while_full(consumer, offsets)
            else:
                batch = await consumer.getmany(timeout_ms=200, max_records=free)
                for tp, records in batch.items():
                    for record in records:
                        self._take(tp, record, offsets)
            try:
                # Bounded: the client waits for a group coordinator for as long as the broker
                # is away, and the loop must still see ``stop`` and drain; what this commit
                # did not pass is committed by the next one.
                await asyncio.wait_for(offsets.commit(consumer), _LEAVE_S)
            except CommitFailedError as exc:
                # Left out of the group (paused past its session): it rejoins at its next
                # poll, and what it did not commit is delivered again to the partition's
                # owner, which finds it acted on.
                _log.warning("committing failed; rejoining the group: %s", one_line(str(exc)))
            except TimeoutError:
                _log.warning("committing took over %.0fs; trying again", _LEAVE_S)
            if time.monotonic() >= next_scan:
                next_scan = time.monotonic() + self.recheck_s
                self._recheck(set(self.owned), adopt=True)

    async def _cancels_while_full(self, consumer: AIOKafkaConsumer, offsets: _Offsets) -> None:
        """Act on the cancels waiting in the owned partitions while the worker is full.

        A full worker reads no requests, and a cancel is what frees a slot held by a run that
        should not go on: so every `_PEEK_S` it reads up to `_PEEK_RECORDS` of what is waiting,
        acts on each cancel (and sets aside what is not a request), and goes back to the first
        other request of each partition, which is read again once a slot is free. That request
        is marked taken and not done meanwhile, so no commit passes it; the cancels after it,
        done, are skipped when read again. Each peek reads on from where the one before it
        stopped, so a cancel behind more waiting requests than one peek reads is reached too.
        """
        assigned = consumer.assignment()
        ahead = offsets.peeks(assigned)
        for tp, (_, read_on_at) in ahead.items():
            consumer.seek(tp, read_on_at)
        consumer.resume(*assigned)
        try:
            batch = await consumer.getmany(timeout_ms=200, max_records=_PEEK_RECORDS)
        finally:
            consumer.pause(*consumer.assignment())  # the assignment may have moved meanwhile
        # Partitions revoked while reading are their next owner's; one revoked and assigned
        # again has no peek kept (its position went back to what was committed).
        assigned = consumer.assignment()
        kept = offsets.peeks(assigned)
        for tp in assigned:
            records = batch.get(tp, [])
            waiting: int | None = None
            peek_at: int | None = None
            if tp in kept:
                waiting, peek_at = kept[tp]
            held = offsets.held_runs(tp)
            for record in records:
                if offsets.taken_before(tp, record.offset):
                    continue  # acted on, or being acted on (a cancel still in flight)
                run_id = self._waits_for_a_slot(record, held)
                if run_id is None:
                    self._take(tp, record, offsets)
                    continue
                # Read over and not done: no commit passes it (nor the cancels after it, done)
                # until it is read again and acted on. Its run's cancels after it wait too,
                # so that a run's requests are acted on in the order they were stored.
                offsets.read_over(tp, record.offset)
                held.add(run_id)
                if waiting is None:
                    waiting = record.offset
            if records:
                peek_at = records[-1].offset + 1
            if waiting is not None and peek_at is not None:
                offsets.peeked(tp, waiting, peek_at)
                consumer.seek(tp, waiting)
            elif peek_at is not None:
                consumer.seek(tp, peek_at)

    def _waits_for_a_slot(self, record: Any, held: Collection[str]) -> str | None:
        """The run of a request record that must wait for a free slot: anything but a cancel
        of a run none of whose requests waits before it (``held``), or a record set aside as
        no request at all (None for those)."""
        try:
            self._check_signature(record)
            request = decode_request(record.value)
        except InvalidInputError:
            return None
        if isinstance(request, CancelRun) and request.run_id not in held:
            return None
        return request.run_id

    def _take(self, tp: TopicPartition, record: Any, offsets: _Offsets) -> None:
        if offsets.taken_before(tp, record.offset):
            return  # a cancel acted on (or still in flight) while the worker was full, read again
        offsets.taken(tp, record.offset)
        try:
            self._check_signature(record)
            request = decode_request(record.value)
        except InvalidInputError as exc:
            # Set aside, never retried: anyone on the topic can write such a record, and one
            # that stopped the worker would stop every worker that takes the partition next.
            _log.warning(
                "partition %d offset %d: set aside: %s",
                tp.partition,
                record.offset,
                one_line(str(exc)),
            )
            self.stats.set_aside += 1
            offsets.done(tp, record.offset, True)
            return

        def done(acted: bool) -> None:
            offsets.done(tp, record.offset, acted)

        def expired() -> bool:
            return self._set_aside_once_expired(
                f"partition {tp.partition} offset {record.offset}",
                record.key,
                record.value,
                record.headers or (),
            )

        self.submit(request, done, expired=expired)

    def _check_signature(self, record: Any) -> None:
        """Raises `InvalidInputError` with the reason when the record's signature does not
        check (an unsigned one passes only when unsigned requests are accepted)."""
        self._check_signed(record.key, record.value, record.headers or ())

    def _check_signed(
        self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
    ) -> None:
        if self._signer is None or (
            self._accept_unsigned and all(k != SIGNATURE_HEADER for k, _ in headers)
        ):
            return
        refusal = self._signer.refusal(key, value, headers)
        if refusal is not None:
            raise InvalidInputError(f"request not acted on: {refusal}")

    def _set_aside_once_expired(
        self,
        where: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
    ) -> bool:
        """Whether a request whose signature checked when taken must now be set aside (it
        expired while the worker waited for its stores), said so and counted as when taken."""
        try:
            self._check_signed(key, value, headers)
        except InvalidInputError as exc:
            _log.warning("%s: set aside: %s", where, one_line(str(exc)))
            self.stats.set_aside += 1
            return True
        return False

    # -- serving the PostgreSQL requests table -----------------------------------------------

    async def serve_postgres(
        self,
        stop: asyncio.Event,
        *,
        requests: PostgresRequests,
        signer: RequestSigner | None = None,
        accept_unsigned: bool = False,
        poll_s: float = 1.0,
        claim_s: float = CLAIM_S,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        """Act on requests from the ``onward_requests`` table and carry on lapsed runs of every
        partition until ``stop``; then drain and hand back what was not acted on.

        Args:
            requests: The open table (`PostgresRequests`), on the deployment's database.
            signer: Checks each request's signature; one that is missing or does not check is
                set aside (deleted, with the reason logged).
            accept_unsigned: Act on requests that carry no signature: anyone who can write the
                table may then start, answer and tag runs.
            poll_s: The longest a new request waits to be seen when no notification arrives
                (a notification wakes the worker at once).
            claim_s: How long a claim lasts unrenewed; a dead worker's requests move after it.

        Raises:
            ConfigurationError: Neither a signer nor ``accept_unsigned``; a ``poll_s`` or
                ``claim_s`` that is not positive.
        """
        _require_signer(signer, accept_unsigned, "table")
        if poll_s <= 0 or claim_s <= 0:
            raise ConfigurationError(
                f"poll_s and claim_s must be positive, got {poll_s} and {claim_s}"
            )
        self._signer, self._accept_unsigned = signer, accept_unsigned
        self.owned = set(range(self.backends.log.partitions))
        claims = _Claims(requests, self.name, claim_s)
        async with requests.listening() as woken:
            self.joined = True
            if on_ready is not None:
                on_ready()
            next_scan = 0.0
            try:
                while not stop.is_set():
                    if time.monotonic() >= next_scan:
                        next_scan = time.monotonic() + self.recheck_s
                        self._recheck(self.owned)
                    self._slot.clear()
                    woken.clear()
                    try:
                        await claims.settle()
                        more = await self._claim(requests, claims)
                    except BackendUnavailableError as exc:
                        _log.warning("requests table: %s; trying again in %.1fs", exc, poll_s)
                        more = False
                    if not more:
                        await _first_of((woken, stop, self._slot), min(poll_s, claim_s / 3))
            except Exception:
                # Serving failed (a statement the table refuses for good): the runs in flight
                # still stop at their next boundary and hand their leases and claims back
                # before the error ends the worker, as on SIGTERM.
                await self._drain_claims(claims, min(poll_s, claim_s / 3))
                raise
            await self._drain_claims(claims, min(poll_s, claim_s / 3))

    async def _drain_claims(self, claims: _Claims, every_s: float) -> None:
        """Take nothing new and wait for the runs in flight to stop, settling the claims every
        ``every_s`` meanwhile."""
        self.drain()
        _log.info("draining: %d runs in flight", self.in_flight)
        # Runs stop at their next boundary, which can be longer than a claim away: the
        # claims on what is still acted on are renewed meanwhile (and what is done is
        # deleted), or another worker would take those requests and act on them again.
        drained = asyncio.ensure_future(self.drained())
        try:
            while not drained.done():
                await asyncio.wait({drained}, timeout=every_s)
                try:
                    await claims.settle()
                except OnwardError as exc:
                    _log.warning("handing back requests failed (their claims lapse): %s", exc)
            await drained
        finally:
            drained.cancel()

    async def _claim(self, requests: PostgresRequests, claims: _Claims) -> bool:
        """Claim what the free slots take (cancels alone when full or when lapsed runs go
        first) and act on it; whether a full batch came, so more may be waiting."""
        free = self.free
        if free > 0 and self.owes_lapsed_runs and not self._scans:
            self._launch_lapsed()
        cancels_only = free <= 0 or self.owes_lapsed_runs
        limit = _PEEK_RECORDS if cancels_only else free
        taken = await requests.claim(
            self.name,
            limit,
            cancels_only=cancels_only,
            claim_s=claims.claim_s,
            agents=self.agents.keys(),
        )
        for row in taken:
            self._take_claimed(row, claims)
        return len(taken) >= limit

    def _take_claimed(self, row: ClaimedRequest, claims: _Claims) -> None:
        """Act on a claimed row, or set it aside (a claim made for cancels alone holds only
        cancels: the row's kind is checked against its body)."""
        claims.taken(row.id)
        headers = [(SIGNATURE_HEADER, row.signature)] if row.signature is not None else []
        try:
            self._check_signed(row.run_id.encode(), row.value, headers)
            elsewhere = row.elsewhere(self.agents.keys())
            if elsewhere is not None:
                # Stored for no agent (before migration 0019, or by a sender of then) and for
                # one this worker lacks: left for a worker that carries it, not lost.
                _log.info(
                    "request %d: stored for no agent, names agent %r; routed to a worker "
                    "carrying it",
                    row.id,
                    printable(elsewhere),
                )
                claims.route(row.id, elsewhere)
                return
            request = row.request(self.agents.keys())
        except InvalidInputError as exc:
            # Set aside for good, as a bad record on the topic is: anyone who can write the
            # table can write such a row, and one that stopped the worker would stop them all.
            _log.warning("request %d: set aside: %s", row.id, one_line(str(exc)))
            self.stats.set_aside += 1
            claims.done(row.id, True)
            return
        self.submit(
            request,
            lambda acted: claims.done(row.id, acted),
            expired=lambda: self._set_aside_once_expired(
                f"request {row.id}", row.run_id.encode(), row.value, headers
            ),
        )


@contextlib.asynccontextmanager
async def _driven(run_id: str, bound: AbstractAsyncContextManager[Agent]) -> AsyncIterator[Agent]:
    """``bound`` entered, with ``run_id`` the run the current task drives until it is left."""
    token = _driving_now.set(run_id)
    try:
        async with bound as agent:
            yield agent
    finally:
        _driving_now.reset(token)


_leaving: set[asyncio.Task[None]] = set()
"""Consumers stopping after the task that stopped them was cancelled: kept until they are."""


def _left(stopping: asyncio.Task[None]) -> None:
    _leaving.discard(stopping)
    if not stopping.cancelled():
        stopping.exception()  # seen: the caller may be gone, and a failed leave is harmless


async def _leave(consumer: AIOKafkaConsumer) -> str | None:
    """Stop ``consumer`` (it leaves the group), waiting at most `_LEAVE_S`: None once it
    stopped, else what kept it from leaving. A stop that gave up, failed or was cut has its
    consumer's tasks and connections ended (`drop_connections`): aiokafka stops the heartbeat
    only after the group's coordination ended, and a stop cut before then left the member
    heartbeating, in its group, for as long as the process lived. The stop is a task of its
    own that a cancellation of the caller leaves running: Python 3.11's `wait_for` cancels a
    stop that has not begun yet when the caller is cancelled again. It is given up all the
    same once `_LEAVE_S` passed, as the caller would have (`_give_up_leaving`)."""
    from aiokafka.errors import KafkaError  # noqa: PLC0415  (loaded already: ``consumer``)

    from onward._storage import drop_connections  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    deadline = loop.time() + _LEAVE_S
    stopping = asyncio.ensure_future(consumer.stop())
    _leaving.add(stopping)
    stopping.add_done_callback(_left)
    try:
        done, _ = await asyncio.wait({stopping}, timeout=_LEAVE_S)
    except asyncio.CancelledError:
        loop.call_at(deadline, _give_up_leaving, stopping, consumer)
        raise
    if not done:
        stopping.cancel()
        drop_connections(consumer)
        return f"gave up after {_LEAVE_S:.0f}s (the broker did not answer)"
    if stopping.cancelled():
        drop_connections(consumer)
        return "was cut (its stop was cancelled)"
    failed = stopping.exception()
    if failed is None:
        return None
    drop_connections(consumer)
    if not isinstance(failed, KafkaError):
        raise failed
    return f"failed: {one_line(str(failed)) or type(failed).__name__}"


def _give_up_leaving(stopping: asyncio.Task[None], consumer: AIOKafkaConsumer) -> None:
    """End what is left of a stop its cancelled caller left running (`_leave`), unless it
    stopped the consumer by now: a broker that does not answer kept it, with the consumer's
    fetcher, metadata task and connections, running for as long as the broker stayed away,
    and one that failed or was cut left them running."""
    from onward._storage import drop_connections  # noqa: PLC0415  (loaded already: ``consumer``)

    if not stopping.done():
        stopping.cancel()
    elif not stopping.cancelled() and stopping.exception() is None:
        return
    drop_connections(consumer)


def _require_signer(signer: RequestSigner | None, accept_unsigned: bool, where: str) -> None:
    if signer is None and not accept_unsigned:
        raise ConfigurationError(
            "the worker has no request key: set ONWARD_REQUEST_KEY (the same on the "
            "applications that submit; `openssl rand -hex 32` makes one), or accept "
            f"unsigned requests from anyone who can write the {where} "
            "(--accept-unsigned-requests)"
        )


async def _first_of(events: Sequence[asyncio.Event], seconds: float) -> None:
    """Until one of ``events`` is set or ``seconds`` pass."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class _Claims:
    """A worker's claims on rows of the requests table: renewed while acted on, deleted once
    acted on, handed back when not (`PostgresRequests`). ``done`` is called from a task's
    callback; the table is written by `settle`, from the serving loop, and what a failed write
    did not settle is tried again on the next."""

    def __init__(self, requests: PostgresRequests, worker: str, claim_s: float) -> None:
        self.requests = requests
        self.worker = worker
        self.claim_s = claim_s
        self.held: set[int] = set()
        self.finished: set[int] = set()
        self.released: set[int] = set()
        self.routed: dict[int, str] = {}
        self._next_renewal = time.monotonic() + claim_s / 3

    def taken(self, request_id: int) -> None:
        self.held.add(request_id)

    def done(self, request_id: int, acted: bool) -> None:
        if request_id in self.held:
            self.held.discard(request_id)
            (self.finished if acted else self.released).add(request_id)

    def route(self, request_id: int, agent: str) -> None:
        """Hand the row back stored for ``agent``, for a worker that carries it."""
        if request_id in self.held:
            self.held.discard(request_id)
            self.routed[request_id] = agent

    async def settle(self) -> None:
        for request_id, agent in list(self.routed.items()):
            await self.requests.route(self.worker, request_id, agent)
            del self.routed[request_id]
        if self.finished:
            finished = set(self.finished)
            await self.requests.finish(self.worker, finished)
            self.finished -= finished
        if self.released:
            released = set(self.released)
            await self.requests.release(self.worker, released)
            self.released -= released
        if self.held and time.monotonic() >= self._next_renewal:
            await self.requests.renew(self.worker, set(self.held), self.claim_s)
            self._next_renewal = time.monotonic() + self.claim_s / 3


_StartKey = tuple[str, str, str]
"""A start in flight's run id, tenant and agent: its `RunStarted`'s, once written."""


def _start_key(request: StartRun) -> _StartKey:
    return (request.run_id, request.tenant, request.agent)


class _Once:
    """Calls ``done`` the first time only."""

    def __init__(self, done: Callable[[bool], None] | None) -> None:
        self._done = done
        self.key: _StartKey | None = None
        """The run id, tenant and agent of the start it tells of (`Worker._starting`), if one."""

    def __call__(self, acted: bool) -> None:
        done, self._done = self._done, None
        if done is not None:
            done(acted)


async def _unless_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run ``work`` until it ends (True, or its exception) or ``stop`` is set (False): it is
    then cancelled, and waited for, so what it opened is closed before the stop goes on."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        cut = not task.done()
        if cut:
            task.cancel()
            await asyncio.wait([task])
    if cut:
        if not task.cancelled():
            task.exception()  # superseded by the stop
        return False
    task.result()
    return True


class _Offsets:
    """Per partition: offsets taken and whether each was acted on; commits the done prefix."""

    def __init__(self) -> None:
        self._open: dict[TopicPartition, dict[int, bool | None]] = {}
        """Per partition, the offsets read and not committed: True acted on, False being acted
        on, None read over by a full worker's peek (waiting for a slot)."""
        self._committed: dict[TopicPartition, int] = {}
        self._peeked: dict[TopicPartition, tuple[int, int]] = {}
        self._held: dict[TopicPartition, set[str]] = {}

    def peeked(self, tp: TopicPartition, waiting: int, peek_at: int) -> None:
        """A full worker's peek left the partition at ``waiting`` (the first request waiting
        for a slot) and read it up to ``peek_at``."""
        self._peeked[tp] = (waiting, peek_at)

    def peeks(
        self, partitions: Collection[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(first request waiting for a slot, where the next peek reads on) of ``partitions``."""
        return {tp: self._peeked[tp] for tp in partitions if tp in self._peeked}

    def peeked_nowhere(self) -> None:
        """The worker reads from its positions again (a slot is free): peeks start afresh."""
        self._peeked.clear()
        self._held.clear()

    def held_runs(self, tp: TopicPartition) -> set[str]:
        """The runs with a request the peeks of ``tp`` read over (waiting for a slot)."""
        return self._held.setdefault(tp, set())

    def taken(self, tp: TopicPartition, offset: int) -> None:
        """The record at ``offset`` is being acted on."""
        self._open.setdefault(tp, {})[offset] = False

    def read_over(self, tp: TopicPartition, offset: int) -> None:
        """A full worker's peek read the record at ``offset`` and left it for a free slot: no
        commit passes it, and it is taken when read again."""
        self._open.setdefault(tp, {}).setdefault(offset, None)

    def taken_before(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the record at ``offset`` was taken before (read again after a seek): acted
        on, or still being acted on (a cancel a full worker's peek took). A record a peek only
        read over was not."""
        committed = self._committed.get(tp)
        return (committed is not None and offset < committed) or self._open.get(tp, {}).get(
            offset
        ) is not None

    def done(self, tp: TopicPartition, offset: int, acted: bool) -> None:
        # Left for the next owner (not acted on): it stays open, so this worker commits
        # nothing at or after it.
        pending = self._open.get(tp)
        if acted and pending is not None and offset in pending:
            pending[offset] = True

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._open.pop(tp, None)
            self._committed.pop(tp, None)
            self._peeked.pop(tp, None)
            self._held.pop(tp, None)

    async def commit(
        self, consumer: AIOKafkaConsumer, only: Collection[TopicPartition] | None = None
    ) -> None:
        """Commit each partition's prefix of requests acted on. What a commit that failed
        would have passed stays as it was, to be committed by the next one."""
        commits: dict[TopicPartition, int] = {}
        for tp, pending in self._open.items():
            if only is not None and tp not in only:
                continue
            position = self._committed.get(tp)
            for offset in sorted(pending):
                if not pending[offset]:
                    break
                position = offset + 1
            if position is not None and position != self._committed.get(tp):
                commits[tp] = position
        if not commits:
            return
        await consumer.commit(commits)
        for tp, position in commits.items():
            still_open = self._open.get(tp)
            if still_open is None:
                continue  # revoked while committing: forgotten
            for offset in [o for o in still_open if o < position]:
                del still_open[offset]
            self._committed[tp] = position


@functools.cache
def _owner_class() -> type:
    """The rebalance listener a Kafka worker's consumer subscribes with: a class of aiokafka's,
    so made on first use, which a worker on SQLite or PostgreSQL never reaches."""
    from aiokafka import ConsumerRebalanceListener  # noqa: PLC0415
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    class _Owner(ConsumerRebalanceListener):  # type: ignore[misc]
        def __init__(self, worker: Worker, consumer: AIOKafkaConsumer, offsets: _Offsets) -> None:
            self._worker = worker
            self._consumer = consumer
            self._offsets = offsets

        async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
            revoked = list(revoked)
            try:
                await asyncio.wait_for(self._offsets.commit(self._consumer, only=revoked), _LEAVE_S)
            except (KafkaError, TimeoutError) as exc:  # the next owner sees them again: harmless
                _log.warning("committing before a rebalance failed: %r", exc)
            self._offsets.forget(revoked)
            self._worker.owned -= {tp.partition for tp in revoked}
            self._worker.joined = False
            _log.info("partitions revoked: %s", sorted(tp.partition for tp in revoked))

        async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
            partitions = {tp.partition for tp in assigned}
            self._worker.owned |= partitions
            self._worker.joined = True
            _log.info("partitions assigned: %s", sorted(partitions))
            self._worker._scan(partitions)

    return _Owner


__all__ = [
    "DEFAULT_GROUP",
    "NEEDS_PERSON",
    "Worker",
    "WorkerStats",
    "attempts_since_progress",
    "needs_person",
]
