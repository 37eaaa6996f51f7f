"""``ONWARD_FRONTIER_STORE``: where the kafka backend keeps its frontiers, PostgreSQL or Redis.

With ``redis`` the projector process folds into `RedisFrontierStore`, and the commands that
read frontiers (``onward runs``, the stores `open_backends` opens) read them there, and
``onward gc`` collects finished runs' keys there.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys

import pytest
from support.deployment import kafka_settings
from support.histories import append_all, assert_stored_is_the_direct_fold, run_ids_of, workload
from support.processes import reaped, terminated
from support.servers import KafkaServers

from onward.errors import ConfigurationError
from onward.projections.base import DEFAULT_CONSUMER
from onward.projections.frontier import TERMINAL_STATUSES
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.redis import RedisFrontierStore
from onward.runtime.backends import open_backends
from onward.runtime.settings import Settings

PARTITIONS = 3


def test_an_unknown_store_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_FRONTIER_STORE", "mongo")
    with pytest.raises(ConfigurationError) as refused:
        Settings()
    assert "\n" not in str(refused.value)
    assert "ONWARD_FRONTIER_STORE (frontier_store)" in str(refused.value)
    assert "'postgres' or 'redis'" in str(refused.value)


def test_redis_frontiers_need_the_kafka_backend_and_a_redis_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ConfigurationError, match="needs ONWARD_BACKEND=kafka; the sqlite"):
        Settings(frontier_store="redis", redis_url="redis://127.0.0.1:6379/0")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="ONWARD_FRONTIER_STORE=redis needs REDIS_URL"):
        Settings(backend="kafka", frontier_store="redis")


@pytest.mark.kafka
async def test_the_backends_open_the_store_the_setting_names(kafka_servers: KafkaServers) -> None:
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
    for name, kind in (("postgres", PostgresFrontierStore), ("redis", RedisFrontierStore)):
        settings = kafka_settings(kafka_servers, PARTITIONS, frontier_store=name)
        async with open_backends(settings) as backends:
            assert isinstance(backends.frontiers, kind)
    redis = kafka_settings(kafka_servers, PARTITIONS, frontier_store="redis")
    async with open_backends(redis) as backends:
        assert isinstance(backends.frontiers, RedisFrontierStore)
        assert backends.frontiers.prefix == kafka_servers.redis_prefix


@pytest.mark.kafka
async def test_the_projector_process_folds_into_redis_and_runs_lists_from_it(
    kafka_servers: KafkaServers, rng: random.Random
) -> None:
    env = {
        **os.environ,
        **kafka_servers.env(partitions=PARTITIONS),
        "ONWARD_FRONTIER_STORE": "redis",
    }
    steps = workload(rng, 12)
    async with (
        kafka_servers.log(partitions=PARTITIONS) as log,
        RedisFrontierStore(kafka_servers.redis_url, prefix=kafka_servers.redis_prefix) as store,
    ):
        await append_all(log, steps)
        ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
        projector = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "onward",
            "projector",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(90):
                while True:
                    stored = await store.positions(DEFAULT_CONSUMER)
                    if all(stored.get(p, 0) >= end for p, end in ends.items()):
                        break
                    assert projector.returncode is None, "the projector stopped"
                    await asyncio.sleep(0.2)
        finally:
            _, stderr = await terminated(projector, within_s=60)
        assert projector.returncode == 0, stderr.decode()
        await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
    async with reaped() as children:
        listing = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "onward", "runs", "--json"),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        children.append(listing)
        listed, _ = await asyncio.wait_for(listing.communicate(), 60)
    assert listing.returncode == 0, listed.decode()
    assert all(run_id in listed.decode() for run_id in run_ids_of(steps))

    # `onward gc` collects the finished runs' keys in Redis (a ttl of a few microseconds, so
    # every finished run is past it), and leaves every other run's.
    async with RedisFrontierStore(
        kafka_servers.redis_url, prefix=kafka_servers.redis_prefix
    ) as store:
        finished = {s.run_id for s in await store.runs(statuses=TERMINAL_STATUSES)}
        assert finished, "the workload finished no run"
        others = {s.run_id for s in await store.runs()} - finished
        counts: list[dict[str, int]] = []
        for dry_run in (True, False):
            async with reaped() as children:
                collecting = await asyncio.create_subprocess_exec(
                    *(sys.executable, "-m", "onward", "gc", "--checkpoint-ttl-days", "1e-10"),
                    *(["--dry-run"] if dry_run else []),
                    "--json",
                    env=env,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
                children.append(collecting)
                said, _ = await asyncio.wait_for(collecting.communicate(), 60)
            assert collecting.returncode == 0, said.decode()
            report = json.loads(said)
            assert report["kept"] == []
            counts.append(report["counts"])
        assert counts[0] == counts[1]
        assert counts[1]["frontiers"] == len(finished)
        assert {s.run_id for s in await store.runs()} == others
        assert await store.summaries(finished) == {}
