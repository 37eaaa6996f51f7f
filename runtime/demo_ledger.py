"""The booking demo's record of its tool's side effects: one JSON line per effect, in a file.

Not part of the runtime: it stands for the system a real tool acts on, which keeps its own
record. The demo's booking tool writes here and its status check reads here; the crash tests
count the lines to prove that no side effect happened twice. A file, fsynced on every line, so
a process killed with SIGKILL right after a tool returned leaves the effect on record for the
next process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Ledger:
    """Side effects as JSON lines ``{"tool": ..., "key": ..., **details}`` in one file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def record(self, tool: str, key: str, **details: Any) -> None:
        """Append one effect of ``tool`` under its idempotency ``key``, durably."""
        with self.path.open("a") as out:
            out.write(json.dumps({"tool": tool, "key": key, **details}) + "\n")
            out.flush()
            os.fsync(out.fileno())

    def entries(self) -> list[dict[str, Any]]:
        """Every recorded effect, oldest first (none when the file does not exist yet).

        A last line without its newline is a record still being written (by another process,
        read mid-write), not an effect on record yet.
        """
        if not self.path.exists():
            return []
        text = self.path.read_text()
        complete = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def find(self, tool: str, key: str) -> dict[str, Any] | None:
        """The first effect of ``tool`` under ``key``, or ``None`` when it never happened."""
        return next((e for e in self.entries() if e["tool"] == tool and e["key"] == key), None)

    def count(self, tool: str) -> int:
        """How many effects ``tool`` has recorded."""
        return sum(1 for e in self.entries() if e["tool"] == tool)
