"""The path applications have imported fleet requests from (``onward.runtime.requests``); they
live in `onward.runtime.fleet.requests` with the rest of the fleet."""

from .fleet.requests import (
    DEFAULT_REQUESTS_TOPIC,
    REQUESTS_RETENTION_MS,
    AnswerRequest,
    CancelRun,
    Request,
    Requests,
    ResumeRun,
    StartRun,
    TagRun,
    check_request,
    decode_request,
    encode_request,
    ensure_requests_topic,
)

__all__ = [
    "DEFAULT_REQUESTS_TOPIC",
    "REQUESTS_RETENTION_MS",
    "AnswerRequest",
    "CancelRun",
    "Request",
    "Requests",
    "ResumeRun",
    "StartRun",
    "TagRun",
    "check_request",
    "decode_request",
    "encode_request",
    "ensure_requests_topic",
]
