#!/usr/bin/env python3
"""Keep the asv results history in a git branch that is only ever appended to.

The branch (default `benchmark-results`) holds `results/` exactly as asv writes it:
`results/<machine>/<hash8>-<env>.json`, `results/<machine>/machine.json` and
`results/benchmarks.json`. Nothing else in the repository depends on it, and it is never
force-pushed, so its log is an audit trail of every stored result.

    pull: copy the branch's results into the local results directory, so that
          `asv run NEW` skips commits already measured and `asv publish` sees the history.
    push: add the local result files that the branch lacks, commit and push. Existing result
          files are never changed: a local file that differs from the branch's copy is a
          conflict and nothing is pushed. Metadata (machine.json, benchmarks.json) is
          replaced by the local copy (the suite description moves with the code). When the
          push is rejected because someone else pushed first, the branch is fetched again and
          the commit is rebuilt on its new tip (never a force-push), up to --retries times.

The remote is a URL or path. For an authenticated HTTPS remote, put the token in the
environment variable RESULTS_BRANCH_TOKEN: it is handed to git as an HTTP header through
git's environment configuration (never on the command line, never stored in a file).

Usage:
    python -m ci.results_branch pull --remote URL --results results
    python -m ci.results_branch push --remote URL --results results --message "nightly h200"
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ci.merge_results import apply, plan_merge

DEFAULT_BRANCH = "benchmark-results"
BRANCH_README = """\
# benchmark-results

asv results history, written by `ci/results_branch.py` from the benchmark workflows.
Append-only: new result files are added by ordinary commits; nothing here is rewritten
or force-pushed. Layout: `results/<machine>/<commit8>-<env>.json`, one file per commit,
machine and environment, as `asv run` writes it.
"""


class PushRejected(RuntimeError):
    """The remote refused the push (someone else pushed first); fetch again and retry."""


def git_env() -> dict[str, str]:
    """The environment for git: no prompts, and the token (if any) as an HTTP header."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    token = os.environ.get("RESULTS_BRANCH_TOKEN")
    if token:
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        n = int(env.get("GIT_CONFIG_COUNT", "0"))
        env["GIT_CONFIG_COUNT"] = str(n + 1)
        env[f"GIT_CONFIG_KEY_{n}"] = "http.extraHeader"
        env[f"GIT_CONFIG_VALUE_{n}"] = f"AUTHORIZATION: basic {basic}"
    return env


def git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(), capture_output=True, text=True, check=check
    )


def checkout_branch(remote: str, branch: str, work: Path) -> bool:
    """Make `work` a checkout of the branch's tip; False (empty repo) when it does not exist."""
    git("init", "-q", str(work), cwd=Path.cwd())
    if not git("ls-remote", "--heads", remote, branch, cwd=work).stdout.strip():
        git("checkout", "-q", "--orphan", branch, cwd=work)
        return False
    # A shallow fetch is enough: a commit on top of the tip pushes fine from it.
    git("fetch", "-q", "--depth=1", remote, f"refs/heads/{branch}", cwd=work)
    git("checkout", "-q", "-B", branch, "FETCH_HEAD", cwd=work)
    return True


def pull(remote: str, branch: str, results: Path) -> int:
    """Copy the branch's results into `results`; returns the number of files copied."""
    with tempfile.TemporaryDirectory(prefix="results-branch-") as tmp:
        work = Path(tmp)
        if not checkout_branch(remote, branch, work):
            print(f"results_branch: {branch} does not exist yet; nothing to pull")
            return 0
        plan = plan_merge(results, [work / "results"], replace_metadata=True)
        if plan.conflicts:
            raise ValueError("local results differ from the branch's: " + ", ".join(plan.conflicts))
        apply(plan, results)
    print(f"results_branch: pulled {len(plan.copy)} file(s) from {branch} into {results}")
    return len(plan.copy)


def commit_and_push(remote: str, branch: str, results: Path, message: str, work: Path) -> int:
    """One attempt: add the new files on top of the branch tip, commit, push."""
    checkout_branch(remote, branch, work)
    readme = work / "README.md"
    if not readme.exists():
        readme.write_text(BRANCH_README)
    plan = plan_merge(work / "results", [results], replace_metadata=True)
    if plan.conflicts:
        raise ValueError(
            "refusing to change result files already on the branch: " + ", ".join(plan.conflicts)
        )
    apply(plan, work / "results")
    git("add", "-A", "README.md", "results", cwd=work)
    if git("diff", "--cached", "--quiet", cwd=work, check=False).returncode == 0:
        print(f"results_branch: {branch} already has every local result; nothing to push")
        return 0
    n = len(plan.result_files())
    git(
        "-c", "user.name=attnbench-ci", "-c", "user.email=attnbench-ci@users.noreply.github.com",
        "commit", "-q", "-m", f"{message}: {n} result file(s)",
        cwd=work,
    )  # fmt: skip
    res = git("push", "-q", remote, f"HEAD:refs/heads/{branch}", cwd=work, check=False)
    if res.returncode != 0:
        raise PushRejected(res.stderr.strip())
    print(f"results_branch: pushed {n} new result file(s) to {branch}")
    return n


def push(
    remote: str, branch: str, results: Path, message: str, retries: int = 5, delay: float = 2.0
) -> int:
    """Append the local results to the branch, rebuilding the commit when a push races."""
    if not results.is_dir():
        raise FileNotFoundError(f"results directory {results} does not exist")
    for attempt in range(1, retries + 1):
        with tempfile.TemporaryDirectory(prefix="results-branch-") as tmp:
            try:
                return commit_and_push(remote, branch, results, message, Path(tmp))
            except PushRejected as exc:
                if attempt == retries:
                    raise
                print(f"results_branch: push rejected (attempt {attempt}), retrying: {exc}")
        time.sleep(delay * attempt)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["pull", "push"])
    ap.add_argument("--remote", required=True, help="git URL or path of the repository")
    ap.add_argument("--branch", default=DEFAULT_BRANCH)
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--message", default="Add benchmark results", help="commit message (push)")
    ap.add_argument("--retries", type=int, default=5, help="push attempts on a race (push)")
    args = ap.parse_args(argv)
    try:
        if args.action == "pull":
            pull(args.remote, args.branch, args.results)
        else:
            push(args.remote, args.branch, args.results, args.message, args.retries)
    except (ValueError, FileNotFoundError, PushRejected, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        print(f"results_branch: error: {detail}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
