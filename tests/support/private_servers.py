"""Private Kafka, PostgreSQL and Redis servers that a fault test may kill, stop and restart.

The shared servers (``scripts/services.sh``) serve every other test, so a fault test never
touches them: it starts its own instance here, on a free loopback port, in a temporary
directory, and breaks only that one. Every server is its own process group (``setsid``), so
``close()`` kills it and whatever it forked, even after a failed test, and removes its
directory; calling it twice is harmless. Every wait is bounded and fails with the server's log.

* Kafka: a single KRaft node (broker and controller) from the jars ``scripts/services.sh``
  caches; ``ONWARD_KAFKA_LIBS`` names their folder (default ``.cache/kafka/3.9.2/libs``).
* PostgreSQL: ``initdb`` and ``pg_ctl`` from the newest ``/usr/lib/postgresql/*/bin`` (or
  ``pg_config --bindir``); as root the cluster runs as the ``postgres`` user, as the server
  refuses root.
* Redis: ``redis-server`` without persistence, so a restart forgets every key.

A test's fixture: ``async with running(PrivateKafka()) as broker: yield broker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol, TypeVar

REPO = Path(__file__).resolve().parents[2]
KAFKA_LIBS_VARIABLE = "ONWARD_KAFKA_LIBS"
DEFAULT_KAFKA_LIBS = REPO / ".cache" / "kafka" / "3.9.2" / "libs"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


class ServerError(RuntimeError):
    """A private server did not start or stop in time; the message carries its log's tail."""


def free_port(highest: int = 65535) -> int:
    """A loopback port nobody listens on right now, at most ``highest``."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port <= highest:
            return port


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"({path.name} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _wait(
    ready: object,
    what: str,
    log: Path,
    within: float = START_TIMEOUT_S,
    *,
    process: _Process | None = None,
) -> None:
    """Wait until ``ready()``; a ``process`` that exits first ends the wait at once, with its
    log, rather than after ``within``."""
    assert callable(ready)
    deadline = time.monotonic() + within
    while not ready():
        if process is not None and not process.alive:
            raise ServerError(f"{what}: exited before it was ready; log:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise ServerError(f"{what}: not ready after {within:.0f}s; log:\n{tail(log)}")
        time.sleep(0.2)


class _Process:
    """One server process in its own session, killed as a group."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self, argv: list[str], log: Path, *, user: str | None = None) -> None:
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group (a stopped group is killed too) and reap the leader."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_TIMEOUT_S)
        self.proc = None


class PrivateKafka:
    """A single-node KRaft broker on free ports; ``advertise`` names the port clients are told.

    Args:
        advertise: The port the broker advertises (a proxy's, say); its own by default.
        heap: The JVM's ``-Xmx``: small, the machine is shared.
    """

    def __init__(self, *, advertise: int | None = None, heap: str = "256m") -> None:
        libs = Path(os.environ.get(KAFKA_LIBS_VARIABLE) or DEFAULT_KAFKA_LIBS)
        if not any(libs.glob("kafka_*.jar")):
            raise ServerError(
                f"no Kafka jars in {libs}: run `bash scripts/services.sh up kafka` (it caches "
                f"them) or point {KAFKA_LIBS_VARIABLE} at a folder holding them"
            )
        self.libs = libs
        self.heap = heap
        self.dir = Path(tempfile.mkdtemp(prefix="onward-fault-kafka-"))
        self.port = free_port()
        self.controller_port = free_port()
        self.advertised = advertise or self.port
        self.log = self.dir / "logs" / "server.log"
        self._process = _Process()
        self._started_at = 0

    @property
    def bootstrap(self) -> str:
        """What clients connect to: the advertised port."""
        return f"127.0.0.1:{self.advertised}"

    def _java(self, *argv: str) -> list[str]:
        return [
            "java",
            f"-Xmx{self.heap}",
            "-Xms64m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.dir / 'logs'}",
            f"-Dlog4j.configuration=file:{self.dir / 'log4j.properties'}",
            "-cp",
            f"{self.libs}/*",
            *argv,
        ]

    def _configure(self) -> None:
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.dir / "server.properties").write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.advertised}",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    "controller.listener.names=CONTROLLER",
                    f"log.dirs={self.dir / 'data'}",
                    "num.partitions=1",
                    "default.replication.factor=1",
                    "auto.create.topics.enable=false",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "transaction.state.log.num.partitions=1",
                    "group.initial.rebalance.delay.ms=0",
                    "min.insync.replicas=1",
                    "num.network.threads=2",
                    "num.io.threads=2",
                    "background.threads=2",
                    "log.segment.bytes=16777216",
                    "",
                ]
            )
        )
        (self.dir / "log4j.properties").write_text(
            "\n".join(
                [
                    "log4j.rootLogger=INFO, file",
                    "log4j.appender.file=org.apache.log4j.FileAppender",
                    "log4j.appender.file.File=${kafka.logs.dir}/server.log",
                    "log4j.appender.file.layout=org.apache.log4j.PatternLayout",
                    "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n",
                    "log4j.logger.kafka.request.logger=WARN",
                    "log4j.logger.state.change.logger=WARN",
                    "log4j.logger.org.apache.kafka.clients=WARN",
                    "",
                ]
            )
        )
        import base64  # noqa: PLC0415

        cluster_id = "-"
        while cluster_id.startswith("-"):  # StorageTool would read it as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        formatted = subprocess.run(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(self.dir / "server.properties"),
            ),
            capture_output=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        if formatted.returncode != 0:
            raise ServerError(f"kafka storage format failed: {formatted.stderr.decode()[-2000:]}")

    def _started(self) -> bool:
        if not self._process.alive:
            raise ServerError(f"the private broker exited during startup:\n{tail(self.log)}")
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "Kafka Server started" in text[self._started_at :] and port_open(self.port)

    def start(self) -> None:
        """Start the broker (formatting its storage the first time) and wait until it serves."""
        if not (self.dir / "server.properties").exists():
            self._configure()
        self._started_at = self.log.stat().st_size if self.log.exists() else 0
        self._process.spawn(
            self._java("kafka.Kafka", str(self.dir / "server.properties")),
            self.dir / "logs" / "stdout.log",
        )
        _wait(self._started, "private Kafka broker", self.log)

    def kill(self) -> None:
        """SIGKILL the broker: no flush, no controlled shutdown."""
        self._process.kill()

    def pause(self) -> None:
        """SIGSTOP the broker: its sockets stay open and nothing answers."""
        self._process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the broker."""
        self._process.signal(signal.SIGCONT)

    def close(self) -> None:
        """Kill the broker and remove its directory. Idempotent."""
        self._process.signal(signal.SIGCONT)
        self._process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def pg_bindir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live: the newest Debian major first."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]), reverse=True
    )
    for candidate in found:
        if os.access(f"{candidate}/initdb", os.X_OK):
            return Path(candidate)
    pg_config = shutil.which("pg_config")
    if pg_config:
        bindir = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if bindir and os.access(f"{bindir}/initdb", os.X_OK):
            return Path(bindir)
    raise ServerError("PostgreSQL server binaries (initdb, pg_ctl) not found")


class PrivatePostgres:
    """A PostgreSQL cluster of its own: role and database ``onward``, trust auth on loopback."""

    def __init__(self) -> None:
        self.bin = pg_bindir()
        self.user = "postgres" if os.geteuid() == 0 else None
        self.dir = Path(tempfile.mkdtemp(prefix="onward-fault-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = free_port()
        if self.user is not None:
            owner = pwd.getpwnam(self.user)
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        self._started = False

    @property
    def url(self) -> str:
        return f"postgresql://onward@127.0.0.1:{self.port}/onward"

    def _run(
        self, *argv: str, timeout: float = START_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        command = list(argv)
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, cwd="/"
        )

    def _ctl(self, *argv: str) -> None:
        done = self._run(str(self.bin / "pg_ctl"), *argv, "-D", str(self.data))
        if done.returncode != 0:
            raise ServerError(
                f"pg_ctl {' '.join(argv)}: {done.stdout}{done.stderr}\n{tail(self.log)}"
            )

    def start(self) -> None:
        """initdb the first time, then start and wait (``pg_ctl -w``)."""
        if not (self.data / "PG_VERSION").exists():
            done = self._run(
                str(self.bin / "initdb"), "-D", str(self.data), "-U", "onward", "-E", "UTF8",
                "--no-locale", "--auth=trust", "--no-sync",
            )  # fmt: skip
            if done.returncode != 0:
                raise ServerError(f"initdb failed: {done.stdout}{done.stderr}")
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(
                    "\nfsync = off\nshared_buffers = 16MB\nmax_connections = 60\n"
                    "logging_collector = off\nlog_min_messages = warning\n"
                )
        self._ctl(
            "start", "-w", "-t", str(int(START_TIMEOUT_S)), "-l", str(self.log),
            "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories=''",
        )  # fmt: skip
        self._started = True
        if not (self.dir / "created").exists():
            done = self._run(
                str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                "onward", "onward",
            )  # fmt: skip
            if done.returncode != 0 and "already exists" not in done.stderr:
                raise ServerError(f"createdb failed: {done.stderr}")
            self._run("touch", str(self.dir / "created"))

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server; ``immediate`` is a crash for the clients (no goodbye, no checkpoint)."""
        if self._started:
            self._ctl("stop", "-m", mode, "-w", "-t", str(int(STOP_TIMEOUT_S)))
            self._started = False

    def close(self) -> None:
        """Stop the cluster (killing it if it does not stop) and remove it. Idempotent."""
        with contextlib.suppress(ServerError, subprocess.TimeoutExpired):
            self.stop()
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():
            with contextlib.suppress(ValueError, ProcessLookupError, OSError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


REDIS_CLUSTER_BUS_OFFSET = 10_000
"""How far above a cluster node's port Redis puts its cluster bus."""


class PrivateRedis:
    """``redis-server`` without persistence: a restart, or a SIGKILL, forgets every key.

    Args:
        options: More ``redis-server`` arguments (``"--requirepass", "secret"``).
    """

    def __init__(self, *options: str) -> None:
        self.options = options
        self.dir = Path(tempfile.mkdtemp(prefix="onward-fault-redis-"))
        # A cluster node also listens on its port + 10000 (the cluster bus), and refuses to
        # start on a port above 55535.
        clustered = "--cluster-enabled" in options
        self.port = free_port(highest=65535 - REDIS_CLUSTER_BUS_OFFSET if clustered else 65535)
        self.log = self.dir / "redis.log"
        self._process = _Process()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self._process.spawn(
            [
                "redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                *self.options,
            ],
            self.log,
        )  # fmt: skip
        _wait(lambda: port_open(self.port), "private Redis", self.log, process=self._process)

    def kill(self) -> None:
        self._process.kill()

    def close(self) -> None:
        self._process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Server(Protocol):
    def start(self) -> None: ...

    def close(self) -> None: ...


ServerT = TypeVar("ServerT", bound=_Server)


@contextlib.asynccontextmanager
async def running(server: ServerT) -> AsyncIterator[ServerT]:
    """Start ``server`` (off the event loop) and, however the block ends, close it."""
    try:
        await asyncio.to_thread(server.start)
        yield server
    finally:
        await asyncio.to_thread(server.close)
