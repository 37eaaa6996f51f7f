"""Throwaway Kafka topics, so tests never read each other's records."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiokafka.admin import AIOKafkaAdminClient


def new_topic_name() -> str:
    """A topic name no other test uses."""
    return f"onward.test.{uuid.uuid4().hex[:12]}"


async def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` if it exists (a test may never have created it)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if topic in await admin.list_topics():
            await admin.delete_topics([topic])
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
