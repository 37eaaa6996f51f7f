"""`frontier_main` and `resume_main`: ``inspect`` and ``run --resume`` for a product's own stores.

A product that embeds Onward wires its own stores into an `AgentRunner` (its log, frontier
store, lease store, blobs), often not the ones ``ONWARD_*`` variables would name; its on-call
engineer still wants to see where a run stands and carry it on from a terminal. These two
callables are those commands, on the runner the product gives them, for the product to expose
under its own command name::

    def inspect_command() -> None:            # $ mytool inspect run_1 --tenant acme
        sys.exit(frontier_main(sys.argv[1:], runner=opened_runner, prog="mytool inspect"))

Each takes the command line (without the program name) and returns the exit code a script
reads, the same as ``onward``'s: 0 shown or carried on, 1 no run under that id, 2 a command line
it could not read, 3 another worker holds the run, 4 it must not be carried on (an undecided
call, an evicted transcript, another revision, a record or frontier row of a newer format), 5 a
store, the model or the agent's code failed. Errors are one line on standard error.

``runner`` is an `AgentRunner` whose stores need no opening, or (the usual case: stores hold
connections, which belong to the event loop the command runs) a zero-argument callable returning
an async context manager that opens the stores and yields the runner on them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Annotated, TypeVar

import typer

from onward.runtime.agent import Agent
from onward.runtime.runner import AgentRunner

from ._common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    JsonResultOption,
    RunArgument,
    boundary,
    echo_json,
    error,
    help_paragraphs,
    out,
    run_until_terminated,
)
from .runs import chain_of, readable_run, shown_run
from .summary import carried, result_facts, run_facts, run_summary

_T = TypeVar("_T")

RunnerSource = AgentRunner | Callable[[], AbstractAsyncContextManager[AgentRunner]]
"""A runner on the product's stores, or how to open them and get one (see the module)."""

TenantOption = Annotated[str, typer.Option("--tenant", "-t", help="The tenant that owns the run.")]


def frontier_main(argv: Sequence[str], *, runner: RunnerSource, prog: str = "inspect") -> int:
    """``RUN --tenant TENANT [--json]``: show where a run stands and what resume would do,
    from ``runner``'s stores. Takes no lease and writes nothing.

    Returns:
        The exit code: 0 shown; 1 no such run; 2 a bad command line; 4 the run or its
        frontier row cannot be read (a newer format), or the output it ended with cannot (the
        rest of it is shown); 5 a store failed.
    """

    def inspect(
        run_id: RunArgument, tenant: TenantOption, as_json: JsonResultOption = False
    ) -> None:
        """Show where a run stands and what resume would do. Takes no lease, writes nothing."""

        async def work(on: AgentRunner) -> None:
            frontier, lost = await readable_run(on, run_id, tenant)
            lease = await on.leases.current(run_id)
            chain = await chain_of(on, frontier)
            spend = None if on.spend is None else await on.spend.run_total(run_id)
            if as_json:
                facts = run_facts(frontier, lease=lease, chain=chain, spend=spend)
                echo_json(facts)
            else:
                out.print(run_summary(frontier, lease=lease, chain=chain, spend=spend))
            if lost is not None:
                raise lost

        _on_runner(runner, work)

    return _main(inspect, argv, prog)


def resume_main(
    argv: Sequence[str], *, runner: RunnerSource, agent: Agent, prog: str = "run --resume"
) -> int:
    """``RUN --tenant TENANT [--json]``: print the run's summary (the one `frontier_main`
    prints), then carry it on with ``agent``: take its lease, read it once under the lease,
    plan, drive it, and report the fence it held and where the run stands now.

    Returns:
        The exit code: 0 carried on, or nothing to do; 1 no such run; 2 a bad command line;
        3 another worker holds it; 4 it must not be carried on; 5 a store, the model or the
        agent's code failed.
    """

    def resume(
        run_id: RunArgument, tenant: TenantOption, as_json: JsonResultOption = False
    ) -> None:
        """Carry a run on under its lease, saying first where it stands."""

        async def work(on: AgentRunner) -> None:
            if not as_json:
                frontier = await shown_run(on, run_id, tenant)
                lease = await on.leases.current(run_id)
                chain = await chain_of(on, frontier)
                spend = None if on.spend is None else await on.spend.run_total(run_id)
                out.print(run_summary(frontier, lease=lease, agent=agent, chain=chain, spend=spend))
            result = await on.resume(agent, run_id, tenant=tenant)
            if as_json:
                echo_json(result_facts(result, worker=on.worker))
            else:
                out.print(carried(result, on.worker, run_id))

        _on_runner(runner, work)

    return _main(resume, argv, prog)


def _on_runner(source: RunnerSource, work: Callable[[AgentRunner], Awaitable[_T]]) -> _T:
    """Run ``work`` on the runner ``source`` gives, in an event loop of its own."""

    async def on_runner() -> _T:
        if isinstance(source, AgentRunner):
            return await work(source)
        async with source() as runner:
            return await work(runner)

    return run_until_terminated(on_runner())


def _main(command: Callable[..., None], argv: Sequence[str], prog: str) -> int:
    """Parse ``argv`` for ``command`` and run it inside the command boundary every ``onward``
    command runs in; the exit code, never `SystemExit`."""
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    paragraphs = help_paragraphs(command.__doc__)
    single.command(help="\n\n".join(paragraphs) or None)(boundary(command, name=prog))
    try:
        # Not standalone: the parser returns an `Exit`'s code rather than leaving the process.
        code = typer.main.get_command(single).main(
            args=list(argv), prog_name=prog, standalone_mode=False
        )
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return EXIT_INTERRUPTED
    except typer.TyperException as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        error(f"{message.rstrip('.')}; see {prog} --help")
        return int(getattr(exc, "exit_code", EXIT_USAGE))
    return code if isinstance(code, int) else EXIT_OK


__all__ = ["RunnerSource", "frontier_main", "resume_main"]
