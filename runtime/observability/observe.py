"""The runtime's hooks: a run step and a tool call, counted and (optionally) traced."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from time import perf_counter

from .counts import COUNTS
from .tracing import span


@dataclass(slots=True)
class ToolCallEnd:
    """How a tool call ended, set by the caller before the block closes; a block left by an
    exception keeps ``interrupted``."""

    disposition: str = "interrupted"


@contextlib.contextmanager
def run_step(step: str, run_id: str, fence: int) -> Iterator[None]:
    """Count and time one run step (``model`` or ``tools``), in a span of its own."""
    started = perf_counter()
    attributes = {"onward.run_id": run_id, "onward.fence": fence, "onward.step": step}
    try:
        with span("onward.run.step", attributes):
            yield
    finally:
        COUNTS.step(step, perf_counter() - started)


@contextlib.contextmanager
def tool_call(run_id: str, fence: int, call_id: str, tool: str) -> Iterator[ToolCallEnd]:
    """Count and time one tool call by how it ended, in a span of its own."""
    started = perf_counter()
    end = ToolCallEnd()
    attributes = {
        "onward.run_id": run_id,
        "onward.fence": fence,
        "onward.call_id": call_id,
        "onward.tool": tool,
    }
    try:
        with span("onward.tool_call", attributes) as current:
            try:
                yield end
            finally:
                current.set_attribute("onward.disposition", end.disposition)
    finally:
        COUNTS.tool_call(end.disposition, perf_counter() - started)
