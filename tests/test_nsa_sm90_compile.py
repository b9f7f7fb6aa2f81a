"""The NSA selection kernels compile for an H200 (sm_90) without a GPU.

The interpreter runs the kernels' Python, not the compiler; `tools/dev/compile_nsa_sm90.py`
compiles every kernel the public forward (token-tile and block paths) and backward
launch down to a cubin with ptxas, at the seed and the paper grouping, and exits non-zero
on a compile error; with --sass it also counts each cubin's barriers (the partial kernel
has some: its tiles pass through shared memory).
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    r = subprocess.run(
        [sys.executable, "-m", "tools.dev.compile_nsa_sm90", "--seq-len", "1024", "--shapes",
         "seed", "paper", "--sass"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "0 compile errors" in r.stdout
    kernels = {
        ln.split()[3]
        for ln in r.stdout.splitlines()
        if ln.strip().endswith(tuple("0123456789")) and "_kernel" in ln
    }
    for name in ("_sel_fwd_kernel", "_partial_kernel", "_combine_kernel", "_sel_bwd_dq_kernel",
                 "_sel_bwd_dkdv_kernel", "_inv_sort_kernel", "_inv_scan_kernel",
                 "_inv_fill_kernel"):  # fmt: skip
        assert name in kernels, r.stdout
    bars = [
        int(kv.split("=")[1])
        for ln in r.stdout.splitlines()
        if " _partial_kernel " in ln
        for kv in ln.split()
        if kv.startswith("BAR=")
    ]
    assert bars and all(b > 0 for b in bars), r.stdout
