"""The edge's device run (`kvedge.bench.gpu_edge`) on a CPU with the tiny model's config and
tokenizer: every strategy answers through `EdgeEngine`, the graph-decode setting (eager on
the CPU) gives the same answers, and the tables are built (a GPU session runs it whole)."""
import json

from kvedge.bench.gpu_edge import STRATEGIES, main
from kvedge.common.model.models import TINY_CONFIGS
from kvedge.common.model.tokenizer import tiny_tokenizer


def test_the_edge_device_run_answers_on_the_cpu(tmp_path):
    files = tmp_path / "files"
    TINY_CONFIGS["tiny-llama"]().save_pretrained(str(files))
    tiny_tokenizer().save_pretrained(str(files))
    rc = main(["--model-files", str(files), "--quick", "--max-new-tokens", "6",
               "--out", str(tmp_path / "out")])
    result = json.loads((tmp_path / "out" / "gpu_edge.json").read_text())
    assert rc == 0, [s.get("error") for s in result["settings"]]
    cpu, static = result["settings"]
    assert static["graph"] and static["graph_steps"] > 0 and not cpu["graph_steps"]
    for strategy in STRATEGIES:
        assert [a["answer"] for a in static[strategy]] == [a["answer"] for a in cpu[strategy]]
        assert all(a["tokens"] > 0 and a["phases"] for a in cpu[strategy])
    assert cpu["together_same_as_alone"] == 3 and not cpu["together_errors"]
