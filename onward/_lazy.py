"""Names a package re-exports but imports on first use (PEP 562), so importing the package
loads only what its caller touches."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from types import ModuleType


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    ``exports`` maps each lazy name to the module (absolute, or relative to ``package``) and the
    attribute it is. A value imported once is kept in the package, so later lookups of it never
    come back here. Any other name is looked up as a submodule, as it was when the package
    imported its submodules eagerly: ``import onward.runtime.observability as o; o.server``.
    """
    namespace = sys.modules[package].__dict__

    def lookup(name: str) -> object:
        if name not in exports:
            return submodule(name)
        module, attribute = exports[name]
        value = getattr(import_module(module, package), attribute)
        namespace[name] = value
        return value

    def submodule(name: str) -> ModuleType:
        missing = AttributeError(f"module {package!r} has no attribute {name!r}")
        if name.startswith("__"):
            raise missing  # a tool probing for a dunder: never a submodule
        try:
            return import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise  # the submodule exists and an import of its own failed
            raise missing from None

    def listing() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return lookup, listing


def functions_over_submodules(package: str, *names: str) -> None:
    """Keep each of ``names`` in ``package`` the function its submodule of the same name
    defines, once that submodule is imported: the import system sets a package's attribute to
    each submodule it loads, which would shadow a lazily exported function of that name."""

    class Package(ModuleType):
        def __setattr__(self, name: str, value: object) -> None:
            if name in names and isinstance(value, ModuleType):
                value = getattr(value, name)
            super().__setattr__(name, value)

    sys.modules[package].__class__ = Package
