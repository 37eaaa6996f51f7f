"""The exported names are the public API; changing them is a decision, so a test pins them.

Both ways: what a module exports is the pinned list, and what it defines is exported (or
named with a leading underscore), so a new public class cannot slip in unlisted.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import onward.projections
from onward.eventlog import EventLog, KafkaEventLog, MemoryEventLog, SqliteEventLog

PINNED_FILE = Path(__file__).with_name("fixtures") / "public_api.json"
PINNED: dict[str, list[str]] = json.loads(PINNED_FILE.read_text())


@pytest.mark.parametrize("module", sorted(PINNED))
def test_exports_are_the_pinned_ones(module: str) -> None:
    exported = importlib.import_module(module).__all__
    assert sorted(exported) == PINNED[module], f"update {PINNED_FILE.name} only on purpose"


@pytest.mark.parametrize("module", sorted(PINNED))
def test_every_exported_name_exists(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert missing == [], f"{module}.__all__ names what it does not have"


def _bindings(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run when the module is imported, into ``if``/``try`` blocks but not
    into ``if TYPE_CHECKING:``, whose imports exist for annotations only."""
    for statement in statements:
        if isinstance(statement, ast.If):
            test = statement.test
            if isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith(
                "TYPE_CHECKING"
            ):
                yield from _bindings(statement.orelse)
                continue
            yield from _bindings(statement.body)
            yield from _bindings(statement.orelse)
        elif isinstance(statement, ast.Try):
            for block in (statement.body, statement.orelse, statement.finalbody):
                yield from _bindings(block)
            for handler in statement.handlers:
                yield from _bindings(handler.body)
        else:
            yield statement


def _names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _names(element)


def defined_names(module: ModuleType) -> set[str]:
    """The public names ``module`` binds that are its own: classes, functions and constants
    defined in it, and for a package what it takes from its own submodules. Names imported
    from elsewhere (the standard library, typing, another Onward package) are not its own."""
    own = module.__name__
    is_package = hasattr(module, "__path__")
    found: set[str] = set()
    for statement in _bindings(ast.parse(inspect.getsource(module)).body):
        if isinstance(statement, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(statement.name)
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                found.update(_names(target))
        elif isinstance(statement, ast.AnnAssign):
            found.update(_names(statement.target))
        elif isinstance(statement, ast.ImportFrom):
            source = statement.module or ""
            inside = (
                statement.level == 1 or source == own or source.startswith(f"{own}.")
                if is_package
                else False
            )
            if inside:
                found.update(alias.asname or alias.name for alias in statement.names)
    return {
        name
        for name in found
        if not name.startswith("_")
        and hasattr(module, name)
        and not inspect.ismodule(getattr(module, name))
    }


@pytest.mark.parametrize("module", sorted(PINNED))
def test_every_name_a_module_defines_is_exported(module: str) -> None:
    imported = importlib.import_module(module)
    unlisted = sorted(defined_names(imported) - set(imported.__all__))
    assert unlisted == [], (
        f"{module} defines public names missing from its __all__: export them (and pin them "
        f"in {PINNED_FILE.name}) or give them a leading underscore"
    )


def test_the_reverse_check_sees_definitions_and_package_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above would pass vacuously if it found nothing: it must see a package's own
    classes, functions and constants and what it takes from its submodules, and skip what it
    imports from elsewhere, for annotations only, or under a leading underscore."""
    package = tmp_path / "exports_probe"
    package.mkdir()
    (package / "part.py").write_text("class Listed: ...\nclass Unlisted: ...\nclass Typed: ...\n")
    (package / "__init__.py").write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING, Any\n"
        "from . import part\n"
        "from .part import Listed, Unlisted\n"
        "from .part import Listed as _Alias\n"
        "if TYPE_CHECKING:\n"
        "    from .part import Typed\n"
        "LIMIT: int = 3\n"
        "def helper() -> Any: ...\n"
        "__all__ = ['Listed']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        probe = importlib.import_module("exports_probe")
        assert defined_names(probe) == {"LIMIT", "Listed", "Unlisted", "helper"}
    finally:
        for name in ("exports_probe", "exports_probe.part"):
            sys.modules.pop(name, None)


def test_backends_satisfy_the_protocol() -> None:
    assert isinstance(MemoryEventLog(), EventLog)
    assert isinstance(SqliteEventLog("unused.db"), EventLog)
    assert isinstance(KafkaEventLog("127.0.0.1:9092"), EventLog)


def test_stores_satisfy_the_protocol() -> None:
    assert isinstance(onward.projections.MemoryFrontierStore(), onward.projections.FrontierStore)
    assert isinstance(
        onward.projections.SqliteFrontierStore("unused.db"), onward.projections.FrontierStore
    )
    assert isinstance(
        onward.projections.PostgresFrontierStore("postgresql://x@127.0.0.1/x"),
        onward.projections.FrontierStore,
    )
