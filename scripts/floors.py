"""Print pip pins of onward's core dependencies at their floors, one a line, from pyproject.toml.

`make test-core-lowest` installs these, so the floors a deployment may really have are the ones
tested, and the pins cannot drift from pyproject.toml: they are read from it each time.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+(?:\[[^\]]+\])?)\s*>=\s*(?P<floor>[0-9.]+)")


def floor_pins(pyproject: Path) -> list[str]:
    """``name[extras]==floor`` for each core dependency (``==0.14`` is 0.14.0 to pip)."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = []
    for requirement in dependencies:
        found = _REQUIREMENT.match(requirement)
        if found is None:
            raise SystemExit(f"{requirement!r} in {pyproject} has no `>=` floor; give it one")
        pins.append(f"{found['name']}=={found['floor']}")
    return pins


if __name__ == "__main__":
    print("\n".join(floor_pins(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))))
