"""The console commands, through click's runner (same code as the installed scripts)."""
from click.testing import CliRunner

from kvedge.cloud.cli import kvctl
from kvedge.edge.cli import main as kvedge_main


def test_models_lists_registry():
    out = CliRunner().invoke(kvctl, ["models"])
    assert out.exit_code == 0
    for name in ("smollm2-135m-instruct", "tiny-llama", "tiny-qwen3"):
        assert name in out.output


def test_model_verify_passes_and_fails_by_tolerance():
    ok = CliRunner().invoke(kvctl, ["model", "verify", "--model", "tiny-mistral"])
    assert ok.exit_code == 0, ok.output
    assert "full prefill" in ok.output and "8 greedy decode steps" in ok.output
    strict = CliRunner().invoke(kvctl, ["model", "verify", "--model", "tiny-mistral",
                                        "--tolerance", "0"])
    assert strict.exit_code == 1 and "FAIL" in strict.output


def test_unknown_model_is_one_clear_line():
    out = CliRunner().invoke(kvctl, ["model", "verify", "--model", "nope"])
    assert out.exit_code == 2
    assert "UnknownModel" in out.output and "Traceback" not in out.output


def test_kvedge_generate_streams_text():
    out = CliRunner().invoke(kvedge_main, ["generate", "hello", "--model", "tiny-llama",
                                           "--max-new-tokens", "5"])
    assert out.exit_code == 0, out.output
    assert "[5 tokens" in out.output or "tokens," in out.output
