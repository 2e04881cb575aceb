"""`kvctl demo` end to end: gateway and edge as child processes (real gRPC on loopback, Ray in
the gateway), a small KB, asked with recompute and with the edge's default strategy."""
import json
from pathlib import Path

from kvedge.apps.demo import run_demo
from kvedge.edge import DEFAULT_STRATEGY


def test_demo_answers_with_recompute_and_the_edge_default(tmp_path):
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "alpha.md").write_text("Alpha facts. The alpha code is 1234567.\n")
    (kb / "beta.txt").write_text("Beta facts. Beta has a bridge of copper.\n")
    (kb / "questions.json").write_text(json.dumps(
        [{"question": "What is the alpha code?", "answers": ["1234567"]}]))
    lines: list[str] = []
    run_demo("tiny-llama", echo=lines.append, kb_dir=kb)  # random weights: answers are noise
    out = "\n".join(lines)
    assert "uploaded 2 files" in out and "2 segments" in out
    assert f"correct: recompute 0/1, {DEFAULT_STRATEGY} " in out or \
        f"correct: recompute 1/1, {DEFAULT_STRATEGY} " in out
    assert f"({DEFAULT_STRATEGY} / recompute = " in out and "KV loaded per answer" in out
    root = out.split("data in ", 1)[1].split(")", 1)[0]
    assert not Path(root).exists()  # its processes stopped, its files removed (not --keep)
