"""The sweepers a deployment's `Settings` name: what ``onward gc`` and a `GarbageCollector`
built without stores collect from.

``sqlite``: the SQLite file; ``kafka`` and ``postgres``: PostgreSQL (``DATABASE_URL``), and the
frontier keys in Redis with ``ONWARD_FRONTIER_STORE=redis``; with
``REDIS_URL`` set, the Redis keys of leases, fences and the MCP schema cache too. ``memory``
keeps nothing past the process, so there is nothing to collect.
"""

from __future__ import annotations

from onward._storage import check_onward_sqlite
from onward.errors import ConfigurationError
from onward.runtime.settings import Settings

from .base import KeySweeper, RecordSweeper
from .postgres import PostgresRecordSweeper
from .sqlite import SqliteRecordSweeper


def check_collectable(settings: Settings) -> None:
    """Refuse a backend with nothing to collect.

    Raises:
        ConfigurationError: ``ONWARD_BACKEND=memory``.
    """
    if settings.backend == "memory":
        raise ConfigurationError(
            "ONWARD_BACKEND=memory keeps nothing past the process, so there is nothing to "
            "collect; use sqlite (ONWARD_SQLITE_PATH) or kafka"
        )


def record_sweeper(settings: Settings, *, readonly: bool) -> RecordSweeper:
    """The sweeper of the frontier, transcript, `tool_calls`, compaction and lease rows
    (unopened); ``readonly`` opens a SQLite file read-only (a dry run).

    Raises:
        ConfigurationError: The memory backend, a SQLite file that does not exist or is not an
            Onward database, or no usable ``DATABASE_URL`` for kafka (nor ``REDIS_URL`` with
            ``ONWARD_FRONTIER_STORE=redis``, whose frontier keys `RedisFrontierSweeper` collects).
    """
    check_collectable(settings)
    if settings.frontier_store == "redis":
        from .redis_frontiers import RedisFrontierSweeper  # noqa: PLC0415  (redis-py: only here)

        return RedisFrontierSweeper(
            settings.require_redis_url(),
            settings.require_database_url(),
            prefix=settings.redis_prefix,
            schema=settings.database_schema,
            timeout_s=settings.backend_timeout,
        )
    if settings.backend == "sqlite":
        path = settings.sqlite_path
        if not path.exists():
            raise ConfigurationError(
                f"ONWARD_SQLITE_PATH {str(path)!r} does not exist; point it at the database "
                "the runs were written to"
            )
        check_onward_sqlite(path)
        return SqliteRecordSweeper(path, migrate=False, readonly=readonly)
    return PostgresRecordSweeper(
        settings.require_database_url(),
        schema=settings.database_schema,
        max_size=1,
        timeout_s=settings.backend_timeout,
    )


def key_sweeper(settings: Settings) -> KeySweeper | None:
    """The sweeper of the Redis keys (unopened), or ``None`` without ``REDIS_URL``."""
    if not settings.redis_url:
        return None
    from .redis import RedisKeySweeper  # noqa: PLC0415  (redis-py: only with REDIS_URL)

    return RedisKeySweeper(
        settings.require_redis_url(),
        prefix=settings.redis_prefix,
        schema_prefix=settings.schema_cache_prefix,
        timeout_s=settings.backend_timeout,
    )


__all__ = ["check_collectable", "key_sweeper", "record_sweeper"]
