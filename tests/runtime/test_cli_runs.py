"""`onward runs`: the frontier store's runs, filtered by the store and paged by run id.

A mixed set of runs (waiting, completed, failed, running; two tenants, two agents, old and
fresh) is written as the projector writes it, into the embedded SQLite file and into a
PostgreSQL schema behind the Kafka backend; the command line then lists them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.readme import run_example
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

from onward.projections.audit import printable
from onward.projections.base import FrontierStore, Snapshot
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.cli import app
from onward.testing.frontiers import frontier

TENANT = "acme"
STATUSES = ("waiting", "completed", "failed", "running")


class Stack:
    """Where the runs are: the environment `onward` reads, and how to write rows there."""

    def __init__(self, env: dict[str, str], store: Callable[[], FrontierStore]) -> None:
        self.env = env
        self.store = store

    def onward(self, *args: str) -> Result:
        return CliRunner().invoke(app, ["runs", *args], env=self.env)

    def write(self, *rows: Any) -> None:
        async def go() -> None:
            async with self.store() as store:
                await store.write("frontiers", {}, [Snapshot.of(row) for row in rows], [])

        asyncio.run(go())


@pytest.fixture(params=["sqlite", "kafka"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Stack:
    if request.param == "sqlite":
        db = tmp_path / "onward.db"
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        return Stack(env, lambda: SqliteFrontierStore(db))
    servers: KafkaServers = request.getfixturevalue("kafka_servers")
    return Stack(
        servers.env(),
        lambda: PostgresFrontierStore(servers.database_url, schema=servers.schema),
    )


def mixed_set(stack: Stack) -> dict[str, str]:
    """Twelve runs of tenant acme, three of each status, plus one waiting run of another
    tenant; returns acme's run ids with their statuses."""
    runs = {f"run-{i:02d}": STATUSES[i % 4] for i in range(12)}
    rows = [frontier(run_id, through=i, status=s) for i, (run_id, s) in enumerate(runs.items())]
    rows = [msgspec.structs.replace(row, tenant=TENANT) for row in rows]
    stack.write(*rows, frontier("run-other", through=99, tenant="globex", status="waiting"))
    return runs


def lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_status_waiting_lists_exactly_the_waiting_runs(stack: Stack) -> None:
    runs = mixed_set(stack)
    listed = lines(stack.onward("--status", "waiting", "--json"))
    waiting = sorted(run_id for run_id, status in runs.items() if status == "waiting")
    assert [line["run"] for line in listed] == [*waiting, "run-other"]
    assert {line["status"] for line in listed} == {"waiting"}
    assert listed[0]["tenant"] == TENANT
    assert listed[0]["agent"] == "booker"
    mine = lines(stack.onward("--status", "waiting", "--tenant", TENANT, "--json"))
    assert [line["run"] for line in mine] == waiting
    two = lines(stack.onward("--status", "failed", "--status", "completed", "--json"))
    assert {line["run"] for line in two} == {
        run_id for run_id, status in runs.items() if status in ("failed", "completed")
    }


def test_pages_return_every_run_once(stack: Stack) -> None:
    runs = mixed_set(stack)
    seen: list[str] = []
    after: list[str] = []
    pages = 0
    while True:
        page = lines(stack.onward("--tenant", TENANT, "--limit", "5", "--json", *after))
        pages += 1
        more = [line["next"] for line in page if "next" in line]
        seen += [line["run"] for line in page if "run" in line]
        if not more:
            break
        after = ["--after", more[0]]
    assert pages == 3
    assert seen == sorted(runs)


def test_json_pages_over_runs_whose_ids_hold_control_characters_return_each_once(
    stack: Stack,
) -> None:
    """A producer on the log may write a run id holding a C0 control (the log refuses only
    NUL): the ``next`` cursor of ``--json`` is that very id, and given back to ``--after`` it
    lists the page after it, not an error that leaves the runs after it out of reach."""
    ids = sorted(["run-a\x1bb", "run-a\nb", "run-a\x7fb", "run-b", "run-c"])
    stack.write(*(frontier(run_id, through=i, tenant=TENANT) for i, run_id in enumerate(ids)))
    seen: list[str] = []
    after: list[str] = []
    for _ in range(len(ids) + 2):
        page = lines(stack.onward("--tenant", TENANT, "--limit", "2", "--json", *after))
        seen += [line["run"] for line in page if "run" in line]
        more = [line["next"] for line in page if "next" in line]
        if not more:
            break
        after = ["--after", more[0]]
    assert seen == ids


def test_agent_and_age_filter_in_the_store(stack: Stack) -> None:
    now_us = time.time_ns() // 1000
    fresh = msgspec.structs.replace(
        frontier("run-fresh", through=1, tenant=TENANT), updated_at=now_us
    )
    old = frontier("run-old", through=2, tenant=TENANT)  # updated in 1970
    other = msgspec.structs.replace(frontier("run-x", through=3, tenant=TENANT), agent="other")
    stack.write(fresh, old, other)
    older = lines(stack.onward("--older-than", "15m", "--json"))
    assert [line["run"] for line in older] == ["run-old", "run-x"]
    booker = lines(stack.onward("--agent", "booker", "--json"))
    assert [line["run"] for line in booker] == ["run-fresh", "run-old"]
    assert booker[0]["age_s"] < 60


def test_the_table_shows_each_run_and_says_how_to_page_on(stack: Stack) -> None:
    mixed_set(stack)
    result = stack.onward("--tenant", TENANT, "--limit", "2")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["RUN", "TENANT", "AGENT", "STATUS", "AGE", "LAST", "UPDATE", "SPEND"]
    assert [row.split()[:4] for row in rows] == [
        ["run-00", TENANT, "booker", "waiting"],
        ["run-01", TENANT, "booker", "completed"],
    ]
    assert "--after run-01" in result.stderr


def test_the_next_page_hint_pasted_into_a_shell_pages_on_exactly(stack: Stack) -> None:
    """Run ids may hold what a terminal must not be sent raw (a right-to-left override, a C1
    control, a C0 control a producer on the log wrote): the hint shows them escaped, yet pasted
    into a shell it gives back the very id, so the next page neither repeats a run nor skips
    one."""
    ids = ["run-a\u202eb", "run-a\x85b", "run-ab", "run-ac", "run-a'\\u202ez", "run-z"]
    ids = sorted([*ids, "run-a\x1b[2Jb", "run-a\x07b"])
    stack.write(*(frontier(run_id, through=i, tenant=TENANT) for i, run_id in enumerate(ids)))
    seen: list[str] = []
    after: list[str] = []
    for _ in range(len(ids) + 2):
        result = stack.onward("--tenant", TENANT, "--limit", "1", *after)
        assert result.exit_code == 0, result.output
        seen += [row.split()[0] for row in result.stdout.splitlines()[1:]]
        if "more runs follow" not in result.stderr:
            break
        assert not any(printable(c) != c for c in result.stderr.rstrip("\n"))
        hint = result.stderr.strip().split("--after ", 1)[1]
        pasted = subprocess.run(
            ["bash", "-c", f"printf %s {hint}"],
            env={"LC_ALL": "C.UTF-8"},
            capture_output=True,
            check=True,
        )
        after = ["--after", pasted.stdout.decode()]
    assert seen == [printable(run_id) for run_id in ids]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--status", "stuck"], "--status: 'stuck' is not a run status; one of new, running"),
        (["--older-than", "2 weeks"], "--older-than: '2 weeks' is not a duration"),
        (["--limit", "0"], "--limit must be from 1"),
        (["--after", "run\x00x"], "--after holds a NUL character at position 3"),
        (["--after", ""], "--after must not be empty"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(tmp_path: Path, args: list[str], said: str) -> None:
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "none.db")}
    result = CliRunner().invoke(app, ["runs", *args], env=env)
    assert result.exit_code == 2
    assert said in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "none.db").exists()


def test_the_readme_example_lists_the_waiting_runs(tmp_path: Path) -> None:
    _, printed = run_example("Command line", tmp_path)
    assert printed.splitlines() == [
        "[('ticket-1', 'waiting', 'support')] {'next': 'ticket-1'}",
        "[('ticket-2', 'waiting')]",
        "ticket-2 waiting r",
    ]
