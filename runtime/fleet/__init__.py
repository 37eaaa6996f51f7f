"""The fleet: `onward worker` processes, the requests an application sends them, and how a
worker carries lapsed runs on.

``worker`` owns a worker's tasks, slots and consumer; ``recovery`` finds runs whose lease
lapsed and carries them on; ``requests_handling`` acts on one request; ``requests`` is the
wire format of the requests and the producer that sends them to the topic;
``requests_postgres`` is the table a deployment on PostgreSQL alone sends them through;
``member`` is what recovery and request handling see of a worker.
"""

from .member import FleetMember, WorkerStats
from .requests import (
    DEFAULT_REQUESTS_TOPIC,
    AnswerRequest,
    CancelRun,
    Request,
    Requests,
    RequestSender,
    ResumeRun,
    StartRun,
    TagRun,
)
from .requests_postgres import PostgresRequests
from .worker import DEFAULT_GROUP, Worker

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_REQUESTS_TOPIC",
    "AnswerRequest",
    "CancelRun",
    "FleetMember",
    "PostgresRequests",
    "Request",
    "RequestSender",
    "Requests",
    "ResumeRun",
    "StartRun",
    "TagRun",
    "Worker",
    "WorkerStats",
]
