"""Secrets are masked on every path: by the key they are stored under, in shapes the patterns
used to miss, at any depth, and in settings and error messages (security review #4, #13, #18,
#20, #23).

Every secret here is invented and assembled at run time, so no literal token that looks real
sits in the source.
"""

from __future__ import annotations

import asyncio
import decimal
import json
import logging
import random
import string
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest
from langchain_core.messages import ToolCall as LangChainToolCall
from langchain_core.messages import ToolMessage
from langgraph.prebuilt import ToolRuntime
from langgraph.prebuilt.tool_node import ToolCallRequest
from support.sqlite_files import stored_bytes
from support.stores import sqlite_stores
from typer.testing import CliRunner

from onward._storage.logs import masked_http_logs
from onward.errors import BackendUnavailableError, ConfigurationError, InvalidInputError
from onward.eventlog.events import ToolCall, ToolCompleted
from onward.integrations.langgraph import OnwardSaver
from onward.integrations.langgraph.tools import OnwardToolMiddleware
from onward.integrations.mcp import HttpServer, MCPToolset
from onward.integrations.mcp.cache import load_mcp_settings
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.postgres_sql import SqlProjectionSink
from onward.runtime.cli import app as cli_app
from onward.runtime.cli._common import imported
from onward.runtime.leases import RedisLeaseStore
from onward.runtime.redaction import DEFAULT_MASK, Redactor
from onward.runtime.settings import load_settings

ALNUM = string.ascii_letters + string.digits


def invented(length: int, *, seed: int) -> str:
    """Invented characters of a secret's alphabet; the same for the same seed."""
    rng = random.Random(seed)
    return "".join(rng.choice(ALNUM) for _ in range(length))


PASSWORD = "hunter2-very-secret"
API_KEY = "sk-" + "live-" + invented(32, seed=1)
ANTHROPIC = "sk-" + "ant-api03-" + invented(60, seed=2)


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "Password",
        "passwd",
        "pwd",
        "DB_PASSWORD",
        "secret",
        "client_secret",
        "clientSecret",
        "token",
        "access_token",
        "refreshToken",
        "id-token",
        "api_key",
        "apiKey",
        "X-API-Key",
        "openai_api_key",
        "Authorization",
        "Proxy-Authorization",
        "cookie",
        "Set-Cookie",
        "session",
        "sessionid",
        "private_key",
        "credentials",
        "DBPassword",
        "APIToken",
        "IDToken",
        "JWTSecret",
        "AWSSecretAccessKey",
        "GCPCredentials",
        "passwords",
        "db_passwords",
        "secrets",
        "clientSecrets",
        "api_keys",
        "apiKeys",
        "private_keys",
        "cookies",
        "credential",
        "aws_credential",
        "passphrases",
    ],
)
def test_a_value_under_a_secret_key_is_masked_whole(key: str) -> None:
    """security review #4: a plain value under a key naming a secret is no longer stored, and
    keys that only look related (``max_tokens``, ``idempotency_key``) are left alone."""
    ordinary = {
        "user": "ann",
        "max_tokens": 4000,
        "maxTokens": 4000,
        "MaxTokens": 4000,
        "tokens": 12,
        "idempotency_key": "k-1",
        "HTTPTimeout": 30,
    }

    masked = Redactor().redact({**ordinary, key: "plainvalue42"})

    assert masked == {**ordinary, key: DEFAULT_MASK}


def test_tool_arguments_and_results_under_secret_keys_are_masked_in_events() -> None:
    """security review #4: ``{"password": ...}`` arguments and ``{"api_key": ...}`` results."""
    redactor = Redactor()
    call = ToolCall(call_id="c1", tool="login", args={"user": "ann", "password": PASSWORD})
    completed = ToolCompleted(
        run_id="r", tenant="t", seq=4, fence=1, call_id="c1", result={"api_key": API_KEY}
    )

    assert redactor.redact(call).args == {"user": "ann", "password": DEFAULT_MASK}
    assert redactor.redact_event(completed).result == {"api_key": DEFAULT_MASK}


def test_everything_nested_under_a_secret_key_is_masked_and_the_shape_kept() -> None:
    """security review #4: strings and numbers under a secret key, at any depth, are masked;
    None, booleans and binary values are kept."""
    value = {
        "credentials": {"user": "ann", "pin": 4821, "factors": ["otp-991", 3.5, None, True]},
        "blob": {"private_key": b"\x00binary"},
        "count": 3,
    }

    masked = Redactor().redact(value)

    assert masked == {
        "credentials": {
            "user": DEFAULT_MASK,
            "pin": DEFAULT_MASK,
            "factors": [DEFAULT_MASK, DEFAULT_MASK, None, True],
        },
        "blob": {"private_key": b"\x00binary"},
        "count": 3,
    }


def test_a_decimal_or_uuid_under_a_secret_key_is_masked_too() -> None:
    """A database driver hands NUMERIC columns back as `Decimal`, and a session id is often a
    `UUID`: the log writes both as their text, so under a key naming a secret they are
    secrets as a number or a string is, not values to keep."""
    session = uuid.UUID(int=0x5EC2E7)
    value = {
        "card_pin": decimal.Decimal("4821"),
        "session_id": session,
        "count": decimal.Decimal(3),
    }

    masked = Redactor(secret_keys=["*_pin"]).redact(value)

    assert masked == {"card_pin": DEFAULT_MASK, "session_id": DEFAULT_MASK, "count": 3}


def test_a_secret_used_as_a_dict_key_is_masked_and_keys_stay_distinct() -> None:
    """security review #4: keys are scanned too; two keys masked alike do not overwrite."""
    other = "sk-" + "ant-api03-" + invented(60, seed=3)
    value = {ANTHROPIC: 1, other: 2, DEFAULT_MASK: 0, "plain": "x"}

    masked = Redactor().redact(value)

    assert list(masked.values()) == [1, 2, 0, "x"]
    assert ANTHROPIC not in str(masked)
    assert other not in str(masked)
    assert set(masked) == {f"{DEFAULT_MASK}#2", f"{DEFAULT_MASK}#3", DEFAULT_MASK, "plain"}


def test_keys_equal_across_types_keep_their_own_type() -> None:
    """``True``, ``1`` and ``1.0`` are equal and hash alike, so a key cache blind to type
    handed back one of them for another: a dict keyed ``1.0`` came back keyed ``True``."""
    redactor = Redactor()

    assert redactor.redact({True: "a"}) == {True: "a"}
    for key in (1.0, 1, True, 0.0, False, 0):
        masked = redactor.redact({key: "a"})
        assert [type(k) for k in masked] == [type(key)]


def test_extra_secret_keys_from_the_parameter_and_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """security review #4: ``secret_keys=`` and ``ONWARD_REDACT_KEYS`` add names (``*_x`` as a
    suffix) to the defaults, which stay."""
    value = {"ssn": "123-45-6789", "card_pin": "4821", "password": "pw-1234567", "city": "Oslo"}
    masked = {"ssn": DEFAULT_MASK, "card_pin": DEFAULT_MASK, "password": DEFAULT_MASK}

    assert Redactor(secret_keys=["ssn", "*_pin"]).redact(value) == {**masked, "city": "Oslo"}
    monkeypatch.setenv("ONWARD_REDACT_KEYS", " SSN , *_pin,")
    assert Redactor().redact(value) == {**masked, "city": "Oslo"}


@pytest.mark.parametrize("names", [["-"], "ssn"])
def test_an_unusable_secret_key_name_is_refused_by_name(names: Any) -> None:
    """security review #4: a name with no letter, or one string instead of a list, is a clear
    `ConfigurationError`."""
    with pytest.raises(ConfigurationError, match="secret"):
        Redactor(secret_keys=names)


def test_a_bad_name_in_onward_redact_keys_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """security review #4: the environment's names are checked as the parameter's are."""
    monkeypatch.setenv("ONWARD_REDACT_KEYS", "ssn,*")

    with pytest.raises(ConfigurationError, match="ONWARD_REDACT_KEYS"):
        Redactor()


def nested(depth: int, leaf: Any) -> Any:
    """``leaf`` inside ``depth`` levels of alternating dicts and lists."""
    value = leaf
    for level in range(depth):
        value = {"next": value} if level % 2 else [value]
    return value


def innermost(value: Any) -> Any:
    """What ``nested`` put at the bottom."""
    while isinstance(value, list) or (isinstance(value, dict) and "next" in value):
        value = value["next"] if isinstance(value, dict) else value[0]
    return value


def test_a_value_nested_five_thousand_deep_is_masked_without_recursion_error() -> None:
    """security review #18: the walk used to recurse twice per level and failed near 500."""
    deep = nested(5000, {"password": PASSWORD, "note": f"key {ANTHROPIC}"})

    masked = Redactor().redact(deep)

    assert innermost(masked) == {"password": DEFAULT_MASK, "note": f"key {DEFAULT_MASK}"}


def test_a_deep_clean_value_is_the_same_object_and_an_event_holding_it_too() -> None:
    """security review #18: depth keeps the no-copy property, in a value and in an event, with
    key-aware masking looking at every key on the way."""
    deep = nested(5000, {"city": "Paris", "password_hint": None, "days": [1, 2]})
    event = ToolCompleted(run_id="r", tenant="t", seq=2, fence=1, call_id="c", result=deep)

    assert Redactor().redact(deep) is deep
    assert Redactor().redact_event(event) is event


def test_a_container_holding_itself_does_not_loop_for_ever() -> None:
    """security review #18: a walk without recursion must still end on a cycle."""
    looped: list[Any] = [f"Bearer {API_KEY}99"]
    looped.append(looped)

    masked = Redactor().redact(looped)

    assert masked[0] == f"Bearer {DEFAULT_MASK}"


def test_a_secret_key_masks_everything_under_it_at_any_depth() -> None:
    """security review #4 and #18: a secret key's masking reaches values hundreds of levels
    below it, past the depth where the walk stops recursing."""
    value = {"credentials": nested(300, {"note": "plain words", "pin": 4821})}

    masked = Redactor().redact(value)

    assert innermost(masked["credentials"]) == {"note": DEFAULT_MASK, "pin": DEFAULT_MASK}


@pytest.mark.parametrize(
    ("text", "expected", "prose"),
    [
        pytest.param(
            "GET https://api.example.com/v1/items?token=q8Zk2LmN4pRt&page=2",
            f"GET https://api.example.com/v1/items?token={DEFAULT_MASK}&page=2",
            "a token budget of 4000 per turn",
            id="query-token",
        ),
        pytest.param(
            "https://maps.example.com/geo?q=oslo&key=Zx81kLmQ0pWvTn3&lang=en",
            f"https://maps.example.com/geo?q=oslo&key={DEFAULT_MASK}&lang=en",
            "the key to success is practice; see https://example.com/search?q=keys&page=2",
            id="query-key",
        ),
        pytest.param(
            "https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&ss=b&srt=o&sp=r"
            "&se=2026-01-01T00:00:00Z&sig=k3J%2Bv9QeL0xY7%3D",
            "https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&ss=b&srt=o&sp=r"
            f"&se=2026-01-01T00:00:00Z&sig={DEFAULT_MASK}",
            "sign here: sig. J. Smith",
            id="azure-sas-sig",
        ),
        pytest.param(
            "Cookie: sessionid=9f8e7d6c5b4a; csrftoken=Qw3rTy",
            f"Cookie: {DEFAULT_MASK}",
            "Cookie: chocolate chip, please",
            id="cookie",
        ),
        pytest.param(
            "Set-Cookie: session=eyJ1c2VyIjo3fQ; Path=/; HttpOnly",
            f"Set-Cookie: {DEFAULT_MASK}",
            "the server sends a Set-Cookie header with the session",
            id="set-cookie",
        ),
        pytest.param(
            "PGPASSWORD s3cretPG psql -h db",
            f"PGPASSWORD {DEFAULT_MASK} psql -h db",
            "set PGPASSWORD before running psql",
            id="pgpassword-spaced",
        ),
        pytest.param(
            "mysql -h db.internal -u root -pS3cretMy shop",
            f"mysql -h db.internal -u root -p{DEFAULT_MASK} shop",
            "mysql -u root -p shop (it asks for the password)",
            id="mysql-p",
        ),
        pytest.param(
            "passwd hunter2-x",
            f"passwd {DEFAULT_MASK}",
            "reset your password from the settings page; the passwd file lists users",
            id="passwd-value",
        ),
    ],
)
def test_secret_shapes_the_patterns_missed_are_masked_and_prose_stays(
    text: str, expected: str, prose: str
) -> None:
    """security review #20: query tokens and keys, SAS signatures, cookies, ``PGPASSWORD
    value``, ``mysql -p`` and ``passwd value`` were stored in clear; prose near each shape
    must stay as it is."""
    redactor = Redactor()

    assert redactor.redact_text(text) == expected
    assert redactor.redact_text(prose) == prose


def sqlite_file_bytes(path: Path) -> bytes:
    """Every byte of a SQLite database, its -wal and -shm files included, and its rows unpacked."""
    return stored_bytes(path)


def tool_request(thread_id: str, call_id: str, args: dict[str, Any]) -> ToolCallRequest:
    """The request LangGraph's ToolNode hands the middleware for one call of ``login``."""
    runtime: ToolRuntime[None, dict[Any, Any]] = ToolRuntime(
        state={},
        context=None,
        config={"configurable": {"thread_id": thread_id}},
        stream_writer=lambda _chunk: None,
        tool_call_id=call_id,
        store=None,
    )
    call: LangChainToolCall = {"name": "login", "args": args, "id": call_id, "type": "tool_call"}
    return ToolCallRequest(tool_call=call, tool=None, state={}, runtime=runtime)


async def test_langgraph_tool_results_and_errors_are_masked_in_the_sqlite_file(
    tmp_path: Path,
) -> None:
    """security review #9(b): `OnwardToolMiddleware` wrote results and error text through the
    saver unmasked; a tool's ``{"api_key": ...}`` and an error quoting a password were in the
    SQLite file in clear."""
    path = tmp_path / "onward.db"
    error_text = f"login refused for ann with PGPASSWORD={PASSWORD}"

    async def returns_a_key(request: ToolCallRequest) -> ToolMessage:
        # What ToolNode makes of a tool returning a dict: its JSON as the message content.
        return ToolMessage(content=json.dumps({"api_key": API_KEY}), tool_call_id="call-1")

    async def fails(request: ToolCallRequest) -> ToolMessage:
        raise RuntimeError(error_text)

    async with sqlite_stores(path) as stores:
        saver = OnwardSaver(stores.log, stores.leases, tenant="acme")
        async with saver:
            middleware = OnwardToolMiddleware(saver)
            args = {"user": "ann", "password": PASSWORD}
            await middleware.awrap_tool_call(tool_request("t-1", "call-1", args), returns_a_key)
            with pytest.raises(RuntimeError):
                await middleware.awrap_tool_call(tool_request("t-1", "call-2", args), fails)
        events = [stored.event for stored in await stores.log.read_run("t-1")]

    completed = [event for event in events if isinstance(event, ToolCompleted)]
    assert [event.call_id for event in completed] == ["call-1", "call-2"]
    assert completed[0].result == json.dumps({"api_key": DEFAULT_MASK})
    assert completed[1].error is not None
    assert DEFAULT_MASK in completed[1].error.message
    stored_bytes = sqlite_file_bytes(path)
    assert API_KEY.encode() not in stored_bytes
    assert PASSWORD.encode() not in stored_bytes


async def test_a_saver_with_redaction_off_keeps_the_value(tmp_path: Path) -> None:
    """security review #9(b): ``Redactor(enabled=False)`` turns the saver's masking off."""
    async with sqlite_stores(tmp_path / "onward.db") as stores:
        saver = OnwardSaver(
            stores.log, stores.leases, tenant="acme", redactor=Redactor(enabled=False)
        )
        async with saver:
            await saver.arecord("t-2", ToolCompleted, call_id="c", result={"api_key": API_KEY})
        events = [stored.event for stored in await stores.log.read_run("t-2")]

    (completed,) = [event for event in events if isinstance(event, ToolCompleted)]
    assert completed.result == {"api_key": API_KEY}


PG_PASSWORD = "PG-" + invented(16, seed=4)
REDIS_PASSWORD = "R3D1S-" + invented(16, seed=5)


def test_settings_never_show_the_database_or_redis_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """security review #13: ``repr(settings)`` and ``model_dump()`` held both passwords."""
    monkeypatch.setenv("DATABASE_URL", f"postgresql://onward:{PG_PASSWORD}@db:5432/onward")
    monkeypatch.setenv("REDIS_URL", f"rediss://onward:{REDIS_PASSWORD}@cache:6380/0")

    settings = load_settings()

    shown = [repr(settings), str(settings), str(settings.model_dump())]
    shown.append(settings.model_dump_json())
    for text in shown:
        assert PG_PASSWORD not in text
        assert REDIS_PASSWORD not in text
    assert "postgresql://onward:***@db:5432/onward" in repr(settings)
    assert settings.require_database_url().endswith(f":{PG_PASSWORD}@db:5432/onward")
    assert settings.require_redis_url() == f"rediss://onward:{REDIS_PASSWORD}@cache:6380/0"


def test_mcp_settings_never_show_the_redis_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """security review #13: the MCP schema cache's settings read the same REDIS_URL and showed
    its password in their repr."""
    monkeypatch.setenv("REDIS_URL", f"redis://onward:{REDIS_PASSWORD}@cache:6379/0")

    settings = load_mcp_settings()

    assert REDIS_PASSWORD not in repr(settings)
    assert REDIS_PASSWORD not in str(settings.model_dump())
    assert settings.cache_enabled


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("REDIS_URL", f"rediss//onward:{REDIS_PASSWORD}@cache:6380/0"),
        ("REDIS_URL", f"redis://onward:{REDIS_PASSWORD}@cache:63x0/0"),
        ("DATABASE_URL", f"postgresql://onward:{PG_PASSWORD}@db:54x2/onward"),
        # An unencoded "//" in a password (base64 has "/") ends the host part early.
        ("REDIS_URL", f"redis://onward:{REDIS_PASSWORD[:8]}//{REDIS_PASSWORD[8:]}@cache:6379/0"),
        ("DATABASE_URL", f"postgresql://onward:{PG_PASSWORD[:8]}//{PG_PASSWORD[8:]}@db:5432/x"),
    ],
    ids=[
        "redis-no-scheme",
        "redis-bad-port",
        "database-bad-port",
        "redis-password-with-slashes",
        "database-password-with-slashes",
    ],
)
def test_a_malformed_url_is_a_configuration_error_without_its_password(
    tmp_path: Path, variable: str, url: str
) -> None:
    """security review #13: ``onward gc --dry-run`` printed a malformed REDIS_URL with its
    password, and a bad DATABASE_URL port was blamed on the agent's code (exit 5)."""
    env = {"ONWARD_BACKEND": "kafka", "REDIS_URL": None, "DATABASE_URL": None, variable: url}
    env["ONWARD_SQLITE_PATH"] = str(tmp_path / "onward.db")

    result = CliRunner().invoke(cli_app, ["gc", "--dry-run"], env=env)

    assert result.exit_code == 2, result.output
    assert variable in result.stderr
    assert "***" in result.stderr
    for password in (REDIS_PASSWORD, PG_PASSWORD):
        assert password not in result.output
        assert password[8:] not in result.output


async def test_a_redis_store_given_a_malformed_url_names_it_without_its_password() -> None:
    """security review #13: `RedisStore._connect` put the URL, password and all, in its
    `ConfigurationError`."""
    url = f"rediss//onward:{REDIS_PASSWORD}@cache:6380/0"

    with pytest.raises(ConfigurationError) as raised:
        await RedisLeaseStore.open(url)

    assert "REDIS_URL rediss//onward:***@cache:6380/0" in str(raised.value)
    assert REDIS_PASSWORD not in str(raised.value)
    assert raised.value.__cause__ is None


async def test_a_postgresql_store_given_a_bad_port_names_database_url_without_the_password() -> (
    None
):
    """security review #13: asyncpg's DSN parser raised a bare ValueError for a bad port."""
    dsn = f"postgresql://onward:{PG_PASSWORD}@127.0.0.1:54x2/onward"

    with pytest.raises(ConfigurationError) as raised:
        await PostgresFrontierStore.open(dsn)

    assert "DATABASE_URL postgresql://onward:***@127.0.0.1:54x2/onward" in str(raised.value)
    assert PG_PASSWORD not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://onward:{PG_PASSWORD[:8]}/{PG_PASSWORD[8:]}@127.0.0.1:5432/onward",
        f"postgresql://onward:{PG_PASSWORD[:8]}?{PG_PASSWORD[8:]}@127.0.0.1:5432/onward",
        f"redis://onward:{PG_PASSWORD[:8]}/{PG_PASSWORD[8:]}@127.0.0.1:6379/0",
    ],
    ids=["database-slash", "database-question-mark", "redis-slash"],
)
async def test_a_store_given_a_password_that_ends_the_host_part_shows_no_half_of_it(
    url: str,
) -> None:
    """An unencoded ``/`` or ``?`` in the password ends the host part early: the driver quotes
    its first half as the port (``invalid literal for int(): '...'``) or the rest as a query
    field, and the refusal showed that half, though it hid the password whole."""
    store = PostgresFrontierStore if url.startswith("postgresql") else RedisLeaseStore

    with pytest.raises(ConfigurationError) as raised:
        await store.open(url)

    assert PG_PASSWORD[:8] not in str(raised.value)
    assert PG_PASSWORD[8:] not in str(raised.value)


async def _answer_not_found(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An HTTP server that is no MCP server: 404 to every request."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    await writer.drain()
    writer.close()


async def test_an_mcp_servers_password_and_token_are_not_logged_with_its_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The HTTP client logs each request's URL whole at INFO (``onward worker`` logs at INFO),
    and the MCP client the endpoint it connects to: an MCP server's URL with a password or a
    ``?token=`` put both in the worker's log on every call."""
    password, token = invented(16, seed=7), invented(16, seed=8)
    server = await asyncio.start_server(_answer_not_found, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://mcp-user:{password}@127.0.0.1:{port}/mcp?token={token}&plan=free"
    caplog.set_level(logging.DEBUG)
    try:
        with pytest.raises(BackendUnavailableError):
            async with MCPToolset([HttpServer(name="web", url=url, timeout_seconds=10)]):
                pass
    finally:
        server.close()

    requests = [r.getMessage() for r in caplog.records if r.name == "httpx2"]
    assert requests, "the HTTP client logged no request: nothing was checked"
    assert f"http://***@127.0.0.1:{port}/mcp?token=***&plan=***" in requests[0]
    assert password not in caplog.text
    assert token not in caplog.text


def test_an_mcp_servers_credentials_are_not_logged_in_a_failed_requests_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The MCP client logs a failed GET stream with its traceback (``exc_info``), and an
    `HTTPStatusError` names the URL whole: the filter hid a credential in the message only,
    so the traceback under it put the password and the token in the log."""
    masked_http_logs()
    password, token = invented(16, seed=9), invented(16, seed=10)
    url = f"http://mcp-user:{password}@127.0.0.1:9/mcp?token={token}"
    refused = httpx2.Response(401, request=httpx2.Request("GET", url))
    caplog.set_level(logging.DEBUG)
    try:
        refused.raise_for_status()
    except httpx2.HTTPStatusError:
        logging.getLogger("mcp.client.streamable_http").debug("GET stream error", exc_info=True)

    assert "GET stream error" in caplog.text
    assert "HTTPStatusError: Client error '401 Unauthorized' for url" in caplog.text
    assert "http://***@127.0.0.1:9/mcp?token=***" in caplog.text
    assert password not in caplog.text
    assert token not in caplog.text


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module in the working directory that leaves a mark when imported, as a file planted
    in an untrusted directory would; its name and the mark's path."""
    name = f"planted_{invented(8, seed=6).lower()}"
    mark = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(mark)!r}).touch()\nagent = 'mine'\n"
    )
    monkeypatch.chdir(tmp_path)
    return name, mark


def test_a_bare_module_name_is_not_imported_from_the_working_directory(
    planted: tuple[str, Path],
) -> None:
    """security review #23: ``--agent foo:bar`` imported ``./foo.py`` from whatever directory
    the command ran in; now the error says how to name the file instead."""
    name, mark = planted

    with pytest.raises(InvalidInputError, match=rf"{name}\.py:agent"):
        imported(f"{name}:agent", "--agent")

    assert not mark.exists()


def test_a_module_file_named_explicitly_is_imported(planted: tuple[str, Path]) -> None:
    """security review #23: the explicit way, ``file.py:attribute``, still finds it."""
    name, mark = planted

    assert imported(f"{name}.py:agent", "--agent") == "mine"
    assert mark.exists()


class FrontiersLookalike:
    """A user projection that takes the name of Onward's own."""

    name = "frontiers"
    version = 1

    def ddl(self, table: str) -> str:
        return f"CREATE TABLE {table} (run_id text PRIMARY KEY)"

    async def apply(self, conn: Any, table: str, events: Any) -> None:
        """Nothing to fold."""


def test_a_user_projection_named_after_a_built_in_one_is_refused() -> None:
    """security review #23: a user projection named ``frontiers`` shared the built-in one's
    build registry, and rebuilding it retired the frontiers build."""
    with pytest.raises(InvalidInputError, match="'frontiers' is reserved"):
        SqlProjectionSink("postgresql://nobody@127.0.0.1:1/none", FrontiersLookalike())
