"""The exported names are the public API; changing them is a decision, so a test pins them."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

import onward
import onward.eventlog
import onward.integrations.mcp
import onward.projections
import onward.runtime
import onward.testing
from onward.eventlog import EventLog, KafkaEventLog, MemoryEventLog, SqliteEventLog

PINNED_FILE = Path(__file__).with_name("fixtures") / "public_api.json"
PINNED: dict[str, list[str]] = json.loads(PINNED_FILE.read_text())


@pytest.mark.parametrize("module", sorted(PINNED))
def test_exports_are_the_pinned_ones(module: str) -> None:
    exported = importlib.import_module(module).__all__
    assert sorted(exported) == PINNED[module], f"update {PINNED_FILE.name} only on purpose"


def test_every_exported_name_exists() -> None:
    modules = (
        onward,
        onward.eventlog,
        onward.integrations.mcp,
        onward.projections,
        onward.runtime,
        onward.testing,
    )
    for module in modules:
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_backends_satisfy_the_protocol() -> None:
    assert isinstance(MemoryEventLog(), EventLog)
    assert isinstance(SqliteEventLog("unused.db"), EventLog)
    assert isinstance(KafkaEventLog("127.0.0.1:9092"), EventLog)


def test_stores_satisfy_the_protocol() -> None:
    assert isinstance(onward.projections.MemoryFrontierStore(), onward.projections.FrontierStore)
    assert isinstance(
        onward.projections.SqliteFrontierStore("unused.db"), onward.projections.FrontierStore
    )
    assert isinstance(
        onward.projections.PostgresFrontierStore("postgresql://x@127.0.0.1/x"),
        onward.projections.FrontierStore,
    )
