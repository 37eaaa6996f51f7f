"""Call ids a model repeats: each call is made once, under an id and a key of its own."""

from __future__ import annotations

from onward.eventlog import MemoryEventLog, ToolCall
from onward.eventlog.events import ModelAnswered, ToolCompleted, ToolDispatched
from onward.runtime import Agent, AgentRunner, ScriptedProvider, reply, tool
from onward.runtime.limits import MAX_NAME_LENGTH, check_name

TENANT = "acme"


def booker(booked: list[tuple[str, str]]) -> Agent:
    @tool
    async def book(seat: str, *, idempotency_key: str) -> str:
        booked.append((seat, idempotency_key))
        return f"booked {seat}"

    return Agent(name="booker", instructions="book", tools=[book])


async def test_calls_of_one_answer_sharing_a_model_call_id_each_get_their_own_id_and_key() -> None:
    """A model (or an OpenAI-compatible server) that gives several parallel calls the same id:
    every call is recorded, made once, and answered, each under a key of its own."""
    booked: list[tuple[str, str]] = []
    model = ScriptedProvider(
        [
            reply("", *(ToolCall(call_id="c", tool="book", args={"seat": s}) for s in "ABC")),
            reply("done"),
        ]
    )
    log = MemoryEventLog()
    result = await AgentRunner(provider=model, log=log).run(
        booker(booked), "book three", tenant=TENANT, run_id="r"
    )
    assert result.status == "completed"
    events = [s.event for s in await log.read_run("r")]
    (answered,) = [e for e in events if isinstance(e, ModelAnswered) and e.tool_calls]
    ids = [c.call_id for c in answered.tool_calls]
    assert len(set(ids)) == 3, ids
    assert len({c.idempotency_key for c in answered.tool_calls}) == 3
    assert sorted(seat for seat, _ in booked) == ["A", "B", "C"]
    assert len({key for _, key in booked}) == 3
    dispatched = [e.call_id for e in events if isinstance(e, ToolDispatched)]
    completed = [e.call_id for e in events if isinstance(e, ToolCompleted)]
    assert sorted(dispatched) == sorted(completed) == sorted(ids)


async def test_a_call_id_reused_from_an_earlier_turn_twice_in_one_answer_stays_two_calls() -> None:
    """Ids some servers number per answer ("call_0") come back in every turn: two calls that
    both reuse an earlier turn's id are still two calls with two keys."""
    booked: list[tuple[str, str]] = []
    model = ScriptedProvider(
        [
            reply("", ToolCall(call_id="call_0", tool="book", args={"seat": "A"})),
            reply(
                "",
                ToolCall(call_id="call_0", tool="book", args={"seat": "B"}),
                ToolCall(call_id="call_0", tool="book", args={"seat": "C"}),
            ),
            reply("done"),
        ]
    )
    result = await AgentRunner(provider=model, log=MemoryEventLog()).run(
        booker(booked), "book three", tenant=TENANT, run_id="r"
    )
    assert result.status == "completed"
    assert sorted(seat for seat, _ in booked) == ["A", "B", "C"]
    assert len({key for _, key in booked}) == 3


async def test_a_repeated_call_id_of_the_longest_length_is_renamed_within_the_limit() -> None:
    """A model's id as long as a name may be, repeated: the renamed ids still fit
    `MAX_NAME_LENGTH`, so `onward resolve` and `approve` can name them."""
    booked: list[tuple[str, str]] = []
    long_id = "c" * MAX_NAME_LENGTH
    model = ScriptedProvider(
        [
            reply("", *(ToolCall(call_id=long_id, tool="book", args={"seat": s}) for s in "AB")),
            reply("", ToolCall(call_id=long_id, tool="book", args={"seat": "C"})),
            reply("done"),
        ]
    )
    log = MemoryEventLog()
    result = await AgentRunner(provider=model, log=log).run(
        booker(booked), "book three", tenant=TENANT, run_id="r"
    )
    assert result.status == "completed"
    ids = [
        call.call_id
        for stored in await log.read_run("r")
        if isinstance(stored.event, ModelAnswered)
        for call in stored.event.tool_calls
    ]
    assert len(set(ids)) == 3, ids
    for call_id in ids:
        check_name("call_id", call_id)
    assert len({key for _, key in booked}) == 3
