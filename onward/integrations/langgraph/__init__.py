"""LangGraph's checkpointer on Onward's log: a thread is a run, one writer per thread; and
a tool middleware that gives LangGraph tools Onward's write-ahead dispatch.

Needs the ``langgraph`` and ``langchain`` packages: ``pip install 'onward[langgraph]'``.

    async with SqliteEventLog(path) as log, SqliteLeaseStore(path) as leases:
        async with OnwardSaver(log, leases, tenant="acme") as saver:
            graph = builder.compile(checkpointer=saver)
            await graph.ainvoke(state, {"configurable": {"thread_id": "t-1"}})
"""

from __future__ import annotations

try:
    import langgraph.checkpoint.base as _base  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "onward.integrations.langgraph needs the langgraph package: pip install 'onward[langgraph]'"
    ) from exc

from .saver import OnwardSaver
from .summary import (
    MemoryThreadSummaries,
    PostgresThreadSummaries,
    SqliteThreadSummaries,
    ThreadSummaryStore,
)
from .thread import StoredWrite, ThreadState
from .tools import (
    OnwardToolMiddleware,
    current_fence,
    current_idempotency_key,
    current_lease_expires_at,
)

__all__ = [
    "MemoryThreadSummaries",
    "OnwardSaver",
    "OnwardToolMiddleware",
    "PostgresThreadSummaries",
    "SqliteThreadSummaries",
    "StoredWrite",
    "ThreadState",
    "ThreadSummaryStore",
    "current_fence",
    "current_idempotency_key",
    "current_lease_expires_at",
]
