"""MCP tools against real MCP servers (stdio and streamable HTTP), and warm restart on Redis."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import pytest
from support.crash_world import until_lapsed
from support.processes import kill_if_running, reaped
from support.proxy import TcpProxy

from integrations.mcp_world import (
    TENANT,
    TESTS,
    charging_agent,
    charging_provider,
    ledger,
    listings,
    metas,
    stdio_server,
    switch,
)
from onward.errors import BackendUnavailableError, ConfigurationError, IndeterminateToolCallError
from onward.eventlog import SqliteEventLog, ToolCall, ToolCompleted, ToolDispatched
from onward.integrations.mcp import (
    FENCE_META_KEY,
    IDEMPOTENCY_META_KEY,
    LEASE_EXPIRY_META_KEY,
    HttpServer,
    MCPSettings,
    MCPToolError,
    MCPToolset,
    SchemaCache,
    StdioServer,
    ToolOptions,
    forget_schemas,
    load_mcp_settings,
)
from onward.integrations.mcp import cache as cache_module
from onward.integrations.mcp.servers import Connection
from onward.runtime.agent import Agent
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Reconciled, idempotency_key

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cache(redis_url: str, redis_prefix: str) -> AsyncIterator[SchemaCache]:
    """A schema cache under the test's own Redis prefix (whose keys are removed afterwards)."""
    async with SchemaCache.from_url(redis_url, prefix=f"{redis_prefix}mcp:schema:") as schemas:
        yield schemas


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    """The test server over streamable HTTP on a free loopback port; yields its URL."""
    port = _free_port()
    env = os.environ | {
        "PYTHONPATH": str(TESTS),
        "MCP_TEST_LISTINGS": str(tmp_path / "web.listings"),
        "MCP_TEST_LEDGER": str(tmp_path / "ledger.jsonl"),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "integrations.mcp_server", "http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # A failure bound, within the test's 60 s: on a loaded machine the server's imports
        # alone took over 20 s, past the 200 tries after which this went on unheard.
        deadline = time.monotonic() + 40
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                if process.poll() is not None:
                    pytest.fail(f"the HTTP MCP server exited with {process.returncode}")
                if time.monotonic() > deadline:
                    pytest.fail(f"the HTTP MCP server was not listening on {port} within 40s")
                subprocess.run(["sleep", "0.05"], check=True)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        try:
            process.terminate()
            process.wait(timeout=10)
        finally:
            kill_if_running(process)  # one that did not end on SIGTERM would outlive the test


# -- tools from a server ------------------------------------------------------------------------


async def test_stdio_tools_become_onward_tools(tmp_path: Path) -> None:
    server = stdio_server(tmp_path, tools={"charge": ToolOptions(requires_approval=True)})
    async with MCPToolset([server]) as toolset:
        tools = {t.name: t for t in toolset.tools}
        assert sorted(tools) == [
            "add",
            "charge",
            "charge_then_die",
            "die",
            "echo",
            "fail",
            "fenced",
            "freeze",
            "grow",
            "header",
            "keyed",
            "wait",
        ]
        echo, charge = tools["echo"], tools["charge"]
        assert echo.description == "Say the text back."
        assert echo.parameters["required"] == ["text"]
        assert echo.retry_safe  # readOnlyHint
        assert not charge.retry_safe
        assert charge.requires_approval
        assert await echo.call({"text": "hi"}, idempotency_key="k0") == {"result": "hi"}
        assert await tools["add"].call({"a": 2, "b": 3}, idempotency_key="k1") == {"sum": 5}
        await charge.call({"account": "a1", "cents": 7}, idempotency_key="k2")
    assert ledger(tmp_path) == [{"key": "k2", "account": "a1", "cents": 7}]


async def test_a_tool_error_is_raised_with_its_message(tmp_path: Path) -> None:
    async with MCPToolset([stdio_server(tmp_path)]) as toolset:
        (fail,) = [t for t in toolset.tools if t.name == "fail"]
        with pytest.raises(MCPToolError, match="out of paper") as caught:
            await fail.call({"reason": "out of paper"}, idempotency_key="k")
    assert (caught.value.server, caught.value.tool) == ("ledger", "fail")


async def test_the_key_can_also_go_as_an_argument(tmp_path: Path) -> None:
    async with MCPToolset([stdio_server(tmp_path, key_argument="request_key")]) as toolset:
        (keyed,) = [t for t in toolset.tools if t.name == "keyed"]
        assert "request_key" not in keyed.parameters["properties"]
        assert keyed.parameters["required"] == ["text"]
        assert await keyed.call({"text": "t"}, idempotency_key="k9") == {"result": "t:k9"}


async def test_options_may_override_annotations(tmp_path: Path) -> None:
    server = stdio_server(tmp_path, tools={"echo": ToolOptions(retry_safe=False)})
    async with MCPToolset([server]) as toolset:
        assert not next(t for t in toolset.tools if t.name == "echo").retry_safe


async def test_options_for_a_tool_the_server_lacks_are_refused(tmp_path: Path) -> None:
    server = stdio_server(tmp_path, tools={"chrage": ToolOptions(requires_approval=True)})
    with pytest.raises(ConfigurationError, match="chrage"):
        await MCPToolset.open([server])


async def test_names_that_clash_across_servers_are_refused_unless_prefixed(
    tmp_path: Path,
) -> None:
    one, two = stdio_server(tmp_path, name="one"), stdio_server(tmp_path, name="two")
    clashing = MCPToolset([one, two])
    with pytest.raises(ConfigurationError, match="'one' and 'two'"):
        await clashing.start()
    assert not clashing.is_open
    assert not any(c.is_open for c in clashing.connections.values())  # both servers stopped
    prefixed = stdio_server(tmp_path, name="two", prefix="two_")
    async with MCPToolset([one, prefixed]) as toolset:
        assert "two_echo" in {t.name for t in toolset.tools}
        tool = next(t for t in toolset.tools if t.name == "two_add")
        assert await tool.call({"a": 1, "b": 1}, idempotency_key="k") == {"sum": 2}


async def test_streamable_http_server(tmp_path: Path, http_server: str) -> None:
    server = HttpServer(name="web", url=http_server, headers={"x-tenant": TENANT})
    async with MCPToolset([server]) as toolset:
        charge = next(t for t in toolset.tools if t.name == "charge")
        assert await charge.call({"account": "h", "cents": 1}, idempotency_key="kh") == {
            "result": "charged h 1"
        }
        header = next(t for t in toolset.tools if t.name == "header")
        assert await header.call({"name": "x-tenant"}, idempotency_key="k") == {"result": TENANT}
    assert ledger(tmp_path) == [{"key": "kh", "account": "h", "cents": 1}]


# -- servers that are down -----------------------------------------------------------------------


async def test_a_command_that_does_not_exist_is_a_named_error() -> None:
    server = StdioServer(name="ghost", command="/nonexistent/mcp-server")
    with pytest.raises(BackendUnavailableError, match=r"'ghost'.*nonexistent"):
        await MCPToolset.open([server], connect_timeout=5)


async def test_a_server_that_exits_at_start_is_a_named_error(tmp_path: Path) -> None:
    """Its exit, not a timeout: with a 5 s bound, a loaded machine (the server's imports took
    over 20 s) passed this test on the timeout's message."""
    server = stdio_server(tmp_path, name="crashy", crash=True)
    with pytest.raises(BackendUnavailableError, match=r"MCP server 'crashy'.*: connecting failed"):
        await MCPToolset.open([server], connect_timeout=45)


async def test_a_server_that_never_answers_is_a_named_timeout() -> None:
    server = StdioServer(
        name="mute", command=sys.executable, args=("-c", "import time; time.sleep(60)")
    )
    with pytest.raises(BackendUnavailableError, match=r"'mute'.*no answer within 1s"):
        await MCPToolset.open([server], connect_timeout=1)


async def test_a_handshake_failing_as_its_caller_is_cancelled_leaves_no_unread_error(
    tmp_path: Path,
) -> None:
    """The caller waiting for a session is cancelled (its own timeout) just as the server's
    handshake fails: the failure is nobody's to report, and asyncio must not log it as an
    error nobody read, with a traceback of a connection the caller gave up on. The server exits
    before importing anything (the test server's imports took over 20 s on a loaded machine),
    and the connect limit is only a failure bound: the handshake must fail, not time out."""
    loop = asyncio.get_running_loop()
    unread: list[str] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unread.append(str(context.get("message"))))
    crashy = StdioServer(
        name="crashy", command=sys.executable, args=("-c", "import sys; sys.exit('on purpose')")
    )
    connection = Connection(crashy, connect_timeout=30)
    try:
        opening = asyncio.create_task(connection.session())
        # Turn by turn, to cancel the caller in the turn the handshake failed in. A caller
        # that ended first (its limit passed) leaves a handshake that never ends: not waited on.
        while not opening.done() and (  # noqa: ASYNC110
            (ready := connection._here().ready) is None or not ready.done()
        ):
            await asyncio.sleep(0)
        if opening.done():
            pytest.fail(f"the caller ended before the handshake failed: {opening.exception()!r}")
        opening.cancel()  # before it takes the failure
        with pytest.raises(asyncio.CancelledError):
            await opening
        with pytest.raises(BackendUnavailableError, match="'crashy'"):
            await connection.session()  # a new handshake, in place of the failed one
        del opening, ready  # the test must not keep the failed handshake alive past its check
        gc.collect()
        await asyncio.sleep(0)
    finally:
        await connection.close()
        loop.set_exception_handler(handler)
    assert unread == []


async def test_a_server_that_dies_mid_call_is_a_named_error_then_restarted(
    tmp_path: Path,
) -> None:
    async with MCPToolset([stdio_server(tmp_path)], connect_timeout=30) as toolset:
        tools = {t.name: t for t in toolset.tools}
        with pytest.raises(BackendUnavailableError, match=r"MCP server 'ledger'.*'die'"):
            await tools["die"].call({}, idempotency_key="k1")
        assert await tools["echo"].call({"text": "back"}, idempotency_key="k2") == {
            "result": "back"
        }
        assert toolset.connections["ledger"].sessions == 2
    assert not toolset.connections["ledger"].is_open
    assert listings(tmp_path) == 1  # the new session reported the same version


async def test_an_http_server_that_is_down_is_a_named_error() -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    with pytest.raises(BackendUnavailableError, match=f"'down' \\({url}\\)"):
        await MCPToolset.open([HttpServer(name="down", url=url)], connect_timeout=5)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:99999/mcp", "localhost:8000/mcp", "", "ftp://files.example/mcp"],
)
def test_a_url_that_is_no_http_url_is_refused_naming_the_server(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"MCP server 'web'.*url"):
        HttpServer(name="web", url=url)


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan"), "30"])
def test_a_timeout_no_request_fits_in_is_refused_naming_the_server(seconds: object) -> None:
    """Accepted before, zero failed every connection with a bare ``ConnectTimeout`` and nan
    with ``deadline must not be NaN``, neither naming the setting."""
    with pytest.raises(ConfigurationError, match=r"MCP server 'web'.*timeout_seconds"):
        HttpServer(name="web", url="http://127.0.0.1:8000/mcp", timeout_seconds=seconds)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        "gopher://user:s3cret@example.com/mcp?token=t0ken",
        "user:s3cret@example.com/mcp?token=t0ken",
        "s3cret@example.com/mcp",
    ],
    ids=["another-scheme", "no-scheme", "no-scheme-token-as-user"],
)
def test_the_url_refused_is_shown_without_its_credentials(url: str) -> None:
    """Without ``scheme://`` the credentials are not parsed as such (``user`` is read as the
    scheme, the rest as the path), and were shown as they were given."""
    with pytest.raises(ConfigurationError) as caught:
        HttpServer(name="web", url=url)
    assert "s3cret" not in str(caught.value)
    assert "t0ken" not in str(caught.value)
    assert "example.com/mcp" in str(caught.value)


@pytest.mark.parametrize(
    "url",
    ["http://user:s3cr/et@example.com/mcp", "http://user:s3cr?et@example.com/mcp"],
    ids=["slash", "question-mark"],
)
def test_a_url_whose_password_holds_a_slash_is_refused_without_a_piece_of_it(url: str) -> None:
    """A password holding an unencoded ``/`` or ``?`` ends the authority early: its first half
    is parsed as the port, and the parser's refusal quoted it."""
    with pytest.raises(ConfigurationError, match="MCP server 'web'") as caught:
        HttpServer(name="web", url=url)
    assert "s3cr" not in str(caught.value)
    assert "example.com/mcp" in str(caught.value)


def test_an_http_servers_repr_hides_a_password_parsed_as_port_and_path() -> None:
    """``http://user:1234/s3cret@host`` is parsed as host ``user``, port ``1234``, path
    ``/s3cret@host``: its repr showed the whole password as the path."""
    server = HttpServer(name="web", url="https://user:1234/s3cret@example.com/mcp")
    assert "s3cret" not in repr(server)
    assert "1234" not in repr(server)
    assert "example.com/mcp" in repr(server)


def test_an_http_servers_repr_shows_its_url_without_credentials() -> None:
    """Its headers were kept out of its repr, its url (which may hold a password or a token
    in its query) was not."""
    server = HttpServer(name="web", url="https://user:s3cret@example.com/mcp?token=t0ken")
    assert "s3cret" not in repr(server)
    assert "t0ken" not in repr(server)
    assert "https://example.com/mcp" in repr(server)


# -- warm restart ---------------------------------------------------------------------------------


async def test_a_resume_reads_schemas_from_the_cache_not_the_server(
    tmp_path: Path, cache: SchemaCache
) -> None:
    server = stdio_server(tmp_path)
    async with MCPToolset([server], run_id="r1", cache=cache) as first:
        assert first.warm == ()
        revision = charging_agent(first.tools).revision
    assert listings(tmp_path) == 1
    async with MCPToolset([server], run_id="r1", cache=cache) as second:
        assert second.warm == ("ledger",)
        assert charging_agent(second.tools).revision == revision
        add = next(t for t in second.tools if t.name == "add")
        assert await add.call({"a": 1, "b": 2}, idempotency_key="k") == {"sum": 3}
    assert listings(tmp_path) == 1
    async with MCPToolset([server], run_id="another run", cache=cache):
        pass
    assert listings(tmp_path) == 2


async def test_warm_restart_over_http(tmp_path: Path, http_server: str, cache: SchemaCache) -> None:
    server = HttpServer(name="web", url=http_server)
    for _ in range(3):
        async with MCPToolset([server], run_id="r1", cache=cache) as toolset:
            echo = next(t for t in toolset.tools if t.name == "echo")
            assert await echo.call({"text": "x"}, idempotency_key="k") == {"result": "x"}
    assert listings(tmp_path, "web") == 1


async def test_without_a_cache_every_open_lists(tmp_path: Path) -> None:
    server = stdio_server(tmp_path)
    for _ in range(2):
        async with MCPToolset([server], run_id="r1"):
            pass
    assert listings(tmp_path) == 2


async def test_a_reconnect_reporting_other_tools_replaces_the_entry(
    tmp_path: Path, cache: SchemaCache
) -> None:
    async with MCPToolset([stdio_server(tmp_path)], run_id="r1", cache=cache) as first:
        old = charging_agent(first.tools).revision
    before = (await cache.load("r1"))["ledger"]

    # The server was upgraded while the run was down: it reports v2 and one more tool.
    switch(tmp_path, "v2")
    upgraded = stdio_server(tmp_path)
    async with MCPToolset([upgraded], run_id="r1", cache=cache) as resumed:
        assert resumed.warm == ("ledger",)
        assert charging_agent(resumed.tools).revision == old  # the run keeps its tools
        echo = next(t for t in resumed.tools if t.name == "echo")
        await echo.call({"text": "x"}, idempotency_key="k")  # new session: v2, listed again
        assert resumed.replaced == ["ledger"]
    after = (await cache.load("r1"))["ledger"]
    assert (before.server_version, after.server_version) == ("test-v1", "test-v2")
    assert after.digest != before.digest
    assert "refund" in {t["name"] for t in after.tools}
    assert listings(tmp_path) == 2

    async with MCPToolset([upgraded], run_id="r1", cache=cache) as later:
        assert "refund" in {t.name for t in later.tools}
        assert charging_agent(later.tools).revision != old
    assert listings(tmp_path) == 2


async def test_a_tools_changed_notification_replaces_the_entry(
    tmp_path: Path, cache: SchemaCache
) -> None:
    async with MCPToolset([stdio_server(tmp_path)], run_id="r1", cache=cache) as toolset:
        tools = {t.name: t for t in toolset.tools}
        await tools["grow"].call({}, idempotency_key="k1")
        connection = toolset.connections["ledger"]
        for _ in range(100):
            if connection.list_changes:
                break
            await asyncio.sleep(0.01)
        assert connection.list_changes
        await tools["echo"].call({"text": "x"}, idempotency_key="k2")  # lists before calling
        assert toolset.replaced == ["ledger"]
        assert "extra" not in {t.name for t in toolset.tools}  # the run keeps its tools
    assert "extra" in {t["name"] for t in (await cache.load("r1"))["ledger"].tools}
    assert listings(tmp_path) == 2


async def test_gc_removes_a_runs_entry(tmp_path: Path, cache: SchemaCache) -> None:
    async with MCPToolset([stdio_server(tmp_path)], run_id="r1", cache=cache):
        pass
    ttl = await cache.client.pttl(cache.key("r1"))
    assert 0 < ttl <= timedelta(hours=24) / timedelta(milliseconds=1)
    assert await cache.forget("r1")
    assert not await cache.forget("r1")
    assert await cache.load("r1") == {}


@pytest.mark.parametrize(
    ("url", "hidden"),
    [
        ("redis://default:pa/ss@127.0.0.1:6379/0", ("pa/ss", "pa")),
        ("redis://default:s3c#ret@127.0.0.1:6379/0", ("s3c#ret", "s3c")),
        ("redis://default:s3cret@127.0.0.1:6379/0?socket_timeout=abc", ("s3cret",)),
        ("redis://default:s3cret@127.0.0.1:6379/0?no_such_option=1", ("s3cret",)),
    ],
)
def test_a_redis_url_the_cache_cannot_use_is_refused_without_its_password(
    url: str, hidden: tuple[str, ...]
) -> None:
    """A schema cache's REDIS_URL redis-py cannot use failed with its bare ValueError, which
    quoted the half of a password holding a ``/`` or ``#`` as the port, or (an option it does
    not take) at the first read, as a TypeError out of the run: it is refused when the cache
    is made, naming REDIS_URL without its password, as a Redis store refuses it."""
    with pytest.raises(ConfigurationError, match="REDIS_URL redis://default:\\*\\*\\*@") as refused:
        SchemaCache.from_url(url)
    for piece in hidden:
        assert f"'{piece}'" not in str(refused.value)
        assert f":{piece}@" not in str(refused.value)


async def test_a_redis_that_is_down_costs_warmth_not_the_run(tmp_path: Path) -> None:
    async with SchemaCache.from_url(f"redis://127.0.0.1:{_free_port()}/0") as down:
        async with MCPToolset([stdio_server(tmp_path)], run_id="r1", cache=down) as toolset:
            assert toolset.warm == ()
            assert {t.name for t in toolset.tools} >= {"echo", "charge"}
        with pytest.raises(BackendUnavailableError, match="removing"):
            await down.forget("r1")
    assert listings(tmp_path) == 1


async def test_a_redis_that_stops_answering_costs_warmth_not_the_run(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition or a hung Redis: the cache's reads and writes give up after its timeout,
    so the toolset lists the server and opens, rather than wait for good."""
    monkeypatch.setattr(cache_module, "CACHE_TIMEOUT_S", 0.5)
    parts = urlsplit(redis_url)
    assert parts.hostname is not None
    assert parts.port is not None
    async with TcpProxy(parts.hostname, parts.port) as proxy:
        through = redis_url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}")
        async with SchemaCache.from_url(through, prefix="onward-test-silent:") as silent:
            await silent.load("r1")  # connected before the network goes quiet
            await proxy.cut(silent=True)
            try:
                async with asyncio.timeout(10):
                    async with MCPToolset(
                        [stdio_server(tmp_path)], run_id="r1", cache=silent
                    ) as toolset:
                        assert toolset.warm == ()
                        assert {t.name for t in toolset.tools} >= {"echo", "charge"}
                    with pytest.raises(BackendUnavailableError, match="removing"):
                        await silent.forget("r1")
            finally:
                await proxy.restore()
    assert listings(tmp_path) == 1


async def test_forget_schemas_reads_the_environment(
    tmp_path: Path, cache: SchemaCache, redis_url: str
) -> None:
    async with MCPToolset([stdio_server(tmp_path)], run_id="r1", cache=cache):
        pass
    settings = MCPSettings.model_validate(
        {"REDIS_URL": redis_url, "MCP_SCHEMA_CACHE_PREFIX": cache.prefix}
    )
    assert await forget_schemas("r1", settings=settings)
    assert await cache.load("r1") == {}


async def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ("MCP_SCHEMA_CACHE_ENABLED", "MCP_SCHEMA_CACHE_TTL_HOURS", "MCP_SCHEMA_CACHE_PREFIX")
    for name in (*names, "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    assert not load_mcp_settings().cache_enabled
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    settings = load_mcp_settings()
    assert (settings.cache_enabled, settings.schema_cache_ttl_hours) == (True, 24)
    monkeypatch.setenv("MCP_SCHEMA_CACHE_TTL_HOURS", "1.5")
    monkeypatch.setenv("MCP_SCHEMA_CACHE_PREFIX", "app:")
    cache = SchemaCache.from_settings()
    assert cache is not None
    async with cache:
        assert (cache.ttl, cache.key("r1")) == (timedelta(hours=1.5), "app:r1")
    monkeypatch.setenv("MCP_SCHEMA_CACHE_ENABLED", "false")
    assert SchemaCache.from_settings(load_mcp_settings()) is None
    monkeypatch.setenv("MCP_SCHEMA_CACHE_TTL_HOURS", "0")
    with pytest.raises(ConfigurationError, match="MCP_SCHEMA_CACHE_TTL_HOURS"):
        load_mcp_settings()
    monkeypatch.delenv("MCP_SCHEMA_CACHE_TTL_HOURS")
    monkeypatch.delenv("REDIS_URL")
    monkeypatch.setenv("MCP_SCHEMA_CACHE_ENABLED", "true")
    with pytest.raises(ConfigurationError, match="REDIS_URL"):
        load_mcp_settings()


# -- through the runner ---------------------------------------------------------------------------


async def test_a_run_calls_the_mcp_tool_with_its_idempotency_key(tmp_path: Path) -> None:
    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([stdio_server(tmp_path)]) as toolset,
        AgentRunner(provider=charging_provider(), log=log, worker="w") as runner,
    ):
        result = await runner.run(charging_agent(toolset.tools), "go", tenant=TENANT, run_id="r1")
        events = [s.event for s in await log.read_run("r1")]
    assert (result.status, result.output) == ("completed", "charged")
    assert ledger(tmp_path) == [{"key": idempotency_key("r1", "c1"), "account": "a1", "cents": 500}]
    (completed,) = [e for e in events if isinstance(e, ToolCompleted)]
    assert (completed.result, completed.error) == ({"result": "charged a1 500"}, None)


async def test_a_run_sends_the_fence_and_lease_expiry_of_its_dispatch_in_meta(
    tmp_path: Path,
) -> None:
    """The server sees the fence the call was dispatched under, so it can refuse older ones."""
    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([stdio_server(tmp_path)]) as toolset,
        AgentRunner(provider=charging_provider(), log=log, worker="w") as runner,
    ):
        for _ in range(2):  # earlier claims of the run raise its fence above the first
            await runner.leases.release(
                await runner.leases.acquire("r1", tenant=TENANT, holder="x", ttl_s=30)
            )
        before = time.time()
        await runner.run(charging_agent(toolset.tools), "go", tenant=TENANT, run_id="r1")
        (dispatched,) = [
            s.event for s in await log.read_run("r1") if isinstance(s.event, ToolDispatched)
        ]
    (meta,) = metas(tmp_path)
    assert dispatched.fence == 3
    assert meta[FENCE_META_KEY] == dispatched.fence
    assert meta[IDEMPOTENCY_META_KEY] == idempotency_key("r1", "c1")
    ttl = runner.lease_policy.ttl_s
    assert before + ttl - 1 < meta[LEASE_EXPIRY_META_KEY] < time.time() + ttl + 1


async def test_an_argument_named_fence_stays_the_models(tmp_path: Path) -> None:
    """A server's own ``fence`` argument is not replaced by the lease's (nor sent in ``_meta``)."""
    async with MCPToolset([stdio_server(tmp_path)]) as toolset:
        fenced = next(t for t in toolset.tools if t.name == "fenced")
        assert "fence" in fenced.parameters["properties"]
        assert (fenced.takes_fence, fenced.takes_lease_expiry) == (False, True)
        answer = await fenced.call(
            {"fence": "north"}, idempotency_key="k", fence=7, lease_expires_at=1.5
        )
    assert answer == {"result": "north"}


async def test_a_failing_mcp_tool_is_recorded_as_a_typed_error(tmp_path: Path) -> None:
    provider = ScriptedProvider(
        [reply("", ToolCall(call_id="f", tool="fail", args={"reason": "nope"})), reply("ok")]
    )
    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([stdio_server(tmp_path)]) as toolset,
        AgentRunner(provider=provider, log=log, worker="w") as runner,
    ):
        agent = Agent(name="a", instructions="i", tools=toolset.tools)
        await runner.run(agent, "go", tenant=TENANT, run_id="r1")
        (completed,) = [
            s.event for s in await log.read_run("r1") if isinstance(s.event, ToolCompleted)
        ]
    assert completed.error is not None
    assert completed.error.type == "MCPToolError"
    assert "nope" in completed.error.message


def _charging_twice() -> ScriptedProvider:
    """A model that answers a failed charge by charging again, under a new call id."""
    charge = {"account": "a1", "cents": 500}
    return ScriptedProvider(
        [
            reply("", ToolCall(call_id="c1", tool="charge_then_die", args=charge)),
            reply("", ToolCall(call_id="c2", tool="charge_then_die", args=charge)),
            reply("charged"),
        ]
    )


async def test_a_call_whose_answer_is_lost_waits_for_a_person_not_the_model(
    tmp_path: Path,
) -> None:
    """The server charged and died before answering: the call may have taken effect, so the
    model is not told it failed (it would charge again); the run waits for `onward resolve`."""
    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([stdio_server(tmp_path)], connect_timeout=30) as toolset,
        AgentRunner(provider=_charging_twice(), log=log, worker="w") as runner,
    ):
        with pytest.raises(IndeterminateToolCallError) as caught:
            await runner.run(charging_agent(toolset.tools), "go", tenant=TENANT, run_id="r1")
        events = [s.event for s in await log.read_run("r1")]
    assert [c.call_id for c in caught.value.calls] == ["c1"]
    assert not [e for e in events if isinstance(e, ToolCompleted)]
    assert ledger(tmp_path) == [{"key": idempotency_key("r1", "c1"), "account": "a1", "cents": 500}]


async def test_a_call_whose_answer_is_lost_is_settled_by_its_status_check(
    tmp_path: Path,
) -> None:
    """With a status check, the lost answer is asked for: the charge took effect, so that is
    the call's outcome, and the run goes on without a second charge."""

    async def charged(key: str) -> Reconciled:
        made = any(entry["key"] == key for entry in ledger(tmp_path))
        return Reconciled("completed", "charged") if made else Reconciled("never_ran")

    options = {"charge_then_die": ToolOptions(reconcile=charged)}
    provider = ScriptedProvider(
        [
            reply(
                "",
                ToolCall(call_id="c1", tool="charge_then_die", args={"account": "a1", "cents": 5}),
            ),
            reply("charged"),
        ]
    )
    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([stdio_server(tmp_path, tools=options)], connect_timeout=30) as toolset,
        AgentRunner(provider=provider, log=log, worker="w") as runner,
    ):
        result = await runner.run(charging_agent(toolset.tools), "go", tenant=TENANT, run_id="r1")
    assert result.status == "completed"
    assert len(ledger(tmp_path)) == 1


async def test_a_retry_safe_call_whose_answer_is_lost_is_its_error(tmp_path: Path) -> None:
    """Calling a retry-safe tool again is harmless: the lost answer is its error, for the model."""
    options = {"charge_then_die": ToolOptions(retry_safe=True)}
    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([stdio_server(tmp_path, tools=options)], connect_timeout=30) as toolset,
        AgentRunner(provider=_charging_twice(), log=log, worker="w") as runner,
    ):
        result = await runner.run(charging_agent(toolset.tools), "go", tenant=TENANT, run_id="r1")
        completed = [
            s.event for s in await log.read_run("r1") if isinstance(s.event, ToolCompleted)
        ]
    assert result.status == "completed"
    assert [c.error.type if c.error else None for c in completed] == ["OutcomeUnknownError"] * 2


async def test_an_mcp_tool_that_needs_approval_waits(tmp_path: Path) -> None:
    server = stdio_server(tmp_path, tools={"charge": ToolOptions(requires_approval=True)})
    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([server]) as toolset,
        AgentRunner(provider=charging_provider(), log=log, worker="w") as runner,
    ):
        result = await runner.run(charging_agent(toolset.tools), "go", tenant=TENANT, run_id="r1")
    assert (result.status, result.waiting_on) == ("waiting", "c1")
    assert ledger(tmp_path) == []


async def test_a_server_down_on_resume_is_recorded_naming_it(
    tmp_path: Path, cache: SchemaCache
) -> None:
    async with MCPToolset([stdio_server(tmp_path)], run_id="r1", cache=cache):
        pass
    # Warm: the schemas come from the cache; the server is only started at the first call.
    switch(tmp_path, "crash")
    down = stdio_server(tmp_path)
    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([down], run_id="r1", cache=cache, connect_timeout=5) as toolset,
        AgentRunner(provider=charging_provider(), log=log, worker="w") as runner,
    ):
        await runner.run(charging_agent(toolset.tools), "go", tenant=TENANT, run_id="r1")
        (completed,) = [
            s.event for s in await log.read_run("r1") if isinstance(s.event, ToolCompleted)
        ]
    assert completed.error is not None
    assert completed.error.type == "BackendUnavailableError"
    assert "MCP server 'ledger'" in completed.error.message
    assert ledger(tmp_path) == []


async def test_resume_after_a_sigkill_between_side_effect_and_outcome(
    tmp_path: Path, cache: SchemaCache, redis_url: str
) -> None:
    config = {
        "db": str(tmp_path / "log.db"),
        "tmp": str(tmp_path),
        "run_id": "r1",
        "redis_url": redis_url,
        "prefix": cache.prefix,
    }
    async with reaped() as children:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "integrations.mcp_child",
            json.dumps(config),
            env=os.environ | {"PYTHONPATH": str(TESTS)},
        )
        children.append(child)
        assert await asyncio.wait_for(child.wait(), 30) == -9
    assert len(ledger(tmp_path)) == 1  # the side effect happened; its outcome was never written
    assert listings(tmp_path) == 1

    async with (
        SqliteEventLog(tmp_path / "log.db") as log,
        MCPToolset([stdio_server(tmp_path)], run_id="r1", cache=cache) as toolset,
        AgentRunner(provider=charging_provider(), log=log, worker="w") as runner,
    ):
        assert toolset.warm == ("ledger",)
        await until_lapsed(runner.leases, "r1")  # the killed child's lease, on the store's clock
        with pytest.raises(IndeterminateToolCallError) as caught:
            await runner.resume(charging_agent(toolset.tools), "r1", tenant=TENANT)
    assert [c.call_id for c in caught.value.calls] == ["c1"]
    assert len(ledger(tmp_path)) == 1  # not called again
    assert listings(tmp_path) == 1  # and the resume did not list the server's tools


def test_cached_listings_round_trip() -> None:
    from onward.integrations.mcp import ServerSchema  # noqa: PLC0415

    schema = ServerSchema.of(
        [{"name": "b", "inputSchema": {}}, {"name": "a", "inputSchema": {}}],
        endpoint="x",
        server_name="s",
        server_version="1",
    )
    assert [t["name"] for t in schema.tools] == ["a", "b"]
    assert msgspec.json.decode(msgspec.json.encode(schema), type=ServerSchema) == schema
