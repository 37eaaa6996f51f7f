"""The application API: start runs, watch them as they go, answer them, find them again.

``async with onward.open(settings, agents=..., provider=...) as app`` opens every store once
(and, for a fleet, the requests producer) and closes them on exit. Where runs execute is the
settings' ``app_mode``:

* ``in_process``: the application's own process drives its runs, on any backend (SQLite,
  memory, Kafka + PostgreSQL + Redis), through a `Worker` of its own that takes no requests
  from Kafka. Closing the app lets every run in flight reach its next boundary and hands its
  lease back; a later `resume` (here or in any process) carries it on.
* ``fleet`` (Kafka): the application submits requests on the requests topic and ``onward
  worker`` processes do the work; it needs no agents or provider of its own.

Either way a stream (`RunStream`) follows the run's events in the log, so what it yields does
not depend on who drives the run, a consumer that stops reading neither stops nor loses the run,
and a stream opened later (`resume`) replays what was missed, from the start or after a
message's position.

A run id alone never reaches a run: every read and answer is for a tenant, the call's own
``tenant=`` or the app's (``onward.open(..., tenant=...)``, ``"default"`` unless given), and a
run of another tenant is answered exactly as a run that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from onward._storage import Resource
from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    NothingToResumeError,
    OnwardError,
    ResumeConflictError,
)
from onward.eventlog.base import partition_for
from onward.eventlog.events import (
    Event,
)
from onward.projections.frontier import Frontier, RunTag
from onward.runtime.agent import Agent
from onward.runtime.ask import check_answer
from onward.runtime.backends import Backends, open_backends
from onward.runtime.blobs import ClaimCheck, output_of
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.fleet.requests import (
    AnswerRequest,
    CancelRun,
    Request,
    RequestSender,
    ResumeRun,
    StartRun,
    TagRun,
    check_request,
)
from onward.runtime.fleet.requests_postgres import PostgresRequests, cancel_waiting_start
from onward.runtime.fleet.senders import request_sender
from onward.runtime.fleet.worker import Worker
from onward.runtime.leases.base import CancelAsked, LeasePolicy
from onward.runtime.limits import check_stored_name
from onward.runtime.manager import ExecutionManager, needs_person
from onward.runtime.options import DEFAULT_TENANT, Options
from onward.runtime.providers import NoModel, Provider
from onward.runtime.redaction import Redactor
from onward.runtime.resumer import Resumer
from onward.runtime.runner import check_invocation_to_end
from onward.runtime.settings import Settings, load_settings

from .messages import RunMessage
from .stream import Position, RunStream
from .watcher import WATCHED_NAP_S, LogWatcher

_log = logging.getLogger("onward.app")

_WATCHED_RUNS = 1024
"""Runs with registered streams kept before those whose streams are all gone are forgotten."""


@dataclass(frozen=True, slots=True)
class SessionState:
    """Where a run stands, for `get_session_state`.

    Attributes:
        status: The run's status (``running``, ``waiting``, ``completed``, ``failed``,
            ``cancelled``, ``continued``), except a running run nobody holds, which is
            ``interrupted`` (``resume`` carries it on), or ``needs_person`` when a worker left
            it because a call may or may not have run (settle it with ``onward resolve``).
        waiting_on: The request a waiting run waits on (an approval, or a collaborative pause).
        holder: The worker that holds the run now, if any.
        cancel_asked: Someone asked that holder to end the run cancelled (`App.cancel`,
            ``onward cancel --wait``) and it has not yet: it does at its next boundary.
    """

    run_id: str
    tenant: str
    user: str | None
    agent: str
    status: str
    iteration: int
    last_seq: int
    waiting_on: str | None
    holder: str | None
    output: Any
    error: str | None
    tags: tuple[RunTag, ...]
    cancel_asked: CancelAsked | None = None

    def get(self, key: str, default: Any = None) -> Any:
        """A field by name, as from a mapping."""
        return getattr(self, key, default)


_FROM_FRONTIER = (
    "run_id",
    "tenant",
    "agent",
    *("iteration", "last_seq", "waiting_on", "output", "error", "tags"),
)
"""The `SessionState` fields that are the frontier's own."""


class App(Resource):
    """An application's handle on Onward; see the module docstring.

    Args:
        settings: Where the stores live and ``app_mode``; from the environment by default.
        agents: In process: the agents runs may name (one agent, a list, or a dict by name).
        provider: In process: the model.
        poll_s: How often a stream with nothing new looks at the log again (it backs off to
            ten times that while the run is quiet). In process, what the app's own worker
            writes wakes the streams of that run at once; the polls find what other
            processes write.
        recheck_s: In process: how often a quiet stream looks whether its run was left
            running with nobody holding it (its process died) and, if so, carries it on.
        lease_policy: In process: the runs' lease ttl.
        name: In process: this process's name in leases and `RunClaimed`.
        tenant: The tenant this app acts for when a call names none: runs it starts are
            that tenant's (unless their options name another) and it reads and answers only
            that tenant's runs. An application serving several tenants passes ``tenant=`` on
            each call instead.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        agents: Agent | Sequence[Agent] | Mapping[str, Agent] | None = None,
        provider: Provider | None = None,
        poll_s: float = 0.05,
        recheck_s: float = 5.0,
        lease_policy: LeasePolicy | None = None,
        name: str | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        self.tenant = Options.of({"tenant": tenant}).tenant
        self.settings = settings or load_settings()
        self.agents = _by_name(agents)
        self.provider = provider
        self.in_process = self.settings.app_mode == "in_process"
        refusal = _refusal(
            self.settings, in_process=self.in_process, ready=bool(provider and agents)
        )
        if refusal:
            raise ConfigurationError(refusal)
        self.poll_s = _seconds("poll_s", poll_s, zero=False)
        self.recheck_s = _seconds("recheck_s", recheck_s, zero=True)
        self._worker_options: dict[str, Any] = {
            "name": name,
            "lease_policy": lease_policy,
            "max_runs": sys.maxsize,  # an application's own runs are never held back
        }
        self._stack: AsyncExitStack | None = None
        self._backends: Backends | None = None
        self._worker: Worker | None = None
        self._requests: RequestSender | None = None
        self._folder: Checkpointer | None = None
        self._watching: dict[str, weakref.WeakSet[RunStream]] = {}
        """The live streams of each run, woken by this process's appends to it."""
        self._log_watcher: LogWatcher | None = None
        """In fleet mode, what looks at the log once for every stream (`nap`)."""
        self._tags_left: list[TagRun] = []
        """In process, tags the worker let go of as it drained (`close` writes them)."""
        self._closed = False
        """Closed after it was open: its streams and calls say so, not that it never was."""

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._backends is not None

    async def _connect(self) -> None:
        stack = self._stack = AsyncExitStack()
        backends = await stack.enter_async_context(
            open_backends(self.settings, in_process=self.in_process)
        )
        if self.in_process:
            assert self.provider is not None
            self._worker = Worker(backends, self.provider, self.agents, **self._worker_options)
            self._worker.append_listeners.append(self._appended)
        else:
            self._requests = await stack.enter_async_context(request_sender(self.settings))
            watcher = self._log_watcher = LogWatcher(
                backends.log, interval_s=self.poll_s, streams=self._live_streams
            )
            stack.push_async_callback(watcher.close)
        self._backends = backends
        _opened.append(self)

    async def close(self) -> None:
        """Let runs in flight reach their next boundary and hand their leases back, then close
        every store. Idempotent. Cancelled while runs drain, it cancels them (a call cut off is
        indeterminate for the next holder, never repeated) and still closes every store. Its
        streams still being read end at once, raising `ConfigurationError` (the app was closed);
        their runs are not lost: `resume` on another app follows (and carries on) each again."""
        if self in _opened:
            _opened.remove(self)
        worker, self._worker = self._worker, None
        try:
            if worker is not None:
                worker.drain()
                try:
                    await worker.drained()
                except asyncio.CancelledError:
                    # Cut short while runs drain (a second Ctrl-C, a deadline on the close):
                    # they are cancelled, as a worker's second SIGTERM cancels them, and waited
                    # for as they hand their leases back; the stores are closed after, not left
                    # open behind an app that is gone.
                    worker.stop_now()
                    await worker.drained()
                    raise
                await self._write_tags_left(worker)
        finally:
            stack, self._stack = self._stack, None
            if self._backends is not None:
                self._closed = True
            self._backends = self._requests = self._folder = self._log_watcher = None
            if self._closed:
                # Its streams end now, saying it closed, not at their next look of their own.
                for stream in self._live_streams():
                    stream.wake()
            if stack is not None:
                await stack.aclose()

    @property
    def backends(self) -> Backends:
        """The open stores."""
        if self._backends is None:
            raise self._not_open()
        return self._backends

    def _not_open(self) -> ConfigurationError:
        """Why the app cannot act: it was closed, or was never opened."""
        if self._closed:
            return ConfigurationError(
                "the app was closed; its streams and calls end with it (open another with "
                "`async with onward.open(...)`)"
            )
        return ConfigurationError("the app is not open; use `async with onward.open(...)`")

    @property
    def manager(self) -> ExecutionManager:
        """Who is waiting: `ExecutionManager` on the app's stores, for the app's tenant."""
        return ExecutionManager(self.backends.frontiers, self.backends.leases, tenant=self.tenant)

    # -- starting, resuming, following -------------------------------------------------------

    def query(
        self,
        prompt: Any,
        options: Options | Mapping[str, Any] | None = None,
        *,
        follow_waits: bool = True,
        timeout: float | None = None,
    ) -> RunStream:
        """Start a run with ``prompt`` as its input; the stream yields its messages.

        The run starts when the stream is first read. ``follow_waits`` and ``timeout``: as
        for `resume`.

        Raises:
            InvalidInputError: Bad options, or an agent this app does not know (in process);
                reading the stream: a ``prompt`` JSON cannot hold (``nan``, an object it has
                no form for; in process as in a fleet, nothing is sent), or the run id is
                taken (``Options.run_id`` of a run that exists, or that another start of
                another agent or tenant took first; one of the same agent and tenant is not
                told apart, and both streams follow it).
        """
        chosen = Options.of(options)
        if "tenant" not in chosen.model_fields_set:
            chosen = chosen.model_copy(update={"tenant": self.tenant})
        agent = self._agent_name(chosen)
        run_id = chosen.new_run_id()
        if timeout is not None:
            _seconds("timeout", timeout, zero=True)

        # Set once the start may have been sent: a submit that failed (its acknowledgement
        # lost, or cut off) may have landed, so an opening tried again sends it again and
        # follows the run from where the first try would have, rather than find the run its
        # own start made and call the run id taken (a worker takes a start of a run that
        # exists as started already).
        start: StartRun | None = None

        async def begin(stream: RunStream) -> None:
            nonlocal start
            if start is None:
                # The place is taken before the id is looked for: a start of it (another
                # tenant's, another agent's) that lands after the look is then read by the
                # stream, which ends saying the id is taken, rather than wait for a run whose
                # start the worker drops as made before.
                log = self.backends.log
                end = (await log.bounds(partition_for(run_id, log.partitions))).end
                if await self._resumer().exists(run_id):
                    raise InvalidInputError(
                        f"run {run_id!r} already exists; resume it instead", run_id=run_id
                    )
                backends = self.backends
                await Resumer(
                    backends.log, backends.leases, compaction=backends.compaction
                ).refuse_collected(run_id)
                stream.next_offset = end
                stream.expect_start(agent)
                start = StartRun(
                    run_id=run_id,
                    tenant=chosen.tenant,
                    agent=agent,
                    input=prompt,
                    options=chosen.recorded(),
                )
            await self._submit(start)
            self._sent_to_fleet(stream, "its start")

        return self._watched(
            RunStream(
                self,
                run_id,
                chosen.tenant,
                begin,
                follow_waits=follow_waits,
                timeout=timeout,
                agent=agent,
            )
        )

    def resume(
        self,
        run_id: str,
        resume_value: Any = None,
        *,
        tenant: str | None = None,
        after: int | Position = 0,
        approve: bool = True,
        by: str = "app",
        follow_waits: bool = True,
        timeout: float | None = None,
    ) -> RunStream:
        """Follow a run again: its messages after ``after`` (a seq, or a message's position;
        0: from the start), then what comes.

        With a ``resume_value`` the run must wait on a person: the value answers that request
        (``approve=False`` denies it) and the run goes on. Without one, a run left running by
        a process that died is carried on; anything else is only followed.

        Args:
            tenant: The run's tenant; the app's (``tenant=`` of `App`) when not given.
            follow_waits: False ends the stream once it has caught up with a run that waits
                on a person (what a script that cannot wait wants).
            timeout: Seconds the stream may see nothing new before it raises
                `RunTimeoutError` (saying who holds the run, and until when); ``None``: no
                bound. Whatever the bound, a stream ends with a ``needs_person`` message once a
                worker left the run for a person to settle a call, and says once (log
                ``onward.app``) who holds the run while it waits on another process. In a
                fleet, a stream whose start or answer nothing came of raises `RunTimeoutError`
                once no worker acts on it any more (``ONWARD_REQUEST_MAX_AGE`` after it was
                sent: a worker set it aside, saying why in its own log alone), or, on the
                PostgreSQL requests table, as soon as a worker took it and did not act on it.

        Raises:
            NothingToResumeError: No such run for that tenant (another tenant's run is no
                such run).
            InvalidInputError: A ``resume_value`` for a run that waits on nothing, or an
                ``after`` past the run's last event (nothing is answered); at once, an
                ``after`` that is no seq or position, or a ``timeout`` that is no duration.
        """
        start_after = _position(after)
        if timeout is not None:
            _seconds("timeout", timeout, zero=True)
        owner = self._tenant(tenant)

        # The request a try answered whose outcome is unknown (cut off, or a store that did not
        # answer): an opening tried again once the run no longer waits on it carries the run
        # on from that answer rather than refuse it as answered already.
        asked: str | None = None

        async def begin(stream: RunStream) -> None:
            nonlocal asked
            frontier = await self._frontier(run_id, owner)
            if start_after[0] > frontier.last_seq:
                # Another run's position: every message up to it would be skipped in silence.
                raise InvalidInputError(
                    f"run {run_id!r} has no message after seq {start_after[0]}: its events are "
                    f"1 to {frontier.last_seq} (a position is of the run whose stream gave it)",
                    run_id=run_id,
                )
            stream.agent = frontier.agent or None
            await self._follow_from_first(stream, frontier)
            if resume_value is not None or not approve:
                if asked is None or frontier.waiting_on == asked:
                    asked = frontier.waiting_on
                    try:
                        await self._answer(frontier, asked, resume_value, approve, by)
                    except (InvalidInputError, ResumeConflictError):
                        asked = None  # refused: nothing was written
                        raise
                    stream.answered.add(asked or "")
                    self._sent_to_fleet(stream, f"the answer to {asked!r}", answers=asked)
                    return
                stream.answered.add(asked)
            if await self._interrupted(frontier):
                await self._submit(_resume_of(frontier))

        return self._watched(
            RunStream(
                self,
                run_id,
                owner,
                begin,
                after=start_after,
                follow_waits=follow_waits,
                timeout=timeout,
            )
        )

    async def get_session_state(
        self, run_id: str, *, tenant: str | None = None
    ) -> SessionState | None:
        """Where the run stands now (the log's word, not a cached one); ``None``: no such run
        for ``tenant`` (the app's when not given)."""
        try:
            frontier = await self._frontier(run_id, self._tenant(tenant))
        except NothingToResumeError:
            return None
        status: str = frontier.status
        lease = await self.backends.leases.current(run_id)
        if status == "running" and lease is None:
            status = "needs_person" if needs_person(frontier) else "interrupted"
        same = {name: getattr(frontier, name) for name in _FROM_FRONTIER}
        if frontier.output is not None:
            # The row keeps it as the log does (out of line when large): given as it was.
            same["output"] = await output_of(frontier, ClaimCheck(self.backends.blobs))
        holder, asked = (None, None) if lease is None else (lease.holder, lease.cancel_asked)
        return SessionState(
            status=status, user=frontier.user_id, holder=holder, cancel_asked=asked, **same
        )

    # -- what messages ask for (`Answers`) ---------------------------------------------------

    async def answer(self, message: RunMessage, value: Any, *, approve: bool, by: str) -> None:
        """Answer the request ``message`` waits on; recorded in the log before this returns
        in process, submitted to the fleet before this returns otherwise."""
        frontier = await self._frontier(message.run_id, message.tenant)
        await self._answer(frontier, message.request_id, value, approve, by)
        if self._worker is None and message.request_id is not None:
            # Sent to the fleet: the streams of the run that wait on that request wait for the
            # worker now, and for what comes of the answer (it may be set aside).
            for stream in self._watching.get(message.run_id, ()):
                if stream.tenant == message.tenant and stream.waiting_on == message.request_id:
                    stream.answered.add(message.request_id)
                    what = f"the answer to {message.request_id!r}"
                    self._sent_to_fleet(stream, what, answers=message.request_id)

    async def tag(self, message: RunMessage, label: str, *, by: str) -> None:
        """Tag the event ``message`` came from (a `Tagged` event, written once no one else
        holds the run)."""
        if not label.strip():
            raise InvalidInputError("a tag needs a non-empty label", run_id=message.run_id)
        if self._worker is not None:
            with contextlib.suppress(ResumeConflictError):  # held: tagged once it is free
                await _as_person(
                    self._worker.runner.tag,
                    message.run_id,
                    label,
                    waiting=False,
                    tenant=message.tenant,
                    seq=message.seq,
                    by=by,
                )
                return
        request = TagRun(
            run_id=message.run_id, tenant=message.tenant, label=label, seq=message.seq, by=by
        )
        if self._worker is not None:
            # Kept by the worker until the run's lease is free; one it lets go of as it drains
            # (the app closing) has no other owner to come to: `close` writes it.
            def done(acted: bool) -> None:
                if not acted:
                    self._tags_left.append(request)

            self._worker.submit(request, done)
            return
        await self._submit(request)

    async def _write_tags_left(self, worker: Worker) -> None:
        """Write the tags the worker let go of as it drained: its runs are handed back now, so
        each is written unless another process holds its run (then it is lost, and said so)."""
        left, self._tags_left = self._tags_left, []
        for request in left:
            try:
                await _as_person(
                    worker.runner.tag,
                    request.run_id,
                    request.label,
                    waiting=True,
                    tenant=request.tenant,
                    seq=request.seq,
                    by=request.by,
                )
            except OnwardError as exc:
                _log.warning(
                    "run %s: tag %r not written as the app closed: %s",
                    request.run_id,
                    request.label,
                    exc,
                )

    async def cancel(
        self, run_id: str, *, by: str, why: str = "", tenant: str | None = None
    ) -> None:
        """End a run ``cancelled`` as person ``by`` (``why`` is recorded with it); nothing of
        it is carried on after, and the spend it holds is released.

        A run nobody is driving (waiting on a person, left for one, its worker gone) ends
        before this returns in process. A run being driven, by this app's worker, by another
        process sharing its stores or, in a fleet, by the worker that owns it, stops at its
        next boundary (before its next model call; a tool call in flight finishes and is
        recorded) and then ends: its stream ends with an ``error`` message whose status is
        ``cancelled``. Another process hears the ask at its next lease renewal or tool call
        (`AgentRunner.ask_to_cancel`) and abandons a model call in flight then. A fleet's start
        still waiting in the PostgreSQL requests table (no worker carrying its agent has taken
        it) is taken back, and its run recorded as ended ``cancelled``; one this app's `query`
        sent on a Kafka topic, that no worker has taken yet, is followed there by the cancel,
        and the worker that takes the start ends the run at its first boundary.

        Raises:
            NothingToResumeError: No such run for the tenant (nor a start of it waiting, in
                the PostgreSQL requests table, or sent on a Kafka topic by this app's `query`).
            InvalidInputError: ``by`` or ``why`` out of bounds, or the run has ended already
                (naming how), or is a LangGraph thread between invocations; nothing was written
                or sent.
            ResumeConflictError: In process, a person holds the run this moment (answering
                or tagging it), or its holder let go as it was asked; or a worker is taking
                its waiting start this moment; try again.
        """
        tenant = self._tenant(tenant)
        request = CancelRun(run_id=run_id, tenant=tenant, by=by, why=why)
        check_request(request)
        try:
            frontier = await self._frontier(run_id, tenant)
        except NothingToResumeError:
            if await self._withdraw_start(request):
                return
            if not self._start_sent(run_id, tenant):
                raise
            # Its start waits on the topic (no worker has taken it yet): the cancel goes on the
            # same partition behind it, and the worker that takes the start ends the run.
            await self._submit(request)
            return
        if frontier.finished:
            onward = frontier.continued_to
            goes_on = f"; it goes on as run {onward!r}: cancel that run" if onward else ""
            raise InvalidInputError(
                f"run {run_id!r} has ended already ({frontier.status}){goes_on}", run_id=run_id
            )
        worker = self._worker
        # A run that waits on a person is ended here even while the worker that wrote its
        # request is still handing the lease back (the moment its stream showed the request).
        waiting = frontier.status == "waiting"
        if worker is not None and (waiting or not worker.carrying(run_id)):
            try:
                await _as_person(
                    worker.runner.cancel, run_id, waiting=waiting, tenant=tenant, by=by, why=why
                )
            except ResumeConflictError as exc:
                if exc.holder != worker.name:
                    if not _drives(exc.holder) or not await worker.runner.ask_to_cancel(
                        run_id, tenant=tenant, by=by, why=why
                    ):
                        raise
                    return  # another process drives it: asked to end it at its next boundary
                # This app's worker took it up a moment ago: it stops it first.
            else:
                return
        if worker is None and await self.backends.leases.current(run_id) is None:
            # Refused here as this app's own worker would (the fleet's worker refuses it in
            # its own log alone): a LangGraph thread nobody writes has no invocation to end.
            check_invocation_to_end(frontier)
        await self._submit(request)

    def _start_sent(self, run_id: str, tenant: str) -> bool:
        """Whether a stream of this app sent the run's start to the fleet and has read nothing
        of the run yet: the start may wait for a worker (all full, or none up) for as long as
        its max age. Only on a Kafka topic, where the cancel is stored behind the start: a
        start on the PostgreSQL requests table is withdrawn while it waits (`_withdraw_start`),
        and once a worker took it, a cancel stored after could be taken before the run is
        written, or after the start was refused, and refused itself with no one told."""
        if isinstance(self._requests, PostgresRequests):
            return False
        return any(
            stream.tenant == tenant and stream.start_sent
            for stream in self._watching.get(run_id, ())
        )

    async def _withdraw_start(self, cancel: CancelRun) -> bool:
        """A fleet's start that waits in the requests table (no worker carrying its agent has
        taken it): taken back and recorded as a run ended cancelled; whether there was one."""
        requests = self._requests
        if not isinstance(requests, PostgresRequests):
            return False  # a topic's start cannot be taken back (`_start_sent`)
        return await cancel_waiting_start(requests, self.backends.runner(NoModel()), cancel)

    async def _answer(
        self, frontier: Frontier, request_id: str | None, value: Any, approve: bool, by: str
    ) -> None:
        if request_id is None or frontier.waiting_on != request_id:
            waiting = frontier.waiting_on
            raise InvalidInputError(
                f"run {frontier.run_id!r} is not waiting on "
                + (repr(request_id) if request_id else "an answer")
                + (f" (it waits on {waiting!r})" if waiting else f" (it is {frontier.status})")
                + "; it may have been answered already",
                run_id=frontier.run_id,
            )
        if approve:
            # Checked here too, so a fleet's app refuses a bad answer before submitting it.
            # Masked as it will be: by the runner that writes it, or as a request is sent.
            check_answer(
                frontier.answer_schema,
                value,
                run_id=frontier.run_id,
                request_id=request_id,
                redactor=self._worker.runner.writer.redactor
                if self._worker is not None
                else Redactor(),
            )
        worker = self._worker
        if worker is not None:
            # Recorded before this returns, so the caller may end its process right after.
            answer = worker.runner.approve if approve else worker.runner.deny
            try:
                await _as_person(
                    answer,
                    frontier.run_id,
                    request_id,
                    waiting=True,
                    tenant=frontier.tenant,
                    by=by,
                    value=value,
                )
            except asyncio.CancelledError:
                # Cut off, maybe once the answer was recorded: the run is carried on from it
                # then, not left for nobody (a run that still waits is left as it is).
                if approve:
                    worker.submit(_resume_of(frontier))
                raise
            if approve:
                worker.submit(_resume_of(frontier))
            return
        await self._submit(
            AnswerRequest(
                run_id=frontier.run_id,
                tenant=frontier.tenant,
                request_id=request_id,
                approve=approve,
                by=by,
                value=value,
                agent=frontier.agent or None,
            )
        )

    # -- helpers -----------------------------------------------------------------------------

    async def _submit(self, request: Request) -> None:
        """Hand ``request`` to the app's own worker, or send it to the fleet.

        Raises:
            InvalidInputError: A request a worker would refuse (`check_request`: run input
                JSON cannot hold, a name out of bounds); nothing was handed on or sent, in
                process as in a fleet, whose sender checks it the same way.
        """
        if self._worker is not None:
            check_request(request)
            self._worker.submit(request)
        elif self._requests is not None:
            await self._requests.submit(request)
        else:
            raise self._not_open()

    def _tenant(self, tenant: str | None) -> str:
        """The tenant a call acts for: its own, or the app's when it names none. A tenant given
        empty is kept (and refused as a name), never taken for the app's."""
        return self.tenant if tenant is None else tenant

    def _sent_to_fleet(self, stream: RunStream, what: str, *, answers: str | None = None) -> None:
        """Have ``stream`` wait for what comes of a request just sent to the fleet (not in
        process: this app's own worker says when it refuses a start): a worker acts on it
        only within the request key's max age, and says why it set one aside in its log."""
        if self._worker is None:
            signed = self.settings.request_key is not None
            max_age_s = self.settings.request_max_age if signed else None
            stream.sent_to_fleet(what, answers=answers, max_age_s=max_age_s)

    def _resumer(self) -> Resumer:
        backends = self.backends
        return Resumer(backends.log, backends.leases, backends.frontiers)

    async def _frontier(self, run_id: str, tenant: str) -> Frontier:
        """The tenant's run as the log has it now (the row, then the log after it).

        Raises:
            InvalidInputError: The run id or tenant is no name a stored run has (empty, a NUL,
                a lone surrogate; `check_stored_name`): nothing was read.
        """
        check_stored_name("run_id", run_id)
        check_stored_name("tenant", tenant, run_id=run_id)
        return await self._resumer().read(run_id, tenant=tenant)

    async def _follow_from_first(self, stream: RunStream, frontier: Frontier) -> None:
        """Start the stream at the run's first event, or, once the log was cut below it, at
        the first of its events the log still holds (its messages before are gone from the
        stream; the transcript keeps the conversation). A run that ended and was cut whole
        gives the message of its end alone.

        The cut need not be compaction's (Kafka retention, a cut made elsewhere write no
        truncation point): the events kept say where the run's count goes on from."""
        first = frontier.first_offset if frontier.first_offset >= 0 else None
        log = self.backends.log
        if first is None:
            stream.next_offset = first
            return
        kept_from = (await log.bounds(partition_for(frontier.run_id, log.partitions))).start
        stream.next_offset = max(first, kept_from)
        if first >= kept_from:
            return
        await stream.go_on_after_a_cut(frontier, kept_from)

    async def _interrupted(self, frontier: Frontier) -> bool:
        """Running, held by nobody, and not left for a person: someone should carry it on."""
        return (
            frontier.status == "running"
            and not needs_person(frontier)
            and await self.backends.leases.current(frontier.run_id) is None
        )

    def _agent_name(self, options: Options) -> str:
        if options.agent is not None:
            if self.in_process and options.agent not in self.agents:
                raise InvalidInputError(
                    f"no agent {options.agent!r} in this app; it has {sorted(self.agents)}"
                )
            return options.agent
        if len(self.agents) == 1:
            return next(iter(self.agents))
        raise InvalidInputError(
            "name the agent in the options (Options(agent=...))"
            + (f"; this app has {sorted(self.agents)}" if self.agents else "")
        )

    async def restore(self, event: Event) -> Event:
        """An event as written, its claim-checked body put back."""
        return await ClaimCheck(self.backends.blobs).restore(event)

    async def fold(self, partition: int) -> None:
        """Fold ``partition`` into the frontier rows now, on a backend folded by whoever
        appends (SQLite, PostgreSQL, memory): the append that a stream just read is folded
        right after it is durable, by the process that made it, and a reader may see the event
        in between. On Kafka the projector keeps the rows and this does nothing."""
        folder = self._folder
        if folder is None:
            if not self.backends.embedded:
                return
            worker = self._worker
            runner_folder = worker.runner.checkpointer if worker is not None else None
            folder = self._folder = runner_folder or Checkpointer(
                self.backends.frontiers, self.backends.log, compaction=self.backends.compaction
            )
        try:
            await folder.catch_up([partition])
        except OnwardError as exc:
            _log.warning("run rows of partition %d not folded yet: %s", partition, exc)

    async def nap(
        self,
        stream: RunStream,
        seconds: float,
        *,
        most_s: float | None = None,
        heed_after_s: float = 0.0,
    ) -> None:
        """Wait up to ``seconds`` before the stream looks at the log again, less if its run is
        known to have been appended to since it last looked: in process, by this process's
        worker (a stream sees each event as it is written rather than at its next poll); in
        fleet mode, by the log's watcher (`LogWatcher`), which wakes it within a poll of an
        append to its run's partition. While the watcher answers, a stream waits up to
        `WATCHED_NAP_S` between looks of its own. Never longer than ``most_s`` (the stream's
        timeout, or when it must say nobody holds its run), however seldom the app polls. A
        wake is heeded only after ``heed_after_s`` (`RunStream` backs it off while vague wakes
        bring it nothing), but one for the stream's own run at once: it brings something."""
        watcher = self._log_watcher
        if watcher is not None:
            watcher.watch()
            if watcher.answering:
                seconds = max(seconds, WATCHED_NAP_S)
        if most_s is not None:
            seconds = min(seconds, most_s)
        deaf_s = min(heed_after_s, seconds)
        if deaf_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.woken_for_its_run.wait(), deaf_s)
                return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stream.woken.wait(), seconds - deaf_s)

    def _live_streams(self) -> list[RunStream]:
        """Every stream still registered (`_watched`), for the log's watcher."""
        return [stream for streams in self._watching.values() for stream in streams]

    def _watched(self, stream: RunStream) -> RunStream:
        """Register a stream to be woken by this process's appends to its run (from before its
        first look at the log, so none falls between a look and the wait after it)."""
        if len(self._watching) > _WATCHED_RUNS:
            for run_id in [r for r, streams in self._watching.items() if not streams]:
                del self._watching[run_id]
        self._watching.setdefault(stream.run_id, weakref.WeakSet()).add(stream)
        return stream

    def _appended(self, events: Sequence[Event]) -> None:
        """Wake the streams of the run a batch was appended to (a batch is one run's)."""
        for stream in self._watching.get(events[0].run_id, ()):
            stream.wake()

    async def quiet(self, stream: RunStream) -> None:
        """A stream found nothing new: in process, end it if the worker refused to start its
        run, and carry a run whose process died on. In a fleet on the PostgreSQL requests
        table, have it end once no row of its run is left while it waits for what comes of a
        request its opener sent (a worker set it aside or refused it, `RunStream.let_go`)."""
        if self._worker is None:
            requests = self._requests
            if stream.sent and isinstance(requests, PostgresRequests):
                try:
                    if not await requests.stored_for(stream.run_id):
                        stream.let_go()
                except BackendUnavailableError as exc:
                    _log.warning(
                        "run %s: its requests could not be looked for: %s", stream.run_id, exc
                    )
            return
        cause = self._worker.refused_start(stream.run_id, tenant=stream.tenant)
        if cause is not None:
            stream.refused(cause)
            return
        if time.monotonic() - stream.nudged < self.recheck_s:
            return
        stream.nudged = time.monotonic()
        with contextlib.suppress(NothingToResumeError):
            frontier = await self._frontier(stream.run_id, stream.tenant)
            if await self._interrupted(frontier):
                await self._submit(_resume_of(frontier))


def _seconds(field: str, value: object, *, zero: bool) -> float:
    """A duration given in seconds: a finite number above 0 (or from 0, with ``zero``).

    Raises:
        InvalidInputError: Anything else, naming ``field`` (a poll of 0 would read the log
            without a pause, a string fail later as no Onward error).
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        if math.isfinite(seconds) and (seconds > 0 or (zero and seconds == 0)):
            return seconds
    least = "from 0" if zero else "above 0"
    raise InvalidInputError(f"{field} must be a number of seconds {least}, got {value!r}")


def _whole(value: object, least: int = 0) -> int | None:
    """``value`` if it is a whole number from ``least``, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= least:
        return value
    return None


def _position(after: object) -> Position:
    """Where a stream opened with ``after`` starts: after a seq (every part of its event), or
    after a message's position (a pair, as a tuple or, having been through JSON, a list; part
    -1 is before the event's first message).

    Raises:
        InvalidInputError: Anything else, naming ``after``.
    """
    seq = _whole(after)
    if seq is not None:
        return (seq, sys.maxsize)
    if isinstance(after, tuple | list) and len(after) == 2:
        seq, part = _whole(after[0]), _whole(after[1], -1)
        if seq is not None and part is not None:
            return (seq, part)
    raise InvalidInputError(
        "after must be a seq (a whole number from 0) or a message's position (seq, part), "
        f"got {after!r}"
    )


def _resume_of(frontier: Frontier) -> ResumeRun:
    """The request that carries the run on, naming its agent (so a PostgreSQL fleet hands it
    to a worker that carries that agent)."""
    return ResumeRun(run_id=frontier.run_id, tenant=frontier.tenant, agent=frontier.agent or None)


def _refusal(settings: Settings, *, in_process: bool, ready: bool) -> str | None:
    """Why an app with these settings could not work, or None."""
    if in_process and not ready:
        return (
            "an in-process app runs agents itself: pass agents= and provider= (or set "
            "ONWARD_APP_MODE=fleet to have `onward worker` processes run them)"
        )
    if not in_process and settings.backend not in ("kafka", "postgres"):
        return (
            f"ONWARD_APP_MODE=fleet needs ONWARD_BACKEND=kafka or postgres (it is "
            f"{settings.backend}): a fleet takes its requests from a Kafka topic or a "
            "PostgreSQL table"
        )
    if not in_process and settings.request_key is None and not settings.accept_unsigned_requests:
        return (
            "ONWARD_APP_MODE=fleet needs ONWARD_REQUEST_KEY, the key the workers check requests "
            "with (or ONWARD_ACCEPT_UNSIGNED_REQUESTS=true where the workers accept unsigned "
            "ones)"
        )
    return None


async def _as_person(
    write: Callable[..., Awaitable[Any]], *args: Any, waiting: bool, **kwargs: Any
) -> Any:
    """A person's write (answer, tag), retried for a few seconds while the run is held for a
    moment: by another person's write, or (``waiting``: the run waits on a person) by the
    worker that wrote the request and is handing the lease back. Otherwise a run a worker
    holds raises `ResumeConflictError` at once."""
    for _ in range(_PERSON_RETRIES):
        try:
            return await write(*args, **kwargs)
        except ResumeConflictError as exc:
            if not (waiting or (exc.holder or "").startswith("person:")):
                raise
            await asyncio.sleep(0.05)
    return await write(*args, **kwargs)


_PERSON_RETRIES = 100


def _drives(holder: str | None) -> bool:
    """Whether a lease's holder is a runner driving the run (a worker, an app, a command), not
    a person's brief write, which hears no cancel ask."""
    return holder is not None and not holder.startswith("person:")


def _by_name(agents: Agent | Sequence[Agent] | Mapping[str, Agent] | None) -> dict[str, Agent]:
    if agents is None:
        return {}
    if isinstance(agents, Agent):
        return {agents.name: agents}
    if isinstance(agents, Mapping):
        return dict(agents)
    return {agent.name: agent for agent in agents}


_opened: list[App] = []
"""The apps open now, in the order they were opened; the last one is the default."""


def current_app() -> App:
    """The app opened last and still open: the one `onward.query` and the others use.

    Raises:
        ConfigurationError: No app is open.
    """
    if not _opened:
        raise ConfigurationError(
            "no Onward app is open: wrap the code in `async with onward.open(settings, "
            "agents=..., provider=...)` (or call app.query on one)"
        )
    return _opened[-1]


__all__ = ["App", "SessionState", "current_app"]
