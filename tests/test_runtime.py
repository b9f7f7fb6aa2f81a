"""The kernels' shared host helpers (`kernels._runtime`) and the host-cost tool."""

import os
import subprocess
import sys

import triton

from kernels import _runtime


def test_cdiv_and_next_pow2_agree_with_triton():
    for a in list(range(0, 70)) + [2**31 - 1, 2**31, 2**40 + 3]:
        for b in (1, 2, 3, 16, 64, 1000):
            assert _runtime.cdiv(a, b) == triton.cdiv(a, b)
        assert _runtime.next_pow2(a) == triton.next_power_of_2(a)


def test_host_python_tool_runs_and_reports_every_call():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(root, "src")
    r = subprocess.run(
        [sys.executable, "-m", "tools.dev.nsa_host_python", "--seq-len", "256", "--calls", "3"],
        cwd=root, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    for call in ("forward recent", "backward recent", "forward random", "backward random"):
        assert call in r.stdout, r.stdout
