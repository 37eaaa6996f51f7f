"""An `MCPToolset`'s timeouts must be positive numbers: a call timeout of zero or less sent each
call and at once gave up on its answer, so every call took effect on the server and was left
undecided (`OutcomeUnknownError`) for a person to resolve."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from integrations.mcp_world import stdio_server
from onward.errors import InvalidInputError
from onward.integrations.mcp import MCPToolset

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("seconds", [0, -1, math.nan])
def test_a_call_timeout_that_is_not_positive_is_refused(tmp_path: Path, seconds: float) -> None:
    with pytest.raises(InvalidInputError, match="call_timeout must be positive"):
        MCPToolset([stdio_server(tmp_path)], call_timeout=seconds)


@pytest.mark.parametrize("seconds", [0, -1, math.nan])
def test_a_connect_timeout_that_is_not_positive_is_refused(tmp_path: Path, seconds: float) -> None:
    with pytest.raises(InvalidInputError, match="connect_timeout must be positive"):
        MCPToolset([stdio_server(tmp_path)], connect_timeout=seconds)
