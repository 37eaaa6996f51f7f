"""What a user's code type-checks to: the public API seen by ``mypy --strict`` from outside the
tree, as an application written against Onward runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

USER_CODE = """
from typing import assert_type

import onward
from onward.runtime.backends import open_backends


def ask_for_amounts() -> None:
    assert_type(onward.ask("refund how much?", schema=int), int)
    assert_type(onward.ask("which dates?", schema=list[str]), list[str])


async def spent(settings: onward.Settings) -> int:
    async with open_backends(settings, in_process=True) as stores:
        return (await stores.spend.run_total("run-1")).micros
"""

MISSPELT_CODE = """
import onward
from onward import Setings
from onward.eventlog import SqliteEvntLog
from onward.projections import MemoryFrontierStor
from onward.runtime import Agnt
from onward.runtime.leases import SqliteLeaseStor

options = onward.Optons
"""


@pytest.mark.slow
@pytest.mark.timeout(300)  # a cold mypy cache reads onward and its dependencies: half a minute
def test_user_code_type_checks_strictly_against_the_public_api(tmp_path: Path) -> None:
    """``ask(schema=int)`` is typed as the int it returns, not ``Any``; the spend ledger of
    `open_backends` (always there) is not ``Optional``, so the README's budget example reads
    it as written; and a misspelt name imported from a lazily exporting package is an error,
    not an ``object`` that type-checks (a module ``__getattr__`` in view of mypy was)."""
    (tmp_path / "user.py").write_text(textwrap.dedent(USER_CODE))
    (tmp_path / "misspelt.py").write_text(textwrap.dedent(MISSPELT_CODE))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache")]
    checked = subprocess.run(
        [*command, "user.py", "misspelt.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    errors = re.findall(r"^(\w+\.py):(\d+): error: .*\[(\S+)\]$", checked.stdout, re.MULTILINE)
    expected = [("misspelt.py", str(line), "attr-defined") for line in range(3, 8)]
    assert errors == [*expected, ("misspelt.py", "9", "attr-defined")], checked.stdout
