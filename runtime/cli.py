"""The `onward` command line."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, TypeGuard, TypeVar

import asyncpg
import msgspec
import typer
from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from onward.errors import (
    ConfigurationError,
    EventDecodeError,
    FencedError,
    HistoryUnavailableError,
    IndeterminateToolCallError,
    InvalidInputError,
    LogTruncatedError,
    NothingToResumeError,
    OnwardError,
    ResumeConflictError,
    RevisionMismatchError,
)
from onward.eventlog import KafkaEventLog
from onward.eventlog.base import EventLog, RefusedEvent, SequenceGuard, StoredEvent
from onward.eventlog.events import (
    AnyEvent,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    Message,
    ModelAnswered,
    ResumePlanned,
    RunClaimed,
    RunContinued,
    RunFinished,
    RunStarted,
    Tagged,
    ToolCompleted,
    ToolDispatched,
    ToolResolved,
    TurnSettled,
    kind_of,
)
from onward.projections.builds import active_build
from onward.projections.frontier import CallState, Frontier
from onward.projections.kafka import (
    DEFAULT_GROUP,
    PROJECTOR_FLUSH_EVENTS,
    PROJECTOR_FLUSH_INTERVAL,
    KafkaProjector,
    quiet_garbage_collector,
)
from onward.projections.migrations import schema_version_postgres
from onward.projections.postgres import PROJECTION, PostgresFrontierStore, migrate
from onward.projections.projector import FrontierProjection, ProjectionSink
from onward.projections.rebuild import RebuildReport, rebuild_frontiers, rebuild_projection
from onward.projections.sql import SqlProjectionSink, load_projection

from .agent import Agent
from .backends import Backends, open_backends
from .leases.base import RunLease
from .planning import ResumePlan, plan_resume
from .providers import ModelReply, Provider
from .runner import RunResult, summarize
from .settings import Settings, load_settings

_T = TypeVar("_T")

app = typer.Typer(
    name="onward",
    help="Onward: an event-sourced durable runtime for agent runs.",
    no_args_is_help=True,
    add_completion=False,
)
db_app = typer.Typer(help="The PostgreSQL schema: migrate and verify.", no_args_is_help=True)
projections_app = typer.Typer(help="Projections of the event log.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(projections_app, name="projections")
console = Console(stderr=True)


def event_schema() -> bytes:
    """The JSON Schema of every event kind, formatted for review in diffs."""
    schema = msgspec.json.schema(AnyEvent)
    return msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"


def _settings() -> Settings:
    try:
        return load_settings()
    except OnwardError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


def _fail(exc: OnwardError) -> typer.Exit:
    console.print(f"[red]{type(exc).__name__}: {exc}[/red]")
    return typer.Exit(1)


@app.command()
def schema(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here instead of standard output."),
    ] = None,
) -> None:
    """Print the JSON Schema of the events (committed as schemas/events.schema.json)."""
    text = event_schema()
    if output is None:
        typer.echo(text.decode(), nl=False)
    else:
        output.write_bytes(text)


# -- runs: inspect, carry on, answer, settle, audit --------------------------------------------

EXIT_NO_RUN = 1
"""No run under that id for that tenant."""
EXIT_USAGE = 2
"""The command line (or the configuration) cannot be used; typer's own usage errors are 2 too."""
EXIT_HELD = 3
"""Another worker holds the run's lease (or took it over while this command held it)."""
EXIT_MUST_NOT_CARRY_ON = 4
"""The run must not be carried on as it is: a person or an upgrade has to act first."""
EXIT_FAILED = 5
"""A store, the model or the agent's code failed; nothing was decided about the run."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (SIGINT), the shell's convention."""

out = Console(highlight=False)
"""Results go to standard output, so they can be piped; errors go to ``console`` (stderr)."""

RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run id.")]
TenantOption = Annotated[str, typer.Option("--tenant", "-t", help="The tenant that owns the run.")]
ByOption = Annotated[str, typer.Option("--by", help="Who answers; recorded in the log.")]
ValueOption = Annotated[
    str | None, typer.Option("--value", metavar="JSON", help="Recorded with the answer.")
]


class Outcome(StrEnum):
    """What a person found out about an undecided call."""

    COMPLETED = "completed"
    NEVER_RAN = "never_ran"


class _NoModel:
    """The provider of commands that must never reach a model (inspect, approve, deny, resolve).

    Those commands only read a run or append a person's answer; a model call from one of them
    would be a bug, so it fails loudly instead of spending tokens.
    """

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        raise ConfigurationError(
            "this command does not call a model; carry the run on with `onward run --resume`"
        )


def _exit_code(exc: OnwardError) -> int:
    """The documented exit code of an error, so scripts can tell outcomes apart."""
    if isinstance(exc, NothingToResumeError):
        return EXIT_NO_RUN
    if isinstance(exc, InvalidInputError | ConfigurationError):
        return EXIT_USAGE
    if isinstance(exc, ResumeConflictError | FencedError):
        return EXIT_HELD
    if isinstance(
        exc,
        IndeterminateToolCallError
        | HistoryUnavailableError
        | RevisionMismatchError
        | EventDecodeError
        | LogTruncatedError,
    ):
        return EXIT_MUST_NOT_CARRY_ON
    return EXIT_FAILED


def _error(message: str) -> None:
    """One line on stderr, never re-wrapped, so a command in it can be copied whole."""
    console.print(Text(message, style="red"), soft_wrap=True)


def _resolve_commands(run_id: str, tenant: str, call: CallState) -> list[str]:
    """The two `onward resolve` commands that settle an undecided call, ready to fill in."""
    base = (
        f"onward resolve {shlex.quote(run_id)} {shlex.quote(call.call_id)} "
        f"--tenant {shlex.quote(tenant)}"
    )
    return [
        f"{base} --outcome completed --result JSON --by NAME --why REASON",
        f"{base} --outcome never_ran --by NAME --why REASON",
    ]


def _refuse(exc: OnwardError, *, tenant: str) -> typer.Exit:
    """Say on stderr why the command stopped and what to do, and pick its exit code."""
    _error(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, ResumeConflictError):
        _error(f"held by: {exc.holder}")
    if isinstance(exc, IndeterminateToolCallError) and exc.run_id is not None:
        _error("undecided calls; find out whether each took effect, then settle it with one of:")
        for call in exc.calls:
            if not isinstance(call, CallState):
                continue
            _error(
                f"  {call.call_id} ({call.tool}, key {call.idempotency_key or 'none'}, "
                f"dispatched under fence {call.dispatched_fence}, args {_short(call.args)})"
            )
            for command in _resolve_commands(exc.run_id, tenant, call):
                _error(f"    {command}")
    return typer.Exit(_exit_code(exc))


def _with_backends(work: Callable[[Backends], Awaitable[_T]], *, tenant: str) -> _T:
    """Run ``work`` on the configured stores, turning every failure into its exit code.

    An unexpected exception (a bug in the agent's code, a provider's own error type) exits
    with `EXIT_FAILED` and its traceback rather than typer's 1, which means "no such run" here.
    """
    settings = _settings()

    async def session() -> _T:
        if settings.backend == "sqlite" and not settings.sqlite_path.exists():
            # Every command here is about a run that exists; a mistyped path must not quietly
            # become a new, empty database.
            raise ConfigurationError(
                f"ONWARD_SQLITE_PATH {str(settings.sqlite_path)!r} does not exist; point it at "
                "the database the runs were written to"
            )
        async with open_backends(settings) as backends:
            return await work(backends)

    try:
        return asyncio.run(session())
    except OnwardError as exc:
        raise _refuse(exc, tenant=tenant) from exc
    except typer.Exit:
        raise
    except Exception as exc:
        console.print_exception()
        raise typer.Exit(EXIT_FAILED) from exc
    except KeyboardInterrupt as exc:
        # The run was cancelled cleanly (the lease handed back); click would say 1, "no such run".
        _error("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from exc


def _imported(spec: str, option: str) -> object:
    """Import ``package.module:attribute``, falling back to the working directory.

    The ``onward`` script does not put the working directory on ``sys.path`` the way
    ``python -m`` does; without the fallback a user's own ``agents.py`` next to them could not
    be named. Installed packages still win, as they do for every other import of the process.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise typer.BadParameter(
            f"{spec!r} must look like package.module:attribute", param_hint=option
        )
    try:
        found: object = _import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except Exception as exc:
        raise typer.BadParameter(
            f"cannot import {spec!r}: {type(exc).__name__}: {exc}", param_hint=option
        ) from exc
    return found


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        if exc.name != name.partition(".")[0] or here in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(name)


def _made(found: object, spec: str, option: str) -> object:
    """Call a zero-argument factory the option named, turning its failure into a usage error."""
    if not callable(found):
        return found
    try:
        return found()
    except Exception as exc:
        raise typer.BadParameter(
            f"{spec} raised {type(exc).__name__}: {exc}", param_hint=option
        ) from exc


def load_agent(spec: str) -> Agent:
    """The `Agent` named by ``--agent``: an instance, or a zero-argument callable returning one."""
    found = _imported(spec, "--agent")
    agent = found if isinstance(found, Agent) else _made(found, spec, "--agent")
    if not isinstance(agent, Agent):
        raise typer.BadParameter(
            f"{spec} is a {type(agent).__name__}, not an Agent or a function returning one",
            param_hint="--agent",
        )
    return agent


def _is_provider(value: object) -> TypeGuard[Provider]:
    # A provider class has a `complete` attribute too; only instances count.
    return not isinstance(value, type) and isinstance(value, Provider)


def load_provider(spec: str) -> Provider:
    """The `Provider` named by ``--provider``: an instance, or a zero-argument callable."""
    found = _imported(spec, "--provider")
    provider = found if _is_provider(found) else _made(found, spec, "--provider")
    if not _is_provider(provider):
        raise typer.BadParameter(
            f"{spec} is a {type(provider).__name__}, not a Provider or a function returning one",
            param_hint="--provider",
        )
    return provider


def _json_option(text: str | None, option: str) -> Any:
    """Decode a JSON option before anything is opened, so bad input writes nothing."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=option) from exc


def _short(value: Any, limit: int = 60) -> str:
    """A value as one short line of text, for tables read by people."""
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _lease_text(lease: RunLease | None) -> str:
    if lease is None:
        return "free: no worker holds the run"
    return f"held by {lease.holder} under fence {lease.fence} until {_when(lease.expires_at)}"


def _call_state(call: CallState) -> str:
    if call.outcome is not None:
        return call.outcome + (f" (settled by {call.resolved_by})" if call.resolved_by else "")
    if call.dispatched_seq is None:
        return "not dispatched"
    return f"dispatched under fence {call.dispatched_fence}, no outcome"


def _resume_would(
    frontier: Frontier, plan: ResumePlan, tools: Agent | None, lease: RunLease | None
) -> str:
    """What `onward run --resume` would do with the run now, in one sentence."""
    if frontier.finished:
        return f"nothing: the run is {frontier.status}"
    if lease is not None:
        return f"nothing while {lease.holder} holds the run (exit {EXIT_HELD})"
    if frontier.status == "waiting" and frontier.waiting_on is not None:
        return (
            f"nothing until a person answers {frontier.waiting_on} (onward approve or onward deny)"
        )
    if plan.safe:
        return "claim the run under a new fence and carry on"
    undecided = plan.indeterminate
    if tools is None:
        return (
            f"claim the run and stop (exit {EXIT_MUST_NOT_CARRY_ON}) unless the agent's tools "
            f"settle {', '.join(c.call_id for c in undecided)}; otherwise settle each with "
            "onward resolve"
        )
    asked = [c.call_id for c in undecided if (t := tools.tool(c.tool)) and t.reconcile]
    unasked = [c.call_id for c in undecided if c.call_id not in asked]
    words = [f"ask the tools' status checks about {', '.join(asked)}"] if asked else []
    if unasked:
        words.append(
            f"stop (exit {EXIT_MUST_NOT_CARRY_ON}): nothing can tell whether "
            f"{', '.join(unasked)} ran; settle each with onward resolve"
        )
    return "claim the run, then " + "; then ".join(words)


def run_summary(frontier: Frontier, *, lease: RunLease | None, agent: Agent | None = None) -> Group:
    """What `inspect` and `run --resume` print about a run; one function, so they cannot drift.

    Args:
        frontier: The run folded from the log.
        lease: The unexpired lease on the run, if a worker holds it.
        agent: The agent resume will use, when known: its tools say which undecided calls are
            retry-safe or can be asked about. Without it the plan assumes neither.
    """
    facts = summarize(frontier)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for key in ("run", "tenant", "agent", "revision", "status", "iteration", "usage", "fence"):
        grid.add_row(key, Text(str(facts[key])))
    grid.add_row("waiting on", Text(facts["waiting_on"] or "-"))
    grid.add_row("lease", Text(_lease_text(lease)))
    if frontier.output is not None:
        grid.add_row("output", Text(_short(frontier.output, 200)))
    if frontier.error is not None:
        grid.add_row("error", Text(frontier.error))
    if frontier.refused:
        grid.add_row("refused", Text(f"{frontier.refused} event(s); last: {frontier.last_refusal}"))
    tools = agent if agent is not None and agent.revision == frontier.revision else None
    plan = plan_resume(frontier, tools or Agent(name=frontier.agent or "unknown", instructions=""))
    grid.add_row("resume would", Text(_resume_would(frontier, plan, tools, lease)))
    parts: list[RenderableType] = [grid]
    if agent is not None and tools is None:
        parts.append(
            Text(
                f"the agent given is revision {agent.revision}, the run started with "
                f"{frontier.revision}: resume will refuse it",
                style="yellow",
            )
        )
    if plan.calls:
        table = Table(title="calls of the turn in progress", title_justify="left")
        for column in ("call", "tool", "state", "resume decides", "why"):
            table.add_column(column)
        for planned in plan.calls:
            decides = planned.disposition.value + (
                ", dispatched again" if planned.dispatch_again else ""
            )
            table.add_row(
                Text(planned.call.call_id),
                Text(planned.call.tool),
                Text(_call_state(planned.call)),
                Text(decides),
                Text(planned.reason),
            )
        parts.append(table)
        if tools is None:
            parts.append(
                Text(
                    "the agent's tools are unknown here, so no call is taken as retry-safe or "
                    "as having a status check; resume with the agent may settle some by itself"
                )
            )
    return Group(*parts)


async def _look(backends: Backends, run_id: str, tenant: str) -> tuple[Frontier, RunLease | None]:
    """The run folded from the log and who holds it; takes no lease and writes nothing."""
    reader = backends.runner(_NoModel())
    frontier = await reader.inspect(run_id, tenant=tenant)
    return frontier, await backends.leases.current(run_id)


@app.command("inspect")
def inspect_command(run_id: RunArgument, tenant: TenantOption) -> None:
    """Show where a run stands and what resume would do. Takes no lease, writes nothing.

    Exit 0: shown. 1: no such run. 2: bad command line. 4: the run cannot be read.
    """

    async def work(backends: Backends) -> None:
        frontier, lease = await _look(backends, run_id, tenant)
        out.print(run_summary(frontier, lease=lease))

    _with_backends(work, tenant=tenant)


def _carried(result: RunResult, worker: str) -> Group:
    """What a resume did: the fence it held, its plan, and where the run stands now."""
    lines: list[RenderableType] = []
    if result.plan is None:
        waiting = f" on {result.waiting_on}" if result.waiting_on else ""
        lines.append(
            Text(f"nothing to carry on: the run is {result.status}{waiting}; nothing was written")
        )
    else:
        lines.append(Text(f"carried on by {worker} under fence {result.fence}"))
        lines.extend(Text(f"  {line}") for line in result.plan.describe())
        if result.reconciled:
            lines.append(
                Text(f"  settled by the tools' status checks: {', '.join(result.reconciled)}")
            )
    status = f"status {result.status}, iteration {result.iteration}"
    if result.waiting_on:
        status += f", waiting on {result.waiting_on}"
    lines.append(Text(status))
    if result.output is not None:
        lines.append(Text(f"output: {_short(result.output, 200)}"))
    if result.error is not None:
        lines.append(Text(f"error: {result.error}"))
    return Group(*lines)


@app.command("run")
def run_command(
    resume: Annotated[str, typer.Option("--resume", metavar="RUN", help="The run to carry on.")],
    tenant: TenantOption,
    agent_spec: Annotated[
        str,
        typer.Option(
            "--agent",
            metavar="MODULE:ATTR",
            help="The agent the run started with: an Agent, or a function returning one.",
        ),
    ],
    provider_spec: Annotated[
        str,
        typer.Option(
            "--provider",
            metavar="MODULE:ATTR",
            help="The model: a Provider, or a function returning one.",
        ),
    ],
    worker: Annotated[
        str | None, typer.Option(help="This worker's name (default: host and process id).")
    ] = None,
) -> None:
    """Carry a run on: print its summary, take its lease, claim it, plan, and drive it.

    Exit 0: carried on, or nothing to do. 1: no such run. 2: bad command line.
    3: another worker holds it.
    4: it must not be carried on (an undecided call, an evicted transcript, another revision,
    an unreadable or newer record).
    5: a store or the model failed.
    """
    agent = load_agent(agent_spec)
    provider = load_provider(provider_spec)

    async def work(backends: Backends) -> None:
        frontier, lease = await _look(backends, resume, tenant)
        out.print(run_summary(frontier, lease=lease, agent=agent))
        runner = backends.runner(provider, worker=worker)
        result = await runner.resume(agent, resume, tenant=tenant)
        out.print(_carried(result, runner.worker))

    _with_backends(work, tenant=tenant)


def _answer(run_id: str, request: str, *, tenant: str, by: str, value: Any, approve: bool) -> None:
    async def work(backends: Backends) -> None:
        runner = backends.runner(_NoModel())
        if approve:
            await runner.approve(run_id, request, tenant=tenant, by=by, value=value)
            out.print(
                Text(
                    f"approved {request} of run {run_id} (by {by}); carry it on with "
                    f"onward run --resume {shlex.quote(run_id)} --tenant {shlex.quote(tenant)} "
                    "--agent MODULE:ATTR --provider MODULE:ATTR"
                ),
                soft_wrap=True,
            )
        else:
            await runner.deny(run_id, request, tenant=tenant, by=by, value=value)
            out.print(Text(f"denied {request} of run {run_id} (by {by}); the run is cancelled"))

    _with_backends(work, tenant=tenant)


RequestArgument = Annotated[
    str, typer.Argument(metavar="REQUEST", help="The approval request the run waits on.")
]


@app.command("approve")
def approve_command(
    run_id: RunArgument,
    request: RequestArgument,
    *,
    tenant: TenantOption,
    by: ByOption,
    value: ValueOption = None,
) -> None:
    """Answer a run's approval request with yes; a later `run --resume` carries it on.

    Exit 0: approved. 1: no such run. 3: another worker holds the run.
    2: bad input (not waiting on that request, invalid JSON).
    """
    parsed = _json_option(value, "--value")
    _answer(run_id, request, tenant=tenant, by=by, value=parsed, approve=True)


@app.command("deny")
def deny_command(
    run_id: RunArgument,
    request: RequestArgument,
    *,
    tenant: TenantOption,
    by: ByOption,
    value: ValueOption = None,
) -> None:
    """Answer a run's approval request with no; the run ends, cancelled.

    Exit 0: denied. 1: no such run. 3: another worker holds the run.
    2: bad input (not waiting on that request, invalid JSON).
    """
    parsed = _json_option(value, "--value")
    _answer(run_id, request, tenant=tenant, by=by, value=parsed, approve=False)


@app.command("resolve")
def resolve_command(
    run_id: RunArgument,
    call: Annotated[str, typer.Argument(metavar="CALL", help="The undecided call.")],
    *,
    tenant: TenantOption,
    outcome: Annotated[Outcome, typer.Option(help="What you found out about the call.")],
    by: ByOption,
    why: Annotated[str, typer.Option(help="How you know; recorded in the log.")],
    result: Annotated[
        str | None,
        typer.Option(metavar="JSON", help="The call's result, when it completed."),
    ] = None,
) -> None:
    """Settle an undecided call as a person: it completed (with its result) or never ran.

    Exit 0: settled. 1: no such run. 3: another worker holds the run.
    2: bad input (no such undecided call, invalid JSON).
    """
    if outcome is Outcome.NEVER_RAN and result is not None:
        raise typer.BadParameter("a call that never ran has no result", param_hint="--result")
    parsed = _json_option(result, "--result")

    async def work(backends: Backends) -> None:
        await backends.runner(_NoModel()).resolve(
            run_id,
            call,
            tenant=tenant,
            outcome="completed" if outcome is Outcome.COMPLETED else "never_ran",
            by=by,
            why=why,
            result=parsed,
        )
        out.print(
            Text(
                f"settled call {call} of run {run_id} as {outcome.value} (by {by}); carry it on "
                f"with onward run --resume {shlex.quote(run_id)} --tenant {shlex.quote(tenant)} "
                "--agent MODULE:ATTR --provider MODULE:ATTR"
            ),
            soft_wrap=True,
        )

    _with_backends(work, tenant=tenant)


@dataclass(frozen=True, slots=True)
class AuditLine:
    """One stored event of a run as the audit timeline shows it.

    Attributes:
        stored: The event and its position.
        refused: Why readers do not count it, if they do not.
    """

    stored: StoredEvent
    refused: RefusedEvent | None

    def as_json(self) -> dict[str, Any]:
        """One JSON-lines object: the position, the verdict, and the event as stored."""
        event = self.stored.event
        return {
            "run_id": event.run_id,
            "partition": self.stored.position.partition,
            "offset": self.stored.position.offset,
            "seq": event.seq,
            "fence": event.fence,
            "kind": kind_of(type(event)),
            "at": event.at,
            "description": describe_event(event),
            "refused": self.refused is not None,
            "reason": self.refused.reason.value if self.refused else None,
            "detail": self.refused.detail if self.refused else None,
            "event": event,
        }


def _ids(call_ids: Sequence[str]) -> str:
    return ", ".join(call_ids) or "none"


def _model_answered(event: ModelAnswered) -> str:
    usage = f"{event.usage.input_tokens} in, {event.usage.output_tokens} out"
    if event.tool_calls:
        calls = ", ".join(f"{c.call_id} {c.tool}" for c in event.tool_calls)
        return f"asks for {calls} ({usage})"
    return f"answers {_short(event.message.content)} ({usage})"


def _tool_completed(event: ToolCompleted) -> str:
    if event.error is not None:
        return f"{event.call_id} failed: {event.error.type} {_short(event.error.message)}"
    return f"{event.call_id} returned {_short(event.result)}"


def _finished(event: RunFinished) -> str:
    said = event.error if event.error is not None else _short(event.output)
    return f"{event.status}: {said}"


# One entry per kind, as the fold has one rule per kind; a kind without one fails loudly.
_DESCRIPTIONS: dict[type[Event], Callable[[Any], str]] = {
    RunStarted: lambda e: f"{e.agent} {e.revision}, input {_short(e.input)}",
    RunClaimed: lambda e: f"claimed by {e.worker}",
    ResumePlanned: lambda e: (
        f"replayed {_ids(e.replayed)}, dispatched {_ids(e.dispatched)}, "
        f"undecided {_ids(e.undecided)}"
    ),
    ModelAnswered: _model_answered,
    ToolDispatched: lambda e: f"{e.call_id} {e.tool}, key {e.idempotency_key}",
    ToolCompleted: _tool_completed,
    ToolResolved: lambda e: f"{e.call_id} settled as {e.outcome} by {e.by}: {_short(e.why)}",
    TurnSettled: lambda e: (
        f"iteration {e.iteration} settled: {', '.join(e.call_ids) or 'no calls'}"
    ),
    ApprovalRequested: lambda e: f"{e.request_id}: {_short(e.prompt)}",
    ApprovalGranted: lambda e: f"{e.request_id} approved by {e.by}",
    ApprovalDenied: lambda e: f"{e.request_id} denied by {e.by}",
    Tagged: lambda e: f"seq {e.target_seq} tagged {e.label}",
    RunContinued: lambda e: f"continued as {e.new_run_id}",
    RunFinished: _finished,
}


def describe_event(event: Event) -> str:
    """A few words on what an event says, for the audit timeline."""
    return _DESCRIPTIONS[type(event)](event)


async def audit_timeline(log: EventLog, run_id: str, *, tenant: str) -> list[AuditLine]:
    """Every stored event of a run in log order, each with the verdict every reader reaches.

    Raises:
        NothingToResumeError: No run under that id for that tenant.
    """
    stored = await log.read_run(run_id)
    guard = SequenceGuard()
    if stored and stored[0].event.seq > 1:
        # The run's beginning was compacted away: judge what is left from where it starts.
        first = stored[0].event
        guard = SequenceGuard(last_seq=first.seq - 1, fence=first.fence)
        _error(
            f"run {run_id!r}: the events before seq {first.seq} (offset "
            f"{stored[0].position.offset}) were compacted away; the timeline starts there"
        )
    lines: list[AuditLine] = []
    for item in stored:
        counted = guard.admit(item)
        lines.append(AuditLine(item, None if counted else guard.refused[-1]))
    first_counted = next((line for line in lines if line.refused is None), None)
    if first_counted is None or first_counted.stored.event.tenant != tenant:
        raise NothingToResumeError(
            f"no run {run_id!r} for tenant {tenant!r}; check the id and tenant", run_id=run_id
        )
    return lines


@app.command("replay")
def replay_command(
    run_id: RunArgument,
    tenant: TenantOption,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON lines, one object per event, instead of a table.")
    ] = False,
) -> None:
    """The audit timeline: every stored event of a run in log order, refused ones marked.

    Exit 0: shown. 1: no such run. 4: a record cannot be read.
    """

    async def work(backends: Backends) -> list[AuditLine]:
        return await audit_timeline(backends.log, run_id, tenant=tenant)

    lines = _with_backends(work, tenant=tenant)
    if as_json:
        for line in lines:
            typer.echo(msgspec.json.encode(line.as_json()).decode())
        return
    refused = sum(1 for line in lines if line.refused is not None)
    table = Table(
        title=f"run {run_id} ({tenant}): {len(lines)} events, {refused} refused",
        title_justify="left",
    )
    table.add_column("offset", justify="right")
    table.add_column("seq", justify="right")
    table.add_column("fence", justify="right")
    table.add_column("kind", no_wrap=True)
    table.add_column("what", overflow="fold")
    table.add_column("counted", no_wrap=True)
    for line in lines:
        event = line.stored.event
        what = Text(describe_event(event))
        verdict = Text("yes")
        if line.refused is not None:
            verdict = Text("REFUSED", style="bold red")
            # The guard's detail starts with the run and seq, which the row already shows.
            why = line.refused.detail.removeprefix(f"run {event.run_id!r} seq {event.seq}: ")
            what.append(f"\n{line.refused.reason.value}: {why}", style="red")
        table.add_row(
            str(line.stored.position.offset),
            str(event.seq),
            str(event.fence),
            kind_of(type(event)),
            what,
            verdict,
        )
    out.print(table)


async def _connect(settings: Settings) -> asyncpg.Connection:
    server_settings = {"search_path": settings.database_schema} if settings.database_schema else {}
    return await asyncpg.connect(settings.require_database_url(), server_settings=server_settings)


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply pending PostgreSQL migrations (DATABASE_URL) and create the first builds."""
    settings = _settings()

    async def run() -> list[str]:
        conn = await _connect(settings)
        try:
            return await migrate(conn)
        finally:
            await conn.close()

    try:
        applied = asyncio.run(run())
    except OnwardError as exc:
        raise _fail(exc) from exc
    for name in applied:
        console.print(f"applied {name}")
    console.print("schema is current" if not applied else f"{len(applied)} step(s) applied")


@db_app.command("verify")
def db_verify() -> None:
    """Check the PostgreSQL schema is the version this code expects (exit 1 if not)."""
    settings = _settings()

    async def run() -> tuple[int, int | None]:
        async with PostgresFrontierStore(
            settings.require_database_url(), schema=settings.database_schema
        ):
            conn = await _connect(settings)
            try:
                return await schema_version_postgres(conn), await active_build(conn, PROJECTION)
            finally:
                await conn.close()

    try:
        version, build = asyncio.run(run())
    except OnwardError as exc:
        raise _fail(exc) from exc
    console.print(f"schema version {version}, frontiers build {build}: ok")


@app.command()
def projector(
    *,
    projection: Annotated[
        str | None,
        typer.Option(help="A user projection, package.module:attribute (default: frontiers)."),
    ] = None,
    group: Annotated[
        str | None, typer.Option(help="Consumer group shared by all projectors of one projection.")
    ] = None,
    batch: Annotated[int, typer.Option(help="Most records folded per batch.")] = 5_000,
    session_timeout_ms: Annotated[int, typer.Option(help="Group session timeout.")] = 10_000,
    flush_events: Annotated[
        int,
        typer.Option(
            help="Frontiers: while working through a backlog, store after folding this many "
            "events (0: store every batch). A projector that has caught up stores every batch."
        ),
    ] = PROJECTOR_FLUSH_EVENTS,
    flush_interval: Annotated[
        float,
        typer.Option(help="Frontiers: store at least this often, in seconds, while folding."),
    ] = PROJECTOR_FLUSH_INTERVAL,
) -> None:
    """Fold the events topic into PostgreSQL until SIGTERM or SIGINT."""
    settings = _settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    quiet_garbage_collector()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        database_url = settings.require_database_url()
        async with contextlib.AsyncExitStack() as stack:
            log = await stack.enter_async_context(
                KafkaEventLog(
                    settings.kafka_bootstrap_servers,
                    topic=settings.kafka_topic,
                    partitions=settings.partitions,
                )
            )
            sink: ProjectionSink
            if projection is None:
                store = await stack.enter_async_context(
                    PostgresFrontierStore(
                        database_url,
                        schema=settings.database_schema,
                        synchronous_commit=False,  # every row can be folded again from the log
                    )
                )
                sink = FrontierProjection(
                    store,
                    log,
                    flush_events=flush_events,
                    flush_interval=flush_interval,
                    write_behind=True,
                )
                default_group = DEFAULT_GROUP
            else:
                user = load_projection(projection)
                sink = await stack.enter_async_context(
                    SqlProjectionSink(database_url, user, schema=settings.database_schema)
                )
                default_group = f"{DEFAULT_GROUP}-{user.name}"
            worker = KafkaProjector(
                settings.kafka_bootstrap_servers,
                sink,
                topic=settings.kafka_topic,
                partitions=settings.partitions,
                group_id=group or default_group,
                batch_records=batch,
                session_timeout_ms=session_timeout_ms,
            )
            await worker.start()
            try:
                reporter = asyncio.create_task(_report_lag(worker, stop))
                await worker.run(stop)
                await reporter
            finally:
                await worker.close()
        console.print("projector stopped cleanly")

    try:
        asyncio.run(run())
    except OnwardError as exc:
        raise _fail(exc) from exc


async def _report_lag(worker: KafkaProjector[ProjectionSink], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 10)
        except TimeoutError:
            lag = await worker.lag()
            stats = getattr(worker.projection, "stats", None)
            logging.getLogger("onward.projector").info(
                "lag %d records %s stats %s", sum(lag.values()), lag, stats
            )


@projections_app.command("rebuild")
def projections_rebuild(
    name: Annotated[str, typer.Argument(help="frontiers, or the name of a user projection.")],
    projection: Annotated[
        str | None,
        typer.Option(help="The user projection to rebuild, package.module:attribute."),
    ] = None,
    batch: Annotated[int, typer.Option(help="Records read per partition per step.")] = 5_000,
) -> None:
    """Fold the retained log into a new build of a projection and switch its views to it."""
    settings = _settings()
    user = None
    if name != PROJECTION:
        if projection is None:
            console.print(f"[red]{name!r} is not built in; pass --projection module:attr[/red]")
            raise typer.Exit(2)
        try:
            user = load_projection(projection)
        except OnwardError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from exc
        if user.name != name:
            console.print(f"[red]{projection} is projection {user.name!r}, not {name!r}[/red]")
            raise typer.Exit(2)

    async def run() -> RebuildReport:
        database_url = settings.require_database_url()
        async with KafkaEventLog(
            settings.kafka_bootstrap_servers,
            topic=settings.kafka_topic,
            partitions=settings.partitions,
            create_topic=False,
        ) as log:
            with Progress(
                TextColumn(f"rebuilding {name}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("fold", total=None)

                def show(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                if user is None:
                    return await rebuild_frontiers(
                        log,
                        database_url,
                        schema=settings.database_schema,
                        batch_size=batch,
                        on_progress=show,
                    )
                return await rebuild_projection(
                    log,
                    database_url,
                    user,
                    schema=settings.database_schema,
                    batch_size=batch,
                    on_progress=show,
                )

    try:
        report = asyncio.run(run())
    except OnwardError as exc:
        raise _fail(exc) from exc
    console.print(
        f"{report.projection} build {report.build} active (was {report.previous}); "
        f"{report.events} events in {report.seconds:.1f}s ({report.events_per_second:,.0f}/s); "
        "the old tables stay until dropped"
    )


@app.command()
def demo(
    child: Annotated[Path | None, typer.Option(hidden=True)] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Keep the demo's files here (default: a temp dir).")
    ] = None,
) -> None:
    """Kill a booking run mid-way and resume it elsewhere: one booking, never two."""
    from . import demo as booking  # noqa: PLC0415 - the demo's tools load only for the demo

    if child is not None:
        booking.run_child(child)
        return
    bookings = booking.run_demo(directory, Console())
    if bookings != 1:
        raise typer.Exit(1)


@app.callback()
def _root() -> None:
    """Onward: an event-sourced durable runtime for agent runs."""


def main() -> None:
    """Entry point of the `onward` console script."""
    app()
