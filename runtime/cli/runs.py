"""The run commands: inspect, run --resume, approve, deny, resolve, cancel, tag, replay."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, TypeGuard, TypeVar

import msgspec
import typer

from onward._storage import check_onward_sqlite
from onward.errors import (
    ConfigurationError,
    HistoryUnavailableError,
    InvalidInputError,
    NothingToResumeError,
    OnwardError,
    ResumeConflictError,
)
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.eventlog.events import Event, RunStarted, Tagged
from onward.projections.audit import AuditLine, audit_timeline, printable, shell_word
from onward.projections.compaction.base import CompactionStore
from onward.projections.compaction.history import (
    CompactedSpan,
    compacted_span,
    compacted_timeline,
)
from onward.projections.frontier import Frontier, RunTag
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.blobs import output_of
from onward.runtime.compaction import compaction_store
from onward.runtime.leases.base import (
    DEFAULT_LEASE_TTL_S,
    MAX_LEASE_TTL_S,
    LeasePolicy,
    RunLease,
)
from onward.runtime.limits import check_name, check_stored_name
from onward.runtime.options import DEFAULT_TENANT
from onward.runtime.providers import NoModel as _NoModel
from onward.runtime.providers import Provider
from onward.runtime.runner import AgentRunner, new_run_id
from onward.runtime.settings import Settings, load_settings

from ._common import (
    ArchiveOption,
    JsonResultOption,
    RunArgument,
    TenantOption,
    backend_servers,
    checked_sqlite_directory,
    echo_json,
    error,
    imported,
    json_option,
    made,
    opened,
    out,
    run_until_terminated,
    text_option,
)
from .progress import TurnLines
from .summary import (
    audit_table,
    carried,
    outcome,
    result_facts,
    run_facts,
    run_summary,
    shown,
    tags_text,
)

if TYPE_CHECKING:
    from onward.runtime.fleet.requests import CancelRun

_T = TypeVar("_T")

ByOption = Annotated[str, typer.Option("--by", help="Who answers; recorded in the log.")]
RequestArgument = Annotated[
    str, typer.Argument(metavar="REQUEST", help="The approval request the run waits on.")
]
ValueOption = Annotated[
    str | None,
    typer.Option(
        "--value",
        metavar="JSON",
        help="Recorded with the answer: JSON, @FILE to read it from a file, - from stdin.",
    ),
]
AgentOption = Annotated[
    str,
    typer.Option(
        "--agent",
        metavar="MODULE:ATTR",
        help="The agent the run started with: an Agent, or a function returning one.",
    ),
]
ProviderOption = Annotated[
    str,
    typer.Option(
        "--provider",
        metavar="MODULE:ATTR",
        help="The model: a Provider, or a function returning one.",
    ),
]


class NoModel(_NoModel):
    """The provider of commands that must never reach a model (inspect, approve, deny, resolve).

    Those commands only read a run or append a person's answer; a model call from one of them
    would be a bug, so it fails loudly instead of spending tokens.
    """

    def __init__(self) -> None:
        super().__init__(
            "this command does not call a model; carry the run on with `onward run --resume`"
        )


class Outcome(StrEnum):
    """What a person found out about an undecided call."""

    COMPLETED = "completed"
    NEVER_RAN = "never_ran"


def with_backends(
    work: Callable[[Backends], Awaitable[_T]], *, readonly: bool = False, creates: bool = False
) -> _T:
    """Run ``work`` on the configured stores, opened within a bounded connect time.

    With ``readonly`` (the commands that only read) the stores are opened read-only
    (`open_backends`): nothing in a SQLite file changes, and a file that is not an Onward
    database is refused. With ``creates`` (a command that starts a run) a SQLite file that is
    not there yet is made.
    """
    config = load_settings()

    async def on_stores() -> _T:
        if config.backend == "sqlite" and not creates and not config.sqlite_path.exists():
            # Every command here is about a run that exists; a mistyped path must not quietly
            # become a new, empty database.
            raise ConfigurationError(
                f"ONWARD_SQLITE_PATH {str(config.sqlite_path)!r} does not exist; point it at "
                "the database the runs were written to"
            )
        checked_sqlite_directory(config)
        if config.backend == "sqlite" and config.sqlite_path.exists():
            # Nor may another program's file quietly get Onward's tables: it holds no run.
            check_onward_sqlite(config.sqlite_path)
        stores = open_backends(config, readonly=readonly)
        async with opened(backend_servers(config), stores) as backends:
            return await work(backends)

    return run_until_terminated(on_stores())


def _is_agent(value: object) -> TypeGuard[Agent]:
    return isinstance(value, Agent)


def _is_provider(value: object) -> TypeGuard[Provider]:
    # A provider class has a `complete` attribute too; only instances count.
    return not isinstance(value, type) and isinstance(value, Provider)


def load_agent(spec: str) -> Agent:
    """The `Agent` named by ``--agent``: an instance, or a zero-argument callable returning one."""
    agent = made(imported(spec, "--agent"), spec, "--agent", is_made=_is_agent)
    if not _is_agent(agent):
        raise InvalidInputError(
            f"--agent: {spec} is a {type(agent).__name__}, not an Agent or a function returning one"
        )
    return agent


def load_provider(spec: str) -> Provider:
    """The `Provider` named by ``--provider``: an instance, or a zero-argument callable."""
    provider = made(imported(spec, "--provider"), spec, "--provider", is_made=_is_provider)
    if not _is_provider(provider):
        raise InvalidInputError(
            f"--provider: {spec} is a {type(provider).__name__}, not a Provider or a function "
            "returning one"
        )
    return provider


async def _look(
    backends: Backends, run_id: str, tenant: str
) -> tuple[Frontier, RunLease | None, HistoryUnavailableError | None]:
    """The run folded from the log, who holds it, and why its output could not be read
    (`readable_run`); takes no lease and writes nothing."""
    reader = backends.runner(NoModel())
    frontier, lost = await readable_run(reader, run_id, tenant)
    return frontier, await backends.leases.current(run_id), lost


async def shown_run(reader: AgentRunner, run_id: str, tenant: str) -> Frontier:
    """The run as ``reader.inspect`` folds it, with the output it ended with as it was given,
    for a person to read: its row keeps it as the log does, out of line in the blob store when
    it was large (`output_of`).

    Raises:
        HistoryUnavailableError: The output is out of line and cannot be read.
    """
    frontier, lost = await readable_run(reader, run_id, tenant)
    if lost is not None:
        raise lost
    return frontier


async def readable_run(
    reader: AgentRunner, run_id: str, tenant: str
) -> tuple[Frontier, HistoryUnavailableError | None]:
    """`shown_run`, but an output the blob store lost (or altered) is left out and returned
    as the error that says so: what shows a run shows the rest of it, the missing body named,
    rather than nothing."""
    frontier = await reader.inspect(run_id, tenant=tenant)
    if frontier.output is None:
        return frontier, None
    try:
        output = await output_of(frontier, reader.writer.claim_check)
    except HistoryUnavailableError as lost:
        return msgspec.structs.replace(frontier, output=None), lost
    return msgspec.structs.replace(frontier, output=output), None


MAX_CHAIN = 100
"""How far `inspect` follows a chain of continued runs either way."""


async def _chain(backends: Backends, frontier: Frontier) -> list[Frontier]:
    """The runs ``frontier``'s run was carried on from and into, oldest first, itself included."""
    return await chain_of(backends.runner(NoModel()), frontier)


async def chain_of(reader: AgentRunner, frontier: Frontier) -> list[Frontier]:
    """`_chain`, read through ``reader`` (a product's runner, `frontier_main`). A run is shown
    carried on from another only once that run was continued into it: a run a carry started
    and the old run went on without (`continuation.hand_over`) is no link of the chain."""
    chain = [frontier]
    while (before := chain[0].continuation_of) is not None and len(chain) < MAX_CHAIN:
        earlier = await reader.inspect(before, tenant=frontier.tenant)
        if earlier.continued_to != chain[0].run_id:
            break
        chain.insert(0, earlier)
    while (after := chain[-1].continued_to) is not None and len(chain) < MAX_CHAIN:
        chain.append(await reader.inspect(after, tenant=frontier.tenant))
    return chain


def _carry_on_hint(run_id: str, tenant: str) -> str:
    return (
        f"carry it on with onward run --resume {shell_word(run_id)} --tenant "
        f"{shell_word(tenant)} --agent MODULE:ATTR --provider MODULE:ATTR"
    )


def inspect_command(
    run_id: RunArgument,
    tenant: TenantOption = DEFAULT_TENANT,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object with the same facts, not a table.")
    ] = False,
) -> None:
    """Show where a run stands and what resume would do. Takes no lease, writes nothing.

    A run carried into another run (or carried on from one) shows the whole chain.

    Exit 0: shown. 1: no such run. 2: bad command line, or the SQLite file is missing or is
    not an Onward database. 4: the run cannot be read, or the output it ended with cannot (the
    rest of it is shown). 5: a store failed.
    """

    async def work(backends: Backends) -> None:
        frontier, lease, lost = await _look(backends, run_id, tenant)
        chain = await _chain(backends, frontier)
        spend = await backends.spend.run_total(run_id)
        if as_json:
            facts = run_facts(frontier, lease=lease, chain=chain, spend=spend)
            echo_json(facts)
        else:
            out.print(run_summary(frontier, lease=lease, chain=chain, spend=spend))
        if backends.compaction is not None:
            span = await compacted_span(backends.compaction, run_id)
            if span is not None:
                error(printable(span.describe(run_id)))
        if lost is not None:
            raise lost

    with_backends(work, readonly=True)


WAIT_RECHECK_S = 1.0
"""How often `run --resume --wait` asks again for a held run."""

WorkerOption = Annotated[
    str | None, typer.Option(help="This worker's name (default: host and process id).")
]
LeaseTtlOption = Annotated[
    float | None,
    typer.Option(
        help="Seconds the run's lease lasts unless renewed: how long the run stays held if "
        "this process dies where no process of this host can tell (its host is lost). "
        f"Default: ONWARD_LEASE_TTL, else {DEFAULT_LEASE_TTL_S:g}.",
        show_default=False,
    ),
]


def lease_policy(lease_ttl: float | None) -> LeasePolicy:
    """The policy of ``--lease-ttl``, else the settings' (``ONWARD_LEASE_TTL``); refused
    before anything is opened if it cannot hold, or is longer than ``ONWARD_LEASE_TTL`` may be
    (a lost host's run would stay locked that long)."""
    if lease_ttl is None:
        return load_settings().lease_policy()
    if not (lease_ttl > 0 and math.isfinite(lease_ttl)):
        raise InvalidInputError(f"--lease-ttl must be positive seconds, got {lease_ttl}")
    if lease_ttl > MAX_LEASE_TTL_S:
        raise InvalidInputError(
            f"--lease-ttl must be at most {MAX_LEASE_TTL_S:g} seconds, as ONWARD_LEASE_TTL, "
            f"got {lease_ttl:g}"
        )
    ttl = timedelta(seconds=lease_ttl)
    if not ttl:
        raise InvalidInputError(f"--lease-ttl must be at least a microsecond, got {lease_ttl:g}")
    return LeasePolicy(ttl=ttl)


def worker_name(name: str | None, option: str = "--worker") -> str | None:
    """The lease holder's name an option gives, refused if it cannot be printed as it is (every
    refusal and `inspect` show it); empty or None is the default (host and process id)."""
    return check_name(option, name) if name else None


def start_command(
    prompt: Annotated[
        str,
        typer.Argument(
            metavar="PROMPT",
            help="The run's input, as text; @FILE reads it from a file, - from stdin.",
        ),
    ],
    *,
    tenant: TenantOption = DEFAULT_TENANT,
    agent_spec: AgentOption,
    provider_spec: ProviderOption,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="The new run's id (default: a fresh one).")
    ] = None,
    worker: WorkerOption = None,
    lease_ttl: LeaseTtlOption = None,
    as_json: JsonResultOption = False,
) -> None:
    """Start a run of the agent with PROMPT as its input and drive it until it ends or waits
    on a person, saying on stderr how each turn went as it settles.

    The run's id is printed first, with the command that carries it on if this one stops.

    Exit 0: the run ended or waits on a person (its status is printed). 2: bad command line, or
    a run under that id exists. 3: another worker holds that id. 5: a store, the model or the
    agent's code failed; the run is kept, `onward run --resume` carries it on.
    """
    policy = lease_policy(lease_ttl)
    worker = worker_name(worker)
    text = text_option(prompt, "PROMPT")
    if not text.strip():
        # An unset shell variable, an empty file or an empty pipe: a run on no input would
        # still ask (and pay) the model.
        where = ""
        if prompt == "-":
            where = " (standard input)"
        elif prompt.startswith("@"):
            where = f" (the file {prompt[1:]})"
        raise InvalidInputError(f"PROMPT is empty{where}; give the run's input as text, @FILE or -")
    agent = load_agent(agent_spec)
    provider = load_provider(provider_spec)
    new_id = check_name("--run-id", run_id) if run_id is not None else new_run_id()

    async def work(backends: Backends) -> None:
        where = ["--tenant", tenant, "--agent", agent_spec, "--provider", provider_spec]
        carry_on = " ".join(map(shell_word, ["onward", "run", "--resume", new_id, *where]))
        said = (
            None
            if as_json
            else f"started run {new_id} (tenant {tenant}); if this stops: {carry_on}"
        )
        observer = _StartLine(said)
        runner = backends.runner(provider, worker=worker, lease_policy=policy, observer=observer)
        result = await runner.run(agent, text, tenant=tenant, run_id=new_id)
        if as_json:
            echo_json(result_facts(result, worker=runner.worker))
        else:
            out.print(outcome(result))

    with_backends(work, creates=True)


class _StartLine(TurnLines):
    """`TurnLines`, with ``line`` on standard output once the run's start is in the log: a
    start refused (its id taken, a tenant no run can have) says it started nothing."""

    def __init__(self, line: str | None) -> None:
        super().__init__()
        self._line_once = line

    async def appended(self, events: Sequence[Event]) -> None:
        if self._line_once is not None and any(isinstance(e, RunStarted) for e in events):
            out.print(shown(self._line_once), soft_wrap=True)
            self._line_once = None
        await super().appended(events)


def run_command(
    resume: Annotated[str, typer.Option("--resume", metavar="RUN", help="The run to carry on.")],
    *,
    tenant: TenantOption = DEFAULT_TENANT,
    agent_spec: AgentOption,
    provider_spec: ProviderOption,
    worker: WorkerOption = None,
    lease_ttl: LeaseTtlOption = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="If another worker holds the run, wait for its lease to end (saying who holds "
            "it and until when) and then carry it on.",
        ),
    ] = False,
    as_json: JsonResultOption = False,
) -> None:
    """Carry a run on: take its lease, read it once under the lease, claim it, plan, and
    drive it, saying on stderr what the plan is and how each turn went as it settles.

    A run held by a process of this host that has ended (killed, crashed) is taken at once;
    one held by a live worker or another host's is refused with when its lease lapses, or with
    --wait waited for.

    Exit 0: carried on, or nothing to do. 1: no such run. 2: bad command line.
    3: another worker holds it.
    4: it must not be carried on (an undecided call, an evicted transcript, another revision,
    an unreadable or newer record).
    5: a store, the model or the agent's code failed.
    """
    policy = lease_policy(lease_ttl)
    worker = worker_name(worker)
    agent = load_agent(agent_spec)
    provider = load_provider(provider_spec)

    async def work(backends: Backends) -> None:
        runner = backends.runner(provider, worker=worker, lease_policy=policy, observer=TurnLines())
        said: tuple[str | None, float | None] | None = None
        while True:
            try:
                result = await runner.resume(agent, resume, tenant=tenant)
                break
            except ResumeConflictError as held:
                if not wait:
                    raise
                if said != (held.holder, held.expires_at):
                    said = (held.holder, held.expires_at)
                    error(f"waiting: {held}")
                await asyncio.sleep(_recheck_in(held.expires_at))
        if as_json:
            echo_json(result_facts(result, worker=runner.worker))
        else:
            out.print(carried(result, runner.worker, resume))

    with_backends(work)


def _recheck_in(expires_at: float | None) -> float:
    """How long to wait before asking for a held run again: until its lease lapses, at most
    `WAIT_RECHECK_S` (the holder may let go sooner)."""
    if expires_at is None:
        return WAIT_RECHECK_S
    return min(max(expires_at - time.time(), 0.05), WAIT_RECHECK_S)


def approve_command(
    run_id: RunArgument,
    request: RequestArgument,
    *,
    tenant: TenantOption = DEFAULT_TENANT,
    by: ByOption,
    value: ValueOption = None,
    as_json: JsonResultOption = False,
) -> None:
    """Answer a run's approval request with yes; a later `run --resume` carries it on.

    Exit 0: answered. 1: no such run. 2: bad input (not waiting on that request, invalid JSON).
    3: another worker holds the run. 5: a store failed.
    """
    _answer(run_id, request, approve=True, tenant=tenant, by=by, value=value, as_json=as_json)


def deny_command(
    run_id: RunArgument,
    request: RequestArgument,
    *,
    tenant: TenantOption = DEFAULT_TENANT,
    by: ByOption,
    value: ValueOption = None,
    as_json: JsonResultOption = False,
) -> None:
    """Answer a run's approval request with no; the run ends, cancelled.

    Exit 0: answered. 1: no such run. 2: bad input (not waiting on that request, invalid JSON).
    3: another worker holds the run. 5: a store failed.
    """
    _answer(run_id, request, approve=False, tenant=tenant, by=by, value=value, as_json=as_json)


def _answer(
    run_id: str,
    request: str,
    *,
    approve: bool,
    tenant: str,
    by: str,
    value: str | None,
    as_json: bool,
) -> None:
    """`approve` or `deny`: the same arguments, one verb apart. Each is a function of its own,
    its docstring in the source, so ``onward --help`` lists it without importing this module."""
    parsed = json_option(value, "--value")

    async def work(backends: Backends) -> None:
        runner = backends.runner(NoModel())
        if approve:
            await runner.approve(run_id, request, tenant=tenant, by=by, value=parsed)
        else:
            await runner.deny(run_id, request, tenant=tenant, by=by, value=parsed)

    with_backends(work)
    verdict = "approved" if approve else "denied"
    if as_json:
        answered = {"run": run_id, "tenant": tenant, "request": request, "answer": verdict}
        echo_json({**answered, "by": by})
        return
    then = _carry_on_hint(run_id, tenant) if approve else "the run is cancelled"
    out.print(shown(f"{verdict} {request} of run {run_id} (by {by}); {then}"), soft_wrap=True)


def resolve_command(
    run_id: RunArgument,
    call: Annotated[str, typer.Argument(metavar="CALL", help="The undecided call.")],
    *,
    tenant: TenantOption = DEFAULT_TENANT,
    outcome: Annotated[Outcome, typer.Option(help="What you found out about the call.")],
    by: ByOption,
    why: Annotated[str, typer.Option(help="How you know; recorded in the log.")],
    result: Annotated[
        str | None,
        typer.Option(
            metavar="JSON",
            help="The call's result, when it completed: JSON, @FILE from a file, - from stdin.",
        ),
    ] = None,
    as_json: JsonResultOption = False,
) -> None:
    """Settle an undecided call as a person: it completed (with its result) or never ran.

    Exit 0: settled. 1: no such run. 2: bad input (no such undecided call, invalid JSON).
    3: another worker holds the run. 5: a store failed.
    """
    if outcome is Outcome.NEVER_RAN and result is not None:
        raise InvalidInputError("--result: a call that never ran has no result")
    parsed = json_option(result, "--result")

    async def work(backends: Backends) -> None:
        await backends.runner(NoModel()).resolve(
            run_id,
            call,
            tenant=tenant,
            outcome="completed" if outcome is Outcome.COMPLETED else "never_ran",
            by=by,
            why=why,
            result=parsed,
        )

    with_backends(work)
    if as_json:
        settled = {"run": run_id, "tenant": tenant, "call": call, "outcome": outcome.value}
        echo_json({**settled, "by": by})
        return
    out.print(
        shown(
            f"settled call {call} of run {run_id} as {outcome.value} (by {by}); "
            + _carry_on_hint(run_id, tenant)
        ),
        soft_wrap=True,
    )


def cancel_command(
    run_id: RunArgument,
    *,
    tenant: TenantOption = DEFAULT_TENANT,
    by: Annotated[str, typer.Option("--by", help="Who cancels it; recorded in the log.")],
    why: Annotated[str, typer.Option(help="Why; recorded in the log with who.")] = "",
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            metavar="SECONDS",
            help="While another holds the run, ask its holder to end it at its next boundary "
            "and wait up to SECONDS for that.",
        ),
    ] = None,
    as_json: JsonResultOption = False,
) -> None:
    """End a run cancelled: nothing of it is carried on after, and the spend it holds is
    released. For a run nobody should carry on (a worker gave it up, or it is not wanted).

    A call it dispatched and never settled stays undecided in its record (it may have run);
    the command names each such call on stderr. A run another process drives: with --wait, its
    holder is asked (with the run's lease; on Kafka with ONWARD_REQUEST_KEY set, the fleet's
    worker that owns it is sent a CancelRun too) to end it at its next boundary (a tool call in
    flight finishes first), and the command waits for that. On PostgreSQL alone, a start that
    still waits in the requests table (no worker carrying its agent took it) is taken back and
    its run recorded as cancelled.

    Exit 0: cancelled. 1: no such run. 2: bad input (the run has ended already, or ended
    otherwise while waited for, or is a LangGraph thread no graph run is writing). 3: another
    holds the run (without --wait, or still at its end). 5: a store failed.
    """
    if wait is not None and not (wait > 0 and math.isfinite(wait)):
        raise InvalidInputError(f"--wait must be positive, finite seconds, got {wait!r}")

    # The fleet (its worker, its consumer) is for cancel alone: not loaded by the other commands.
    from onward.runtime.fleet.requests import CancelRun  # noqa: PLC0415

    async def work(backends: Backends) -> Frontier:
        runner = backends.runner(NoModel())
        request = CancelRun(run_id=run_id, tenant=tenant, by=by, why=why)
        try:
            if wait is not None:
                return await _cancel_within(backends, runner, request, wait)
            return await runner.cancel(run_id, tenant=tenant, by=by, why=why)
        except NothingToResumeError:
            if not await _cancel_waiting_start(backends, runner, request):
                raise
            return await runner.inspect(run_id, tenant=tenant)
        except ResumeConflictError as held:
            if held.holder is None or wait is not None:
                raise  # with --wait, said by `_cancel_within`: the hint would name what was done
            raise ResumeConflictError(
                f"{held}; --wait SECONDS asks its holder to end it at its next boundary and "
                "waits for that",
                run_id=run_id,
                holder=held.holder,
                expires_at=held.expires_at,
            ) from held

    ended = with_backends(work)
    # A call stopped at a person's question (`ask`) did nothing after it: it is no call that
    # may have run, and nobody is to go and find out whether it did.
    undecided = [
        c
        for c in ended.calls
        if c.dispatched_seq is not None and c.outcome is None and c.asked_seq is None
    ]
    for call in undecided:
        error(
            f"call {call.call_id} ({call.tool}) was dispatched and never settled: it may have "
            "run; its record says undecided"
        )
    # The run that ended: the run it goes on as, when it was carried on as it was asked.
    if as_json:
        facts = {"run": ended.run_id, "tenant": tenant, "status": ended.status, "by": by}
        echo_json({**facts, "why": why, "undecided_calls": [c.call_id for c in undecided]})
        return
    out.print(shown(f"cancelled run {ended.run_id} (by {by})"), soft_wrap=True)


async def _cancel_waiting_start(
    backends: Backends, runner: AgentRunner, request: CancelRun
) -> bool:
    """On PostgreSQL alone, a run whose start waits in the requests table (no worker carrying
    its agent has taken it) is cancelled there; whether it was."""
    from onward.runtime.fleet.requests_postgres import cancel_waiting_start  # noqa: PLC0415
    from onward.runtime.fleet.senders import postgres_requests  # noqa: PLC0415

    settings = backends.settings
    if settings.backend != "postgres":
        return False
    async with opened("the requests table", postgres_requests(settings)) as requests:
        return await cancel_waiting_start(requests, runner, request)


async def _cancel_within(
    backends: Backends, runner: AgentRunner, request: CancelRun, wait: float
) -> Frontier:
    """Cancel the run, trying again while another holds it, for up to ``wait`` seconds.

    Each refusal asks the holder met to end the run itself at its next boundary (the ask kept
    with its lease, `LeaseStore.ask_to_cancel`, which every backend has and the holder hears at
    its next renewal or tool call); on Kafka with a request key the first refusal also sends a
    `CancelRun` to the worker that owns the run's partition, which hears it at once. Whoever
    ends the run first, the command reports it cancelled. A run its holder carried on once
    asked (the ask goes on with the carry) is followed to the run it goes on as, which is
    the one returned.

    Raises:
        ResumeConflictError: Still held once ``wait`` is over (its holder was asked, and still
            ends the run at its next boundary).
        InvalidInputError: The run has ended, and not cancelled (it finished meanwhile).
    """
    deadline = time.monotonic() + wait
    asked = False
    while True:
        try:
            return await runner.cancel(
                request.run_id, tenant=request.tenant, by=request.by, why=request.why
            )
        except InvalidInputError:
            if asked:  # the holder asked may have ended it first
                frontier = await runner.inspect(request.run_id, tenant=request.tenant)
                if frontier.status == "cancelled":
                    return frontier
                onward = frontier.continued_to
                if frontier.status == "continued" and onward is not None:
                    # Carried on as it was asked: the ask went on with it, and the run it goes
                    # on as is the one that ends (or is to be ended here).
                    request = msgspec.structs.replace(request, run_id=onward)
                    continue
            raise
        except ResumeConflictError as held:
            if held.holder is None:
                raise  # not this tenant's to know about, or let go this moment: said as it is
            if time.monotonic() >= deadline:
                then = (
                    "; its holder was asked to end it cancelled and does at its next boundary"
                    if asked
                    else ""
                )
                if asked and await _is_graph_thread(runner, request):
                    then = (
                        "; its holder was asked to end it cancelled. It is a LangGraph thread: "
                        "its saver ends the graph run writing it at that run's next write; if "
                        "none is (the saver keeps the thread between invocations), nothing is "
                        "cancelled and the thread's next invocation runs"
                    )
                raise ResumeConflictError(
                    f"{held}; still held after --wait {wait:g} s{then}",
                    run_id=request.run_id,
                    holder=held.holder,
                    expires_at=held.expires_at,
                ) from held
            holding = await runner.ask_to_cancel(
                request.run_id, tenant=request.tenant, by=request.by, why=request.why
            )
            if not asked:
                asked = True
                asked_fleet = await _ask_fleet_to_cancel(backends.settings, request)
                graph = await _is_graph_thread(runner, request)
                _say_waiting(request, held.holder, holding, asked_fleet, wait, graph=graph)
        await asyncio.sleep(_CANCEL_RETRY_S)


async def _is_graph_thread(runner: AgentRunner, request: CancelRun) -> bool:
    """Whether the run is a LangGraph thread (no agent of Onward's own), as far as its
    frontier can be read: its saver ends only a graph run writing it, not the thread."""
    try:
        frontier = await runner.inspect(request.run_id, tenant=request.tenant)
    except OnwardError:
        return False
    return not frontier.agent


def _say_waiting(
    request: CancelRun,
    holder: str,
    holding: RunLease | None,
    asked_fleet: bool,
    wait: float,
    *,
    graph: bool = False,
) -> None:
    """Say on stderr whom the command asked, when the holder hears it, and until when it waits.

    A LangGraph thread's holder is its saver, which no fleet worker drives and which ends only
    a graph run writing the thread (or one stopped at an interrupt), never the thread itself.
    """
    until = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + wait))
    by_when = ""
    if holding is not None:
        lapses = time.strftime("%H:%M:%S UTC", time.gmtime(holding.expires_at))
        by_when = f" (before {lapses}, when its lease would lapse unrenewed)"
    if graph:
        heard = (
            f"it is a LangGraph thread: its saver hears the ask at its next lease renewal or "
            f"write{by_when} and ends the graph run writing it, or one stopped at an interrupt; "
            "if none is, nothing is cancelled"
        )
    elif asked_fleet:
        heard = "the worker that owns it was sent the cancel and stops it at its next boundary"
    else:
        heard = (
            f"it hears the ask at its next lease renewal or tool call{by_when} and ends the run "
            "at its next boundary"
        )
    error(
        f"run {request.run_id} is held by {holder}; asked it to end the run cancelled: {heard}; "
        f"waiting until {until}"
    )


_CANCEL_RETRY_S = 0.25


def _fleet_takes_requests(settings: Settings) -> bool:
    """Whether the deployment has a fleet to ask: Kafka, and a request key (or unsigned requests
    accepted)."""
    return settings.backend == "kafka" and bool(
        settings.request_key or settings.accept_unsigned_requests
    )


async def _ask_fleet_to_cancel(settings: Settings, request: CancelRun) -> bool:
    """Send ``request`` to the fleet when the deployment has one to send it to (Kafka, and a
    request key or unsigned requests accepted); whether it was sent."""
    from onward.runtime.fleet.requests import Requests  # noqa: PLC0415

    if not _fleet_takes_requests(settings):
        return False
    async with Requests(
        settings.kafka_connection(),
        settings.requests_topic,
        partitions=settings.partitions,
        signer=settings.request_signer(),
    ) as requests:
        await requests.submit(request)
    return True


def tag_command(
    run_id: RunArgument,
    label: Annotated[str, typer.Argument(metavar="LABEL", help="The label, e.g. phase-1-done.")],
    *,
    tenant: TenantOption = DEFAULT_TENANT,
    seq: Annotated[
        int | None,
        typer.Option(
            "--seq", metavar="N", help="The event to tag (default: the run's latest boundary)."
        ),
    ] = None,
    by: Annotated[
        str, typer.Option("--by", help="Who tags it; the lease store shows it as the holder.")
    ] = "tagger",
    as_json: JsonResultOption = False,
) -> None:
    """Put a label on one event of a run; tagged events survive compaction.

    Written as a `Tagged` event under the run's lease.

    Exit 0: tagged. 1: no such run. 2: bad input (an empty label, a seq the run does not have,
    no boundary yet and no --seq, a seq compaction removed: below the run's truncation point).
    3: another worker holds the run. 5: a store failed.
    """

    async def work(backends: Backends) -> int:
        async with compaction_store(backends) as store:
            tagger = backends.runner(NoModel(), compaction=store)
            return await tagger.tag(run_id, label, tenant=tenant, seq=seq, by=by)

    tagged = with_backends(work)
    if as_json:
        echo_json({"run": run_id, "tenant": tenant, "seq": tagged, "label": label, "by": by})
        return
    out.print(shown(f"tagged seq {tagged} of run {run_id} as {label!r}"), soft_wrap=True)


def replay_command(
    run_id: RunArgument,
    tenant: TenantOption = DEFAULT_TENANT,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON lines, one object per event, instead of a table.")
    ] = False,
    archive: ArchiveOption = None,
) -> None:
    """The audit timeline: every stored record of a run in log order, refused events and
    unreadable records marked in place (with their offset and why). After compaction, the
    compacted span is named with where it was archived, and tagged events retained are shown
    in place; with --archive the whole history is read from the archive and the log.

    Takes no lease and writes nothing.

    Exit 0: shown. 1: no such run. 2: bad command line, an --archive that does not hold what
    compaction archived of the run, or the SQLite file is missing or is not an Onward
    database. 5: a store failed, or the archive is corrupt.
    """
    # Refused as every other command refuses them, not read as a run nobody has (exit 1).
    check_stored_name("run_id", run_id)
    check_stored_name("tenant", tenant, run_id=run_id)
    if archive is not None and not archive.is_dir():
        # An archive that is not there reads as an empty one: the timeline would be the log's
        # alone and a mistyped path never named.
        raise InvalidInputError(f"--archive {archive}: no such directory")

    async def work(
        backends: Backends,
    ) -> tuple[list[AuditLine], CompactedSpan | None, int | None]:
        if archive is not None:
            log = ArchivedEventLog(backends.log, DirectoryArchive(archive))
            async with compaction_store(backends) as store:
                await _refuse_if_not_archived_here(store, log, run_id)
            return await audit_timeline(log, run_id, tenant=tenant, archived=True), None, None
        async with compaction_store(backends) as store:
            lines, span = await compacted_timeline(backends.log, store, run_id, tenant=tenant)
        return lines, span, await _tail_cut_through(backends, run_id, lines, span)

    lines, span, cut_through = with_backends(work, readonly=True)
    if span is not None:
        error(printable(span.describe(run_id)))
    # The log's first record of the run; an unreadable one has no seq to tell a cut by, and
    # is named below as unreadable, not as the start of a cut.
    first = next((line.stored for line in lines if not line.retained), None)
    if first is not None and first.event.seq > (1 if span is None else span.before_seq):
        # Nothing compaction took: cut by other means (Kafka retention, a cut made elsewhere).
        since = "" if span is None else f"from seq {span.before_seq} "
        error(
            f"run {run_id!r}: the events {since}before seq {first.event.seq} (offset "
            f"{first.position.offset}) were cut from the log; the timeline starts there"
        )
    elif span is not None and cut_through == _UNKNOWN_TAIL:
        error(
            f"run {run_id!r}: its events from seq {span.before_seq} on, if it had any, were cut "
            "from the log (its frontier row, which says, is missing); the timeline shows only "
            "what compaction retained"
        )
    elif span is not None and cut_through is not None:
        error(
            f"run {run_id!r}: its events from seq {span.before_seq} to {cut_through} were cut "
            "from the log; the timeline shows only what compaction retained"
        )
    runs = _runs_of(lines)
    starts = [lines[begin].position.offset for begin, _ in runs]
    if len(runs) > 1:
        error(
            f"run {run_id!r}: the id was used again after an earlier run under it was collected; "
            f"{len(runs)} runs are shown in turn, each from its first record (offset "
            f"{', '.join(map(str, starts))})"
        )
    holes = [line.position.offset for line in lines if line.unreadable is not None]
    if holes:
        error(
            f"run {run_id!r}: {len(holes)} record(s) cannot be read (offset "
            f"{', '.join(map(str, holes))}); inspect and resume refuse the run until they can"
        )
    if as_json:
        for line in lines:
            echo_json(line.as_json())
        return
    out.print(audit_table(run_id, tenant, lines))
    if len(runs) < 2:
        out.print(shown(f"tags: {tags_text(_tags(lines))}"), soft_wrap=True)
        return
    # Each run's tags apart: read as one line, the old run's would be the new run's seqs.
    for start, (begin, end) in zip(starts, runs, strict=True):
        tags = tags_text(_tags(lines[begin:end]))
        out.print(shown(f"tags of the run from offset {start}: {tags}"), soft_wrap=True)


async def _refuse_if_not_archived_here(
    store: CompactionStore, log: ArchivedEventLog, run_id: str
) -> None:
    """Refuse an --archive that does not reach back to where compaction archived the run's
    cut events (a mistyped or another directory): read as an empty archive, a run cut whole
    would be said not to exist, one cut in part shown from the log on.

    Raises:
        InvalidInputError: The archive does not hold what compaction archived of the run.
    """
    point = (await store.truncations([run_id])).get(run_id)
    if point is None:
        return  # no cut took any of the run's events (every cut gives a point first)
    archived = [
        c
        for c in await store.cuts(point.partition)
        if c.archive is not None and c.start < point.before_offset
    ]
    if not archived:
        return
    lowest = min(c.start for c in archived)
    reach = (await log.bounds(point.partition)).start
    if reach > lowest:
        where = ", ".join(sorted({str(c.archive) for c in archived}))
        raise InvalidInputError(
            f"--archive {log.archive.location}: partition {point.partition} was cut from offset "
            f"{lowest} and archived in {where}, but this archive and the log reach back to "
            f"offset {reach} only; pass the archive compaction wrote",
            run_id=run_id,
        )


async def _tail_cut_through(
    backends: Backends, run_id: str, lines: list[AuditLine], span: CompactedSpan | None
) -> int | None:
    """The last seq of a compacted run's events after its point that were cut from the log by
    other means (Kafka retention), when none of them is left; else ``None``; `_UNKNOWN_TAIL`
    when the run's row, which tells, is missing.

    The timeline then holds only retained events, which read as the run's whole history. A
    point past the run's last event (a run compacted to its end) lost nothing: the run's
    frontier row tells the two apart.
    """
    if span is None or any(not line.retained for line in lines):
        return None
    if (await backends.log.bounds(span.partition)).start <= span.before_offset:
        return None
    row = await backends.frontiers.get(run_id)
    if row is None:
        return _UNKNOWN_TAIL
    if row.summary.last_seq < span.before_seq:
        return None
    return row.summary.last_seq


_UNKNOWN_TAIL = -1
"""What `_tail_cut_through` gives when the run's row is missing, so none says whether it had
events past its point: said as possibly cut, not passed over as nothing lost."""


def _counted_start(line: AuditLine) -> bool:
    """Whether ``line`` is a counted start of a run's history."""
    event = line.stored.event if line.stored is not None else None
    return isinstance(event, RunStarted) and event.seq == 1 and line.refused is None


def _runs_of(lines: list[AuditLine]) -> list[tuple[int, int]]:
    """The ``(begin, end)`` line bounds of each run a timeline holds: a counted start after a
    counted line begins a run id used again (only a timeline read with the archive has one).
    The first run is read from the first line on, whether or not its start is there: one whose
    start was cut (Kafka retention, an unreadable record) is still a run of its own."""
    if not lines:
        return []
    begins = [0]
    counted = False
    for n, line in enumerate(lines):
        if counted and _counted_start(line):
            begins.append(n)
        counted = counted or (line.stored is not None and line.refused is None)
    return list(itertools.pairwise([*begins, len(lines)]))


def _tags(lines: list[AuditLine]) -> list[RunTag]:
    """The tags the counted `Tagged` events of a timeline put on the run, in log order."""
    tags: list[RunTag] = []
    for line in lines:
        event = line.stored.event if line.stored is not None else None
        if isinstance(event, Tagged) and line.refused is None:
            tags.append(RunTag(seq=event.target_seq, label=event.label, tagged_seq=event.seq))
    return tags
