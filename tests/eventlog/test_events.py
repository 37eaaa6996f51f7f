"""The event model and its codec: stable tags, exact round trips, errors that name the place."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

import msgspec
import pytest

from onward.errors import CheckpointFormatError, EventDecodeError, InvalidInputError
from onward.eventlog import codec
from onward.eventlog.events import (
    EVENT_FORMAT,
    EVENT_TYPES,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    ChannelValue,
    Event,
    GraphCheckpointed,
    GraphCheckpointRef,
    GraphCheckpointsRemoved,
    GraphThreadDeleted,
    GraphWrite,
    GraphWritesSaved,
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
from onward.eventlog.schema import event_schema
from onward.testing.eventlog import Envelope

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "events.schema.json"
ENV = Envelope(run_id="run-1", tenant="acme", seq=1, fence=2, at=1_700_000_000_000_000)

ONE_OF_EACH: list[Event] = [
    RunStarted(**ENV, agent="booker", revision="r1", input="book", continuation_of="run-0"),
    RunClaimed(**ENV, worker="w-1"),
    ResumePlanned(**ENV, replayed=["c1"], dispatched=["c2"], undecided=["c3"], reason="r"),
    ModelAnswered(
        **ENV,
        message=Message(role="assistant", content=[{"type": "text", "text": "hi"}]),
        tool_calls=[ToolCall(call_id="c1", tool="book", args={"seat": "3A"}, idempotency_key="k")],
        usage=Usage(input_tokens=10, output_tokens=5),
    ),
    ToolDispatched(**ENV, call_id="c1", tool="book", idempotency_key="k"),
    ToolCompleted(**ENV, call_id="c1", error=ToolError(type="Timeout", message="slow")),
    ToolResolved(**ENV, call_id="c1", outcome="completed", result=1, by="ops@x", why="checked"),
    TurnSettled(**ENV, iteration=3, call_ids=["c1"]),
    ApprovalRequested(**ENV, request_id="a1", prompt="pay?", details={"amount": 3}),
    ApprovalGranted(**ENV, request_id="a1", by="ann", value=True),
    ApprovalDenied(**ENV, request_id="a1", by="bob", value="no"),
    Tagged(**ENV, target_seq=1, label="important"),
    RunContinued(**ENV, new_run_id="run-2"),
    RunFinished(**ENV, status="completed", output={"ok": True}),
    GraphCheckpointed(
        **ENV,
        checkpoint_ns="",
        checkpoint_id="cp-2",
        parent_checkpoint_id="cp-1",
        checkpoint=Serialized(type="msgpack", data=b"\x81\xa1v\x01"),
        metadata=Serialized(type="msgpack", data=b"\x80"),
        values=[ChannelValue(channel="a", version="1", value=None)],
    ),
    GraphWritesSaved(
        **ENV,
        checkpoint_id="cp-2",
        task_id="t1",
        task_path="~",
        writes=[GraphWrite(channel="a", idx=0, value=Serialized(type="null"))],
    ),
    GraphThreadDeleted(**ENV),
    GraphCheckpointsRemoved(
        **ENV,
        checkpoints=[GraphCheckpointRef(checkpoint_ns="child:1", checkpoint_id="cp-1")],
        why="pruned",
    ),
]


def test_tags_are_stable() -> None:
    assert {t.__name__: kind_of(t) for t in EVENT_TYPES} == {
        "RunStarted": "run.started",
        "RunClaimed": "run.claimed",
        "ResumePlanned": "resume.planned",
        "ModelAnswered": "model.answered",
        "ToolDispatched": "tool.dispatched",
        "ToolCompleted": "tool.completed",
        "ToolResolved": "tool.resolved",
        "TurnSettled": "turn.settled",
        "ApprovalRequested": "approval.requested",
        "ApprovalGranted": "approval.granted",
        "ApprovalDenied": "approval.denied",
        "Tagged": "tagged",
        "RunContinued": "run.continued",
        "RunFinished": "run.finished",
        "GraphCheckpointed": "graph.checkpointed",
        "GraphWritesSaved": "graph.writes",
        "GraphThreadDeleted": "graph.thread_deleted",
        "GraphCheckpointsRemoved": "graph.checkpoints_removed",
    }


def test_one_of_each_covers_every_kind() -> None:
    assert {type(e) for e in ONE_OF_EACH} == set(EVENT_TYPES)


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: type(e).__name__)
def test_every_kind_round_trips_exactly(event: Event) -> None:
    record = codec.encode(event)
    assert msgspec.json.decode(record)["kind"] == kind_of(type(event))
    assert codec.decode(record) == event


def test_events_are_frozen() -> None:
    event = RunClaimed(**ENV, worker="w")
    with pytest.raises(AttributeError):
        event.seq = 5  # type: ignore[misc]


def test_binary_parts_survive_the_round_trip() -> None:
    event = ToolCompleted(**ENV, call_id="c", result=b"\x00\xffpng")
    decoded = codec.decode(codec.encode(event))
    assert isinstance(decoded, ToolCompleted)
    assert msgspec.convert(decoded.result, bytes) == b"\x00\xffpng"


def test_headers_name_run_kind_fence_and_format() -> None:
    assert dict(codec.headers(RunClaimed(**ENV, worker="w"))) == {
        "onward.run_id": b"run-1",
        "onward.kind": b"run.claimed",
        "onward.fence": b"2",
        "onward.format": str(EVENT_FORMAT).encode(),
    }


def test_the_bare_envelope_is_not_an_event_to_write() -> None:
    with pytest.raises(InvalidInputError, match="known kind"):
        codec.encode(Event(**ENV))


def test_a_newer_format_is_refused_even_when_its_shape_changed() -> None:
    record = msgspec.json.encode({"kind": "run.teleported", "run_id": "r", "seq": 4, "format": 9})
    with pytest.raises(CheckpointFormatError, match="format 9 is newer") as caught:
        codec.decode(record)
    assert (caught.value.run_id, caught.value.seq) == ("r", 4)


def test_a_missing_field_is_named() -> None:
    record = msgspec.json.encode({"kind": "tool.dispatched", **ENV, "tool": "t"})
    with pytest.raises(EventDecodeError, match="call_id") as caught:
        codec.decode(record)
    assert (caught.value.run_id, caught.value.seq) == ("run-1", 1)


def test_a_dispatch_written_before_retry_safe_was_recorded_reads_as_not_saying() -> None:
    record = msgspec.json.encode(
        {"kind": "tool.dispatched", **ENV, "call_id": "c1", "tool": "t", "idempotency_key": "k"}
    )
    decoded = codec.decode(record)
    assert isinstance(decoded, ToolDispatched)
    assert decoded.retry_safe is None


def test_garbage_names_the_run_it_was_filed_under() -> None:
    with pytest.raises(EventDecodeError, match="run-7") as caught:
        codec.decode(b"\xff\xfe not json", run_hint="run-7")
    assert caught.value.run_id == "run-7"


def test_committed_schema_matches_the_code() -> None:
    assert SCHEMA_FILE.read_bytes() == event_schema(), (
        "schemas/events.schema.json is stale; regenerate it with "
        "`onward schema -o schemas/events.schema.json`"
    )


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _fixture_records() -> list[bytes]:
    """Every event record the shared fixtures hold, as written."""
    return [
        line.encode()
        for path in sorted(FIXTURES.glob("*/*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _readable(record: bytes) -> bool:
    try:
        codec.decode(record)
    except (EventDecodeError, CheckpointFormatError):
        return False
    return True


def test_decode_many_gives_what_decode_gives_for_every_kind_and_fixture() -> None:
    records = [codec.encode(e) for e in ONE_OF_EACH]
    records += [r for r in _fixture_records() if _readable(r)]
    decoded = codec.decode_many(records)
    assert decoded == [codec.decode(r) for r in records]
    assert [type(e) for e in decoded] == [type(codec.decode(r)) for r in records]
    assert len({type(e) for e in decoded}) == len(EVENT_TYPES)


def test_decode_many_refuses_every_unreadable_fixture_record_as_decode_does() -> None:
    unreadable = [r for r in _fixture_records() if not _readable(r)]
    assert unreadable  # the fixtures hold a record of a newer format
    for record in unreadable:
        assert _raised(partial(codec.decode_many, [record])) == _raised(
            partial(codec.decode, record)
        )


def _raised(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    with pytest.raises((EventDecodeError, CheckpointFormatError)) as caught:
        call()
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "bad",
    [
        b"\xff\xfe not json",
        None,
        msgspec.json.encode({"kind": "tool.dispatched", **ENV, "tool": "t"}),
        msgspec.json.encode({"kind": "run.teleported", "run_id": "r", "seq": 4, "format": 9}),
        codec.encode(RunClaimed(**ENV, worker="w")).replace(b'"format":1', b'"format":2'),
        codec.encode(RunClaimed(**ENV, worker="w")).replace(b'"w"', b'"w\\u0000"'),
        codec.encode(RunClaimed(**ENV, worker="w")).replace(
            b'"seq":1', b'"seq":9223372036854775808'
        ),
    ],
    ids=[
        "garbage",
        "tombstone",
        "missing field",
        "newer kind",
        "newer format",
        "NUL in a name",
        "seq past 64 bits",
    ],
)
def test_decode_many_refuses_a_bad_record_as_decode_does(bad: bytes | None) -> None:
    good = codec.encode(RunClaimed(**ENV, worker="w"))
    assert _raised(lambda: codec.decode_many([good, bad, good])) == _raised(
        lambda: codec.decode(bad)
    )


def test_decode_many_keeps_a_nul_in_a_free_form_value_and_reads_views() -> None:
    event = ToolCompleted(**ENV, call_id="c1", result="a\x00b")
    record = codec.encode(event)
    assert codec.decode_many([record, memoryview(record)]) == [event, event]


def _forged(event: Event, field: bytes, value: int) -> bytes:
    record = codec.encode(event)
    start = record.index(b'"' + field + b'":') + len(field) + 3
    end = start
    while record[end : end + 1].isdigit():
        end += 1
    return record[:start] + str(value).encode() + record[end:]


_ANSWER = ModelAnswered(**ENV, message=Message(role="assistant"), usage=Usage(input_tokens=7))


@pytest.mark.parametrize(
    ("event", "field", "value", "path"),
    [
        (RunClaimed(**ENV, worker="w"), b"fence", 2**63, "$.fence"),
        (RunClaimed(**ENV, worker="w"), b"at", 2**64, "$.at"),
        (TurnSettled(**ENV, iteration=3), b"iteration", 2**31, "$.iteration"),
        (TurnSettled(**ENV, iteration=3), b"iteration", -1, "$.iteration"),
        (_ANSWER, b"input_tokens", 2**40 + 1, "$.usage.input_tokens"),
        (Tagged(**ENV, target_seq=1, label="x"), b"target_seq", 2**63, "$.target_seq"),
    ],
    ids=["fence", "at", "iteration", "negative iteration", "tokens", "target_seq"],
)
def test_an_integer_no_store_keeps_makes_the_record_unreadable_and_is_never_written(
    event: Event, field: bytes, value: int, path: str
) -> None:
    """A forged or damaged record whose integer no store column holds is unreadable, naming
    the field (so the projector sets its run aside instead of failing the batch it is in), and
    the codec refuses to write such an event at all."""
    record = _forged(event, field, value)
    with pytest.raises(EventDecodeError, match=re.escape(path)):
        codec.decode(record)
    assert _raised(partial(codec.decode_many, [record])) == _raised(partial(codec.decode, record))
    if field == b"input_tokens":
        forged = msgspec.structs.replace(event, usage=Usage(input_tokens=value))
    else:
        forged = msgspec.structs.replace(event, **{field.decode(): value})
    with pytest.raises(InvalidInputError, match=r"cannot be written: .*" + re.escape(path)):
        codec.encode(forged)


def test_a_graph_writes_special_negative_index_reads_back() -> None:
    """LangGraph marks special writes (errors, interrupts) with negative indexes."""
    saved = GraphWritesSaved(
        **ENV,
        checkpoint_ns="",
        checkpoint_id="c1",
        task_id="t1",
        writes=[GraphWrite(channel="__error__", idx=-1, value=Serialized(type="json", data=b"1"))],
    )
    assert codec.decode(codec.encode(saved)) == saved
