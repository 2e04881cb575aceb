"""The committed protobuf/gRPC modules are exactly what kvedge.proto generates."""
from pathlib import Path

from kvedge.common.net.proto import generate


def test_generated_code_matches_the_proto(tmp_path):
    here = Path(generate.__file__).parent
    for path in generate.generate(tmp_path):
        assert path.read_bytes() == (here / path.name).read_bytes(), (
            f"{path.name} is stale: run `python -m kvedge.common.net.proto.generate`")
