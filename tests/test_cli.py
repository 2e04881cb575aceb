"""The console commands, through click's runner (same code as the installed scripts)."""
import pytest
from click.testing import CliRunner

from kvedge.apps.kvctl import kvctl
from kvedge.edge.cli import main as kvedge_main


def test_models_lists_registry():
    out = CliRunner().invoke(kvctl, ["models"])
    assert out.exit_code == 0
    for name in ("smollm2-135m-instruct", "tiny-llama", "tiny-qwen3"):
        assert name in out.output
    # the widths by layer the default codec binds for Qwen (one digit a layer, 24 layers)
    assert "calibrated=true (kivi, rdq): key_layers=444544444545454454445554," in out.output


def test_model_verify_passes_and_fails_by_tolerance():
    ok = CliRunner().invoke(kvctl, ["model", "verify", "--model", "tiny-mistral"])
    assert ok.exit_code == 0, ok.output
    assert "full prefill" in ok.output and "8 greedy decode steps" in ok.output
    assert "8 static decode steps" in ok.output
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


def test_json_output_is_snake_case_with_int64_as_numbers():
    from kvedge.common.cli import proto_dict
    from kvedge.common.net.proto import kvedge_pb2 as pb

    info = pb.KBInfo(namespace="ns", kb="kb", n_tokens=2**40, segments=[
        pb.SegmentInfo(index=1, pack_id="ab", pack_bytes=123, fp16_bytes=456)])
    d = proto_dict(info)
    assert d["n_tokens"] == 2**40 and d["segments"][0]["pack_bytes"] == 123
    assert d["variants"] == [] and d["error"] == "" and "nTokens" not in d
    assert proto_dict(pb.AskRequest(options={"ratio": "0.2"}))["options"] == {"ratio": "0.2"}


def test_an_alternate_must_be_a_variant_of_a_served_kb(tmp_path):
    for spec in ("other@small", "docs"):
        out = CliRunner().invoke(kvedge_main, ["serve", "--kb", "docs", "--alternate", spec,
                                               "--state", str(tmp_path)])
        assert out.exit_code == 2 and "name a variant (KB@VARIANT) of a KB served" in out.output


def test_registry_options_are_choices_and_opts_parse():
    import click

    from kvedge.common.cli import parse_options

    out = CliRunner().invoke(kvedge_main, ["serve", "--kb", "x", "--strategy", "telepathy"])
    assert out.exit_code == 2 and "'telepathy' is not one of" in out.output
    assert "a3" in out.output and "recompute" in out.output
    assert parse_options(["ratio=0.3", " k = 7 "]) == {"ratio": "0.3", "k": "7"}
    with pytest.raises(click.BadParameter):
        parse_options(["ratio"])


def test_kvctl_help_names_what_it_does():
    out = CliRunner().invoke(kvctl, ["--help"])
    assert out.exit_code == 0
    for command in ("upload", "kb", "job", "ask", "cloud", "pack", "model", "demo", "bench"):
        assert f"\n  {command} " in out.output, command


def test_the_command_lines_start_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys, kvedge.apps.kvctl, kvedge.edge.cli; "
            "print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_progress_into_a_pipe_redraws_rarely_and_ends_at_the_last_poll():
    import io

    from kvedge.common.cli import PIPE_REDRAW_S, advance, progress_bar

    log = io.StringIO()  # not a terminal: a CI log, `kvctl upload ... 2> file`
    bar = progress_bar(file=log, desc="prefill", unit="seg")
    assert bar.mininterval == PIPE_REDRAW_S
    for done in range(201):  # a wait's polls, far quicker than PIPE_REDRAW_S
        advance(bar, done, 200 if done else None)  # the total arrives with the first reply
    bar.close()
    draws = log.getvalue().split("\r")
    assert len([d for d in draws if d.strip()]) <= 3  # the first draw, close's, not 200
    assert "200/200" in draws[-1]


def test_progress_on_a_terminal_keeps_tqdm_rate():
    import io

    from kvedge.common.cli import PIPE_REDRAW_S, advance, progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    bar = progress_bar(file=Terminal(), total=10, unit="B")
    assert bar.mininterval < PIPE_REDRAW_S
    advance(bar, 4)
    assert bar.n == 4 and bar.total == 10  # no total from the poll: the bar keeps its own
    bar.close()
