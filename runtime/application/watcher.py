"""One look at the log for every stream of a fleet application.

In fleet mode the runs are driven by worker processes, so an application hears of an append
only by looking. Each stream looking for itself costs the log one read per stream per poll
(on Kafka, two offset requests and a fetch each), most of them finding nothing. The watcher
instead asks, once per poll for all of them, which runs were appended to in the partitions the
live streams' runs are in since its last look (`partition_runs_appended`: one query on
PostgreSQL; on Kafka one offsets request and a fetch of the new records' keys per partition that
moved), and wakes the streams of those runs; those streams then read their run. While the
watcher answers, a stream looks for itself only every `WATCHED_NAP_S`; while it does not,
streams poll on their own as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping

from onward.errors import OnwardError
from onward.eventlog.base import (
    Appended,
    EventLog,
    partition_ends,
    partition_for,
    partition_runs_appended,
)

from .stream import RunStream

_log = logging.getLogger("onward.app")

WATCHED_NAP_S = 5.0
"""The longest a stream waits between looks of its own while the watcher answers: a net under
a wake that did not come (the watcher only wakes, it never reads a run)."""

RETRY_S = 1.0
"""How long the watcher waits after a look the log did not answer."""


class LogWatcher:
    """Wakes the streams of the runs appended to since its last look (every stream of a
    partition when which runs is unknown: its first look, or too much appended).

    Args:
        log: The log the streams read.
        interval_s: How often it looks (the application's ``poll_s``).
        streams: The live streams, each time it looks.
    """

    def __init__(
        self, log: EventLog, *, interval_s: float, streams: Callable[[], Iterable[RunStream]]
    ) -> None:
        self._log = log
        self._interval_s = interval_s
        self._streams = streams
        self._ends: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None
        self.answering = False
        """Whether its last look was answered: streams may then rely on it to be woken."""

    def watch(self) -> None:
        """Look from now on, while any stream is live (started again once one is after that)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch(), name="onward-log-watcher")

    async def close(self) -> None:
        """Stop looking."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.answering = False

    async def _watch(self) -> None:
        while True:
            by_partition: dict[int, list[RunStream]] = {}
            for stream in self._streams():
                if not stream.ended:
                    partition = partition_for(stream.run_id, self._log.partitions)
                    by_partition.setdefault(partition, []).append(stream)
            if not by_partition:
                self.answering = False
                return
            try:
                moved = await self._look(by_partition)
            except Exception as exc:  # noqa: BLE001 - streams rely on its wakes while it answers
                # Any failure, not only the log's own errors: a driver error it did not
                # translate, or a bug, must not end the watcher still said to answer.
                if self.answering:
                    _log.warning(
                        "watching the log for %d streams failed, each looks for itself until "
                        "it answers again: %s",
                        sum(map(len, by_partition.values())),
                        exc,
                        exc_info=not isinstance(exc, OnwardError),
                    )
                self.answering = False
                self._ends.clear()  # what moved meanwhile is unknown: every stream is woken
                await asyncio.sleep(max(self._interval_s, RETRY_S))
                continue
            for partition, appended in moved.items():
                self._ends[partition] = appended.end
                for stream in by_partition[partition]:
                    if appended.runs is None:
                        stream.wake(vaguely=True)
                    elif stream.run_id in appended.runs:
                        stream.wake()
            self.answering = True
            await asyncio.sleep(self._interval_s)

    async def _look(self, by_partition: Mapping[int, object]) -> dict[int, Appended]:
        """What each watched partition gained since the last look: the runs appended to
        (unknown for a partition it had not looked at yet, whose streams are all woken)."""
        seen = {p: self._ends[p] for p in by_partition if p in self._ends}
        unseen = [p for p in by_partition if p not in self._ends]
        moved = (
            {
                p: appended
                for p, appended in (await partition_runs_appended(self._log, seen)).items()
                if appended.end != seen[p]
            }
            if seen
            else {}
        )
        if unseen:
            ends = await partition_ends(self._log, unseen)
            moved.update((p, Appended(end, None)) for p, end in ends.items())
        return moved
