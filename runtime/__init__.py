"""The runner, resume planning, leases, garbage collection, redaction, providers, tools, the CLI."""

from typing import TYPE_CHECKING

from onward._lazy import functions_over_submodules as _functions_over_submodules
from onward._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from .agent import Agent
    from .ask import ask
    from .blobs import BlobStore, ClaimCheck, MemoryBlobStore, PostgresBlobStore, SqliteBlobStore
    from .checkpoint import Checkpointer, CheckpointPolicy
    from .continuation import DEFAULT_CONTINUATION, Continuation, ContinuationPolicy, continued
    from .gc import GarbageCollector, GcReport
    from .leases import (
        Leaseholder,
        LeasePolicy,
        LeaseStore,
        MemoryLeaseStore,
        PostgresLeaseStore,
        RedisLeaseStore,
        RunLease,
        SqliteLeaseStore,
    )
    from .manager import ExecutionManager, RunOverview
    from .openai import OpenAICompatibleProvider
    from .planning import (
        PlannedCall,
        ResumePlan,
        ToolDisposition,
        plan_resume,
        refuse_if_undecidable,
    )
    from .providers import ModelReply, Provider, ScriptedProvider, reply
    from .redaction import Redactor
    from .resumer import CarriedRun, Resumer
    from .runner import AgentRunner, RunObserver, RunResult
    from .tools import Reconciled, Tool, idempotency_key, tool

_LAZY: dict[str, str] = {
    **dict.fromkeys(("Agent",), ".agent"),
    **dict.fromkeys(("ask",), ".ask"),
    **dict.fromkeys(
        ("BlobStore", "ClaimCheck", "MemoryBlobStore", "PostgresBlobStore", "SqliteBlobStore"),
        ".blobs",
    ),
    **dict.fromkeys(("Checkpointer", "CheckpointPolicy"), ".checkpoint"),
    **dict.fromkeys(
        ("DEFAULT_CONTINUATION", "Continuation", "ContinuationPolicy", "continued"), ".continuation"
    ),
    **dict.fromkeys(("GarbageCollector", "GcReport"), ".gc"),
    **dict.fromkeys(
        (
            "Leaseholder",
            "LeasePolicy",
            "LeaseStore",
            "MemoryLeaseStore",
            "PostgresLeaseStore",
            "RedisLeaseStore",
            "RunLease",
            "SqliteLeaseStore",
        ),
        ".leases",
    ),
    **dict.fromkeys(("ExecutionManager", "RunOverview"), ".manager"),
    **dict.fromkeys(("OpenAICompatibleProvider",), ".openai"),
    **dict.fromkeys(
        ("PlannedCall", "ResumePlan", "ToolDisposition", "plan_resume", "refuse_if_undecidable"),
        ".planning",
    ),
    **dict.fromkeys(("ModelReply", "Provider", "ScriptedProvider", "reply"), ".providers"),
    **dict.fromkeys(("Redactor",), ".redaction"),
    **dict.fromkeys(("CarriedRun", "Resumer"), ".resumer"),
    **dict.fromkeys(("AgentRunner", "RunObserver", "RunResult"), ".runner"),
    **dict.fromkeys(("Reconciled", "Tool", "idempotency_key", "tool"), ".tools"),
}
"""Exported name -> the submodule it comes from, imported on first use: a process that needs one
part of the runtime (the projector's settings and metrics) does not load the runner, the
providers' HTTP client and every store."""

__all__ = [
    "DEFAULT_CONTINUATION",
    "Agent",
    "AgentRunner",
    "BlobStore",
    "CarriedRun",
    "CheckpointPolicy",
    "Checkpointer",
    "ClaimCheck",
    "Continuation",
    "ContinuationPolicy",
    "ExecutionManager",
    "GarbageCollector",
    "GcReport",
    "LeasePolicy",
    "LeaseStore",
    "Leaseholder",
    "MemoryBlobStore",
    "MemoryLeaseStore",
    "ModelReply",
    "OpenAICompatibleProvider",
    "PlannedCall",
    "PostgresBlobStore",
    "PostgresLeaseStore",
    "Provider",
    "Reconciled",
    "Redactor",
    "RedisLeaseStore",
    "ResumePlan",
    "Resumer",
    "RunLease",
    "RunObserver",
    "RunOverview",
    "RunResult",
    "ScriptedProvider",
    "SqliteBlobStore",
    "SqliteLeaseStore",
    "Tool",
    "ToolDisposition",
    "ask",
    "continued",
    "idempotency_key",
    "plan_resume",
    "refuse_if_undecidable",
    "reply",
    "tool",
]


# Hidden from type checkers, which see each lazy name in the TYPE_CHECKING imports above:
# with a module __getattr__ in view they would take a misspelt import for an `object`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_exports(__name__, {name: (m, name) for name, m in _LAZY.items()})


# `ask` is exported lazily (it loads pydantic's JSON Schema) and is also its submodule's name.
_functions_over_submodules(__name__, "ask")
