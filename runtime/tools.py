"""Tools: async functions with a JSON schema, called with their idempotency key.

A tool is a plain ``async def`` whose keyword parameters (type-hinted, or one pydantic model)
become its JSON schema, plus an ``idempotency_key`` keyword it receives on every attempt:

    @tool(retry_safe=True)
    async def search(query: str, *, idempotency_key: str) -> list[str]: ...

    @tool(reconcile=booking_status)
    async def book(flight: str, seat: str, *, idempotency_key: str) -> dict[str, str]: ...

A tool that needs a person (``requires_approval``) may also take an ``approval`` keyword: it
receives the value the person answered with (``approve(..., value=)``, or ``respond(value)`` of
the application API), as recorded in the log. It is not part of the tool's schema.

``retry_safe`` tools (reads, searches) may be called again when resume cannot tell whether they
ran. ``reconcile(key)`` asks the tool's own status endpoint whether a call with that key took
effect; resume calls it once for an undecided call and records the answer.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints, overload

import msgspec
import pydantic

from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog.events import ToolError

from .limits import check_name

KEY_PARAMETER = "idempotency_key"
APPROVAL_PARAMETER = "approval"


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What a tool's status check says about a call: it took effect (with its result) or not."""

    outcome: Literal["completed", "never_ran"]
    result: Any = None


Reconcile = Callable[[str], Awaitable[Reconciled | None]]
"""``reconcile(key)``: the tool's answer about the call with that key, or ``None`` if unknown."""


@dataclass(frozen=True)
class Tool:
    """A tool the model may call.

    Attributes:
        name: What the model calls it.
        description: What the model reads about it.
        parameters: JSON Schema of its arguments.
        fn: The implementation, called as ``fn(**args, idempotency_key=key)``.
        retry_safe: Calling it twice is harmless (reads, searches).
        reconcile: Its status check, for calls resume cannot decide.
        requires_approval: A person approves each call before it is dispatched.
        takes_approval: ``fn`` takes an ``approval`` keyword: the value its call was approved
            with (``None`` when there was none).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Awaitable[Any]] = field(repr=False)
    retry_safe: bool = False
    reconcile: Reconcile | None = field(default=None, repr=False)
    requires_approval: bool = False
    takes_approval: bool = False
    _model: type[pydantic.BaseModel] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A tool's name is recorded with every call to it, in text columns and log lines.
        try:
            check_name("tool name", self.name)
        except InvalidInputError as exc:
            raise ConfigurationError(f"tool {self.name[:40]!r}: {exc}") from None

    def fingerprint(self) -> dict[str, Any]:
        """What of the tool the agent's revision covers."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "retry_safe": self.retry_safe,
            "reconciles": self.reconcile is not None,
            "requires_approval": self.requires_approval,
        }

    async def call(
        self, args: Mapping[str, Any], *, idempotency_key: str, approval: Any = None
    ) -> Any:
        """Validate the arguments against the schema, then call the tool.

        Raises:
            ToolArgumentsError: The arguments do not fit the schema (nothing was called).
        """
        values: dict[str, Any] = dict(args)
        if self._model is not None:
            try:
                model = self._model.model_validate(values)
            except pydantic.ValidationError as exc:
                raise ToolArgumentsError(self.name, str(exc)) from exc
            values = {k: getattr(model, k) for k in type(model).model_fields}
        if self.takes_approval:
            values[APPROVAL_PARAMETER] = approval
        return await self.fn(**values, idempotency_key=idempotency_key)


class ToolArgumentsError(Exception):
    """The model's arguments for a tool do not fit its schema; recorded as the call's error."""

    def __init__(self, tool: str, detail: str) -> None:
        super().__init__(f"arguments for {tool!r} do not fit its schema: {detail}")
        self.tool = tool


def tool_error(exc: BaseException) -> ToolError:
    """The typed error recorded when a tool raises."""
    return ToolError(type=type(exc).__name__, message=str(exc)[:2_000])


@overload
def tool(fn: Callable[..., Awaitable[Any]], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    retry_safe: bool = False,
    reconcile: Reconcile | None = None,
    requires_approval: bool = False,
) -> Callable[[Callable[..., Awaitable[Any]]], Tool]: ...


def tool(
    fn: Callable[..., Awaitable[Any]] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    retry_safe: bool = False,
    reconcile: Reconcile | None = None,
    requires_approval: bool = False,
) -> Tool | Callable[[Callable[..., Awaitable[Any]]], Tool]:
    """Make a `Tool` from an async function; its schema comes from the type hints."""

    def make(function: Callable[..., Awaitable[Any]]) -> Tool:
        if not inspect.iscoroutinefunction(function):
            raise ConfigurationError(f"tool {function.__name__!r} must be an async function")
        model = _arguments_model(function)
        return Tool(
            name=name or function.__name__,
            description=description or inspect.getdoc(function) or "",
            parameters=model.model_json_schema(),
            fn=function,
            retry_safe=retry_safe,
            reconcile=reconcile,
            requires_approval=requires_approval,
            takes_approval=APPROVAL_PARAMETER in inspect.signature(function).parameters,
            _model=model,
        )

    return make(fn) if fn is not None else make


def _arguments_model(function: Callable[..., Any]) -> type[pydantic.BaseModel]:
    signature = inspect.signature(function)
    if KEY_PARAMETER not in signature.parameters:
        raise ConfigurationError(
            f"tool {function.__name__!r} must take a keyword `{KEY_PARAMETER}: str`: it is how "
            "the tool makes a repeated call harmless"
        )
    hints = get_type_hints(function)
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.name in (KEY_PARAMETER, APPROVAL_PARAMETER):
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {function.__name__!r}: *args/**kwargs have no schema")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    return pydantic.create_model(f"{function.__name__}_arguments", **fields)


def idempotency_key(run_id: str, call_id: str) -> str:
    """The key a call carries on every attempt: stable for the run and call, opaque to tools."""
    digest = hashlib.sha256(f"{run_id}\x00{call_id}".encode()).hexdigest()[:32]
    return f"onward-{digest}"


def canonical(value: Any) -> bytes:
    """Canonical JSON (sorted keys) for hashing."""
    return msgspec.json.encode(value, order="sorted")
