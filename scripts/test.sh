#!/usr/bin/env bash
# The README's test command: set-up, lint, format check, then the whole test suite.
# Without a GPU, tests marked `gpu` are skipped and kernels run under Triton's interpreter.
# pytest runs one worker per CPU core (pytest-xdist; PYTEST_WORKERS overrides, 0 runs in this
# process); each test file stays on one worker, so a module's fixtures are built once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/ci_tools.sh
VPY=.venv/bin/python
echo "== ruff check"
"$VPY" -m ruff check .
echo "== ruff format --check"
"$VPY" -m ruff format --check .
echo "== pytest"
"$VPY" -m pytest -n "${PYTEST_WORKERS:-auto}" --dist loadfile "$@"
