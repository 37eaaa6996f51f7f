"""What a shell makes of a command a user pastes from Onward's output."""

from __future__ import annotations

import subprocess


def pasted(command: str) -> list[str]:
    """The words a shell (bash, in UTF-8) gives ``command`` pasted into it."""
    said = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {command}"],
        env={"LC_ALL": "C.UTF-8"},
        capture_output=True,
        check=True,
    )
    return said.stdout.decode().split("\0")[:-1]
