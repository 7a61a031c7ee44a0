"""The package ``__init__`` files export their names lazily (PEP 562): importing
``prefect_baton`` or the server's supervisor module loads no database, Redis or web
framework code, and every exported name still resolves to its defining module's object."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import prefect_baton
import prefect_baton.rest

HEAVY = ("sqlalchemy", "sqlmodel", "fastapi", "starlette", "redis", "pydantic", "prefect")


@pytest.mark.parametrize(
    "statement",
    ["import prefect_baton", "import prefect_baton.rest", "import prefect_baton.rest.__main__"],
)
def test_importing_the_package_loads_no_heavy_library(statement: str) -> None:
    """Checked in a new interpreter: none of the stores' or web framework's libraries is in
    ``sys.modules`` after the import."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


@pytest.mark.parametrize("package", [prefect_baton, prefect_baton.rest])
def test_every_exported_name_resolves(package: object) -> None:
    """Each name of ``__all__`` is an attribute, and (but for ``__version__`` and the
    constants) the object its defining module holds under that name."""
    for name in package.__all__:  # type: ignore[attr-defined]
        value = getattr(package, name)
        module = getattr(value, "__module__", None)
        if isinstance(module, str) and module.startswith("prefect_baton"):
            assert getattr(importlib.import_module(module), name) is value


def test_a_star_import_gets_every_name() -> None:
    """``from prefect_baton import *`` binds every name of ``__all__``."""
    namespace: dict[str, object] = {}
    exec("from prefect_baton import *", namespace)
    assert set(prefect_baton.__all__) <= namespace.keys()


def test_submodules_are_attributes_and_unknown_names_are_attribute_errors() -> None:
    """A public submodule is reachable as an attribute (as with an eager ``__init__``);
    a name that is neither exported nor a submodule raises ``AttributeError``, so
    ``hasattr`` and ``getattr(..., default)`` work."""
    assert prefect_baton.errors is importlib.import_module("prefect_baton.errors")
    assert prefect_baton.rest.keys is importlib.import_module("prefect_baton.rest.keys")
    with pytest.raises(AttributeError, match="no attribute 'Bton'"):
        prefect_baton.Bton  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(prefect_baton, "no_such_module")
    assert getattr(prefect_baton.rest, "__wrapped__", None) is None


@pytest.mark.parametrize("package", ["prefect_baton", "prefect_baton.rest"])
def test_dir_lists_the_exports_before_they_are_loaded(package: str) -> None:
    """In a new interpreter, ``dir()`` of the package (attribute completion, ``help()``)
    already lists every name of ``__all__``, and listing them imports none of them."""
    code = (
        f"import json, sys, {package} as p\n"
        "print(json.dumps([sorted(dir(p)), sorted(p.__all__), 'fastapi' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    listed, exported, loaded = json.loads(out.stdout)
    assert set(exported) <= set(listed)
    assert not loaded
