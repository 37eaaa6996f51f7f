"""What every benchmark needs: servers from the environment, throwaway topics, schemas,
databases and Redis keys, quantiles, a little text, and the results file.

The benchmarks import this as ``_common`` (they run as ``python bench/NAME.py``). ``steps.py``
also runs as a child process in the peers' venv, which has no Onward, aiokafka, asyncpg or redis:
so this module imports only the standard library at the top, and each driver inside the
function that uses it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

SERVICES_HINT = 'eval "$(bash scripts/services.sh up)"'
SERVERS = {
    "bootstrap": ("--bootstrap", "KAFKA_BOOTSTRAP_SERVERS"),
    "database_url": ("--database-url", "DATABASE_URL"),
    "redis_url": ("--redis-url", "REDIS_URL"),
}
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "agents")


class Printer(Protocol):
    """Where cleanup failures are reported (a rich ``Console``)."""

    def print(self, *objects: Any) -> None: ...


def _report(console: Printer | None, message: str) -> None:
    """Say what a cleanup could not do: on ``console``, or on stderr without one."""
    if console is None:
        print(message, file=sys.stderr)
    else:
        console.print(f"[red]{message}")


# --------------------------------------------------------------------------------------------
# Servers


_T = TypeVar("_T")


def run_ending_on_sigterm(main: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run` with SIGTERM (``kill``, a CI job's time limit) cancelling ``main``: its
    ``finally`` blocks then stop the child processes and drop the topics, schemas, databases
    and keys the bench made, instead of the process ending with them left behind. SIGKILL
    cannot be caught; what it leaves is named ``onward.bench.*`` and ``bench_*``."""

    terminated = False

    def cancel(task: asyncio.Task[_T]) -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    async def cancelled_on_sigterm() -> _T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, cancel, task)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(cancelled_on_sigterm())
    except asyncio.CancelledError:
        if terminated:
            raise SystemExit("ended by SIGTERM; what the bench made was removed") from None
        raise


def add_server_options(parser: argparse.ArgumentParser, *names: str) -> None:
    """Add ``--bootstrap``, ``--database-url`` and/or ``--redis-url`` (``names`` as in SERVERS)."""
    for name in names:
        flag, variable = SERVERS[name]
        parser.add_argument(flag, default=None, help=f"default: ${variable}")


def server_urls(args: argparse.Namespace, *names: str) -> None:
    """Fill each of ``names`` on ``args`` from its environment variable when not given.

    Exits with the command that starts the servers when one is still missing.
    """
    missing: list[str] = []
    for name in names:
        variable = SERVERS[name][1]
        setattr(args, name, getattr(args, name, None) or os.environ.get(variable, ""))
        if not getattr(args, name):
            missing.append(variable)
    if missing:
        raise SystemExit(f"{', '.join(missing)} not set; start the servers: {SERVICES_HINT}")


def whole_numbers(text: str) -> list[int]:
    """``"1,2,3"`` as ``[1, 2, 3]``: the type of an option that takes several numbers."""
    return [int(part) for part in text.split(",")]


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def throwaway_name(kind: str, separator: str = ".") -> str:
    """``onward.bench.KIND.<random>`` (or joined by ``separator``): a name no other run uses."""
    return separator.join(["onward", "bench", kind, uuid.uuid4().hex[:8]])


# --------------------------------------------------------------------------------------------
# Kafka


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` as `KafkaEventLog` lays it out (partitions, retention, policy)."""
    from onward.eventlog import KafkaEventLog  # noqa: PLC0415

    log = await KafkaEventLog.open(bootstrap, topic=topic, partitions=partitions)
    await log.close()


def raw_producer(bootstrap: str, *, linger_ms: int) -> Any:
    """An (unstarted) aiokafka producer with the settings `KafkaEventLog` uses."""
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        compression_type="zstd",
        linger_ms=linger_ms,
        max_batch_size=1_048_000,
        max_request_size=1_100_000,
    )


async def delete_topics(
    bootstrap: str, topics: Sequence[str], console: Printer | None = None
) -> None:
    """Delete ``topics``; a failure is reported, not raised."""
    from aiokafka.admin import AIOKafkaAdminClient  # noqa: PLC0415

    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics(list(topics))
        finally:
            await admin.close()
    except Exception as exc:
        _report(console, f"could not delete topics {', '.join(topics)}: {exc!r}")


# --------------------------------------------------------------------------------------------
# PostgreSQL


async def kafka_log_dirs(bootstrap: str) -> list[Path]:
    """The broker's ``log.dirs``, asked of the broker (one broker, on this machine): wherever
    its data lives, whichever checkout started it."""
    from aiokafka.admin import AIOKafkaAdminClient  # noqa: PLC0415
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType  # noqa: PLC0415

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        (broker,) = cluster["brokers"]
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(broker["node_id"]), {"log.dirs": None})]
        )
    finally:
        await admin.close()
    entries = {entry[0]: entry[1] for entry in response.resources[0][4]}
    dirs = [Path(d) for d in str(entries["log.dirs"]).split(",")]
    if not any(d.is_dir() for d in dirs):
        raise SystemExit(f"the broker's log.dirs ({entries['log.dirs']}) are not on this machine")
    return dirs


def topic_bytes(dirs: list[Path], topic: str) -> int:
    """Bytes of the topic's log segments (every partition) in the broker's data folders."""
    return sum(
        f.stat().st_size for d in dirs for p in d.glob(f"{topic}-*") for f in p.glob("*.log")
    )


SERVER_COMMANDS: Mapping[str, str] = {
    "kafka": "kafka.Kafka",
    "postgres": "postgres",
    "redis": "redis-server",
}
"""How each server's processes are found on this machine: a word of their command line."""


def _process_cpu(stat: str) -> float:
    """utime + stime + cutime + cstime of one ``/proc/PID/stat`` line, in clock ticks: the
    children's times keep what exited processes (PostgreSQL's backends) used."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return float(sum(int(f) for f in fields[11:15]))


def cpu_seconds(servers: Sequence[str]) -> dict[str, float]:
    """CPU seconds used so far by this process (every thread) and by each of ``servers``
    (names of `SERVER_COMMANDS`: every process of that server on this machine, alive or
    exited under it). Two readings subtracted give a phase's cost, wherever it ran."""
    used: dict[str, float] = {"process": time.process_time()}
    wanted = {name: SERVER_COMMANDS[name] for name in servers}
    ticks = dict.fromkeys(wanted, 0.0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        words = command.split()
        for name, word in wanted.items():
            if word in words or (words and Path(words[0]).name.rstrip(":") == word):
                ticks[name] += _process_cpu(stat)
    per_second = os.sysconf("SC_CLK_TCK")
    used.update({name: count / per_second for name, count in ticks.items()})
    return used


def cpu_used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each part used between two `cpu_seconds` readings, and their ``total``."""
    spent = {name: after[name] - before[name] for name in after}
    spent["total"] = sum(spent.values())
    return spent


DROP_DATABASE_WAIT_S = 120.0
"""How long a benchmark keeps trying to drop a database it made. ``WITH (FORCE)`` ends the
benchmark's own sessions but not an autovacuum worker vacuuming what it wrote (another role's
process), which refuses the drop until it finishes."""


def drop_database_statement(database: str) -> str:
    return f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"


def drop_refused_for_now(error: BaseException) -> bool:
    """Whether a failed drop is one that waiting ends: another role's process (autovacuum) in
    the database."""
    return "pg_signal_backend" in str(error) or "being accessed by other users" in str(error)


def drop_database_again(
    database: str, error: BaseException, deadline: float, console: Printer | None = None
) -> float | None:
    """Seconds to wait before trying to drop ``database`` again after ``error``; ``None`` when
    waiting would not help or ``deadline`` (monotonic) has passed, in which case the database
    is left, said on ``console``, and the results measured before it are kept."""
    left = deadline - time.monotonic()
    if not drop_refused_for_now(error) or left <= 0:
        _report(console, f"could not drop database {database} ({error}); drop it by hand")
        return None
    _report(
        console,
        f"waiting up to {left:.0f}s more to drop database {database}: another role's process "
        f"(autovacuum) is in it",
    )
    return min(2.0, left)


def drop_database(
    execute: Callable[[str], object], database: str, console: Printer | None = None
) -> None:
    """Drop a database a benchmark made, with ``execute`` (a sync driver's), waiting out an
    autovacuum in it for up to `DROP_DATABASE_WAIT_S`; a drop that still fails is reported."""
    deadline = time.monotonic() + DROP_DATABASE_WAIT_S
    while True:
        try:
            execute(drop_database_statement(database))
        except Exception as exc:  # reported; the results are kept
            delay = drop_database_again(database, exc, deadline, console)
            if delay is None:
                return
            time.sleep(delay)
        else:
            return


async def drop_database_async(
    execute: Callable[[str], Awaitable[object]], database: str, console: Printer | None = None
) -> None:
    """`drop_database` with an async driver's ``execute``."""
    deadline = time.monotonic() + DROP_DATABASE_WAIT_S
    while True:
        try:
            await execute(drop_database_statement(database))
        except Exception as exc:  # reported; the results are kept
            delay = drop_database_again(database, exc, deadline, console)
            if delay is None:
                return
            await asyncio.sleep(delay)
        else:
            return


async def create_schema(database_url: str, kind: str) -> str:
    """A fresh schema named ``bench_KIND_<random>``, migrated; return its name.

    A schema whose migration fails is dropped again.
    """
    from onward.testing import storage  # noqa: PLC0415

    schema = f"bench_{kind}_{uuid.uuid4().hex[:10]}"
    await storage.create_schema(database_url, schema)
    return schema


async def drop_schemas(
    database_url: str, schemas: Sequence[str], console: Printer | None = None
) -> None:
    """Drop ``schemas``; a failure is reported, not raised."""
    import asyncpg  # noqa: PLC0415

    if not schemas:
        return
    try:
        conn = await asyncpg.connect(database_url)
        try:
            for schema in schemas:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        finally:
            await conn.close()
    except Exception as exc:
        _report(console, f"could not drop schemas {', '.join(schemas)}: {exc!r}")


@asynccontextmanager
async def throwaway_database(database_url: str, kind: str) -> AsyncIterator[tuple[str, str]]:
    """A fresh, migrated database on the server of ``database_url``, dropped afterwards.

    Yields its name and its URL.
    """
    import asyncpg  # noqa: PLC0415

    from onward.projections.postgres import migrate  # noqa: PLC0415

    database = throwaway_name(kind, "_")
    url = with_database(database_url, database)
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f"CREATE DATABASE {database}")
        try:
            conn = await asyncpg.connect(url)
            try:
                await migrate(conn)
            finally:
                await conn.close()
            yield database, url
        finally:
            await drop_database_async(admin.execute, database)
    finally:
        await admin.close()


# --------------------------------------------------------------------------------------------
# Redis


async def delete_redis_keys(redis_url: str, prefix: str, console: Printer | None = None) -> None:
    """Delete every key under ``prefix``; a failure is reported, not raised."""
    import redis.asyncio as aioredis  # noqa: PLC0415

    try:
        client = aioredis.Redis.from_url(redis_url)
        try:
            keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
            for first in range(0, len(keys), 500):
                await client.delete(*keys[first : first + 500])
        finally:
            await client.aclose()
    except Exception as exc:
        _report(console, f"could not delete Redis keys {prefix}*: {exc!r}")


# --------------------------------------------------------------------------------------------
# Figures


def quantile(values: Sequence[float], q: float, *, interpolate: bool = True) -> float:
    """The ``q`` quantile (0..1) of ``values`` (NaN when there are none).

    Interpolated linearly between the closest ranks, or (``interpolate=False``) the value at
    rank ``min(n - 1, int(n * q))`` of the sorted values.
    """
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    if not interpolate:
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))]
    index = q * (len(ordered) - 1)
    low = int(index)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def text(rng: random.Random, low: int, high: int) -> str:
    """Some words, ``low`` to ``high`` characters long."""
    size = rng.randint(low, high)
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def code_version() -> str:
    """The commit the benchmarks' checkout is at, ``-dirty`` if the tree had changes."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip()


def write_results(path: Path, document: Mapping[str, Any]) -> None:
    """Write a benchmark's results as indented JSON (creating the folder); say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2))
    print(f"wrote {path}")
