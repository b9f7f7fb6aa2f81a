"""`tools/dev/gpu_gate_ab.sh`: the PR gate's two stages on two commits, with the workflow's
settings (its DRY_RUN mode, which prints the commands it would run, on the CPU)."""

import shlex
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools/dev/gpu_gate_ab.sh"


def dry_run(**env):
    base = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "MACHINE": "h200"}
    proc = subprocess.run(["bash", str(TOOL)], env={**base, **env}, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    return proc


def options(words):
    """{--option: value} of a command's words (flags without a value map to True)."""
    out, i = {}, 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("-"):
            out[w] = words[i + 1]
            i += 2
        else:
            out[w] = True
            i += 1
    return out


def commands(proc):
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr
    assert lines[0].startswith("asv continuous") and lines[1].startswith("python -m ci.confirm")
    return shlex.split(lines[0]), shlex.split(lines[1])


def test_both_stages_take_the_workflows_settings():
    env = yaml.safe_load((ROOT / ".github/workflows/gpu-pr-gate.yml").read_text())["env"]
    cont, conf = commands(dry_run(BASE="b6ecfc9", HEAD_REF="HEAD", BENCH="^nsa\\.(A|B) x"))
    assert cont[-2:] == ["b6ecfc9", "HEAD"]
    extra = env["GATE_EXTRA_ARGS"].split()
    assert " ".join(extra) in " ".join(cont)  # as the workflow passes them, in order
    c = options(cont[2:-2])
    assert c["--factor"] == env["GATE_FACTOR"] and c["--machine"] == "h200"
    assert c["-b"] == "^nsa\\.(A|B) x" and c["--show-stderr"] is True
    k = options(conf[3:])
    assert (k["--base"], k["--head"], k["--out"]) == ("b6ecfc9", "HEAD", "gate")
    expected = {
        "--rounds": "GATE_CONFIRM_ROUNDS", "--suspect": "GATE_CONFIRM_SUSPECT",
        "--factor": "GATE_CONFIRM_FACTOR", "--sure": "GATE_CONFIRM_SURE",
        "--batch": "GATE_CONFIRM_BATCH", "--time-cap": "GATE_CONFIRM_TIME_CAP",
        "--host-factor": "GATE_HOST_FACTOR", "--host-quantile": "GATE_HOST_QUANTILE",
    }  # fmt: skip
    assert {o: k[o] for o in expected} == {o: env[v] for o, v in expected.items()}
    # without BENCH, every benchmark: no -b
    cont, _ = commands(dry_run(BASE="a", HEAD_REF="b"))
    assert "-b" not in cont


def test_the_environment_overrides_one_setting():
    env = yaml.safe_load((ROOT / ".github/workflows/gpu-pr-gate.yml").read_text())["env"]
    _, conf = commands(dry_run(BASE="a", HEAD_REF="b", GATE_CONFIRM_TIME_CAP="600"))
    k = options(conf[3:])
    assert k["--time-cap"] == "600" and env["GATE_CONFIRM_TIME_CAP"] != "600"
    assert k["--rounds"] == env["GATE_CONFIRM_ROUNDS"]


def test_without_both_commits_it_prints_its_usage():
    proc = dry_run(BASE="a")
    assert proc.returncode == 2 and "HEAD_REF=<commit>" in proc.stderr and proc.stdout == ""
