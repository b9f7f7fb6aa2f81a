"""ci/results_branch.py against a local bare repository standing in for GitHub."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import results_branch  # noqa: E402
from ci.merge_results import scan  # noqa: E402

BRANCH = results_branch.DEFAULT_BRANCH


def git(*args, cwd=None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def add_result(results: Path, commit: str, machine: str = "h200", value: int = 1) -> str:
    rel = f"{machine}/{commit}-virtualenv-py3.11.json"
    for path, data in [
        (results / rel, {"commit_hash": commit, "result": [value]}),
        (results / machine / "machine.json", {"machine": machine, "version": 1}),
        (results / "benchmarks.json", {"version": 2}),
    ]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    return rel


def branch_files(remote: Path) -> list[str]:
    return sorted(git("ls-tree", "-r", "--name-only", BRANCH, cwd=remote).split())


def tip(remote: Path) -> str:
    return git("rev-parse", BRANCH, cwd=remote)


@pytest.fixture
def remote(tmp_path):
    path = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(path))
    return path


def test_pull_from_missing_branch_is_empty(remote, tmp_path):
    assert results_branch.pull(str(remote), BRANCH, tmp_path / "results") == 0
    assert not (tmp_path / "results").exists()


def test_push_appends_and_pull_restores(remote, tmp_path):
    local = tmp_path / "results"
    first = add_result(local, "aaaaaaaa")
    assert results_branch.push(str(remote), BRANCH, local, "run 1", delay=0) == 1
    assert branch_files(remote) == [
        "README.md",
        "results/benchmarks.json",
        f"results/{first}",
        "results/h200/machine.json",
    ]
    tip1 = tip(remote)

    second = add_result(local, "bbbbbbbb")
    assert results_branch.push(str(remote), BRANCH, local, "run 2", delay=0) == 1
    assert f"results/{second}" in branch_files(remote)
    # append-only: the old tip is the new tip's parent (no rewrite, no force-push)
    assert git("rev-parse", f"{BRANCH}^", cwd=remote) == tip1
    # pushing the same results again makes no commit
    tip2 = tip(remote)
    assert results_branch.push(str(remote), BRANCH, local, "run 3", delay=0) == 0
    assert tip(remote) == tip2

    fresh = tmp_path / "fresh"
    assert results_branch.pull(str(remote), BRANCH, fresh) == 4
    assert sorted(scan(fresh)) == sorted(scan(local))


def test_changed_result_is_refused(remote, tmp_path):
    local = tmp_path / "results"
    add_result(local, "aaaaaaaa")
    results_branch.push(str(remote), BRANCH, local, "run 1", delay=0)
    before = tip(remote)
    add_result(local, "aaaaaaaa", value=2)  # same commit, different numbers
    args = ["push", "--remote", str(remote), "--results", str(local)]
    assert results_branch.main(args) == 1
    assert tip(remote) == before
    # pulling into a directory holding the differing file is refused as well
    assert results_branch.main(["pull", "--remote", str(remote), "--results", str(local)]) == 1


def test_race_is_retried_on_the_new_tip(remote, tmp_path, monkeypatch):
    """Another run pushes between our fetch and our push: we rebuild on its commit."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    add_result(ours, "aaaaaaaa", machine="h200")
    add_result(theirs, "bbbbbbbb", machine="h100")
    results_branch.push(str(remote), BRANCH, theirs, "seed", delay=0)

    real_checkout = results_branch.checkout_branch
    calls = []

    def checkout_then_race(remote_url, branch, work):
        found = real_checkout(remote_url, branch, work)
        calls.append(work)
        if len(calls) == 1:  # the competing run lands while we are busy
            add_result(theirs, "cccccccc", machine="h100")
            results_branch.commit_and_push(remote_url, branch, theirs, "other", tmp_path / "o")
        return found

    monkeypatch.setattr(results_branch, "checkout_branch", checkout_then_race)
    assert results_branch.push(str(remote), BRANCH, ours, "ours", delay=0) == 1
    assert len(calls) == 3  # ours (rejected), theirs, ours again
    files = branch_files(remote)
    for rel in ["h200/aaaaaaaa", "h100/bbbbbbbb", "h100/cccccccc"]:
        assert f"results/{rel}-virtualenv-py3.11.json" in files
    competing_tip = git("rev-parse", f"{BRANCH}^", cwd=remote)
    assert "other" in git("log", "-1", "--format=%s", competing_tip, cwd=remote)
    assert git("rev-list", "--count", BRANCH, cwd=remote) == "3"


def test_token_goes_to_git_config_env_not_argv(monkeypatch):
    monkeypatch.setenv("RESULTS_BRANCH_TOKEN", "s3cret")
    monkeypatch.delenv("GIT_CONFIG_COUNT", raising=False)
    env = results_branch.git_env()
    assert env["GIT_CONFIG_COUNT"] == "1"
    assert env["GIT_CONFIG_KEY_0"] == "http.extraHeader"
    assert env["GIT_CONFIG_VALUE_0"].startswith("AUTHORIZATION: basic ")
    assert "s3cret" not in env["GIT_CONFIG_VALUE_0"]  # base64, as actions/checkout does
