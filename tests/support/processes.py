"""Child processes running a module of tests/support, as the crash and worker tests need."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]


async def spawn_support(module: str, *args: str, **options: Any) -> asyncio.subprocess.Process:
    """``python -m support.<module> *args`` with tests/ on its path; ``options`` as for asyncio."""
    env = {**os.environ, **options.pop("env", {}), "PYTHONPATH": str(TESTS)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", f"support.{module}", *args, env=env, **options
    )


async def spawn_onward(log: Path, env: dict[str, str], *argv: str) -> asyncio.subprocess.Process:
    """``python -m onward *argv`` in ``env``, its output (both streams) in the file ``log``."""
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "onward", *argv, env=env, stdout=out, stderr=out
        )
