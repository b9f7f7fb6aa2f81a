"""Helpers for the tests that run the real asv suite in smoke mode on a throwaway clone.

A clone is a fresh git repository holding the working tree's files (tracked and untracked,
not ignored) in `n` commits, so `asv run` can build each commit as it would on a runner.
asv runs from the project's .venv with ATTNBENCH_SMOKE=1 and the .venv's torch/Triton
exposed to its environments (as scripts/main.sh does), its machine file in a temporary
HOME (the user's ~/.asv-machine.json is left alone) and its environments in a directory
shared by these tests (`.asv/ci-test-env-<xdist worker>`, ignored by git), so they are
built once per worker.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VPY = ROOT / ".venv" / "bin" / "python"
ASV = ROOT / ".venv" / "bin" / "asv"
CONF = ROOT / "asv.conf.json"
# One directory per pytest-xdist worker (scripts/test.sh runs several): asv does not lock
# an environment directory, and two workers building commits in one would race.
SHARED_ENV_DIR = ROOT / ".asv" / f"ci-test-env-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
MACHINE = "cpu-smoke"


def available() -> str | None:
    """None when the suite can run here, else the reason it cannot."""
    if not CONF.exists():
        return "asv.conf.json does not exist yet"
    if not ASV.exists():
        return ".venv has no asv: run scripts/bootstrap.sh"
    return None


def require_site_libraries() -> None:
    """Skip where the site's JavaScript libraries cannot be installed (no npm: scripts/ci_tools.sh
    said so and skipped `npm ci`); fail where npm exists but node_modules is missing."""
    if not (ROOT / "node_modules" / "jquery").is_dir():
        if shutil.which("npm") is None:
            pytest.skip("no npm on this machine: the site's libraries are not installed")
        pytest.fail("node_modules is missing: run `bash scripts/ci_tools.sh` (npm ci)")


def git(*args: str, cwd: Path) -> str:
    res = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return res.stdout.strip()


def make_clone(dest: Path, n_commits: int) -> list[str]:
    """A repository of the working tree in `n_commits` commits; their hashes, oldest first."""
    files = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    dest.mkdir(parents=True)
    for rel in filter(None, files.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git("init", "-q", "-b", "main", cwd=dest)
    ident = ["-c", "user.name=ci-test", "-c", "user.email=ci-test@example.invalid"]
    hashes = []
    for i in range(n_commits):
        # Later commits change only a file outside the package: same code, new commit.
        if i:
            (dest / "CI_TEST_COMMITS.txt").write_text(f"commit {i}\n")
        git("add", "-A", cwd=dest)
        git(*ident, "commit", "-q", "-m", f"ci test commit {i}", cwd=dest)
        hashes.append(git("rev-parse", "HEAD", cwd=dest))
    return hashes


def write_conf(clone: Path, name: str, results_dir: str, html_dir: str = "html") -> Path:
    """A copy of the project's asv.conf.json for `clone`, with its own results/html dirs."""
    from asv.util import load_json

    conf = load_json(str(CONF), js_comments=True)
    conf.update(
        repo=".",
        branches=["main"],
        results_dir=results_dir,
        html_dir=html_dir,
        env_dir=str(SHARED_ENV_DIR),
    )
    path = clone / name
    path.write_text(json.dumps(conf, indent=2))
    return path


def env(home: Path) -> dict[str, str]:
    """The environment for asv: smoke mode, a private HOME, the user's caches kept."""
    real_home = Path.home()
    home.mkdir(parents=True, exist_ok=True)
    out = dict(os.environ, ATTNBENCH_SMOKE="1", HOME=str(home), ATTNBENCH_HOST_SITE=host_site())
    out.setdefault("XDG_CACHE_HOME", str(real_home / ".cache"))
    out.setdefault("XDG_CONFIG_HOME", str(real_home / ".config"))
    out.pop("ATTNBENCH_SUITE", None)
    return out


def asv(*args: str, cwd: Path, home: Path, timeout: float = 600) -> str:
    """Run asv; raise with its output when it fails."""
    res = subprocess.run(
        [str(ASV), *args], cwd=cwd, env=env(home), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if res.returncode != 0:
        raise AssertionError(f"asv {' '.join(args)} exited {res.returncode}:\n"
                             f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}")  # fmt: skip
    return res.stdout


def register_machine(home: Path) -> None:
    """The smoke machine's entry in HOME's .asv-machine.json (tools/asv_machine.py)."""
    home.mkdir(parents=True, exist_ok=True)
    tool = [str(VPY), str(ROOT / "tools" / "asv_machine.py"), "--machine", MACHINE]
    subprocess.run(tool, env=dict(os.environ, HOME=str(home)), check=True, capture_output=True)


def scratch(tmp_path_factory, name: str, n_commits: int) -> tuple[Path, Path, list[str]]:
    """(root, repo, hashes) for a module's smoke runs: a clone of n_commits commits in
    root/repo (`make_clone`) and the smoke machine registered in root/home. Skips the
    calling test where smoke runs cannot work here (`available`)."""
    reason = available()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp(name)
    repo = root / "repo"
    hashes = make_clone(repo, n_commits)
    register_machine(root / "home")
    return root, repo, hashes


@functools.cache
def host_site() -> str:
    """Where .venv's torch and Triton live, for asv's environments (tools/asv_host_site.py)."""
    tool = [str(VPY), str(ROOT / "tools" / "asv_host_site.py"), "--print"]
    return subprocess.run(tool, check=True, capture_output=True, text=True).stdout.strip()


def result_pairs(results_dir: Path) -> set[tuple[str, str, str]]:
    """(commit, benchmark, parameter set) of every stored non-failed result."""
    from asv.results import iter_results

    pairs = set()
    for res in iter_results(str(results_dir)):
        for key in res.get_all_result_keys():
            values = res.get_result_value(key, res.get_result_params(key))
            for params, value in zip(_param_sets(res.get_result_params(key)), values, strict=True):
                if value is not None:
                    pairs.add((res.commit_hash, key, params))
    return pairs


def _param_sets(params: list) -> list[str]:
    import itertools

    return [repr(p) for p in itertools.product(*params)] if params else ["()"]
