"""Names a package re-exports but imports on first use (PEP 562), so importing the package
loads only what its caller touches."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    ``exports`` maps each lazy name to the module (absolute, or relative to ``package``) and the
    attribute it is. A value imported once is kept in the package, so later lookups of it never
    come back here.
    """
    namespace = sys.modules[package].__dict__

    def lookup(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = exports[name]
        value = getattr(import_module(module, package), attribute)
        namespace[name] = value
        return value

    def listing() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return lookup, listing
