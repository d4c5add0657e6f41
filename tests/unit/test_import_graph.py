"""The project's import graph, read from the source (every import statement, at module level or inside a
function): layered, with no cycle anywhere and no arrow out of the engine core.

The engine core (server/core/) is the part every other one builds on: it may import models/ (the
inference core: bundles, ONNX Runtime sessions, the slot cache) and itself, nothing else of the project,
and never grpc (it runs in the engine core process, which loads no grpc). A cycle, even one held apart
by a lazy import inside a function, is two modules that cannot be read, tested or moved one without the
other. Type-only imports (under `if TYPE_CHECKING:`) run nowhere and are not arrows.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("server", "models", "export", "client", "protos", "benchmarks")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path) -> set[str]:
    """Every dotted name module `name` imports (absolute; relative imports resolved), third-party included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (a name imported from a package is that package's module)."""
    known = modules()

    def resolve(dotted: str) -> str:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted
    return {name: {m for m in (resolve(d) for d in imported(name, path)) if m and m != name}
            for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walker_sees_a_cycle_and_an_arrow():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    edges = graph()
    assert "server.core.scheduler" in edges["server.core.loop"]  # a plain import is seen
    assert "models.core.bundle" in edges["server.frontend.server"]


def test_no_cycle_anywhere_in_the_project():
    assert cycles(graph()) == []


def test_the_engine_core_imports_nothing_of_the_project_but_models_and_itself_and_no_grpc():
    outside = {}
    for name, path in modules().items():
        if not (name == "server.core" or name.startswith("server.core.")):
            continue
        names = imported(name, path)
        wrong = sorted(n for n in names if n.split(".")[0] in PACKAGES and not (
            n == "server.core" or n.startswith(("server.core.", "models."))) or n.split(".")[0] == "grpc")
        if wrong:
            outside[name] = wrong
    assert outside == {}
