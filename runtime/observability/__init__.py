"""Metrics, health and readiness, and optional OpenTelemetry spans.

``counts``: what the process counts, in plain objects; ``metrics``: the Prometheus registry
they are read from (the process's own, never the global default); ``server``: `/metrics`,
`/healthz` and `/readyz` on the process's event loop; ``observe``: the runtime's hooks for a
run step and a tool call; ``tracing``: spans through `opentelemetry-api` when it is installed.

Each name is imported on first use: the runner counts through ``counts`` and ``observe``, and a
command that only reads runs through it (``onward inspect``) loads neither prometheus_client
nor the server.
"""

from typing import TYPE_CHECKING

from onward._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from .counts import COUNTS, RUN_STEPS, TOOL_CALL_DISPOSITIONS, RuntimeCounts, Timings
    from .metrics import ProjectorCollector, WorkerCollector, process_registry
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

# Hidden from type checkers, which see each lazy name in the TYPE_CHECKING imports above:
# with a module __getattr__ in view they would take a misspelt import for an `object`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_exports(
        __name__,
        {
            **{
                name: (".counts", name)
                for name in (
                    "COUNTS",
                    "RUN_STEPS",
                    "TOOL_CALL_DISPOSITIONS",
                    "RuntimeCounts",
                    "Timings",
                )
            },
            **{
                name: (".metrics", name)
                for name in ("ProjectorCollector", "WorkerCollector", "process_registry")
            },
            **{name: (".observe", name) for name in ("ToolCallEnd", "run_step", "tool_call")},
            **{
                name: (".server", name)
                for name in ("READY_WITHIN_S", "HealthServer", "Readiness", "Refresh", "probe")
            },
            **{name: (".tracing", name) for name in ("span", "use_tracer_provider")},
        },
    )
