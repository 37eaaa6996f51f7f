"""The kafka marker's check. As a pytest plugin (``-p support.marker_probe``), once collection
ends it writes (to the file ``ONWARD_MARKER_PROBE_OUT`` names) every test that uses the shared
Kafka broker without the ``kafka`` marker, one node id a line. In a session of its own, the
conftest keeps every test it collected (`remember`, before ``-m``, ``-k`` or ``--deselect``
leave any out), so that a session that collected the whole suite checks it without collecting
it again in another process."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

OUT_VARIABLE = "ONWARD_MARKER_PROBE_OUT"
SHARED_KAFKA = frozenset({"kafka_bootstrap", "kafka_topic", "kafka_servers"})
"""The fixtures that hand out the shared broker, or a place on it."""
COLLECTED = pytest.StashKey[list[pytest.Item]]()
"""Every test the session collected, deselected ones too."""


def unmarked(items: Sequence[pytest.Item]) -> list[str]:
    """The node ids of ``items`` that take the shared broker without the ``kafka`` marker."""
    return [
        item.nodeid
        for item in items
        if SHARED_KAFKA & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("kafka") is None
    ]


def remember(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    """Keep every collected test; called before any is deselected."""
    config.stash[COLLECTED] = list(items)


def whole_suite(config: pytest.Config, tests: Path) -> list[pytest.Item] | None:
    """Every test under ``tests`` if this session collected them all (it was given ``tests``
    or its parent, whole, with nothing ignored nor skipped by ``--lf``), else ``None``."""
    given = [Path(config.invocation_params.dir, arg).resolve() for arg in config.args]
    whole = (
        all("::" not in arg for arg in config.args)
        and all(path in (tests, tests.parent) for path in given)
        and not config.getoption("ignore", None)
        and not config.getoption("ignore_glob", None)
        and not config.getoption("lf", False)
    )
    return config.stash.get(COLLECTED, None) if whole else None


def pytest_collection_finish(session: pytest.Session) -> None:
    found = unmarked(session.items)
    Path(os.environ[OUT_VARIABLE]).write_text("".join(f"{n}\n" for n in found))
