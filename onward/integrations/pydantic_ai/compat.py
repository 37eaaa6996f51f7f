"""What differs across the supported pydantic-ai releases, in one place.

Waiting for external events (`pydantic_ai.external_events`) and the replay telemetry hook
(`record_durable_unit`) arrived in later releases than the durable backend API itself. On a
release without them, runs wait on people through `DeferredToolRequests` only, and replayed units
are not told apart in traces.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

try:
    _replay: Any = import_module("pydantic_ai._durable_replay")
except ImportError:  # pragma: no cover - depends on the installed release
    _replay = None

try:
    external_events: Any = import_module("pydantic_ai.external_events")
except ImportError:  # pragma: no cover - depends on the installed release
    external_events = None


def unit_completed(*, executed: bool) -> None:
    """Tell pydantic-ai's telemetry whether a unit ran or was replayed, where it listens."""
    if _replay is not None:
        _replay.record_durable_unit(executed=executed)


def waits_for_external_events() -> bool:
    """Whether this pydantic-ai lets an engine supply the wait for external events."""
    return external_events is not None
