import os
import uuid

# Triton has no CPU backend: kernels run in its interpreter, which reads this at import time.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

TINY = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"]


def pytest_configure(config):
    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def smollm2():
    from kvedge.common.model.models import load_model

    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_rt(smollm2):
    from kvedge.common.model.runtime import Runtime

    return Runtime(smollm2)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server on a free loopback port, in its own process, with one bucket
    (tests/s3server.py); stopped when the session ends."""
    from s3server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture()
def s3_url(s3_server, monkeypatch):
    """A fresh `s3://` store URL on the test server, the AWS settings pointing at it."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server.url(uuid.uuid4().hex[:12])


def tiny_runtime(name):
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime

    return Runtime(load_model(name))
