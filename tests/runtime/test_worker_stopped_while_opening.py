"""`onward worker` told to stop while it still opens the PostgreSQL requests table (a pod
stopped during a rollout, PostgreSQL not answering): it stops at once, as it does while it
opens its stores or joins its Kafka group, rather than wait out the whole connect bound and
then exit 5 as though PostgreSQL had failed."""

from __future__ import annotations

import asyncio
import socket

from support.appapi import agents, provider
from support.servers import REQUEST_KEY

from onward.runtime.backends import open_backends
from onward.runtime.cli.worker import _serve
from onward.runtime.fleet.worker import Worker
from onward.runtime.settings import Settings


async def test_a_worker_stopped_while_it_opens_its_requests_table_stops_at_once() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.setblocking(False)
        port = silent.getsockname()[1]
        config = Settings.model_validate(
            {
                "ONWARD_BACKEND": "postgres",
                "DATABASE_URL": f"postgresql://onward:secret@127.0.0.1:{port}/onward",
                "ONWARD_REQUEST_KEY": REQUEST_KEY,
            }
        )
        memory = Settings.model_validate({"ONWARD_BACKEND": "memory"})
        async with open_backends(memory, in_process=True) as backends:
            worker = Worker(backends, provider(), agents, name="w")
            stop = asyncio.Event()
            serving = asyncio.ensure_future(
                _serve(
                    worker,
                    stop,
                    config,
                    requests_topic="unused",
                    group="unused",
                    session_timeout_ms=10_000,
                    signer=config.request_signer(),
                    accept_unsigned=False,
                )
            )
            async with asyncio.timeout(10):
                connected, _ = await asyncio.get_running_loop().sock_accept(silent)
            with connected:
                await asyncio.sleep(0.2)
                assert not serving.done()
                stop.set()
                await asyncio.wait([serving], timeout=3)
                assert serving.done(), "the stopped worker still waits on the requests table"
                assert serving.result() is None
