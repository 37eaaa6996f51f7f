"""What the runtime of this process counts, in plain objects that need no Prometheus.

The runner, the lease holder, the writer and the compactor add to `COUNTS`; only a process that
serves metrics loads prometheus_client (`metrics`), whose collectors read these at scrape time.
A command that reads a run through the runner (``onward inspect``) so loads no collector.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Bucket bounds, in seconds, for run steps and tool calls (a model call or a tool call each)."""

TOOL_CALL_DISPOSITIONS = (
    "completed",
    "error",
    "reconciled",
    "indeterminate",
    "interrupted",
    "asked",
)
"""How a tool call the runner made ended: it returned (``completed``), its error was recorded
(``error``), it was cut off at its deadline and its status check said it took effect
(``reconciled``) or nobody could say (``indeterminate``, left for a person), the call was
stopped by something outside it (``interrupted``: a lost lease, a cancelled task), or its code
stopped at a question for a person (``asked``: it runs again once answered)."""

RUN_STEPS = ("model", "tools")
"""A step of a run: one model call (``model``), or one turn of tool calls (``tools``: its
calls dispatched and settled, or the turn stopped to ask for an approval)."""


@dataclass(slots=True)
class Timings:
    """A histogram without a lock: counts per bucket (the last one is +Inf) and their sum."""

    bounds: tuple[float, ...] = STEP_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    total_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        """Count one duration (Prometheus buckets are inclusive: ``le``)."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total_s += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """The buckets as Prometheus exposes them: cumulative, ending with +Inf."""
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return buckets


@dataclass(slots=True)
class RuntimeCounts:
    """What the runtime of this process did: run steps, tool calls, leases, fenced writes,
    compaction, checkpoints given up. Every field only grows."""

    steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RUN_STEPS, 0))
    step_timings: dict[str, Timings] = field(
        default_factory=lambda: {step: Timings() for step in RUN_STEPS}
    )
    tool_calls: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(TOOL_CALL_DISPOSITIONS, 0)
    )
    tool_call_timings: Timings = field(default_factory=Timings)
    lease_claims: int = 0
    lease_conflicts: int = 0
    fenced_writes_refused: int = 0
    compaction_events_cut: int = 0
    compaction_bytes_cut: int = 0
    checkpoints_not_written: int = 0

    def step(self, step: str, seconds: float) -> None:
        """Count one run step that took ``seconds``."""
        self.steps[step] += 1
        self.step_timings[step].observe(seconds)

    def tool_call(self, disposition: str, seconds: float) -> None:
        """Count one tool call that ended as ``disposition`` after ``seconds``."""
        self.tool_calls[disposition] += 1
        self.tool_call_timings.observe(seconds)


COUNTS = RuntimeCounts()
"""This process's runtime counts; the runner, the lease holder, the writer and the compactor
add to it."""
