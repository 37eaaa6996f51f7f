"""The log of run events: the event model, its codec, the `EventLog` protocol and its backends.

The Kafka and PostgreSQL backends are imported on first use: aiokafka (~170 ms) and asyncpg
(~40 ms) are for a deployment on those servers, not for a process on SQLite or in memory.
"""

from typing import TYPE_CHECKING

from onward._lazy import lazy_exports as _lazy_exports

from .base import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_PARTITIONS,
    EventLog,
    LogRecord,
    PartitionBounds,
    Position,
    Refusal,
    RefusedEvent,
    SequenceGuard,
    StoredEvent,
    UnreadableRecord,
    partition_for,
)
from .codec import decode, encode, headers
from .events import (
    EVENT_FORMAT,
    EVENT_TYPES,
    KINDS,
    AnyEvent,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Asked,
    Carried,
    ChannelValue,
    Event,
    Grant,
    GraphCheckpointed,
    GraphCheckpointRef,
    GraphCheckpointsRemoved,
    GraphThreadDeleted,
    GraphWrite,
    GraphWritesSaved,
    HistoryHandle,
    Message,
    ModelAnswered,
    ResumePlanned,
    RunClaimed,
    RunContinued,
    RunFinished,
    RunStarted,
    Serialized,
    Tagged,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    ToolError,
    ToolResolved,
    TurnSettled,
    Usage,
    kind_of,
)
from .memory import MemoryEventLog
from .sqlite import SqliteEventLog

if TYPE_CHECKING:
    from .kafka import DEFAULT_TOPIC, KafkaEventLog
    from .postgres import PostgresEventLog

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_PARTITIONS",
    "DEFAULT_TOPIC",
    "EVENT_FORMAT",
    "EVENT_TYPES",
    "KINDS",
    "AnyEvent",
    "ApprovalDenied",
    "ApprovalGranted",
    "ApprovalRequested",
    "Asked",
    "Carried",
    "ChannelValue",
    "Event",
    "EventLog",
    "Grant",
    "GraphCheckpointRef",
    "GraphCheckpointed",
    "GraphCheckpointsRemoved",
    "GraphThreadDeleted",
    "GraphWrite",
    "GraphWritesSaved",
    "HistoryHandle",
    "KafkaEventLog",
    "LogRecord",
    "MemoryEventLog",
    "Message",
    "ModelAnswered",
    "PartitionBounds",
    "Position",
    "PostgresEventLog",
    "Refusal",
    "RefusedEvent",
    "ResumePlanned",
    "RunClaimed",
    "RunContinued",
    "RunFinished",
    "RunStarted",
    "SequenceGuard",
    "Serialized",
    "SqliteEventLog",
    "StoredEvent",
    "Tagged",
    "ToolCall",
    "ToolCompleted",
    "ToolDispatched",
    "ToolError",
    "ToolResolved",
    "TurnSettled",
    "UnreadableRecord",
    "Usage",
    "decode",
    "encode",
    "headers",
    "kind_of",
    "partition_for",
]

# The backends on a server load their drivers: imported on first access.
# Hidden from type checkers, which see each lazy name in the TYPE_CHECKING imports above:
# with a module __getattr__ in view they would take a misspelt import for an `object`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_exports(
        __name__,
        {
            "DEFAULT_TOPIC": (".kafka", "DEFAULT_TOPIC"),
            "KafkaEventLog": (".kafka", "KafkaEventLog"),
            "PostgresEventLog": (".postgres", "PostgresEventLog"),
        },
    )
