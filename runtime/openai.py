"""A `Provider` for any server that speaks the OpenAI chat-completions API, over httpx.

OpenAI itself, Azure-style gateways, vLLM, llama.cpp, Ollama and LiteLLM all answer
``POST {base_url}/chat/completions``; one small client covers them all, so the runtime needs no
vendor SDK and every failure comes out as an Onward error.

Our `Message` has no field for the tool calls an assistant asked for, yet the server must see
them again on the next turn next to the ``tool`` messages that answer them: they travel as a
tool-calls part of the content (`onward.eventlog.parts`, the one convention the runner and every
provider share), and go to the server in its ``tool_calls`` field. Text parts are sent as one
string; a binary part with an image media type as an ``image_url`` data URL; other parts as given.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import email.utils
import json
import logging
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import httpx
import msgspec

from onward._storage import Resource, masked_http_logs, masked_url, without_passwords
from onward.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    OnwardError,
)
from onward.eventlog.events import TOKENS_MAX, Message, ToolCall, Usage
from onward.eventlog.parts import (
    BinaryPart,
    TextPart,
    ToolCallRef,
    ToolCallsPart,
    assistant_message,
    parts_of,
)

from .agent import Agent
from .limits import MAX_DEPTH, too_deep
from .providers import ModelReply
from .redaction import Redactor, window_to_mask
from .tools import UNPARSED

log = logging.getLogger("onward.runtime.openai")

TOOL_CALLS_PART = "tool_calls"
"""The ``type`` of the content part that carries an assistant message's tool calls."""

_TOO_DEEP = f"(arguments nested more than {MAX_DEPTH} levels deep; not kept)"

RETRY_AFTER_CAP_S = 10.0
"""The longest a server's ``Retry-After`` makes us wait before the next attempt."""

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The largest answer read from the server (64 MiB): a misbehaving one cannot fill memory."""

_BACKOFF_BASE_S = 0.25
_BACKOFF_CAP_S = 4.0
_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_RESERVED_SETTINGS = frozenset({"model", "messages", "tools", "stream"})
_ERROR_TEXT_LIMIT = 500


class OpenAICompatibleProvider(Resource):
    """A chat model behind an OpenAI-compatible chat-completions endpoint.

    Requests carry ``model`` (the agent's), the conversation, the agent's tools in function
    shape, and the agent's ``model_settings`` (temperature, max_tokens, ...) merged into the body.

    Conversation conventions:
        * The caller puts the system prompt first; it is sent as given.
        * A ``tool`` message must name the call it answers in ``tool_call_id``.
        * An assistant message that asked for tools carries them in a tool-calls part (see the
          module docstring and :func:`assistant_message`); it is sent with OpenAI's
          ``tool_calls`` field, each call's ``arguments`` JSON-encoded as a string.
        * A content list made only of text (strings or ``{"type": "text"}`` parts) is sent as
          one string, which every compatible server accepts; other parts (images) go as given.

    Reply conventions:
        * ``content: null`` becomes the model's ``refusal``, if it refused (so the run's
          output says why), else ``""``.
        * A tool call whose ``arguments`` are not a JSON object (strict JSON: no ``NaN``, no
          lone surrogate) is kept, with
          ``args={"_unparsed": "<the raw string>"}``: the tool then rejects the arguments and
          the runner records a typed tool error the model can read and correct, instead of the
          run crashing on one bad generation. Sent back to the server, such a call carries the
          raw string again, so the model sees exactly what it produced.
        * ``idempotency_key`` is left empty; the runner assigns it, and a call id where the
          server gave none (or an empty one).

    Errors (the API key, and the value of every extra header that names a secret, never
    appear in any message; the server's text is masked (`Redactor`) before it is cut):
        * 429, 408, 409, 5xx, connection failures and timeouts are retried up to
          ``max_retries`` times with a small exponential backoff, or after the server's
          ``Retry-After`` (seconds or an HTTP date; at most 10 s); then
          `BackendUnavailableError`.
        * Any other 4xx (and a 3xx) raises `ConfigurationError` with the server's message.
        * A successful answer that is not a chat completion raises `BackendError`, naming the
          path of what is wrong in it (``$.choices[0].message.content``); so does an answer
          larger than `MAX_ANSWER_BYTES`.

    Use it as an async context manager, or call :meth:`aclose`; a client passed in is left open
    for its owner to close.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        client: httpx.AsyncClient | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        """Configure the endpoint; nothing is sent until the first `complete`.

        Args:
            base_url: The API root, e.g. ``https://api.openai.com/v1``; requests go to
                ``{base_url}/chat/completions``.
            api_key: Sent as ``Authorization: Bearer <key>``; omit it for local servers.
            timeout_s: Limit for each attempt as a whole (connect, send, the full answer), in
                seconds: a server that drips its answer slowly is cut off at it too.
            max_retries: Attempts made after the first for transient failures.
            client: An httpx client to share (connection pool, proxies); its owner closes it.
            extra_headers: Sent with every request (organisation, gateway routing, ...). The
                value of one whose name names a secret (``api-key``, ``X-Auth-Token``:
                `Redactor.is_secret_key`) is masked like ``api_key``.

        Raises:
            ConfigurationError: The URL is not http(s), a number is out of range, or
                ``ONWARD_REDACT_KEYS`` names no key (`Redactor`).
        """
        self._redactor = Redactor()
        # httpx logs each request's URL whole, at INFO: a gateway's password in it would be too.
        masked_http_logs()
        # A refused URL is named masked, as every later message names it: its password or key
        # is still in it. The driver's exception is not chained, as its text may hold it too.
        shown = self._redactor.redact_text(_without_query_values(masked_url(base_url)))
        try:
            root = httpx.URL(base_url)
            # Onto the path: a query (Azure's ``?api-version=``) stays the request's query.
            url = root.copy_with(path=root.path.rstrip("/") + "/chat/completions")
        except httpx.InvalidURL as exc:
            raise ConfigurationError(
                f"base_url {shown!r} is not a valid URL: "
                f"{self._redactor.redact_text(without_passwords(str(exc), base_url))}"
            ) from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigurationError(
                f"base_url {shown!r} must be an absolute http:// or https:// URL"
            )
        if not timeout_s > 0:  # NaN too: it would cut every attempt off at once
            raise ConfigurationError(f"timeout_s must be positive, not {timeout_s}")
        if max_retries < 0:
            raise ConfigurationError(f"max_retries must be zero or more, not {max_retries}")
        self._url = url
        self._api_key = api_key or None
        self._timeout_s = timeout_s
        self._timeout = httpx.Timeout(timeout_s)
        self._max_retries = max_retries
        self._headers: dict[str, str] = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            **dict(extra_headers or {}),
        }
        if self._api_key is not None:
            self._headers["Authorization"] = f"Bearer {self._api_key}"
        self._secrets = _secret_values(self._headers, self._redactor, url)
        self._shown_url = _without_query_values(masked_url(str(url)))
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()

    def __repr__(self) -> str:
        return f"OpenAICompatibleProvider({self._redact(str(self._url))!r})"

    async def close(self) -> None:
        """Close the HTTP client if this provider created it; a shared client stays open."""
        if self._owns_client:
            await self._client.aclose()

    aclose = close
    """The name httpx gives it."""

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        """Ask the server for the next assistant turn.

        Args:
            agent: Supplies the model name, tools and model settings.
            messages: The conversation, system prompt first, in the conventions of the class.

        Returns:
            The first choice's message, its tool calls and the token usage.

        Raises:
            InvalidInputError: A message cannot be expressed in the chat-completions API.
            ConfigurationError: The server refused the request (key, URL, model, settings).
            BackendUnavailableError: The server stayed unreachable or overloaded.
            BackendError: The server answered with something that is not a chat completion.
        """
        if self._client.is_closed:
            raise ConfigurationError(
                self._redact(f"the provider for {self._url} is closed; create a new one")
            )
        response, content = await self._post(self._request_body(agent, messages))
        return self._parse(response, content)

    def _request_body(self, agent: Agent, messages: Sequence[Message]) -> bytes:
        reserved = sorted(_RESERVED_SETTINGS.intersection(agent.model_settings))
        if reserved:
            raise ConfigurationError(
                f"agent {agent.name!r}: model_settings may not set {reserved}; the provider "
                "sets them from the agent and the conversation"
            )
        body: dict[str, Any] = {
            **dict(agent.model_settings),
            "model": agent.model,
            "messages": [_wire_message(i, m) for i, m in enumerate(messages)],
        }
        if agent.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": dict(t.parameters),
                    },
                }
                for t in agent.tools
            ]
        try:
            return msgspec.json.encode(body)
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidInputError(
                f"agent {agent.name!r}: the request is not JSON-encodable "
                f"(model_settings or message content): {exc}"
            ) from exc

    async def _post(self, body: bytes) -> tuple[httpx.Response, bytes]:
        attempts = self._max_retries + 1
        attempt = 0
        while True:
            attempt += 1
            try:
                # httpx's timeout bounds each read, not the answer: a server sending a byte
                # now and then would hold the call, and the run, for ever.
                async with asyncio.timeout(self._timeout_s):
                    response, content = await self._send(body)
            except httpx.UnsupportedProtocol as exc:
                raise ConfigurationError(
                    self._redact(f"POST {self._url}: unsupported protocol: {exc}")
                ) from exc
            except (httpx.TransportError, TimeoutError) as exc:
                failure = (
                    f"no complete answer within {self._timeout_s:g} s"
                    if isinstance(exc, TimeoutError)
                    else _describe(exc)
                )
                if attempt >= attempts:
                    raise BackendUnavailableError(
                        self._redact(
                            f"POST {self._url} failed after {attempts} attempt(s): {failure} "
                            "(the server did not answer; retry once it is reachable)"
                        )
                    ) from exc
                delay = _backoff(attempt)
                log.warning(self._redact(f"POST {self._url}: {failure}; retrying in {delay:.2f} s"))
                await asyncio.sleep(delay)
                continue
            except httpx.HTTPError as exc:
                raise BackendError(
                    self._redact(f"POST {self._url} failed: {_describe(exc)}")
                ) from exc
            if response.is_success:
                return response, content
            if not _retryable(response.status_code):
                raise self._refusal(response, content)
            if attempt >= attempts:
                raise BackendUnavailableError(
                    self._redact(
                        f"POST {self._url} answered {response.status_code} after {attempts} "
                        f"attempt(s): {_server_message(content, self._redact)} (retry later)"
                    )
                )
            retry_after = _retry_after(response)
            delay = _backoff(attempt) if retry_after is None else retry_after
            log.warning(
                self._redact(
                    f"POST {self._url} answered {response.status_code}; retrying in {delay:.2f} s"
                )
            )
            await asyncio.sleep(delay)

    async def _send(self, body: bytes) -> tuple[httpx.Response, bytes]:
        """One POST and its answer, read up to `MAX_ANSWER_BYTES`."""
        request = self._client.build_request(
            "POST", self._url, content=body, headers=self._headers, timeout=self._timeout
        )
        response = await self._client.send(request, stream=True)
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise BackendError(
                        self._redact(
                            f"POST {self._url} answered {response.status_code} with more than "
                            f"{MAX_ANSWER_BYTES} bytes (MAX_ANSWER_BYTES); not read further"
                        )
                    )
                chunks.append(chunk)
        finally:
            await response.aclose()
        return response, b"".join(chunks)

    def _refusal(self, response: httpx.Response, content: bytes) -> OnwardError:
        status = response.status_code
        if status in (401, 403):
            hint = "check the API key"
        elif status == 404:
            hint = "check base_url and model"
        elif 300 <= status < 400:
            location = response.headers.get("location", "elsewhere")
            hint = f"the server redirects to {location}; set base_url to that address"
        else:
            hint = "check the model settings and the conversation"
        return ConfigurationError(
            self._redact(
                f"POST {self._url} answered {status} ({hint}): "
                f"{_server_message(content, self._redact)}"
            )
        )

    def _parse(self, response: httpx.Response, content: bytes) -> ModelReply:
        try:
            completion = msgspec.json.decode(content, type=_Completion)
        except msgspec.ValidationError as exc:
            raise BackendError(
                self._redact(
                    f"POST {self._url} answered {response.status_code} with a body that is not "
                    f"a chat completion: {exc}"
                )
            ) from None
        except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
            raise BackendError(
                self._redact(
                    f"POST {self._url} answered {response.status_code} with a body that is not "
                    f"JSON: {_text(content.decode('utf-8', errors='replace'), self._redact)!r}"
                )
            ) from exc
        return _reply(completion)

    def _redact(self, text: str) -> str:
        """``text`` with the endpoint shown as `_without_query_values`, the key, the secret
        headers' and the URL's long query values as ``***``, other secrets masked."""
        text = text.replace(str(self._url), self._shown_url)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return self._redactor.redact_text(text)


class _Function(msgspec.Struct):
    """The function a tool call names. Its ``arguments`` are kept as sent (a JSON string, or
    any JSON value from some servers): `_arguments` reads them, keeping what does not parse
    for the tool to refuse, so one bad generation does not fail the whole answer. A missing
    or null ``name`` names no tool: the call ends ``UnknownTool``, which the model reads."""

    name: str | None = None
    arguments: msgspec.Raw = msgspec.Raw()


class _ToolCall(msgspec.Struct, kw_only=True):
    """One entry of ``message.tool_calls``. Some compatible servers (Gemini's, LM Studio's)
    send an empty ``id``, or none: the runner gives such a call an id of its own."""

    id: str | None = None
    function: _Function


class _Message(msgspec.Struct):
    """A choice's message: ``content`` may be null (a turn of only tool calls, or a refusal,
    whose reason is in ``refusal``)."""

    content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    refusal: str | None = None


class _Choice(msgspec.Struct):
    """One choice of a chat completion."""

    message: _Message


class _Completion(msgspec.Struct):
    """The parts of a chat completion Onward reads; other fields are ignored. ``usage`` is left
    undecoded: servers omit or shape it loosely, and token counts never fail an answer."""

    choices: Annotated[list[_Choice], msgspec.Meta(min_length=1)]
    usage: Any = None


def _wire_message(index: int, message: Message) -> dict[str, Any]:
    """One of our messages in chat-completions shape."""
    content, calls = _wire_content(index, message)
    wire: dict[str, Any] = {"role": message.role}
    if message.role == "tool":
        if not message.tool_call_id:
            raise InvalidInputError(
                f"message {index} (tool): tool_call_id is missing; it names the call answered"
            )
        wire["tool_call_id"] = message.tool_call_id
    if calls:
        wire["tool_calls"] = calls
        if content == "":
            content = None
    wire["content"] = content
    return wire


def _wire_content(
    index: int, message: Message
) -> tuple[str | list[Any] | None, list[dict[str, Any]]]:
    """A message's content (one string when it is all text) and its tool calls, if any."""
    if isinstance(message.content, str):
        return message.content, []
    try:
        parts = parts_of(message.content)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(
            f"message {index} ({message.role}): {exc}; it has no chat-completions form"
        ) from exc
    texts: list[str] = []
    wire: list[Any] = []
    calls: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            texts.append(part.text)
            wire.append({"type": "text", "text": part.text})
        elif isinstance(part, ToolCallsPart):
            if message.role != "assistant":
                raise InvalidInputError(
                    f"message {index} ({message.role}): only an assistant message can carry "
                    "a tool-calls part"
                )
            calls.extend(_wire_tool_call(index, c) for c in part.tool_calls)
        elif isinstance(part, BinaryPart):
            wire.append(_wire_binary(index, part))
        else:
            wire.append(part)
    return ("".join(texts) if len(texts) == len(wire) else wire), calls


def _wire_binary(index: int, part: BinaryPart) -> dict[str, Any]:
    """An image as a data URL; other binary parts have no chat-completions form."""
    if not part.media_type.startswith("image/"):
        raise InvalidInputError(
            f"message {index}: a binary part of type {part.media_type} has no chat-completions "
            "form; only images can be sent"
        )
    url = f"data:{part.media_type};base64,{base64.b64encode(part.data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def _wire_tool_call(index: int, call: ToolCallRef) -> dict[str, Any]:
    """One entry of a tool-calls part in OpenAI's ``tool_calls`` shape."""
    arguments = call.arguments
    if isinstance(arguments, str):
        encoded = arguments
    else:
        unparsed = arguments.get(UNPARSED)
        if len(arguments) == 1 and isinstance(unparsed, str):
            encoded = unparsed
        else:
            encoded = msgspec.json.encode(arguments).decode()
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": encoded},
    }


def _reply(completion: _Completion) -> ModelReply:
    """The first choice of a chat completion as our reply."""
    message = completion.choices[0].message
    return ModelReply(
        message=Message(role="assistant", content=message.content or message.refusal or ""),
        tool_calls=[
            ToolCall(
                call_id=c.id or "",
                tool=c.function.name or "",
                args=_arguments(c.function.arguments),
            )
            for c in message.tool_calls or []
        ],
        usage=_usage(completion.usage),
    )


def _arguments(sent: msgspec.Raw) -> dict[str, Any]:
    """The call's arguments as a dict; anything that is not a JSON object is kept raw, and so
    is an object nested more than `MAX_DEPTH` levels deep (as text: parsed, it could not be
    masked, stored or read back by every reader)."""
    try:
        raw = msgspec.json.decode(sent) if sent else None
    except msgspec.DecodeError:  # well formed, but a number no float holds (``1e999``)
        return {UNPARSED: bytes(sent).decode()}
    if isinstance(raw, dict):
        return raw if not too_deep(raw) else {UNPARSED: _TOO_DEEP}
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if not isinstance(raw, str):
        return {UNPARSED: json.dumps(raw)} if not too_deep(raw) else {UNPARSED: _TOO_DEEP}
    try:
        # Strict, as the answer around it was read: `json.loads` takes ``NaN`` (recorded as
        # null, a value the tool was not called with) and lone surrogates (which no event
        # can hold: the answer could not be written and the run would fail).
        parsed = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return {UNPARSED: raw}
    return parsed if isinstance(parsed, dict) and not too_deep(parsed) else {UNPARSED: raw}


def _usage(raw: Any) -> Usage:
    """Token counts; servers that omit usage (or parts of it), or give a count no model call
    has (negative, past `TOKENS_MAX`), count as zero."""
    if not isinstance(raw, dict):
        return Usage()
    return Usage(
        input_tokens=_tokens(raw.get("prompt_tokens")),
        output_tokens=_tokens(raw.get("completion_tokens")),
    )


def _tokens(count: Any) -> int:
    plausible = type(count) is int and 0 <= count <= TOKENS_MAX
    return count if plausible else 0


def _retryable(status: int) -> bool:
    """Statuses that say "not now" rather than "not this request"."""
    return status in _RETRYABLE_STATUSES or status >= 500


def _retry_after(response: httpx.Response) -> float | None:
    """The server's ``Retry-After`` in seconds, capped; ``None`` if absent or neither a number
    nor an HTTP date. A date is read against the answer's ``Date`` (the server's clock), or
    ours without one; one already past means no wait."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        at = _http_date(value)
        if at is None:
            return None
        now = _http_date(response.headers.get("date", "")) or datetime.datetime.now(datetime.UTC)
        seconds = max((at - now).total_seconds(), 0.0)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, RETRY_AFTER_CAP_S)


def _http_date(value: str) -> datetime.datetime | None:
    """An HTTP date (``Wed, 21 Oct 2015 07:28:00 GMT``) as an aware datetime, else ``None``."""
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=datetime.UTC)


def _backoff(attempt: int) -> float:
    """Exponential backoff with jitter, so many workers throttled together spread out."""
    ceiling = min(_BACKOFF_BASE_S * 2.0 ** (attempt - 1), _BACKOFF_CAP_S)
    return ceiling * (0.5 + random.random() / 2)  # noqa: S311  # jitter, not cryptography


_KEY_LIKE_LENGTH = 20
"""How long a value of the base URL's query must be to be masked wherever a server echoes it:
keys are this long or longer, while a short value (``api-version=2024-02-01``) is also found in
text that is no secret."""


def _secret_values(
    headers: Mapping[str, str], redactor: Redactor, url: httpx.URL
) -> tuple[str, ...]:
    """The values of the headers that name a secret, the credentials after a scheme
    (``Bearer <token>``), the URL's password and its query values as long as a key, longest
    first: a server may echo any of them."""
    values: set[str] = set()
    for name, value in headers.items():
        if redactor.is_secret_key(name) and value.strip():
            values.update((value.strip(), value.split(maxsplit=1)[-1]))
    if url.password:
        values.add(url.password)
    values.update(v for _, v in url.params.multi_items() if len(v) >= _KEY_LIKE_LENGTH)
    return tuple(sorted(values, key=len, reverse=True))


def _without_query_values(url: str) -> str:
    """``url`` with every query value hidden: a gateway may take its key under any name
    (Azure Functions' ``?code=``), which no list of secret names holds, and a failed call's
    message naming the endpoint is recorded in the run's log."""
    address, question, query = url.partition("?")
    if not question:
        return url
    return f"{address}?{re.sub(r'=[^&#]*', '=***', query)}"


def _text(text: str, redact: Callable[[str], str]) -> str:
    """A server's text for a message: masked, then cut. Masked first, because a secret the
    cut splits (a URL cut between its password and its ``@``, a key cut mid-way) is one
    nothing recognises any more. Only a window a few times the limit is masked (an answer
    may be megabytes); the word the window's end falls in is left out, for the same reason."""
    return redact(window_to_mask(text.strip(), _ERROR_TEXT_LIMIT * 4))[:_ERROR_TEXT_LIMIT]


def _server_message(content: bytes, redact: Callable[[str], str]) -> str:
    """The error text a server put in its answer (OpenAI, FastAPI and plain-text shapes),
    masked and cut (`_text`)."""
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _text(error["message"], redact)
        for key in ("error", "message", "detail"):
            if body.get(key) is not None:
                return _text(str(body[key]), redact)
    return _text(content.decode("utf-8", errors="replace"), redact) or "(empty body)"


def _describe(exc: BaseException) -> str:
    """An exception's type and text, as one phrase (httpx timeouts often have no text)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = [
    "MAX_ANSWER_BYTES",
    "RETRY_AFTER_CAP_S",
    "TOOL_CALLS_PART",
    "UNPARSED",
    "OpenAICompatibleProvider",
    "assistant_message",
]
