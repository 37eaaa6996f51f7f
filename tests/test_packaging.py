"""The built wheel carries the three code folders under `onward` and imports from anywhere."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
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
