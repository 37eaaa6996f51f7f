"""A strict MCP server for the integration tests, run over stdio as a subprocess: it checks every
call's arguments against the input schema it listed (``additionalProperties: false``), as a
server built on JSON Schema validation does, and refuses a call whose arguments do not fit.

Usage: python -m integrations.mcp_strict_server

Each tool answers with the arguments it was given, as JSON text.

Environment:
    MCP_STRICT_EXTRA_TOOLS: a JSON list of more tool names to list (each taking no
        arguments), as a server with a broken listing sends them: a name twice, a name with a
        control character.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import jsonschema
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server


def _strict(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "note": _strict({"text": {"type": "string"}}),
    "keyed": _strict({"text": {"type": "string"}, "request_key": {"type": "string"}}),
    "stamp": _strict({"text": {"type": "string"}, "idempotency_key": {"type": "string"}}),
}
EXTRA: list[str] = json.loads(os.environ.get("MCP_STRICT_EXTRA_TOOLS") or "[]")


async def _list_tools(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(name=name, description=f"{name} (strict)", input_schema=schema)
            for name, schema in SCHEMAS.items()
        ]
        + [types.Tool(name=name, input_schema=_strict({})) for name in EXTRA]
    )


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    try:
        jsonschema.validate(arguments, SCHEMAS[params.name])
    except (KeyError, jsonschema.ValidationError) as exc:
        detail = exc.message if isinstance(exc, jsonschema.ValidationError) else "no such tool"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"refused: {detail}")], is_error=True
        )
    text = json.dumps(arguments, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("strict", version="1", on_list_tools=_list_tools, on_call_tool=_call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
