"""Projections of the event log: the fold, frontier stores, projectors, builds and rebuilds.

What runs on a server is imported on first use: the Kafka projector loads aiokafka (~170 ms),
the PostgreSQL store, its projections and rebuilds asyncpg (~40 ms), which a process on SQLite
or in memory never uses.
"""

from typing import TYPE_CHECKING

from onward._lazy import functions_over_submodules as _functions_over_submodules
from onward._lazy import lazy_exports as _lazy_exports

from .base import (
    DEFAULT_MAX_BYTES,
    BuildSwitched,
    FrontierStore,
    ProjectionSink,
    QuarantineEntry,
    RunSummary,
    Snapshot,
    StoredFrontier,
)
from .frontier import CallState, Frontier, ToolCallRow, fold, fold_all, fold_run
from .frontier_projection import FrontierProjection, ProjectorStats
from .log_projector import LogProjector
from .memory import MemoryFrontierStore
from .sqlite import SqliteFrontierStore

if TYPE_CHECKING:
    from .kafka import KafkaProjector
    from .postgres import PostgresFrontierStore, migrate
    from .postgres_sql import Projection, SqlProjectionSink
    from .rebuild import RebuildReport, rebuild, rebuild_frontiers, rebuild_projection

__all__ = [
    "DEFAULT_MAX_BYTES",
    "BuildSwitched",
    "CallState",
    "Frontier",
    "FrontierProjection",
    "FrontierStore",
    "KafkaProjector",
    "LogProjector",
    "MemoryFrontierStore",
    "PostgresFrontierStore",
    "Projection",
    "ProjectionSink",
    "ProjectorStats",
    "QuarantineEntry",
    "RebuildReport",
    "RunSummary",
    "Snapshot",
    "SqlProjectionSink",
    "SqliteFrontierStore",
    "StoredFrontier",
    "ToolCallRow",
    "fold",
    "fold_all",
    "fold_run",
    "migrate",
    "rebuild",
    "rebuild_frontiers",
    "rebuild_projection",
]

# The projector and stores on a server load their drivers: imported on first access.
# Hidden from type checkers, which see each lazy name in the TYPE_CHECKING imports above:
# with a module __getattr__ in view they would take a misspelt import for an `object`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_exports(
        __name__,
        {
            "KafkaProjector": (".kafka", "KafkaProjector"),
            "PostgresFrontierStore": (".postgres", "PostgresFrontierStore"),
            "migrate": (".postgres", "migrate"),
            "Projection": (".postgres_sql", "Projection"),
            "SqlProjectionSink": (".postgres_sql", "SqlProjectionSink"),
            **{
                name: (".rebuild", name)
                for name in ("RebuildReport", "rebuild", "rebuild_frontiers", "rebuild_projection")
            },
        },
    )


# `rebuild` is exported lazily (it loads asyncpg) and is also its submodule's name.
_functions_over_submodules(__name__, "rebuild")
