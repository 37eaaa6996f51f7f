"""The module-level application API: `onward.open`, `onward.query`, `onward.resume`, ...

They act on the app opened last (`current_app`); `query_sync` and `resume_sync` open one of
their own for the length of the call, for scripts without an event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from onward.errors import InvalidInputError
from onward.runtime.agent import Agent
from onward.runtime.options import Options
from onward.runtime.providers import Provider
from onward.runtime.settings import Settings

from .app import App, SessionState, current_app
from .messages import RunMessage
from .stream import RunStream


def open_app(
    settings: Settings | None = None,
    *,
    agents: Agent | Sequence[Agent] | Mapping[str, Agent] | None = None,
    provider: Provider | None = None,
    **options: Any,
) -> App:
    """``async with onward.open(settings, agents=..., provider=...) as app``: see `App`.

    While open, it is also the app the module-level `query`, `resume` and `get_session_state`
    use (the one opened last).
    """
    return App(settings, agents=agents, provider=provider, **options)


def query(
    prompt: Any,
    options: Options | Mapping[str, Any] | None = None,
    *,
    follow_waits: bool = True,
    timeout: float | None = None,
) -> RunStream:
    """`App.query` on the open app."""
    return current_app().query(prompt, options, follow_waits=follow_waits, timeout=timeout)


def resume(run_id: str, resume_value: Any = None, **options: Any) -> RunStream:
    """`App.resume` on the open app."""
    return current_app().resume(run_id, resume_value, **options)


async def get_session_state(run_id: str, *, tenant: str | None = None) -> SessionState | None:
    """`App.get_session_state` on the open app."""
    return await current_app().get_session_state(run_id, tenant=tenant)


def resume_sync(
    run_id: str,
    resume_value: Any = None,
    *,
    settings: Settings | None = None,
    agents: Agent | Sequence[Agent] | Mapping[str, Agent] | None = None,
    provider: Provider | None = None,
    **options: Any,
) -> RunMessage | None:
    """For scripts: resume a run (answering it with ``resume_value``) and return its last
    message once it ends or waits on a person again; ``None`` if nothing new came.

    Opens its own app (from ``settings``, or the environment) and closes it before returning.
    ``options``: as for `App.resume` (``follow_waits`` is False unless given).

    Raises:
        InvalidInputError: Called inside a running event loop (use `resume` there).
    """

    options.setdefault("follow_waits", False)

    async def work(app: App) -> list[RunMessage]:
        return await app.resume(run_id, resume_value, **options).collect()

    return _sync(work, settings, agents, provider)


def query_sync(
    prompt: Any,
    options: Options | Mapping[str, Any] | None = None,
    *,
    settings: Settings | None = None,
    agents: Agent | Sequence[Agent] | Mapping[str, Agent] | None = None,
    provider: Provider | None = None,
    timeout: float | None = None,
) -> RunMessage | None:
    """For scripts: start a run and return its last message once it ends, waits on a person
    or needs one to settle a call (a ``needs_person`` message). Opens its own app and closes
    it before returning (see `resume_sync`).

    Raises:
        RunTimeoutError: Nothing new for ``timeout`` seconds.
    """

    async def work(app: App) -> list[RunMessage]:
        return await app.query(prompt, options, follow_waits=False, timeout=timeout).collect()

    return _sync(work, settings, agents, provider)


def _sync(
    work: Callable[[App], Awaitable[list[RunMessage]]],
    settings: Settings | None,
    agents: Agent | Sequence[Agent] | Mapping[str, Agent] | None,
    provider: Provider | None,
) -> RunMessage | None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop running here: this call may start one
    else:
        raise InvalidInputError("called inside an event loop: use `async for` with query/resume")

    async def main() -> list[RunMessage]:
        async with App(settings, agents=agents, provider=provider) as app:
            return await work(app)

    messages = asyncio.run(main())
    return messages[-1] if messages else None


__all__ = [
    "current_app",
    "get_session_state",
    "open_app",
    "query",
    "query_sync",
    "resume",
    "resume_sync",
]
