"""An append Kafka did not acknowledge in time may still land: a read of its partition made
afterwards must not say it is missing while the producer still holds it, or a writer that
reads the log back to decide whether to append the batch again (`RunWriter.read_back`) writes
it twice. Real Kafka behind a `TcpProxy` that drops everything for a while.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.kafka import broker_redirected
from support.proxy import TcpProxy

from onward.errors import BackendUnavailableError
from onward.eventlog import KafkaEventLog
from onward.testing.eventlog import new_run_id, seqs, step_events

pytestmark = pytest.mark.kafka


@pytest.fixture
def broker_through_proxy(kafka_bootstrap: str) -> Iterator[dict[str, int]]:
    """Clients are told the proxy's address for the broker once the test puts its port here."""
    with broker_redirected(kafka_bootstrap) as proxied:
        yield proxied


async def test_a_read_after_an_unacknowledged_append_sees_the_batch_that_then_lands(
    kafka_bootstrap: str, kafka_topic: str, broker_through_proxy: dict[str, int]
) -> None:
    """The network drops everything past the request timeout, so the append fails saying the
    batch may still land; the idempotent producer keeps it and sends it once the way is open.
    Reading the run then (a writer's read-back) must find the batch, not report it missing
    and so have it appended a second time: seq 2 twice in the run's log."""
    host, _, port = kafka_bootstrap.rpartition(":")
    run_id = new_run_id()
    async with TcpProxy(host, int(port)) as proxy:
        broker_through_proxy["port"] = proxy.port
        log = KafkaEventLog(
            f"127.0.0.1:{proxy.port}", topic=kafka_topic, partitions=2, request_timeout_s=1.0
        )
        async with log:
            await log.append(step_events(run_id, 1))
            await proxy.cut(silent=True)
            with pytest.raises(BackendUnavailableError, match="may still land"):
                await log.append(step_events(run_id, 1, first_seq=2))
            await proxy.restore()
            read_back = seqs(await log.read_run(run_id))
            if 2 not in read_back:  # as `RunWriter.read_back` decides: not there, so again
                await log.append(step_events(run_id, 1, first_seq=2))
            assert seqs(await log.read_run(run_id)) == [1, 2]
            assert read_back == [1, 2]
