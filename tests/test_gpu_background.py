"""`tools/dev/gpu_background.sh`: a command longer than one device call, started in the
background and polled (run here on the CPU with a shell command for the job)."""

import subprocess
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools/dev/gpu_background.sh"


def bg(tmp_path, *args, out=None):
    env = {"PATH": "/usr/bin:/bin", "BG_DIR": str(tmp_path / "bg")}
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(TOOL), *args], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_start_then_poll_until_done(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = "echo one; sleep 3; echo two; exit 4"
    assert bg(tmp_path, "start", "j", "--", "bash", "-c", job).returncode == 0
    running = bg(tmp_path, "poll", "j", "1")
    assert running.returncode == 3 and "RUNNING" in running.stdout
    done = bg(tmp_path, "poll", "j", "30", out=out)
    assert done.returncode == 0, done.stdout
    assert "DONE rc=4" in done.stdout  # the job's own exit status
    log = (out / "j.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in log] == ["one", "two"]  # time-stamped lines
    assert all(line[2] == ":" and line[5] == ":" for line in log)


def test_usage_errors(tmp_path):
    assert bg(tmp_path, "poll", "nothing").returncode == 2
    assert bg(tmp_path, "start", "j", "echo", "no separator").returncode == 2
    assert bg(tmp_path, "stop", "j").returncode == 2
