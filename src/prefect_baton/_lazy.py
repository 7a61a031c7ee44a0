"""Lazy exports for a package ``__init__`` (PEP 562): a name is imported from its module on
first access, so ``import prefect_baton`` (and ``prefect_baton.rest``) loads no database,
Redis or web framework code until a name that needs it is used.

Why: ``baton serve --workers N`` replaces itself with a supervisor process that imports only
the standard library, uvicorn and :mod:`prefect_baton.rest.__main__`; with eager package
``__init__`` files that import alone loaded the whole client (the supervisor, which serves
no request, held about 112 MB resident; now about 26 MB).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports", "listing"]


def exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` (``str``, its ``__name__``) that imports
    ``name`` from the module ``names[name]`` (a dotted module name) on first access and
    keeps it in the package's namespace; a public submodule (``package.<name>``) is
    imported on access as well, as an eager ``__init__`` would have done.

    Raises (from the returned function):
        AttributeError: ``name`` is neither exported nor a submodule of ``package``.
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        namespace = sys.modules[package].__dict__
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        elif not name.startswith("__"):
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    return __getattr__


def listing(package: str) -> Callable[[], list[str]]:
    """A module ``__dir__`` for ``package`` (``str``, its ``__name__``): the names already in
    its namespace and those of its ``__all__``, sorted (``list[str]``), so ``dir()``, ``help()``
    and attribute completion show the lazy exports before their first access. Imports
    nothing."""

    def __dir__() -> list[str]:
        namespace = sys.modules[package].__dict__
        return sorted({*namespace, *namespace.get("__all__", ())})

    return __dir__
