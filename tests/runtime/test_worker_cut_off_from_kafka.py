"""A Kafka worker cut off from the broker still stops when told to.

Committing the offsets of the requests it acted on waits for the group's coordinator, and the
client waits for one for as long as the broker is away: the serving loop bounds the commit, so
it sees ``stop``, drains and returns (SIGTERM ends the worker) rather than hang until the broker
is back. Real Kafka, cut off by a `TcpProxy` in front of it, never touched itself; the runs'
stores are a SQLite file, so only the requests go through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from support.fault_runs import until
from support.kafka import broker_redirected
from support.proxy import TcpProxy

from onward.eventlog import Event, RunFinished
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.fleet import worker as worker_module
from onward.runtime.fleet.requests import Requests, StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings

pytestmark = pytest.mark.kafka
TENANT = "acme"
LEAVE_S = 1.0
"""The bound on a commit (and on leaving the group) in this test."""


@pytest.fixture
def broker_through_proxy(kafka_bootstrap: str, requests_topic: str) -> Iterator[dict[str, int]]:
    """Clients are told the proxy's address for the broker (it advertises its own), while the
    test puts a port in the dict; undone before the topic fixture's admin client deletes it."""
    with broker_redirected(kafka_bootstrap) as proxied:
        yield proxied


async def test_a_worker_cut_off_from_the_broker_stops_when_told(
    kafka_bootstrap: str,
    requests_topic: str,
    broker_through_proxy: dict[str, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_module, "_LEAVE_S", LEAVE_S)
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "cut.db")}
    )
    host, _, port = kafka_bootstrap.rpartition(":")
    agent = Agent(name="writer", instructions="w")
    async with TcpProxy(host, int(port)) as proxy, open_backends(settings) as backends:
        broker_through_proxy["port"] = proxy.port
        worker = Worker(backends, ScriptedProvider([reply("done")]), {"writer": agent})
        ended = asyncio.Event()

        def listen(events: Sequence[Event]) -> None:
            if any(isinstance(e, RunFinished) for e in events):
                ended.set()

        worker.append_listeners.append(listen)
        commit = worker_module._Offsets.commit
        cut = False

        async def cut_before_committing(
            offsets: worker_module._Offsets,
            consumer: AIOKafkaConsumer,
            only: Sequence[TopicPartition] | None = None,
        ) -> None:
            """The broker goes away as the worker is about to commit the start it acted on."""
            nonlocal cut
            if ended.is_set() and not cut:
                cut = True
                await proxy.cut()
            await commit(offsets, consumer, only)

        monkeypatch.setattr(worker_module._Offsets, "commit", cut_before_committing)
        stop, ready = asyncio.Event(), asyncio.Event()
        serving = asyncio.create_task(
            worker.serve_kafka(
                stop,
                bootstrap_servers=f"127.0.0.1:{proxy.port}",
                topic=requests_topic,
                group_id=f"{requests_topic}.workers",
                session_timeout_ms=6000,
                on_ready=ready.set,
                accept_unsigned=True,
            )
        )
        try:
            await asyncio.wait_for(ready.wait(), 60)
            async with Requests(
                f"127.0.0.1:{proxy.port}", requests_topic, partitions=backends.log.partitions
            ) as requests:
                await requests.submit(StartRun(run_id="r", tenant=TENANT, agent="writer"))
            await until(lambda: cut, "the cut as the worker commits")
            await asyncio.sleep(2 * LEAVE_S)  # the commit is waiting on the broker now
            stop.set()
            began = time.monotonic()
            await asyncio.wait_for(asyncio.shield(serving), 6 * LEAVE_S + 10)
            assert time.monotonic() - began < 6 * LEAVE_S + 10
        finally:
            stop.set()
            await proxy.restore()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(serving, 60)
        assert (await worker.runner.inspect("r", tenant=TENANT)).status == "completed"
