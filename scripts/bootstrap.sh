#!/usr/bin/env bash
# Set-up shared by the README's two commands: a virtual environment in .venv with the
# project (editable) and its test and bench extras. Idempotent; safe to re-run.
#
# torch and Triton, by host:
#   - GPU host (an NVIDIA device node, /dev/nvidia0 ...): .venv reuses the host's CUDA build
#     of torch and its Triton, wherever they live (a venv, a conda env, the system or user
#     site). It is made with the interpreter that holds them, and a .pth file appends that
#     interpreter's site directories (tools/asv_host_site.py, the mechanism asv's
#     environments use). The project install is constrained to those versions, so pip never
#     replaces them; with no CUDA torch anywhere it stops and says what to install.
#   - CPU host: .venv gets the CPU build of torch 2.13.0 and the Triton the GPU host runs
#     (3.6.0), so the interpreter and the GPU run the same Triton. An existing pip
#     configuration (index or find-links) is honoured; otherwise torch comes from PyTorch's
#     CPU wheel index (PyPI's default torch is a CUDA build of several GB).
#
# Environment:
#   PYTHON=/path/to/python      the interpreter to use (on a GPU host: the one with CUDA torch)
#   ATTNBENCH_GPU_HOST=1|0      override the device-node test
#   ATTNBENCH_SKIP_INSTALL=1    stop after .venv and torch (used by the tests)
set -euo pipefail
cd "$(dirname "$0")/.."

CPU_TORCH=2.13.0
CPU_TRITON=3.6.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
VENV=.venv
VPY=$VENV/bin/python

# shellcheck source=scripts/host.sh
. scripts/host.sh

# Exit 0 when interpreter $1 imports a CUDA build of torch and Triton.
has_cuda_torch() {
    "$1" -c 'import sys, torch, triton; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null
}

# Interpreters that may hold the host's torch, most specific first.
candidates() {
    local c
    for c in "${PYTHON:-}" "${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}" \
        "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" python3 python; do
        [ -n "$c" ] && command -v "$c" 2>/dev/null || true
    done | awk '!seen[$0]++'
}

# pip already has a source configured (index, extra index or find-links, from a config file
# or the environment): use it as it is. The listing is read whole before it is searched: a
# `grep -q` in a pipe stops reading at its first match, and under pipefail the listing's
# broken pipe would read as "not configured".
pip_configured() {
    local config
    config=$("$VPY" -m pip config list 2>/dev/null) || return 1
    grep -Eq '(^|\.)(index-url|extra-index-url|find-links)=' <<<"$config"
}

if gpu_host; then
    HOST_PY=""
    while read -r c; do
        if has_cuda_torch "$c"; then HOST_PY=$c; break; fi
    done < <(candidates)
    if [ -z "$HOST_PY" ]; then
        cat >&2 <<MSG
bootstrap: this is a GPU host (NVIDIA device nodes), but no interpreter here imports a
CUDA build of torch with Triton. Tried: $(candidates | tr '\n' ' ')
Install one that matches the driver (https://pytorch.org/get-started/locally/), e.g.
    python3 -m pip install torch --index-url https://download.pytorch.org/whl/cu130
or point PYTHON at the interpreter that has it. A CPU build is not installed on a GPU host.
MSG
        exit 1
    fi
    if [ -x "$VPY" ] && ! has_cuda_torch "$VPY"; then
        echo "bootstrap: $VENV has no CUDA torch; making it again"
        rm -rf "$VENV"
    fi
    if [ ! -x "$VPY" ]; then
        echo "bootstrap: CUDA torch found in $HOST_PY; $VENV reuses it"
        "$HOST_PY" -m venv "$VENV"
        ATTNBENCH_HOST_SITE=$("$HOST_PY" tools/asv_host_site.py --print) \
            "$VPY" tools/asv_host_site.py --write "$VENV"
    fi
    # Pin the project's install to the host's torch and Triton.
    # (Distribution versions: a build's torch.__version__ may carry a local label that its
    # metadata does not.)
    "$VPY" -c 'import importlib.metadata as m; [print(f"{p}=={m.version(p)}") for p in ("torch", "triton")]' \
        >"$VENV/host-constraints.txt"
    CONSTRAINT=(-c "$VENV/host-constraints.txt")
else
    [ -x "$VPY" ] || "${PYTHON:-python3}" -m venv "$VENV"
    if ! "$VPY" -c 'import torch, triton' 2>/dev/null; then
        SOURCE=()
        if ! pip_configured; then SOURCE=(--index-url "$CPU_INDEX"); fi
        FROM="from the configured pip sources"
        [ "${#SOURCE[@]}" -eq 0 ] || FROM="from $CPU_INDEX"
        echo "bootstrap: installing torch $CPU_TORCH, CPU build (about 200 MB download," \
            "700 MB installed), $FROM"
        "$VPY" -m pip install --progress-bar on "${SOURCE[@]}" "torch==$CPU_TORCH"
        "$VPY" -m pip install -q "triton==$CPU_TRITON"
    fi
    CONSTRAINT=()
fi
if [ "${ATTNBENCH_SKIP_INSTALL:-0}" = 1 ]; then exit 0; fi
echo "bootstrap: installing the project with its test and bench extras into $VENV"
"$VPY" -m pip install -q "${CONSTRAINT[@]}" -e ".[test,bench]"
"$VPY" -c 'import torch, triton; print(f"bootstrap: torch {torch.__version__} ({torch.__file__}), triton {triton.__version__}, CUDA build: {torch.version.cuda}")'
