"""The built wheel carries the three code folders under `onward` and imports from anywhere."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from onward.projections.migrations import expected_version

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_contains_the_subpackages_and_imports_outside_the_tree(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("onward-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "eventlog/kafka.py",
        "projections/__init__.py",
        "runtime/cli/__init__.py",
        "schemas/sql/0001_projections.sql",
        "schemas/sql/frontiers.build.sql",
        "schemas/sqlite/0001_frontiers.sql",
        "schemas/redis/acquire.lua",
        "schemas/redis/_shared.lua",
    ):
        assert f"onward/{module}" in names
    assert not any(n.split("/")[0] in {"eventlog", "projections", "runtime"} for n in names)

    target = tmp_path / "installed"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheel],
        check=True,
        timeout=300,
    )
    # -S skips site, so the editable install's path hook is not seen: onward comes from the
    # wheel, its dependencies from this environment's site-packages.
    site_packages = sysconfig.get_paths()["purelib"]
    result = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import onward.eventlog as e; from onward.projections.migrations import "
            "expected_version as v; print(e.__file__, v('postgres'), v('sqlite'))",
        ],
        env={"PYTHONPATH": f"{target}:{site_packages}"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    path, postgres_version, sqlite_version = result.stdout.split()
    assert path.startswith(str(target / "onward" / "eventlog"))
    # The wheel ships every migration this tree has.
    assert (int(postgres_version), int(sqlite_version)) == (
        expected_version("postgres"),
        expected_version("sqlite"),
    )


def _floors(tmp_path: Path, *dependencies: str) -> subprocess.CompletedProcess[str]:
    """What ``scripts/floors.py`` (`make test-core-lowest`'s pins) prints for a pyproject.toml
    whose dependencies are ``dependencies``."""
    pyproject = tmp_path / "pyproject.toml"
    listed = ", ".join(f"'{dependency}'" for dependency in dependencies)
    pyproject.write_text(f"[project]\nname = 'x'\ndependencies = [{listed}]\n")
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "floors.py"), str(pyproject)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_floors_are_read_whatever_the_order_of_the_bounds(tmp_path: Path) -> None:
    """PEP 508 lets a requirement give its bounds in any order and space its extras: an upper
    bound written first ("<0.15,>=0.14") was refused as having no ``>=`` floor."""
    result = _floors(tmp_path, "aiokafka [zstd] <0.15, >= 0.14", "redis>=6.0", "rich >=13.8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["aiokafka[zstd]==0.14", "redis==6.0", "rich==13.8"]


def test_a_floor_that_is_not_a_plain_release_is_refused_not_cut_short(tmp_path: Path) -> None:
    """A floor such as ``2.0.post1`` was pinned as ``==2.0``, a release below the floor the
    project declares, and the suites said nothing of it: it is refused, naming the requirement."""
    result = _floors(tmp_path, "redis>=6.0", "httpx>=2.0.post1")
    assert result.returncode != 0
    assert "'httpx>=2.0.post1'" in result.stderr, result.stderr
    assert "httpx==2.0" not in result.stdout


def test_the_floors_pin_every_core_dependency_of_pyproject_at_its_floor() -> None:
    """Each core dependency of this project's pyproject.toml is pinned at its ``>=`` bound."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "floors.py"), str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = result.stdout.split()
    assert len(pins) == len(dependencies), pins
    for dependency, pin in zip(dependencies, pins, strict=True):
        name, floor = pin.split("==")
        assert dependency.replace(" ", "").startswith(f"{name}>={floor}"), (dependency, pin)
