"""Tools: async functions with a JSON schema, called with their idempotency key.

A tool is a plain ``async def`` whose keyword parameters (type-hinted, or one pydantic model)
become its JSON schema, plus an ``idempotency_key`` keyword it receives on every attempt:

    @tool(retry_safe=True)
    async def search(query: str, *, idempotency_key: str) -> list[str]: ...

    @tool(reconcile=booking_status)
    async def book(flight: str, seat: str, *, idempotency_key: str) -> dict[str, str]: ...

A tool that needs a person (``requires_approval``) may also take an ``approval`` keyword: it
receives the value the person answered with (``approve(..., value=)``, or ``respond(value)`` of
the application API), as recorded in the log. It is not part of the tool's schema. Any tool's
code may also ask a person a question mid-call and get the answer back: `onward.runtime.ask`.

``retry_safe`` tools (reads, searches) may be called again when resume cannot tell whether they
ran. ``reconcile(key)`` asks the tool's own status endpoint whether a call with that key took
effect; resume calls it once for an undecided call and records the answer.

A tool may also take ``fence`` (the fencing token its call was dispatched under: it rises with
every claim of the run) and ``lease_expires_at`` (when the lease it was called under lapses,
seconds since the epoch, the lease store's clock), and its status check may take ``fence``
too: the fence of the worker asking, which has taken the run over. An external system that
remembers the highest fence it has seen for a key, from calls and from status checks alike,
and refuses a call with a lower one cannot be reached by a worker that was paused past its
lease and carries on afterwards: the status check raises the bar before it answers "never
ran", so the late call is refused whichever arrives first. That is the one rule no lease can
enforce from this side. ``max_call_s`` bounds a call: it starts only under a lease that lasts
longer, is cut off at its deadline (recorded with the dispatch), and a status check is asked
about it only once that deadline has passed.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, get_type_hints, overload

import msgspec
import pydantic

from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog.events import ToolError

from .limits import check_name
from .redaction import Redactor

KEY_PARAMETER = "idempotency_key"
APPROVAL_PARAMETER = "approval"
FENCE_PARAMETER = "fence"
LEASE_EXPIRY_PARAMETER = "lease_expires_at"
UNPARSED = "_unparsed"
"""The one argument a provider gives a call whose arguments, as the model wrote them, are not a
JSON object (kept as text for the model to read back): `Tool.call` refuses such a call rather
than make it with the tool's defaults. No parameter of a `tool` can have the name."""
_SHOWN_CHARS = 200
_PASSED_BY_ONWARD = (KEY_PARAMETER, APPROVAL_PARAMETER, FENCE_PARAMETER, LEASE_EXPIRY_PARAMETER)
"""Keywords Onward passes itself: not part of a tool's schema."""


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What a tool's status check says about a call: it took effect (with its result) or not."""

    outcome: Literal["completed", "never_ran"]
    result: Any = None


Reconcile = Callable[..., Awaitable[Reconciled | None]]
"""``reconcile(key)`` (or ``reconcile(key, *, fence)``): the tool's answer about the call with
that key, or ``None`` if unknown; ``fence`` is the asking holder's (see the module docstring)."""


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
        max_call_s: The longest one call may take: it is started only under a lease that
            lasts longer, cut off at its deadline, and asked about by its status check only
            after that deadline (``None``: unbounded).
        takes_fence: ``fn`` takes a ``fence`` keyword: the fencing token of its call.
        takes_lease_expiry: ``fn`` takes a ``lease_expires_at`` keyword.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Awaitable[Any]] = field(repr=False)
    retry_safe: bool = False
    reconcile: Reconcile | None = field(default=None, repr=False)
    requires_approval: bool = False
    takes_approval: bool = False
    max_call_s: float | None = None
    takes_fence: bool = False
    takes_lease_expiry: bool = False
    _model: type[pydantic.BaseModel] | None = field(default=None, repr=False, compare=False)

    arguments_as_keywords: ClassVar[bool] = True
    """``fn`` takes the model's arguments as keywords among Onward's own; a subclass whose
    ``fn`` takes them otherwise (an MCP server's tools: one mapping beside them) may have an
    argument named like one of Onward's keywords."""

    def __post_init__(self) -> None:
        if self.arguments_as_keywords:
            self._refuse_keyword_arguments()
        if self.max_call_s is not None and not 0 < self.max_call_s <= MAX_CALL_S:
            raise ConfigurationError(
                f"tool {self.name[:40]!r}: max_call_s must be more than 0 and at most "
                f"{MAX_CALL_S:g} seconds, got {self.max_call_s!r}"
            )
        # A tool's name is recorded with every call to it, in text columns and log lines.
        try:
            check_name("tool name", self.name)
        except InvalidInputError as exc:
            raise ConfigurationError(f"tool {self.name[:40]!r}: {exc}") from None

    def _refuse_keyword_arguments(self) -> None:
        """Refuse a schema with an argument named like a keyword Onward passes ``fn`` itself:
        the model's value could never reach it (``fn(**args, idempotency_key=key)`` fails, or
        Onward's value would replace the model's)."""
        properties = self.parameters.get("properties")
        if not isinstance(properties, Mapping):
            return
        passed = {
            KEY_PARAMETER: True,
            APPROVAL_PARAMETER: self.takes_approval,
            FENCE_PARAMETER: self.takes_fence,
            LEASE_EXPIRY_PARAMETER: self.takes_lease_expiry,
        }
        taken = [name for name, passes in passed.items() if passes and name in properties]
        if taken:
            raise ConfigurationError(
                f"tool {self.name[:40]!r}: its schema has an argument named {taken[0]!r}, a "
                "keyword Onward passes the tool itself; rename the argument"
            )

    def fingerprint(self) -> dict[str, Any]:
        """What of the tool the agent's revision covers."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "retry_safe": self.retry_safe,
            "reconciles": self.reconcile is not None,
            "requires_approval": self.requires_approval,
        } | ({"max_call_s": self.max_call_s} if self.max_call_s is not None else {})

    async def check_status(self, key: str, *, fence: int) -> Reconciled | None:
        """Ask the tool's status check about the call with ``key``, passing the asking
        holder's ``fence`` when it takes one; ``None`` without a status check or an answer.

        Raises:
            ConfigurationError: The status check answered something else than `Reconciled`
                (with outcome ``completed`` or ``never_ran``) or ``None``: it is recorded as
                the call's settlement, so it is refused rather than guessed at.
        """
        if self.reconcile is None:
            return None
        if FENCE_PARAMETER in inspect.signature(self.reconcile).parameters:
            answer = await self.reconcile(key, fence=fence)
        else:
            answer = await self.reconcile(key)
        if answer is not None and not (
            isinstance(answer, Reconciled) and answer.outcome in ("completed", "never_ran")
        ):
            shown = repr(answer)
            shown = shown if len(shown) <= _SHOWN_CHARS else shown[:_SHOWN_CHARS] + "..."
            raise ConfigurationError(
                f"{self.name}'s status check answered {shown}: it must answer "
                "Reconciled('completed', result), Reconciled('never_ran') or None"
            )
        return answer

    async def call(
        self,
        args: Mapping[str, Any],
        *,
        idempotency_key: str,
        approval: Any = None,
        fence: int | None = None,
        lease_expires_at: float | None = None,
    ) -> Any:
        """Validate the arguments against the schema, then call the tool.

        Raises:
            ToolArgumentsError: The arguments do not fit the schema, or the model's were not a
                JSON object (`UNPARSED`); nothing was called.
        """
        values = self._arguments(args)
        if self.takes_approval:
            values[APPROVAL_PARAMETER] = approval
        if self.takes_fence:
            values[FENCE_PARAMETER] = fence
        if self.takes_lease_expiry:
            values[LEASE_EXPIRY_PARAMETER] = lease_expires_at
        return await self.fn(**values, idempotency_key=idempotency_key)

    def _arguments(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The model's arguments, checked against the schema (`call`).

        Raises:
            ToolArgumentsError: They do not fit the schema, or were not a JSON object.
        """
        if UNPARSED in args:
            # Checked before the schema: one whose parameters all have defaults would take
            # `{}` and make the call, with arguments the model never wrote.
            raw = str(args[UNPARSED])
            shown = raw if len(raw) <= _SHOWN_CHARS else raw[:_SHOWN_CHARS] + "..."
            raise ToolArgumentsError(self.name, f"they are not a JSON object: {shown!r}")
        values: dict[str, Any] = dict(args)
        if self._model is not None:
            try:
                model = self._model.model_validate(values)
            except pydantic.ValidationError as exc:
                raise ToolArgumentsError(self.name, str(exc)) from exc
            values = {k: getattr(model, k) for k in type(model).model_fields}
        return values


class ToolArgumentsError(Exception):
    """The model's arguments for a tool do not fit its schema; recorded as the call's error."""

    def __init__(self, tool: str, detail: str) -> None:
        super().__init__(f"arguments for {tool!r} do not fit its schema: {detail}")
        self.tool = tool


MAX_CALL_S = 24 * 3600.0
"""The longest ``max_call_s`` a tool may declare: a day."""


MAX_ERROR_CHARS = 2_000
"""The longest message of a tool's error that is recorded."""


def tool_error(exc: BaseException, redactor: Redactor) -> ToolError:
    """The typed error recorded when a tool raises: its message masked, then cut to
    `MAX_ERROR_CHARS`. Masked first, because a secret the cut splits (a URL cut between its
    password and its ``@``) is one no pattern recognises any more."""
    message = redactor.redact_text(str(exc))[:MAX_ERROR_CHARS]
    return ToolError(type=type(exc).__name__, message=message)


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
    max_call_s: float | None = None,
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
    max_call_s: float | None = None,
) -> Tool | Callable[[Callable[..., Awaitable[Any]]], Tool]:
    """Make a `Tool` from an async function; its schema comes from the type hints."""

    def make(function: Callable[..., Awaitable[Any]]) -> Tool:
        if not inspect.iscoroutinefunction(function):
            raise ConfigurationError(f"tool {function.__name__!r} must be an async function")
        model = _arguments_model(function)
        parameters = inspect.signature(function).parameters
        return Tool(
            name=name or function.__name__,
            description=description or inspect.getdoc(function) or "",
            parameters=model.model_json_schema(),
            fn=function,
            retry_safe=retry_safe,
            reconcile=reconcile,
            requires_approval=requires_approval,
            takes_approval=APPROVAL_PARAMETER in parameters,
            max_call_s=max_call_s,
            takes_fence=FENCE_PARAMETER in parameters,
            takes_lease_expiry=LEASE_EXPIRY_PARAMETER in parameters,
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
        if param.kind is param.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"tool {function.__name__!r}: parameter {param.name!r} is positional-only; "
                "Onward passes every argument by keyword"
            )
        if param.name in _PASSED_BY_ONWARD:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {function.__name__!r}: *args/**kwargs have no schema")
        if param.name.startswith("_") and param.default is param.empty:
            raise ConfigurationError(
                f"tool {function.__name__!r}: parameter {param.name!r} starts with `_`, which "
                "the schema keeps private: the model could never pass it, and it has no default"
            )
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


_T = TypeVar("_T")


class ToolCancelledError(Exception):
    """A tool raised `CancelledError` while nobody cancelled its run or cut it off."""


async def cancelled_as_failure(calling: Awaitable[_T]) -> _T:
    """Await a tool call; a `CancelledError` it raises while the task running it is not being
    cancelled (it awaited a task or future something else cancelled, a shared request its
    pool closed) is its failure, raised as `ToolCancelledError` and recorded like any other,
    not taken for the run being cancelled, which would hand it to a caller nobody cancelled
    and leave the call undecided. The runner and both integrations' tool paths await tools
    through it."""
    try:
        return await calling
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is None or current.cancelling():
            raise
        raise ToolCancelledError(
            "the tool raised CancelledError: something it awaited was cancelled, not the run"
        ) from None
