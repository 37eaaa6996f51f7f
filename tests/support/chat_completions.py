"""A local OpenAI-compatible chat-completions server, for the README's quickstart test.

It answers like a model that uses its tools: while the conversation holds no tool result it asks
for the first tool of the request with the numbers found in the last user message; once it holds
one it answers with the result in words. It runs in a thread, so a test that runs the README's
example as a separate process can point ``OPENAI_BASE_URL`` at it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages", [])
    results = [m for m in messages if m.get("role") == "tool"]
    if results:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": f"The answer is {results[-1].get('content')}.",
        }
    else:
        asked: dict[str, Any] = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        numbers = [int(n) for n in re.findall(r"\d+", str(asked.get("content", "")))][:2]
        tool = body["tools"][0]["function"]
        names = list(tool["parameters"].get("properties", {}))
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call-1",
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "arguments": json.dumps(dict(zip(names, numbers, strict=False))),
                    },
                }
            ],
        }
    return {
        "id": "chatcmpl-local",
        "object": "chat.completion",
        "model": body.get("model", "local"),
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        if not self.path.endswith("/chat/completions"):
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        data = json.dumps(_answer(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads the example's output, not the server's."""


@contextmanager
def chat_completions_server() -> Iterator[str]:
    """Serve on a free loopback port for the block's length; yields the base URL (``.../v1``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
