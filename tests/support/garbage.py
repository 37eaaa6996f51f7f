"""Collect garbage after each test, so what a test left unclosed fails that test.

An unclosed client (an aiokafka connection, a socket) held in a reference cycle is finalized, and
its ``ResourceWarning`` raised, only when the cycle collector runs: left to itself, in whichever
later test that happens. These fixtures, autouse in ``tests/conftest.py``, collect once the
test's own fixtures are torn down (an autouse fixture is set up before them, so torn down after
them) and before pytest looks for unraisable exceptions at the end of the teardown, so the
warning names the test that leaked.

A full collection walks every object the session holds: 0.1 s and more per test once the suite
has run a while. What a test left is among what it made, so after each collection the objects
that survived it are set aside (``gc.freeze``) and the next collection walks only what the next
test made. After a module's last test everything is walked again, for what its module-scoped
fixtures left, and at the session's end everything is given back to the collector, for what the
session-scoped fixtures and the last test's arguments left.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    """Set what the imports and the collection made aside before the first test."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Give what is set aside back to the collector: pytest's last collection, which reports
    what it finalizes, then walks what session-scoped fixtures left (a frozen cycle is never
    collected, not even at the interpreter's exit)."""
    gc.unfreeze()


@pytest.fixture(autouse=True, scope="module")
def _garbage_of_the_module_collected() -> Iterator[None]:
    """After the module's fixtures are torn down, walk every object again."""
    yield
    gc.unfreeze()
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _garbage_of_the_test_collected() -> Iterator[None]:
    """After the test's fixtures are torn down, walk what it made."""
    yield
    gc.collect()
    gc.freeze()
