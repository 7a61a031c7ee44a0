"""No import cycles among the modules of ``prefect_baton``, and the layers import downwards.

Every module is parsed with :mod:`ast`; each import (at module level or inside a function,
except under ``if TYPE_CHECKING:``) is resolved to the package modules it loads: for
``from a.b import c`` the module ``a.b.c`` when it is one, else ``a.b``; and importing
``a.b.c`` also runs the ``__init__`` of ``a`` and of ``a.b``. A cycle in that graph is an
import that can find a half-initialised module depending on which module is imported first.
"""

from __future__ import annotations

import ast
from pathlib import Path

import prefect_baton

PACKAGE = "prefect_baton"
ROOT = Path(prefect_baton.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` at any depth, skipping ``if TYPE_CHECKING:`` bodies
    (their ``else`` branch counts)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _ancestors(module: str) -> set[str]:
    """The packages containing ``module`` (initialised before ``module`` runs)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _loads(name: str, modules: dict[str, Path], importer: str) -> set[str]:
    """What importing module ``name`` from ``importer`` runs: ``name`` and the ``__init__``
    of its packages, except the importer's own packages (already initialised)."""
    return ({name} | (_ancestors(name) - _ancestors(importer))) & modules.keys()


def _targets(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The package modules ``node`` (in ``module``) loads."""
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith(PACKAGE):
                out |= _loads(alias.name, modules, module)
        return out
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if modules[module].name == "__init__.py" else 0)
        base = ".".join([*parts[:keep], *([base] if base else [])])
    if not base.startswith(PACKAGE):
        return out
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out |= _loads(sub if sub in modules else base, modules, module)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (itself excluded)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps: set[str] = set()
        for node in _imports(tree):
            deps |= _targets(name, node, modules)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return out


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"  {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "\n".join([", ".join(component), *edges])


def test_graph_sees_function_level_and_parent_imports() -> None:
    """The resolver counts imports inside functions and the ``__init__`` of the packages
    they load, and skips ``if TYPE_CHECKING:`` imports."""
    graph = import_graph()
    factory = graph["prefect_baton._stores.factory"]
    # inside open_stores: the authority module and its package's __init__
    assert {"prefect_baton._stores.redis.authority", "prefect_baton._stores.redis"} <= factory
    # ``from prefect_baton._rules import core``: the module, not only the package
    assert "prefect_baton._rules.core" in graph["prefect_baton._stores.ledger.leases"]
    # base.py names RedisAuthority under TYPE_CHECKING only
    assert "prefect_baton._stores.redis.authority" not in graph["prefect_baton._stores.redis.base"]


def test_cycles_finds_strongly_connected_components() -> None:
    """:func:`cycles` reports each cycle once, as its sorted members."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    """The import graph of the package is acyclic."""
    graph = import_graph()
    found = cycles(graph)
    report = "\n\n".join(_describe(c, graph) for c in found)
    print(report)
    assert not found, f"import cycles:\n{report}"


_LAYERS = {
    # a layer may import only the layers listed (and itself)
    # errors use the models' wire form of a time (``models.wire_time``); models import nothing
    "errors": {"errors", "models"},
    "models": {"models"},
    "_settings": {"_settings", "errors"},
    # random ids from the process's pool of os.urandom bytes; imports nothing of ours
    "_ids": {"_ids"},
    "_rules": {"_rules", "errors", "models"},
    "_stores": {"_stores", "_rules", "errors", "models", "_settings", "_ids"},
    "_client": {"_client", "_stores", "_rules", "errors", "models", "_settings", "metrics", "_ids"},
    # the client records its operations (metrics._state, metrics._calls); the gauges read
    # the stores at scrape time
    "metrics": {"metrics", "_stores", "_rules", "errors", "models", "_settings"},
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_layers_import_downwards() -> None:
    """Surfaces -> ``_client`` -> ``_stores`` -> ``_rules`` -> errors/models: a store never
    imports the client or a surface, the rules import no store or client."""
    graph = import_graph()
    bad = [
        f"{module} -> {dep}"
        for module, deps in sorted(graph.items())
        if _layer(module) in _LAYERS
        for dep in sorted(deps)
        if _layer(dep) and _layer(dep) not in _LAYERS[_layer(module)]
    ]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)
