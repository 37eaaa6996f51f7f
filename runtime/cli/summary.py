"""What the run commands print: a run's summary, what a resume did, and the audit table.

Every string here that came from a run (ids, tenants, labels, holders, output, errors, tool
names, refusal details) is shown through `printable`, so run content cannot send escape
sequences to the operator's terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from onward.eventlog.events import kind_of
from onward.projections.audit import AuditLine, describe_event, one_line, printable
from onward.projections.frontier import CallState, Frontier, RunTag
from onward.runtime.agent import Agent
from onward.runtime.leases.base import RunLease
from onward.runtime.planning import ResumePlan, plan_resume
from onward.runtime.spend.base import Spend
from onward.runtime.tools import Tool

from ._common import EXIT_HELD, EXIT_MUST_NOT_CARRY_ON

if TYPE_CHECKING:
    # The runner (and through it the metrics): ``onward runs`` prints no run's result.
    from onward.runtime.runner import RunResult


def shown(value: object, style: str = "") -> Text:
    """A value as text for people: `printable`, and never read as rich markup."""
    return Text(printable(str(value)), style=style)


def utc_time(at: int) -> datetime | None:
    """An ``at`` (microseconds since the epoch) as a UTC time; ``None`` when unknown (0) or
    past the dates a `datetime` holds.

    Every reader takes any 64-bit ``at`` (it is informational), so a foreign producer whose
    clock gives nanoseconds writes times past year 9999: shown, they must not stop the command
    that shows the run.
    """
    if at <= 0:
        return None
    try:
        return datetime.fromtimestamp(at / 1_000_000, UTC)
    except (OverflowError, ValueError, OSError):
        return None


def _when(seconds: float) -> str:
    """Seconds since the epoch in ISO 8601, UTC; as a number when no date holds them."""
    try:
        return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return f"{seconds:.0f} s after the epoch"


def event_time(at: int, *, day: str | None) -> tuple[str | None, str]:
    """An event's ``at`` (microseconds since the epoch) in UTC, as the replay table shows it
    under the event's kind: the time to the millisecond, with the date above it only when it is
    not ``day`` (the row above's), so a narrow terminal keeps its width for what happened.

    Returns:
        The event's date (``day`` for an event written without a time, shown ``-``, or at one
        no date holds, shown as its number) and the text.
    """
    when = utc_time(at)
    if when is None:
        return day, "-" if at <= 0 else f"at {at}"
    date, clock = when.strftime("%Y-%m-%d"), when.strftime("%H:%M:%S.%f")[:-3]
    return date, clock if date == day else f"{date}\n{clock}"


def _iso(at: int) -> str | None:
    """An ``at`` in ISO 8601 (UTC, to the microsecond) for JSON; ``None`` when unknown or past
    the dates a `datetime` holds."""
    when = utc_time(at)
    return None if when is None else when.isoformat()


def _lease_text(lease: RunLease | None) -> str:
    if lease is None:
        return "free: no worker holds the run"
    return f"held by {lease.holder} under fence {lease.fence} until {_when(lease.expires_at)}"


def _call_state(call: CallState) -> str:
    if call.outcome is not None:
        return call.outcome + (f" (settled by {call.resolved_by})" if call.resolved_by else "")
    if call.dispatched_seq is None:
        return "not dispatched"
    deadline = f", cut off at {_when(call.deadline / 1_000_000)}" if call.deadline else ""
    return f"dispatched under fence {call.dispatched_fence}{deadline}, no outcome"


def guarantee(tool: Tool | None) -> str:
    """What keeps a call of ``tool`` from taking effect twice by accident, and the one
    condition that depends on (README: "What each kind of tool is promised")."""
    if tool is None:
        return "unknown tool: never called again"
    if tool.retry_safe:
        return "retry-safe: may be called again, harmless by its own definition"
    if tool.reconcile is not None:
        bounded = (
            f", or its effect comes after an await within max_call_s={tool.max_call_s:g}s"
            if tool.max_call_s is not None
            else ""
        )
        return (
            "status-checked: takes effect once if its system refuses calls with an older fence "
            "than it has seen, its status check's included, or deduplicates on the idempotency "
            f"key{bounded}"
        )
    return "plain: never called again; a call nobody can decide waits for a person"


GUARANTEES = (
    "what keeps a call from taking effect twice: a plain tool's call is never made again (one "
    "nobody can decide waits for a person); a status-checked tool's call once its system "
    "refuses calls with an older fence than it has seen (its status check's included) or "
    "deduplicates on the idempotency key; a retry-safe "
    "tool's may be made again, harmlessly"
)
"""`inspect`'s footnote when the agent's tools are not known."""


def _resume_would(
    frontier: Frontier, plan: ResumePlan, tools: Agent | None, lease: RunLease | None
) -> str:
    """What `onward run --resume` would do with the run now, in one sentence."""
    if frontier.finished:
        instead = f"; resume {frontier.continued_to} instead" if frontier.continued_to else ""
        return f"nothing: the run is {frontier.status}{instead}"
    if lease is not None:
        return f"nothing while {lease.holder} holds the run (exit {EXIT_HELD})"
    if (frontier.status == "waiting" and frontier.waiting_on is not None) or not frontier.agent:
        return _answered_how(frontier)
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


def _answered_how(frontier: Frontier) -> str:
    """What a run waiting on a person needs: their answer, given with `onward approve`; for a
    LangGraph thread (no agent: no `RunStarted`), its graph, which reads no answer Onward
    records and which alone carries the thread on, waiting or not."""
    request_id = frontier.waiting_on
    if frontier.agent:
        return f"nothing until a person answers {request_id} (onward approve or onward deny)"
    if frontier.status == "waiting" and request_id is not None:
        return (
            f"nothing: a LangGraph thread waiting on {request_id}; the graph is answered by "
            "resuming it with Command(resume=...), not by onward approve"
        )
    return (
        "nothing: a LangGraph thread between invocations; its graph carries it on "
        "(ainvoke with its thread_id), not onward run --resume"
    )


def tags_text(tags: Sequence[RunTag]) -> str:
    """A run's tags in one line, in the order they were written: ``seq 4 reviewed; ...``."""
    return printable("; ".join(f"seq {tag.seq} {tag.label}" for tag in tags)) or "-"


def summarize(frontier: Frontier) -> Mapping[str, Any]:
    """The facts `inspect` prints about a run."""
    return {
        "run": frontier.run_id,
        "tenant": frontier.tenant,
        "agent": frontier.agent,
        "revision": frontier.revision,
        "status": frontier.status,
        "iteration": frontier.iteration,
        "usage": f"{frontier.input_tokens} in, {frontier.output_tokens} out",
        "fence": frontier.fence,
        "waiting_on": frontier.waiting_on,
        "outstanding": [
            f"{c.call_id} {c.tool} "
            + (c.outcome or ("dispatched" if c.dispatched_seq else "not dispatched"))
            for c in frontier.calls
        ],
    }


def chain_text(chain: Sequence[Frontier], run_id: str) -> str:
    """A chain of continued runs in one line, oldest first, this run in brackets."""
    return printable(
        " -> ".join(
            (f"[{f.run_id}]" if f.run_id == run_id else f.run_id) + f" ({f.status})" for f in chain
        )
    )


def _plan(frontier: Frontier, agent: Agent | None) -> tuple[Agent | None, ResumePlan]:
    """The agent's tools when they are the run's revision, and resume's plan with them."""
    tools = agent if agent is not None and agent.revision == frontier.revision else None
    plan = plan_resume(frontier, tools or Agent(name=frontier.agent or "unknown", instructions=""))
    return tools, plan


def spend_text(spend: Spend | None) -> str:
    """A run's spend as the ledger has it: ``4100 micros (3 calls)``; ``-`` with no ledger."""
    if spend is None:
        return "-"
    return f"{spend.micros} micros ({spend.calls} call{'' if spend.calls == 1 else 's'})"


def run_facts(
    frontier: Frontier,
    *,
    lease: RunLease | None,
    chain: Sequence[Frontier] = (),
    spend: Spend | None = None,
) -> dict[str, Any]:
    """What `inspect --json` prints: the facts of `run_summary`, as data rather than text.

    Times are UTC ISO 8601; run content is given as it is (JSON escapes what a terminal must not
    see).
    """
    tools, plan = _plan(frontier, None)
    return {
        "run": frontier.run_id,
        "tenant": frontier.tenant,
        "agent": frontier.agent,
        "revision": frontier.revision,
        "status": frontier.status,
        "iteration": frontier.iteration,
        "usage": {"input_tokens": frontier.input_tokens, "output_tokens": frontier.output_tokens},
        "spend": None if spend is None else {"micros": spend.micros, "calls": spend.calls},
        "fence": frontier.fence,
        "waiting_on": frontier.waiting_on,
        "lease": None
        if lease is None
        else {"holder": lease.holder, "fence": lease.fence, "expires_at": _when(lease.expires_at)},
        "tags": [
            {"seq": t.seq, "label": t.label, "tagged_seq": t.tagged_seq} for t in frontier.tags
        ],
        "continuation_of": frontier.continuation_of,
        "continued_to": frontier.continued_to,
        "chain": [{"run": f.run_id, "status": f.status} for f in chain],
        "output": frontier.output,
        "error": frontier.error,
        "refused": frontier.refused,
        "last_refusal": frontier.last_refusal,
        "started_at": _iso(frontier.started_at),
        "updated_at": _iso(frontier.updated_at),
        "resume_would": _resume_would(frontier, plan, tools, lease),
        "calls": [
            {
                "call": planned.call.call_id,
                "tool": planned.call.tool,
                "state": _call_state(planned.call),
                "resume_decides": planned.disposition.value,
                "dispatched_again": planned.dispatch_again,
                "why": planned.reason,
            }
            for planned in plan.calls
        ],
    }


def run_summary(
    frontier: Frontier,
    *,
    lease: RunLease | None,
    agent: Agent | None = None,
    chain: Sequence[Frontier] = (),
    spend: Spend | None = None,
) -> Group:
    """What `inspect` and `run --resume` print about a run; one function, so they cannot drift.

    Args:
        frontier: The run folded from the log.
        lease: The unexpired lease on the run, if a worker holds it.
        agent: The agent resume will use, when known: its tools say which undecided calls are
            retry-safe or can be asked about. Without it the plan assumes neither.
        chain: The runs it was carried on from and into, oldest first, itself included.
        spend: What its model calls cost, as the spend ledger has it (the authority: the
            frontier counts tokens only).
    """
    facts = summarize(frontier)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for key in ("run", "tenant", "agent", "revision", "status", "iteration", "usage"):
        grid.add_row(key, shown(facts[key] if facts[key] != "" else "- (none ran)"))
    grid.add_row("spend", shown(spend_text(spend)))
    grid.add_row("fence", shown(facts["fence"]))
    grid.add_row("waiting on", shown(facts["waiting_on"] or "-"))
    grid.add_row("lease", shown(_lease_text(lease)))
    grid.add_row("tags", shown(tags_text(frontier.tags)))
    if frontier.continuation_of is not None:
        grid.add_row("continued from", shown(frontier.continuation_of))
    if frontier.continued_to is not None:
        grid.add_row("continued as", shown(frontier.continued_to))
    if len(chain) > 1:
        grid.add_row("chain", shown(chain_text(chain, frontier.run_id)))
    if frontier.output is not None:
        grid.add_row("output", shown(one_line(frontier.output, 200)))
    if frontier.error is not None:
        grid.add_row("error", shown(frontier.error))
    if frontier.refused:
        grid.add_row(
            "refused", shown(f"{frontier.refused} event(s); last: {frontier.last_refusal}")
        )
    tools, plan = _plan(frontier, agent)
    grid.add_row("resume would", shown(_resume_would(frontier, plan, tools, lease)))
    parts: list[RenderableType] = [grid]
    if agent is not None and agent.toolsets:
        parts.append(
            shown(
                f"the agent given declares toolsets, whose tools are built per run: its revision "
                f"is not compared with the run's ({frontier.revision}) here",
                style="yellow",
            )
        )
    elif agent is not None and tools is None:
        parts.append(
            shown(
                f"the agent given is revision {agent.revision}, the run started with "
                f"{frontier.revision}: resume will refuse it",
                style="yellow",
            )
        )
    if plan.calls:
        parts.extend(_calls(plan, tools))
    return Group(*parts)


def _calls(plan: ResumePlan, tools: Agent | None) -> list[RenderableType]:
    """The table of the turn's calls, what resume decides for each and (tools known) what
    keeps each from taking effect twice; the footnotes when the tools are not known."""
    table = Table(title="calls of the turn in progress", title_justify="left")
    columns = ["call", "tool", "state", "resume decides", "why"]
    for column in [*columns, *(["guarantee"] if tools is not None else [])]:
        table.add_column(column)
    for planned in plan.calls:
        decides = planned.disposition.value + (
            ", dispatched again" if planned.dispatch_again else ""
        )
        cells = [
            shown(planned.call.call_id),
            shown(planned.call.tool),
            shown(_call_state(planned.call)),
            shown(decides),
            shown(planned.reason),
        ]
        if tools is not None:
            cells.append(shown(guarantee(tools.tool(planned.call.tool))))
        table.add_row(*cells)
    parts: list[RenderableType] = [table]
    if tools is None:
        parts.append(
            Text(
                "the agent's tools are unknown here, so no call is taken as retry-safe or "
                "as having a status check; resume with the agent may settle some by itself"
            )
        )
        parts.append(Text(GUARANTEES))
    return parts


def carried(result: RunResult, worker: str, asked: str | None = None) -> Group:
    """What a resume did: the fence it held, its plan, and where the run stands now; first,
    when ``asked`` (the run named) was carried on into the run the result is of, which that
    is: the rest is said of it."""
    lines: list[RenderableType] = []
    if asked is not None and asked != result.run_id:
        lines.append(shown(f"run {asked} went on as {result.run_id}"))
    if result.plan is None:
        waiting = f" on {result.waiting_on}" if result.waiting_on else ""
        lines.append(
            shown(f"nothing to carry on: the run is {result.status}{waiting}; nothing was written")
        )
    else:
        lines.append(shown(f"carried on by {worker} under fence {result.fence}"))
        lines.extend(shown(f"  {line}") for line in result.plan.describe())
        if result.reconciled:
            lines.append(
                shown(f"  settled by the tools' status checks: {', '.join(result.reconciled)}")
            )
    lines.append(outcome(result))
    return Group(*lines)


def result_facts(result: RunResult, *, worker: str) -> dict[str, Any]:
    """What `start --json` and `run --resume --json` print: where the run stands now, and
    what this command did (the fence it held, its plan), as data."""
    return {
        "run": result.run_id,
        "tenant": result.tenant,
        "status": result.status,
        "iteration": result.iteration,
        "waiting_on": result.waiting_on,
        "output": result.output,
        "error": result.error,
        "continued_to": result.continued_to,
        "worker": worker,
        "fence": result.fence,
        "plan": None if result.plan is None else result.plan.describe(),
        "reconciled": list(result.reconciled),
    }


def outcome(result: RunResult) -> Group:
    """Where a run stands after this command drove it: status (with the run it went on as,
    if it was carried on into one another worker holds), and its output or error."""
    status = f"status {result.status}"
    if result.continued_to is not None:
        status += f" as {result.continued_to}"
    status += f", iteration {result.iteration}"
    if result.waiting_on:
        status += f", waiting on {result.waiting_on}"
    lines = [shown(status)]
    if result.output is not None:
        lines.append(shown(f"output: {one_line(result.output, 200)}"))
    if result.error is not None:
        lines.append(shown(f"error: {result.error}"))
    return Group(*lines)


def audit_table(run_id: str, tenant: str, lines: Sequence[AuditLine]) -> Table:
    """The audit timeline as a table: one row per stored record, refused and unreadable ones
    marked."""
    refused = sum(1 for line in lines if line.refused is not None)
    unreadable = sum(1 for line in lines if line.unreadable is not None)
    title = f"run {run_id} ({tenant}): {len(lines) - unreadable} events, {refused} refused"
    if unreadable:
        title += f", {unreadable} unreadable record(s)"
    table = Table(title=shown(title), title_justify="left")
    table.add_column("offset", justify="right")
    table.add_column("seq", justify="right")
    table.add_column("fence", justify="right")
    table.add_column("kind, UTC time", no_wrap=True)
    table.add_column("what", overflow="fold")
    table.add_column("counted", no_wrap=True)
    day: str | None = None
    for line in lines:
        if line.stored is None:
            bad = line.unreadable
            assert bad is not None
            table.add_row(
                str(bad.position.offset),
                str(bad.error.seq) if bad.error.seq is not None else "?",
                "?",
                shown(bad.kind or "?"),
                shown(f"unreadable record: {bad.reason}", style="red"),
                Text("UNREADABLE", style="bold red"),
            )
            continue
        event = line.stored.event
        what = Text(describe_event(event))
        verdict = Text("retained" if line.retained else "yes")
        if line.refused is not None:
            verdict = Text("REFUSED", style="bold red")
            # The guard's detail starts with the run and seq, which the row already shows.
            why = line.refused.detail.removeprefix(f"run {event.run_id!r} seq {event.seq}: ")
            what.append(f"\n{line.refused.reason.value}: {printable(why)}", style="red")
        day, time = event_time(event.at, day=day)
        table.add_row(
            str(line.stored.position.offset),
            str(event.seq),
            str(event.fence),
            Text(kind_of(type(event))).append(f"\n{time}", style="dim"),
            what,
            verdict,
        )
    return table
