"""`ask`: a tool's code asks a person a question and gets the answer back as a return value.

    @tool
    async def refund(order: str, *, idempotency_key: str) -> str:
        amount = ask(f"refund how much for {order}?", schema=int)
        await payments.refund(order, amount, key=idempotency_key)
        return f"refunded {amount}"

The first time the call reaches ``ask`` the question is recorded (`ApprovalRequested` with
`Asked`) and the call stops there: nothing after ``ask`` runs, no outcome is recorded, and the
run waits on a person, holding nothing, as for a tool's approval. Streams show the question as
a ``hil_request``; ``respond(value)`` (or ``onward approve RUN REQUEST --value``) answers it.
Once the run goes on, in this process or any other after any restart, the call runs again
from its start, and each ``ask`` gets the answer recorded for its place among the call's
questions (the first, the second, ...) instead of asking again: the code after a question runs
once, with the answer, as long as the call asks its questions in the same order every time.

So the code before a question runs again on every answer, as LangGraph's ``interrupt`` does:
keep it free of side effects, or make them harmless to repeat with the call's
``idempotency_key``. Python cannot save a coroutine half-way, and a question can be answered
days later by another process, so running the call again is the only way its code reaches the
answer after a restart; the log, not the process, is what remembers where it was.

``schema`` says what an answer must be: a JSON Schema (a dict) or a type pydantic validates
(a model, a dataclass, a ``TypedDict``, ``int``, ``Literal[...]``, ``list[str]``...), whose
JSON Schema is recorded with the question. Every answer is checked against the recorded schema
where it is given (`check_answer`), in whichever process answers, before anything is written:
a bad answer raises `InvalidInputError` and the run keeps waiting. With a type, ``ask`` returns
the answer validated into it (a model instance, say); with a JSON Schema or none, the JSON
value as recorded. A person who denies the question ends the run, cancelled.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

import msgspec
import pydantic

from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog.codec import unencodable
from onward.eventlog.events import Grant

from .limits import MAX_NAME_LENGTH, check_depth, check_note
from .redaction import Redactor

if TYPE_CHECKING:
    import jsonschema

ASK_REQUEST = "onward.ask:"
"""The request id of a question starts with it; model call ids never do (`RESERVED_PREFIX`)."""

_MISSING = object()

_redactor = Redactor()
"""Masks an answer's faults before they are cut (`check_answer`)."""


@dataclass(frozen=True, slots=True)
class Question:
    """A question a call asked that nobody has answered yet.

    Attributes:
        call_id: The call that asked.
        index: Its place among the call's questions, from 0.
        text: What is asked.
        schema: The JSON Schema an answer must fit, as JSON text (as `Asked` records it), or
            ``None``.
    """

    call_id: str
    index: int
    text: str
    schema: str | None

    @property
    def request_id(self) -> str:
        """The id a person answers it under."""
        return ask_request(self.call_id, self.index)


class QuestionAsked(BaseException):
    """Stops a tool's code at an unanswered question.

    A `BaseException`, so that a tool's own ``except Exception`` does not swallow it; the
    runner catches it around the call. (A call that swallows it anyway is still taken as
    stopped at its question: whatever it returns is dropped.)
    """

    def __init__(self, question: Question) -> None:
        super().__init__(question.text)
        self.question = question


@dataclass(slots=True)
class Asking:
    """One call's questions while its code runs: the answers recorded so far, and the first
    question that has none."""

    call_id: str
    answers: dict[str, Any]
    asked: int = 0
    question: Question | None = field(default=None)

    def next(self, text: str, schema: str | None) -> Any:
        """The recorded answer to the call's next question, else `QuestionAsked`."""
        index = self.asked
        self.asked += 1
        answer = self.answers.get(ask_request(self.call_id, index), _MISSING)
        if answer is not _MISSING:
            return answer
        question = Question(self.call_id, index, text, schema)
        if self.question is None:
            # Code that caught the stop of an earlier question and asked on is still stopped
            # at that one: asked a later one first, it would go on past the earlier with a
            # guess once the later is answered.
            self.question = question
        raise QuestionAsked(question)

    @classmethod
    def of(cls, call_id: str, grants: Iterable[Grant]) -> Asking:
        """A call's questions, answered from ``grants`` (the turn's recorded answers)."""
        return cls(call_id, {g.request_id: g.value for g in grants})

    @contextlib.contextmanager
    def active(self) -> Iterator[Asking]:
        """While the call's code runs: ``ask`` in it (and in tasks it starts) is this call's."""
        token = _asking.set(self)
        try:
            yield self
        finally:
            _asking.reset(token)


_asking: ContextVar[Asking | None] = ContextVar("onward.asking", default=None)

_Answer = TypeVar("_Answer")


@overload
def ask(question: str, *, schema: type[_Answer]) -> _Answer: ...


@overload
def ask(question: str, *, schema: Any = None) -> Any: ...


def ask(question: str, *, schema: Any = None) -> Any:
    """Ask a person ``question`` from a tool's code; the answer, once there is one.

    See the module docstring: the call stops here until a person answers, then runs again
    from its start and gets the answer here.

    Args:
        question: What the person reads (at most 10,000 characters).
        schema: A JSON Schema (a dict) or a type pydantic validates; ``None``: any JSON value.

    Returns:
        The answer: validated into ``schema`` when it is a type (and typed as it for a type
        checker), else as recorded.

    Raises:
        ConfigurationError: Not called from the code of a tool Onward is running, or
            ``schema`` is neither a valid JSON Schema nor a type pydantic can validate.
        InvalidInputError: ``question`` is empty, too long or holds a control character.
    """
    scope = _asking.get()
    if scope is None:
        raise ConfigurationError(
            "ask() is called from the code of a tool while Onward's runner runs it (the tool's "
            "call is what stops and runs again once a person answers); a LangGraph graph asks "
            "with interrupt(), a pydantic-ai agent with its own waits (wait_for_external_event)"
        )
    text = check_note("question", question)
    recorded, adapter = json_schema_of(schema)
    answer = scope.next(text, None if recorded is None else json.dumps(recorded))
    if adapter is None:
        return answer
    try:
        # Read as the JSON value it is, as its schema was checked: a strict type takes
        # "2030-01-02" for a date from JSON, only a date object from Python.
        return adapter.validate_json(msgspec.json.encode(answer))
    except pydantic.ValidationError as exc:
        raise InvalidInputError(
            f"the answer to {ask_request(scope.call_id, scope.asked - 1)!r} does not fit "
            f"{schema!r}: {exc}"
        ) from exc


def json_schema_of(
    schema: Any,
) -> tuple[dict[str, Any] | None, pydantic.TypeAdapter[Any] | None]:
    """The JSON Schema to record for ``schema``, and the adapter answers are validated into
    when it is a type.

    Raises:
        ConfigurationError: Not a valid JSON Schema, nor a type pydantic can validate.
    """
    if schema is None:
        return None, None
    adapter: pydantic.TypeAdapter[Any] | None = None
    if isinstance(schema, Mapping):
        recorded = dict(schema)
        try:
            json.dumps(recorded, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"ask(schema=...) is not a JSON object: {exc}") from exc
    else:
        try:
            adapter = pydantic.TypeAdapter(schema)
            recorded = adapter.json_schema()
        except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError) as exc:
            raise ConfigurationError(
                f"ask(schema=...) takes a JSON Schema or a type pydantic validates: {exc}"
            ) from exc
    import jsonschema  # noqa: PLC0415  (~2 MiB: loaded by the first question with a schema)

    try:
        jsonschema.Draft202012Validator.check_schema(recorded)
    except jsonschema.SchemaError as exc:
        raise ConfigurationError(
            f"ask(schema=...) is not a valid JSON Schema: {exc.message}"
        ) from exc
    _check_references(recorded)
    return recorded, adapter


def _check_references(schema: dict[str, Any]) -> None:
    """Refuse a schema with a reference (``$ref``, ``$dynamicRef``) that does not resolve.

    A valid JSON Schema may still point at nothing (``#/$defs/gone``, a remote URL, which is
    never fetched): recorded, every answer's check (`check_answer`) would fail on it, and the
    run would wait on a question no answer can be given to. Every reference is followed as the
    answer's validator follows it, within the schema and the JSON Schema meta-schemas.

    Raises:
        ConfigurationError: Naming the first reference that does not resolve.
    """
    import jsonschema_specifications  # type: ignore[import-untyped]  # noqa: PLC0415
    import referencing.exceptions  # noqa: PLC0415
    from referencing.jsonschema import DRAFT202012  # noqa: PLC0415

    root = DRAFT202012.create_resource(schema)
    seen: set[int] = set()
    stack = [(root, jsonschema_specifications.REGISTRY.resolver_with_root(root))]
    while stack:
        resource, resolver = stack.pop()
        contents = resource.contents
        if not isinstance(contents, dict) or id(contents) in seen:
            continue
        seen.add(id(contents))
        for keyword in ("$ref", "$dynamicRef"):
            ref = contents.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                resolved = resolver.lookup(ref)
            except referencing.exceptions.Unresolvable as exc:
                raise ConfigurationError(
                    f"ask(schema=...) refers to what it does not hold: {keyword} {ref!r} does "
                    f"not resolve ({type(exc).__name__}); no answer could be checked against it"
                ) from exc
            target = DRAFT202012.create_resource(resolved.contents)
            stack.append((target, resolved.resolver.in_subresource(target)))
        stack.extend((sub, resolver.in_subresource(sub)) for sub in resource.subresources())
    _check_loops(root, jsonschema_specifications.REGISTRY.resolver_with_root(root))


_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas")
"""The keywords whose subschemas apply to the very value their schema applies to."""


def _check_loops(root: Any, resolver: Any) -> None:
    """Refuse a schema whose references come back to where they started without reading a
    part of the answer (``{"$ref": "#"}``; two definitions referring to each other): its
    validator would go round for good on every answer reaching it (`RecursionError`), and the
    run wait on a question no answer can be given to. References resolve (`_check_references`).

    Raises:
        ConfigurationError: The schema loops so.
    """
    from referencing.jsonschema import DRAFT202012  # noqa: PLC0415

    loops = ConfigurationError(
        "ask(schema=...) refers to itself in a loop that comes back to itself without reading "
        "any part of the answer; no answer could be checked against it"
    )
    on_path: set[int] = set()
    done: set[int] = set()

    def visit(resource: Any, resolver: Any) -> None:
        contents = resource.contents
        if not isinstance(contents, dict) or id(contents) in done:
            return
        if id(contents) in on_path:
            raise loops
        on_path.add(id(contents))
        for keyword in _IN_PLACE:
            value = contents.get(keyword)
            if keyword == "dependentSchemas" and isinstance(value, dict):
                subs = list(value.values())
            else:
                subs = value if isinstance(value, list) else [value]
            for sub in subs:
                if isinstance(sub, dict):
                    target = DRAFT202012.create_resource(sub)
                    visit(target, resolver.in_subresource(target))
        for keyword in ("$ref", "$dynamicRef"):
            ref = contents.get(keyword)
            if isinstance(ref, str):
                resolved = resolver.lookup(ref)
                target = DRAFT202012.create_resource(resolved.contents)
                visit(target, resolved.resolver.in_subresource(target))
        on_path.discard(id(contents))
        done.add(id(contents))

    # From every subschema of the schema: one under ``properties`` may loop on its own.
    stack = [(root, resolver)]
    try:
        while stack:
            resource, at = stack.pop()
            visit(resource, at)
            stack.extend((sub, at.in_subresource(sub)) for sub in resource.subresources())
    except RecursionError as exc:
        raise loops from exc


def recorded_schema(text: str | None) -> Any:
    """A question's recorded JSON Schema as a JSON value (``None`` without one); the text as
    it is when it is not JSON (written by another writer)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def check_answer(
    schema: str | None,
    value: Any,
    *,
    run_id: str,
    request_id: str,
    redactor: Redactor = _redactor,
) -> None:
    """Refuse an answer that, as it will be recorded (`_as_recorded`: masked by ``redactor``,
    the one that will write or send it, then in its JSON form), does not fit the question's
    recorded JSON Schema (JSON text).

    Raises:
        InvalidInputError: The answer cannot be recorded; or it does not fit, naming each
            place in it that does not (at most five), each masked (`Redactor`), then cut: a
            fleet worker logs the refusal, and a secret the cut split (a URL cut between its
            password and its ``@``) is one no pattern recognises any more. Nothing was
            written, the run still waits.
    """
    if schema is None:
        return
    import jsonschema  # noqa: PLC0415  (as in the check of a question's schema)
    import referencing.exceptions  # noqa: PLC0415

    recorded = _as_recorded(value, run_id=run_id, request_id=request_id, redactor=redactor)
    try:
        schema = json.loads(schema)
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema, format_checker=_formats())
        faults = sorted(validator.iter_errors(recorded), key=lambda e: list(map(str, e.path)))
    except (
        ValueError,
        RecursionError,
        jsonschema.SchemaError,
        referencing.exceptions.Unresolvable,
    ) as exc:
        # Recorded by another writer: no answer can be checked against it (a reference that
        # loops without reading the answer goes round until Python's stack runs out).
        raise InvalidInputError(
            f"run {run_id!r}: the question {request_id!r} has a schema no answer can be "
            f"checked against: {str(exc)[:200]}",
            run_id=run_id,
        ) from exc
    if not faults:
        return
    where = "; ".join(
        f"{'/'.join(map(str, fault.path)) or 'the answer'}: "
        f"{_redactor.redact_text(fault.message)[:200]}"
        for fault in faults[:5]
    )
    masked = ""
    if redactor.redact(value) is not value:
        masked = (
            "; it was checked as it would be recorded, what it holds under a secret's name or "
            "in a secret's shape masked (never ask a person for a secret)"
        )
    raise InvalidInputError(
        f"run {run_id!r}: the answer to {request_id!r} does not fit its schema ({where}); "
        f"nothing was recorded and the run still waits{masked}",
        run_id=run_id,
    )


def _as_recorded(value: Any, *, run_id: str, request_id: str, redactor: Redactor) -> Any:
    """The answer as the log records it and the tool's code reads it back: masked, then in
    its JSON form.

    That form, not the value given, is what must fit: a ``Decimal`` is a number to a JSON
    Schema validator but is written as a string, so checked as given it would reach a tool
    that asked for a number as text; a number under a secret's name (``pin``) is recorded as
    the mask, which a tool that asked for a number could not read.

    Raises:
        InvalidInputError: The answer nests too deep, or JSON has no form for it.
    """
    check_depth("the answer", value, run_id=run_id)
    fault = unencodable(value)
    if fault is not None:
        raise InvalidInputError(
            f"run {run_id!r}: the answer to {request_id!r} cannot be recorded: {fault}",
            run_id=run_id,
        )
    return msgspec.json.decode(msgspec.json.encode(redactor.redact(value)))


_READ_AS: dict[str, Any] = {
    "date": datetime.date,
    "date-time": datetime.datetime,
    "time": datetime.time,
    "duration": datetime.timedelta,
    "uuid": uuid.UUID,
    "uri": pydantic.AnyUrl,
}
"""The ``format`` of each type whose JSON Schema pydantic records with one, and the type."""


@functools.cache
def _formats() -> jsonschema.FormatChecker:
    """The ``format`` checks an answer must pass: each format a type records is read as
    ``ask`` reads it into that type (pydantic), the others as jsonschema checks them.

    Without them ``format`` is only an annotation: "tomorrow" would fit a question asked with
    ``schema=datetime.date``, be recorded, and fail in the tool's code, the question gone."""
    import jsonschema  # noqa: PLC0415  (as in the check of a question's schema)

    checker = jsonschema.FormatChecker()
    for name, kind in _READ_AS.items():
        checker.checks(name, raises=pydantic.ValidationError)(_reads_as(kind))
    return checker


def _reads_as(kind: Any) -> Callable[[object], bool]:
    """A format check: a string pydantic validates into ``kind`` (anything else passes, as
    ``format`` speaks of strings only)."""
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(kind)

    def check(value: object) -> bool:
        if isinstance(value, str):
            adapter.validate_python(value)
        return True

    return check


def ask_request(call_id: str, index: int) -> str:
    """The request id of a call's ``index``-th question: readable while it fits a name,
    else the call id's digest."""
    plain = f"{ASK_REQUEST}{index}:{call_id}"
    if len(plain) <= MAX_NAME_LENGTH:
        return plain
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:32]
    return f"{ASK_REQUEST}{index}:#{digest}"


__all__ = ["Question", "ask", "check_answer", "recorded_schema"]
