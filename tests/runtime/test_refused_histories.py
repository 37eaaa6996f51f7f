"""Recorded histories that resume must refuse, and leave exactly as they were.

The files in tests/fixtures/refused are the contract: a run whose later events a newer Onward
wrote (a newer event format) and a run started by another revision of its agent. Each is stored
record by record, as recorded, in the embedded SQLite log and in the memory log; carrying it on
must raise the error its ``<name>.expected.json`` names (`CheckpointFormatError`,
`RevisionMismatchError`), naming the run, append nothing, fold no frontier row, call no model,
and leave the run's lease free for whoever comes next.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.resume_fixtures import fixture_agent

import onward.errors
from onward.eventlog import MemoryEventLog, PartitionBounds, RunStarted, SqliteEventLog, decode
from onward.eventlog.base import EventLog
from onward.runtime.backends import Backends, open_backends
from onward.runtime.providers import ScriptedProvider
from onward.runtime.settings import Settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "refused"
NAMES = sorted(p.name.removesuffix(".jsonl") for p in FIXTURES.glob("*.jsonl"))
TENANT = "acme"


def recorded(name: str) -> tuple[list[bytes], dict[str, Any]]:
    """A history's records, as stored, and the refusal it must meet."""
    lines = [line for line in (FIXTURES / f"{name}.jsonl").read_bytes().splitlines() if line]
    return lines, json.loads((FIXTURES / f"{name}.expected.json").read_text())


@pytest_asyncio.fixture(params=["sqlite", "memory"])
async def backends(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backends]:
    """The embedded file, or memory, as an application opens it."""
    settings = Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")
    async with open_backends(settings, in_process=True) as opened:
        yield opened


def store(log: EventLog, run_id: str, records: list[bytes]) -> None:
    """Put the records in the log byte for byte, as the writer that recorded them did."""
    assert isinstance(log, SqliteEventLog | MemoryEventLog)
    for record in records:
        log.write_raw(run_id, record)


async def ends(log: EventLog) -> list[PartitionBounds]:
    """Where every partition starts and ends: an append anywhere moves one of them."""
    return [await log.bounds(partition) for partition in range(log.partitions)]


def test_there_are_refused_histories() -> None:
    assert NAMES == ["another_agent_revision", "newer_event_format"]


@pytest.mark.parametrize("name", NAMES)
async def test_resume_refuses_the_recorded_history_and_writes_nothing(
    backends: Backends, name: str
) -> None:
    records, expected = recorded(name)
    started = decode(records[0])
    assert isinstance(started, RunStarted)
    run_id = started.run_id
    agent = fixture_agent()
    # The history's one defect is the one expected: a newer format, or another revision.
    assert (started.revision == agent.revision) is expected["started_by_this_revision"]
    store(backends.log, run_id, records)
    before = await ends(backends.log)
    model = ScriptedProvider([])
    refusal = getattr(onward.errors, expected["error"])

    async with backends.runner(model, worker="w-refused") as runner:
        with pytest.raises(refusal) as refused:
            await runner.resume(agent, run_id, tenant=TENANT)

    assert type(refused.value) is refusal
    assert refused.value.run_id == run_id
    assert getattr(refused.value, "seq", None) == expected["seq"]
    assert expected["says"] in str(refused.value)
    assert await ends(backends.log) == before
    assert await backends.frontiers.get(run_id) is None
    assert await backends.leases.current(run_id) is None
    assert model.calls == 0
