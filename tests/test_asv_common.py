"""The suite's shared machinery (benchmarks/common.py) and its mode switches, on the CPU."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _suite_list import list_suites  # noqa: E402

from benchmarks import common  # noqa: E402  (smoke mode here: no CUDA)

PROBE = """
import json, math, os, torch
import benchmarks.common as c
from benchmarks import ceilings, kda, nsa
# One asv process per (benchmark method, parameter point), skipped points included; a
# method's own `params` (asv reads the method's attributes first) replace the class's.
classes = [v for m in (c, ceilings, kda, nsa) for v in vars(m).values()
           if isinstance(v, type) and v.__module__ == m.__name__ and not v.__name__.startswith("_")]
procs = sum(math.prod(len(a) for a in getattr(getattr(k, name), "params", getattr(k, "params", [])))
            for k in classes for name in dir(k) if name.startswith(("track_", "time_")))
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
    # 24 for the graph timings, peak VRAM, the ceilings and the BLOCK_V sweep; 9 for the NSA
    # eager and host figures and NsaSeedBackward's graph figure. Rates are the report's.
    assert got["processes"] == 24 + 9


def test_gpu_grids_default_and_nightly():
    default = probe(ATTNBENCH_SMOKE="0")
    assert default["mode"] == "default" and default["interpret"] is None
    assert default["seq_len"] == [4096, 32768] and default["batch"] == [1, 16, 64]
    # The per-commit budget: kernels only, no skipped points (docs/benchmarks.md, "Modes"):
    # 56 for the graph timings and peak VRAM, 49 for the NSA eager and host figures and
    # NsaSeedBackward's graph figure.
    assert default["impl"] == ["triton"] and default["processes"] == 56 + 49
    nightly = probe(ATTNBENCH_SMOKE="0", ATTNBENCH_SUITE="nightly")
    assert nightly["seq_len"][0] == 512 and nightly["seq_len"][-1] == 65536
    assert nightly["batch"] == [1, 2, 4, 8, 16, 32, 64]
    assert nightly["heads"] == ["H8-HV8", "H8-HV16"]
    # 654: the sweep's graph timings, peak VRAM, the ceilings and the BLOCK_V sweep (tokens/s,
    # TFLOP/s and % of a ceiling are derived by tools/report.py, not timed in processes).
    assert nightly["impl"] == ["triton", "reference"] and nightly["processes"] == 654 + 49
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


def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory (test)")


NSA_POINT = (40, "triton", "tiny-seed", "random")
KDA_POINT = (1, "fused", "safe", "H1-HV2")


def asv_strings(params):
    return [repr(p) for p in params]


@pytest.mark.skipif(not common.SMOKE, reason="smoke-mode benchmark set-up")
def test_oom_anywhere_in_setup_is_na_the_same_way_in_both_families(monkeypatch, tmp_path):
    """An out-of-memory error in a correctness check (NSA's, KDA's) makes every method of the
    point NaN and logs the point in ci/na_reasons.py's encoding."""
    from benchmarks import kda, nsa
    from ci import na_reasons

    log = na_reasons.log_path(tmp_path, "m")
    monkeypatch.setenv(common.NA_LOG_ENV, str(log))
    monkeypatch.setenv("ASV_COMMIT", "a" * 40)
    monkeypatch.setattr(nsa.NsaForward, "check", _oom)
    monkeypatch.setattr(kda, "check_against_reference", _oom)
    b, k = nsa.NsaForward(), kda.KdaVerify()
    b_cache, k_cache = b.setup_cache(), k.setup_cache()
    b.setup(b_cache, *NSA_POINT)
    k.setup(k_cache, *KDA_POINT)
    assert b.oom and k.oom
    # Called as asv calls them: the setup_cache result first (the log records the
    # parameters alone).
    for method in ("track_time", "track_time_eager", "track_time_host", "track_peak_vram_bytes"):
        assert math.isnan(getattr(b, method)(b_cache, *NSA_POINT)), method
    for method in ("track_time", "track_time_cold"):
        assert math.isnan(getattr(k, method)(k_cache, *KDA_POINT)), method
    got, commit = na_reasons.load_oom(log), "a" * 40
    assert len(got) == 6
    assert na_reasons.is_oom(got, commit, "nsa.NsaForward.track_time_host", asv_strings(NSA_POINT))
    assert na_reasons.is_oom(got, commit, "kda.KdaVerify.track_time_cold", asv_strings(KDA_POINT))
    lines = log.read_text().splitlines()
    assert all(json.loads(line)["reason"] == "out-of-memory" for line in lines)


@pytest.mark.skipif(not common.SMOKE, reason="smoke-mode benchmark set-up")
def test_setup_errors_other_than_oom_still_fail_or_skip(monkeypatch, tmp_path):
    from benchmarks import kda, nsa

    monkeypatch.delenv(common.NA_LOG_ENV, raising=False)
    monkeypatch.setattr(nsa.NsaForward, "check", lambda self, x: 1 / 0)
    b = nsa.NsaForward()
    with pytest.raises(common.CheckFailed, match="ZeroDivisionError"):
        b.setup(b.setup_cache(), *NSA_POINT)
    with pytest.raises(NotImplementedError):
        b.setup({}, 65536, "triton", "tiny-seed", "random")  # paper preset only
    monkeypatch.setattr(kda, "check_against_reference", lambda *a: 1 / 0)
    k = kda.KdaVerify()
    with pytest.raises(common.CheckFailed, match="ZeroDivisionError"):
        k.setup(k.setup_cache(), *KDA_POINT)
    # Without $ATTNBENCH_NA_LOG an OOM is NaN only; nothing is written.
    monkeypatch.chdir(tmp_path)
    b = _Bench()
    assert math.isnan(b.track_x()) and not list(tmp_path.iterdir())


@pytest.mark.skipif(not common.SMOKE, reason="smoke-mode benchmark set-up")
def test_checks_run_once_per_class_and_fail_only_their_points(monkeypatch):
    """Each class's setup_cache runs every check of its grid once (NSA: per preset and
    pattern, KDA: per mode, gate and heads); a point's setup re-raises its own check's
    outcome only, and asv gives every class a setup_cache of its own."""
    from asv_runner.benchmarks._base import get_setup_cache_key

    from benchmarks import kda, nsa

    seen = []

    def check(self, x):
        seen.append(self.p)
        if self.p is nsa.PRESETS["tiny-seed"] and x["idx"].shape[2] == nsa.CHECK_SEQ_LEN:
            raise AssertionError("wrong")

    monkeypatch.setattr(nsa.NsaForward, "check", check)
    monkeypatch.setattr(nsa.NsaForward, "params", [[40], ["triton"], ["tiny-seed", "tiny-paper"],
                                                   ["random", "recent"]])  # fmt: skip
    b = nsa.NsaForward()
    checks = b.setup_cache()
    assert len(seen) == 4 and set(checks) == {
        (p, q) for p in ("tiny-seed", "tiny-paper") for q in ("random", "recent")
    }
    assert checks["tiny-paper", "recent"] is None
    assert checks["tiny-seed", "random"] == ("failed", "AssertionError: wrong")
    b.setup(checks, 40, "triton", "tiny-paper", "recent")  # its check passed
    with pytest.raises(common.CheckFailed, match="wrong"):
        b.setup(checks, 40, "triton", "tiny-seed", "recent")
    assert len(seen) == 4  # setup ran no check of its own

    calls = []
    monkeypatch.setattr(kda, "check_against_reference", lambda *a: calls.append(a[1]))
    monkeypatch.setattr(kda, "check_ring_bitwise", lambda *a: None)
    k = kda.KdaVerify()
    outcomes = k.setup_cache()
    assert sorted(calls) == sorted(m for m in kda.KdaVerify.params[1] for _ in kda.HEADS)
    assert all(v is None for v in outcomes.values())
    k.setup(outcomes, *KDA_POINT)
    assert len(calls) == len(outcomes)

    classes = [nsa.NsaForward, nsa.NsaBackward, nsa.NsaSeedBackward, nsa.NsaAutograd,
               kda.KdaVerify]  # fmt: skip
    keys = {get_setup_cache_key(c.setup_cache) for c in classes}
    assert len(keys) == len(classes)


def test_run_checks_sorts_outcomes_and_raise_check_replays_them():
    def oom():
        raise torch.OutOfMemoryError("out of memory (test)")

    def skip():
        raise NotImplementedError("no API")

    got = common.run_checks({"ok": lambda: None, "oom": oom, "skip": skip, "bad": lambda: 1 / 0})
    assert got["ok"] is None and got["oom"][0] == "oom" and got["skip"] == ("skip", "no API")
    assert got["bad"] == ("failed", "ZeroDivisionError: division by zero")
    common.raise_check(got["ok"])
    with pytest.raises(torch.OutOfMemoryError):
        common.raise_check(got["oom"])
    with pytest.raises(NotImplementedError, match="no API"):
        common.raise_check(got["skip"])
    with pytest.raises(common.CheckFailed, match="ZeroDivisionError"):
        common.raise_check(got["bad"])


def test_check_close_rejects_wrong_and_nan():
    ref = torch.ones(8)
    common.check_close("same", ref + 1e-7, ref)
    with pytest.raises(AssertionError, match="relative error"):
        common.check_close("off", ref * 1.1, ref)
    with pytest.raises(AssertionError):
        common.check_close("nan", torch.full((8,), float("nan")), ref)


def test_require_api_skips_missing():
    import kernels.nsa

    assert common.require_api(kernels.nsa, "selection_forward_triton") is kernels.nsa
    with pytest.raises(NotImplementedError, match="lacks.*no_such_function"):
        common.require_api(kernels.nsa, "no_such_function")
    with pytest.raises(NotImplementedError, match="does not import"):
        common.require_api(None, "x")


def test_asv_check_in_this_interpreter():
    env = {**os.environ, "ATTNBENCH_SMOKE": "1"}
    out = subprocess.run([sys.executable, "-m", "asv", "check", "-E", "existing:same"],
                         cwd=ROOT, env=env, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and "No problems found" in out.stdout, out.stdout + out.stderr


# ---------------------------------------------------------------- suites as asv lists them


# Every mode's benchmarks as asv lists them (tests/_suite_list.py), and the view's selection
# through asv's own filter (asv.benchmarks.Benchmarks, which matches -b against
# "name(param, ...)" and runs one process per selected parameter combination).
@pytest.fixture(scope="module")
def suites():
    from asv.benchmarks import Benchmarks

    out = list_suites()
    conf = SimpleNamespace(benchmark_dir="benchmarks")
    for listed in out.values():
        selected = Benchmarks(conf, listed["benchmarks"], regex=listed["view_regex"])
        listed["view_selection"] = {
            k: len(v) if v is not None else 1
            for k, v in selected.benchmark_selection.items()
            if k in selected
        }
    return out


GATED = [["4096", "32768"], ["'triton'"], ["'seed'", "'paper'"], ["'recent'", "'random'"]]
AUTOGRAD = [["4096", "32768"], ["'triton'"], ["'seed'"], ["'recent'", "'random'"]]
SEED_BACKWARD = [["512", "1024", "2048"], ["'triton'"], ["'seed'"], ["'recent'"]]
# The default suite's NSA benchmarks (the history on main and the PR gate): names, params and
# versions. The view suite was added without changing any of them.
DEFAULT_NSA = {
    **{
        f"nsa.{cls}.{method}": (GATED, "1")
        for cls in ("NsaForward", "NsaBackward")
        for method in ("track_time", "track_time_eager", "track_time_host", "track_peak_vram_bytes")
    },  # fmt: skip
    "nsa.NsaAutograd.track_time_eager": (AUTOGRAD, "1"),
    "nsa.NsaAutograd.track_time_host": (AUTOGRAD, "1"),
    **{
        f"nsa.NsaSeedBackward.{m}": (SEED_BACKWARD, "1")
        for m in ("track_time", "track_time_eager", "track_time_host")
    },  # fmt: skip
}
# sha256 of the nightly and smoke suites' NSA and ceiling benchmarks (`_digest`): a change
# to them shows here. They are the suite as it was when the view suite was added, with one
# rename since: the ceilings' common.* names became ceilings.* when they moved to
# benchmarks/ceilings.py (the same rows, params and versions otherwise).
PINNED_DIGESTS = {
    "nightly": "0fd1b0c625d56f963ab430cb8f60c256c5b3fe649ded470a4a9b6e52562dc7d9",
    "smoke": "fe8c4eb306ca9ce6f8aef4c3b54f8e8c5c63fe21458f2a4f06e737b20be481db",
}
# The module prefixes the digests cover; common.py holds no benchmark (its shared machinery).
PINNED_MODULES = ("nsa.", "ceilings.", "common.")


def _digest(benches):
    """sha256 of the PINNED_MODULES entries' [name, params, version], sorted by name."""
    import hashlib

    rows = [[b["name"], b["params"], b["version"]] for b in benches
            if b["name"].startswith(PINNED_MODULES)]  # fmt: skip
    return hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()


def test_default_and_nightly_suites_are_pinned(suites):
    default = {b["name"]: (b["params"], b["version"]) for b in suites["default"]["benchmarks"]}
    pinned = {k: v for k, v in default.items() if k.startswith(PINNED_MODULES)}
    assert pinned == DEFAULT_NSA  # the ceilings are not in the default suite
    for mode, digest in PINNED_DIGESTS.items():
        assert _digest(suites[mode]["benchmarks"]) == digest, mode


def test_view_suite_grid_and_process_count(suites):
    """The view: NsaForward and NsaBackward x {seed, paper} x {recent, random} x seq_len
    512..32768 x {triton, reference}; the graph figure for the kernel only, no host figure;
    the -b selection runs the reference on one pattern; and the matmul ceiling. 225 processes
    (docs/benchmarks.md):
    within the main job's budget of about 250 (15 min on an H200, 1.5-3 s a process)."""
    view = {b["name"]: b["params"] for b in suites["view"]["benchmarks"]}
    seq = [str(T) for T in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
    presets, patterns = ["'seed'", "'paper'"], ["'recent'", "'random'"]
    for cls in ("NsaForward", "NsaBackward"):
        for method in ("track_time_eager", "track_peak_vram_bytes"):
            assert view[f"nsa.{cls}.{method}"] == [seq, ["'triton'", "'reference'"], presets,
                                                   patterns]  # fmt: skip
        assert view[f"nsa.{cls}.track_time"] == [seq, ["'triton'"], presets, patterns]
        assert f"nsa.{cls}.track_time_host" not in view
    selection = suites["view"]["view_selection"]
    per_class = {"track_time": 28, "track_time_eager": 42, "track_peak_vram_bytes": 42}
    assert selection == {
        **{f"nsa.{cls}.{method}": n for cls in ("NsaForward", "NsaBackward")
           for method, n in per_class.items()},
        "ceilings.Matmul.track_bf16_tflops": 1,  # the report's % of the matmul rate
    }  # fmt: skip
    assert sum(selection.values()) == 225 <= 250
    # Smoke: the smoke sizes, two seq_lens, one pattern; the reference runs there.
    smoke = suites["smoke-view"]["view_selection"]
    assert sum(smoke.values()) == 21
    smoke_eager = {b["name"]: b["params"] for b in suites["smoke-view"]["benchmarks"]}
    assert smoke_eager["nsa.NsaForward.track_time_eager"] == [["40", "80"], ["'triton'",
                                                              "'reference'"], ["'tiny-seed'"],
                                                             ["'random'"]]  # fmt: skip
    # Nothing else runs in the view: asv's filter selects no other benchmark.
    assert suites["default"]["view_selection"].keys() <= selection.keys()


def test_view_selection_regex():
    """VIEW_BENCHMARKS against asv's names: every kernel point, the reference on its one
    pattern, the three figures, nothing else (no `$`: asv matches "name(params)")."""
    import re

    from benchmarks import nsa

    sel = re.compile(nsa.VIEW_BENCHMARKS)
    ref = nsa.VIEW_REFERENCE_PATTERN
    other = "x" + ref  # any other pattern's name
    for cls in ("NsaForward", "NsaBackward"):
        for method in ("track_time", "track_time_eager", "track_peak_vram_bytes"):
            name = f"nsa.{cls}.{method}"
            assert sel.search(f"{name}(512, 'triton', 'seed', '{other}')")
            assert sel.search(f"{name}(32768, 'reference', 'paper', '{ref}')")
            assert not sel.search(f"{name}(512, 'reference', 'seed', '{other}')")
        assert not sel.search(f"nsa.{cls}.track_time_host(512, 'triton', 'seed', '{ref}')")
    assert not sel.search(f"nsa.NsaAutograd.track_time_eager(4096, 'triton', 'seed', '{ref}')")
    assert not sel.search("kda.KdaVerify.track_time(1, 'fused', 'safe', 'H8-HV8')")
    assert sel.search("ceilings.Matmul.track_bf16_tflops")
    assert not sel.search("ceilings.CopyRate.track_copy_gb_per_s")


VIEW_OOM = r"""
import json, math, os, sys, torch
from types import SimpleNamespace
sys.path.insert(0, os.getcwd())
from benchmarks import nsa

def oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory (test)")

out = {}
for cls in (nsa.NsaForward, nsa.NsaBackward):
    b, point = cls(), (40, "reference", "tiny-seed", "random")
    cache = b.setup_cache()
    b.setup(cache, *point)
    b.api = SimpleNamespace(**{**vars(b.api), "selection_forward_reference": oom})
    if cls is nsa.NsaForward:
        b.prepare()
    out[cls.__name__] = [b.track_time_eager(cache, *point), b.track_peak_vram_bytes(cache, *point)]
print(json.dumps(out))
"""


def test_view_reference_oom_is_na_out_of_memory(tmp_path):
    """In the view suite the reference's eager figure (new there) and its peak VRAM record
    NaN and an out-of-memory line when the dense reference runs out of memory."""
    from ci import na_reasons

    log = na_reasons.log_path(tmp_path, "m-view")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNBENCH_", "TRITON_"))}
    env = {**clean, "ATTNBENCH_SMOKE": "1", "ATTNBENCH_SUITE": "view",
           common.NA_LOG_ENV: str(log), "ASV_COMMIT": "a" * 40}  # fmt: skip
    res = subprocess.run([sys.executable, "-c", VIEW_OOM], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    got = json.loads(res.stdout.strip().splitlines()[-1], parse_constant=float)
    assert all(math.isnan(v) for values in got.values() for v in values), got
    oom = na_reasons.load_oom(log)
    params = asv_strings((40, "reference", "tiny-seed", "random"))
    for cls in ("NsaForward", "NsaBackward"):
        for method in ("track_time_eager", "track_peak_vram_bytes"):
            assert na_reasons.is_oom(oom, "a" * 40, f"nsa.{cls}.{method}", params), (cls, method)


def test_machine_file_records_no_gpu_where_the_gpus_are_hidden(tmp_path, monkeypatch):
    """tools/asv_machine.py reads the GPU from nvidia-smi, which ignores
    CUDA_VISIBLE_DEVICES; with the GPUs hidden (the CPU tests on a GPU host) it records
    none, as the suite then runs in smoke mode."""
    from tools import asv_machine

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 580.159.04'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert asv_machine.nvidia_smi() == ("NVIDIA H200", "580.159.04")
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert asv_machine.nvidia_smi() is None
