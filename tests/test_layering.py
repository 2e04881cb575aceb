"""Dependencies point down (docs/design.md, decision 7): kernels ← common ← cloud, edge ← apps ←
bench. `apps` holds the programs that drive both tiers (kvctl, the demos); the benchmark sits
on top and plugs its commands into kvctl through an entry point.

Every import in every module — at the top or inside a function — is parsed; importing a layer
above, or the other tier (cloud ↔ edge), fails. A subprocess checks what starting the edge
daemon's command really loads.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYER = {"kernels": 0, "common": 1, "cloud": 2, "edge": 2, "apps": 3, "bench": 4}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `import kvedge.X...` / `from kvedge.X... import` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return [(line, mod) for line, mod in found if mod.startswith("kvedge.")]


def violations(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imports_of(path):
            target = module.split(".")[1]
            if target not in LAYER or target == package:
                continue
            if LAYER[target] >= LAYER[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("package", sorted(LAYER))
def test_no_upward_or_sideways_imports(package):
    assert violations(package) == []


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    fake = tmp_path / "common"
    fake.mkdir()
    (fake / "bad.py").write_text("def f():\n    from kvedge.edge.engine import EdgeEngine\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations("common") == ["common/bad.py:2 imports kvedge.edge.engine"]


def test_the_edge_command_loads_no_cloud_or_bench_code():
    code = ("import sys; import kvedge.edge.cli, kvedge.edge.server, kvedge.edge.engine, "
            "kvedge.edge.sync; print(sorted({m.split('.')[1] for m in sys.modules "
            "if m.startswith('kvedge.')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "['common', 'edge', 'kernels']" or out.strip() == "['common', 'edge']"


def runtime_privates() -> set[str]:
    """The names of `Runtime`'s private methods and attributes (`_x`, not dunders)."""
    tree = ast.parse((ROOT / "common" / "model" / "runtime.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Runtime")
    names = {n.name for n in ast.walk(cls) if isinstance(n, ast.FunctionDef)}
    names |= {t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Attribute)}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_nothing_outside_the_runtime_touches_its_privates():
    """The runtime's contract is its public methods (forward, prefill, layer, ...): one
    execution path (`Decoding.start`) for everything that answers, none re-implemented."""
    private = runtime_privates()
    assert "_logits" in private
    found = []
    for package in LAYER:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "common" / "model" / "runtime.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr in private:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert found == []
