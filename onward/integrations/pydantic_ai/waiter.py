"""pydantic-ai's wait for an external event, backed by Onward approvals.

A run that waits on a person (``HandleDeferredToolCalls`` whose handler takes a resume token,
``RequestInput`` before 2.78, or any `wait_for_external_event`) gets this
waiter inside an Onward run. The wait is recorded as ``ApprovalRequested`` and the run stops
there, holding nothing; the answer is recorded as ``ApprovalGranted`` (its value is the
payload) by `OnwardDurability.decide` or ``onward approve``, and the run is resumed. Its
re-execution reaches the same wait and gets the recorded answer without asking again.

The token handed to ``ask`` is the approval's request id. A wait's ``timeout`` is not enforced:
Onward has no timers, and a run waits until it is answered, denied or cancelled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from onward.eventlog import ApprovalDenied

from .compat import external_events
from .journal import RunJournal, RunSuspended

if external_events is not None:
    _Waiter: Any = external_events.ExternalEventWaiter
    _EventError: Any = external_events.ExternalEventError
else:  # pragma: no cover - depends on the installed release
    _Waiter = object
    _EventError = RuntimeError


class OnwardWaiter(_Waiter):  # type: ignore[misc]
    """Waits for an external event by waiting on a person in the Onward log.

    Args:
        journal: The run being executed.
    """

    def __init__(self, journal: RunJournal) -> None:
        self.journal = journal

    async def wait(
        self,
        name: str,
        *,
        ask: Callable[[str], Awaitable[Any]],
        timeout: timedelta | None,  # noqa: ASYNC109 - pydantic-ai's interface; not enforced
    ) -> Any:
        """The recorded answer to this wait; else ask, record, and stop the run until answered.

        Raises:
            ExternalEventError: A person denied the request.
            RunSuspended: Nobody has answered yet; the run waits.
        """
        request_id, recorded = self.journal.next_wait(name)
        if recorded is not None:
            if recorded.answer is None:
                raise RunSuspended(request_id, recorded.asked.details)
            if isinstance(recorded.answer, ApprovalDenied):
                raise _EventError(f"{request_id} was denied by {recorded.answer.by}")
            return recorded.answer.value
        answer = await ask(request_id)
        details = {"wait": name, "undecided": dict(self.journal.surfaced)}
        await self.journal.ask(request_id, f"answer the wait {name!r}", details, answer, by="ask")
        if answer is None:
            raise RunSuspended(request_id, details)
        return answer
