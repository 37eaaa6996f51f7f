"""Throwaway Redis key prefixes, so tests never see each other's keys."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis


async def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix``."""
    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@asynccontextmanager
async def fresh_prefix(url: str) -> AsyncIterator[str]:
    """Yield a key prefix no other test uses; delete its keys afterwards."""
    prefix = f"onward-test-{uuid.uuid4().hex}:"
    try:
        yield prefix
    finally:
        await delete_prefix(url, prefix)
