"""Stores holding many lapsed runs, for the tests that page through them (recovery passes,
`ExecutionManager.list_pending`): run ids that sort differently by case, past ASCII, and with
the ``~`` and ``#`` run ids hold, each run interrupted at its first model call."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from onward.eventlog import Message
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.providers import ModelReply, ScriptedProvider
from onward.runtime.settings import Settings
from support.pg import SchemaFactory

TENANT = "acme"
PAGE = 4
RUN_IDS = ["b#2", "B~1", "a~1", "A#3", "é~9", "e#0", "Z", "z~z", "ß#1", "~", "#", "run-7"]


@contextlib.asynccontextmanager
async def paging_backends(
    kind: str, tmp_path: Path, database_url: str, new_pg_schema: SchemaFactory
) -> AsyncIterator[Backends]:
    """Embedded SQLite (``kind`` "sqlite") or PostgreSQL backends in a schema of their own."""
    if kind == "sqlite":
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "pages.db")}
    else:
        env = {
            "ONWARD_BACKEND": "postgres",
            "DATABASE_URL": database_url,
            "ONWARD_DATABASE_SCHEMA": await new_pg_schema(),
        }
    async with open_backends(Settings.model_validate(env)) as opened:
        yield opened


async def interrupted(backends: Backends, agent: Agent, run_id: str) -> None:
    """A run whose first model call failed: running, nobody holding it."""

    def down(messages: Sequence[Message]) -> ModelReply:
        raise ConnectionError("the model went away")

    with pytest.raises(ConnectionError):
        await backends.runner(ScriptedProvider(down)).run(agent, "go", tenant=TENANT, run_id=run_id)
