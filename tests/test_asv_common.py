"""The suite's shared machinery (benchmarks/common.py) and its mode switches, on the CPU."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402  (smoke mode here: no CUDA)

PROBE = """
import json, math, os, torch
import benchmarks.common as c
from benchmarks import kda, nsa
# One asv process per (benchmark method, parameter point), skipped points included.
classes = [v for m in (c, kda, nsa) for v in vars(m).values()
           if isinstance(v, type) and v.__module__ == m.__name__ and not v.__name__.startswith("_")]
procs = sum(math.prod(len(a) for a in getattr(k, "params", [])) for k in classes
            for name in dir(k) if name.startswith(("track_", "time_")))
print(json.dumps({
    "mode": c.MODE_NAME, "interpret": os.environ.get("TRITON_INTERPRET"), "processes": procs,
    "seq_len": nsa.NsaForward.params[0], "impl": nsa.NsaForward.params[1],
    "presets": nsa.NsaForward.params[2],
    "batch": kda.KdaVerify.params[0], "heads": kda.KdaVerify.params[3],
    "mib": [kda.verify_bytes(1, 8, 8, m) / 2**20 for m in ("fused", "fused+ring")],
    "cold": [[B, m, kda.cold_set_count(B, 8, 8, m, 60 * 2**20), kda.verify_bytes(B, 8, 8, m)]
             for B in (1, 2, 4, 16, 64) for m in ("fused", "fused+ring")],
    "cuda_initialized": torch.cuda.is_initialized(),
}))
"""


def probe(**env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNBENCH_", "TRITON_"))}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, **env},
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(out.splitlines()[-1])


def test_smoke_mode_is_tiny_and_interpreted():
    got = probe(ATTNBENCH_SMOKE="1")
    assert got["mode"] == "smoke" and got["interpret"] == "1"
    assert got["seq_len"] == [40] and got["presets"] == ["tiny-seed"]
    assert got["heads"] == ["H1-HV2"]
    assert not got["cuda_initialized"]


def test_gpu_grids_default_and_nightly():
    default = probe(ATTNBENCH_SMOKE="0")
    assert default["mode"] == "default" and default["interpret"] is None
    assert default["seq_len"] == [4096, 32768] and default["batch"] == [1, 16, 64]
    # The per-commit budget: kernels only, no skipped points (docs/benchmarks.md, "Modes").
    assert default["impl"] == ["triton"] and default["processes"] == 56
    nightly = probe(ATTNBENCH_SMOKE="0", ATTNBENCH_SUITE="nightly")
    assert nightly["seq_len"][0] == 512 and nightly["seq_len"][-1] == 65536
    assert nightly["batch"] == [1, 2, 4, 8, 16, 32, 64]
    assert nightly["heads"] == ["H8-HV8", "H8-HV16"]
    assert nightly["impl"] == ["triton", "reference"] and nightly["processes"] == 1150
    # The KDA spec's bytes per sequence at the seed's shape: 2.64 MiB (snapshots), 0.66 (ring).
    assert default["mib"] == pytest.approx([2.64, 0.66], rel=0.01)
    # Cold sets: a multiple of 10, and enough of them that the other sets' calls touch
    # 3x a 60 MiB L2 before a set comes round again (not counting the snapshot stores); 10
    # sets were too few below B = 16.
    n_cold = {}
    for B, mode, n, nbytes in default["cold"]:
        if mode == "fused":
            nbytes -= B * 4 * 8 * 128 * 128 * 4  # T snapshots of the fp32 state
        assert n % 10 == 0 and 10 <= n <= 400
        assert (n - 1) * nbytes >= 3 * 60 * 2**20 or n == 10 and 9 * nbytes >= 3 * 60 * 2**20
        n_cold[B, mode] = n
    assert n_cold[1, "fused+ring"] == 280 and n_cold[64, "fused+ring"] == 10
    # Smoke parameter values never occur on a GPU.
    assert not set(probe(ATTNBENCH_SMOKE="1")["seq_len"]) & set(nightly["seq_len"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_without_gpu_benchmarks_skip_unless_smoke():
    code = "from benchmarks.common import *\ntry: require_device()\n"
    code += "except NotImplementedError: print('s')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "ATTNBENCH_SMOKE": "0"}, check=True)  # fmt: skip
    assert out.stdout.strip() == "s"


class _Bench:
    calls = 0

    @common.metric("bytes")
    def track_x(self):
        self.calls += 1
        raise torch.OutOfMemoryError("out of memory")


def test_oom_records_nan_and_is_sticky():
    b = _Bench()
    assert math.isnan(b.track_x()) and b.oom
    assert math.isnan(b.track_x()) and b.calls == 1
    assert _Bench.track_x.unit == "bytes"


@pytest.mark.skipif(not common.SMOKE, reason="host-timer path (smoke mode) only")
def test_per_call_seconds_rotates_buffers():
    counts = [0, 0]
    fns = [lambda i=i: counts.__setitem__(i, counts[i] + 1) for i in range(2)]
    samples = common.per_call_seconds(fns, calls=4, samples=3)
    assert len(samples) == 3 and all(s > 0 for s in samples)
    assert counts[0] == counts[1] > 0
    result = common.timing_result(samples)
    assert result["number"] == 1 and result["samples"] == samples


def test_check_close_rejects_wrong_and_nan():
    ref = torch.ones(8)
    common.check_close("same", ref + 1e-7, ref)
    with pytest.raises(AssertionError, match="relative error"):
        common.check_close("off", ref * 1.1, ref)
    with pytest.raises(AssertionError):
        common.check_close("nan", torch.full((8,), float("nan")), ref)


def test_load_api_skips_missing():
    with pytest.raises(NotImplementedError, match="lacks"):
        common.load_api("kernels.nsa", "no_such_function")
    with pytest.raises(NotImplementedError):
        common.load_api("kernels.no_such_module", "x")


def test_asv_check_in_this_interpreter():
    env = {**os.environ, "ATTNBENCH_SMOKE": "1"}
    out = subprocess.run([sys.executable, "-m", "asv", "check", "-E", "existing:same"],
                         cwd=ROOT, env=env, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and "No problems found" in out.stdout, out.stdout + out.stderr
