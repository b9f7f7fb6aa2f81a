"""ci/results_branch.py against a local bare repository standing in for GitHub."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ci_results_check import result_json  # noqa: E402

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
        (results / rel, result_json(machine, commit * 5, (float(value), 2.0))),
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
    assert tip(remote) == before  # nothing else was new: no commit
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


def commit_to_branch(remote: Path, tmp: Path, rel: str, text: str) -> None:
    """Put a file on the branch by a plain git commit (as before the checks existed)."""
    work = tmp / "raw"
    git("clone", "-q", "-b", BRANCH, str(remote), str(work))
    (work / "results" / rel).parent.mkdir(parents=True, exist_ok=True)
    (work / "results" / rel).write_text(text)
    git("add", "-A", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "raw", cwd=work)
    git("push", "-q", "origin", BRANCH, cwd=work)


def test_a_bad_local_file_is_never_pushed_and_the_good_ones_are(remote, tmp_path, capsys):
    local = tmp_path / "results"
    good = add_result(local, "aaaaaaaa")
    bad = add_result(local, "bbbbbbbb")
    (local / bad).write_text((local / bad).read_text()[:150])  # asv killed mid-write
    args = ["push", "--remote", str(remote), "--results", str(local)]
    assert results_branch.main(args) == 1
    files = branch_files(remote)
    assert f"results/{good}" in files and f"results/{bad}" not in files
    assert f"not pushed: {bad}: asv cannot load it" in capsys.readouterr().out


def test_a_refused_file_does_not_hold_back_an_unrelated_new_one(remote, tmp_path):
    """The branch holds a truncated file; asv re-measured that commit locally; the next
    push refuses the differing file, names the repair, and still adds the new one."""
    local = tmp_path / "results"
    add_result(local, "aaaaaaaa")
    results_branch.push(str(remote), BRANCH, local, "run 1", delay=0)
    rel = add_result(tmp_path / "x", "cccccccc")
    good_text = (tmp_path / "x" / rel).read_text()
    commit_to_branch(remote, tmp_path, rel, good_text[:120])  # a bad file on the branch
    fresh = tmp_path / "fresh"
    assert results_branch.pull(str(remote), BRANCH, fresh) == 3  # the bad one is not pulled
    assert not (fresh / rel).exists()
    (fresh / rel).write_text(good_text)  # asv measured it again
    new = add_result(fresh, "dddddddd")
    with pytest.raises(results_branch.FilesRefused) as info:
        results_branch.push(str(remote), BRANCH, fresh, "run 2", delay=0)
    assert info.value.pushed == 1 and list(info.value.refused) == [rel]
    assert "the branch's copy is bad" in info.value.refused[rel]
    assert f"results/{new}" in branch_files(remote)


def test_repair_removes_or_replaces_bad_files_by_an_ordinary_commit(remote, tmp_path):
    local = tmp_path / "results"
    add_result(local, "aaaaaaaa")
    results_branch.push(str(remote), BRANCH, local, "run 1", delay=0)
    cut = add_result(tmp_path / "x", "cccccccc")
    cut_text = (tmp_path / "x" / cut).read_text()
    commit_to_branch(remote, tmp_path, cut, cut_text[:120])
    other = add_result(tmp_path / "y", "eeeeeeee")
    commit_to_branch(remote, tmp_path / "y2", other, "{")
    before = tip(remote)
    # A good local copy replaces `cut`; `other` has none and is removed.
    good = tmp_path / "good"
    (good / cut).parent.mkdir(parents=True)
    (good / cut).write_text(cut_text)
    args = ["repair", "--remote", str(remote), "--results", str(good)]
    assert results_branch.main(args) == 0
    assert git("rev-parse", f"{BRANCH}^", cwd=remote) == before  # on top: no rewrite
    files = branch_files(remote)
    assert f"results/{cut}" in files and f"results/{other}" not in files
    shown = git("show", f"{BRANCH}:results/{cut}", cwd=remote)
    assert json.loads(shown)["commit_hash"] == "cccccccc" * 5
    assert "Repair: 2 bad result file(s)" in git("log", "-1", "--format=%s", BRANCH, cwd=remote)
    # the branch passes now: a second repair does nothing, a push of the rest works
    tip2 = tip(remote)
    assert results_branch.main(["repair", "--remote", str(remote)]) == 0
    assert tip(remote) == tip2
    fresh = tmp_path / "fresh2"
    assert results_branch.pull(str(remote), BRANCH, fresh) == 4
    add_result(fresh, "eeeeeeee")
    assert results_branch.push(str(remote), BRANCH, fresh, "run 3", delay=0) == 1


def test_oom_log_grows_on_the_branch(remote, tmp_path):
    from ci import na_reasons

    local = tmp_path / "results"
    add_result(local, "aaaaaaaa")
    log = na_reasons.log_path(local, "h200")
    na_reasons.record_oom(log, "a" * 40, "nsa.NsaForward.track_time", ["1"])
    results_branch.push(str(remote), BRANCH, local, "run 1", delay=0)
    na_reasons.record_oom(log, "b" * 40, "nsa.NsaForward.track_time", ["2"])
    add_result(local, "bbbbbbbb")
    assert results_branch.push(str(remote), BRANCH, local, "run 2", delay=0) == 1
    shown = git("show", f"{BRANCH}:results/h200/{na_reasons.LOG_NAME}", cwd=remote)
    assert len(shown.splitlines()) == 2
