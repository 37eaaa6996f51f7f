"""Print pip pins of onward's core dependencies at their floors, one a line, from pyproject.toml.

`make test-core-lowest` installs these, so the floors a deployment may really have are the ones
tested, and the pins cannot drift from pyproject.toml: they are read from it each time.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9_.\-]*)\s*(?P<extras>\[[^\]]*\])?\s*(?P<bounds>[^;]*)"
)
"""A PEP 508 requirement: its name, its extras and its bounds (an environment marker after
``;`` is left out: the suites run on one Python)."""

_FLOOR = re.compile(r"^>=\s*(?P<floor>[0-9]+(?:\.[0-9]+)*)$")
"""A ``>=`` bound on a plain release: a pre- or post-release floor cut to its numbers would pin
another release than the one declared."""


def floor_pins(pyproject: Path) -> list[str]:
    """``name[extras]==floor`` for each core dependency (``==0.14`` is 0.14.0 to pip), its bounds
    in any order (``<0.15,>=0.14``)."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = []
    for requirement in dependencies:
        found = _REQUIREMENT.match(requirement)
        bounds = found["bounds"].split(",") if found else []
        floors = [floor for bound in bounds if (floor := _FLOOR.match(bound.strip()))]
        if found is None or len(floors) != 1:
            raise SystemExit(
                f"{requirement!r} in {pyproject} has no `>=` floor on a plain release "
                "(such as >=0.14); give it one"
            )
        extras = re.sub(r"\s", "", found["extras"] or "")
        pins.append(f"{found['name']}{extras}=={floors[0]['floor']}")
    return pins


if __name__ == "__main__":
    print("\n".join(floor_pins(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))))
