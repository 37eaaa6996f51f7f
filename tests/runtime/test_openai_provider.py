"""The OpenAI-compatible provider against a real local HTTP server that speaks chat-completions.

The server is a few lines of HTTP/1.1 over ``asyncio.start_server``: it records every request
and answers from the test's script, so each test sees exactly what went over the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import pytest_asyncio

from onward.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    OnwardError,
)
from onward.eventlog.events import Message, ToolCall, Usage
from onward.eventlog.memory import MemoryEventLog
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.openai import UNPARSED, OpenAICompatibleProvider, assistant_message
from onward.runtime.providers import ModelReply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import tool

API_KEY = "sk-test-0123456789-very-secret"


@tool(description="Search the web.", retry_safe=True)
async def search(query: str, *, idempotency_key: str) -> list[str]:
    return [query]


@tool(description="Book a seat on a flight.")
async def book(flight: str, seat: str, *, idempotency_key: str) -> dict[str, str]:
    return {"flight": flight, "seat": seat}


AGENT = Agent(
    name="travel",
    instructions="Be brief.",
    tools=(search, book),
    model="gpt-test",
    model_settings={"temperature": 0.2, "max_tokens": 64},
)
PLAIN_AGENT = Agent(name="plain", instructions="Be brief.", model="gpt-plain")
CONVERSATION = [
    Message(role="system", content="Be brief."),
    Message(role="user", content="Find me a flight to Oslo."),
]


@dataclass
class Answer:
    """One scripted response: a status, a JSON (or raw) body, headers, or a dropped connection;
    ``drip_s`` sends the body a byte at a time, that long apart."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drop: bool = False
    drip_s: float = 0.0


@dataclass
class Received:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float


class ChatServer:
    """A minimal chat-completions server: records requests, answers from a script."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.script: list[Answer] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, *answers: Answer) -> None:
        self.script.extend(answers)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while await self._serve_one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request_line = await reader.readline()
        if not request_line:
            return False
        method, path, _ = request_line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, value = line.decode("latin-1").split(":", 1)
            headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(raw) if raw else None
        self.requests.append(Received(method, path, headers, body, time.monotonic()))
        answer = self.script.pop(0) if self.script else _unscripted()
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        if answer.drop:
            return False
        payload = (
            answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
        )
        head = [f"HTTP/1.1 {answer.status} Scripted", f"Content-Length: {len(payload)}"]
        if not isinstance(answer.body, bytes):
            head.append("Content-Type: application/json")
        head.extend(f"{k}: {v}" for k, v in answer.headers.items())
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        for chunk in (
            (payload[i : i + 1] for i in range(len(payload))) if answer.drip_s else [payload]
        ):
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(answer.drip_s)
        return True


def _unscripted() -> Answer:
    return Answer(status=418, body={"error": {"message": "the test script has no answer left"}})


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ChatServer]:
    chat = ChatServer()
    await chat.start()
    try:
        yield chat
    finally:
        await chat.stop()


def completion(
    content: str | None = "",
    tool_calls: list[dict[str, Any]] | None = None,
    usage: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A chat-completions response body, as OpenAI shapes it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": dict(usage or {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}),
    }


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def provider_for(server: ChatServer, **options: Any) -> OpenAICompatibleProvider:
    options.setdefault("api_key", API_KEY)
    return OpenAICompatibleProvider(server.base_url, **options)


async def reply_to(server: ChatServer, *answers: Answer) -> ModelReply:
    """Queue ``answers`` on the server, ask a fresh provider once, return its reply."""
    server.answer(*answers)
    async with provider_for(server) as provider:
        return await provider.complete(AGENT, CONVERSATION)


async def tool_calls_to(server: ChatServer, *calls: dict[str, Any]) -> ModelReply:
    """The reply to an answer that is only these tool calls."""
    return await reply_to(server, Answer(body=completion(None, list(calls))))


async def test_a_text_answer_comes_back_with_its_usage(server: ChatServer) -> None:
    reply = await reply_to(
        server,
        Answer(body=completion("Oslo it is.", usage={"prompt_tokens": 21, "completion_tokens": 4})),
    )
    assert reply.message == Message(role="assistant", content="Oslo it is.")
    assert reply.tool_calls == []
    assert reply.final
    assert reply.usage == Usage(input_tokens=21, output_tokens=4)


async def test_tool_calls_come_back_with_parsed_arguments(server: ChatServer) -> None:
    reply = await tool_calls_to(
        server,
        function_call("call_1", "search", '{"query": "flights to Oslo"}'),
        function_call("call_2", "book", '{"flight": "SK123", "seat": "4A"}'),
    )
    assert reply.message == Message(role="assistant", content="")
    assert reply.tool_calls == [
        ToolCall(call_id="call_1", tool="search", args={"query": "flights to Oslo"}),
        ToolCall(call_id="call_2", tool="book", args={"flight": "SK123", "seat": "4A"}),
    ]
    assert all(call.idempotency_key == "" for call in reply.tool_calls)
    assert not reply.final


async def test_the_request_carries_model_messages_tools_settings_and_key(
    server: ChatServer,
) -> None:
    server.answer(Answer(body=completion("ok")))
    async with provider_for(server) as provider:
        await provider.complete(AGENT, CONVERSATION)
    [request] = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.body == {
        "model": "gpt-test",
        "temperature": 0.2,
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Find me a flight to Oslo."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "description": "Search the web.",
                    "parameters": dict(search.parameters),
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "book",
                    "description": "Book a seat on a flight.",
                    "parameters": dict(book.parameters),
                },
            },
        ],
    }


async def test_an_agent_without_tools_sends_no_tools_key(server: ChatServer) -> None:
    server.answer(Answer(body=completion("ok")))
    async with provider_for(server) as provider:
        await provider.complete(PLAIN_AGENT, CONVERSATION)
    [request] = server.requests
    assert "tools" not in request.body
    assert request.body["model"] == "gpt-plain"


async def test_no_api_key_sends_no_authorization_and_extra_headers_are_sent(
    server: ChatServer,
) -> None:
    server.answer(Answer(body=completion("ok")))
    async with OpenAICompatibleProvider(
        server.base_url + "/", extra_headers={"OpenAI-Organization": "org-1"}
    ) as provider:
        await provider.complete(PLAIN_AGENT, CONVERSATION)
    [request] = server.requests
    assert "authorization" not in request.headers
    assert request.headers["openai-organization"] == "org-1"
    assert request.path == "/v1/chat/completions"


async def test_a_query_in_the_base_url_stays_the_query_of_the_request(server: ChatServer) -> None:
    """An Azure-style endpoint names its API version in the query (``?api-version=``): the
    path goes before it, and the query is sent as given."""
    server.answer(Answer(body=completion("ok")))
    async with OpenAICompatibleProvider(server.base_url + "/?api-version=2024-10-21") as provider:
        await provider.complete(PLAIN_AGENT, CONVERSATION)
    [request] = server.requests
    assert request.path == "/v1/chat/completions?api-version=2024-10-21"


async def test_tool_and_assistant_tool_call_messages_are_sent_in_openai_shape(
    server: ChatServer,
) -> None:
    server.answer(Answer(body=completion("Booked.")))
    conversation = [
        *CONVERSATION,
        Message(
            role="assistant",
            content=[
                "Let me look.",
                {
                    "type": "tool_calls",
                    "tool_calls": [
                        {"id": "call_1", "name": "search", "arguments": {"query": "Oslo"}},
                        {
                            "id": "call_2",
                            "name": "book",
                            "arguments": {"flight": "SK1", "seat": "1A"},
                        },
                    ],
                },
            ],
        ),
        Message(role="tool", content='["SK1"]', tool_call_id="call_1"),
        Message(role="tool", content='{"seat": "1A"}', tool_call_id="call_2"),
    ]
    async with provider_for(server) as provider:
        await provider.complete(AGENT, conversation)
    sent = server.requests[0].body["messages"]
    assistant, first_result, second_result = sent[2], sent[3], sent[4]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == "Let me look."
    assert [
        (c["id"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["tool_calls"]
    ] == [
        ("call_1", "function", "search", {"query": "Oslo"}),
        ("call_2", "function", "book", {"flight": "SK1", "seat": "1A"}),
    ]
    assert all(isinstance(c["function"]["arguments"], str) for c in assistant["tool_calls"])
    assert first_result == {"role": "tool", "tool_call_id": "call_1", "content": '["SK1"]'}
    assert second_result == {"role": "tool", "tool_call_id": "call_2", "content": '{"seat": "1A"}'}


async def test_assistant_message_builds_the_tool_calls_convention(server: ChatServer) -> None:
    server.answer(Answer(body=completion("ok")))
    calls = [ToolCall(call_id="call_9", tool="search", args={"query": "x"}, idempotency_key="k")]
    async with provider_for(server) as provider:
        await provider.complete(AGENT, [*CONVERSATION, assistant_message("", calls)])
    assistant = server.requests[0].body["messages"][2]
    assert assistant == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "search", "arguments": '{"query":"x"}'},
            }
        ],
    }


async def test_invalid_tool_arguments_are_kept_unparsed(server: ChatServer) -> None:
    reply = await tool_calls_to(
        server,
        function_call("call_1", "search", '{"query": "Oslo'),
        function_call("call_2", "book", '["SK1", "1A"]'),
    )
    assert reply.tool_calls == [
        ToolCall(call_id="call_1", tool="search", args={"_unparsed": '{"query": "Oslo'}),
        ToolCall(call_id="call_2", tool="book", args={"_unparsed": '["SK1", "1A"]'}),
    ]


@pytest.mark.parametrize(
    "arguments",
    ['{"flight": NaN}', '{"flight": Infinity}', '{"flight": "SK\\ud800"}'],
    ids=["NaN", "Infinity", "lone-surrogate"],
)
async def test_arguments_that_are_not_strict_json_are_kept_unparsed(
    server: ChatServer, arguments: str
) -> None:
    """What JSON does not allow (a non-finite number, an unpaired surrogate escape) is not an
    object of arguments: a NaN would be recorded as null and a lone surrogate could not be
    recorded at all."""
    reply = await tool_calls_to(server, function_call("call_1", "book", arguments))
    assert reply.tool_calls == [ToolCall(call_id="call_1", tool="book", args={UNPARSED: arguments})]


@pytest.mark.parametrize("arguments", ['{"flight": 1e999}', "1e999"], ids=["object", "number"])
async def test_arguments_sent_as_json_with_a_number_out_of_range_are_kept_unparsed(
    server: ChatServer, arguments: str
) -> None:
    """A server that sends ``arguments`` as a JSON value, not a string, with a number no
    float holds: the call is kept with the raw text, as a string of such arguments is, not
    a decoding error out of the provider."""
    body = (
        '{"choices": [{"message": {"content": null, "tool_calls": [{"id": "call_1", '
        f'"function": {{"name": "book", "arguments": {arguments}}}}}]}}}}]}}'
    )
    reply = await reply_to(server, Answer(body=body.encode()))
    assert reply.tool_calls == [ToolCall(call_id="call_1", tool="book", args={UNPARSED: arguments})]


async def test_a_call_with_unparsed_arguments_is_refused_not_made_with_defaults(
    server: ChatServer,
) -> None:
    """A tool whose parameters all have defaults would accept ``{}``: a truncated generation
    must not send the report to the default address. The call ends InvalidArguments, the
    model reads why, and the run goes on."""
    sent: list[str] = []

    @tool
    async def send_report(to: str = "team@example.com", *, idempotency_key: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    agent = Agent(name="reporter", instructions="Be brief.", tools=(send_report,), model="m")
    truncated = '{"to": "ceo@exa'
    server.answer(
        Answer(body=completion(None, [function_call("call_1", "send_report", truncated)])),
        Answer(body=completion("I could not send it.")),
    )
    async with provider_for(server) as provider:
        runner = AgentRunner(
            provider=provider, log=MemoryEventLog(partitions=1), frontiers=MemoryFrontierStore()
        )
        result = await runner.run(agent, "send the report", tenant="acme", run_id="r1")
    assert sent == []
    assert result.status == "completed"
    told = server.requests[1].body["messages"][-1]
    assert told["role"] == "tool"
    assert "InvalidArguments" in told["content"]
    assert "not a JSON object" in told["content"]


async def test_a_lone_surrogate_in_arguments_does_not_fail_the_run(server: ChatServer) -> None:
    """The answer is recorded with the call's arguments unparsed, instead of an answer no
    event can hold failing the run."""
    server.answer(
        Answer(body=completion(None, [function_call("call_1", "book", '{"flight": "\\ud800"}')])),
        Answer(body=completion("Sorry.")),
    )
    async with provider_for(server) as provider:
        runner = AgentRunner(
            provider=provider, log=MemoryEventLog(partitions=1), frontiers=MemoryFrontierStore()
        )
        result = await runner.run(AGENT, "book", tenant="acme", run_id="r1")
    assert result.status == "completed"
    assert "InvalidArguments" in server.requests[1].body["messages"][-1]["content"]


async def test_calls_without_ids_or_a_name_are_run_or_refused_not_fatal(
    server: ChatServer,
) -> None:
    """Gemini's and LM Studio's compatible endpoints send ``"id": ""`` (or no id): the runner
    gives each call an id of its own, unique in the run, and sends it back with the call's
    answer. A call naming no tool ends UnknownTool, which the model reads; the run goes on."""
    searched: list[str] = []

    @tool(retry_safe=True)
    async def lookup(query: str, *, idempotency_key: str) -> str:
        searched.append(query)
        return f"found {query}"

    agent = Agent(name="finder", instructions="Be brief.", tools=(lookup,), model="m")
    calls = [
        {
            "id": "",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"query": "a"}'},
        },
        {"type": "function", "function": {"name": "lookup", "arguments": '{"query": "b"}'}},
        {"id": "", "type": "function", "function": {"name": None, "arguments": "{}"}},
    ]
    server.answer(Answer(body=completion(None, calls)), Answer(body=completion("Found both.")))
    async with provider_for(server) as provider:
        runner = AgentRunner(
            provider=provider, log=MemoryEventLog(partitions=1), frontiers=MemoryFrontierStore()
        )
        result = await runner.run(agent, "find a and b", tenant="acme", run_id="r1")
    assert (result.status, result.output) == ("completed", "Found both.")
    assert sorted(searched) == ["a", "b"]
    sent = server.requests[1].body["messages"]
    asked = [c["id"] for c in sent[-4]["tool_calls"]]
    answered = {m["tool_call_id"]: m["content"] for m in sent[-3:]}
    assert len(set(asked)) == 3
    assert all(asked)
    assert set(answered) == set(asked)
    assert "UnknownTool" in answered[asked[2]]


async def test_an_unparsed_call_is_sent_back_with_its_raw_arguments(server: ChatServer) -> None:
    server.answer(Answer(body=completion("ok")))
    calls = [ToolCall(call_id="call_1", tool="search", args={"_unparsed": '{"query": "Os'})]
    async with provider_for(server) as provider:
        await provider.complete(AGENT, [*CONVERSATION, assistant_message("", calls)])
    [call] = server.requests[0].body["messages"][2]["tool_calls"]
    assert call["function"]["arguments"] == '{"query": "Os'


async def test_a_500_then_a_200_is_retried_after_a_backoff(server: ChatServer) -> None:
    reply = await reply_to(
        server,
        Answer(status=500, body={"error": {"message": "internal error"}}),
        Answer(body=completion("recovered")),
    )
    assert reply.message.content == "recovered"
    assert len(server.requests) == 2
    assert server.requests[1].at - server.requests[0].at >= 0.1
    assert server.requests[0].body == server.requests[1].body


async def test_a_persistent_503_raises_backend_unavailable_after_every_attempt(
    server: ChatServer,
) -> None:
    overloaded = Answer(
        status=503, body={"error": {"message": "overloaded"}}, headers={"Retry-After": "0"}
    )
    server.answer(overloaded, overloaded, overloaded, overloaded)
    async with provider_for(server, max_retries=2) as provider:
        with pytest.raises(BackendUnavailableError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    assert len(server.requests) == 3
    message = str(caught.value)
    assert f"{server.base_url}/chat/completions" in message
    assert "503" in message
    assert "overloaded" in message
    assert caught.value.retryable


async def test_a_429_retry_after_is_honoured_then_retried(server: ChatServer) -> None:
    reply = await reply_to(
        server,
        Answer(status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "0"}),
        Answer(body=completion("ok")),
    )
    assert reply.message.content == "ok"
    assert len(server.requests) == 2
    # Retry-After: 0 replaces the backoff (at least 0.125 s) with no wait at all.
    assert server.requests[1].at - server.requests[0].at < 0.1


async def test_a_401_raises_configuration_error_naming_the_key_but_not_showing_it(
    server: ChatServer,
) -> None:
    server.answer(Answer(status=401, body={"error": {"message": "Incorrect API key provided."}}))
    async with provider_for(server) as provider:
        with pytest.raises(ConfigurationError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    message = str(caught.value)
    assert "check the API key" in message
    assert "Incorrect API key provided." in message
    assert API_KEY not in message
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "hint"),
    [
        (403, "check the API key"),
        (404, "check base_url and model"),
        (400, "max_tokens is too large"),
        (422, "max_tokens is too large"),
    ],
)
async def test_other_4xx_raise_configuration_error_without_retrying(
    server: ChatServer, status: int, hint: str
) -> None:
    server.answer(Answer(status=status, body={"error": {"message": "max_tokens is too large"}}))
    async with provider_for(server) as provider:
        with pytest.raises(ConfigurationError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    assert hint in str(caught.value)
    assert str(status) in str(caught.value)
    assert len(server.requests) == 1


def _with_message(**message: Any) -> dict[str, Any]:
    """A chat-completions body whose first choice's message is ``message``."""
    return {"choices": [{"index": 0, "message": message}]}


@pytest.mark.parametrize(
    ("body", "wrong"),
    [
        ({"object": "chat.completion"}, "missing required field `choices`"),
        ([completion("ok")], "Expected `object`, got `array`"),
        ({"choices": []}, "length >= 1 - at `$.choices`"),
        ({"choices": [{"index": 0}]}, "field `message` - at `$.choices[0]`"),
        ({"choices": ["hello"]}, "got `str` - at `$.choices[0]`"),
        (_with_message(content=42), "got `int` - at `$.choices[0].message.content`"),
        (_with_message(content=["a"]), "got `array` - at `$.choices[0].message.content`"),
        (_with_message(tool_calls={"id": "c"}), "at `$.choices[0].message.tool_calls`"),
        (
            completion(None, [{"type": "function", "function": {"name": 7}}]),
            "got `int` - at `$.choices[0].message.tool_calls[0].function.name`",
        ),
        (b"<html>gateway</html>", "not JSON"),
    ],
    ids=[
        "no-choices",
        "not-an-object",
        "empty-choices",
        "no-message",
        "choice-not-an-object",
        "content-a-number",
        "content-a-list",
        "tool-calls-not-a-list",
        "function-name-a-number",
        "not-json",
    ],
)
async def test_a_malformed_200_raises_backend_error_naming_the_path(
    server: ChatServer, body: Any, wrong: str
) -> None:
    server.answer(Answer(body=body))
    async with provider_for(server) as provider:
        with pytest.raises(BackendError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    assert type(caught.value) is BackendError
    assert wrong in str(caught.value)
    assert "not a chat completion" in str(caught.value) or wrong == "not JSON"
    assert len(server.requests) == 1


async def test_loose_but_valid_answers_are_read(server: ChatServer) -> None:
    """Null content and tool calls, no usage, unknown fields, and arguments sent as a JSON
    value rather than a string (as some servers do) all make a reply."""
    loose = _with_message(role="assistant", content=None, tool_calls=None, refusal=None)
    reply = await reply_to(server, Answer(body={**loose, "system_fingerprint": "x"}))
    assert reply == ModelReply(message=Message(role="assistant", content=""), usage=Usage())
    as_values = [
        {"id": "call_1", "function": {"name": "search", "arguments": {"query": "Oslo"}}},
        {"id": "call_2", "function": {"name": "search", "arguments": None}},
        {"id": "call_3", "function": {"name": "search"}},
        {"id": "call_4", "function": {"name": "book", "arguments": ["SK1", "1A"]}},
    ]
    reply = await reply_to(
        server,
        Answer(
            body={
                **completion(None, as_values),
                "usage": {"prompt_tokens": "many", "completion_tokens": 3},
            }
        ),
    )
    assert reply.tool_calls == [
        ToolCall(call_id="call_1", tool="search", args={"query": "Oslo"}),
        ToolCall(call_id="call_2", tool="search", args={}),
        ToolCall(call_id="call_3", tool="search", args={}),
        ToolCall(call_id="call_4", tool="book", args={"_unparsed": '["SK1", "1A"]'}),
    ]
    assert reply.usage == Usage(input_tokens=0, output_tokens=3)


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 2**64, "completion_tokens": 3},
        {"prompt_tokens": -5, "completion_tokens": 3},
        {"prompt_tokens": True, "completion_tokens": 3},
    ],
    ids=["past what a store keeps", "negative", "a boolean"],
)
async def test_a_token_count_no_model_call_has_counts_as_zero(
    server: ChatServer, usage: dict[str, Any]
) -> None:
    """A server's implausible count would make an answer no reader of the log takes (the
    codec refuses to write it): it counts as zero, as a missing one does."""
    reply = await reply_to(server, Answer(body=completion("Oslo it is.", usage=usage)))
    assert reply.usage == Usage(input_tokens=0, output_tokens=3)


async def test_connection_refused_raises_backend_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    async with OpenAICompatibleProvider(base_url, api_key=API_KEY, max_retries=1) as provider:
        with pytest.raises(BackendUnavailableError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    assert f"{base_url}/chat/completions" in str(caught.value)
    assert "2 attempt(s)" in str(caught.value)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


async def test_a_timeout_raises_backend_unavailable(server: ChatServer) -> None:
    server.answer(Answer(body=completion("late"), delay_s=2.0))
    async with provider_for(server, timeout_s=0.2, max_retries=0) as provider:
        with pytest.raises(BackendUnavailableError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    assert "no complete answer within 0.2 s" in str(caught.value)
    assert isinstance(caught.value.__cause__, TimeoutError)


async def test_an_answer_dripped_slowly_is_cut_off_at_the_timeout(server: ChatServer) -> None:
    """Each byte comes well within ``timeout_s``, the whole answer far after it: the attempt as
    a whole is bounded, so a run does not wait on such a server for ever."""
    server.answer(Answer(body=completion("slow " * 20), drip_s=0.02))
    started = time.monotonic()
    async with provider_for(server, timeout_s=0.3, max_retries=0) as provider:
        with pytest.raises(BackendUnavailableError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    assert time.monotonic() - started < 2.0
    assert "no complete answer within 0.3 s" in str(caught.value)


async def test_a_dropped_connection_is_retried(server: ChatServer) -> None:
    reply = await reply_to(server, Answer(drop=True), Answer(body=completion("second time")))
    assert reply.message.content == "second time"
    assert len(server.requests) == 2


def _echo(status: int) -> Answer:
    return Answer(status=status, body={"error": {"message": f"bad key {API_KEY}"}})


@pytest.mark.parametrize(
    "answers",
    [
        [_echo(401)],
        [_echo(404)],
        [_echo(400)],
        [_echo(503), _echo(503)],
        [Answer(body=f"not json {API_KEY}".encode())],
    ],
    ids=["401", "404", "400", "503", "not-json"],
)
async def test_the_api_key_never_appears_in_a_raised_message(
    server: ChatServer, answers: list[Answer]
) -> None:
    server.answer(*answers)
    async with provider_for(server, max_retries=len(answers) - 1) as provider:
        assert API_KEY not in repr(provider)
        with pytest.raises(OnwardError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    assert API_KEY not in str(caught.value)
    assert "***" in str(caught.value)


async def test_a_shared_client_is_left_open_and_a_closed_provider_refuses(
    server: ChatServer,
) -> None:
    server.answer(Answer(body=completion("ok")))
    async with httpx.AsyncClient() as client:
        provider = OpenAICompatibleProvider(server.base_url, client=client)
        await provider.complete(PLAIN_AGENT, CONVERSATION)
        await provider.aclose()
        assert not client.is_closed
    with pytest.raises(ConfigurationError, match="closed"):
        await provider.complete(PLAIN_AGENT, CONVERSATION)


async def test_a_password_in_the_base_url_is_shown_neither_by_repr_nor_when_closed(
    server: ChatServer,
) -> None:
    """A gateway reached as ``https://user:password@host/v1``: every message naming the
    endpoint masks its password, the provider's repr and a closed provider's refusal too."""
    base_url = server.base_url.replace("//", "//gateway:hunter2-very-secret@", 1)
    provider = OpenAICompatibleProvider(base_url)
    await provider.aclose()
    with pytest.raises(ConfigurationError, match="closed") as caught:
        await provider.complete(PLAIN_AGENT, CONVERSATION)
    for shown in (repr(provider), str(caught.value)):
        assert "hunter2-very-secret" not in shown
        assert "gateway:" in shown


async def test_a_password_in_the_base_url_is_not_logged_with_each_request(
    server: ChatServer, caplog: pytest.LogCaptureFixture
) -> None:
    """httpx logs each request's URL whole at INFO (``onward worker`` logs at INFO): a
    gateway's password in the base URL reached the log on every model call."""
    base_url = server.base_url.replace("//", "//gateway:hunter2-very-secret@", 1)
    server.answer(Answer(body=completion("ok")))
    caplog.set_level(logging.INFO)
    async with OpenAICompatibleProvider(base_url) as provider:
        await provider.complete(PLAIN_AGENT, CONVERSATION)

    requests = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert requests, "httpx logged no request: nothing was checked"
    assert "***@127.0.0.1" in requests[0]
    assert "hunter2-very-secret" not in caplog.text


QUERY_KEY = "Zm9vYmFyLWdhdGV3YXkta2V5LTEyMzQ1Njc4OTA"


def _echo_code(status: int) -> Answer:
    return Answer(status=status, body={"error": {"message": f"bad code {QUERY_KEY}"}})


@pytest.mark.parametrize(
    "answers",
    [[_echo_code(401)], [_echo_code(503), _echo_code(503)], [Answer(drop=True)]],
    ids=["401", "503", "dropped"],
)
async def test_a_key_in_the_base_url_query_never_appears_in_a_raised_message(
    server: ChatServer, answers: list[Answer]
) -> None:
    """A gateway that takes its key as a query value the redactor has no name for (Azure
    Functions' ``?code=``): every failure names the endpoint, and a failed model call's message
    is recorded in the run's log for years, so the URL is shown with its query values hidden
    and a server's echo of the key is masked too."""
    key = QUERY_KEY
    server.answer(*answers)
    base_url = f"{server.base_url}?code={key}"
    async with OpenAICompatibleProvider(base_url, max_retries=len(answers) - 1) as provider:
        assert key not in repr(provider)
        with pytest.raises(OnwardError) as caught:
            await provider.complete(PLAIN_AGENT, CONVERSATION)
    assert server.requests, "no request reached the server: nothing was checked"
    assert key not in str(caught.value)
    assert "code=***" in str(caught.value) or "bad code ***" in str(caught.value)


@pytest.mark.parametrize(
    "message",
    [
        Message(role="tool", content="42"),
        Message(role="user", content=[{"type": "tool_calls", "tool_calls": []}]),
        Message(role="user", content=[b"raw bytes"]),
    ],
    ids=["tool-without-call-id", "tool-calls-on-a-user", "bytes-part"],
)
async def test_a_message_with_no_chat_completions_form_is_refused_before_sending(
    server: ChatServer, message: Message
) -> None:
    async with provider_for(server) as provider:
        with pytest.raises(InvalidInputError):
            await provider.complete(AGENT, [*CONVERSATION, message])
    assert server.requests == []


@pytest.mark.parametrize(
    ("base_url", "options"),
    [
        ("localhost:8000/v1", {}),
        ("ftp://example.test/v1", {}),
        ("http://127.0.0.1/v1", {"max_retries": -1}),
        ("http://127.0.0.1/v1", {"timeout_s": 0}),
        ("http://127.0.0.1/v1", {"timeout_s": float("nan")}),
    ],
)
async def test_a_bad_configuration_is_refused_at_construction(
    base_url: str, options: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError):
        OpenAICompatibleProvider(base_url, **options)


@pytest.mark.parametrize(
    "base_url",
    [
        "htps://gateway:hunter2-very-secret@gw.example/v1",
        "gateway:hunter2-very-secret@gw.example/v1",
        "gw.example/v1?key=hunter2-very-secret",
        "gw.example/v1?code=hunter2-very-secret",
        "http://gateway:hunter2-very-secret@[::1/v1",
    ],
    ids=["bad-scheme", "no-scheme", "key-in-query", "code-in-query", "not-a-url"],
)
async def test_a_base_url_refused_at_construction_is_named_without_its_secret(
    base_url: str,
) -> None:
    """A base_url refused as malformed still carries its password or key: the refusal names
    the URL, masked as the provider's repr and every later message mask it."""
    with pytest.raises(ConfigurationError, match="base_url") as caught:
        OpenAICompatibleProvider(base_url)
    assert "hunter2-very-secret" not in str(caught.value)


async def test_a_base_url_whose_password_holds_a_slash_is_refused_without_a_piece_of_it() -> None:
    """A password holding an unencoded ``/`` ends the authority early: httpx reads its first
    half as the port and quotes it (``Invalid port: 'hunter2'``), a piece the masking of the
    whole password did not hide."""
    with pytest.raises(ConfigurationError, match="not a valid URL") as caught:
        OpenAICompatibleProvider("http://gateway:hunter2/very-secret@gw.example:x/v1")
    assert "hunter2" not in str(caught.value)
    assert "very-secret" not in str(caught.value)


async def test_model_settings_may_not_override_the_request_itself(server: ChatServer) -> None:
    agent = Agent(name="odd", instructions="", model_settings={"stream": True})
    async with provider_for(server) as provider:
        with pytest.raises(ConfigurationError, match="stream"):
            await provider.complete(agent, CONVERSATION)
    assert server.requests == []


DB_PASSWORD = "s3cret-db-passw0rd"


def _cut_inside(secret_text: str, secret: str) -> str:
    """Text whose 500-character cut falls in the middle of ``secret`` (inside
    ``secret_text``), padded so the secret straddles the cut."""
    start = secret_text.index(secret) + len(secret) // 2
    return "x " * ((500 - start) // 2) + "y" * ((500 - start) % 2) + secret_text


@pytest.mark.parametrize(
    "answer",
    [
        Answer(
            status=400,
            body={
                "error": {
                    "message": _cut_inside(
                        f"see postgres://app:{DB_PASSWORD}@db.internal/app", DB_PASSWORD
                    )
                }
            },
        ),
        Answer(status=400, body={"detail": _cut_inside(f"bad key {API_KEY}", API_KEY)}),
        Answer(status=400, body=_cut_inside(f"bad key {API_KEY}", API_KEY).encode()),
        Answer(body=_cut_inside(f"bad key {API_KEY}", API_KEY).encode()),
    ],
    ids=["url-password", "api-key", "api-key-plain-text", "api-key-not-json-200"],
)
async def test_a_secret_the_error_text_is_cut_in_is_masked_not_shown_in_part(
    server: ChatServer, answer: Answer
) -> None:
    """A server's text is masked before it is cut to 500 characters: cut first, the half of a
    URL's password before the cut (no ``@`` after it any more) or of the key is shown."""
    server.answer(answer)
    async with provider_for(server, max_retries=0) as provider:
        with pytest.raises(OnwardError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    message = str(caught.value)
    assert "x x x" in message
    for secret in (DB_PASSWORD, API_KEY):
        assert secret[: len(secret) // 3] not in message


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("api-key", "azure-0123456789abcdef", "azure-0123456789abcdef"),
        ("x-api-key", "gateway-0123456789abcdef", "gateway-0123456789abcdef"),
        ("Authorization", "Bearer gw0123456789abcdef", "gw0123456789abcdef"),
        ("X-Auth-Token", "tok0123456789abcdef", "tok0123456789abcdef"),
    ],
)
async def test_a_key_given_in_extra_headers_never_appears_in_a_raised_message(
    server: ChatServer, name: str, value: str, shown: str
) -> None:
    server.answer(Answer(status=401, body={"error": {"message": f"bad key {shown}"}}))
    async with OpenAICompatibleProvider(
        server.base_url, extra_headers={name: value}, max_retries=0
    ) as provider:
        with pytest.raises(ConfigurationError) as caught:
            await provider.complete(AGENT, CONVERSATION)
    assert server.requests[0].headers[name.lower()] == value
    assert shown not in str(caught.value)
    assert "bad key ***" in str(caught.value)


async def test_a_retry_after_date_is_honoured_up_to_the_cap(
    server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Retry-After`` may be an HTTP date: it is waited for (capped, as seconds are), not
    replaced by the far shorter backoff."""
    monkeypatch.setattr("onward.runtime.openai.RETRY_AFTER_CAP_S", 1.0)
    later = email.utils.format_datetime(
        datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30), usegmt=True
    )
    reply = await reply_to(
        server,
        Answer(
            status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": later}
        ),
        Answer(body=completion("ok")),
    )
    assert reply.message.content == "ok"
    assert 0.9 <= server.requests[1].at - server.requests[0].at < 3.0


async def test_an_answer_past_the_size_limit_is_refused_naming_it(
    server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's answer is read up to `MAX_ANSWER_BYTES`, not whole whatever its size."""
    monkeypatch.setattr("onward.runtime.openai.MAX_ANSWER_BYTES", 4_096)
    server.answer(Answer(body=completion("big " * 2_000)))
    async with provider_for(server, max_retries=0) as provider:
        with pytest.raises(BackendError, match="more than 4096 bytes"):
            await provider.complete(AGENT, CONVERSATION)
    server.answer(Answer(body=completion("small " * 500)))
    async with provider_for(server, max_retries=0) as provider:
        assert (await provider.complete(AGENT, CONVERSATION)).message.content == "small " * 500


async def test_a_refusal_is_the_runs_output_not_an_empty_answer(server: ChatServer) -> None:
    """A model that refuses answers ``content: null`` with its reason in ``refusal``: the run
    ends with that reason, so its user sees why rather than an empty output."""
    refused = completion(None)
    refused["choices"][0]["message"]["refusal"] = "I can't help with booking that."
    server.answer(Answer(body=refused))
    async with provider_for(server) as provider:
        runner = AgentRunner(
            provider=provider, log=MemoryEventLog(partitions=1), frontiers=MemoryFrontierStore()
        )
        result = await runner.run(AGENT, "book", tenant="acme", run_id="r1")
    assert result.status == "completed"
    assert result.output == "I can't help with booking that."
