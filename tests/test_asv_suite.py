"""The asv suite end to end, in smoke mode, on a temporary copy of the repository.

The copy (tracked and untracked-but-not-ignored files of this checkout) gets three commits:

    c1  a deliberately slower NSA forward (selection_forward_triton sleeps first)
    c2  the code as it is (the slowdown reverted)
    c3  a documentation-only change: the same code as c2

Then `asv run HEAD^!` (c3) records a value for every benchmark method;
`asv continuous c2 c3` exits 0 (identical code); `asv continuous c2 c1` exits 1 (c1 is
slower); `asv publish` lists every benchmark; tools/report.py writes its files.
(`asv check` runs in test_asv_common.py, in this interpreter.)

Smoke gate settings (looser than the GPU's, which are tuned on the GPU's own noise): factor
3. The slow commit's forward sleeps SLOW_MULTIPLE times as long as the real call it wraps
has just taken, in the same process: its time is (1 + SLOW_MULTIPLE) times the call's, so
the ratio asv sees is 1 + SLOW_MULTIPLE however busy the machine is. Only a change of load
between the base's and the head's processes moves it, and it stays above the factor until
the base's calls run (1 + SLOW_MULTIPLE) / 3 times slower than the head's. A fixed sleep
did not have that property: its ratio fell below 3 once a loaded machine made the call
itself take more than half the sleep. Only the plumbing is tested.
"""

import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE_FACTOR = "3"
# The kernel's NSA forward timings (graph, eager, host). asv matches -b against
# "name(param, ...)"; the dense reference's smoke call lasts well under a millisecond, so a
# busy machine can move its host-timed figure by more than SMOKE_FACTOR.
KERNEL_TIMES = r"NsaForward\.track_time\w*\(.*'triton'"
# Extra time of the slow forward, as a multiple of the call it wraps (ratio 1 + this).
SLOW_MULTIPLE = 8
SLOW_PATCH = f"""

# Deliberately slower forward (asv gate test only): sleeps {SLOW_MULTIPLE} times as long as
# the call took, so the slowdown is a ratio, whatever the machine's load.
import time as _time

_selection_forward_triton = selection_forward_triton


def selection_forward_triton(*args, **kwargs):
    t0 = _time.perf_counter()
    out = _selection_forward_triton(*args, **kwargs)
    _time.sleep({SLOW_MULTIPLE} * (_time.perf_counter() - t0))
    return out
"""

pytestmark = pytest.mark.slow


def _git(repo, *args):
    ident = ["-c", "user.name=asv test", "-c", "user.email=asv-test@example.invalid"]
    out = subprocess.run(["git", *ident, *args], cwd=repo, check=True, capture_output=True)
    return out.stdout.decode().strip()


def _copy_tree(dest):
    files = _git(ROOT, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The temporary repository, its environment variables and its three commit hashes."""
    base = tmp_path_factory.mktemp("asv")
    repo, home = base / "repo", base / "home"
    repo.mkdir()
    home.mkdir()
    _copy_tree(repo)
    _git(repo, "init", "-q", "-b", "main")
    nsa_init = repo / "src/kernels/nsa/__init__.py"
    original = nsa_init.read_text()
    nsa_init.write_text(original + SLOW_PATCH)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "c1: slower forward")
    nsa_init.write_text(original)
    _git(repo, "commit", "-qam", "c2: revert the slowdown")
    (repo / "docs").mkdir(exist_ok=True)
    (repo / "docs" / "asv-test-note.md").write_text("documentation only\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "c3: docs only")
    c3, c2, c1 = _git(repo, "rev-list", "--max-count=3", "HEAD").split()
    host_site = subprocess.run(
        [sys.executable, str(ROOT / "tools/asv_host_site.py"), "--print"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    env = dict(os.environ, HOME=str(home), ATTNBENCH_SMOKE="1", ATTNBENCH_HOST_SITE=host_site)
    env.pop("ATTNBENCH_SUITE", None)
    subprocess.run(
        [sys.executable, str(ROOT / "tools/asv_machine.py"), "--machine", "cpu-smoke"],
        cwd=repo,
        env=env,
        check=True,
    )
    return {"path": repo, "env": env, "c1": c1, "c2": c2, "c3": c3}


def asv(repo, *args, check=True):
    cmd = [sys.executable, "-m", "asv", *args]
    proc = subprocess.run(cmd, cwd=repo["path"], env=repo["env"], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-6000:]}")
    return proc


def benchmark_names(repo):
    data = json.loads((repo["path"] / "results/benchmarks.json").read_text())
    return sorted(k for k, v in data.items() if isinstance(v, dict) and "name" in v)


@pytest.fixture(scope="module")
def smoke_run(repo):
    asv(repo, "run", "HEAD^!", "--machine", "cpu-smoke", "--record-samples", "-e")
    return repo


def test_run_records_every_benchmark_method(smoke_run):
    names = benchmark_names(smoke_run)
    expected = {
        "ceilings.Matmul.track_bf16_tflops",
        "ceilings.CopyRate.track_copy_gb_per_s",
        "nsa.NsaForward.track_time",
        "nsa.NsaForward.track_peak_vram_bytes",
        "nsa.NsaForward.track_time_eager",
        "nsa.NsaForward.track_time_host",
        "nsa.NsaBackward.track_time",
        "nsa.NsaBackward.track_time_eager",
        "nsa.NsaBackward.track_time_host",
        "nsa.NsaBackward.track_peak_vram_bytes",
        "nsa.NsaSeedBackward.track_time",
        "nsa.NsaSeedBackward.track_time_eager",
        "nsa.NsaSeedBackward.track_time_host",
        "nsa.NsaAutograd.track_time_eager",
        "nsa.NsaAutograd.track_time_host",
        "kda.KdaVerify.track_time",
        "kda.KdaVerify.track_time_cold",
        "kda.KdaVerify.track_peak_vram_bytes",
        "kda.KdaBlockV.track_time",
        "kda.KdaBlockV.track_time_cold",
    }
    assert expected <= set(names)
    # benchmarks/common.py holds no benchmark (the ceilings are benchmarks/ceilings.py's).
    assert not [n for n in names if n.startswith("common.")]
    (path,) = (smoke_run["path"] / "results/cpu-smoke").glob(f"{smoke_run['c3'][:8]}-*.json")
    data = json.loads(path.read_text())
    assert data["params"]["machine"] == "cpu-smoke" and data["params"]["gpu"] == "none"
    for name in names:
        values = data["results"][name][0]
        values = values if isinstance(values, list) else [values]
        assert any(v is not None for v in values), f"{name} has no value"


def test_continuous_passes_identical_commits(smoke_run):
    r = smoke_run
    proc = asv(r, "continuous", r["c2"], r["c3"], "-b", KERNEL_TIMES, "--factor",
               SMOKE_FACTOR, "--machine", "cpu-smoke", check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:]


def test_continuous_fails_a_slower_kernel(smoke_run):
    r = smoke_run
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


def test_publish_lists_every_benchmark(smoke_run):
    asv(smoke_run, "publish")
    index = json.loads((smoke_run["path"] / "html/index.json").read_text())
    assert set(benchmark_names(smoke_run)) <= set(index["benchmarks"])
    assert (smoke_run["path"] / "html/index.html").is_file()


def test_report_writes_csv_and_plots(smoke_run, tmp_path):
    out = tmp_path / "report"
    subprocess.run(
        [sys.executable, str(ROOT / "tools/report.py"), "--results",
         str(smoke_run["path"] / "results"), "--out", str(out), "--machine", "cpu-smoke"],
        check=True,
    )  # fmt: skip
    csvs = ["nsa_forward.csv", "nsa_backward.csv", "kda_verify.csv", "kda_block_v.csv"]
    for name in csvs + ["kda_verify.md", "vram_vs_seqlen_fwd.png", "toks_vs_seqlen_bwd.png"]:
        assert (out / name).stat().st_size > 0, name
    assert "40" in (out / "nsa_forward.csv").read_text()  # the smoke seq_len


def test_view_step_records_kernel_and_reference_eager(smoke_run, tmp_path):
    """The main job's view step (scripts/main.sh): `asv run HEAD^!` with
    ATTNBENCH_SUITE=view under its own machine, selected by nsa.VIEW_BENCHMARKS (here
    narrowed to seq_len 40 to keep the test short), records the eager figure of the kernel
    and the reference, the kernel's graph figure and both peak VRAMs, and nothing else; the
    report writes the view's plots from it."""
    r = smoke_run
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
    saved = bench_json.read_bytes()  # put back as scripts/main.sh does
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "asv", "run", "HEAD^!", "--machine", machine, "-b",
             selection, "--record-samples"],
            cwd=r["path"], env=env, capture_output=True, text=True,
        )  # fmt: skip
    finally:
        bench_json.write_bytes(saved)
    assert proc.returncode == 0, proc.stdout[-6000:]
    (path,) = (r["path"] / "results" / machine).glob(f"{r['c3'][:8]}-*.json")
    data = json.loads(path.read_text())
    methods = ("track_time", "track_time_eager", "track_peak_vram_bytes")
    expected = {f"nsa.{cls}.{m}" for cls in ("NsaForward", "NsaBackward") for m in methods}
    assert set(data["results"]) == expected
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
