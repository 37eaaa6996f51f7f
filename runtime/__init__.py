"""The runner, resume planning, leases, garbage collection, redaction, providers, tools, the CLI."""

from .agent import Agent
from .ask import ask
from .blobs import (
    BlobStore,
    ClaimCheck,
    MemoryBlobStore,
    PostgresBlobStore,
    SqliteBlobStore,
)
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
