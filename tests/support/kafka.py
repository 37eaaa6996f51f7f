"""Throwaway Kafka topics, so tests never read each other's records."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, NodeNotReadyError, RequestTimedOutError

DELETE_ATTEMPTS = 5
"""How often a topic's deletion is asked before the error is the test's: an admin client just
started may send to a broker connection that is not ready yet (``NodeNotReadyError``)."""


def new_topic_name() -> str:
    """A topic name no other test uses."""
    return f"onward.test.{uuid.uuid4().hex[:12]}"


async def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` if it exists (a test may never have created it)."""
    for attempt in range(1, DELETE_ATTEMPTS + 1):
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            if topic in await admin.list_topics():
                await admin.delete_topics([topic])
            return
        except (NodeNotReadyError, RequestTimedOutError, KafkaConnectionError):
            if attempt == DELETE_ATTEMPTS:
                raise
        finally:
            await admin.close()
        await asyncio.sleep(0.2 * attempt)


@asynccontextmanager
async def fresh_topic(bootstrap: str) -> AsyncIterator[str]:
    """Yield a new topic's name; delete the topic afterwards, if it was created."""
    topic = new_topic_name()
    try:
        yield topic
    finally:
        await delete_topic(bootstrap, topic)
