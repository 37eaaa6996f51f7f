"""The class of every pooled PostgreSQL connection, apart so that asyncpg, which it derives
from, is imported only when a pool is opened (`open_pool`)."""

from __future__ import annotations

import asyncpg


class PooledConnection(asyncpg.Connection):  # type: ignore[misc]
    """A pooled connection given back without a round trip, unless it was marked for one.

    asyncpg resets every connection it takes back (advisory locks, cursors, ``LISTEN``,
    session settings) with one more statement, as many as every other call makes together.
    Onward's own statements change no session state on a pooled connection: their settings
    are ``SET LOCAL``, their cursors live in transactions, they never ``LISTEN``; what a
    transaction left open is still rolled back by asyncpg. A connection that held an
    `AdvisoryLock` is marked to unlock on its way back, and one handed to code that is not
    Onward's (a user projection's ``apply``) to get asyncpg's whole reset.
    """

    _reset_on_release = ""

    def release_session_locks(self) -> None:
        """Unlock every advisory lock of the session when the pool takes the connection back."""
        self._reset_on_release = self._reset_on_release or "SELECT pg_advisory_unlock_all()"

    def reset_session(self) -> None:
        """Reset the whole session (asyncpg's own reset) when the pool takes it back."""
        self._reset_on_release = super().get_reset_query()

    def get_reset_query(self) -> str:
        query, self._reset_on_release = self._reset_on_release, ""
        return str(query)
