"""A LangGraph thread as `onward runs` lists it: the same on the embedded SQLite file as on
Kafka + PostgreSQL + Redis.

A thread is a run (README, LangGraph): one that ran to its end, one whose graph run stopped
mid-way (a node raised) and one stopped at an interrupt are all listed, the first two ``new``
(a thread between invocations: nothing runs it and nobody is asked) and the third ``waiting``.
On Kafka the projector folds the rows; embedded, the saver's ``checkpoint_inline`` does.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import interrupt
from support.servers import KafkaServers
from typer.testing import CliRunner

from onward.integrations.langgraph import OnwardSaver
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.cli import app as cli

from .graphs import config, steps_graph
from .worlds import TENANT, World, kafka_world, sqlite_world


class Answer(TypedDict):
    answer: str


def _ask(state: Answer) -> dict[str, str]:
    return {"answer": str(interrupt("go on?"))}


def _break(state: Answer) -> dict[str, str]:
    raise RuntimeError("the node broke")


def _one_node(saver: OnwardSaver, node: Any) -> CompiledStateGraph[Any]:
    builder = StateGraph(Answer)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    return builder.compile(checkpointer=saver)


async def _write_threads(world: World) -> None:
    """Thread ``done`` ran to its end, ``cut`` stopped at a node that raised, ``asked`` at an
    interrupt."""
    async with world.saver() as saver:
        await steps_graph("a", saver).ainvoke({"steps": []}, config("done"))
        await _one_node(saver, _ask).ainvoke({"answer": ""}, config("asked"))
        with pytest.raises(RuntimeError, match="the node broke"):
            await _one_node(saver, _break).ainvoke({"answer": ""}, config("cut"))


async def _listed(env: dict[str, str]) -> dict[str, str]:
    """Each run `onward runs --json` lists, with its status."""
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, ["runs", "--json", "--tenant", TENANT], env=env
    )
    assert result.exit_code == 0, result.output
    return {line["run"]: line["status"] for line in map(json.loads, result.stdout.splitlines())}


EXPECTED = {"done": "new", "cut": "new", "asked": "waiting"}


async def test_threads_are_listed_embedded(tmp_path: Path) -> None:
    """On SQLite every thread is listed, not only the one waiting on a person."""
    db = tmp_path / "onward.db"
    async with sqlite_world(db) as world:
        await _write_threads(world)
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db), "ONWARD_PARTITIONS": "4"}
    assert await _listed(env) == EXPECTED


@pytest.mark.kafka
async def test_threads_are_listed_on_kafka(kafka_servers: KafkaServers) -> None:
    """On Kafka, once the projector folded the log, the same threads with the same statuses."""
    async with kafka_world(*kafka_servers) as world:
        await _write_threads(world)
        await Checkpointer(world.frontiers, world.log).catch_up()
    assert await _listed(kafka_servers.env(partitions=2)) == EXPECTED


async def test_inspect_says_a_thread_is_carried_on_by_its_graph(tmp_path: Path) -> None:
    """`onward inspect` of a thread between invocations (ended or cut mid-way) says its graph
    carries it on, not that `onward run --resume` would claim it and carry on: no agent of
    Onward's can (the thread has no `RunStarted`)."""
    db = tmp_path / "onward.db"
    async with sqlite_world(db) as world:
        await _write_threads(world)
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db), "ONWARD_PARTITIONS": "4"}
    for thread_id in ("done", "cut"):
        result = await asyncio.to_thread(
            CliRunner().invoke, cli, ["inspect", thread_id, "--tenant", TENANT, "--json"], env=env
        )
        assert result.exit_code == 0, result.output
        facts = json.loads(result.stdout)
        assert facts["status"] == "new"
        assert facts["resume_would"].startswith("nothing: a LangGraph thread between invocations")


async def test_run_resume_of_a_thread_names_it_a_langgraph_thread(tmp_path: Path) -> None:
    """`onward run --resume THREAD` refuses (exit 4, nothing appended) saying the run is a
    LangGraph thread its graph carries on, not that it "started with agent revision" nothing."""
    db = tmp_path / "onward.db"
    async with sqlite_world(db) as world:
        await _write_threads(world)
        before = len(await world.log.read_run("done"))
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db), "ONWARD_PARTITIONS": "4"}
    agent = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, ["run", "--resume", "done", "--tenant", TENANT, *agent], env=env
    )
    assert result.exit_code == 4, result.output
    assert "run 'done' is a LangGraph thread" in result.stderr
    async with sqlite_world(db) as world:
        assert len(await world.log.read_run("done")) == before
