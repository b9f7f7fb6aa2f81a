"""The asv gate and the main job's view step end to end, in smoke mode, on a temporary copy
of the repository (`_asv_repo`): `asv continuous c2 c3` exits 0 (identical code), `asv
continuous c2 c1` exits 1 (c1 is slower), and the view's `asv run` records what the view
shows.
"""

import csv
import itertools
import json
import subprocess
import sys

import pytest
from _asv_repo import (
    KERNEL_TIMES,
    ROOT,
    SLOW_MULTIPLE,
    SLOW_PATCH,
    SMOKE_FACTOR,
    asv,
    make_repo,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory)


def test_continuous_passes_identical_commits(repo):
    r = repo
    proc = asv(r, "continuous", r["c2"], r["c3"], "-b", KERNEL_TIMES, "--factor",
               SMOKE_FACTOR, "--machine", "cpu-smoke", check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:]


def test_continuous_fails_a_slower_kernel(repo):
    r = repo
    proc = asv(r, "continuous", r["c2"], r["c1"], "-b", KERNEL_TIMES, "--factor",
               SMOKE_FACTOR, "--machine", "cpu-smoke", check=False)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-6000:]
    assert "PERFORMANCE DECREASED" in proc.stdout


def test_slow_patch_scales_with_the_call_it_wraps():
    """The slow commit's forward takes (1 + SLOW_MULTIPLE) times its real call, for a fast
    call and for one three times slower (as on a loaded machine): the ratio is the same.
    A virtual clock stands in for `time`, so this test does not depend on load itself."""

    class Clock:
        now = 0.0

        def perf_counter(self):
            return self.now

        def sleep(self, seconds):
            assert seconds >= 0
            self.now += seconds

    def ratio(call_s):
        clock = Clock()

        def selection_forward_triton(*args, **kwargs):
            clock.now += call_s
            return ("o", args, kwargs)

        ns = {"selection_forward_triton": selection_forward_triton}
        exec(SLOW_PATCH, ns)
        ns["_time"] = clock
        assert ns["selection_forward_triton"](1, b=2) == ("o", (1,), {"b": 2})
        return clock.now / call_s

    for call_s in (0.3, 0.9):
        assert ratio(call_s) == pytest.approx(1 + SLOW_MULTIPLE)
    assert (1 + SLOW_MULTIPLE) / float(SMOKE_FACTOR) >= 3  # margin against a change of load


def test_view_step_records_kernel_and_reference_eager(repo, tmp_path):
    """The main job's view step (scripts/main.sh): `asv run HEAD^!` with
    ATTNBENCH_SUITE=view under its own machine, selected by nsa.VIEW_BENCHMARKS (here
    narrowed to seq_len 40 to keep the test short), records the eager figure of the kernel
    and the reference, the kernel's graph figure, both peak VRAMs and the matmul ceiling, and
    nothing else; the report writes the view's plots from it and gives the kernel's TFLOP/s
    as a share of that ceiling."""
    r = repo
    names = subprocess.run(
        [sys.executable, "-c", "import benchmarks.nsa as n; print(n.VIEW_BENCHMARKS)"],
        cwd=r["path"], env=dict(r["env"], ATTNBENCH_SUITE="view"), check=True,
        capture_output=True, text=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    selection = names.replace(r"\(\d+, ", r"\(40, ")
    assert selection != names
    machine = "cpu-smoke-view"
    env = dict(r["env"], ATTNBENCH_SUITE="view")
    env["ATTNBENCH_NA_LOG"] = str(r["path"] / "results" / machine / "na_reasons.jsonl")
    subprocess.run([sys.executable, str(ROOT / "tools/asv_machine.py"), "--machine", machine],
                   cwd=r["path"], env=env, check=True, capture_output=True)  # fmt: skip
    bench_json = r["path"] / "results/benchmarks.json"
    saved = bench_json.read_bytes() if bench_json.exists() else None  # as scripts/main.sh does
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "asv", "run", "HEAD^!", "--machine", machine, "-b",
             selection, "--record-samples"],
            cwd=r["path"], env=env, capture_output=True, text=True,
        )  # fmt: skip
    finally:
        if saved is not None:
            bench_json.write_bytes(saved)
    assert proc.returncode == 0, proc.stdout[-6000:]
    (path,) = (r["path"] / "results" / machine).glob(f"{r['c3'][:8]}-*.json")
    data = json.loads(path.read_text())
    methods = ("track_time", "track_time_eager", "track_peak_vram_bytes")
    expected = {f"nsa.{cls}.{m}" for cls in ("NsaForward", "NsaBackward") for m in methods}
    ceiling = "ceilings.Matmul.track_bf16_tflops"
    assert set(data["results"]) == expected | {ceiling}
    assert data["results"][ceiling][0][0] > 0
    for name in expected:
        values, params = data["results"][name][:2]
        got = dict(zip(itertools.product(*params), values, strict=True))
        impls = ["'triton'"] if name.endswith(".track_time") else ["'triton'", "'reference'"]
        assert params[1] == impls, name
        for impl in impls:
            value = got[("40", impl, "'tiny-seed'", "'random'")]
            assert value is not None and value == value, (name, impl)  # measured, not NaN
    out = tmp_path / "view"
    subprocess.run(
        [sys.executable, str(ROOT / "tools/report.py"), "--results", str(r["path"] / "results"),
         "--out", str(out), "--machine", machine, "--title", "The seed's view at HEAD"],
        check=True, capture_output=True,
    )  # fmt: skip
    rows = list(csv.DictReader(open(out / "nsa_backward.csv")))
    assert rows[0]["ref_eager_ms"] and rows[0]["kernel_eager_ms"] and rows[0]["kernel_ms"]
    for name in ("toks_vs_seqlen_fwd.png", "vram_vs_seqlen_bwd.png"):
        assert (out / name).stat().st_size > 0, name
    summary = (out / "summary.md").read_text()
    assert "% of the matmul rate (" in summary and "no Matmul ceiling" not in summary
