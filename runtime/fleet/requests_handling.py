"""Acting on a `Worker`'s requests: start a run, answer a person's request, tag, cancel, carry
on.

Every write is made under the run's lease, so a rebalance that briefly gives a partition two
owners is safe: the second owner's start, resume or answer gets `ResumeConflictError`; a start
is deferred until the run exists, an answer, a tag or a cancel is asked again until the run is
free, a resume is dropped, since whoever holds the run carries it on.

A cancel first stops the run where this worker drives it, at its next boundary (before its next
model call, as a drain does: a tool call in flight finishes and is recorded), then writes the
run's end under its lease, so no call of it is cut off mid-way and left undecided.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from onward.errors import (
    BackendUnavailableError,
    BudgetExceededError,
    ConfigurationError,
    FencedError,
    InvalidInputError,
    NothingToResumeError,
    OnwardError,
    ResumeConflictError,
)
from onward.projections.audit import one_line, printable
from onward.runtime.options import checked_options
from onward.runtime.result import RunResult

from .member import FleetMember
from .recovery import Recovery
from .requests import AnswerRequest, CancelRun, Request, StartRun, TagRun, check_request

_log = logging.getLogger("onward.worker")


class RequestHandler:
    """Acts on one request at a time for a worker (several may be in flight at once).

    Args:
        worker: Whose runner, agents, limits and counters it uses.
        recovery: Carries a run on once a resume or an answer asks for it.
    """

    def __init__(self, worker: FleetMember, recovery: Recovery) -> None:
        self._worker = worker
        self._recovery = recovery

    async def act(self, request: Request, *, expired: Callable[[], bool] | None = None) -> bool:
        """Act on ``request``; True once acted on (or refused for good), False to leave it.

        ``expired`` (said so and counted when True) checks the request's age again before each
        ask while its run is held by another: a wait longer than ONWARD_REQUEST_MAX_AGE has its
        sender told to send it again, and acting on it too would do the work twice.

        Raises:
            InvalidInputError: A field is out of bounds (`check_request`); nothing was done.
        """
        check_request(request)
        if isinstance(request, StartRun):
            return await self._start(request, expired)
        if isinstance(request, AnswerRequest):
            return await self._answer(request, expired)
        if isinstance(request, TagRun):
            return await self._tag(request, expired)
        if isinstance(request, CancelRun):
            return await self._cancel(request)
        return await self._resume(request)

    async def _resume(self, request: Request, *, answered: str | None = None) -> bool:
        """Carry the run on (after the answer to ``answered``, recorded). A run of this tenant
        that then fails is recovery's, not a refused request: said as a refusal, its stream's
        reader would take the run for never carried, and a person an answer for lost."""
        try:
            return await self._recovery.carry(request.run_id, request.tenant, recovery=False)
        except (BackendUnavailableError, NothingToResumeError):
            raise  # tried again (`Worker.handle`), or no such run of the tenant: refused
        except OnwardError as exc:
            self._worker.stats.failures += 1
            _log.warning(
                "run %s: %scarrying it on failed: %s; it is carried on as a lapsed run",
                printable(request.run_id),
                "" if answered is None else f"answered ({printable(answered)}), then ",
                one_line(str(exc)),
            )
            return True

    async def _start(self, request: StartRun, expired: Callable[[], bool] | None) -> bool:
        worker = self._worker
        agent = worker.agents.get(request.agent)
        if agent is None:
            return await self._fail_start(request, expired)

        async def start() -> bool:
            try:
                async with worker.for_run(agent, request.run_id, request.tenant) as bound:
                    result = await worker.runner.run(
                        bound,
                        request.input,
                        tenant=request.tenant,
                        run_id=request.run_id,
                        options=checked_options(request.options),
                        # Each run it is carried on into gets toolsets bound to that run.
                        bind=lambda new: worker.for_run(agent, new, request.tenant),
                    )
            except InvalidInputError:
                # Started before (sent again), carried on by its owner: left to it. The run of
                # another start under its id refuses this one (raised again).
                if await worker.runner.resumer.exists(request.run_id) and await self._own_run(
                    request
                ):
                    return True
                raise  # a value it cannot take: refused for good, and said so (`Worker.handle`)
            except ConfigurationError as exc:
                if await worker.runner.resumer.exists(request.run_id):
                    raise
                # Refused before anything of it was written (a budget on a model this worker
                # has no price for): recorded as a run that failed at its start, saying why, as
                # a start for an agent it lacks is. A fleet's application hears of the refusal
                # through the log alone, and would otherwise wait for a run that never comes.
                error = f"worker {worker.name} could not start it: {exc}"
                _log.warning("run %s: %s; the run ends failed", request.run_id, one_line(error))
                return await self._end_failed(request, error)
            except BudgetExceededError as exc:
                # Started, and ended failed before a call over its budget: not a refusal.
                _log.warning("run %s: %s", request.run_id, exc)
                result = RunResult(
                    run_id=request.run_id, tenant=request.tenant, status="failed", error=str(exc)
                )
            worker.stats.started += 1
            worker.count(result.status)
            return True

        return await self._once_startable(request, start, expired)

    async def _once_startable(
        self,
        request: StartRun,
        start: Callable[[], Awaitable[bool]],
        expired: Callable[[], bool] | None = None,
    ) -> bool:
        """Do ``start`` (a start's first write, made under the run's lease) once the run is
        free, or not at all once it exists: a start is never dropped, its request committed,
        for a lease held by someone who never writes the run, but is set aside once
        ``expired`` says it is too old to act on (its sender was told to send it again).

        Raises:
            ResumeConflictError: The lease was held on, renewed, all this time by someone who
                never wrote the run (a zombie): refused, saying so (`Worker.handle`).
        """
        worker = self._worker
        # Conflicts with a lease that is held on count towards giving up; one seen again as it
        # was (not renewed since) does not: it lapses by the store's own clock (its starter
        # died holding it, and the start waits for that, however long the lease was taken for).
        in_the_way: tuple[str, float] | None = None
        looks = attempt = 0
        while True:
            try:
                return await start()
            except (ResumeConflictError, FencedError) as held:
                # Another owner is starting or driving it (an overlapping rebalance, or a dead
                # worker's lease not yet lapsed), or this worker lost the lease while starting
                # (paused past its ttl): once the run exists it is its holder's or recovery's;
                # until then the start is tried again, never dropped as refused for good.
                worker.stats.conflicts += 1
                if await self._started(request.run_id, lost=isinstance(held, FencedError)):
                    if await self._own_run(request):
                        return True
                    raise _taken(request) from None
                lease = _lease_in_the_way(held)
                if lease is None or lease != in_the_way:
                    looks += 1
                in_the_way = lease
                if looks >= worker.max_attempts * 10:
                    # The row may lag the log (a projector behind or down): a holder that did
                    # write the run's `RunStarted` drives it, and the start is left to it.
                    if await worker.runner.resumer.exists(request.run_id):
                        if await self._own_run(request):
                            return True
                        raise _taken(request) from None
                    # Held on all this time by someone who never wrote it: a zombie lease, not
                    # a run. Refused, saying so (the application's stream of the run ends),
                    # rather than keep this partition's later requests from being committed.
                    raise ResumeConflictError(
                        f"run {request.run_id!r} was never free to start ({held}); the start "
                        "is dropped",
                        run_id=request.run_id,
                    ) from held
                if not await worker.sleep(worker.backoff_s * min(2**attempt, 8)):
                    return False
                attempt += 1
                if expired is not None and expired():
                    return True  # set aside: its sender was told to send it again

    async def _own_run(self, request: StartRun) -> bool:
        """Whether the run a start found under its id is the start's own (its tenant's, of its
        agent: the start sent again, or made by another worker), left to whoever drives it.
        Another start's run (another tenant's or agent's) refuses it for good (`_taken`):
        dropped, it left its stream waiting for a run that never comes, and no worker said why.
        """
        try:
            frontier = await self._worker.runner.inspect(request.run_id, tenant=request.tenant)
        except NothingToResumeError:
            return False
        except BackendUnavailableError:
            raise
        except OnwardError:
            return True  # its tenant's run, that cannot be read now (a hole): left as it is
        return frontier.agent in ("", request.agent)

    async def _fail_start(
        self, request: StartRun, expired: Callable[[], bool] | None = None
    ) -> bool:
        """A start for an agent this worker does not carry ends its run ``failed`` at once,
        saying why (a topic's partition is read by this worker alone, so the start cannot wait
        for another); a run that exists already is left as it is. A lease in the way is waited
        out as for any start (`_once_startable`): a run another worker holds is left to it once
        it exists, and a start dropped for a lease whose holder never wrote the run would leave
        whoever follows the run waiting for it with no cause given."""
        worker = self._worker
        error = (
            f"no agent {request.agent!r} on worker {worker.name} (it carries "
            f"{', '.join(sorted(worker.agents))}): every worker serving one requests topic "
            "carries every agent started on it"
        )
        _log.warning("run %s: %s; the run ends failed", request.run_id, error)
        return await self._once_startable(
            request, lambda: self._end_failed(request, error), expired
        )

    async def _end_failed(self, request: StartRun, error: str) -> bool:
        """Record the start as a run that ended ``failed`` at once with ``error``
        (`AgentRunner.end_at_start`); its own run that exists already (the start sent again) is
        left as it is. Another start's run under its id, or a value it cannot take, refuses it
        for good, saying so (`Worker.handle`): dropped, it left its stream waiting for a run
        that never comes."""
        worker = self._worker
        try:
            await worker.runner.end_at_start(
                request.agent,
                request.input,
                tenant=request.tenant,
                run_id=request.run_id,
                options=checked_options(request.options),
                status="failed",
                error=error,
            )
        except InvalidInputError as exc:
            if not (
                await worker.runner.resumer.exists(request.run_id) and await self._own_run(request)
            ):
                raise
            _log.warning("run %s: not ended failed: %s", request.run_id, one_line(str(exc)))
        worker.stats.failures += 1
        return True

    async def _started(self, run_id: str, *, lost: bool) -> bool:
        """Whether the run exists: by its row while another holds it (cheap), by the log once
        this worker lost the lease mid-start (its `RunStarted` may be newer than any row)."""
        if lost:
            return await self._worker.runner.resumer.exists(run_id)
        return await self._worker.backends.frontiers.get(run_id) is not None

    async def _answer(
        self, request: AnswerRequest, expired: Callable[[], bool] | None = None
    ) -> bool:
        worker = self._worker
        answer = worker.runner.approve if request.approve else worker.runner.deny

        async def write() -> None:
            await answer(
                request.run_id,
                request.request_id,
                tenant=request.tenant,
                by=request.by,
                value=request.value,
            )

        # An answer that did land makes the next ask find the run no longer waiting on it.
        try:
            if not await self._once_free(
                request, write, moot=lambda: self._answered_already(request), expired=expired
            ):
                return False
        except InvalidInputError:
            if not await self._answered_already(request):
                raise  # the run waits on it and refuses this answer (a value that does not fit)
        if not request.approve:
            return True  # denied: the run has ended
        # Carried on whether written here or found answered already: the answer that landed
        # may be this one (its append lost its answer and was tried again), and nothing else
        # would carry the run on until a recovery pass found it lapsed. Once more is harmless:
        # a run driven now is held (a conflict), one that ended or waits again is left alone.
        return await self._resume(request, answered=request.request_id)

    async def _tag(self, request: TagRun, expired: Callable[[], bool] | None = None) -> bool:
        runner = self._worker.runner
        return await self._once_free(
            request,
            lambda: runner.tag(
                request.run_id, request.label, tenant=request.tenant, seq=request.seq, by=request.by
            ),
            expired=expired,
        )

    async def _once_free(
        self,
        request: Request,
        act: Callable[[], Awaitable[object]],
        *,
        moot: Callable[[], Awaitable[bool]] | None = None,
        expired: Callable[[], bool] | None = None,
    ) -> bool:
        """Do ``act`` (a person's write, made under the run's lease) once the run is free: while
        another holds it, or this worker lost the lease while writing, ask again after the
        backoff, unless ``moot`` then says the write has nothing left to do, or ``expired``
        that the request is too old to act on (set aside). A loop, not a call per ask: the run
        may be held for a long while. Returns False when the worker began draining meanwhile
        (the request is not acted on)."""
        worker = self._worker
        asks = 0
        while True:
            try:
                await act()
            except (ResumeConflictError, FencedError) as held:
                worker.stats.conflicts += 1
                if moot is not None and await moot():
                    return True
                if not asks:
                    _waits(request, held, worker.backoff_s)
                asks += 1
                if not await worker.sleep(worker.backoff_s):
                    return False
                if expired is not None and expired():
                    return True  # set aside: its sender was told to send it again
            else:
                return True

    async def _answered_already(self, request: AnswerRequest) -> bool:
        """Whether the run no longer waits on the request ``request`` answers (an answer sent
        twice: the first landed, and the run went on or ended), said so. Such an answer has
        nothing to write; it must not wait, holding a slot, for whoever drives the run now."""
        try:
            frontier = await self._worker.runner.inspect(request.run_id, tenant=request.tenant)
        except NothingToResumeError:
            return False
        if not frontier.finished and frontier.waiting_on == request.request_id:
            return False
        _log.info(
            "run %s: no longer waits on %s (answered already, or %s); the answer is dropped",
            printable(request.run_id),
            printable(request.request_id),
            f"it ended {frontier.status}" if frontier.finished else "it went on",
        )
        return True

    async def _goes_on_as(self, request: CancelRun) -> str | None:
        """The run a cancel's run was carried on into, if it was (``None`` if it cannot be
        read)."""
        try:
            ended = await self._worker.runner.inspect(request.run_id, tenant=request.tenant)
        except OnwardError:
            return None
        return ended.continued_to if ended.status == "continued" else None

    async def _ended_before_the_cancel(
        self, request: CancelRun, refused: InvalidInputError
    ) -> None:
        """Say why a cancel found its run ended: a warning only when it ended otherwise. The
        same cancel often reaches a run twice (`onward cancel --wait` asks its holder through
        the lease too), and the holder that heard it first ended it cancelled."""
        run_id = request.run_id
        try:
            ended = await self._worker.runner.inspect(run_id, tenant=request.tenant)
        except OnwardError:
            ended = None
        if ended is not None and ended.status == "cancelled":
            _log.info(
                "run %s: cancelled already (%s)", printable(run_id), printable(ended.error or "")
            )
            return
        _log.warning("run %s: not cancelled here: %s", printable(run_id), refused)

    async def _cancel(self, request: CancelRun) -> bool:
        """Stop the run's tasks here at their next boundary, then end it ``cancelled`` under
        its lease. Held by another (a worker that took it up while this one's partitions were
        moving, or a lease not lapsed yet): that holder is asked to end it at its next boundary
        (`AgentRunner.ask_to_cancel`), and the cancel is tried again after a backoff until the
        run is free or has ended."""
        worker, run_id = self._worker, request.run_id
        # The tenant is checked before anything of the run is touched: another tenant's cancel
        # must not stop the run's tasks here (releasing its lease) only to be refused after.
        # A run with no event yet (its start still in flight here) is checked under the lease.
        try:
            await worker.runner.inspect(run_id, tenant=request.tenant)
        except NothingToResumeError:
            if await worker.runner.resumer.exists(run_id):
                # Another tenant's run (no such run for this one), or its start, in flight
                # here, wrote it since it was read: read again, or this tenant's cancel right
                # behind its start would be refused and the run go on.
                await worker.runner.inspect(run_id, tenant=request.tenant)
        async with worker.stopping_run(run_id):
            # A task here may be waiting for another process that holds the run to let go (a
            # tag asked again until the run is free): that holder is asked to end the run first,
            # or the wait for this worker's own tasks would last until the run ends by itself.
            holding = await worker.backends.leases.current(run_id)
            if holding is not None and holding.holder != worker.name:
                await worker.runner.ask_to_cancel(
                    run_id, tenant=request.tenant, by=request.by, why=request.why
                )
            asks = 0
            while True:
                await worker.others_stopped(run_id)
                try:
                    await worker.runner.cancel(
                        run_id, tenant=request.tenant, by=request.by, why=request.why
                    )
                except InvalidInputError as exc:  # it ended before the cancel reached it
                    onward = await self._goes_on_as(request)
                    if onward is not None:
                        # Carried on since the cancel was sent (its asker was told the run
                        # ends): the run it goes on as is the one to cancel.
                        return await self._cancel(
                            CancelRun(
                                run_id=onward, tenant=request.tenant, by=request.by, why=request.why
                            )
                        )
                    await self._ended_before_the_cancel(request, exc)
                    return True
                except (ResumeConflictError, FencedError) as exc:
                    worker.stats.conflicts += 1
                    if not asks:
                        _waits(request, exc, worker.backoff_s)
                    asks += 1
                    if isinstance(exc, ResumeConflictError) and exc.holder is not None:
                        await worker.runner.ask_to_cancel(
                            run_id, tenant=request.tenant, by=request.by, why=request.why
                        )
                    if not await worker.sleep(worker.backoff_s):
                        return False
                    continue
                _log.info("run %s cancelled by %s", printable(run_id), printable(request.by))
                worker.count("cancelled")
                return True


def _waits(request: Request, held: ResumeConflictError | FencedError, every_s: float) -> None:
    """Say, once per request, what a request asked again until its run is free waits on: it
    holds a slot meanwhile, and its partition's offsets are not committed past it."""
    _log.info(
        "%s of run %s waits until the run is free, asked again every %.1fs: %s",
        type(request).__name__,
        printable(request.run_id),
        every_s,
        one_line(str(held)),
    )


def _taken(request: StartRun) -> InvalidInputError:
    """The refusal of a start whose run id another start took, in the words every tenant gets
    (`App.query`'s "already exists"): nothing of that run is told."""
    return InvalidInputError(
        f"run {request.run_id!r} cannot be started for tenant {request.tenant!r}: it already "
        "exists or is not permitted; if it is this tenant's, resume it instead",
        run_id=request.run_id,
    )


def _lease_in_the_way(held: ResumeConflictError | FencedError) -> tuple[str, float] | None:
    """The holder and expiry of the lease a start met, when the refusal tells them (it does not
    to another tenant, nor when this worker lost its own lease)."""
    if isinstance(held, ResumeConflictError) and held.holder and held.expires_at is not None:
        return held.holder, held.expires_at
    return None
