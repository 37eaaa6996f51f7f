"""How a lock every process sees (`FileLock`, `AdvisoryLock`) is waited for: never in silence,
never without end unless asked to.

Such a lock covers a few milliseconds of work, so a wait of more than a second means its holder
is slow, paused (a stopped process, a frozen machine) or stuck: the waiter says so once, naming
the lock, its holder and when it gives up, and at that moment fails with
`BackendUnavailableError`, as a statement that outlives its timeout does.

Once a wait for a lock has given up, the process remembers it: until the lock is next taken,
each wait for it lasts at most `STUCK_WAIT_S`, so a holder paused for minutes costs every later
wait a second, not a whole timeout each (waits queued behind one another would otherwise add
their timeouts up).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from onward.errors import BackendUnavailableError

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("onward.locks")

LOCK_TIMEOUT_S = 30.0
"""How long a lock is waited for by default before the wait fails."""

SAY_AFTER_S = 1.0
"""How long a lock is waited for before the wait is said in the log."""

STUCK_WAIT_S = 1.0
"""The longest a wait lasts for a lock whose last wait in this process gave up, until the lock
is taken again."""

_GAVE_UP: dict[str, float] = {}
"""Locks (by what they are) whose last wait gave up, and when (epoch seconds)."""


def lock_taken(what: str) -> None:
    """The lock ``what`` was taken: later waits for it last their whole timeout again."""
    _GAVE_UP.pop(what, None)


class LockWait:
    """One wait for a lock: its deadline, and the one line it logs once it has lasted.

    Args:
        what: The lock, for messages ("the fold lock of /data/onward.db").
        timeout_s: The longest the wait lasts; ``None`` waits until the lock is free.
        holder: Describes who holds the lock now ("pid 412 on host-a since 12:00:03 UTC"),
            or returns "" when that cannot be told.
    """

    def __init__(
        self, what: str, timeout_s: float | None, holder: Callable[[], Awaitable[str]]
    ) -> None:
        self.what = what
        self._timeout_s = timeout_s
        self._gave_up_at = _GAVE_UP.get(what) if timeout_s is not None else None
        if self._gave_up_at is not None and timeout_s is not None:
            timeout_s = min(timeout_s, STUCK_WAIT_S)
        self._bound_s = timeout_s
        self._holder = holder
        self._started = time.monotonic()
        self._said = False

    def remaining(self) -> float | None:
        """Seconds left before the wait gives up (``None``: no limit)."""
        if self._bound_s is None:
            return None
        return max(0.0, self._bound_s - (time.monotonic() - self._started))

    def taken(self) -> None:
        """The lock was taken (`lock_taken`)."""
        lock_taken(self.what)

    async def not_yet(self) -> None:
        """Called after each try that did not get the lock: says the wait once it has lasted
        `SAY_AFTER_S`, and ends it once the timeout has passed.

        Raises:
            BackendUnavailableError: The lock was not free within ``timeout_s``.
        """
        waited = time.monotonic() - self._started
        remaining = self.remaining()
        if remaining is not None and remaining <= 0:
            holder = await self._holder()
            held_by = f" (held by {holder})" if holder else ""
            if self._gave_up_at is not None:
                raise BackendUnavailableError(
                    f"{self.what} is still not free{held_by}: a wait of {self._timeout_s:g} s "
                    f"for it gave up at {_clock(self._gave_up_at)}, and until it is taken again "
                    f"it is waited for {STUCK_WAIT_S:g} s at most; the same call may succeed "
                    "once its holder lets go"
                )
            _GAVE_UP[self.what] = time.time()
            raise BackendUnavailableError(
                f"{self.what} was not free within {self._timeout_s:g} s{held_by}: its holder "
                "is slow, paused or stuck; the same call may succeed once it lets go"
            )
        if self._said or waited < SAY_AFTER_S:
            return
        self._said = True
        holder = await self._holder()
        until = (
            "until it is free (no timeout set)"
            if remaining is None
            else "until " + _clock(time.time() + remaining) + f", {self._bound_s:g} s in all"
        )
        log.warning(
            "waiting for %s%s, %s",
            self.what,
            f", held by {holder}" if holder else "",
            until,
        )


def _clock(epoch_s: float) -> str:
    """A moment as a wall-clock time, for a person reading the log."""
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%H:%M:%S UTC")


def holder_record() -> str:
    """What a holder writes where waiters can read it: its pid, host and since when."""
    return f"pid {os.getpid()} on {socket.gethostname()} since {_clock(time.time())}"


async def bound_lock_waits(conn: asyncpg.Connection, seconds: float) -> None:
    """Within the transaction ``conn`` is in, give up waiting for a lock after ``seconds``
    (``lock_timeout``; the statement then fails with ``asyncpg.LockNotAvailableError``): a
    session left open holding a table would otherwise keep the statement, and every one queued
    behind it, waiting in silence. What the statement does once it holds its locks is not
    bounded."""
    await conn.execute(
        "SELECT set_config('lock_timeout', $1, true)", f"{max(1, math.ceil(seconds * 1000))}ms"
    )
