"""Tools (schemas, keys, argument checks), agent revisions, and the checkpoint policy."""

from __future__ import annotations

import re
from typing import Any

import pydantic
import pytest

from onward.errors import ConfigurationError
from onward.eventlog import MemoryEventLog, ToolCall
from onward.integrations.mcp import MCPToolset
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.checkpoint import CheckpointPolicy
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import UNPARSED, Tool, ToolArgumentsError, idempotency_key, tool


class Seat(pydantic.BaseModel):
    row: int
    letter: str = "A"


@tool(retry_safe=True)
async def search(query: str, limit: int = 5, *, idempotency_key: str) -> list[str]:
    """Search flights."""
    return [query] * limit


@tool
async def book(seat: Seat, *, idempotency_key: str) -> str:
    return f"{seat.row}{seat.letter}:{idempotency_key}"


def test_the_schema_comes_from_type_hints_and_pydantic_models() -> None:
    assert search.description == "Search flights."
    assert search.parameters["required"] == ["query"]
    assert search.parameters["properties"]["limit"]["default"] == 5
    assert "idempotency_key" not in search.parameters["properties"]
    assert book.parameters["properties"]["seat"]["$ref"].endswith("Seat")


async def test_a_tool_receives_validated_arguments_and_its_key() -> None:
    assert await book.call({"seat": {"row": 14, "letter": "C"}}, idempotency_key="k1") == "14C:k1"


async def test_arguments_that_do_not_fit_are_refused_before_the_call() -> None:
    with pytest.raises(ToolArgumentsError, match="book"):
        await book.call({"seat": {"row": "fourteen"}}, idempotency_key="k")


def test_a_tool_must_take_an_idempotency_key() -> None:
    async def no_key(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match="idempotency_key"):
        tool(no_key)


async def _positional_only(query: str, /, *, idempotency_key: str) -> str:
    return query


async def _key_positional_only(idempotency_key: str, /) -> str:
    return idempotency_key


async def _private(_query: str, *, idempotency_key: str) -> str:
    return _query


@pytest.mark.parametrize(
    ("function", "named"),
    [
        (_positional_only, "'query' is positional-only"),
        (_key_positional_only, "'idempotency_key' is positional-only"),
        (_private, "'_query' starts with `_`"),
    ],
    ids=["positional-only", "key-positional-only", "leading-underscore"],
)
def test_a_signature_onward_cannot_call_is_refused_at_decoration(function: Any, named: str) -> None:
    """Onward passes arguments by keyword and the schema drops ``_`` names: such a tool would
    be accepted, then fail every call with a TypeError."""
    with pytest.raises(ConfigurationError, match=named):
        tool(function)


async def test_arguments_the_model_did_not_write_as_an_object_are_refused() -> None:
    """A provider marks arguments that are not a JSON object with `UNPARSED`: a tool whose
    parameters all have defaults is not called with them."""
    called: list[int] = []

    @tool
    async def ping(times: int = 1, *, idempotency_key: str) -> None:
        called.append(times)

    with pytest.raises(ToolArgumentsError, match=re.escape("""not a JSON object: '{"times": 3'""")):
        await ping.call({UNPARSED: '{"times": 3'}, idempotency_key="k")
    with pytest.raises(ToolArgumentsError, match=r"'xxxx+\.\.\.'"):
        await ping.call({UNPARSED: "x" * 10_000}, idempotency_key="k")
    assert called == []


def test_a_tool_must_be_async() -> None:
    def blocking(*, idempotency_key: str) -> None:
        return None

    with pytest.raises(ConfigurationError, match="async"):
        tool(blocking)  # type: ignore[arg-type]


def test_keys_are_stable_per_run_and_call() -> None:
    """Golden values: a call left undecided before an upgrade keeps its key after it, so a
    changed formula (which would make a tool see a new key for an old call and do it twice)
    fails here. The separator keeps ``("r1:c", "1")`` and ``("r1", "c:1")`` apart."""
    assert idempotency_key("r1", "c1") == "onward-d1f8c9b7b7de3b1465fd389278ae1b17"
    assert idempotency_key("r1:c", "1") == "onward-939a6f7a2f174629519cb01c24935466"
    assert idempotency_key("r1", "c:1") == "onward-b4db96fd0dcd9eb99ebe2af46eae9879"
    assert (
        len({idempotency_key("r1", "c1"), idempotency_key("r1", "c2"), idempotency_key("r2", "c1")})
        == 3
    )


async def test_the_key_a_tool_receives_is_the_golden_one() -> None:
    """The runner hands the tool the key of the documented format for its run and call, on
    the first attempt: pinning the function alone would miss a runner that derived its own."""
    seen: list[str] = []

    @tool
    async def book(seat: str, *, idempotency_key: str) -> str:
        seen.append(idempotency_key)
        return seat

    agent = Agent(name="booker", instructions="", tools=[book])
    provider = ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("booked")]
    )
    runner = AgentRunner(provider=provider, log=MemoryEventLog())
    result = await runner.run(agent, "book", tenant="acme", run_id="run-1")
    assert result.status == "completed"
    assert seen == ["onward-1a0d7c2f2719e52b34d0f742f5ffa414"]


def test_the_revision_changes_with_instructions_tools_and_settings() -> None:
    base = Agent(name="a", instructions="x", tools=[search])
    assert base.revision == Agent(name="a", instructions="x", tools=[search]).revision
    assert base.revision != Agent(name="a", instructions="y", tools=[search]).revision
    assert base.revision != Agent(name="a", instructions="x", tools=[search, book]).revision
    assert (
        base.revision
        != Agent(name="a", instructions="x", tools=[search], model_settings={"t": 1}).revision
    )


def test_an_agent_refuses_two_tools_of_one_name() -> None:
    with pytest.raises(ConfigurationError, match="named twice"):
        Agent(name="a", instructions="", tools=[search, search])


async def _undecorated(query: str, *, idempotency_key: str) -> str:
    return query


@pytest.mark.parametrize(
    ("tools", "refusal"),
    [
        (search, r"tools must be a list of tools, got one Tool: tools=\[search\]"),
        (None, r"tools must be a list of tools, got NoneType"),
        ([search, _undecorated], r"tools\[1\] is a function, not a Tool: decorate it with @tool"),
        (["search"], r"tools\[0\] is a str, not a Tool: give the function decorated with @tool"),
        (
            [MCPToolset([])],
            r"tools\[0\] is a toolset \(MCPToolset\), not a Tool: give it as toolsets=\[\.\.\.\]",
        ),
        (
            MCPToolset([]),
            r"tools must be a list of tools, got a toolset \(MCPToolset\): give it as",
        ),
    ],
)
def test_an_agent_refuses_tools_that_are_not_a_list_of_tools(tools: Any, refusal: str) -> None:
    """One tool not in a list, None, or a function without ``@tool`` is refused naming the
    argument and what to do, not with "'Tool' object is not iterable" or "'function' object
    has no attribute 'name'"; a toolset (an MCP server's) given as a tool is sent to
    ``toolsets``, not told to be decorated with ``@tool``, which cannot make it one."""
    with pytest.raises(ConfigurationError, match=rf"^agent 'a': {refusal}"):
        Agent(name="a", instructions="", tools=tools)


def test_an_agent_takes_its_tools_from_any_ordered_iterable() -> None:
    """``tools=registry.values()`` or a generator was refused ("got dict_values"), though the
    tools are there in a settled order: they are taken as a tuple, with the revision of the
    same tools in a list."""
    listed = Agent(name="a", instructions="", tools=[search, book])
    registry = {"search": search, "book": book}
    for given in (registry.values(), (t for t in (search, book)), (search, book)):
        agent = Agent(name="a", instructions="", tools=given)  # type: ignore[arg-type]
        assert agent.tools == (search, book)
        assert agent.revision == listed.revision


def test_an_agent_given_a_dict_of_tools_is_told_to_give_its_values() -> None:
    """A dict of names to tools was refused as "tools[0] is a str" (its keys): the refusal
    names the dict and says to give its values."""
    with pytest.raises(
        ConfigurationError, match=r"^agent 'a': tools must be a list of tools, got a dict: give"
    ) as refused:
        Agent(name="a", instructions="", tools={"search": search})  # type: ignore[arg-type]
    assert "tools=list(tools_by_name.values())" in str(refused.value)


# Every policy also folds the run's start and its end, whatever it names: a row from the start
# lets a worker find a run that died before its first boundary.
@pytest.mark.parametrize(
    ("policy", "expected_writes"),
    [
        (CheckpointPolicy(), 8),
        (CheckpointPolicy(after_model_call=False), 5),
        (
            CheckpointPolicy(
                after_model_call=False, after_tool_result=False, before_approval=False
            ),
            2,
        ),
    ],
)
async def test_a_sparser_policy_writes_fewer_checkpoints_and_repeats_nothing(
    policy: CheckpointPolicy, expected_writes: int
) -> None:
    calls: list[Any] = []

    @tool
    async def counted_search(query: str, limit: int = 5, *, idempotency_key: str) -> str:
        calls.append(idempotency_key)
        return query

    agent = Agent(name="a", instructions="", tools=[counted_search])
    provider = ScriptedProvider(
        [
            reply("", ToolCall(call_id=f"s{i}", tool="counted_search", args={"query": "x"}))
            for i in range(3)
        ]
        + [reply("done")]
    )
    store = MemoryFrontierStore()
    runner = AgentRunner(
        provider=provider,
        log=MemoryEventLog(),
        frontiers=store,
        checkpoints=policy,
        checkpoint_inline=True,
    )
    result = await runner.run(agent, "go", tenant="t", run_id="r")
    assert result.status == "completed"
    assert runner.checkpointer is not None
    assert runner.checkpointer.written == expected_writes
    assert len(calls) == len(set(calls)) == 3
    row = await store.get("r")
    assert row is not None
    assert row.summary.status == "completed"


async def _echo(**args: Any) -> Any:
    return args


@pytest.mark.parametrize(
    ("argument", "options"),
    [
        ("idempotency_key", {}),
        ("fence", {"takes_fence": True}),
        ("approval", {"takes_approval": True}),
        ("lease_expires_at", {"takes_lease_expiry": True}),
    ],
)
def test_a_tool_built_by_hand_with_an_argument_named_like_onward_s_keyword_is_refused(
    argument: str, options: dict[str, Any]
) -> None:
    """Its model's value could never reach it: ``fn(**args, idempotency_key=key)`` fails with a
    TypeError at every call, or Onward's fence replaces the model's."""
    schema = {"type": "object", "properties": {argument: {"type": "string"}}}
    with pytest.raises(ConfigurationError, match=f"argument named '{argument}'"):
        Tool(name="t", description="", parameters=schema, fn=_echo, **options)


def test_an_argument_named_fence_is_the_model_s_when_the_tool_takes_no_fence() -> None:
    schema = {"type": "object", "properties": {"fence": {"type": "string"}}}
    assert Tool(name="t", description="", parameters=schema, fn=_echo).name == "t"
