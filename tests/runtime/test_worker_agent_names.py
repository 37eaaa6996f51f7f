"""An agent a worker is given under another name than its own (``--agent b=module:attr``)
runs under the name given, as the CLI promises: its runs record that name, by which the
worker's recovery (and an answer, and the requests table's routing) finds the agent again."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from support.fleet import script

from onward.eventlog import Message
from onward.runtime.backends import open_backends
from onward.runtime.cli.worker import load_agents
from onward.runtime.fleet.requests import StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, ScriptedProvider
from onward.runtime.settings import Settings

TENANT = "acme"


def _flaky(messages: Sequence[Message]) -> ModelReply:
    if sum(1 for m in messages if m.role == "assistant") == 1:
        raise ConnectionError("the model went away")
    return script(messages)


async def test_a_run_of_an_agent_named_on_the_command_line_is_carried_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = Settings.model_validate(
        {
            "ONWARD_BACKEND": "sqlite",
            "ONWARD_SQLITE_PATH": str(tmp_path / "fleet.db"),
            "ONWARD_PARTITIONS": 4,
        }
    )
    named = load_agents(["b=support.fleet:make_booker"])
    async with open_backends(settings) as backends:
        first = Worker(backends, ScriptedProvider(_flaky), named, name="first", backoff_s=0)
        with pytest.raises((ConnectionError, RuntimeError)):  # interrupted at its second turn
            await first.handle(StartRun(run_id="r1", tenant=TENANT, agent="b", input="job"))
        nxt = Worker(backends, ScriptedProvider(script), named, name="next", backoff_s=0)
        await nxt.recover(range(4))
        await nxt.drained()
        run = await nxt.runner.inspect("r1", tenant=TENANT)
    assert (run.agent, run.status) == ("b", "completed")
