"""Daemon configuration (common/config.py): flag > KVEDGE_* environment > TOML file > default,
checked through the real daemon commands' parse and `kvctl config show`."""
import json

import click
import pytest
from click.testing import CliRunner

from kvedge.apps.kvctl import kvctl
from kvedge.cloud.cli.gateway import cloud_up
from kvedge.common.config import ConfigError, configurable, daemons, effective
from kvedge.edge.cli import main as kvedge_main
from kvedge.edge.cli import serve_cmd


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """An empty $KVEDGE_HOME and no KVEDGE_* configuration from the outside."""
    import os

    for name in [n for n in os.environ if n.startswith("KVEDGE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path))
    return tmp_path


def write(path, text):
    path.write_text(text)
    return path


def settings(command, args=()):
    path, found = effective(command, args)
    return path, {s.key: (s.shown(), s.source) for s in found}


def test_flag_over_environment_over_file_over_default(home, monkeypatch):
    write(home / "config.toml", '[edge.serve]\nkb = ["reg"]\ntop-k = 5\nmax_new_tokens = 32\n'
          'strategy = "recompute"\n')
    monkeypatch.setenv("KVEDGE_EDGE_SERVE_MAX_NEW_TOKENS", "64")
    monkeypatch.setenv("KVEDGE_EDGE_SERVE_STRATEGY", "pie")
    path, got = settings(serve_cmd, ["--strategy", "sparsex"])
    assert path == home / "config.toml"  # the default location, when present
    assert got["sync-interval"] == (5.0, "default")
    assert got["top-k"] == (5, "config file")
    assert got["max-new-tokens"] == (64, "environment")
    assert got["strategy"] == ("sparsex", "flag")
    assert got["kb"] == (["reg"], "config file")


def test_the_daemon_runs_with_the_values_shown(tmp_path_factory):
    """The decorator is generic: a command's callback gets the merged values."""
    seen = {}

    @configurable("edge.serve")
    @click.command()
    @click.option("--top-k", default=3)
    @click.option("--kb", "kbs", multiple=True)
    @click.option("--anchored/--alone", default=False)
    def toy(top_k, kbs, anchored):
        seen.update(top_k=top_k, kbs=kbs, anchored=anchored)

    config = write(tmp_path_factory.mktemp("etc") / "config.toml",
                   '[edge.serve]\ntop-k = 4\nkb = "single"\nanchored = true\n')
    out = CliRunner().invoke(toy, ["--config", str(config)],
                             env={"KVEDGE_EDGE_SERVE_KB": "a b@v"})
    assert out.exit_code == 0, out.output
    assert seen == {"top_k": 4, "kbs": ("a", "b@v"), "anchored": True}
    CliRunner().invoke(toy, ["--config", str(config), "--alone"])
    assert seen == {"top_k": 4, "kbs": ("single",), "anchored": False}


@pytest.mark.parametrize("text,match", [
    ("[edge.serve]\nsync-intervl = 3\n", "no key 'sync-intervl' .*did you mean 'sync-interval'"),
    ("[edge.serv]\nkb = 'x'\n", r"unknown table or key 'edge.serv'.*did you mean \[edge.serve\]"),
    ("verbose = true\n", "unknown table or key 'verbose'"),
    ("[edge.serve]\ntop-k = 'many'\n", "top-k = 'many': 'many' is not a valid integer"),
    ("[edge.serve\n", "not valid TOML"),
])
def test_a_bad_file_is_a_named_error_naming_it(home, text, match):
    config = write(home / "config.toml", text)
    with pytest.raises(ConfigError, match=match):
        effective(serve_cmd)
    out = CliRunner().invoke(kvedge_main, ["serve"])  # the daemon refuses before any work
    assert out.exit_code == 2 and "ConfigError" in out.output and str(config) in out.output
    assert "Traceback" not in out.output


def test_each_daemon_reads_its_own_table(home):
    """[cloud.up] keys are the gateway's; the edge accepts the table without reading it."""
    write(home / "config.toml", "[cloud.up]\nsegment-tokens = 256\nanchored = true\n"
          "[edge.serve]\nkb = ['reg']\n")
    _, cloud = settings(cloud_up)
    assert cloud["segment-tokens"] == (256, "config file")
    assert cloud["anchored"] == (True, "config file")
    _, edge = settings(serve_cmd)
    assert edge["kb"] == (["reg"], "config file") and "segment-tokens" not in edge


def test_config_flag_and_environment_choose_the_file(home, tmp_path_factory, monkeypatch):
    other = write(tmp_path_factory.mktemp("etc") / "edge.toml", "[edge.serve]\ntop-k = 2\n")
    write(home / "config.toml", "[edge.serve]\ntop-k = 9\n")
    monkeypatch.setenv("KVEDGE_CONFIG", str(other))
    assert settings(serve_cmd)[1]["top-k"] == (2, "config file")
    assert settings(serve_cmd, ["--config", str(home / "config.toml")])[1]["top-k"][0] == 9
    with pytest.raises(ConfigError, match="cannot read the config file"):
        effective(serve_cmd, ["--config", str(home / "missing.toml")])


def test_config_show_prints_values_and_sources(home, monkeypatch):
    write(home / "config.toml", '[edge.serve]\nkb = ["reg"]\ncloud-token = "kve_secret"\n'
          'http = "127.0.0.1:8000"\n')
    monkeypatch.setenv("KVEDGE_EDGE_SERVE_TOP_K", "7")
    out = CliRunner().invoke(kvctl, ["config", "show", "--json"])
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)
    assert set(shown) == {"cloud.up", "edge.serve"}
    edge = shown["edge.serve"]
    assert edge["config_file"] == str(home / "config.toml")
    assert edge["settings"]["http"] == {"value": "127.0.0.1:8000", "source": "config file",
                                        "env": "KVEDGE_EDGE_SERVE_HTTP"}
    assert edge["settings"]["top-k"]["value"] == 7
    assert edge["settings"]["top-k"]["source"] == "environment"
    assert edge["settings"]["cloud-token"]["value"] == "<set>"  # secrets are not printed
    assert shown["cloud.up"]["settings"]["address"]["source"] == "default"

    text = CliRunner().invoke(kvctl, ["config", "show", "edge.serve", "--top-k", "9"])
    assert text.exit_code == 0, text.output
    assert text.output.startswith(f"[edge.serve]  # from {home / 'config.toml'}")
    lines = {line.split()[0]: line for line in text.output.splitlines()[1:] if line}
    assert lines["top-k"].endswith("# flag") and "= 9" in lines["top-k"]
    assert lines["http"].endswith("# config file")
    assert "kve_secret" not in text.output
    assert "[cloud.up]" not in text.output


def test_config_show_comments_unset_options_out_and_refuses_bad_sections(home):
    out = CliRunner().invoke(kvctl, ["config", "show", "edge.serve"])
    assert out.exit_code == 0, out.output
    assert "no config file" in out.output
    lines = out.output.splitlines()
    assert any(line.startswith("# kb =") for line in lines)  # --kb or --pin: neither required
    assert any(line.startswith("# pin =") for line in lines)
    bad = CliRunner().invoke(kvctl, ["config", "show", "edge.serv"])
    assert bad.exit_code == 2 and "cloud.up, edge.serve" in bad.output
    write(home / "config.toml", "[edge.serve]\nkbs = ['x']\n")
    bad = CliRunner().invoke(kvctl, ["config", "show"])
    assert bad.exit_code == 2 and "ConfigError" in bad.output and "'kbs'" in bad.output


def test_a_missing_required_option_is_reported_not_raised(home):
    @configurable("edge.serve")
    @click.command()
    @click.option("--kb", "kbs", multiple=True, required=True)
    def toy(kbs):
        pass

    assert settings(toy)[1]["kb"][1] == "missing"


def test_every_daemon_entry_point_is_configurable_under_its_name():
    found = daemons()
    assert set(found) == {"cloud.up", "edge.serve"}
    for section, command in found.items():
        assert command.config_section == section
        assert any(p.name == "config" for p in command.params)
