"""What recovery and request handling need from the worker they act for.

`Worker` owns the tasks, the slots and the consumer; `Recovery` and `RequestHandler` act for it
on one run at a time. They see the worker through `FleetMember`, the few things they use, so
neither imports the worker (whose module imports both) and a test can hand them anything with
that shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from onward.runtime.agent import Agent
from onward.runtime.backends import Backends
from onward.runtime.runner import AgentRunner


@dataclass
class WorkerStats:
    """What a worker did, for its log lines and the benchmark (``set_aside``: request records
    that were not a request it could act on, logged with their partition and offset)."""

    started: int = 0
    recovered: int = 0
    finished: int = 0
    stopped: int = 0
    conflicts: int = 0
    needs_person: int = 0
    gave_up: int = 0
    failures: int = 0
    set_aside: int = 0
    pauses: int = 0
    peak_in_flight: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


class FleetMember(Protocol):
    """A worker as recovery and request handling see it.

    Attributes:
        backends: The deployment's stores.
        runner: Drives and carries on the runs, under this worker's name.
        name: This worker's name in leases and claims.
        stats: Its counters.
        max_attempts: Claims without progress before a run ends ``failed``.
        backoff_s: Wait before a retry, doubled per attempt.
    """

    backends: Backends
    runner: AgentRunner
    name: str
    stats: WorkerStats
    max_attempts: int
    backoff_s: float

    @property
    def agents(self) -> Mapping[str, Agent]:
        """The agents this worker runs, by name."""
        ...

    @property
    def draining(self) -> bool:
        """Whether the worker stopped taking work."""
        ...

    @property
    def free(self) -> int:
        """Runs that may still be started before the worker is full."""
        ...

    def for_run(self, agent: Agent, run_id: str, tenant: str) -> AbstractAsyncContextManager[Agent]:
        """``agent`` as it drives ``run_id``: its toolsets' tools for that run added."""
        ...

    def carrying(self, run_id: str) -> bool:
        """Whether a task of the worker is acting on the run now."""
        ...

    def stopping(self, run_id: str | None) -> bool:
        """Whether the run's tasks stop at their next boundary (draining, or a cancel)."""
        ...

    def stopping_run(self, run_id: str) -> AbstractAsyncContextManager[None]:
        """While inside, the run's other tasks stop at their next boundary."""
        ...

    async def others_stopped(self, run_id: str) -> None:
        """Until no task of the worker acts on the run but the caller's own."""
        ...

    def launch(
        self,
        run_id: str,
        work: Callable[[], Awaitable[bool]],
        done: Callable[[bool], None] | None = None,
    ) -> None:
        """Run ``work()`` in one of the worker's slots (called there, not before)."""
        ...

    def count(self, status: str) -> None:
        """Count a run's status after the worker drove it."""
        ...

    async def sleep(self, seconds: float) -> bool:
        """Sleep, unless the worker starts draining first (then False)."""
        ...
