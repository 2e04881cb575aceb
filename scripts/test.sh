#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on CPU. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup.sh
export TRITON_INTERPRET=1   # Triton kernels run in its CPU interpreter
exec python -m pytest tests "$@"
