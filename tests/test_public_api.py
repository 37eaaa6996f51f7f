"""The exported names are the public API; changing them is a decision, so a test pins them."""

from __future__ import annotations

import onward
import onward.eventlog
import onward.projections
import onward.runtime
import onward.testing
from onward.eventlog import EventLog, KafkaEventLog, MemoryEventLog, SqliteEventLog


def test_onward_exports() -> None:
    assert sorted(onward.__all__) == sorted(
        [
            "EVENT_FORMAT",
            "BackendError",
            "BackendUnavailableError",
            "CheckpointFormatError",
            "ConfigurationError",
            "EventDecodeError",
            "EventLog",
            "FencedError",
            "HistoryUnavailableError",
            "IndeterminateToolCallError",
            "InvalidInputError",
            "KafkaEventLog",
            "LogTruncatedError",
            "MemoryEventLog",
            "NothingToResumeError",
            "OnwardError",
            "PayloadTooLargeError",
            "Position",
            "ProducerFatalError",
            "ResumeConflictError",
            "RevisionMismatchError",
            "SchemaMismatchError",
            "SequenceGuard",
            "SqliteEventLog",
            "StoredEvent",
            "__version__",
        ]
    )
    for name in onward.__all__:
        assert hasattr(onward, name), name


def test_every_exported_name_exists() -> None:
    for module in (onward.eventlog, onward.projections, onward.runtime, onward.testing):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_backends_satisfy_the_protocol() -> None:
    assert isinstance(MemoryEventLog(), EventLog)
    assert isinstance(SqliteEventLog("unused.db"), EventLog)
    assert isinstance(KafkaEventLog("127.0.0.1:9092"), EventLog)


def test_projections_exports() -> None:
    assert sorted(onward.projections.__all__) == sorted(
        [
            "DEFAULT_MAX_BYTES",
            "BuildSwitched",
            "CallState",
            "Frontier",
            "FrontierProjection",
            "FrontierStore",
            "KafkaProjector",
            "LogProjector",
            "MemoryFrontierStore",
            "PostgresFrontierStore",
            "Projection",
            "ProjectionSink",
            "ProjectorStats",
            "RebuildReport",
            "RunSummary",
            "Snapshot",
            "SqlProjectionSink",
            "SqliteFrontierStore",
            "StoredFrontier",
            "ToolCallRow",
            "fold",
            "fold_all",
            "fold_run",
            "migrate",
            "rebuild",
            "rebuild_frontiers",
            "rebuild_projection",
        ]
    )


def test_stores_satisfy_the_protocol() -> None:
    assert isinstance(onward.projections.MemoryFrontierStore(), onward.projections.FrontierStore)
    assert isinstance(
        onward.projections.SqliteFrontierStore("unused.db"), onward.projections.FrontierStore
    )
    assert isinstance(
        onward.projections.PostgresFrontierStore("postgresql://x@127.0.0.1/x"),
        onward.projections.FrontierStore,
    )


def test_runtime_exports() -> None:
    assert sorted(onward.runtime.__all__) == sorted(
        [
            "Agent",
            "AgentRunner",
            "BlobStore",
            "CarriedRun",
            "CheckpointPolicy",
            "Checkpointer",
            "ClaimCheck",
            "ExecutionManager",
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
            "idempotency_key",
            "plan_resume",
            "refuse_if_undecidable",
            "reply",
            "tool",
        ]
    )


def test_testing_exports() -> None:
    assert sorted(onward.testing.__all__) == [
        "EventLogConformance",
        "FrontierStoreConformance",
        "LeaseStoreConformance",
        "PersistentEventLogConformance",
    ]
