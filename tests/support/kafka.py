"""Throwaway Kafka topics, so tests never read each other's records."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiokafka.cluster
from aiokafka.admin import AIOKafkaAdminClient


def new_topic_name() -> str:
    """A topic name no other test uses."""
    return f"onward.test.{uuid.uuid4().hex[:12]}"


_UNKNOWN_TOPIC_OR_PARTITION = 3
_DELETION_DEADLINE_S = 30.0


async def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` if it exists and return once the broker no longer lists it.

    The controller answers a deletion before every broker's metadata has caught up, and a
    topic created a moment ago may not be listed yet, so this always asks for the deletion
    (an unknown topic is no error) and then waits until listing agrees.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.delete_topics([topic])
        for name, error_code in response.topic_error_codes:
            if error_code not in (0, _UNKNOWN_TOPIC_OR_PARTITION):
                raise RuntimeError(f"deleting topic {name!r} failed: Kafka error code {error_code}")
        deadline = time.monotonic() + _DELETION_DEADLINE_S
        while topic in await admin.list_topics():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"topic {topic!r} still listed {_DELETION_DEADLINE_S:.0f} s after its deletion"
                )
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


@asynccontextmanager
async def fresh_topic(bootstrap: str) -> AsyncIterator[str]:
    """Yield a new topic's name; delete the topic afterwards, if it was created."""
    topic = new_topic_name()
    try:
        yield topic
    finally:
        await delete_topic(bootstrap, topic)


@contextmanager
def broker_redirected(bootstrap: str) -> Iterator[dict[str, int]]:
    """For the block, clients are told another address for the broker at ``bootstrap`` (it
    advertises its own) once the test puts a port in the dict it yields: a `TcpProxy`'s, so
    the test can cut the way to the broker without touching the broker."""
    port = int(bootstrap.rpartition(":")[2])
    proxied: dict[str, int] = {}
    original = aiokafka.cluster.ClusterMetadata.broker_metadata

    def broker_metadata(self: Any, broker_id: Any) -> Any:
        found = original(self, broker_id)
        if found is not None and "port" in proxied and found.port == port:
            return found._replace(host="127.0.0.1", port=proxied["port"])
        return found

    aiokafka.cluster.ClusterMetadata.broker_metadata = broker_metadata
    try:
        yield proxied
    finally:
        aiokafka.cluster.ClusterMetadata.broker_metadata = original


async def group_members(bootstrap: str, group: str) -> int:
    """How many members the broker counts in ``group``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    return sum(len(g[-1]) if isinstance(g[-1], list) else 0 for g in described.groups)
