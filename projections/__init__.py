"""Projections of the event log: the fold, frontier stores, projectors, builds and rebuilds."""

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
from .kafka import KafkaProjector
from .log_projector import LogProjector
from .memory import MemoryFrontierStore
from .postgres import PostgresFrontierStore, migrate
from .postgres_sql import Projection, SqlProjectionSink
from .rebuild import RebuildReport, rebuild, rebuild_frontiers, rebuild_projection
from .sqlite import SqliteFrontierStore

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
