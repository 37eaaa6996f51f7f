"""Ctrl-C to `onward run --resume`: a real SIGINT to the process, not an exception raised in a
test. The command exits 130 in one line and hands the run's lease back on the way out, so
another worker, on this host or another, carries the run on at once instead of after the ttl.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cli_agent
from support.crashes import Crash, CrashAt
from support.processes import TESTS, kill_if_running
from support.runners import log_runner
from typer.testing import CliRunner

from onward.eventlog import SqliteEventLog
from onward.runtime import Agent, RunLease, SqliteLeaseStore
from onward.runtime.cli import app
from onward.runtime.leases.presence import HOLDERS_DIR_ENV

TENANT = "acme"
TTL_S = 300
"""The interrupted holder's lease: a run left held would stay locked for five minutes."""


def left_before_the_model(db: Path, agent: Agent) -> str:
    """A run of ``agent`` whose worker died right before asking the model; returns its id."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            runner = log_runner(
                cli_agent.booking_model(), log, leases, worker="w1", observer=CrashAt("model.call")
            )
            with contextlib.suppress(Crash):
                await runner.run(agent, "go", tenant=TENANT, run_id=run_id)

    asyncio.run(go())
    return run_id


def ctrl_c_default() -> None:
    """In the child: SIGINT as a terminal's foreground job has it (a shell that runs the tests
    in the background may have it ignored, and the child would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_onward(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``onward *args`` in a process of its own, its stderr kept, SIGINT as a terminal's."""
    return subprocess.Popen(
        [sys.executable, "-m", "onward", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_default,  # noqa: PLW1509 (only resets one signal's disposition)
    )


def wait_until_entered(process: subprocess.Popen[str], entered: Path, never: str) -> None:
    """Wait (a minute at the most) until ``process`` writes the file ``entered``; fail saying
    ``never`` if it does not, or with what it said if it ends first."""
    deadline = time.monotonic() + 60
    while not entered.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, never
        time.sleep(0.05)


def current_lease(db: Path, run_id: str) -> RunLease | None:
    async def read() -> RunLease | None:
        async with SqliteLeaseStore(db) as leases:
            return await leases.current(run_id)

    return asyncio.run(read())


@pytest.mark.parametrize(
    ("agent", "provider"),
    [("booker", "stalling_model"), ("slow_booker", "booking_model")],
    ids=["asking-the-model", "in-a-tool-call"],
)
def test_sigint_to_run_resume_exits_130_and_hands_the_lease_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: str, provider: str
) -> None:
    db, entered = tmp_path / "onward.db", tmp_path / "entered"
    # This test's presence locks alone: no other process may look like this run's holder.
    monkeypatch.setenv(HOLDERS_DIR_ENV, str(tmp_path / "holders"))
    run_id = left_before_the_model(db, getattr(cli_agent, agent)())
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(db),
        "CLI_AGENT_ENTERED": str(entered),
    }
    command = ["run", "--resume", run_id, "--tenant", TENANT]
    command += ["--agent", f"support.cli_agent:{agent}"]
    command += ["--provider", f"support.cli_agent:{provider}"]
    command += ["--worker", "interrupted-1", "--lease-ttl", str(TTL_S)]
    resuming = start_onward(command, env)
    try:
        wait_until_entered(resuming, entered, "the command never reached the model or the tool")
        held = current_lease(db, run_id)
        assert held is not None
        assert held.holder == "interrupted-1"  # the signal lands while the command holds the run

        resuming.send_signal(signal.SIGINT)
        _, said = resuming.communicate(timeout=30)
    finally:
        kill_if_running(resuming)  # one the signal did not end would outlive the test
    assert resuming.returncode == 130, said
    assert said.strip().splitlines()[-1] == "interrupted", said
    assert "Traceback" not in said
    assert current_lease(db, run_id) is None

    if agent == "booker":
        # Nothing was called yet, so a worker that could never prove the holder gone (it
        # names another) carries the run on at once: the lease is free, not lapsing.
        again = ["run", "--resume", run_id, "--tenant", TENANT, "--worker", "elsewhere-2"]
        again += ["--agent", "support.cli_agent:booker"]
        again += ["--provider", "support.cli_agent:booking_model"]
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        carried = CliRunner().invoke(app, again, env=env)
        assert carried.exit_code == 0, carried.output
        assert "status completed" in carried.stdout
        assert cli_agent.effects("book", run_id, "b") == 1


SILENT_COMMANDS = {
    "runs": ["runs"],
    "gc": ["gc"],
    "quarantine-list": ["quarantine", "list"],
    "quarantine-release": ["quarantine", "release", "run-1", "--by", "ann"],
    "db-migrate": ["db", "migrate"],
    "db-verify": ["db", "verify"],
    "projections-rebuild": ["projections", "rebuild", "frontiers"],
}


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A server that accepts connections and never answers: a command waits on it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server


def signalled_while_connected(
    silent_server: socket.socket,
    args: list[str],
    env: dict[str, str],
    sig: signal.Signals,
    *,
    within_s: float = 30,
) -> tuple[int, str, float]:
    """Start ``onward *args``, wait until it connects to the silent server (and waits on it),
    send ``sig``; its exit code, stderr, and how long it took to end after the signal."""
    waiting = start_onward(args, env)
    try:
        silent_server.settimeout(within_s)
        connected, _ = silent_server.accept()  # the command now waits on a silent server
        with connected:
            time.sleep(0.5)
            assert waiting.poll() is None, waiting.communicate()
            started = time.monotonic()
            waiting.send_signal(sig)
            _, stderr = waiting.communicate(timeout=within_s)
    finally:
        kill_if_running(waiting)  # one the signal did not end would outlive the test
    return waiting.returncode, stderr, time.monotonic() - started


@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")],
    ids=["sigterm", "sigint"],
)
@pytest.mark.parametrize("command", list(SILENT_COMMANDS))
def test_a_signal_while_waiting_on_a_server_exits_with_its_code_in_one_line(
    silent_server: socket.socket, command: str, sig: signal.Signals, code: int, said: str
) -> None:
    """Every command stops on SIGTERM as on Ctrl-C: its documented code and one line saying
    so. `gc`, `quarantine`, `db` and `projections rebuild` died of SIGTERM unsaid, with no
    exit code of their own, their connections left to the kernel to close."""
    port = silent_server.getsockname()[1]
    env = {
        **os.environ,
        "ONWARD_BACKEND": "kafka",
        "DATABASE_URL": f"postgresql://onward:secret@127.0.0.1:{port}/onward",
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
    }
    env.pop("REDIS_URL", None)
    returncode, stderr, seconds = signalled_while_connected(
        silent_server, SILENT_COMMANDS[command], env, sig
    )
    assert returncode == code, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(said), stderr
    assert seconds < 10


@pytest.mark.kafka
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_projector_stopped_while_connecting_stops_at_once(
    silent_server: socket.socket, kafka_bootstrap: str, kafka_topic: str, sig: signal.Signals
) -> None:
    """SIGTERM to a projector whose PostgreSQL does not answer yet (a pod stopped during a
    rollout): it waited out the whole connect bound, past a grace period, and then exited 5
    saying PostgreSQL did not answer, as though it had failed."""
    port = silent_server.getsockname()[1]
    env = {
        **os.environ,
        "ONWARD_BACKEND": "kafka",
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ONWARD_KAFKA_TOPIC": kafka_topic,
        "ONWARD_PARTITIONS": "1",
        "DATABASE_URL": f"postgresql://onward:secret@127.0.0.1:{port}/onward",
    }
    env.pop("REDIS_URL", None)
    # Kafka is open once the silent server is reached: PostgreSQL is being waited on.
    returncode, stderr, seconds = signalled_while_connected(
        silent_server, ["projector"], env, sig, within_s=60
    )
    assert returncode == 0, stderr
    assert "did not answer" not in stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "projector stopped before it started folding"
    assert seconds < 10


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_worker_stopped_while_opening_its_stores_stops_at_once_in_one_line(
    silent_server: socket.socket, sig: signal.Signals
) -> None:
    """SIGTERM to `onward worker` whose PostgreSQL does not answer yet (a pod stopped during a
    rollout): its handlers were put in place only once the stores were open, so the signal
    killed it with no line and no exit code of its own."""
    port = silent_server.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": f"postgresql://onward:secret@127.0.0.1:{port}/onward",
    }
    env.pop("REDIS_URL", None)
    command = ["worker", "--agent", "support.cli_agent:booker"]
    command += ["--provider", "support.cli_agent:booking_model"]
    returncode, stderr, seconds = signalled_while_connected(silent_server, command, env, sig)
    assert returncode == 0, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["worker stopped before it started serving"], stderr
    assert seconds < 10


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_worker_stopped_while_connecting_to_kafka_stops_at_once_in_one_line(
    silent_server: socket.socket, sig: signal.Signals
) -> None:
    """SIGTERM to `onward worker` whose Kafka does not answer yet, at the default backend
    timeout (a pod stopped during a rollout): the start it cut short was waited out until the
    request timeout failed it, about 30 s, as long as a pod's whole grace period, and a second
    signal was ignored meanwhile."""
    port = silent_server.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "kafka",
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "DATABASE_URL": f"postgresql://onward:secret@127.0.0.1:{port}/onward",
    }
    for name in ("REDIS_URL", "ONWARD_BACKEND_TIMEOUT"):
        env.pop(name, None)
    command = ["worker", "--agent", "support.cli_agent:booker"]
    command += ["--provider", "support.cli_agent:booking_model"]
    returncode, stderr, seconds = signalled_while_connected(
        silent_server, command, env, sig, within_s=60
    )
    assert returncode == 0, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["worker stopped before it started serving"], stderr
    assert seconds < 10


SLOW_IMPORT = """\
import pathlib
import time

pathlib.Path({entered!r}).touch()
time.sleep(120)  # a module that loads a model or connects when it is imported
"""

IMPORTING_COMMANDS = {
    "worker": (
        ["worker", "--agent", "slow_import:agent", "--provider", "support.cli_agent:booking_model"],
        {"ONWARD_BACKEND": "sqlite"},
        "worker stopped before it started serving",
    ),
    "projector": (
        ["projector", "--projection", "slow_import:Projection"],
        {"ONWARD_BACKEND": "kafka"},
        "projector stopped before it started folding",
    ),
}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
@pytest.mark.parametrize("command", list(IMPORTING_COMMANDS))
def test_a_long_lived_command_stopped_while_importing_the_users_module_stops_in_one_line(
    tmp_path: Path, command: str, sig: signal.Signals
) -> None:
    """SIGTERM to `onward worker` while its ``--agent`` module is still being imported (or
    `onward projector` its ``--projection``; one that loads a model or connects on import):
    no handler was in place yet, so the signal killed it with no line and no exit code of its
    own, and Ctrl-C said "interrupted", 130, not that it stopped."""
    args, backend, said = IMPORTING_COMMANDS[command]
    entered = tmp_path / "entered"
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT.format(entered=str(entered)))
    env = {
        **os.environ,
        **backend,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(tmp_path)]),
        "ONWARD_SQLITE_PATH": str(tmp_path / "onward.db"),
    }
    env.pop("REDIS_URL", None)
    importing = start_onward(args, env)
    try:
        wait_until_entered(importing, entered, f"{command} never imported the module")
        started = time.monotonic()
        importing.send_signal(sig)
        _, stderr = importing.communicate(timeout=30)
    finally:
        kill_if_running(importing)  # one the signal did not end would outlive the test
    assert importing.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == [said], stderr
    assert time.monotonic() - started < 10


SIGINT_IN_IMPORT = """
import importlib.abc, importlib.metadata, os, signal, sys


class CtrlC(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "onward.runtime.cli":
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, CtrlC())
sys.argv = ["onward", "--version"]
(command,) = importlib.metadata.entry_points(group="console_scripts", name="onward")
command.load()()
"""


@pytest.mark.parametrize("how", ["console script", "python -m onward"])
def test_ctrl_c_while_the_command_is_imported_exits_130_in_one_line(how: str) -> None:
    """The command's modules take a second or more to import, before the CLI's own Ctrl-C
    handling is in place: a Ctrl-C then printed a traceback (and the process died of SIGINT)."""
    if how == "console script":
        argv = [sys.executable, "-c", SIGINT_IN_IMPORT]
    else:
        argv = [
            sys.executable,
            "-c",
            SIGINT_IN_IMPORT.replace(
                "command.load()()", "import runpy; runpy.run_module('onward', run_name='__main__')"
            ),
        ]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, preexec_fn=ctrl_c_default
    )
    assert (done.returncode, done.stderr) == (130, "interrupted\n"), done.stderr
    assert done.stdout == ""
