"""`onward worker`: one member of a fleet that starts runs and carries dead workers' runs on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

from onward._storage import check_onward_sqlite
from onward.errors import InvalidInputError
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.fleet.requests import DEFAULT_REQUESTS_TOPIC
from onward.runtime.fleet.senders import postgres_requests
from onward.runtime.fleet.worker import DEFAULT_GROUP, Worker
from onward.runtime.leases.base import DEFAULT_LEASE_TTL_S, MAX_LEASE_TTL_S
from onward.runtime.observability import WorkerCollector
from onward.runtime.settings import Settings, load_settings
from onward.runtime.signing import RequestSigner

from ._common import (
    KAFKA_MAX_MS,
    STOP_SIGNALS,
    backend_servers,
    checked_sqlite_directory,
    err,
    imported,
    made,
    opened,
    stopped_before_the_loop,
    within,
)
from ._health import MetricsHostOption, MetricsPortOption, metrics_served, stores_reachable
from .runs import lease_policy, load_provider, worker_name
from .summary import shown

_T = TypeVar("_T")


def load_agents(specs: list[str]) -> dict[str, Agent]:
    """Agents by name from ``--agent`` values.

    Each value is ``module:attr`` (an Agent, a function returning one, or a dict of agents by
    name) or ``name=module:attr`` (the agent runs record under that name).
    """
    agents: dict[str, Agent] = {}
    for spec in specs:
        name, equals, target = spec.partition("=")
        if not equals:
            name, target = "", spec
        found = made(
            imported(target, "--agent"),
            target,
            "--agent",
            is_made=lambda v: isinstance(v, Agent | dict),
        )
        if isinstance(found, dict):
            if name:
                raise InvalidInputError(
                    f"--agent: {target} is a dict of agents, which name themselves; drop {name}="
                )
            for key, agent in found.items():
                if not isinstance(agent, Agent):
                    raise InvalidInputError(f"--agent: {target}[{key!r}] is not an Agent")
                agents[str(key)] = agent
        elif isinstance(found, Agent):
            agents[name or found.name] = found
        else:
            raise InvalidInputError(
                f"--agent: {target} is a {type(found).__name__}, not an Agent, a dict of agents "
                "or a function returning one"
            )
    if not agents:
        raise InvalidInputError("--agent: name at least one agent")
    return agents


async def _unless_stopped(step: Awaitable[_T], stop: asyncio.Event) -> _T | None:
    """``step``'s result, or None when ``stop`` is set first (``step`` is then cancelled): a
    worker stopped while PostgreSQL did not answer its requests table's opening waited out the
    whole connect bound, then exited 5 as though PostgreSQL had failed."""
    stepping = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({stepping, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        cut = not stepping.done()
        if cut:
            stepping.cancel()
            await asyncio.wait({stepping})
    if cut:
        if not stepping.cancelled():
            stepping.exception()  # superseded by the stop
        return None
    return stepping.result()


async def _serve(
    worker: Worker,
    stop: asyncio.Event,
    config: Settings,
    *,
    requests_topic: str,
    group: str,
    session_timeout_ms: int,
    signer: RequestSigner | None,
    accept_unsigned: bool,
) -> None:
    """Serve the backend's requests (the Kafka topic, the PostgreSQL table when there is a
    request key) and carry runs on until ``stop``; then drain."""
    if config.backend == "kafka":
        await worker.serve_kafka(
            stop,
            bootstrap_servers=config.kafka_connection(),
            topic=requests_topic,
            group_id=group,
            session_timeout_ms=session_timeout_ms,
            on_ready=lambda: err.print(shown(f"worker {worker.name} ready"), soft_wrap=True),
            signer=signer,
            accept_unsigned=accept_unsigned,
        )
    elif config.backend == "postgres" and (signer or accept_unsigned):
        async with contextlib.AsyncExitStack() as stack:
            requests = await _unless_stopped(
                within(stack.enter_async_context(postgres_requests(config)), "the requests table"),
                stop,
            )
            if requests is None:
                return
            await worker.serve_postgres(
                stop,
                requests=requests,
                signer=signer,
                accept_unsigned=accept_unsigned,
                on_ready=lambda: err.print(
                    shown(
                        f"worker {worker.name} ready (postgres: requests table), taking starts "
                        "of " + ", ".join(sorted(worker.agents))
                    ),
                    soft_wrap=True,  # one line, however many agents: logs are read by line
                ),
            )
    else:
        unserved = (
            "; no request key, so the requests table is not served (ONWARD_REQUEST_KEY)"
            if config.backend == "postgres"
            else ""
        )
        err.print(shown(f"worker {worker.name} ready ({config.backend}{unserved})"), soft_wrap=True)
        await worker.serve_embedded(stop)


class _Signals:
    """SIGTERM and SIGINT to a worker: the first drains it, a second cancels its runs in
    flight. One that comes while its stores are still being opened (no worker yet) cancels the
    opening: a server that does not answer would hold the stop for the whole connect bound,
    and with no handler in place yet the signal killed the process without a line."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.worker: Worker | None = None
        self.cut_short = False
        self._main = asyncio.current_task()

    def on_signal(self) -> None:
        if self.worker is None:
            if self._main is not None and not self.cut_short:
                self.cut_short = True
                self._main.cancel()
        elif self.stop.is_set():
            err.print("second signal: cancelling runs in flight")
            self.worker.stop_now()
        else:
            err.print("draining: runs stop at their next boundary")
            self.stop.set()


async def _until_signalled(serve: Callable[[_Signals], Awaitable[None]]) -> None:
    """Run ``serve`` with the signals handled from the start, the opening of the stores too."""
    signals = _Signals()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, signals.on_signal)
    try:
        await serve(signals)
    except asyncio.CancelledError:
        main = asyncio.current_task()
        if not signals.cut_short or main is None:
            raise
        main.uncancel()
        err.print("worker stopped before it started serving")


def _stopped(worker: Worker) -> str:
    """The worker's last line: what it did."""
    stats = worker.stats
    return (
        f"worker {worker.name} stopped: {stats.started} started, {stats.recovered} "
        f"carried on, {stats.stopped} stopped at a boundary, {stats.needs_person} "
        f"left for a person, {stats.gave_up} given up, {stats.conflicts} conflicts, "
        f"{stats.failures} refused; at most {stats.peak_in_flight} in flight, "
        f"paused {stats.pauses} times"
    )


def worker_command(
    *,
    agent: Annotated[
        list[str],
        typer.Option(
            "--agent",
            metavar="[NAME=]MODULE:ATTR",
            help="An agent, or a dict of agents by name; repeat for several.",
        ),
    ],
    provider: Annotated[
        str,
        typer.Option(
            "--provider", metavar="MODULE:ATTR", help="The model: a Provider, or a function."
        ),
    ],
    max_runs: Annotated[int, typer.Option(min=1, help="Most runs in flight; beyond, pause.")] = 16,
    max_attempts: Annotated[
        int, typer.Option(min=1, help="Claims without progress before a run ends failed.")
    ] = 3,
    backoff: Annotated[
        float, typer.Option(help="Seconds before a retry, doubled each time.")
    ] = 1.0,
    lease_ttl: Annotated[
        float | None,
        typer.Option(
            help="Seconds a run's lease lasts; a dead worker's runs move after. Default: "
            f"ONWARD_LEASE_TTL, else {DEFAULT_LEASE_TTL_S:g}.",
            show_default=False,
        ),
    ] = None,
    recheck: Annotated[
        float, typer.Option(help="Seconds between looks for runs whose lease lapsed.")
    ] = 5.0,
    requests_topic: Annotated[
        str | None,
        typer.Option(
            help="Kafka: the requests topic (created like the events topic). Default: "
            f"ONWARD_REQUESTS_TOPIC, else {DEFAULT_REQUESTS_TOPIC}, where applications submit.",
            show_default=False,
        ),
    ] = None,
    group: Annotated[str, typer.Option(help="Kafka: the fleet's consumer group.")] = DEFAULT_GROUP,
    session_timeout_ms: Annotated[
        int,
        typer.Option(
            min=1, max=KAFKA_MAX_MS, help="Kafka: how long a dead worker keeps its partitions."
        ),
    ] = 10_000,
    name: Annotated[
        str | None, typer.Option(help="This worker's name in leases (default: host-pid).")
    ] = None,
    accept_unsigned_requests: Annotated[
        bool,
        typer.Option(
            "--accept-unsigned-requests",
            help="Kafka and PostgreSQL: act on requests without a signature "
            "(ONWARD_REQUEST_KEY), so anyone who can write the requests topic or table may "
            "start, answer and tag any tenant's runs.",
        ),
    ] = False,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
) -> None:
    """Start requested runs and carry on lapsed ones until SIGTERM; then drain.

    SIGTERM or SIGINT: take nothing new, let every run reach its next boundary and release
    it, exit 0. A second one cancels what is still in flight. Exit 2: bad configuration or
    options. 5: a store failed.
    """
    name = worker_name(name, "--name")
    config = checked_sqlite_directory(load_settings())
    path = config.sqlite_path
    if config.backend == "sqlite" and path.is_file() and path.stat().st_size > 0:
        # As `start` does: a file that is not Onward's (no SQLite at all, or another
        # program's) is a wrong ONWARD_SQLITE_PATH, exit 2, not a store to retry (exit 5).
        check_onward_sqlite(path)
    signer = config.request_signer()
    accept_unsigned = accept_unsigned_requests or config.accept_unsigned_requests
    for option, seconds in (("--lease-ttl", lease_ttl), ("--recheck", recheck)):
        if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
            raise InvalidInputError(f"{option} must be positive, finite seconds, got {seconds}")
    if lease_ttl is not None and lease_ttl > MAX_LEASE_TTL_S:
        raise InvalidInputError(
            f"--lease-ttl must be at most {MAX_LEASE_TTL_S:g} seconds, as ONWARD_LEASE_TTL, "
            f"got {lease_ttl:g}"
        )
    if not (backoff > 0 and math.isfinite(backoff)):
        # 0, negative or NaN retries a store that is down (or a run held by another) with no
        # pause, doubled still none; infinite, never.
        raise InvalidInputError(f"--backoff must be positive, finite seconds, got {backoff}")
    policy = lease_policy(lease_ttl)

    async def run() -> None:
        try:
            await _until_signalled(serve)
        finally:
            # Drained (or failed): a signal from here on has nothing left to stop, and must not
            # turn a clean exit into death by that signal while the loop closes.
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_IGN)

    async def serve(signals: _Signals) -> None:
        async with opened(backend_servers(config), open_backends(config)) as backends:
            worker = signals.worker = Worker(
                backends,
                model,
                agents,
                name=name,
                max_runs=max_runs,
                max_attempts=max_attempts,
                backoff_s=backoff,
                lease_policy=policy,
                recheck_s=recheck,
            )

            async def ready() -> str | None:
                if worker.draining:
                    return "draining: taking no new work"
                if not backends.embedded and not worker.joined:
                    return "not in the fleet's consumer group yet (or rebalancing)"
                return await stores_reachable(backends)

            collector = WorkerCollector(worker, lambda: worker.stats)
            async with metrics_served(
                metrics_port, metrics_host, ready=ready, collectors=[collector]
            ):
                await _serve(
                    worker,
                    signals.stop,
                    config,
                    # The applications' topic unless told otherwise: a worker on another
                    # would never hear the starts they submit.
                    requests_topic=requests_topic or config.requests_topic,
                    group=group,
                    session_timeout_ms=session_timeout_ms,
                    signer=signer,
                    accept_unsigned=accept_unsigned,
                )
            err.print(shown(_stopped(worker)), soft_wrap=True)  # one line: logs are read by line

    # The handlers are put back afterwards: the command also runs inside other processes
    # (tests, embedders).
    with stopped_before_the_loop("worker stopped before it started serving"):
        agents = load_agents(agent)  # a module that loads a model or connects on import
        model = load_provider(provider)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        asyncio.run(run())
