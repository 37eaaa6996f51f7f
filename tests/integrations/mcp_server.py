"""A small MCP server for the integration tests, run as a subprocess.

Usage: python -m integrations.mcp_server stdio
       python -m integrations.mcp_server http PORT
       python -m integrations.mcp_server http-json PORT  (each answer a single JSON body, no SSE)
       python -m integrations.mcp_server http-gateway PORT  (as http-json, behind a gateway
           that answers each ``charge`` call with 502 Bad Gateway once the server handled it)

Environment:
    MCP_TEST_LISTINGS: a file that gets one line per ``tools/list`` call (how tests count them).
    MCP_TEST_LEDGER: a file that gets one JSON line per ``charge`` side effect.
    MCP_TEST_META: a file that gets the ``_meta`` of each ``charge`` call, one JSON line each.
    MCP_TEST_VARIANT: ``v1`` (default) or ``v2``; ``v2`` reports another version and adds a tool,
        ``mute-list`` reports another version and never answers ``tools/list``.
    MCP_TEST_CRASH: set to make the server exit at start.
    MCP_TEST_SWITCH: a file; when it exists its text (a variant, or ``crash``) overrides the two
        above, so a test changes a server between sessions without changing its declaration
        (whose environment is part of its cache endpoint).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

KEY = "onward/idempotency-key"
_SWITCH = Path(os.environ.get("MCP_TEST_SWITCH") or os.devnull)
SWITCHED = _SWITCH.read_text().strip() if _SWITCH.is_file() else ""
if os.environ.get("MCP_TEST_CRASH") or SWITCHED == "crash":
    sys.exit("this server fails at start, on purpose")
VARIANT = SWITCHED or os.environ.get("MCP_TEST_VARIANT", "v1")


class CountingServer(MCPServer):
    """Appends a line to ``MCP_TEST_LISTINGS`` on every ``tools/list``."""

    async def list_tools(self) -> Any:
        listings = os.environ.get("MCP_TEST_LISTINGS")
        if listings:
            _append(Path(listings), f"{os.getpid()}")
        if VARIANT == "mute-list":
            await anyio.sleep_forever()
        return await super().list_tools()


def _append(path: Path, line: str) -> None:
    with path.open("a") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


server: CountingServer = CountingServer("ledger", version=f"test-{VARIANT}", log_level="ERROR")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
async def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


@server.tool()
async def fail(reason: str) -> str:
    """Always fails, with the reason."""
    raise ToolError(reason)


@server.tool()
async def charge(account: str, cents: int, ctx: Context) -> str:
    """Charge an account; the side effect goes to the ledger under the call's key."""
    meta = ctx.request_context.meta or {}
    key = meta.get(KEY)
    line = json.dumps({"key": key, "account": account, "cents": cents})
    _append(Path(os.environ["MCP_TEST_LEDGER"]), line)
    metas = os.environ.get("MCP_TEST_META")
    if metas:
        _append(Path(metas), json.dumps(meta))
    return f"charged {account} {cents}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def wait(seconds: float) -> str:
    """Answer after some seconds."""
    await anyio.sleep(seconds)
    return f"waited {seconds:g}s"


@server.tool()
async def freeze() -> str:
    """The server process stops (SIGSTOP) in the middle of the call: it hangs, answering nothing."""
    os.kill(os.getpid(), signal.SIGSTOP)
    return "thawed"


@server.tool()
async def die() -> str:
    """The server process exits in the middle of the call."""
    os._exit(1)


@server.tool()
async def charge_then_die(account: str, cents: int, ctx: Context) -> str:
    """Charge an account, then exit before answering: the effect is made, the answer lost."""
    meta = ctx.request_context.meta or {}
    line = json.dumps({"key": meta.get(KEY), "account": account, "cents": cents})
    _append(Path(os.environ["MCP_TEST_LEDGER"]), line)
    os._exit(1)


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool, and tell the client its tool list changed."""
    server.add_tool(_extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "grown"


def _extra() -> str:
    return "extra"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def header(name: str, ctx: Context) -> str:
    """The value of one HTTP request header ("" over stdio)."""
    return (ctx.headers or {}).get(name, "")


@server.tool()
async def keyed(text: str, request_key: str) -> str:
    """Echo the key it was given as an argument."""
    return f"{text}:{request_key}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def fenced(fence: str) -> str:
    """An argument of its own named like Onward's fence keyword: say it back."""
    return fence


if VARIANT == "v2":

    @server.tool()
    async def refund(account: str) -> str:
        """Refund an account (only in v2)."""
        return f"refunded {account}"


def _gateway(app: Any) -> Any:
    """``app`` behind a gateway that gives up on each ``charge`` call: the server handles it,
    and the client gets 502 Bad Gateway (an HTML page, as proxies send) instead of its answer."""

    async def gateway(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            request = json.loads(body)
        except ValueError:
            request = {}
        if request.get("method") != "tools/call" or request["params"]["name"] != "charge":
            await app(scope, replay, send)
            return

        async def swallow(message: Any) -> None:
            pass

        await app(scope, replay, swallow)
        headers = [(b"content-type", b"text/html")]
        await send({"type": "http.response.start", "status": 502, "headers": headers})
        await send({"type": "http.response.body", "body": b"<h1>502 Bad Gateway</h1>"})

    return gateway


if __name__ == "__main__":
    if sys.argv[1:2] == ["http-gateway"]:
        import uvicorn

        web = _gateway(server.streamable_http_app(json_response=True))
        uvicorn.run(web, host="127.0.0.1", port=int(sys.argv[2]), log_level="error")
    elif sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif sys.argv[1:2] == ["http-json"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), json_response=True)
    else:
        server.run()
