"""A pytest plugin for the marker test: once collection ends, it writes (to the file
``ONWARD_MARKER_PROBE_OUT`` names) every test that uses the shared Kafka broker without the
``kafka`` marker, one node id a line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

OUT_VARIABLE = "ONWARD_MARKER_PROBE_OUT"
SHARED_KAFKA = frozenset({"kafka_bootstrap", "kafka_topic", "kafka_servers"})
"""The fixtures that hand out the shared broker, or a place on it."""


def pytest_collection_finish(session: pytest.Session) -> None:
    unmarked = [
        item.nodeid
        for item in session.items
        if SHARED_KAFKA & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("kafka") is None
    ]
    Path(os.environ[OUT_VARIABLE]).write_text("".join(f"{n}\n" for n in unmarked))
