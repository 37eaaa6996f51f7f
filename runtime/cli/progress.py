"""One line on standard error per turn while `onward run --resume` carries a run on.

A run can take minutes (a slow model, a slow tool); a command that prints nothing while it
works looks hung. The lines go to standard error, so standard output stays the result alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text

from onward.eventlog import events as ev
from onward.eventlog.events import Event
from onward.projections.audit import describe_event, one_line, printable

from ._common import err


class TurnLines:
    """A `RunObserver` printing a line when a resume has planned, a turn settles, an approval
    is asked for or the run ends, each with the seconds since the command began."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._asked: dict[str, str] = {}
        self._outcomes: dict[str, str] = {}

    async def appended(self, events: Sequence[Event]) -> None:
        for event in events:
            line = self._line(event)
            if line is not None:
                elapsed = time.monotonic() - self._started
                err.print(Text(f"[{elapsed:6.1f} s] {line}", style="dim"), soft_wrap=True)

    def _line(self, event: Event) -> str | None:
        """The line an event ends, if any; the events of a turn are kept until it settles."""
        self._keep(event)
        if isinstance(event, ev.TurnSettled):
            calls = ", ".join(
                f"{one_line(self._asked.get(call_id, f'call {call_id}'), 40)} "
                f"{self._outcomes.get(call_id, 'settled')}"
                for call_id in event.call_ids
            )
            return f"turn {event.iteration}: {calls or 'no calls'}"
        if isinstance(
            event, ev.ResumePlanned | ev.ApprovalRequested | ev.RunFinished | ev.RunContinued
        ):
            return f"{ev.kind_of(type(event))}: {describe_event(event)}"
        return None

    def _keep(self, event: Event) -> None:
        """Note which tool each call is and how it ended, for the turn's line."""
        if isinstance(event, ev.ModelAnswered):
            self._asked = {call.call_id: call.tool for call in event.tool_calls}
            self._outcomes = {}
        elif isinstance(event, ev.ToolDispatched):
            self._asked[event.call_id] = event.tool
        elif isinstance(event, ev.ToolCompleted):
            self._outcomes[event.call_id] = (
                # The type is run content (a class named at run time, a producer's record).
                "returned" if event.error is None else f"failed ({printable(event.error.type)})"
            )
        elif isinstance(event, ev.ToolResolved):
            self._outcomes[event.call_id] = f"settled as {event.outcome}"

    async def tool_returned(self, call_id: str) -> None:
        """Nothing to say until the outcome is written."""

    async def before_model_call(self) -> None:
        """Nothing to say: the turn's line comes once it settles."""
