"""`--metrics-port` and `--metrics-host` of `onward worker` and `onward projector`: the
metrics, health and readiness server for as long as the command runs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated

import typer
from prometheus_client.registry import Collector

from onward.errors import InvalidInputError, LogTruncatedError
from onward.projections.base import ProjectionSink
from onward.runtime.backends import Backends
from onward.runtime.observability import (
    HealthServer,
    ProjectorCollector,
    Readiness,
    Refresh,
    probe,
    process_registry,
)

from ._common import err

if TYPE_CHECKING:
    from onward.projections.kafka import KafkaProjector

MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Serve /metrics (Prometheus), /healthz and /readyz on this port (0: a free "
        "port, printed); without it, nothing is served.",
        min=0,
        max=65535,
    ),
]
MetricsHostOption = Annotated[
    str, typer.Option("--metrics-host", help="The address the metrics server binds.")
]

PROBE_RUN = "onward.readiness-probe"
"""The run id readiness asks the lease store about (it never holds a lease)."""
PROBE_CONSUMER = "onward.readiness-probe"
"""The consumer readiness reads the frontier store's positions of (it never stores any)."""


async def stores_reachable(backends: Backends) -> str | None:
    """``None`` if the log, the frontier store, the lease store and the spend ledger each
    answer a read within the readiness bound; else one line naming the first that did not.

    The spend ledger is asked for ``DATABASE_URL``, which keeps it, the blobs and the
    compaction rows: with Kafka and Redis frontiers and leases nothing else asks it.
    """
    checks: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        (f"the event log ({backends.settings.backend})", lambda: backends.log.bounds(0)),
        ("the frontier store", lambda: backends.frontiers.positions(PROBE_CONSUMER)),
        ("the lease store", lambda: backends.leases.current(PROBE_RUN)),
        ("the spend ledger", lambda: backends.spend.run_total(PROBE_RUN)),
    ]
    for name, check in checks:
        why = await probe(name, check())
        if why is not None:
            return why
    return None


@contextlib.asynccontextmanager
async def metrics_served(
    port: int | None,
    host: str,
    *,
    ready: Readiness,
    refresh: Refresh | None = None,
    collectors: Sequence[Collector] = (),
) -> AsyncIterator[HealthServer | None]:
    """Serve metrics, health and readiness while the block runs (nothing if ``port`` is None).

    Prints one line saying where it serves. The collectors are added to the process's
    registry for the block only.

    Raises:
        InvalidInputError: The address cannot be bound.
    """
    if port is None:
        yield None
        return
    registry = process_registry()
    for collector in collectors:
        registry.register(collector)
    server = HealthServer(registry, ready=ready, refresh=refresh, host=host, port=port)
    try:
        try:
            await server.start()
        except OSError as exc:
            raise InvalidInputError(
                f"--metrics-port: cannot serve on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        err.print(
            f"metrics on {server.url}/metrics, health on /healthz, readiness on /readyz",
            soft_wrap=True,
        )
        yield server
    finally:
        await server.close()
        for collector in collectors:
            registry.unregister(collector)


class ProjectorHealth:
    """The projector's lag as last measured, its readiness, and the refresh before a scrape.

    Args:
        projector: The running projector.
        max_lag: Ready only while no assigned partition is more events behind than this.
        store: The server its projection stores in, as readiness names it when it does not
            answer (``Redis`` for a Redis frontier store).
    """

    def __init__(
        self, projector: KafkaProjector[ProjectionSink], max_lag: int, *, store: str = "PostgreSQL"
    ) -> None:
        self.projector = projector
        self.max_lag = max_lag
        self.store = store
        self.lag: dict[int, int] = {}

    def collector(self) -> ProjectorCollector:
        """The lag and the projection's counters, for the registry."""
        return ProjectorCollector(
            self.lag, lambda: getattr(self.projector.projection, "stats", None)
        )

    async def refresh(self, stored: Mapping[int, int] | None = None) -> None:
        """Measure the lag of every assigned partition (PostgreSQL and Kafka are asked; only
        Kafka when ``stored`` gives the store's positions)."""
        measured = await self.projector.lag(stored)
        self.lag.clear()
        self.lag.update(measured)

    async def ready(self) -> str | None:
        """The store and Kafka answer, the projector is in its consumer group, can fold on (no
        partition's start moved past where it reads), and the lag is under the bound.

        The store's positions are read once, under the store's probe: read again under
        Kafka's, a slow store was said to be Kafka not answering."""
        stored: dict[int, int] = {}

        async def positions() -> None:
            stored.update(await self.projector.projection.positions())

        why = await probe(self.store, positions())
        if why is not None:
            return why
        why = await self._measured(stored)
        if why is not None:
            return why
        if not self.projector.joined:
            # No partition of its own yet: ready now, it would say so before folding anything.
            return "not in the projectors' consumer group yet (or rebalancing)"
        if not self.lag:
            return None  # more projectors than partitions: this one has none to fold
        partition, behind = max(self.lag.items(), key=lambda item: item[1])
        if behind > self.max_lag:
            return (
                f"partition {partition} is {behind} events behind, over --ready-max-lag "
                f"{self.max_lag}"
            )
        return None

    async def _measured(self, stored: Mapping[int, int]) -> str | None:
        """Measure the lag (`refresh`); None, or why the projector is not ready: Kafka did not
        answer, or a partition's start moved past where it reads, so it cannot fold on."""
        cut: list[LogTruncatedError] = []

        async def measured() -> None:
            try:
                await self.refresh(stored)
                found = await self.projector.cut(stored)
            except LogTruncatedError as exc:  # kept from a seek: Kafka answered
                found = exc
            if found is not None:
                cut.append(found)

        why = await probe("Kafka", measured())
        if why is None and cut:
            return f"cannot fold on: {cut[0]}"
        return why
