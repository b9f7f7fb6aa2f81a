"""The asv suite's end-to-end tests' repository: a temporary copy of this checkout (tracked
and untracked-but-not-ignored files) in three commits, for test_asv_suite.py and
test_asv_gate.py (two files, so that pytest-xdist runs them side by side):

    c1  a deliberately slower NSA forward (selection_forward_triton sleeps first)
    c2  the code as it is (the slowdown reverted)
    c3  a documentation-only change: the same code as c2

Smoke gate settings (looser than the GPU's, which are tuned on the GPU's own noise): factor
3. The slow commit's forward sleeps SLOW_MULTIPLE times as long as the real call it wraps
has just taken, in the same process: its time is (1 + SLOW_MULTIPLE) times the call's, so
the ratio asv sees is 1 + SLOW_MULTIPLE however busy the machine is. Only a change of load
between the base's and the head's processes moves it, and it stays above the factor until
the base's calls run (1 + SLOW_MULTIPLE) / 3 times slower than the head's. A fixed sleep
did not have that property: its ratio fell below 3 once a loaded machine made the call
itself take more than half the sleep. Only the plumbing is tested.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE_FACTOR = "3"
# The kernel's NSA forward timing (`track_time`; in smoke the eager and host figures time
# the same interpreted call, so they would add processes, not coverage: how the gate judges
# them is ci/confirm's, tested in test_ci_confirm.py). asv matches -b against
# "name(param, ...)"; the dense reference's smoke call lasts well under a millisecond, so a
# busy machine can move its host-timed figure by more than SMOKE_FACTOR.
KERNEL_TIMES = r"NsaForward\.track_time\(.*'triton'"
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


def make_repo(tmp_path_factory):
    """The temporary repository, its environment variables and its three commit hashes
    (a module-scoped fixture of each test file that uses it)."""
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
