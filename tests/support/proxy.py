"""A TCP proxy a test puts in front of a server, to cut the way to it and restore it.

::

    async with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql://...@127.0.0.1:{proxy.port}/db"
        await proxy.cut()               # the server is down: connections reset, new ones refused
        await proxy.cut(silent=True)    # the network drops everything: nothing answers, ever
        await proxy.restore()           # the way is open again, on the same port

Only the proxy stops; the shared server behind it is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

from onward._storage import Resource

_CHUNK = 65_536


class TcpProxy(Resource):
    """Forwards every connection to ``upstream_host:upstream_port`` until cut.

    Args:
        upstream_host: The server's host.
        upstream_port: The server's port.
        host: Where the proxy listens; its port is picked free and kept across cuts.
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port = 0
        self.connections = 0
        """How many connections the proxy has accepted, for tests that check a client's pool."""
        self._server: asyncio.Server | None = None
        self._silent = False
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def is_open(self) -> bool:
        return self._server is not None

    async def _connect(self) -> None:
        await self._listen()

    async def close(self) -> None:
        await self._stop_listening()
        await self._drop_links()

    async def cut(self, *, silent: bool = False) -> None:
        """Cut the way to the server.

        Args:
            silent: Keep every connection open and accept new ones, but forward nothing either
                way (a partition, a hung server). By default live connections are reset and new
                ones refused (a server that went down).
        """
        if silent:
            self._silent = True
            self._flowing.clear()
            return
        await self._stop_listening()
        await self._drop_links()

    async def restore(self) -> None:
        """Open the way again. Connections that lived through a silent cut are reset first."""
        if self._silent:
            self._silent = False
            self._flowing.set()
            await self._drop_links()
        if self._server is None:
            await self._listen()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop_listening(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def _drop_links(self) -> None:
        links = list(self._links)
        for link in links:
            link.cancel()
        await asyncio.gather(*links, return_exceptions=True)
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)  # before the link runs, so a cut now still resets it
        link = asyncio.create_task(self._link(reader, writer))
        self._links.add(link)
        link.add_done_callback(self._links.discard)

    async def _link(self, reader: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        server_out: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()  # a connection made during a silent cut reaches nothing
            server_in, server_out = await asyncio.open_connection(*self.upstream)
            self._writers.add(server_out)
            await asyncio.gather(self._pipe(reader, server_out), self._pipe(server_in, client_out))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_out, server_out):
                if writer is None:
                    continue
                self._writers.discard(writer)
                writer.transport.abort()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while True:
            data = await source.read(_CHUNK)
            if not data:
                with contextlib.suppress(OSError):
                    sink.write_eof()
                return
            if self._silent:
                continue  # dropped, as a partitioned network drops it
            sink.write(data)
            await sink.drain()


def through(url: str, proxy: TcpProxy) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    credentials = parts.netloc.rsplit("@", 1)
    address = f"{proxy.host}:{proxy.port}"
    netloc = f"{credentials[0]}@{address}" if len(credentials) > 1 else address
    return urlunsplit(parts._replace(netloc=netloc))


def upstream(url: str) -> tuple[str, int]:
    """The host and port of a server ``url`` names (what a proxy forwards to)."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port
