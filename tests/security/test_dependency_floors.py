"""Every dependency range starts past the releases with published advisories (security review
#22), and the constraints file a deployment installs with lies inside those ranges."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]

FIXED_IN = {
    "langchain-core": Version("1.3.3"),  # CVE-2025-68664 (1.2.5), CVE-2026-44843 (1.3.3)
    "langgraph": Version("1.0.10"),  # the security update for CVE-2026-28277
    "langgraph-checkpoint": Version("4.3"),  # strict allowed_msgpack_modules (#2)
    "pydantic-settings": Version("2.14.2"),  # GHSA-4xgf-cpjx-pc3j
    "setuptools": Version("78.1.1"),  # CVE-2024-6345, CVE-2025-47273
}


def declared() -> list[Requirement]:
    """Every requirement pyproject.toml names: runtime, each extra, and the build system."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = [
        *project["project"]["dependencies"],
        *(r for extra in project["project"]["optional-dependencies"].values() for r in extra),
        *project["build-system"]["requires"],
    ]
    return [Requirement(name) for name in names]


def test_no_declared_range_admits_a_release_before_its_advisory_fix() -> None:
    """Security review #22: ``langchain>=1.0`` admitted langchain-core 1.0 to 1.3.2,
    ``langgraph>=1.0`` releases before 1.0.10, ``pydantic-settings>=2.2`` releases before
    2.14.2, and ``setuptools>=77`` releases before 78.1.1."""
    requirements = declared()
    for name, fixed in FIXED_IN.items():
        ranges = [r for r in requirements if r.name == name]
        assert ranges, f"{name} is not declared; its advisory floor cannot hold"
        for requirement in ranges:
            assert not requirement.specifier.contains(Version(f"{fixed}.dev0"), prereleases=True)
            assert not requirement.specifier.contains(_just_before(fixed)), (requirement, fixed)


def test_the_constraints_file_pins_inside_the_declared_ranges() -> None:
    """Security review #22: nothing was locked; constraints.txt pins every runtime package,
    each at a version the declared ranges allow."""
    pins = {
        (req := Requirement(line)).name: req
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for requirement in declared():
        pinned = pins.get(requirement.name)
        if pinned is None:
            continue  # a dev or build tool: not installed in deployments
        (spec,) = pinned.specifier
        assert spec.operator == "==", pinned
        assert requirement.specifier.contains(spec.version, prereleases=True), (
            requirement,
            pinned,
        )
    for name, fixed in FIXED_IN.items():
        if name in pins:
            (spec,) = pins[name].specifier
            assert Version(spec.version) >= fixed, pins[name]


def _just_before(version: Version) -> Version:
    """The last release number below ``version`` (1.3.3 -> 1.3.2, 4.3 -> 4.2.999)."""
    parts = list(version.release)
    if parts[-1] > 0:
        parts[-1] -= 1
        return Version(".".join(map(str, parts)))
    parts[-2] -= 1
    return Version(".".join(map(str, parts[:-1])) + ".999")
