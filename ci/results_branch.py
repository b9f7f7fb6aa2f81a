#!/usr/bin/env python3
"""Keep the asv results history in a git branch that is only ever appended to.

The branch (default `benchmark-results`) holds `results/` exactly as asv writes it:
`results/<machine>/<hash8>-<env>.json`, `results/<machine>/machine.json` and
`results/benchmarks.json`. Nothing else in the repository depends on it, and it is never
force-pushed, so its log is an audit trail of every stored result.

    pull: copy the branch's results into the local results directory, so that
          `asv run NEW` skips commits already measured and `asv publish` sees the history.
          A file on the branch that fails the checks of ci/results_check.py is not copied
          (asv would skip it anyway); it is named, with the advice to run `repair`.
    push: add the local result files that the branch lacks, commit and push. Every local
          file is checked first (asv's own loader, the machine and commit its path names):
          a bad one is never pushed. Existing result files are never changed: a local file
          that differs from the branch's copy is refused. The good new files are pushed
          all the same, and the refused ones are named (exit status 1). Metadata
          (machine.json, benchmarks.json) is replaced by the local copy (the suite
          description moves with the code); the OOM logs merge as the union of their lines.
          When the push is rejected because someone else pushed first, the branch is
          fetched again and the commit is rebuilt on its new tip (never a force-push), up
          to --retries times.
    repair: remove the branch's bad files (those the checks refuse, e.g. a truncated JSON
          that was pushed before the checks existed) by an ordinary commit on top of the
          tip, pushed like any other (never a force-push; the bad file stays in the
          history, as the audit trail). With --results, a good local copy of a removed
          file takes its place in the same commit; without one, asv measures that commit
          again on the next run, and the next push adds it.

The remote is a URL or path. For an authenticated HTTPS remote, put the token in the
environment variable RESULTS_BRANCH_TOKEN: it is handed to git as an HTTP header through
git's environment configuration (never on the command line, never stored in a file).

Usage:
    python -m ci.results_branch pull --remote URL --results results
    python -m ci.results_branch push --remote URL --results results --message "nightly h200"
    python -m ci.results_branch repair --remote URL [--results results]
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

from ci.fileio import copy_atomic, write_text_atomic
from ci.merge_results import apply, plan_merge
from ci.results_check import check_file, check_tree

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


class FilesRefused(RuntimeError):
    """Some local files were not pushed (bad, or differing from the branch's copy); the
    good ones were. `pushed`: how many result files the push added; `refused`: {path: why}."""

    def __init__(self, pushed: int, refused: dict[str, str]):
        self.pushed, self.refused = pushed, refused
        lines = "; ".join(f"{k}: {v}" for k, v in refused.items())
        super().__init__(f"pushed {pushed} result file(s), refused {len(refused)}: {lines}")


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
    """Copy the branch's good results into `results`; returns the number of files copied."""
    with tempfile.TemporaryDirectory(prefix="results-branch-") as tmp:
        work = Path(tmp)
        if not checkout_branch(remote, branch, work):
            print(f"results_branch: {branch} does not exist yet; nothing to pull")
            return 0
        plan = plan_merge(results, [work / "results"], replace_metadata=True)
        if plan.conflicts:
            raise ValueError("local results differ from the branch's: " + ", ".join(plan.conflicts))
        apply(plan, results)
    for path, why in plan.rejected.items():
        rel = Path(path).relative_to(work).as_posix()
        print(f"::warning::results_branch: {branch} holds a bad file, not pulled: {rel}: {why} "
              "(`python -m ci.results_branch repair` removes it)")  # fmt: skip
    n = len(plan.copy) + len(plan.write)
    print(f"results_branch: pulled {n} file(s) from {branch} into {results}")
    return n


def commit(work: Path, message: str) -> None:
    git(
        "-c", "user.name=attnbench-ci", "-c", "user.email=attnbench-ci@users.noreply.github.com",
        "commit", "-q", "-m", message,
        cwd=work,
    )  # fmt: skip


def push_tip(remote: str, branch: str, work: Path) -> None:
    res = git("push", "-q", remote, f"HEAD:refs/heads/{branch}", cwd=work, check=False)
    if res.returncode != 0:
        raise PushRejected(res.stderr.strip())


def commit_and_push(
    remote: str, branch: str, results: Path, message: str, work: Path
) -> tuple[int, dict[str, str]]:
    """One attempt: add the good new files on top of the branch tip, commit, push.
    Returns (result files pushed, {path: why} of the local files refused)."""
    checkout_branch(remote, branch, work)
    readme = work / "README.md"
    if not readme.exists():
        write_text_atomic(readme, BRANCH_README)
    plan = plan_merge(work / "results", [results], replace_metadata=True)
    refused = {Path(p).relative_to(results).as_posix(): why for p, why in plan.rejected.items()}
    for rel in plan.conflicts:
        why = "differs from the branch's copy (result files are never changed)"
        if check_file(work / "results" / rel, rel):
            why += "; the branch's copy is bad: `python -m ci.results_branch repair`"
        refused[rel] = why
    apply(plan, work / "results", partial=True)
    git("add", "-A", "README.md", "results", cwd=work)
    if git("diff", "--cached", "--quiet", cwd=work, check=False).returncode == 0:
        print(f"results_branch: {branch} already has every good local result; nothing to push")
        return 0, refused
    n = len(plan.result_files())
    commit(work, f"{message}: {n} result file(s)")
    push_tip(remote, branch, work)
    print(f"results_branch: pushed {n} new result file(s) to {branch}")
    return n, refused


def with_retries(attempt_fn, retries: int, delay: float):
    """attempt_fn(work dir) in a fresh temporary folder, again on PushRejected."""
    for attempt in range(1, retries + 1):
        with tempfile.TemporaryDirectory(prefix="results-branch-") as tmp:
            try:
                return attempt_fn(Path(tmp))
            except PushRejected as exc:
                if attempt == retries:
                    raise
                print(f"results_branch: push rejected (attempt {attempt}), retrying: {exc}")
        time.sleep(delay * attempt)
    raise AssertionError("unreachable")


def push(
    remote: str, branch: str, results: Path, message: str, retries: int = 5, delay: float = 2.0
) -> int:
    """Append the good local results to the branch, rebuilding the commit when a push races;
    returns the number of result files pushed. Raises FilesRefused, after pushing the good
    files, when some were refused."""
    if not results.is_dir():
        raise FileNotFoundError(f"results directory {results} does not exist")
    n, refused = with_retries(
        lambda work: commit_and_push(remote, branch, results, message, work), retries, delay
    )
    if refused:
        raise FilesRefused(n, refused)
    return n


def repair_once(remote: str, branch: str, results: Path | None, work: Path) -> dict[str, str]:
    """One attempt of `repair`: {path: what was done} for each bad file of the branch."""
    if not checkout_branch(remote, branch, work):
        print(f"results_branch: {branch} does not exist; nothing to repair")
        return {}
    bad = check_tree(work / "results")
    if not bad:
        print(f"results_branch: every file of {branch} passes the checks; nothing to repair")
        return {}
    done = {}
    for rel, why in bad.items():
        local = results / rel if results else None
        if local is not None and local.is_file() and check_file(local, rel) is None:
            copy_atomic(local, work / "results" / rel)
            done[rel] = f"replaced by the good local copy (was: {why})"
        else:
            git("rm", "-q", f"results/{rel}", cwd=work)
            done[rel] = f"removed ({why})"
    git("add", "-A", "results", cwd=work)
    names = ", ".join(sorted(done))
    commit(work, f"Repair: {len(done)} bad result file(s) removed or replaced: {names}")
    push_tip(remote, branch, work)
    return done


def repair(remote: str, branch: str, results: Path | None = None, retries: int = 5,
           delay: float = 2.0) -> dict[str, str]:  # fmt: skip
    """Remove (or, from `results`, replace) every file of the branch that the checks
    refuse, by an ordinary commit on its tip; returns {path: what was done}."""
    done = with_retries(lambda work: repair_once(remote, branch, results, work), retries, delay)
    for rel, what in done.items():
        print(f"results_branch: repaired results/{rel}: {what}")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["pull", "push", "repair"])
    ap.add_argument("--remote", required=True, help="git URL or path of the repository")
    ap.add_argument("--branch", default=DEFAULT_BRANCH)
    ap.add_argument(
        "--results", type=Path, default=None,
        help="local results directory (default: results; repair: good copies, optional)",
    )  # fmt: skip
    ap.add_argument("--message", default="Add benchmark results", help="commit message (push)")
    ap.add_argument("--retries", type=int, default=5, help="push attempts on a race")
    args = ap.parse_args(argv)
    results = args.results if args.results is not None else Path("results")
    try:
        if args.action == "pull":
            pull(args.remote, args.branch, results)
        elif args.action == "push":
            push(args.remote, args.branch, results, args.message, args.retries)
        else:
            repair(args.remote, args.branch, args.results, args.retries)
    except FilesRefused as exc:
        for rel, why in exc.refused.items():
            print(f"::error::results_branch: not pushed: {rel}: {why}")
        print(f"results_branch: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, PushRejected, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        print(f"results_branch: error: {detail}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
