"""What a process counts, and the Prometheus registry it is read from.

Counting is plain arithmetic on plain objects (`counts`, re-exported here): a run step or a tool
call adds to an int (and a bucket of a `Timings`), with no lock and no label lookup, so the hot
path costs next to nothing and the runner loads no prometheus_client. The numbers become
Prometheus metrics only when scraped: a custom collector reads them, and reads a worker's or a
projector's own counters the same way (the projections and the event log keep theirs without
knowing of Prometheus, since they sit below the runtime).

The registry is the process's own (`process_registry`), never prometheus_client's global
default, so an embedding application's metrics and a test's are not mixed with Onward's.
Tenant is never a label: a label per tenant is a time series per tenant.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .counts import (
    COUNTS,
    RUN_STEPS,
    STEP_BUCKETS_S,
    TOOL_CALL_DISPOSITIONS,
    RuntimeCounts,
    Timings,
)

__all__ = [
    "COUNTS",
    "RUN_STEPS",
    "STEP_BUCKETS_S",
    "TOOL_CALL_DISPOSITIONS",
    "ProjectorCollector",
    "RuntimeCounts",
    "Timings",
    "WorkerCollector",
    "process_registry",
]


class _RuntimeCollector(Collector):
    """Reads `COUNTS` into metric families at scrape time."""

    def collect(self) -> Iterator[Metric]:
        counts = COUNTS
        steps = CounterMetricFamily(
            "onward_run_steps",
            "Run steps taken: model calls and turns of tool calls.",
            labels=["step"],
        )
        step_seconds = HistogramMetricFamily(
            "onward_run_step_duration_seconds",
            "How long a run step took, written events included.",
            labels=["step"],
        )
        for step in RUN_STEPS:
            steps.add_metric([step], counts.steps[step])
            timings = counts.step_timings[step]
            step_seconds.add_metric([step], timings.cumulative(), timings.total_s)
        yield steps
        yield step_seconds
        calls = CounterMetricFamily(
            "onward_tool_calls", "Tool calls made, by how they ended.", labels=["disposition"]
        )
        for disposition in TOOL_CALL_DISPOSITIONS:
            calls.add_metric([disposition], counts.tool_calls[disposition])
        yield calls
        call_seconds = HistogramMetricFamily(
            "onward_tool_call_duration_seconds",
            "How long a tool call took, its outcome written included.",
        )
        timings = counts.tool_call_timings
        call_seconds.add_metric([], timings.cumulative(), timings.total_s)
        yield call_seconds
        for name, text, value in (
            ("onward_lease_claims", "Run leases taken.", counts.lease_claims),
            (
                "onward_lease_conflicts",
                "Run leases refused because another holder has the run.",
                counts.lease_conflicts,
            ),
            (
                "onward_fenced_writes_refused",
                "Writes to a run refused because this process's lease on it was lost.",
                counts.fenced_writes_refused,
            ),
            (
                "onward_compaction_events_cut",
                "Records compaction cut from the log.",
                counts.compaction_events_cut,
            ),
            (
                "onward_compaction_bytes_cut",
                "About how many bytes of encoded events compaction cut from the log.",
                counts.compaction_bytes_cut,
            ),
            (
                "onward_checkpoints_not_written",
                "Inline folds of run rows given up (a store error, a fold lock not free in "
                "time); a later fold writes what they would have.",
                counts.checkpoints_not_written,
            ),
        ):
            yield CounterMetricFamily(name, text, value=value)


class WorkerView(Protocol):
    """What the worker collector reads of a worker (`onward.runtime.fleet.Worker`)."""

    @property
    def in_flight(self) -> int: ...

    @property
    def max_runs(self) -> int: ...


class WorkerCollector(Collector):
    """A fleet worker's own counters (`WorkerStats`), read at scrape time."""

    def __init__(self, worker: WorkerView, stats: Callable[[], object]) -> None:
        self._worker = worker
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for field_name, name, text in (
            ("started", "onward_worker_runs_started", "Runs this worker started."),
            (
                "recovered",
                "onward_worker_runs_recovered",
                "Lapsed runs this worker carried on.",
            ),
            (
                "stopped",
                "onward_worker_runs_stopped",
                "Runs stopped at a boundary: the worker draining, or the run cancelled.",
            ),
            (
                "needs_person",
                "onward_worker_runs_left_for_person",
                "Runs left for a person to settle.",
            ),
            ("gave_up", "onward_worker_runs_given_up", "Runs that failed after every attempt."),
            (
                "conflicts",
                "onward_worker_conflicts",
                "Requests or recoveries that found the run held by another worker.",
            ),
            ("failures", "onward_worker_requests_refused", "Requests refused."),
            (
                "set_aside",
                "onward_worker_requests_set_aside",
                "Request records that were not a request the worker could act on.",
            ),
            ("pauses", "onward_worker_pauses", "Times the worker paused its partitions, full."),
        ):
            yield CounterMetricFamily(name, text, value=int(getattr(stats, field_name, 0)))
        finished = CounterMetricFamily(
            "onward_worker_runs_finished",
            "Runs this worker drove to a status, by the status.",
            labels=["status"],
        )
        statuses: Mapping[str, int] = getattr(stats, "statuses", {})
        for status, count in sorted(statuses.items()):
            finished.add_metric([status], count)
        yield finished
        yield GaugeMetricFamily(
            "onward_worker_runs_in_flight", "Runs in flight now.", value=self._worker.in_flight
        )
        yield GaugeMetricFamily(
            "onward_worker_runs_max", "Most runs in flight at once.", value=self._worker.max_runs
        )


class ProjectorCollector(Collector):
    """A projector's lag (as last measured) and its projection's counters, read at scrape time.

    Args:
        lag: The latest lag per assigned partition (events behind the log's end), kept up to
            date by whoever measures it (`onward projector` measures at each scrape).
        stats: The projection's stats object (`ProjectorStats` of the frontiers projection,
            `SinkStats` of a user projection), read by field name.
    """

    def __init__(self, lag: Mapping[int, int], stats: Callable[[], object]) -> None:
        self._lag = lag
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "onward_projector_lag_events",
            "Events of the partition not yet folded and stored, behind the log's end.",
            labels=["partition"],
        )
        for partition, behind in sorted(self._lag.items()):
            lag.add_metric([str(partition)], behind)
        yield lag
        yield GaugeMetricFamily(
            "onward_projector_partitions_assigned",
            "Partitions of the events topic this projector folds now.",
            value=len(self._lag),
        )
        stats = self._stats()
        for field_name, name, text in (
            ("events", "onward_projector_events_folded", "Events folded."),
            ("batches", "onward_projector_batches", "Batches folded."),
            ("rows_written", "onward_projector_rows_written", "Rows written to the store."),
            (
                "quarantined",
                "onward_projector_records_quarantined",
                "Unreadable records set aside in quarantine.",
            ),
            (
                "refused_events",
                "onward_projector_events_refused",
                "Events refused by the fold (written under a superseded fence).",
            ),
            ("unreadable", "onward_projector_records_unreadable", "Unreadable records skipped."),
        ):
            if hasattr(stats, field_name):
                yield CounterMetricFamily(name, text, value=int(getattr(stats, field_name)))


_REGISTRY: CollectorRegistry | None = None
_REGISTRY_LOCK = threading.Lock()


def process_registry() -> CollectorRegistry:
    """This process's registry (made on first use), with the runtime's counts in it."""
    global _REGISTRY  # noqa: PLW0603 - one registry per process, made on first use
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            registry = CollectorRegistry(auto_describe=True)
            registry.register(_RuntimeCollector())
            _REGISTRY = registry
        return _REGISTRY
