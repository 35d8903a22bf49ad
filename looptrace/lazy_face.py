"""How a package's face hands out its public names without importing them up front (PEP 562).

A face lists each public name with the module that defines it; the module is imported the first time someone asks
for one of its names, so ``import looptrace`` or ``looptrace detect`` pays only for what it uses. Each face calls
:func:`lazy_face` once and binds what it returns as its module ``__getattr__`` and ``__dir__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

__all__ = ["lazy_face"]


def lazy_face(package: str, homes: Mapping[str, str], renamed: Mapping[str, tuple[str, str]] | None = None,
              ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the face of ``package``.

    ``homes`` maps each public name to the module that defines it, as ``importlib.import_module(home, package)``
    reads it: relative (``".setup"``, ``"..logs"``) or absolute. ``renamed`` maps a public name to a module
    and the name it has there: for a function named like its own module, which the package cannot hand out under
    that name (importing a submodule binds the package's attribute of that name to the submodule).
    """
    aliases = renamed or {}
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> object:
        home, attribute = aliases.get(name) or (homes.get(name), name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), attribute)
        namespace[name] = value  # later look-ups find it without this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes, *aliases})

    return __getattr__, __dir__
