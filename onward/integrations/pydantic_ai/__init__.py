"""pydantic-ai's durable execution on Onward: `OnwardDurability`, a capability for any agent.

Needs the ``pydantic-ai-slim`` package: ``pip install 'onward[pydantic-ai]'``.

    durability = OnwardDurability(log=log, tenant="acme")
    agent = Agent(model, name="booker", tools=[book], capabilities=[durability],
                  output_type=[str, DeferredToolRequests])
    result = await durability.run(agent, "book seat 3A", run_id="r-1")
"""

from __future__ import annotations

try:
    import pydantic_ai.durable_exec as _durable_exec  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "onward.integrations.pydantic_ai needs pydantic-ai: pip install 'onward[pydantic-ai]'"
    ) from exc

from .capability import OnwardDurability
from .driver import DurableRunResult, Pending
from .journal import (
    RecordedToolError,
    current_fence,
    current_idempotency_key,
    current_lease_expires_at,
)
from .waiter import OnwardWaiter

__all__ = [
    "DurableRunResult",
    "OnwardDurability",
    "OnwardWaiter",
    "Pending",
    "RecordedToolError",
    "current_fence",
    "current_idempotency_key",
    "current_lease_expires_at",
]
