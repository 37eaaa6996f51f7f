"""``ONWARD_FRONTIER_STORE``: where the kafka backend keeps its frontiers, PostgreSQL or Redis.

With ``redis`` the projector process folds into `RedisFrontierStore`, and the commands that
read frontiers (``onward runs``, the stores `open_backends` opens) read them there.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

import pytest
from support.deployment import kafka_settings
from support.histories import append_all, assert_stored_is_the_direct_fold, run_ids_of, workload
from support.servers import KafkaServers
from typer.testing import CliRunner

from onward.errors import ConfigurationError
from onward.projections.base import DEFAULT_CONSUMER
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.redis import RedisFrontierStore
from onward.runtime.backends import open_backends
from onward.runtime.cli import app
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
            if projector.returncode is None:
                projector.send_signal(signal.SIGTERM)
            _, stderr = await projector.communicate()
        assert projector.returncode == 0, stderr.decode()
        await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
    listing = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "onward", "runs", "--json"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    listed, _ = await listing.communicate()
    assert listing.returncode == 0, listed.decode()
    assert all(run_id in listed.decode() for run_id in run_ids_of(steps))


def test_gc_says_it_cannot_collect_redis_frontiers_rather_than_report_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "ONWARD_BACKEND": "kafka",
        "ONWARD_FRONTIER_STORE": "redis",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "DATABASE_URL": "postgresql://onward@127.0.0.1:1/onward",
    }.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["gc", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        "ConfigurationError: ONWARD_FRONTIER_STORE=redis: onward gc does not collect frontier "
        "keys in Redis yet, so it would find no finished run; nothing was collected"
    )
