"""Regenerate the committed protobuf/gRPC modules from kvedge.proto.

    python -m kvedge.common.net.proto.generate          # rewrite kvedge_pb2*.py here
A test regenerates into a temporary folder and checks the committed files match.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
PACKAGE = Path("kvedge/common/net/proto")  # generated imports: `from kvedge.common.net.proto`
OUTPUTS = ("kvedge_pb2.py", "kvedge_pb2_grpc.py", "kvedge_pb2.pyi")


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / PACKAGE
        src.mkdir(parents=True)
        shutil.copy(HERE / "kvedge.proto", src / "kvedge.proto")
        code = protoc.main(["protoc", f"-I{tmp}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                            f"--grpc_python_out={tmp}", str(src / "kvedge.proto")])
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        out_dir.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy(src / name, out_dir / name)) for name in OUTPUTS]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(path)
