"""The audit timeline: every stored event of a run in log order, with the verdict readers reach."""

from __future__ import annotations

import pytest
from support.poison import BAD_RECORDS

from onward.errors import NothingToResumeError
from onward.eventlog import (
    MemoryEventLog,
    Message,
    ModelAnswered,
    RunClaimed,
    RunFinished,
    RunStarted,
    ToolCompleted,
    ToolDispatched,
)
from onward.projections.audit import audit_timeline, describe_event
from onward.runtime.blobs import ClaimCheck, MemoryBlobStore, escape_bodies
from onward.testing.eventlog import Envelope


def env(seq: int, fence: int) -> Envelope:
    return Envelope(run_id="run-1", tenant="acme", seq=seq, fence=fence, at=seq)


async def superseded() -> MemoryEventLog:
    """A run taken over by w2 while w1, not knowing, wrote on under the old fence."""
    log = MemoryEventLog()
    for event in [
        RunStarted(**env(1, 1), agent="booker", revision="r1"),
        RunClaimed(**env(2, 2), worker="w2"),
        ToolDispatched(**env(3, 1), call_id="z", tool="book", idempotency_key="k"),
        RunFinished(**env(3, 2), status="completed", output="ok"),
    ]:
        await log.append([event])
    return log


async def test_every_stored_event_is_listed_with_the_refused_one_marked() -> None:
    lines = await audit_timeline(await superseded(), "run-1", tenant="acme")
    verdicts = [(line.stored.event.seq, line.refused is not None) for line in lines if line.stored]
    assert verdicts == [(1, False), (2, False), (3, True), (3, False)]
    refused = lines[2].as_json()
    assert (refused["kind"], refused["reason"]) == ("tool.dispatched", "superseded_fence")
    assert lines[2].stored is not None
    assert describe_event(lines[2].stored.event) == "z book, key k"


@pytest.mark.parametrize(("run_id", "tenant"), [("run-2", "acme"), ("run-1", "other")])
async def test_no_run_for_that_tenant_is_nothing_to_resume(run_id: str, tenant: str) -> None:
    with pytest.raises(NothingToResumeError, match=run_id):
        await audit_timeline(await superseded(), run_id, tenant=tenant)


async def test_a_run_id_used_again_by_another_tenant_shows_each_tenant_its_own_run() -> None:
    """Once compaction cut a collected run, its id is free: another tenant's run under it is
    read with the old one from an archive (`onward replay --archive`). The old run's tenant
    was shown the new run's events, what it was given and what it said; the new run's was
    told there is no such run."""
    log = MemoryEventLog()
    other = Envelope(run_id="run-1", tenant="other", seq=1, fence=1, at=1)
    other_end = Envelope(run_id="run-1", tenant="other", seq=2, fence=1, at=2)
    for event in [
        RunStarted(**env(1, 1), agent="booker", revision="r1", input="ours"),
        RunFinished(**env(2, 1), status="completed", output="ok"),
        RunStarted(**other, agent="booker", revision="r1", input="theirs"),
        RunFinished(**other_end, status="completed", output="secret"),
    ]:
        await log.append([event])
    for tenant in ("acme", "other"):
        lines = await audit_timeline(log, "run-1", tenant=tenant)
        shown = [(line.stored.event.tenant, line.refused is None) for line in lines if line.stored]
        assert shown == [(tenant, True), (tenant, True)]


def test_a_start_names_its_revision_or_that_none_ran() -> None:
    """A start a worker could not drive (`AgentRunner.end_at_start`) records no revision; the
    timeline says so rather than leave a gap where the revision goes."""
    ran = RunStarted(**env(1, 1), agent="booker", revision="r1", input="go")
    never = RunStarted(**env(1, 1), agent="charger", revision="", input="go")
    assert describe_event(ran) == "booker r1, input go"
    assert describe_event(never) == "charger (no revision: never ran), input go"


def test_a_run_carried_on_from_another_names_it_not_an_input() -> None:
    """A run carried on from another is given no input: its conversation starts from the old
    run's transcripts. The timeline said ``input null``, an input the run was never given,
    and not which run it went on from."""
    carried = RunStarted(**env(1, 1), agent="booker", revision="r1", continuation_of="run-0")
    assert describe_event(carried) == "booker r1, carried on from run-0"


@pytest.mark.parametrize("bad", ["newer-format", "unknown-kind", "out-of-range"])
async def test_events_after_an_unreadable_record_that_holds_its_seq_are_not_marked_refused(
    bad: str,
) -> None:
    """A record this code cannot read, that says which seq it holds (one a newer Onward wrote,
    say), takes that seq: the run's events after it are no gap, and the timeline shows them
    counted as every reader that can read the record counts them."""
    log = MemoryEventLog()
    await log.append([RunStarted(**env(1, 1), agent="booker", revision="r1")])
    await log.append([RunClaimed(**env(2, 1), worker="w1")])
    log.write_raw("run-1", BAD_RECORDS[bad]("run-1", 3))
    await log.append([ToolDispatched(**env(4, 1), call_id="z", tool="book", idempotency_key="k")])
    await log.append([RunFinished(**env(5, 1), status="completed", output="ok")])
    lines = await audit_timeline(log, "run-1", tenant="acme")
    assert [line.unreadable is not None for line in lines] == [False, False, True, False, False]
    refused = [line.as_json()["reason"] for line in lines if line.refused is not None]
    assert refused == []


BIG = "x" * 300_000  # over the claim check's threshold


async def test_a_body_out_of_line_is_said_to_be_in_the_blob_store() -> None:
    """`onward replay` shows what a run was given and gave. A body the claim check moved out of
    line was shown as its reference (``completed: {"$blob":"sha256:…``, the digest read as the
    run's output), and a value that only looked like one as the wrapper it is written in
    (``{"$literal": …}``, never the run's). Said to be in the blob store, with its size, and
    shown as given, as `onward` lists a call's arguments."""
    claim_check = ClaimCheck(MemoryBlobStore())
    lookalike = {"$blob": "mine", "size": 3}
    events = [
        RunStarted(**env(1, 1), agent="talker", revision="r1", input=BIG),
        ModelAnswered(**env(2, 1), message=Message(role="assistant", content=BIG)),
        ToolCompleted(**env(3, 1), call_id="c1", result=lookalike),
        RunFinished(**env(4, 1), status="completed", output=BIG),
    ]
    log = MemoryEventLog()
    for event in events:
        await log.append([await claim_check.shrink(escape_bodies(event))])
    lines = await audit_timeline(log, "run-1", tenant="acme")
    said = [describe_event(line.stored.event) for line in lines if line.stored is not None]
    assert not any("sha256" in text or "$literal" in text for text in said), said
    assert said == [
        "talker r1, input (in the blob store, 300002 bytes)",
        "answers (in the blob store, 300053 bytes) (0 in, 0 out)",
        'c1 returned {"$blob":"mine","size":3}',
        "completed: (in the blob store, 300002 bytes)",
    ]


async def test_a_superseded_writer_s_start_after_the_run_ended_stays_refused() -> None:
    """w1 checked the id was free, stalled, and lost its lease; w2 started the run and ended
    it; then w1's start and its first call landed. Every reader refuses them (a seq used
    already, a fence superseded); read from the log alone, with no archive to hold an earlier
    run under the id, the audit showed them counted, as a second run."""
    log = MemoryEventLog()
    for event in [
        RunStarted(**env(1, 2), agent="booker", revision="r1", input="w2"),
        RunFinished(**env(2, 2), status="completed", output="ok"),
        RunStarted(**env(1, 1), agent="booker", revision="r1", input="w1"),
        ToolDispatched(**env(2, 1), call_id="z", tool="book", idempotency_key="k"),
    ]:
        await log.append([event])
    lines = await audit_timeline(log, "run-1", tenant="acme")
    verdicts = [(line.stored.event.seq, line.refused is None) for line in lines if line.stored]
    assert verdicts == [(1, True), (2, True), (1, False), (2, False)]
