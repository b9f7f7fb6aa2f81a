#!/usr/bin/env bash
# Set-up shared by the README's two commands: a virtual environment in .venv with the
# project (editable) and its test and bench extras. Idempotent; safe to re-run.
#
# On a GPU host the environment sees the host's preinstalled CUDA torch and triton
# (--system-site-packages); elsewhere it gets the CPU build of torch and the Triton
# that the GPU host runs, so the interpreter and the GPU run the same Triton.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        echo "bootstrap: CUDA torch found on the host; .venv reuses it"
        "$PY" -m venv --system-site-packages .venv
    else
        "$PY" -m venv .venv
    fi
fi
VPY=.venv/bin/python
if ! "$VPY" -c 'import torch, triton' 2>/dev/null; then
    "$VPY" -m pip install -q "torch==2.13.0" "triton==3.6.0"
fi
"$VPY" -m pip install -q -e ".[test,bench]"
"$VPY" -c 'import torch, triton; print(f"bootstrap: torch {torch.__version__}, triton {triton.__version__}, cuda={torch.cuda.is_available()}")'
