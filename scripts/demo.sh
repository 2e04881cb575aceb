#!/usr/bin/env bash
# Set up (idempotent) and run the demo on the embedded SmolLM2-135M-Instruct. Extra arguments
# go to `kvctl demo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup.sh
exec kvctl demo "$@"
