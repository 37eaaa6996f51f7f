"""`onward projector` and `onward projections rebuild`: the log folded into PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from onward.errors import BackendUnavailableError, ConfigurationError, InvalidInputError
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.eventlog.base import EventLog
from onward.eventlog.postgres import PostgresEventLog
from onward.projections.base import ProjectionSink
from onward.projections.compaction import LogCut, PostgresCompactionStore
from onward.projections.frontier_projection import DEFAULT_CACHE_BYTES, FrontierProjection
from onward.projections.postgres import PROJECTION
from onward.projections.postgres_sql import Projection, SqlProjectionSink, as_projection
from onward.projections.projector_defaults import (
    CAUGHT_UP_STORE_S,
    FOCUS_SLICE_S,
    PROJECTOR_FLUSH_EVENTS,
    PROJECTOR_FLUSH_INTERVAL,
)
from onward.projections.rebuild import RebuildReport, rebuild_frontiers, rebuild_projection
from onward.runtime.backends import kafka_frontier_store
from onward.runtime.settings import Settings, load_settings

from ._common import (
    KAFKA_MAX_MS,
    ArchiveOption,
    JsonResultOption,
    echo_json,
    err,
    imported,
    opened,
    out,
    run_until_terminated,
    stopped_before_the_loop,
    within,
)
from ._health import MetricsHostOption, MetricsPortOption, ProjectorHealth, metrics_served

if TYPE_CHECKING:
    from onward.eventlog.kafka import KafkaEventLog
    from onward.projections.kafka import KafkaProjector

_log = logging.getLogger("onward.projector")


def load_projection(spec: str) -> Projection:
    """The user projection ``--projection`` names: an instance or a class."""
    return as_projection(imported(spec, "--projection"), spec)


def _kafka_log(config: Settings, *, create_topic: bool) -> KafkaEventLog:
    # Imported here, as the projector's classes are (`projector_command`): `onward --help`
    # imports this module to list the commands, and loads no aiokafka (~170 ms) for that.
    from onward.eventlog.kafka import KafkaEventLog  # noqa: PLC0415

    return KafkaEventLog(
        config.kafka_connection(),
        topic=config.kafka_topic,
        partitions=config.partitions,
        create_topic=create_topic,
    )


def _retained_log(config: Settings) -> tuple[str, EventLog]:
    """The configured log a rebuild reads (unopened), and what it is called in messages."""
    if config.backend == "postgres":
        log = PostgresEventLog(
            config.require_database_url(),
            schema=config.database_schema,
            partitions=config.partitions,
            timeout_s=config.backend_timeout,
        )
        return "the PostgreSQL event log", log
    return "Kafka", _kafka_log(config, create_topic=False)


def projector_command(
    *,
    projection: Annotated[
        str | None,
        typer.Option(help="A user projection, package.module:attribute (default: frontiers)."),
    ] = None,
    group: Annotated[
        str | None, typer.Option(help="Consumer group shared by all projectors of one projection.")
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Most records folded per batch.")] = 5_000,
    session_timeout_ms: Annotated[
        int, typer.Option(min=1, max=KAFKA_MAX_MS, help="Group session timeout.")
    ] = 10_000,
    flush_events: Annotated[
        int,
        typer.Option(
            min=0,
            help="Frontiers: while working through a backlog, store after folding this many "
            "events (0: store every batch). A projector that has caught up stores every batch.",
        ),
    ] = PROJECTOR_FLUSH_EVENTS,
    flush_interval: Annotated[
        float,
        typer.Option(
            min=0, help="Frontiers: store at least this often, in seconds, while folding."
        ),
    ] = PROJECTOR_FLUSH_INTERVAL,
    cache_mib: Annotated[
        int,
        typer.Option(
            min=1,
            help="Frontiers: the memory budget, in MiB, of the frontiers kept between batches "
            "and of those folded and not stored yet; a store comes due when it is full. About "
            "twice it is held while a store is written behind the fold; beside it, the fetched "
            "records (up to 4 MiB for each assigned partition) and the batch being folded. A "
            "smaller one stores more often, which is slower with many runs.",
        ),
    ] = DEFAULT_CACHE_BYTES // (1024 * 1024),
    caught_up_store_s: Annotated[
        float,
        typer.Option(
            min=0,
            max=KAFKA_MAX_MS // 1000,  # the fetch waits this long for records
            help="Once caught up, store at most this often, in seconds (0: every batch): "
            "fewer PostgreSQL transactions for a frontier that lags the log by this much more.",
        ),
    ] = CAUGHT_UP_STORE_S,
    focus_slice_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="Behind in several partitions, fold one at a time, each for at most this many "
            "seconds or until it is drained, the others behind paused: the runs in play are "
            "one partition's, not the whole topic's, so the memory budget holds them. 0: fold "
            "every partition's records as they arrive.",
        ),
    ] = FOCUS_SLICE_S,
    exit_on_store_loss: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            min=0,
            help="Exit 5 once PostgreSQL (or a Kafka request) has failed for this long, for a "
            "supervisor that restarts it. Default: wait and reconnect for as long as the outage "
            "lasts, saying so once when the store is lost and once when it is back.",
        ),
    ] = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
    ready_max_lag: Annotated[
        int,
        typer.Option(
            help="/readyz: ready only while no partition is more events behind than this.",
            min=0,
        ),
    ] = 1_000,
) -> None:
    """Fold the events topic into PostgreSQL until SIGTERM or SIGINT.

    A store lost while folding is waited out, reconnecting with backoff,
    unless --exit-on-store-loss is given. A store not reached at start is not:
    exit 5, as a wrong address or a server that is not up is no outage.

    Exit 0: stopped cleanly. 2: bad configuration or --projection.
    5: Kafka or PostgreSQL failed at start, or longer than --exit-on-store-loss.
    """
    config = load_settings()
    if config.backend == "postgres":
        raise ConfigurationError(
            "onward projector folds the Kafka events topic; with ONWARD_BACKEND=postgres every "
            "process folds the runs it appends inline, so no projector runs (onward "
            "projections rebuild still folds a new build from the log)"
        )
    if config.backend != "kafka":
        # Nor may it make and fold a topic for a deployment whose runs are in its file: the
        # Kafka settings are checked only for the kafka backend.
        raise ConfigurationError(
            f"onward projector folds the Kafka events topic; with ONWARD_BACKEND="
            f"{config.backend} whoever appends folds the runs inline, so no projector runs "
            "(set ONWARD_BACKEND=kafka on a Kafka deployment)"
        )

    from onward.projections.kafka import (  # noqa: PLC0415  (loads aiokafka: see `_kafka_log`)
        DEFAULT_GROUP,
        KafkaProjector,
        fixed_mmap_threshold,
        quiet_garbage_collector,
    )

    database_url = config.require_database_url()
    user: Projection | None = None

    async def fold(stop: asyncio.Event, folding: asyncio.Event) -> None:
        async with contextlib.AsyncExitStack() as stack:
            log = await stack.enter_async_context(
                opened("Kafka", _kafka_log(config, create_topic=True))
            )
            sink: ProjectionSink
            if user is None:
                store = kafka_frontier_store(config, projector=True)
                compaction = PostgresCompactionStore(
                    database_url,
                    schema=config.database_schema,
                    timeout_s=config.backend_timeout,
                )
                store_server = "Redis" if config.frontier_store == "redis" else "PostgreSQL"
                sink = FrontierProjection(
                    await stack.enter_async_context(opened(store_server, store)),
                    log,
                    cache_bytes=cache_mib * 1024 * 1024,
                    flush_events=flush_events,
                    flush_interval=flush_interval,
                    write_behind=True,
                    compaction=await stack.enter_async_context(opened("PostgreSQL", compaction)),
                )
                default_group = DEFAULT_GROUP
            else:
                user_sink = SqlProjectionSink(
                    database_url,
                    user,
                    schema=config.database_schema,
                    timeout_s=config.backend_timeout,
                )
                store_server = "PostgreSQL"
                sink = await stack.enter_async_context(opened(store_server, user_sink))
                default_group = f"{DEFAULT_GROUP}-{user.name}"
            worker = KafkaProjector(
                config.kafka_connection(),
                sink,
                topic=config.kafka_topic,
                partitions=config.partitions,
                group_id=group or default_group,
                batch_records=batch,
                session_timeout_ms=session_timeout_ms,
                caught_up_store_s=caught_up_store_s,
                store_loss_limit_s=exit_on_store_loss,
                focus_slice_s=focus_slice_s or None,
            )
            stack.push_async_callback(worker.close)
            await within(worker.start(), "Kafka")
            # Connected: a failure to connect was said in one line; from here on, the client's
            # own warnings help whoever runs a long-lived projector, each once in a while.
            logging.getLogger("aiokafka").setLevel(logging.NOTSET)
            for handler in logging.getLogger().handlers:
                handler.addFilter(_Repeats("aiokafka"))
            # PostgreSQL lost from here on is said once when lost and once when back (the
            # projector's lines); the pool's own attempts to reconnect would repeat it.
            logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)
            health = ProjectorHealth(worker, ready_max_lag, store=store_server)
            await stack.enter_async_context(
                metrics_served(
                    metrics_port,
                    metrics_host,
                    ready=health.ready,
                    refresh=health.refresh,
                    collectors=[health.collector()],
                )
            )
            folding.set()  # from here on a signal stops the fold, which stores first
            reporter = asyncio.create_task(_report_lag(worker, stop))
            await worker.run(stop)
            await reporter

    with stopped_before_the_loop("projector stopped before it started folding"):
        if projection is not None:
            user = load_projection(projection)  # a module that connects on import
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        quiet_garbage_collector()
        fixed_mmap_threshold()
        asyncio.run(_until_signalled(fold))


async def _until_signalled(
    fold: Callable[[asyncio.Event, asyncio.Event], Awaitable[None]],
) -> None:
    """Run ``fold(stop, folding)``, ``stop`` set by SIGTERM or SIGINT. One before ``folding``
    is set (connecting, not folding yet) cancels it: a store that does not answer would hold
    the stop for the whole connect bound, then end it as that store's failure (exit 5)."""
    stop, folding = asyncio.Event(), asyncio.Event()
    main = asyncio.current_task()

    def on_signal() -> None:
        stop.set()
        if not folding.is_set() and main is not None:
            main.cancel()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await fold(stop, folding)
    except asyncio.CancelledError:
        if not stop.is_set() or main is None:
            raise
        main.uncancel()
        err.print("projector stopped before it started folding")
        return
    err.print("projector stopped cleanly")


class _Repeats(logging.Filter):
    """Passes each warning or error of the loggers under ``prefix`` once per ``every_s``
    seconds (everything else as it comes).

    A broker that is down makes aiokafka log the same few failures at every reconnect attempt,
    dozens of times a second; each still shows when it first happens, and again while it lasts.
    """

    def __init__(self, prefix: str, every_s: float = 300.0) -> None:
        super().__init__()
        self._prefix = prefix
        self._every_s = every_s
        self._shown: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(self._prefix):
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        if now - self._shown.get(key, -self._every_s) < self._every_s:
            return False
        self._shown[key] = now
        return True


async def _report_lag(worker: KafkaProjector[ProjectionSink], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 10)
        except TimeoutError:
            try:
                lag = await worker.lag()
            except BackendUnavailableError:
                continue  # the projector says when the store is lost and when it is back
            stats = getattr(worker.projection, "stats", None)
            _log.info("lag %d records %s stats %s", sum(lag.values()), lag, stats)


async def _cuts(config: Settings) -> list[LogCut]:
    """The cuts compaction recorded, of every partition."""
    store = PostgresCompactionStore(
        config.require_database_url(),
        schema=config.database_schema,
        timeout_s=config.backend_timeout,
    )
    async with opened("PostgreSQL", store):
        return await store.cuts()


def _refuse_if_gone(cuts: list[LogCut]) -> None:
    """A cut made with --no-archive is gone for good: no archive gives a rebuild what it cut,
    so the new build would miss (or fold with holes) every run it cut into."""
    gone = [c for c in cuts if c.archive is None]
    if gone:
        ranges = ", ".join(f"partition {c.partition} [{c.start}, {c.end})" for c in gone)
        raise InvalidInputError(
            f"compaction cut {sum(c.events for c in gone)} records from the log with "
            f"--no-archive ({ranges}); they are gone, so a rebuild would drop or break every "
            "run they held; the current build stays"
        )


async def _refuse_if_cut(config: Settings) -> None:
    """A log compaction cut folds into runs with holes: refuse it without the archive."""
    cuts = await _cuts(config)
    _refuse_if_gone(cuts)
    if cuts:
        where = sorted({c.archive for c in cuts if c.archive is not None})
        raise InvalidInputError(
            f"compaction cut {sum(c.events for c in cuts)} records from the log; a rebuild from "
            "what is left would miss the start of every run it cut into. Pass --archive DIR"
            + (f" (archived in {', '.join(where)})" if where else "")
        )


async def _refuse_if_not_archived(config: Settings, log: ArchivedEventLog) -> None:
    """An archive that does not reach back to what compaction archived (a mistyped or another
    --archive) folds the same runs with holes as no archive: refuse it too, and a cut made with
    --no-archive, which no archive holds."""
    cuts = await _cuts(config)
    _refuse_if_gone(cuts)
    lowest: dict[int, LogCut] = {}
    for cut in cuts:
        held = lowest.get(cut.partition)
        if cut.archive is not None and (held is None or cut.start < held.start):
            lowest[cut.partition] = cut
    for partition, cut in sorted(lowest.items()):
        reach = (await log.bounds(partition)).start
        if reach > cut.start:
            raise InvalidInputError(
                f"--archive {log.archive.location}: partition {partition} was cut from offset "
                f"{cut.start} and archived in {cut.archive}, but this archive and the log reach "
                f"back to offset {reach} only; a rebuild would miss the start of every run cut "
                "into. Pass the archive compaction wrote"
            )


async def _refuse_if_lost(log: EventLog) -> None:
    """A partition that does not reach back to offset 0 (the log with the archive, if read
    with it) lost records other than by a cut the checks before named: Kafka's retention on a
    topic made by hand, records deleted by an operator. No archive holds them, and a rebuild
    would fold every run begun below from the middle of its history."""
    for partition in range(log.partitions):
        start = (await log.bounds(partition)).start
        if start > 0:
            raise InvalidInputError(
                f"partition {partition} reaches back to offset {start} only: the records below "
                "were deleted, and not by a compaction whose archive is read here (Kafka's "
                "retention on the topic, records deleted by hand); a rebuild would fold every "
                "run begun below from the middle of its history; the current build stays"
            )


def rebuild_command(
    name: Annotated[str, typer.Argument(help="frontiers, or the name of a user projection.")],
    projection: Annotated[
        str | None,
        typer.Option(help="The user projection to rebuild, package.module:attribute."),
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Records read per partition per step.")] = 5_000,
    archive: ArchiveOption = None,
    as_json: JsonResultOption = False,
) -> None:
    """Fold the retained log into a new build of a projection and switch its views to it.
    With --archive, what compaction cut is read back from the archive first, so the new build
    holds every run whole; without it, a log that was cut is refused.

    Exit 0: rebuilt. 2: bad configuration, --projection or --archive, the frontiers kept in Redis
    (ONWARD_FRONTIER_STORE=redis, which has no builds), the log was cut and no --archive
    given, it was cut with --no-archive (no archive holds that), or it lost records below its
    start otherwise (Kafka's retention). 5: Kafka or PostgreSQL failed, or the archive is
    corrupt.
    """
    if name == PROJECTION and projection is not None:
        # The frontiers are built in; a --projection meant for a user projection would be
        # dropped unsaid, and the frontiers rebuilt in its place.
        raise InvalidInputError(
            f"--projection {projection}: {PROJECTION} is built in and takes no --projection; "
            "name the user projection to rebuild instead"
        )
    config = load_settings()
    database_url = config.require_database_url()
    user = None
    if name == PROJECTION and config.frontier_store == "redis":
        # A build in PostgreSQL nobody reads, whose positions compaction would take for a
        # projector's and never cut past.
        raise ConfigurationError(
            "ONWARD_FRONTIER_STORE=redis keeps the frontiers in Redis, which has no builds to "
            "rebuild into: a rebuild of frontiers would fill a PostgreSQL build that nothing "
            "reads (a user projection, in PostgreSQL, can still be rebuilt)"
        )
    if name != PROJECTION:
        if projection is None:
            raise InvalidInputError(f"{name!r} is not built in; pass --projection module:attr")
        user = load_projection(projection)
        if user.name != name:
            raise InvalidInputError(f"{projection} is projection {user.name!r}, not {name!r}")
    if config.backend not in ("kafka", "postgres"):
        # Its builds are PostgreSQL's, folded from Kafka or the PostgreSQL log: not this
        # deployment's, whose runs and frontiers are in its file.
        raise ConfigurationError(
            f"onward projections rebuild folds the Kafka events topic or the PostgreSQL event "
            f"log into PostgreSQL; ONWARD_BACKEND={config.backend} keeps its frontiers beside "
            "its log, folded inline, with no builds to rebuild"
        )

    async def run() -> RebuildReport:
        what, retained = _retained_log(config)
        async with opened(what, retained) as live:
            log: EventLog = live
            if archive is not None:
                log = ArchivedEventLog(live, DirectoryArchive(archive))
                await _refuse_if_not_archived(config, log)  # names where a cut was archived
                if not archive.is_dir():
                    # Nothing cut, but an archive that is not there reads as an empty one: a
                    # mistyped path would never be named.
                    raise InvalidInputError(f"--archive {archive}: no such directory")
            else:
                await _refuse_if_cut(config)
            await _refuse_if_lost(log)
            with Progress(
                TextColumn(f"rebuilding {name}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=err,
                disable=not err.is_terminal,  # a pipe gets the result line, not a bar
            ) as bar:
                task = bar.add_task("fold", total=None)

                def show(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                schema, timeout_s = config.database_schema, config.backend_timeout
                if user is None:
                    return await rebuild_frontiers(
                        log,
                        database_url,
                        schema=schema,
                        batch_size=batch,
                        on_progress=show,
                        timeout_s=timeout_s,
                    )
                return await rebuild_projection(
                    log,
                    database_url,
                    user,
                    schema=schema,
                    batch_size=batch,
                    on_progress=show,
                    timeout_s=timeout_s,
                )

    report = run_until_terminated(run())
    if as_json:
        echo_json({**dataclasses.asdict(report), "events_per_second": report.events_per_second})
        return
    out.print(
        f"{report.projection} build {report.build} active (was {report.previous}); "
        f"{report.events} events in {report.seconds:.1f}s ({report.events_per_second:,.0f}/s); "
        "the old tables stay until dropped",
        soft_wrap=True,
    )
