"""Where the edge's model runs (`kvedge serve --device`, `models.placed`): a device torch
cannot use here is a named error before any work; a placed model keeps the fingerprint its
packs are bound to. What the edge does on a real GPU is `python -m kvedge.bench.gpu_edge`'s
to measure (docs/gpu.md): CI has no GPU."""
import pytest
import torch
from click.testing import CliRunner

from kvedge.common.errors import DeviceUnavailable
from kvedge.common.model.models import check_device, load_model, placed
from kvedge.edge.cli import main as kvedge_main

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@pytest.mark.parametrize("device", ["bogus", "xla", "cuda:99"])
def test_a_device_torch_cannot_use_is_a_named_error(device):
    with pytest.raises(DeviceUnavailable, match="cpu"):
        check_device(device)


@no_cuda
def test_serve_refuses_a_missing_gpu_before_loading_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path))
    out = CliRunner().invoke(kvedge_main, ["serve", "--device", "cuda", "--address",
                                           "127.0.0.1:0", "--state", str(tmp_path), "--kb", "docs"])
    assert out.exit_code != 0 and "DeviceUnavailable" in out.output
    assert "Traceback" not in out.output


def test_a_placed_model_keeps_its_fingerprint_and_moves_its_weights():
    fresh = load_model("tiny-qwen2", cache=False)
    before = load_model("tiny-qwen2", cache=False).fingerprint
    moved = placed(fresh, "cpu", torch.bfloat16)
    assert moved.model.dtype == torch.bfloat16
    assert moved.fingerprint == before  # packs made from the fp32 weights still serve
    assert load_model("tiny-qwen2", cache=False).fingerprint == before
    assert placed(load_model("tiny-qwen2", cache=False)).model.dtype == torch.float32
