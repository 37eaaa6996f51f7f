"""Metrics, health and readiness, and optional OpenTelemetry spans.

``metrics``: what the process counts and the Prometheus registry it is read from (the
process's own, never the global default); ``server``: `/metrics`, `/healthz` and `/readyz` on
the process's event loop; ``observe``: the runtime's hooks for a run step and a tool call;
``tracing``: spans through `opentelemetry-api` when it is installed.
"""

from .metrics import (
    COUNTS,
    RUN_STEPS,
    TOOL_CALL_DISPOSITIONS,
    ProjectorCollector,
    RuntimeCounts,
    Timings,
    WorkerCollector,
    process_registry,
)
from .observe import ToolCallEnd, run_step, tool_call
from .server import READY_WITHIN_S, HealthServer, Readiness, Refresh, probe
from .tracing import span, use_tracer_provider

__all__ = [
    "COUNTS",
    "READY_WITHIN_S",
    "RUN_STEPS",
    "TOOL_CALL_DISPOSITIONS",
    "HealthServer",
    "ProjectorCollector",
    "Readiness",
    "Refresh",
    "RuntimeCounts",
    "Timings",
    "ToolCallEnd",
    "WorkerCollector",
    "probe",
    "process_registry",
    "run_step",
    "span",
    "tool_call",
    "use_tracer_provider",
]
