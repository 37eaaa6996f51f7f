"""Which transport an application's requests to the fleet take, by backend: the Kafka topic
(`Requests`) or the PostgreSQL table (`PostgresRequests`)."""

from __future__ import annotations

from onward.errors import ConfigurationError
from onward.runtime.settings import Settings

from .requests import Requests
from .requests_postgres import PostgresRequests


def request_sender(settings: Settings) -> Requests | PostgresRequests:
    """The deployment's requests transport, not opened yet, signing with its request key.

    Raises:
        ConfigurationError: A backend with no fleet to send requests to (SQLite, memory).
    """
    if settings.backend == "kafka":
        return Requests(
            settings.kafka_connection(),
            settings.requests_topic,
            partitions=settings.partitions,
            signer=settings.request_signer(),
        )
    if settings.backend == "postgres":
        return postgres_requests(settings)
    raise ConfigurationError(
        f"ONWARD_BACKEND={settings.backend} has no fleet to send requests to: its workers only "
        "carry runs on (use kafka or postgres for a fleet that takes requests)"
    )


def postgres_requests(settings: Settings) -> PostgresRequests:
    """The PostgreSQL requests table on ``DATABASE_URL``, not opened yet, signing with the
    deployment's request key."""
    return PostgresRequests(
        settings.require_database_url(),
        schema=settings.database_schema,
        signer=settings.request_signer(),
        timeout_s=settings.backend_timeout,
    )


__all__ = ["postgres_requests", "request_sender"]
