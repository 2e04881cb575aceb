"""No import cycles between kvedge's modules, in any layer.

Every `kvedge.*` import of every module — at the top, inside a function, absolute or relative —
is an edge from the importing module to the module it names; a cycle in that graph fails the
test and is named with the file and line of each of its imports. A lazy (function-level) import
still counts: a cycle that only works because one side imports late is a tangle a reader must
untie by hand.

Edges go to the module named, not to the packages above it: every submodule of a registry
package (`edge/strategies/`, `cloud/eviction/`) runs its package's `__init__` first, which
imports it back, and that is how registration works, not a cycle anyone wrote. `from pkg import
name` goes to `pkg.name` when that is a submodule, else to `pkg`, and also to the submodule
that `pkg` exports `name` from lazily (its `_EXPORTS` table, see `kvedge.common.pack`). Imports
under `if TYPE_CHECKING:` never run and are left out.
"""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kernels", "common", "cloud", "edge", "bench", "apps")

Edge = tuple[str, str, str]  # (imported module, file, line) for one import statement
# cycles waiting on a file another change owns: {modules: why}; each must still be there (a
# fixed one is taken off), and no other cycle may appear
KNOWN_CYCLES: dict = {}  # a cycle that must stay for now: its modules → why


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("kvedge",) + parts)


def module_path(name: str) -> Path | None:
    """The file of module `kvedge.a.b`, or None when no such module is in the tree."""
    base = ROOT.joinpath(*name.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if name.count(".") and path.is_file():
            return path
    return None


def lazy_exports(package: str) -> dict[str, str]:
    """`name -> submodule` of a package that re-exports lazily through an `_EXPORTS` dict."""
    path = module_path(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)):
            pairs = zip(node.value.keys, node.value.values)
            return {k.value: f"{package}.{v.value}" for k, v in pairs
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def runtime_imports(node: ast.AST):
    """Every import statement under `node` except those under `if TYPE_CHECKING:`."""
    children = node.orelse if type_checking_only(node) else ast.iter_child_nodes(node)
    for child in children:
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from runtime_imports(child)


def type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in (getattr(test, "id", None),
                                                             getattr(test, "attr", None))


def absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a `from ... import` names (resolves `from . import x`)."""
    if not node.level:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def targets(node: ast.AST, importer: str, is_package: bool) -> list[str]:
    """Modules one import statement loads, by the rules in the module docstring."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    source = absolute(node, importer, is_package)
    found = []
    for alias in node.names:
        if module_path(f"{source}.{alias.name}"):
            found.append(f"{source}.{alias.name}")
            continue
        found.append(source)
        if alias.name in lazy_exports(source):
            found.append(lazy_exports(source)[alias.name])
    return found


def import_graph(packages=PACKAGES) -> dict[str, list[Edge]]:
    """module -> [(imported module, file, line)] over every kvedge import in the tree."""
    graph = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            name, rel = module_name(path), str(path.relative_to(ROOT))
            edges = graph.setdefault(name, [])
            for node in runtime_imports(ast.parse(path.read_text(), rel)):
                for target in targets(node, name, path.name == "__init__.py"):
                    if target.startswith("kvedge.") and target != name and module_path(target):
                        edges.append((target, rel, str(node.lineno)))
    return graph


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's components with more than one module (each holds at least one cycle)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _, _ in graph.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def shortest_cycle(graph: dict[str, list[Edge]], component: list[str]) -> str:
    """The shortest cycle through the component's first module, each import with file:line."""
    start, members = component[0], set(component)
    came_from = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target, rel, line in graph[node]:
                if target == start:
                    hops = [f"{node} ({rel}:{line})"]
                    while came_from[node]:
                        node, rel_line = came_from[node]
                        hops.append(f"{node} ({rel_line})")
                    return " -> ".join(reversed(hops)) + f" -> {start}"
                if target in members and target not in came_from:
                    came_from[target] = (node, f"{rel}:{line}")
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")


def cycles(packages=PACKAGES, known=()) -> list[str]:
    """One cycle, named, per tangle of modules that import each other (`known` ones left out)."""
    graph = import_graph(packages)
    return [shortest_cycle(graph, component) for component in strongly_connected(graph)
            if frozenset(component) not in known]


def test_no_import_cycles():
    assert cycles(known=KNOWN_CYCLES) == []


def test_every_known_cycle_is_still_there():
    found = {frozenset(c) for c in strongly_connected(import_graph())}
    assert [sorted(c) for c in KNOWN_CYCLES if c not in found] == [], \
        "fixed: take it off KNOWN_CYCLES"


def test_the_check_names_a_cycle_through_a_lazy_relative_import(tmp_path, monkeypatch):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    (tmp_path / "bench" / "a.py").write_text("import os\nfrom kvedge.bench.b import f\n")
    (tmp_path / "bench" / "b.py").write_text("def f():\n    from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert cycles(("bench",)) == [
        "kvedge.bench.a (bench/a.py:2) -> kvedge.bench.b (bench/b.py:2) -> kvedge.bench.a"]


def test_a_package_importing_its_registered_submodules_is_no_cycle(tmp_path, monkeypatch):
    (tmp_path / "edge").mkdir()
    (tmp_path / "edge" / "__init__.py").write_text("from kvedge.edge import one\n")
    (tmp_path / "edge" / "base.py").write_text("")
    (tmp_path / "edge" / "one.py").write_text("from kvedge.edge.base import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert cycles(("edge",)) == []


def test_a_lazy_reexport_leads_to_the_submodule(tmp_path, monkeypatch):
    (tmp_path / "common" / "pack").mkdir(parents=True)
    (tmp_path / "common" / "__init__.py").write_text("")
    (tmp_path / "common" / "pack" / "__init__.py").write_text("_EXPORTS = {'Pack': 'fmt'}\n")
    (tmp_path / "common" / "pack" / "fmt.py").write_text("from kvedge.common import util\n")
    (tmp_path / "common" / "util.py").write_text(
        "def f():\n    from kvedge.common.pack import Pack\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert cycles(("common",)) == [
        "kvedge.common.pack.fmt (common/pack/fmt.py:1) -> kvedge.common.util (common/util.py:2) "
        "-> kvedge.common.pack.fmt"]


def test_imports_only_a_type_checker_runs_are_no_cycle(tmp_path, monkeypatch):
    (tmp_path / "edge").mkdir()
    (tmp_path / "edge" / "a.py").write_text("from typing import TYPE_CHECKING\n"
                                            "if TYPE_CHECKING:\n    from kvedge.edge import b\n")
    (tmp_path / "edge" / "b.py").write_text("from kvedge.edge import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert cycles(("edge",)) == []
