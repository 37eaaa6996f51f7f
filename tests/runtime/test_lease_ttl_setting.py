"""``ONWARD_LEASE_TTL``: one default lease ttl, taken by every command that drives runs.

The ttl is seen where it decides something a person sees: an agent whose tool may take 30 s
(``max_call_s``) is refused under a ttl whose renewal margin leaves no room for the call, and
the refusal names the ttl in force. So each command shows which ttl it took: the default, the
variable's or ``--lease-ttl``'s.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from onward.errors import ConfigurationError
from onward.runtime import LeasePolicy
from onward.runtime.backends import open_backends
from onward.runtime.cli import app
from onward.runtime.leases.base import DEFAULT_LEASE_TTL_S
from onward.runtime.providers import NoModel
from onward.runtime.settings import Settings

AGENTS = """
from onward.eventlog import ToolCall
from onward.runtime import Agent, ScriptedProvider, reply, tool


@tool(max_call_s=30)
async def book(seat: str, *, idempotency_key: str) -> str:
    return "booked " + seat


def bounded():
    return Agent(name="bounded", instructions="book", tools=[book])


def model():
    return ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("booked")]
    )
"""


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the agents file; the runs go to an embedded file there."""
    (tmp_path / "ttl_agents.py").write_text(AGENTS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def onward(where: Path, *args: str, ttl: str | None = None) -> Result:
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(where / "onward.db")}
    if ttl is not None:
        env["ONWARD_LEASE_TTL"] = ttl
    return CliRunner().invoke(app, list(args), env=env)


AGENT = ["--agent", "ttl_agents.py:bounded", "--provider", "ttl_agents.py:model"]


def test_the_default_is_one_minute_everywhere() -> None:
    assert DEFAULT_LEASE_TTL_S == 60
    assert LeasePolicy().ttl_s == DEFAULT_LEASE_TTL_S
    assert Settings().lease_ttl == DEFAULT_LEASE_TTL_S
    assert Settings().lease_policy() == LeasePolicy()


def test_the_variable_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_LEASE_TTL", "7.5")
    assert Settings().lease_policy().ttl == timedelta(seconds=7.5)
    for unusable in ("0", "1e-9"):
        # Under a microsecond no lease holds at all: said of the variable, at start.
        monkeypatch.setenv("ONWARD_LEASE_TTL", unusable)
        with pytest.raises(ConfigurationError, match=r"ONWARD_LEASE_TTL \(lease_ttl\)"):
            Settings()


async def test_a_runner_the_backends_make_takes_the_settings_ttl() -> None:
    settings = Settings(backend="memory", lease_ttl=9)
    async with open_backends(settings, in_process=True) as backends:
        assert backends.runner(NoModel()).lease_policy.ttl_s == 9
        given = LeasePolicy(ttl=timedelta(seconds=3))
        assert backends.runner(NoModel(), lease_policy=given).lease_policy is given


def test_start_takes_the_default_then_the_variable_then_the_option(where: Path) -> None:
    refused = onward(where, "start", "book", *AGENT)
    assert refused.exit_code == 2, refused.output
    assert "its ttl of 60s" in refused.stderr
    started = onward(where, "start", "book", *AGENT, "--run-id", "r1", ttl="120")
    assert started.exit_code == 0, started.output
    assert "completed" in started.stdout
    overridden = onward(where, "start", "book", *AGENT, "--lease-ttl", "50", ttl="120")
    assert overridden.exit_code == 2
    assert "its ttl of 50s" in overridden.stderr


def test_resume_and_worker_take_the_variable(where: Path) -> None:
    assert onward(where, "start", "book", *AGENT, "--run-id", "r1", ttl="120").exit_code == 0
    resumed = onward(where, "run", "--resume", "r1", *AGENT, ttl="45")
    assert resumed.exit_code == 2, resumed.output
    assert "its ttl of 45s" in resumed.stderr
    assert onward(where, "run", "--resume", "r1", *AGENT, ttl="120").exit_code == 0
    worker = onward(where, "worker", *AGENT, ttl="40")
    assert worker.exit_code == 2, worker.output
    assert "its ttl of 40s" in worker.stderr
    assert "its ttl of 20s" in onward(where, "worker", *AGENT, "--lease-ttl", "20").stderr
