"""Driver log records in one line: a server that is down is news, its stack trace is not.

While a server is unreachable the drivers log what they retry (asyncpg restoring its pool,
aiokafka reconnecting to a broker), some of it with the exception's traceback attached. Those
records are expected and repeated, so :func:`one_line_driver_logs` puts a filter on the
drivers' loggers that folds the exception into the message: one line per record, still naming
what failed. Nothing else about the records changes (level, logger, message).
"""

from __future__ import annotations

import logging

DRIVER_LOGGERS = (
    "aiokafka",
    "aiokafka.admin.client",
    "aiokafka.cluster",
    "aiokafka.conn",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
    "asyncpg.pool",
    "redis.asyncio.connection",
)
"""The loggers the drivers log reconnects and retries on (a filter applies to its own logger
only, not to the loggers below it)."""


class OneLine(logging.Filter):
    """Folds a record's exception into its message, so it prints as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            detail = str(exc).replace("\n", " ")
            record.msg = f"{record.getMessage()} ({type(exc).__name__}: {detail})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


_FILTER = OneLine()


def one_line_driver_logs() -> None:
    """Put the :class:`OneLine` filter on every driver logger; doing it again changes nothing."""
    for name in DRIVER_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
