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
