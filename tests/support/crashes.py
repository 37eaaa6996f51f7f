"""A worker 'dying' at a point of a run, in-process: an observer that raises `Crash` there.

The subprocess crash tests kill with SIGKILL; these stand in for that where a test only needs
the log as a dead worker leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence

from onward.eventlog import Event, kind_of


class Crash(BaseException):
    """Stands in for the worker's process dying (not an `Exception`: nothing catches it)."""


class CrashAt:
    """An observer that 'dies' at the ``n``-th time the run reaches ``point``.

    Args:
        point: An event kind, once an append holding it is durable (``turn.settled``), or
            ``tool.returned`` (a tool returned, its outcome not written yet), or
            ``model.call`` (right before the model is called).
        call_id: With ``tool.returned``: only that call's return counts.
        n: How many times the point is reached before it dies.
    """

    def __init__(self, point: str, call_id: str | None = None, n: int = 1) -> None:
        self.point, self.call_id, self.left = point, call_id, n

    def _reached(self, times: int = 1) -> None:
        self.left -= times
        if times and self.left <= 0:
            raise Crash(self.point)

    async def appended(self, events: Sequence[Event]) -> None:
        self._reached(sum(kind_of(type(e)) == self.point for e in events))

    async def tool_returned(self, call_id: str) -> None:
        if self.point == "tool.returned" and self.call_id in (None, call_id):
            self._reached()

    async def before_model_call(self) -> None:
        if self.point == "model.call":
            self._reached()
