"""A TCP proxy on loopback that a test can slow down or cut: the network between client and server.

Runs in the test's own event loop::

    async with FaultyProxy("127.0.0.1", server_port) as proxy:
        client connects to proxy.port
        proxy.delay(200)      # every chunk waits 200 ms in each direction
        proxy.cut()           # open connections are reset, new ones are closed at once
        proxy.restore()       # accept and forward again (no delay)
        proxy.hold_replies_after(1)  # each connection gets the server's first chunk, no more

A cut resets the connections (``SO_LINGER`` 0, so the client sees a reset, not a clean end),
as a dropped route or a restarted load balancer would.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from onward._storage import Resource

CHUNK = 65536


class FaultyProxy(Resource):
    """Forwards ``127.0.0.1:port`` to ``upstream_host:upstream_port``, with faults on demand.

    Args:
        upstream_host: The server's host.
        upstream_port: The server's port.
        port: The port to listen on (0: a free one; read it from ``port`` after start).
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = port
        self.delay_s = 0.0
        self.is_cut = False
        self.connections = 0
        self.resets = 0
        self._replies_forwarded: int | None = None
        self.reply_held = asyncio.Event()
        """Set once a server's chunk is held back by `hold_replies_after`."""
        self.idle = asyncio.Event()
        """Set while no client connection is open through the proxy."""
        self.idle.set()
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def is_open(self) -> bool:
        return self._server is not None

    async def _connect(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def delay(self, ms: float) -> None:
        """Hold every chunk ``ms`` milliseconds before forwarding it (0: no delay)."""
        self.delay_s = ms / 1000.0

    def hold_replies_after(self, chunks: int) -> None:
        """Forward only each connection's first ``chunks`` chunks from the server; hold every
        later one for good (a server that answers the handshake, then hangs)."""
        self._replies_forwarded = chunks

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until `restore`."""
        self.is_cut = True
        for links in list(self._links):
            for writer in links:
                _reset(writer)
            self.resets += 1
        self._links.clear()
        self.idle.set()

    def restore(self) -> None:
        """Forward again, without delay."""
        self.is_cut = False
        self.delay_s = 0.0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)
            return
        self.connections += 1
        link = (writer, up_writer)
        self._links.add(link)
        self.idle.clear()
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer, replies=True)),
        ]
        for task in pumps:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        self._links.discard(link)
        if not self._links:
            self.idle.set()
        for side in link:
            side.close()

    def _forwarding(self) -> bool:
        return not self.is_cut

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, replies: bool = False
    ) -> None:
        forwarded = 0
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await source.read(CHUNK)
                if not data or not self._forwarding():
                    return
                if replies and self._replies_forwarded is not None:
                    if forwarded >= self._replies_forwarded:
                        self.reply_held.set()
                        continue
                    forwarded += 1
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if not self._forwarding():  # cut while the chunk was held back
                    return
                sink.write(data)
                await sink.drain()

    async def close(self) -> None:
        """Stop listening and drop every connection. Idempotent."""
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset rather than a clean end of stream."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
