"""The fleet: `onward worker` processes, the requests an application sends them, and how a
worker carries lapsed runs on.

``worker`` owns a worker's tasks, slots and consumer; ``recovery`` finds runs whose lease
lapsed and carries them on; ``requests_handling`` acts on one request; ``requests`` is the
wire format of the requests topic and the producer that sends them; ``member`` is what
recovery and request handling see of a worker.
"""

from .member import FleetMember, WorkerStats
from .requests import (
    DEFAULT_REQUESTS_TOPIC,
    AnswerRequest,
    CancelRun,
    Request,
    Requests,
    ResumeRun,
    StartRun,
    TagRun,
)
from .worker import DEFAULT_GROUP, Worker

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_REQUESTS_TOPIC",
    "AnswerRequest",
    "CancelRun",
    "FleetMember",
    "Request",
    "Requests",
    "ResumeRun",
    "StartRun",
    "TagRun",
    "Worker",
    "WorkerStats",
]
