#!/usr/bin/env bash
# One device call: bf16 GPU tests, then the NSA and KDA check scripts.
# Usage on the GPU host: bash tools/gpu_session.sh [wheel dir]   (logs under $OUT)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WHL=${1:-}
if [ -n "$WHL" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl
    export PYTHONPATH=/tmp/site:$PWD/src
else
    export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
( time python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_nsa_*.py tests/test_kda_*.py 2>&1 ) | tee "$OUT/pytest_gpu.log" | tail -25
( time python3 tools/gpu_check_nsa.py --out "$OUT" 2>&1 ) | tee "$OUT/nsa.log" | tail -60
( time python3 tools/gpu_check_kda.py --out "$OUT" 2>&1 ) | tee "$OUT/kda.log" | tail -60
