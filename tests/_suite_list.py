"""The suite's benchmarks as asv lists them, per mode, for the tests that check the suite.

asv_runner's own discovery (what `asv run` records), run in one subprocess for every mode:
benchmarks/common.py reads the mode at import, so the suite's modules are dropped from
sys.modules between modes (torch and the kernels stay). Discovery touches no GPU, so every
mode can be listed on a CPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODES = {
    "smoke": {"ATTNBENCH_SMOKE": "1", "ATTNBENCH_SUITE": "default"},
    "default": {"ATTNBENCH_SMOKE": "0", "ATTNBENCH_SUITE": "default"},
    "nightly": {"ATTNBENCH_SMOKE": "0", "ATTNBENCH_SUITE": "nightly"},
    "view": {"ATTNBENCH_SMOKE": "0", "ATTNBENCH_SUITE": "view"},
    "smoke-view": {"ATTNBENCH_SMOKE": "1", "ATTNBENCH_SUITE": "view"},
}

_LIST = r"""
import json, os, sys
from asv_runner.discovery import disc_benchmarks
sys.path.insert(0, os.getcwd())
out = {}
for mode, env in json.loads(sys.argv[1]).items():
    os.environ.update(env)
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        del sys.modules[name]
    from benchmarks import nsa
    benches = [{"name": b.name, "unit": b.unit, "version": str(b.version),
                "params": [list(p) for p in b.params]} for b in disc_benchmarks("benchmarks")]
    out[mode] = {"benchmarks": sorted(benches, key=lambda b: b["name"]),
                 "view_regex": nsa.VIEW_BENCHMARKS}
print(json.dumps(out))
"""


def list_suites(modes=MODES):
    """{mode: {"benchmarks": [{name, unit, version, params}], "view_regex": str}}: params as
    asv's strings (the ones it writes in `name(param, ...)`), benchmarks sorted by name."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNBENCH_", "TRITON_"))}
    res = subprocess.run([sys.executable, "-c", _LIST, json.dumps(modes)], cwd=ROOT, env=clean,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
