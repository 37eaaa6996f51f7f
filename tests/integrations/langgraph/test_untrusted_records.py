"""Nothing a thread's records name is executed when the thread is read (security review #2).

Anyone who can write the log (a producer on the events topic, a writer of the SQLite file) can
put any bytes in a `graph.checkpointed` record. LangGraph's serializer, left permissive, imports
and calls whatever a msgpack value names; the saver's default is its strict mode, so a forged
value naming ``os.system`` is read back as plain data and runs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ormsgpack
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_SINGLE_ARG, JsonPlusSerializer

from onward.integrations.langgraph import OnwardSaver

from .worlds import TENANT, World

FORGED = "forged"


class Forger(JsonPlusSerializer):
    """Writes the value ``FORGED`` as a msgpack value that calls ``os.system(command)``: what an
    attacker who can write the log appends."""

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if obj == FORGED:
            call = ormsgpack.packb(("os", "system", self.command))
            return "msgpack", ormsgpack.packb(ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, call))
        return super().dumps_typed(obj)


async def test_a_forged_value_naming_a_function_is_read_as_data_and_runs_nothing(
    world: World, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    command = f"touch {ran}"
    writer = OnwardSaver(world.log, world.leases, tenant=TENANT, serde=Forger(command))
    checkpoint = generate_checkpoint(
        channel_values={"notes": FORGED}, channel_versions={"notes": 1}
    )
    async with writer:
        await writer.aput(generate_config("t"), checkpoint, generate_metadata(), {"notes": 1})

    async with OnwardSaver(world.log, world.leases, tenant=TENANT) as reader:
        loaded = await reader.aget_tuple(generate_config("t"))
        listed = [t async for t in reader.alist(generate_config("t"))]

    assert loaded is not None
    assert loaded.checkpoint["channel_values"] == {"notes": command}
    assert len(listed) == 1
    assert not ran.exists()
