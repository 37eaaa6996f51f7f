"""The `onward` command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Annotated

import asyncpg
import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from onward.errors import OnwardError
from onward.eventlog import KafkaEventLog
from onward.eventlog.events import AnyEvent
from onward.projections.builds import active_build
from onward.projections.kafka import DEFAULT_GROUP, KafkaProjector
from onward.projections.migrations import schema_version_postgres
from onward.projections.postgres import PROJECTION, PostgresFrontierStore, migrate
from onward.projections.projector import FrontierProjection, ProjectionSink
from onward.projections.rebuild import RebuildReport, rebuild_frontiers, rebuild_projection
from onward.projections.sql import SqlProjectionSink, load_projection

from .settings import Settings, load_settings

app = typer.Typer(
    name="onward",
    help="Onward: an event-sourced durable runtime for agent runs.",
    no_args_is_help=True,
    add_completion=False,
)
db_app = typer.Typer(help="The PostgreSQL schema: migrate and verify.", no_args_is_help=True)
projections_app = typer.Typer(help="Projections of the event log.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(projections_app, name="projections")
console = Console(stderr=True)


def event_schema() -> bytes:
    """The JSON Schema of every event kind, formatted for review in diffs."""
    schema = msgspec.json.schema(AnyEvent)
    return msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"


def _settings() -> Settings:
    try:
        return load_settings()
    except OnwardError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


def _fail(exc: OnwardError) -> typer.Exit:
    console.print(f"[red]{type(exc).__name__}: {exc}[/red]")
    return typer.Exit(1)


@app.command()
def schema(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here instead of standard output."),
    ] = None,
) -> None:
    """Print the JSON Schema of the events (committed as schemas/events.schema.json)."""
    text = event_schema()
    if output is None:
        typer.echo(text.decode(), nl=False)
    else:
        output.write_bytes(text)


async def _connect(settings: Settings) -> asyncpg.Connection:
    server_settings = {"search_path": settings.database_schema} if settings.database_schema else {}
    return await asyncpg.connect(settings.require_database_url(), server_settings=server_settings)


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply pending PostgreSQL migrations (DATABASE_URL) and create the first builds."""
    settings = _settings()

    async def run() -> list[str]:
        conn = await _connect(settings)
        try:
            return await migrate(conn)
        finally:
            await conn.close()

    try:
        applied = asyncio.run(run())
    except OnwardError as exc:
        raise _fail(exc) from exc
    for name in applied:
        console.print(f"applied {name}")
    console.print("schema is current" if not applied else f"{len(applied)} step(s) applied")


@db_app.command("verify")
def db_verify() -> None:
    """Check the PostgreSQL schema is the version this code expects (exit 1 if not)."""
    settings = _settings()

    async def run() -> tuple[int, int | None]:
        async with PostgresFrontierStore(
            settings.require_database_url(), schema=settings.database_schema
        ):
            conn = await _connect(settings)
            try:
                return await schema_version_postgres(conn), await active_build(conn, PROJECTION)
            finally:
                await conn.close()

    try:
        version, build = asyncio.run(run())
    except OnwardError as exc:
        raise _fail(exc) from exc
    console.print(f"schema version {version}, frontiers build {build}: ok")


@app.command()
def projector(
    projection: Annotated[
        str | None,
        typer.Option(help="A user projection, package.module:attribute (default: frontiers)."),
    ] = None,
    group: Annotated[
        str | None, typer.Option(help="Consumer group shared by all projectors of one projection.")
    ] = None,
    batch: Annotated[int, typer.Option(help="Most records folded per batch.")] = 5_000,
    session_timeout_ms: Annotated[int, typer.Option(help="Group session timeout.")] = 10_000,
) -> None:
    """Fold the events topic into PostgreSQL until SIGTERM or SIGINT."""
    settings = _settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        database_url = settings.require_database_url()
        async with contextlib.AsyncExitStack() as stack:
            log = await stack.enter_async_context(
                KafkaEventLog(
                    settings.kafka_bootstrap_servers,
                    topic=settings.kafka_topic,
                    partitions=settings.partitions,
                )
            )
            sink: ProjectionSink
            if projection is None:
                store = await stack.enter_async_context(
                    PostgresFrontierStore(database_url, schema=settings.database_schema)
                )
                sink = FrontierProjection(store, log)
                default_group = DEFAULT_GROUP
            else:
                user = load_projection(projection)
                sink = await stack.enter_async_context(
                    SqlProjectionSink(database_url, user, schema=settings.database_schema)
                )
                default_group = f"{DEFAULT_GROUP}-{user.name}"
            worker = KafkaProjector(
                settings.kafka_bootstrap_servers,
                sink,
                topic=settings.kafka_topic,
                partitions=settings.partitions,
                group_id=group or default_group,
                batch_records=batch,
                session_timeout_ms=session_timeout_ms,
            )
            await worker.start()
            try:
                reporter = asyncio.create_task(_report_lag(worker, stop))
                await worker.run(stop)
                await reporter
            finally:
                await worker.close()
        console.print("projector stopped cleanly")

    try:
        asyncio.run(run())
    except OnwardError as exc:
        raise _fail(exc) from exc


async def _report_lag(worker: KafkaProjector[ProjectionSink], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 10)
        except TimeoutError:
            lag = await worker.lag()
            stats = getattr(worker.projection, "stats", None)
            logging.getLogger("onward.projector").info(
                "lag %d records %s stats %s", sum(lag.values()), lag, stats
            )


@projections_app.command("rebuild")
def projections_rebuild(
    name: Annotated[str, typer.Argument(help="frontiers, or the name of a user projection.")],
    projection: Annotated[
        str | None,
        typer.Option(help="The user projection to rebuild, package.module:attribute."),
    ] = None,
    batch: Annotated[int, typer.Option(help="Records read per partition per step.")] = 5_000,
) -> None:
    """Fold the retained log into a new build of a projection and switch its views to it."""
    settings = _settings()
    user = None
    if name != PROJECTION:
        if projection is None:
            console.print(f"[red]{name!r} is not built in; pass --projection module:attr[/red]")
            raise typer.Exit(2)
        try:
            user = load_projection(projection)
        except OnwardError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from exc
        if user.name != name:
            console.print(f"[red]{projection} is projection {user.name!r}, not {name!r}[/red]")
            raise typer.Exit(2)

    async def run() -> RebuildReport:
        database_url = settings.require_database_url()
        async with KafkaEventLog(
            settings.kafka_bootstrap_servers,
            topic=settings.kafka_topic,
            partitions=settings.partitions,
            create_topic=False,
        ) as log:
            with Progress(
                TextColumn(f"rebuilding {name}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("fold", total=None)

                def show(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                if user is None:
                    return await rebuild_frontiers(
                        log,
                        database_url,
                        schema=settings.database_schema,
                        batch_size=batch,
                        on_progress=show,
                    )
                return await rebuild_projection(
                    log,
                    database_url,
                    user,
                    schema=settings.database_schema,
                    batch_size=batch,
                    on_progress=show,
                )

    try:
        report = asyncio.run(run())
    except OnwardError as exc:
        raise _fail(exc) from exc
    console.print(
        f"{report.projection} build {report.build} active (was {report.previous}); "
        f"{report.events} events in {report.seconds:.1f}s ({report.events_per_second:,.0f}/s); "
        "the old tables stay until dropped"
    )


@app.command()
def demo(
    child: Annotated[Path | None, typer.Option(hidden=True)] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Keep the demo's files here (default: a temp dir).")
    ] = None,
) -> None:
    """Kill a booking run mid-way and resume it elsewhere: one booking, never two."""
    from . import demo as booking  # noqa: PLC0415 - the demo's tools load only for the demo

    if child is not None:
        booking.run_child(child)
        return
    bookings = booking.run_demo(directory, Console())
    if bookings != 1:
        raise typer.Exit(1)


@app.callback()
def _root() -> None:
    """Onward: an event-sourced durable runtime for agent runs."""


def main() -> None:
    """Entry point of the `onward` console script."""
    app()
